package planner

import (
	"maps"
	"slices"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/gputopo/gputopo/pkg/topology"
)

// Nodes that come and go. A tree is immutable, so adding or removing a
// node copies what it touches: the node list (pointers), the name index,
// and the spine the node is under with its leaves and their nodes
// (shallow copies, so that every node of the spine points at the new
// leaf and spine). No other node's devices are read again. A removed
// node leaves an empty slot, which the next added node takes, so node
// indexes, which snapshots and plans use, stay put.

// maxDevOverlay bounds the device index's overlay; past it the next
// change folds the overlay into a new index.
const maxDevOverlay = 4096

// rank is node n's place in topology order: spine, leaf, name, as
// NewCluster numbers the nodes.
func (c *Cluster) rank(n int) int {
	if c.ranks == nil {
		return n
	}
	return int(c.ranks()[n])
}

// topologyRanks walks the tree in topology order.
func (c *Cluster) topologyRanks() []int32 {
	out := make([]int32, len(c.nodes))
	next := int32(0)
	for i := range out {
		out[i] = int32(len(out)) // vacant slots last
	}
	for _, s := range c.spines {
		for _, n := range s.nodes {
			out[n], next = next, next+1
		}
	}
	var loose []int
	for i, nd := range c.nodes {
		if nd.spine == nil && !nd.gone {
			loose = append(loose, i)
		}
	}
	sortNat(c, loose)
	for _, n := range loose {
		out[n], next = next, next+1
	}
	return out
}

// dev finds a device's node and position.
func (c *Cluster) dev(id structured.DeviceID) (devRef, bool) {
	if r, ok := c.devOver[id]; ok {
		return r, r.node >= 0
	}
	r, ok := c.devIndex[id]
	return r, ok
}

// WithNewNode returns a copy of the tree with one more node, sharing
// everything the node does not touch with c, which stays unchanged. It
// reports false, returning nil, when the change needs NewCluster: the
// node is already in the tree, its leaf or spine is not (a new leaf
// changes the adjacency of its spine), its allocatable names a resource
// no other node had, or it publishes a device another node publishes.
// The new node's devices have no signature, so the allocator is asked
// about it on its own until the next full build.
func (c *Cluster) WithNewNode(in NodeInfo) (*Cluster, bool) {
	if in.Name == "" || c.Has(in.Name) || !c.res.covers(in.Allocatable) {
		return nil, false
	}
	var l *leaf
	var s *spine
	switch {
	case in.Leaf != "":
		if l = c.leafByN[in.Leaf]; l == nil || l.spine.name != in.Spine {
			return nil, false
		}
		s = l.spine
	case in.Spine != "":
		if s = c.spineByN[in.Spine]; s == nil {
			return nil, false
		}
	}
	idx := len(c.nodes)
	if len(c.vacant) > 0 {
		idx = c.vacant[len(c.vacant)-1]
	}
	n, err := c.newNode(&in, l, s, idx)
	if err != nil {
		return nil, false
	}
	for _, id := range n.devs {
		if _, dup := c.dev(id); dup {
			return nil, false
		}
		if _, dup := c.sharedPos(id); dup {
			return nil, false
		}
	}
	n.sig = nodeSig{core: -1}
	out := c.cloneIndexes()
	if idx < len(out.nodes) {
		out.vacant = out.vacant[:len(out.vacant)-1]
		out.nodes[idx] = n
	} else {
		out.nodes = append(out.nodes, n)
	}
	out.byName[in.Name] = idx
	for pos, id := range n.devs {
		out.devOver[id] = devRef{node: int32(idx), pos: int32(pos)}
	}
	if s != nil {
		out.respine(s, func(ns *spine, leafOf map[*leaf]*leaf) {
			if l == nil {
				ns.nodes = append(ns.nodes, idx)
				ns.extra++
				sortNat(out, ns.nodes[len(ns.nodes)-ns.extra:])
				return
			}
			nl := leafOf[l]
			nl.nodes = append(nl.nodes, idx)
			sortNat(out, nl.nodes)
		})
	}
	out.foldOverlay()
	return out, true
}

