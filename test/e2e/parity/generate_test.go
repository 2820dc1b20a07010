package parity

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	gputopology "github.com/gputopo/gputopo/pkg/topology"
)

// Workload shapes: what the Job's pods ask for.
const (
	shapeNode8   = "gpu-8-node"        // one whole node per pod
	shapeQuad    = "gpu-4-nvlink"      // one NVLink quad per pod
	shapeOne     = "gpu-1"             // one GPU per pod
	shapeShared  = "shared-claim"      // one user ResourceClaim for every pod (resourceClaimName)
	shapeAdmin   = "admin-access"      // adminAccess: true, in a namespace that allows it
	shapeMissing = "missing-attribute" // asks for an attribute no device has: refused by both
	shapeShare   = "gpu-share"         // a share of a shared GPU (consumable capacity)
	shapeOther   = "other-driver"      // one GPU and one device of another driver (cluster-wide, per leaf or per node)
	shapeExtRes  = "extended-resource" // limits: gputopo.dev/gpu, a DRA extended resource (no claim in the pod)
)

// The other driver: its DeviceClass, the attribute that says where its
// devices are, and the scopes it publishes (see setupOtherDriver).
const (
	otherDriver   = "nic.example.com"
	otherScope    = "scope"
	extendedName  = "gputopo.dev/gpu" // the extended resource of extendedClass
	extendedClass = "gpu-extended.gputopo.dev"
)

// otherScopes: a pool for every node (allNodes), a pool for the nodes of
// one leaf (nodeSelector), and a pool on each node (nodeName).
var otherScopes = []string{"all", "leaf", "node"}

// Keys of the taints the generator puts on devices and nodes.
const (
	deviceTaintKey = "example.com/broken"
	nodeTaintKey   = "example.com/maintenance"
	// foreignGate is another controller's scheduling gate (a queue), which
	// the test removes once both sides have seen the pods wait for it.
	foreignGate = "example.com/queue"
)

// caseSpec is one generated case: a cluster state and a workload, run once
// through kube-scheduler alone and once opted in to gputopo.
type caseSpec struct {
	Seed  uint64
	Index int
	Shape string
	// Variant says which claim of the shape (a template, a selector).
	Variant   string
	Namespace string
	Pods      int
	// Claim is the claim of every pod (generated from a template), or the
	// one user claim all pods share (Shared).
	Claim  resourcev1.ResourceClaimSpec
	Shared bool
	// Admin: the claim's requests have adminAccess.
	Admin bool
	// Extended: GPUs per pod through the extended resource instead of a
	// claim.
	Extended int

	// State.
	Holders              []holder
	TaintRules           []taintRule
	TolerateDeviceTaints bool // the claim's requests tolerate deviceTaintKey
	TaintedNode          string
	TolerateNodeTaint    bool   // the pods tolerate nodeTaintKey
	Leaf                 string // nodeSelector on the leaf, or ""
	ForeignGate          bool
	// Spread: the pods carry a topology spread constraint on
	// kubernetes.io/hostname over the run's pods, maxSkew 1 (DoNotSchedule):
	// one pod per node, as the cluster has more nodes than a case has pods.
	Spread bool
	// VolumeNodes: every pod uses one PersistentVolumeClaim, bound to a
	// volume whose node affinity allows these nodes only (all but one, or
	// one leaf's); empty: no volume.
	VolumeNodes []string
}

// holder is a plain pod, created before the case, that holds GPUs of one
// node through a claim kube-scheduler allocated.
type holder struct {
	Namespace, Template, Node string
}

// taintRule is a DeviceTaintRule with effect NoSchedule on one device of a
// node, or on all of them (Device "").
type taintRule struct {
	Node, Device string
}

func (c *caseSpec) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d case %d: %s", c.Seed, c.Index, c.Shape)
	if c.Variant != "" {
		fmt.Fprintf(&b, " (%s)", c.Variant)
	}
	if c.Extended > 0 {
		fmt.Fprintf(&b, " (%s: %d)", extendedName, c.Extended)
	}
	fmt.Fprintf(&b, ", %d pod(s) in %s", c.Pods, c.Namespace)
	for _, h := range c.Holders {
		fmt.Fprintf(&b, "; held: %s on %s (ns %s)", h.Template, h.Node, h.Namespace)
	}
	for _, r := range c.TaintRules {
		d := r.Device
		if d == "" {
			d = "*"
		}
		fmt.Fprintf(&b, "; DeviceTaintRule NoSchedule %s/%s", r.Node, d)
	}
	if len(c.TaintRules) > 0 {
		fmt.Fprintf(&b, " (claim tolerates: %v)", c.TolerateDeviceTaints)
	}
	if c.TaintedNode != "" {
		fmt.Fprintf(&b, "; node taint NoSchedule on %s (pods tolerate: %v)", c.TaintedNode, c.TolerateNodeTaint)
	}
	if c.Leaf != "" {
		fmt.Fprintf(&b, "; nodeSelector leaf %s", c.Leaf)
	}
	if c.ForeignGate {
		fmt.Fprintf(&b, "; foreign gate %s", foreignGate)
	}
	if c.Spread {
		b.WriteString("; spread by kubernetes.io/hostname, maxSkew 1")
	}
	if len(c.VolumeNodes) > 0 {
		fmt.Fprintf(&b, "; a volume on %s", strings.Join(c.VolumeNodes, ","))
	}
	return b.String()
}

