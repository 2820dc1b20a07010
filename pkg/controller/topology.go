package controller

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/cache"

	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/topology"
)

// sliceNodeIndex indexes ResourceSlices by the node they are local to,
// and those local to no one node (allNodes, a nodeSelector,
// perDeviceNodeSelection) under nonLocalKey.
const sliceNodeIndex = "gputopo-slice-node"

// nonLocalKey is no node's name: node names have no "/".
const nonLocalKey = "/non-local"

func indexSliceByNode(obj any) ([]string, error) {
	s, ok := obj.(*resourceapi.ResourceSlice)
	if !ok {
		return nil, nil
	}
	if node, local := planner.NodeLocal(s); local {
		return []string{node}, nil
	}
	return []string{nonLocalKey}, nil
}

// topoState is what the planner knows of each node, kept from node and
// slice events one node at a time: an event reads that node and its
// slices, never the whole cluster, and the tree is patched, or built
// again, only at the next plan and only when what the planner sees of
// some node changed. Guarded by Controller.mu.
type topoState struct {
	infos   map[string]planner.NodeInfo
	changed map[string]bool // patched into the tree at the next plan
	rebuild bool            // the next plan builds the tree from every node
	// shared are the slices local to no one node, by name; sharedChanged
	// is set until the tree has them.
	shared        []*resourceapi.ResourceSlice
	sharedChanged bool
	// patched lists the nodes patched into the tree since the snapshot
	// tracker last followed it; built is set when the tree was built.
	patched []string
	built   bool
	work    TopologyWork
}

// TopologyWork counts the work the topology path has done.
type TopologyWork struct {
	// NodesRead counts NodeInfos computed from a Node and its slices.
	NodesRead int
	// NodesBuilt counts nodes put into a tree: every node by a build,
	// one by a patch.
	NodesBuilt int
	// NodesRemoved counts nodes that went away.
	NodesRemoved int
	// SharedRead counts the times the slices local to no one node were
	// read, and SharedApplied the times the tree took a new set of them.
	SharedRead, SharedApplied int
	// Snapshot is what keeping the plans' snapshot up to date cost.
	Snapshot planner.TrackerWork
}

func newTopoState() topoState {
	return topoState{infos: map[string]planner.NodeInfo{}, changed: map[string]bool{}, rebuild: true}
}

// topologyWork returns the counts so far.
func (c *Controller) topologyWork() TopologyWork {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.topo.work
	if c.tracker != nil {
		w.Snapshot = c.tracker.Work()
	}
	return w
}

func (c *Controller) nodeHandler() cache.ResourceEventHandler {
	name := func(obj any) string {
		if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = t.Obj
		}
		if n, ok := obj.(*v1.Node); ok {
			return n.Name
		}
		return ""
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.refreshNode(name(obj)) },
		UpdateFunc: func(_, cur any) { c.refreshNode(name(cur)) },
		DeleteFunc: func(obj any) { c.refreshNode(name(obj)) },
	}
}

// sliceHandler keeps sliceIdx from the tracker's events, which carry the
// slices with DeviceTaintRules applied: a rule that taints a device
// arrives as an update of its slice. The index is updated before the
// node is read, so the node sees the new slice.
func (c *Controller) sliceHandler() cache.ResourceEventHandler {
	refresh := func(s *resourceapi.ResourceSlice) {
		if node, local := planner.NodeLocal(s); local {
			c.refreshNode(node)
			return
		}
		c.refreshShared()
	}
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if s, ok := obj.(*resourceapi.ResourceSlice); ok {
				_ = c.sliceIdx.Add(s)
				refresh(s)
			}
		},
		UpdateFunc: func(old, cur any) {
			s, ok := cur.(*resourceapi.ResourceSlice)
			if !ok {
				return
			}
			_ = c.sliceIdx.Update(s)
			// The same object again (a resync) changes nothing; a new
			// version, or a taint rule applied to the same version, may.
			if o, ok := old.(*resourceapi.ResourceSlice); !ok || o != s {
				refresh(s)
			}
		},
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if s, ok := obj.(*resourceapi.ResourceSlice); ok {
				_ = c.sliceIdx.Delete(s)
				refresh(s)
			}
		},
	}
}

