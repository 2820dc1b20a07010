package planner

import (
	"fmt"
	"slices"
	"sort"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/gputopo/gputopo/pkg/topology"
)

// NodeInfo is what the planner knows about one node.
type NodeInfo struct {
	Name   string
	Leaf   string // empty: the node only serves one-pod and cluster-wide plans
	Spine  string // empty: the leaf is adjacent to no other leaf
	Labels map[string]string
	// Slices are the node's own ResourceSlices (NodeLocal names the
	// node), of every driver. Slices that are not local to one node are
	// the cluster's (NewCluster's shared, WithShared), not any node's.
	Slices        []*resourceapi.ResourceSlice
	Unschedulable bool
	// NotReady: the node's Ready condition is not True. No pod is planned
	// there, whatever it tolerates.
	NotReady bool
	// Taints are checked against each pod's tolerations; only NoSchedule
	// and NoExecute taints keep a pod away.
	Taints []v1.Taint
	// Allocatable is what pods may request in all (cpu, memory, pods and
	// any other resource). Nil means unknown: the planner then checks no
	// resource on the node. An empty list fits no pod.
	Allocatable v1.ResourceList
}

// NodeInfoFor reads a Node's place in the network from its labels, and
// its readiness, taints and allocatable from its spec and status.
func NodeInfoFor(node *v1.Node, slices []*resourceapi.ResourceSlice, labels topology.LabelMapping) NodeInfo {
	p := labels.Resolve(node.Labels)
	alloc := node.Status.Allocatable
	if alloc == nil {
		alloc = v1.ResourceList{}
	}
	return NodeInfo{Name: node.Name, Leaf: p.Leaf, Spine: p.Spine, Labels: node.Labels, Slices: slices,
		Unschedulable: node.Spec.Unschedulable, NotReady: !nodeReady(node), Taints: node.Spec.Taints, Allocatable: alloc}
}

