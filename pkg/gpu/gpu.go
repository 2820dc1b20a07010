// Package gpu defines the hardware seam: one interface for GPU discovery and
// health, implemented by the NVML backend (pkg/gpu/nvml) and by simulated
// profiles (pkg/gpu/sim). Everything above this package sees only Inventory.
package gpu

import (
	"context"
	"errors"
	"io/fs"
)

// ErrDriverReloaded is returned by Discover when the GPU driver was
// unloaded or replaced (an upgrade) under a running backend: its library
// no longer matches the kernel module, and only a new process can load the
// new one.
var ErrDriverReloaded = errors.New("the GPU driver was unloaded or replaced since the backend started; restart to load the new one")

// Device is one physical GPU as discovered on a node.
type Device struct {
	// Index is the NVML index (0..N-1); devices are published in index order.
	Index int `json:"index"`
	// Minor is the /dev/nvidiaN minor number.
	Minor int    `json:"minor"`
	UUID  string `json:"uuid"`
	// ProductName as NVML reports it, e.g. "NVIDIA H100 80GB HBM3".
	ProductName string `json:"productName"`
	// Architecture in lower case, e.g. "hopper", "volta", "blackwell".
	Architecture string `json:"architecture"`
	// CUDAComputeCapability as "major.minor", e.g. "9.0".
	CUDAComputeCapability string `json:"cudaComputeCapability"`
	// DriverVersion of the kernel driver, e.g. "550.54.15".
	DriverVersion string `json:"driverVersion"`
	// CUDADriverVersion is the CUDA version the driver supports, e.g. "12.4".
	CUDADriverVersion string `json:"cudaDriverVersion"`
	// MemoryBytes is the total framebuffer memory.
	MemoryBytes int64 `json:"memoryBytes"`
	// PCIBusID in extended BDF form, lower case: "0000:18:00.0".
	PCIBusID string `json:"pciBusID"`
	// NUMANode is the NUMA node the GPU is attached to, -1 when none.
	NUMANode int `json:"numaNode"`
	// Fabric is set when the GPU belongs to a multi-node NVLink fabric
	// (GB200 NVL72 and similar); nil otherwise.
	Fabric *Fabric `json:"fabric,omitempty"`
	// FabricPending is true while the GPU's registration with the NVLink
	// fabric is still in progress: Fabric is not known yet and discovery
	// should be repeated.
	FabricPending bool `json:"fabricPending,omitempty"`
	// NVLinks is the number of the GPU's active NVLink links, to peers and
	// to NVSwitches alike; 0 means "count the lanes of Links".
	NVLinks int `json:"nvlinks,omitempty"`
	// FabricUnready, when set, says why CUDA cannot use the GPU because
	// of its NVLink fabric: registration not started (no fabric manager),
	// still in progress, or failed. Such a GPU is published tainted.
	FabricUnready *Condition `json:"fabricUnready,omitempty"`
}

// Condition is a reason a GPU cannot be used.
type Condition struct {
	// Reason is short and machine-friendly, e.g. FabricNotStarted; it
	// becomes the value of the unhealthy taint.
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Reasons of a GPU's FabricUnready.
const (
	FabricNotStarted = "FABRIC-NOT-STARTED"
	FabricInProgress = "FABRIC-IN-PROGRESS"
	FabricFailed     = "FABRIC-FAILED"
)

// Skipped is a GPU that discovery found but does not publish.
type Skipped struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid,omitempty"`
	// Reason is a short machine-friendly cause, e.g. "MIG-ENABLED",
	// "GPU-LOST"; it labels the skipped-GPUs metric.
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Fabric identifies a GPU's multi-node NVLink partition.
type Fabric struct {
	// ClusterUUID is the NVLink fabric cluster the GPU is registered with.
	ClusterUUID string `json:"clusterUUID"`
	// CliqueID separates partitions inside one cluster.
	CliqueID uint32 `json:"cliqueID"`
}

// Link is an undirected NVLink connection between two GPUs of one node,
// aggregating every active lane between them.
type Link struct {
	// A and B are device indexes with A < B.
	A int `json:"a"`
	B int `json:"b"`
	// Count is the number of active NVLink lanes joining A and B.
	Count int `json:"count"`
}

// Inventory is everything discovery found on a node.
type Inventory struct {
	Devices []Device `json:"devices"`
	Links   []Link   `json:"links"`
	// Skipped lists GPUs left out of Devices, e.g. lost or in MIG mode.
	Skipped []Skipped `json:"skipped,omitempty"`
	// LinkBandwidthGBps is the unidirectional bandwidth of one NVLink lane in
	// GB/s for this GPU generation; 0 when the node has no NVLink.
	LinkBandwidthGBps float64 `json:"linkBandwidthGBps"`
	// SysFS, when set, replaces the host's /sys for PCIe root and NUMA
	// look-ups (the simulated backend supplies a synthetic one).
	SysFS fs.ReadLinkFS `json:"-"`
}

// HealthEvent reports a change in a device's health, or, with Watch set
// and no UUID, in the health watch itself.
type HealthEvent struct {
	UUID    string
	Healthy bool
	// Reason is a short machine-friendly cause, e.g. "XID-79".
	Reason string
	// Message is a human-readable detail.
	Message string
	// Persist marks a condition that lasts until the GPU is reset (an Xid
	// or ECC error: NVML reports no repair), which the plugin keeps across
	// its restarts; a lost GPU, which answers again, is not one.
	Persist bool
	// Watch, when set, reports on the watch rather than a GPU.
	Watch WatchState
}

// WatchState is how a health watch fares.
type WatchState string

const (
	// WatchActive: the watch follows the GPUs' health (again), or there is
	// nothing it could follow (no GPU supports health events).
	WatchActive WatchState = "Active"
	// WatchFailing: the watch cannot read the GPUs' health for now;
	// Message says why.
	WatchFailing WatchState = "Failing"
)

// Backend discovers GPUs and streams their health.
type Backend interface {
	// Name is "nvml" or "sim".
	Name() string
	// Discover returns the node's GPUs and NVLink graph.
	Discover(ctx context.Context) (*Inventory, error)
	// WatchHealth sends health changes until ctx is done, then returns nil.
	// It sends a WatchActive event once it follows the GPUs, WatchFailing
	// while it cannot, and returns an error when it cannot start; the
	// caller retries. It must not block forever on a full channel once ctx
	// is done.
	WatchHealth(ctx context.Context, events chan<- HealthEvent) error
	// Close releases the backend's resources.
	Close() error
}

// ComputeMode is a GPU's compute mode, spelt as nvidia-smi -c takes it.
type ComputeMode string

const (
	// ComputeModeDefault: any number of processes use the GPU.
	ComputeModeDefault ComputeMode = "DEFAULT"
	// ComputeModeExclusiveThread is deprecated by NVIDIA; read only.
	ComputeModeExclusiveThread ComputeMode = "EXCLUSIVE_THREAD"
	// ComputeModeProhibited: no process uses the GPU.
	ComputeModeProhibited ComputeMode = "PROHIBITED"
	// ComputeModeExclusiveProcess: one process uses the GPU; with MPS,
	// that is the MPS server, through which all clients go.
	ComputeModeExclusiveProcess ComputeMode = "EXCLUSIVE_PROCESS"
)

// ComputeModes reads and sets GPUs' compute modes, by UUID. Backends that
// can change them implement it; a mode set outlives the process that set
// it, as a GPU's does.
type ComputeModes interface {
	ComputeMode(uuid string) (ComputeMode, error)
	SetComputeMode(uuid string, mode ComputeMode) error
}
