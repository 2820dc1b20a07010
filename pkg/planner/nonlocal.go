package planner

import (
	"fmt"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/topology"
)

// Devices that are not local to one node: those of ResourceSlices with
// allNodes, a nodeSelector or perDeviceNodeSelection, of every driver.
// One such device is available to every node its slice (or, with
// perDeviceNodeSelection, the device itself) selects, as the allocator's
// own NodeMatches decides, and it is one device: held by a claim, or
// taken by one pod of a plan, it is taken for every node. The tree keeps
// them apart from the nodes' own devices, numbered by their position in
// the cluster's list (shared positions), and each node records which of
// them it can use. A node that can use one is planned on its own: its
// allocator answers depend on the state of devices other nodes share,
// so they are neither shared with alike nodes nor moved to them.

// nonLocal is the tree's non-local devices.
type nonLocal struct {
	// slices are the non-local slices as given, every generation: the
	// allocator decides which of them count, as the scheduler's does.
	slices []*resourceapi.ResourceSlice
	newest []*resourceapi.ResourceSlice // of the newest generation of their pool
	devs   []structured.DeviceID        // shared position → device
	idx    map[structured.DeviceID]int32
	// multi marks devices that allow multiple allocations; gpus those of
	// gputopo's driver.
	multi, gpus bitset
}

// NodeLocal reports whether a ResourceSlice is local to one node, and
// which: its devices are that node's alone. Every other slice (allNodes,
// a nodeSelector, perDeviceNodeSelection) is non-local, for NewCluster's
// shared argument and WithShared.
func NodeLocal(s *resourceapi.ResourceSlice) (string, bool) {
	if s.Spec.NodeName == nil || *s.Spec.NodeName == "" || ptr.Deref(s.Spec.PerDeviceNodeSelection, false) {
		return "", false
	}
	return *s.Spec.NodeName, true
}

// newNonLocal indexes the devices of the newest generation of each pool.
func newNonLocal(in []*resourceapi.ResourceSlice) (*nonLocal, error) {
	nl := &nonLocal{idx: map[structured.DeviceID]int32{}}
	if len(in) == 0 {
		return nl, nil
	}
	maxGen := map[string]int64{}
	for _, sl := range in {
		if name, local := NodeLocal(sl); local {
			return nil, fmt.Errorf("ResourceSlice %s is local to node %s; list it with that node", sl.Name, name)
		}
		key := sl.Spec.Driver + "/" + sl.Spec.Pool.Name
		maxGen[key] = max(maxGen[key], sl.Spec.Pool.Generation)
	}
	nl.slices = in
	for _, sl := range in {
		if sl.Spec.Pool.Generation == maxGen[sl.Spec.Driver+"/"+sl.Spec.Pool.Name] {
			nl.newest = append(nl.newest, sl)
		}
	}
	for _, sl := range nl.newest {
		for _, d := range sl.Spec.Devices {
			id := devicefit.DeviceID(sl.Spec.Driver, sl.Spec.Pool.Name, d.Name)
			if _, dup := nl.idx[id]; dup {
				return nil, fmt.Errorf("device %s is published twice by non-local ResourceSlices", id)
			}
			nl.idx[id] = int32(len(nl.devs))
			nl.devs = append(nl.devs, id)
		}
	}
	nl.multi, nl.gpus = newBitset(len(nl.devs)), newBitset(len(nl.devs))
	for _, sl := range nl.newest {
		for _, d := range sl.Spec.Devices {
			pos := nl.idx[devicefit.DeviceID(sl.Spec.Driver, sl.Spec.Pool.Name, d.Name)]
			if ptr.Deref(d.AllowMultipleAllocations, false) {
				nl.multi.set(int(pos))
			}
			if sl.Spec.Driver == topology.DriverName {
				nl.gpus.set(int(pos))
			}
		}
	}
	return nl, nil
}

// reach is what one node can use of the non-local devices.
type reach struct {
	mask bitset // the shared positions the node can use
	// broken: matching a selector of some slice or device to the node
	// failed; the allocator, given the slices, fails the same way.
	broken bool
}