func nodeReady(node *v1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// Cluster is the static topology tree. It never changes after NewCluster
// and is safe to share between concurrent plans.
type Cluster struct {
	nodes    []*node // in topology order: spine, leaf, node name
	byName   map[string]int
	spines   []*spine // real spines first, then one pseudo spine per spine-less leaf
	leaves   []*leaf
	leafByN  map[string]*leaf
	spineByN map[string]*spine
	devIndex map[structured.DeviceID]devRef
	// devOver holds the device index's changes since devIndex was built:
	// devices of added nodes, and removed ones with node -1 (membership.go).
	devOver map[structured.DeviceID]devRef
	vacant  []int // slots of removed nodes, taken by the next added node
	// ranks gives each node its place in topology order, which breaks
	// ties between nodes; nil while node indexes are that order.
	ranks func() []int32
	sigs  signatures
	res   resources
	// shared are the devices of the slices not local to one node
	// (nonlocal.go); never nil.
	shared *nonLocal
}

type node struct {
	idx         int
	name        string
	leaf        *leaf
	spine       *spine
	obj         *v1.Node
	slices      []*resourceapi.ResourceSlice
	schedulable bool
	devs        []structured.DeviceID // position → device
	all         bitset                // every device, any driver
	gpus        bitset                // gputopo GPUs
	healthy     bitset                // gputopo GPUs without a NoSchedule/NoExecute taint
	noPrefilter bool                  // shareable devices of its own: counting devices proves nothing
	reach       reach                 // the non-local devices it can use
	sig         nodeSig
	notReady    bool
	gone        bool // the empty slot of a removed node
	taints      []v1.Taint
	alloc       []int64 // by resource index; nil: resources are not checked
	// healthyGPUs lists the healthy GPUs in position order, so that
	// scoring every node for a one-pod job reads one short array per node
	// instead of the node's ResourceSlices.
	healthyGPUs []gpuSlot
}

type leaf struct {
	name  string
	spine *spine
	idx   int // global index into Cluster.leaves
	pos   int // position under its spine
	nodes []int
}

type spine struct {
	name   string // empty for the pseudo spine of a spine-less leaf
	idx    int
	leaves []*leaf
	nodes  []int // the leaves' nodes, then the spine's leaf-less nodes
	extra  int   // how many leaf-less nodes the spine has
}

type devRef struct{ node, pos int32 }

// gpuSlot is one healthy GPU of a node: its position, name and whether it
// is published for sharing.
type gpuSlot struct {
	pos    int32
	name   string
	shared bool
}

// NewCluster builds the tree. leafOrder gives, per spine, the order of its
// leaves, which defines adjacency; leaves it does not name follow in
// natural name order ("leaf-2" before "leaf-10"). shared are the
// ResourceSlices that are local to no one node (allNodes, a nodeSelector,
// perDeviceNodeSelection), of every driver; see NodeLocal.
func NewCluster(infos []NodeInfo, leafOrder map[string][]string, shared ...*resourceapi.ResourceSlice) (*Cluster, error) {
	c := &Cluster{byName: map[string]int{}, leafByN: map[string]*leaf{}, spineByN: map[string]*spine{}, devIndex: map[structured.DeviceID]devRef{}}
	var err error
	if c.shared, err = newNonLocal(shared); err != nil {
		return nil, err
	}
	c.sigs.init()
	c.res.init(infos)
	byLeaf := map[string][]*NodeInfo{}
	bySpine := map[string][]*NodeInfo{} // leaf-less nodes that name a spine
	var loose []*NodeInfo
	leafSpine := map[string]string{}
	for i := range infos {
		in := &infos[i]
		if in.Name == "" {
			return nil, fmt.Errorf("node %d has no name", i)
		}
		if _, dup := c.byName[in.Name]; dup {
			return nil, fmt.Errorf("node %s is listed twice", in.Name)
		}
		c.byName[in.Name] = -1
		switch {
		case in.Leaf != "":
			if s, ok := leafSpine[in.Leaf]; ok && s != in.Spine {
				return nil, fmt.Errorf("leaf %s is under spine %q on one node and %q on node %s", in.Leaf, s, in.Spine, in.Name)
			}
			leafSpine[in.Leaf] = in.Spine
			byLeaf[in.Leaf] = append(byLeaf[in.Leaf], in)
		case in.Spine != "":
			bySpine[in.Spine] = append(bySpine[in.Spine], in)
		default:
			loose = append(loose, in)
		}
	}

	spineNames := map[string]bool{}
	for l, s := range leafSpine {
		if s != "" {
			spineNames[s] = true
		} else {
			c.spines = append(c.spines, &spine{leaves: []*leaf{{name: l}}})
		}
	}
	for s := range bySpine {
		spineNames[s] = true
	}
	for s := range leafOrder {
		if !spineNames[s] {
			return nil, fmt.Errorf("leaf order names spine %s, which no node is under", s)
		}
	}
	var real []*spine
	for _, name := range sortedNat(spineNames) {
		s := &spine{name: name}
		named := map[string]bool{}
		for _, l := range leafOrder[name] {
			if leafSpine[l] != name || byLeaf[l] == nil {
				return nil, fmt.Errorf("leaf order of spine %s names leaf %s, which has no node under that spine", name, l)
			}
			if named[l] {
				return nil, fmt.Errorf("leaf order of spine %s names leaf %s twice", name, l)
			}
			named[l] = true
			s.leaves = append(s.leaves, &leaf{name: l})
		}
		rest := map[string]bool{}
		for l, ls := range leafSpine {
			if ls == name && !named[l] {
				rest[l] = true
			}
		}
		for _, l := range sortedNat(rest) {
			s.leaves = append(s.leaves, &leaf{name: l})
		}
		real = append(real, s)
		c.spineByN[name] = s
	}
	sort.Slice(c.spines, func(a, b int) bool {
		return topology.NaturalLess(c.spines[a].leaves[0].name, c.spines[b].leaves[0].name)
	})
	c.spines = append(real, c.spines...)

	for si, s := range c.spines {
		s.idx = si
		for li, l := range s.leaves {
			l.spine, l.pos, l.idx = s, li, len(c.leaves)
			c.leaves = append(c.leaves, l)
			c.leafByN[l.name] = l
			for _, in := range sortedNodes(byLeaf[l.name]) {
				n, err := c.addNode(in, l, s)
				if err != nil {
					return nil, err
				}
				l.nodes = append(l.nodes, n)
				s.nodes = append(s.nodes, n)
			}
		}
		for _, in := range sortedNodes(bySpine[s.name]) {
			n, err := c.addNode(in, nil, s)
			if err != nil {
				return nil, err
			}
			s.nodes = append(s.nodes, n)
			s.extra++
		}
	}
	for _, in := range sortedNodes(loose) {
		if _, err := c.addNode(in, nil, nil); err != nil {
			return nil, err
		}
	}
	c.sigs.finish(c.nodes)
	return c, nil
}

func (c *Cluster) addNode(in *NodeInfo, l *leaf, s *spine) (int, error) {
	n, err := c.newNode(in, l, s, len(c.nodes))
	if err != nil {
		return 0, err
	}
	for pos, id := range n.devs {
		if prev, dup := c.devIndex[id]; dup {
			return 0, fmt.Errorf("device %s is published by node %s and node %s", id, c.nodes[prev.node].name, in.Name)
		}
		if _, dup := c.sharedPos(id); dup {
			return 0, fmt.Errorf("device %s is published by node %s and by a non-local ResourceSlice", id, in.Name)
		}
		c.devIndex[id] = devRef{node: int32(n.idx), pos: int32(pos)}
	}
	if err := c.sigs.add(n); err != nil {
		return 0, err
	}
	c.byName[in.Name] = n.idx
	c.nodes = append(c.nodes, n)
	return n.idx, nil
}

// newNode reads one node's devices; it touches nothing shared.
func (c *Cluster) newNode(in *NodeInfo, l *leaf, s *spine, idx int) (*node, error) {
	n := &node{
		idx: idx, name: in.Name, leaf: l, spine: s, schedulable: !in.Unschedulable,
		obj:      &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: in.Name, Labels: in.Labels}},
		notReady: in.NotReady, taints: in.Taints,
	}
	if in.Allocatable != nil {
		n.alloc = c.res.vector(in.Allocatable)
	}
	// Stale slices of an older pool generation are ignored by the
	// allocator; ignore them here too so they are not counted.
	maxGen := map[string]int64{}
	for _, sl := range in.Slices {
		key := sl.Spec.Driver + "/" + sl.Spec.Pool.Name
		maxGen[key] = max(maxGen[key], sl.Spec.Pool.Generation)
	}
	for _, sl := range in.Slices {
		if name, local := NodeLocal(sl); !local || name != in.Name {
			return nil, fmt.Errorf("ResourceSlice %s listed for node %s is not local to it; a slice local to no one node is the cluster's (NewCluster, WithShared)", sl.Name, in.Name)
		}
		if sl.Spec.Pool.Generation < maxGen[sl.Spec.Driver+"/"+sl.Spec.Pool.Name] {
			continue
		}
		n.slices = append(n.slices, sl)
	}
	total := 0
	for _, sl := range n.slices {
		total += len(sl.Spec.Devices)
	}
	n.all, n.gpus, n.healthy = newBitset(total), newBitset(total), newBitset(total)
	for _, sl := range n.slices {
		for _, d := range sl.Spec.Devices {
			pos := len(n.devs)
			n.devs = append(n.devs, structured.MakeDeviceID(sl.Spec.Driver, sl.Spec.Pool.Name, d.Name))
			n.all.set(pos)
			if d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations {
				n.noPrefilter = true
			}
			if sl.Spec.Driver == topology.DriverName {
				n.gpus.set(pos)
				if !blockingTaint(d.Taints) {
					n.healthy.set(pos)
					n.healthyGPUs = append(n.healthyGPUs, gpuSlot{pos: int32(pos), name: d.Name, shared: d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations})
				}
			}
		}
	}
	n.setReach(c.shared)
	return n, nil
}