// WithoutNode returns a copy of the tree without the node, sharing
// everything else with c, which stays unchanged. It reports false,
// returning nil, when the node is not in the tree or was the last of its
// leaf or spine: those change the tree's shape and need NewCluster.
func (c *Cluster) WithoutNode(name string) (*Cluster, bool) {
	idx, ok := c.byName[name]
	if !ok {
		return nil, false
	}
	old := c.nodes[idx]
	if (old.leaf != nil && len(old.leaf.nodes) == 1) || (old.spine != nil && len(old.spine.nodes) == 1) {
		return nil, false
	}
	out := c.cloneIndexes()
	out.nodes[idx] = &node{idx: idx, name: "", gone: true, notReady: true}
	out.vacant = append(out.vacant, idx)
	delete(out.byName, name)
	for _, id := range old.devs {
		out.devOver[id] = devRef{node: -1}
	}
	if old.spine != nil {
		out.respine(old.spine, func(ns *spine, leafOf map[*leaf]*leaf) {
			if old.leaf != nil {
				nl := leafOf[old.leaf]
				nl.nodes = slices.DeleteFunc(nl.nodes, func(i int) bool { return i == idx })
			} else {
				ns.extra--
			}
		})
	}
	out.foldOverlay()
	return out, true
}

// cloneIndexes copies the tree's node list, name index, vacant slots and
// device overlay, so the copy can change them.
func (c *Cluster) cloneIndexes() *Cluster {
	out := *c
	out.nodes = slices.Clone(c.nodes)
	out.byName = maps.Clone(c.byName)
	out.vacant = slices.Clone(c.vacant)
	out.devOver = maps.Clone(c.devOver)
	if out.devOver == nil {
		out.devOver = map[structured.DeviceID]devRef{}
	}
	out.ranks = sync.OnceValue(out.topologyRanks)
	return &out
}

// respine replaces spine s, its leaves and the nodes under it with copies
// that point at each other, lets edit change the copies' node lists, and
// then lists the spine's nodes again: its leaves' nodes, then its
// leaf-less ones.
func (c *Cluster) respine(s *spine, edit func(ns *spine, leafOf map[*leaf]*leaf)) {
	ns := *s
	ns.leaves = make([]*leaf, len(s.leaves))
	leafOf := make(map[*leaf]*leaf, len(s.leaves))
	c.leaves = slices.Clone(c.leaves)
	c.leafByN = maps.Clone(c.leafByN)
	for i, l := range s.leaves {
		nl := *l
		nl.spine, nl.nodes = &ns, slices.Clone(l.nodes)
		ns.leaves[i], leafOf[l] = &nl, &nl
		c.leaves[l.idx], c.leafByN[l.name] = &nl, &nl
	}
	ns.nodes = slices.Clone(s.nodes)
	edit(&ns, leafOf)
	extra := slices.Clone(ns.nodes[len(ns.nodes)-ns.extra:])
	ns.nodes = ns.nodes[:0]
	for _, l := range ns.leaves {
		ns.nodes = append(ns.nodes, l.nodes...)
	}
	ns.nodes = append(ns.nodes, extra...)
	c.spines = slices.Clone(c.spines)
	c.spines[s.idx] = &ns
	if s.name != "" {
		c.spineByN = maps.Clone(c.spineByN)
		c.spineByN[s.name] = &ns
	}
	for _, i := range ns.nodes {
		nd := *c.nodes[i]
		nd.spine = &ns
		if nd.leaf != nil {
			nd.leaf = leafOf[nd.leaf]
		}
		c.nodes[i] = &nd
	}
}

// sortNat orders node indexes by node name, naturally.
func sortNat(c *Cluster, idx []int) {
	slices.SortFunc(idx, func(a, b int) int {
		switch x, y := c.nodes[a].name, c.nodes[b].name; {
		case topology.NaturalLess(x, y):
			return -1
		case topology.NaturalLess(y, x):
			return 1
		}
		return 0
	})
}

// foldOverlay merges a grown overlay into a new device index.
func (c *Cluster) foldOverlay() {
	if len(c.devOver) <= maxDevOverlay {
		return
	}
	idx := make(map[structured.DeviceID]devRef, len(c.devIndex)+len(c.devOver))
	for id, r := range c.devIndex {
		idx[id] = r
	}
	for id, r := range c.devOver {
		if r.node < 0 {
			delete(idx, id)
		} else {
			idx[id] = r
		}
	}
	c.devIndex, c.devOver = idx, nil
}

// Capacity returns what a node-local device of the tree offers to the
// claims that share it (its published capacity), and whether the tree
// knows the device.
func (c *Cluster) Capacity(id structured.DeviceID) (map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, bool) {
	r, ok := c.dev(id)
	if !ok {
		return nil, false
	}
	for _, s := range c.nodes[r.node].slices {
		if s.Spec.Driver != id.Driver.String() || s.Spec.Pool.Name != id.Pool.String() {
			continue
		}
		for i := range s.Spec.Devices {
			if d := &s.Spec.Devices[i]; d.Name == id.Device.String() {
				return d.Capacity, true
			}
		}
	}
	return nil, false
}