// refreshNode reads one node and its slices from the informers' caches.
// When what the planner sees of it changed, the node (new, changed,
// moved or gone) is marked to be patched into the tree at the next plan,
// and the groups that wait for room try again. Node status heartbeats and slice
// resyncs change nothing and cost one NodeInfo.
func (c *Controller) refreshNode(name string) {
	if name == "" {
		return
	}
	c.mu.Lock()
	// The caches are read under the lock, so of two events for one node
	// the later one always records the newer state.
	info, exists, err := c.readNode(name)
	if err != nil {
		c.mu.Unlock()
		return
	}
	old, had := c.topo.infos[name]
	switch {
	case !exists && !had:
		c.mu.Unlock()
		return
	case !exists:
		delete(c.topo.infos, name)
		c.topo.changed[name] = true
		c.topo.work.NodesRemoved++
	case had && sameNodeInfo(old, info):
		c.mu.Unlock()
		return
	default:
		c.topo.infos[name] = info
		c.topo.changed[name] = true
	}
	clear(c.unreservable) // the node may make room for them
	c.mu.Unlock()
	c.syncGroupsOn(name)
	c.requeuePending()
}

// refreshShared reads the slices local to no one node from the cache.
// When they changed, the tree takes them at the next plan, and the
// groups that wait for room try again: a device of such a slice may be
// what they wait for. Groups that run keep their allocations, as they do
// when a node's own slice changes.
func (c *Controller) refreshShared() {
	c.mu.Lock()
	objs, err := c.sliceIdx.ByIndex(sliceNodeIndex, nonLocalKey)
	if err != nil {
		c.mu.Unlock()
		return
	}
	c.topo.work.SharedRead++
	shared := make([]*resourceapi.ResourceSlice, 0, len(objs))
	for _, o := range objs {
		shared = append(shared, o.(*resourceapi.ResourceSlice))
	}
	// A fixed order keeps the devices in the same positions from one
	// read to the next.
	slices.SortFunc(shared, func(a, b *resourceapi.ResourceSlice) int { return cmp.Compare(a.Name, b.Name) })
	if slices.Equal(shared, c.topo.shared) {
		c.mu.Unlock()
		return
	}
	c.topo.shared, c.topo.sharedChanged = shared, true
	clear(c.unreservable) // the devices may make room for them
	c.mu.Unlock()
	c.requeuePending()
}

// readNode computes a node's NodeInfo from the caches. Called with c.mu
// held.
func (c *Controller) readNode(name string) (planner.NodeInfo, bool, error) {
	node, err := c.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		return planner.NodeInfo{}, false, nil
	}
	if err != nil {
		return planner.NodeInfo{}, false, err
	}
	objs, err := c.sliceIdx.ByIndex(sliceNodeIndex, name)
	if err != nil {
		return planner.NodeInfo{}, false, err
	}
	own := make([]*resourceapi.ResourceSlice, 0, len(objs))
	for _, o := range objs {
		own = append(own, o.(*resourceapi.ResourceSlice))
	}
	// The index returns a set: a fixed order keeps the node's devices in
	// the same positions from one read to the next.
	slices.SortFunc(own, func(a, b *resourceapi.ResourceSlice) int { return cmp.Compare(a.Name, b.Name) })
	c.topo.work.NodesRead++
	return planner.NodeInfoFor(node, own, c.network), true, nil
}

// sameNodeInfo reports whether the planner would see no difference. The
// caches hand out the same object until it changes, so slices compare by
// identity.
func sameNodeInfo(a, b planner.NodeInfo) bool {
	return a.Name == b.Name && a.Leaf == b.Leaf && a.Spine == b.Spine && maps.Equal(a.Labels, b.Labels) &&
		slices.Equal(a.Slices, b.Slices) && a.Unschedulable == b.Unschedulable && a.NotReady == b.NotReady &&
		equality.Semantic.DeepEqual(a.Taints, b.Taints) && equality.Semantic.DeepEqual(a.Allocatable, b.Allocatable)
}