// WithNode returns a copy of the tree in which one node's readiness,
// taints, labels, allocatable or slices are replaced, sharing everything
// else with c, which stays unchanged. It reports false, returning nil,
// when the change needs NewCluster: the node is new, it moved to another
// leaf or spine, its devices are not the same devices in the same order,
// or its allocatable names a resource no other node had. A node whose
// slices changed loses its signature, so the allocator is asked about it
// on its own until the next full build.
func (c *Cluster) WithNode(in NodeInfo) (*Cluster, bool) {
	i, ok := c.byName[in.Name]
	if !ok {
		return nil, false
	}
	old := c.nodes[i]
	var leafName, spineName string
	if old.leaf != nil {
		leafName = old.leaf.name
	}
	if old.spine != nil {
		spineName = old.spine.name
	}
	if in.Leaf != leafName || in.Spine != spineName {
		return nil, false
	}
	if !c.res.covers(in.Allocatable) {
		return nil, false
	}
	n, err := c.newNode(&in, old.leaf, old.spine, i)
	if err != nil || !slices.Equal(n.devs, old.devs) {
		return nil, false
	}
	n.sig = old.sig
	if !slices.Equal(n.slices, old.slices) {
		n.sig = nodeSig{core: -1}
	}
	out := *c
	out.nodes = slices.Clone(c.nodes)
	out.nodes[i] = n
	return &out, true
}