// clusterShape is what the generator knows of the cluster.
type clusterShape struct {
	nodes   []string          // in topology order
	leafOf  map[string]string // node → leaf
	leaves  []string
	profile map[string]string // node → GPU profile
	shared  map[string]bool   // nodes whose GPUs are published for sharing
	// namespaces the workload may go to; adminNamespace allows adminAccess.
	namespaces     []string
	adminNamespace string
	// templates are demo/specs/claims by name.
	templates map[string]*resourcev1.ResourceClaimTemplate
	// otherDriver: the other driver's devices are published;
	// extended: the API server serves DeviceClass.extendedResourceName.
	otherDriver, extended bool
	otherLeaf             string // the leaf whose nodes the other driver's "leaf" pool serves
	// taintRules: the API server serves DeviceTaintRules in
	// resource.k8s.io/v1 (1.37 on), so cases may have them.
	taintRules bool
}

// shapes lists the shapes the cluster can run: gpu-share only where a
// node publishes shared GPUs.
func (cs *clusterShape) shapes() []string {
	out := []string{shapeNode8, shapeQuad, shapeOne, shapeShared, shapeAdmin, shapeMissing}
	if len(cs.shared) > 0 {
		out = append(out, shapeShare)
	}
	if cs.otherDriver {
		out = append(out, shapeOther)
	}
	if cs.extended {
		out = append(out, shapeExtRes)
	}
	return out
}

// claimOf returns a copy of a demo template's claim spec.
func (cs *clusterShape) claimOf(template string) resourcev1.ResourceClaimSpec {
	t, ok := cs.templates[template]
	if !ok {
		panic("no demo claim template " + template)
	}
	return *t.Spec.Spec.DeepCopy()
}

// hasQuad reports whether a profile has aligned NVLink quads.
func hasQuad(profile string) bool { return profile != "pcie-only" }