// SetLabelMapping reads every node again with a new label mapping, which
// can move any node, and retries the groups that wait.
func (c *Controller) SetLabelMapping(m topology.LabelMapping) {
	c.mu.Lock()
	c.network = m
	for name := range c.topo.infos {
		if info, exists, err := c.readNode(name); err == nil && exists {
			c.topo.infos[name] = info
		}
	}
	c.topo.rebuild = true
	c.mu.Unlock()
	if c.pins != nil {
		c.pins.setLabelMapping(m)
	}
	c.requeuePending()
}

// snapshotCluster returns the static tree with every node change since
// the last plan applied: patched where the planner can (a node changed,
// came, went or moved), built from the recorded NodeInfos where it cannot.
func (c *Controller) snapshotCluster() (*planner.Cluster, error) {
	cl, _, err := c.updateTree()
	return cl, err
}

// updateTree is snapshotCluster that also says how long bringing the tree
// up to date took, which tree_update_duration_seconds records by kind.
func (c *Controller) updateTree() (*planner.Cluster, time.Duration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &c.topo
	if c.cluster != nil && !t.rebuild && len(t.changed) == 0 && !t.sharedChanged {
		return c.cluster, 0, nil
	}
	start := time.Now()
	if c.cluster != nil && !t.rebuild {
		for name := range t.changed {
			cl, ok := c.patchNode(name)
			if !ok {
				t.rebuild = true
				break
			}
			c.cluster = cl
			if _, ok := t.infos[name]; ok {
				t.work.NodesBuilt++
			}
			delete(t.changed, name)
			t.patched = append(t.patched, name)
		}
		if !t.rebuild && t.sharedChanged {
			cl, err := c.cluster.WithShared(t.shared)
			if err != nil {
				return nil, 0, fmt.Errorf("apply the ResourceSlices local to no one node: %w", err)
			}
			c.cluster, t.sharedChanged = cl, false
			t.work.SharedApplied++
		}
		if !t.rebuild {
			d := time.Since(start)
			c.cfg.Metrics.TreeDuration.WithLabelValues(TreePatch).Observe(d.Seconds())
			return c.cluster, d, nil
		}
	}
	infos := make([]planner.NodeInfo, 0, len(t.infos))
	for _, in := range t.infos {
		infos = append(infos, in)
	}
	cl, err := planner.NewCluster(infos, c.cfg.LeafOrder, t.shared...)
	if err != nil {
		return nil, 0, fmt.Errorf("build topology tree: %w", err)
	}
	t.work.NodesBuilt += len(infos)
	if t.sharedChanged {
		t.sharedChanged = false
		t.work.SharedApplied++
	}
	c.cluster, t.rebuild, t.built, t.patched = cl, false, true, nil
	clear(t.changed)
	d := time.Since(start)
	c.cfg.Metrics.TreeDuration.WithLabelValues(TreeBuild).Observe(d.Seconds())
	return cl, d, nil
}

// patchNode applies one node's recorded change to the tree: the node
// changed in place, came, went, or moved. Called with c.mu held.
func (c *Controller) patchNode(name string) (*planner.Cluster, bool) {
	info, ok := c.topo.infos[name]
	if !ok {
		return c.cluster.WithoutNode(name)
	}
	if cl, ok := c.cluster.WithNode(info); ok {
		return cl, true
	}
	base := c.cluster
	if base.Has(name) { // it moved to another leaf or spine, or its devices changed
		if base, ok = base.WithoutNode(name); !ok {
			return nil, false
		}
	}
	return base.WithNewNode(info)
}

// planSnapshot is the snapshot of cl a plan works on: the tracker,
// brought up to date with the claims and pods that changed since the last
// plan, follows cl, patched node by node or, after a build, built again.
// Called with c.mu held.
func (c *Controller) planSnapshot(cl *planner.Cluster) *planner.Snapshot {
	t := &c.topo
	switch {
	case c.tracker == nil || t.built:
		c.tracker = nil // built again by track, with every device and node
	case c.tracker.Cluster() != cl:
		c.index.mu.Lock()
		c.tracker.Rebase(cl, t.patched, c.index.held, c.usage)
		c.index.mu.Unlock()
	}
	if c.tracker != nil {
		for node := range c.usageDirty {
			c.tracker.SetUsage(node, c.usage[node])
		}
	}
	t.built, t.patched = false, nil
	clear(c.usageDirty)
	tr, snap := c.index.track(c.tracker, cl, c.usage)
	c.tracker = tr
	return snap
}