func blockingTaint(taints []resourceapi.DeviceTaint) bool {
	for _, t := range taints {
		if t.Effect == resourceapi.DeviceTaintEffectNoSchedule || t.Effect == resourceapi.DeviceTaintEffectNoExecute {
			return true
		}
	}
	return false
}

// Len is the number of nodes.
func (c *Cluster) Len() int { return len(c.nodes) - len(c.vacant) }

// Has says whether the cluster has the node.
func (c *Cluster) Has(node string) bool {
	_, ok := c.byName[node]
	return ok
}

// Spines lists the spines in order.
func (c *Cluster) Spines() []string {
	var out []string
	for _, s := range c.spines {
		if s.name != "" {
			out = append(out, s.name)
		}
	}
	return out
}

// Leaves lists a spine's leaves in adjacency order.
func (c *Cluster) Leaves(spineName string) []string {
	s := c.spineByN[spineName]
	if s == nil {
		return nil
	}
	out := make([]string, len(s.leaves))
	for i, l := range s.leaves {
		out[i] = l.name
	}
	return out
}

func sortedNodes(in []*NodeInfo) []*NodeInfo {
	out := slices.Clone(in)
	sort.Slice(out, func(a, b int) bool { return topology.NaturalLess(out[a].Name, out[b].Name) })
	return out
}

func sortedNat(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Slice(out, func(a, b int) bool { return topology.NaturalLess(out[a], out[b]) })
	return out
}

// DomainNodes lists the nodes of a domain in topology order; nil for the
// whole cluster, which needs no list. A name the cluster lacks is an error.
func (c *Cluster) DomainNodes(d Domain) ([]string, error) {
	idx, whole, err := c.domainIdx(d)
	if err != nil || whole {
		return nil, err
	}
	out := make([]string, len(idx))
	for i, n := range idx {
		out[i] = c.nodes[n].name
	}
	return out, nil
}

// domainIdx is DomainNodes as node indexes, or whole for the whole
// cluster.
func (c *Cluster) domainIdx(d Domain) (idx []int, whole bool, err error) {
	switch d.Level {
	case LevelNode:
		for _, name := range d.Names {
			i, ok := c.byName[name]
			if !ok {
				return nil, false, fmt.Errorf("node %s is not in the cluster", name)
			}
			idx = append(idx, i)
		}
	case LevelLeaf, LevelLeaves:
		for _, name := range d.Names {
			l := c.leafByN[name]
			if l == nil {
				return nil, false, fmt.Errorf("leaf %s is not in the cluster", name)
			}
			idx = append(idx, l.nodes...)
		}
	case LevelSpine, LevelCluster:
		if len(d.Names) == 0 {
			return nil, true, nil
		}
		for _, name := range d.Names {
			s := c.spineByN[name]
			if s == nil {
				return nil, false, fmt.Errorf("spine %s is not in the cluster", name)
			}
			idx = append(idx, s.nodes...)
		}
	default:
		return nil, false, fmt.Errorf("unknown domain level %q", d.Level)
	}
	return idx, false, nil
}

// LeafOf is the node's leaf, empty when it has none.
func (c *Cluster) LeafOf(node string) (string, error) {
	i, ok := c.byName[node]
	if !ok {
		return "", fmt.Errorf("node %s is not in the cluster", node)
	}
	if l := c.nodes[i].leaf; l != nil {
		return l.name, nil
	}
	return "", nil
}