// reachOf finds the non-local devices node obj can use, with the
// allocator's NodeMatches. A slice of an older generation of its pool
// makes none available: the allocator ignores it.
func (nl *nonLocal) reachOf(obj *v1.Node) reach {
	var r reach
	if len(nl.slices) == 0 {
		return r
	}
	features := devicefit.Features()
	for _, sl := range nl.newest {
		perDevice := ptr.Deref(sl.Spec.PerDeviceNodeSelection, false)
		if !perDevice {
			ok, err := structured.NodeMatches(features, obj, "", ptr.Deref(sl.Spec.AllNodes, false), sl.Spec.NodeSelector)
			if err != nil {
				r.broken = true
				continue
			}
			if !ok {
				continue
			}
		}
		for _, d := range sl.Spec.Devices {
			pos := nl.idx[devicefit.DeviceID(sl.Spec.Driver, sl.Spec.Pool.Name, d.Name)]
			if perDevice {
				match, err := structured.NodeMatches(features, obj, ptr.Deref(d.NodeName, ""), ptr.Deref(d.AllNodes, false), d.NodeSelector)
				if err != nil {
					r.broken = true
					continue
				}
				if !match {
					continue
				}
			}
			if r.mask == nil {
				r.mask = newBitset(len(nl.devs))
			}
			r.mask.set(int(pos))
		}
	}
	return r
}

// uses reports whether the node's allocator answers depend on the
// non-local devices.
func (r reach) uses() bool { return r.broken || r.mask != nil }

// slicesFor is what the allocator is given for node nd: its own slices
// and, where it can use any, every non-local one, as the scheduler gives
// them all (a pool split over slices of different nodes needs all of
// them to be complete).
func (c *Cluster) slicesFor(nd *node) []*resourceapi.ResourceSlice {
	if !nd.reach.uses() {
		return nd.slices
	}
	out := make([]*resourceapi.ResourceSlice, 0, len(nd.slices)+len(c.shared.slices))
	return append(append(out, nd.slices...), c.shared.slices...)
}

// sharedPos finds a non-local device's shared position.
func (c *Cluster) sharedPos(id structured.DeviceID) (int, bool) {
	if c.shared == nil {
		return 0, false
	}
	p, ok := c.shared.idx[id]
	return int(p), ok
}

// sharedLen is how many non-local devices the tree has.
func (c *Cluster) sharedLen() int {
	if c.shared == nil {
		return 0
	}
	return len(c.shared.devs)
}

// WithShared returns a copy of the tree whose non-local slices are
// shared (every one of them, replacing the tree's), sharing the rest with
// c, which stays unchanged. Every node's reach is found again; nodes whose
// reach changed keep their signature, which the cache ignores for nodes
// that can use a non-local device.
func (c *Cluster) WithShared(shared []*resourceapi.ResourceSlice) (*Cluster, error) {
	nl, err := newNonLocal(shared)
	if err != nil {
		return nil, err
	}
	for id := range nl.idx {
		if _, dup := c.dev(id); dup {
			return nil, fmt.Errorf("device %s is published by a non-local ResourceSlice and by node %s", id, c.nodes[c.devRef(id)].name)
		}
	}
	out := *c
	out.shared = nl
	out.nodes = make([]*node, len(c.nodes))
	for i, nd := range c.nodes {
		if nd.gone {
			out.nodes[i] = nd
			continue
		}
		cp := *nd
		cp.setReach(nl)
		out.nodes[i] = &cp
	}
	return &out, nil
}

// devRef is the node index of a node-local device known to the tree.
func (c *Cluster) devRef(id structured.DeviceID) int {
	r, _ := c.dev(id)
	return int(r.node)
}

// setReach records which non-local devices the node can use, and turns
// the counting pre-filter off when one of them allows multiple
// allocations.
func (nd *node) setReach(nl *nonLocal) {
	nd.reach = nl.reachOf(nd.obj)
	nd.noPrefilter = nd.localMulti || nd.reach.broken || (nd.reach.mask != nil && nd.reach.mask.intersects(nl.multi))
}