// generate makes case index of a seed. The same seed, index and cluster
// always give the same case.
func generate(cs *clusterShape, seed uint64, index int) *caseSpec {
	r := rand.New(rand.NewPCG(seed, uint64(index)))
	shapes := cs.shapes()
	c := &caseSpec{Seed: seed, Index: index, Shape: shapes[r.IntN(len(shapes))], Pods: 1 + r.IntN(4)}
	c.Namespace = cs.namespaces[r.IntN(len(cs.namespaces))]

	switch c.Shape {
	case shapeNode8, shapeQuad, shapeOne:
		c.Claim = cs.claimOf(c.Shape)
	case shapeShared:
		c.Variant = []string{shapeOne, shapeQuad, shapeNode8}[r.IntN(3)]
		c.Claim, c.Shared = cs.claimOf(c.Variant), true
	case shapeAdmin:
		c.Variant = []string{shapeOne, shapeNode8}[r.IntN(2)]
		c.Claim, c.Admin = cs.claimOf(c.Variant), true
		c.Namespace = cs.adminNamespace
		for i := range c.Claim.Devices.Requests {
			c.Claim.Devices.Requests[i].Exactly.AdminAccess = ptr.To(true)
		}
	case shapeMissing:
		c.Claim = cs.claimOf(shapeOne)
		req := c.Claim.Devices.Requests[0].Exactly
		switch r.IntN(3) {
		case 0:
			c.Variant = "optional CEL"
			req.Selectors = append(req.Selectors, resourcev1.DeviceSelector{CEL: &resourcev1.CELDeviceSelector{
				Expression: fmt.Sprintf(`device.attributes[%q].?noSuchAttribute.orValue("") == "x"`, gputopology.DriverName)}})
		case 1:
			c.Variant = "plain CEL"
			req.Selectors = append(req.Selectors, resourcev1.DeviceSelector{CEL: &resourcev1.CELDeviceSelector{
				Expression: fmt.Sprintf(`device.attributes[%q].noSuchAttribute == "x"`, gputopology.DriverName)}})
		default:
			c.Variant = "matchAttribute"
			req.Count = 2
			c.Claim.Devices.Constraints = append(c.Claim.Devices.Constraints, resourcev1.DeviceConstraint{
				Requests: []string{c.Claim.Devices.Requests[0].Name}, MatchAttribute: ptr.To(resourcev1.FullyQualifiedName(gputopology.DriverName + "/noSuchAttribute"))})
		}
	case shapeShare:
		c.Variant = []string{"gpu-share-quarter", "gpu-share-half"}[r.IntN(2)]
		c.Claim = cs.claimOf(c.Variant)
	case shapeOther:
		c.Variant = otherScopes[r.IntN(len(otherScopes))]
		c.Claim = cs.claimOf(shapeOne)
		c.Claim.Devices.Requests = append(c.Claim.Devices.Requests, resourcev1.DeviceRequest{Name: "nic", Exactly: &resourcev1.ExactDeviceRequest{
			DeviceClassName: otherDriver, Count: 1,
			Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{
				Expression: fmt.Sprintf(`device.attributes[%q].%s == %q`, otherDriver, otherScope, c.Variant)}}},
		}})
	case shapeExtRes:
		c.Extended = []int{1, 4, 8}[r.IntN(3)]
	}

	// GPUs held by other claims: up to two holders on distinct nodes, each
	// with a claim its node can give.
	nodes := slices.Clone(cs.nodes)
	r.Shuffle(len(nodes), func(i, j int) { nodes[i], nodes[j] = nodes[j], nodes[i] })
	for _, n := range nodes[:r.IntN(3)] {
		choices := []string{"gpu-1", "gpu-8-node"}
		if hasQuad(cs.profile[n]) {
			choices = append(choices, "gpu-4-nvlink")
		}
		if cs.shared[n] {
			choices = append(choices, "gpu-share-quarter", "gpu-share-half")
		}
		c.Holders = append(c.Holders, holder{Namespace: cs.namespaces[r.IntN(len(cs.namespaces))], Template: choices[r.IntN(len(choices))], Node: n})
	}

	// DeviceTaintRules: none, one or two, each on one GPU or a whole node;
	// none where the cluster does not serve them (Kubernetes 1.36).
	rules := 0
	if cs.taintRules {
		rules = r.IntN(3)
	}
	for range rules {
		rule := taintRule{Node: cs.nodes[r.IntN(len(cs.nodes))]}
		if r.IntN(2) == 0 {
			rule.Device = fmt.Sprintf("gpu-%d", r.IntN(8))
		}
		if !slices.Contains(c.TaintRules, rule) {
			c.TaintRules = append(c.TaintRules, rule)
		}
	}
	if len(c.TaintRules) > 0 && c.Extended == 0 { // an extended resource has no tolerations
		c.TolerateDeviceTaints = r.IntN(2) == 0
		if c.TolerateDeviceTaints {
			for i := range c.Claim.Devices.Requests {
				e := c.Claim.Devices.Requests[i].Exactly
				e.Tolerations = append(e.Tolerations, resourcev1.DeviceToleration{
					Key: deviceTaintKey, Operator: resourcev1.DeviceTolerationOpExists, Effect: resourcev1.DeviceTaintEffectNoSchedule})
			}
		}
	}
	if r.IntN(5) < 2 {
		c.TaintedNode = cs.nodes[r.IntN(len(cs.nodes))]
		c.TolerateNodeTaint = r.IntN(2) == 0
	}
	if r.IntN(10) < 3 {
		c.Leaf = cs.leaves[r.IntN(len(cs.leaves))]
	}
	c.ForeignGate = r.IntN(5) == 0
	// Drawn last, so the cases before it were kept. Not with one claim
	// all the pods share (one node, so no spread), nor with a leaf's
	// nodeSelector (fewer nodes than pods: the pods stack, in an order).
	c.Spread = r.IntN(4) == 0 && c.Pods > 1 && !c.Shared && c.Leaf == ""
	// Drawn after it, so the cases before it were kept: a volume claim
	// that holds the pods to all nodes but one, or to one leaf.
	if r.IntN(5) == 0 {
		off, leaf := cs.nodes[r.IntN(len(cs.nodes))], cs.leaves[r.IntN(len(cs.leaves))]
		oneLeaf := r.IntN(2) == 0
		for _, n := range cs.nodes {
			if (oneLeaf && cs.leafOf[n] == leaf) || (!oneLeaf && n != off) {
				c.VolumeNodes = append(c.VolumeNodes, n)
			}
		}
	}
	return c
}
