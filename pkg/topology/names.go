// Package topology is gputopo's pure topology model: the NVLink graph inside
// a node (domains, aligned fully-connected blocks, peers, bandwidth), the
// network tree above it (leaf, spine, higher tiers), and every name gputopo
// publishes or reads. It imports no client-go.
package topology

// DriverName is the DRA driver name and the domain of every device attribute
// gputopo publishes.
const DriverName = "gpu.gputopo.dev"

// Device attribute names. They are published unqualified in the driver's
// domain, so CEL reads them as device.attributes["gpu.gputopo.dev"].<name>
// and constraints name them "gpu.gputopo.dev/<name>". Claims written against
// them must keep working: never rename one.
const (
	AttrIndex                 = "index"
	AttrMinor                 = "minor"
	AttrUUID                  = "uuid"
	AttrProductName           = "productName"
	AttrArchitecture          = "architecture"
	AttrCUDAComputeCapability = "cudaComputeCapability"
	AttrDriverVersion         = "driverVersion"
	AttrCUDADriverVersion     = "cudaDriverVersion"
	AttrNVLinkDomain          = "nvlinkDomain"
	AttrNVLinkBlock2          = "nvlinkBlock2"
	AttrNVLinkBlock4          = "nvlinkBlock4"
	AttrNVLinkBlock8          = "nvlinkBlock8"
	AttrNVLinkPeers           = "nvlinkPeers"
	AttrNVLinkLinks           = "nvlinkLinks"
	AttrNVLinkBandwidthGBps   = "nvlinkBandwidthGBps"
	AttrNVLinkClique          = "nvlinkClique"
	AttrLeaf                  = "leaf"
	AttrSpine                 = "spine"
	AttrCore                  = "core"
	// AttrTierPrefix names tiers above the core: tier3, tier4, ... (the
	// number is topograph's: tier-0 is the leaf).
	AttrTierPrefix = "tier"

	// CapacityMemory is the device's framebuffer memory.
	CapacityMemory = "memory"
)

// BlockAttr returns the attribute naming a GPU's aligned block of size n.
func BlockAttr(n int) string {
	switch n {
	case 2:
		return AttrNVLinkBlock2
	case 4:
		return AttrNVLinkBlock4
	case 8:
		return AttrNVLinkBlock8
	}
	return ""
}

// BlockSizes are the aligned NVLink block sizes gputopo computes.
var BlockSizes = []int{2, 4, 8}

// Node labels read for network placement by default (see
// DefaultLabelMapping). topograph 1.0 numbers switch tiers from the node
// outwards: tier-0 is the switch the node hangs off (the leaf), tier-1 the
// next one (the spine), tier-2 the core, with no fixed depth; its
// accelerator domain is the multi-node NVLink domain. Before 1.0 it wrote
// the network.topology.nvidia.com labels, which NVIDIA's tools still read.
const (
	LabelTopographTierPrefix = "fabric.topograph.run/tier-"
	LabelTopographLeaf       = LabelTopographTierPrefix + "0"
	LabelTopographSpine      = LabelTopographTierPrefix + "1"
	LabelTopographCore       = LabelTopographTierPrefix + "2"
	LabelTopographDomain     = "accelerator.topograph.run/domain"
	LabelNVIDIALeaf          = "network.topology.nvidia.com/leaf"
	LabelNVIDIASpine         = "network.topology.nvidia.com/spine"
	LabelNVIDIACore          = "network.topology.nvidia.com/core"
	LabelNVIDIAAccelerator   = "network.topology.nvidia.com/accelerator"
	// LabelNVIDIAClique is written by GPU feature discovery:
	// <fabric cluster UUID>.<clique ID>.
	LabelNVIDIAClique = "nvidia.com/gpu.clique"
)

// The label mapping ConfigMap: one per cluster, read by the kubelet
// plugins, the controller and the CLI, so all three place a node in the
// same spot of the tree. Each data key lists node labels, comma-separated,
// the first present on a node winning; a key left out keeps its default,
// a key set to "" reads no label.
const (
	LabelMappingConfigMap = "gputopo-label-mapping"
	MappingKeyLeaf        = "leaf"
	MappingKeySpine       = "spine"
	MappingKeyCore        = "core"
	MappingKeyClique      = "clique"
	// MappingKeyTierPrefix is a label prefix: <prefix>N for N >= 3 is
	// published as tierN.
	MappingKeyTierPrefix = "tierPrefix"
)

// Labels, annotations, taints and the scheduling gate gputopo owns.
const (
	// LabelProfile records the simulated GPU profile of a node.
	LabelProfile = "gputopo.dev/profile"
	// TaintUnhealthy is the device taint key put on an unhealthy GPU.
	TaintUnhealthy = DriverName + "/unhealthy"
	// TaintUnmonitored is the device taint key (effect NoSchedule) put on
	// every GPU of a node while its health cannot be watched; the value
	// says why.
	TaintUnmonitored = DriverName + "/unmonitored"
	// TaintFenced is the device taint key (effect NoSchedule) of the
	// DeviceTaintRules the controller writes on a device that
	// kube-scheduler no longer counts as allocated though a claim holds
	// it (two claims held it at once and one gave it back).
	TaintFenced = "gputopo.dev/fenced"
	// LabelFence marks those DeviceTaintRules ("true"); their names start
	// with FenceRulePrefix, and AnnotationFenceReason says why each is
	// there.
	LabelFence            = "gputopo.dev/fence"
	FenceRulePrefix       = "gputopo-fence-"
	AnnotationFenceReason = "gputopo.dev/fence-reason"
	// LabelClaimNodeSelectors ("true") marks the ConfigMap of node
	// selectors the controller keeps in a namespace (pkg/nodepin,
	// ConfigMapName); the gputopo-claim-node-selector admission policy's
	// binding selects its parameters by it, which the API server answers
	// from its cache, where a name it does not find costs a GET of its
	// own for every new pod with claims.
	LabelClaimNodeSelectors = "gputopo.dev/claim-node-selectors"
	// AnnotationPackedAttributes holds, in the controller's memory only,
	// the device attributes of a cached ResourceSlice, serialized
	// (pkg/slicepack). It is never written to the API server; one a slice
	// arrives with is dropped.
	AnnotationPackedAttributes = "gputopo.dev/packed-attributes"
)

// Node labels that mark a node with an NVIDIA GPU, written by NVIDIA's GPU
// feature discovery and by node feature discovery (PCI vendor 10de); the
// chart runs the NVML plugin only where one is "true".
const (
	LabelNVIDIAGPUPresent = "nvidia.com/gpu.present"
	LabelNFDNVIDIAPCI     = "feature.node.kubernetes.io/pci-10de.present"
)

// Environment variables set in every container that receives gputopo GPUs.
const (
	EnvVisibleDevices = "NVIDIA_VISIBLE_DEVICES"
	EnvNVLinkDomain   = "GPUTOPO_NVLINK_DOMAIN"
	EnvNVLinkClique   = "GPUTOPO_NVLINK_CLIQUE"
	EnvLeaf           = "GPUTOPO_LEAF"
	EnvSpine          = "GPUTOPO_SPINE"
	EnvNode           = "GPUTOPO_NODE"
)
