package planner

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/slicepack"
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
// them it can use. The allocator's answers for a node that can use one
// depend on the state of devices other nodes share: they are shared only
// with alike nodes that can use the same ones, on the same state of them
// (cacheKey), and never moved to another node.

// nonLocal is the tree's non-local devices.
type nonLocal struct {
	// slices are the non-local slices as given, every generation: the
	// allocator decides which of them count, as the scheduler's does.
	slices []*resourceapi.ResourceSlice
	newest []*resourceapi.ResourceSlice // of the newest generation of their pool
	devs   []structured.DeviceID        // shared position → device
	specs  []*resourceapi.Device        // shared position → what CEL sees of it
	idx    map[structured.DeviceID]int32
	// attrs are the qualified names of the devices' attributes.
	attrs map[string]bool
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
	nl := &nonLocal{idx: map[structured.DeviceID]int32{}, attrs: map[string]bool{}}
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
		for i := range sl.Spec.Devices {
			d := &sl.Spec.Devices[i]
			id := devicefit.DeviceID(sl.Spec.Driver, sl.Spec.Pool.Name, d.Name)
			if _, dup := nl.idx[id]; dup {
				return nil, fmt.Errorf("device %s is published twice by non-local ResourceSlices", id)
			}
			nl.idx[id] = int32(len(nl.devs))
			nl.devs = append(nl.devs, id)
			nl.specs = append(nl.specs, d)
			for name := range d.Attributes {
				q := string(name)
				if !strings.Contains(q, "/") {
					q = sl.Spec.Driver + "/" + q
				}
				nl.attrs[q] = true
			}
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
	// sameDriver: a device of mask is of a driver that also publishes
	// the node's own devices.
	sameDriver bool
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
//
// A node's slices may be packed (pkg/slicepack): what it returns is
// unpacked, through a cache of the slices last unpacked. The tree keeps
// none unpacked, so that its memory stays that of the packed slices
// whatever the nodes are; a node without a signature (shared GPUs,
// counters) is read by every plan, and past the cache's size unpacked
// every time (BenchmarkUnpackDGXH100).
func (c *Cluster) slicesFor(nd *node) ([]*resourceapi.ResourceSlice, error) {
	own, err := unpacked.UnpackAll(nd.slices)
	if err != nil {
		return nil, err
	}
	if !nd.reach.uses() {
		return own, nil
	}
	out := make([]*resourceapi.ResourceSlice, 0, len(own)+len(c.shared.slices))
	return append(append(out, own...), c.shared.slices...), nil
}

// unpacked unpacks the slices the allocator reads. A plan reads few
// nodes' slices (one allocator run answers for every node of a
// signature), so a few hundred nodes' worth are kept.
var unpacked = slicepack.NewCache(unpackedSlices)

// unpackedSlices is how many unpacked slices the cache keeps: an
// eight-GPU node's slice with 20 attributes per GPU takes about 49 KB
// unpacked (BenchmarkUnpackDGXH100), so 512 are about 24 MiB.
const unpackedSlices = 512

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
// c, which stays unchanged. Every node's reach is found again; signatures
// stay, as they cover a node's own devices only.
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

// setReach records which non-local devices the node can use.
func (nd *node) setReach(nl *nonLocal) {
	nd.reach = nl.reachOf(nd.obj)
	for p := range nl.devs {
		if !nd.reach.mask.has(p) {
			continue
		}
		for _, sl := range nd.slices {
			if sl.Spec.Driver == nl.devs[p].Driver.String() {
				nd.reach.sameDriver = true
			}
		}
	}
}

// The job's view of the non-local devices. A plan first finds which of
// them some request of the job's claims could select at all (its
// DeviceClass's selectors and its own, evaluated by the allocator's CEL
// package; an expression that fails to compile or run counts as
// selecting). Only those make a node's answers depend on other nodes
// (fitter.dependent) and count in the counting pre-filter. A request that
// can select none of them must be served by the node's own devices
// (shape.needLocal).

// findNonLocal fills f.nlUsable, f.nlPatterns and each shape's needLocal.
func (f *fitter) findNonLocal() {
	for si := range f.shapes {
		s := &f.shapes[si]
		s.needLocal = s.need
	}
	nl := f.c.shared
	if len(nl.devs) == 0 {
		return
	}
	f.nlUsable = newBitset(len(nl.devs))
	byClass := map[string]bitset{}
	selects := func(class string, sels []resourceapi.DeviceSelector) bool {
		cm, ok := byClass[class]
		if !ok {
			var classSels []resourceapi.DeviceSelector
			if cl, err := f.eval.Classes.Get(class); err == nil {
				classSels = cl.Spec.Selectors
			}
			cm = f.selectable(nil, classSels) // an unknown class: the allocator says so
			byClass[class] = cm
		}
		m := f.selectable(cm, sels)
		for i := range m {
			f.nlUsable[i] |= m[i]
		}
		return m.count() > 0
	}
	for si := range f.shapes {
		s := &f.shapes[si]
		s.needLocal = 0
		for _, cl := range s.claims {
			for _, r := range cl.Spec.Devices.Requests {
				some := false
				if r.Exactly != nil {
					some = selects(r.Exactly.DeviceClassName, r.Exactly.Selectors)
				}
				for _, sub := range r.FirstAvailable {
					some = selects(sub.DeviceClassName, sub.Selectors) || some
				}
				if !some {
					_, n := requestNeed(r)
					s.needLocal += n
				}
			}
		}
	}
	for _, r := range f.patterns {
		if nl.attrs[f.c.sigs.attrNames[r]] {
			f.nlPatterns = append(f.nlPatterns, r)
		}
	}
}

// selectable returns, of the non-local devices in among (nil: all), those
// every selector in sels may select.
func (f *fitter) selectable(among bitset, sels []resourceapi.DeviceSelector) bitset {
	nl := f.c.shared
	out := newBitset(len(nl.devs))
	for p, d := range nl.specs {
		if among != nil && !among.has(p) {
			continue
		}
		if f.mayMatch(nl.devs[p], d, sels) {
			out.set(p)
		}
	}
	return out
}

// mayMatch evaluates the selectors on a device as the allocator does; an
// error counts as a match.
func (f *fitter) mayMatch(id structured.DeviceID, d *resourceapi.Device, sels []resourceapi.DeviceSelector) bool {
	for _, sel := range sels {
		if sel.CEL == nil {
			continue
		}
		expr := f.eval.Cache.GetOrCompile(sel.CEL.Expression)
		if expr.Error != nil {
			return true
		}
		ok, _, err := expr.DeviceMatches(f.ctx, cel.Device{Driver: id.Driver.String(), AllowMultipleAllocations: d.AllowMultipleAllocations, Attributes: d.Attributes, Capacity: d.Capacity})
		if err != nil {
			return true
		}
		if !ok {
			return false
		}
	}
	return true
}

// dependent reports whether node n's answers for the job depend on the
// non-local devices: it can use one the job could select, or matching a
// selector to it failed.
func (f *fitter) dependent(n int) bool {
	r := &f.c.nodes[n].reach
	return r.broken || r.mask.intersects(f.nlUsable)
}

// noPrefilter says that counting free devices proves nothing on node n
// for the job: a device of its own, or a non-local one the job could
// select, allows multiple allocations.
func (f *fitter) noPrefilter(n int) bool {
	nd := f.c.nodes[n]
	return nd.noPrefilter || (f.dependent(n) && (nd.reach.broken || nd.reach.mask.and(f.nlUsable).intersects(f.c.shared.multi)))
}

// key is node n's cache key for the plan (cacheKey).
func (f *fitter) key(n int) string {
	if f.keys[n] == "" {
		f.keys[n] = f.c.nodes[n].cacheKey(f.values, f.patterns, f.dependent(n), f.nlPatterns)
	}
	return f.keys[n]
}

// taken is what a plan's pods took of the non-local devices: devices
// held whole, and shares of those that allow multiple allocations, which
// leave the rest of the device to other pods as the allocator counts it.
// A value is never changed: with returns a new one.
type taken struct {
	held   bitset
	shares []devicefit.Share
}

func (t taken) empty() bool { return t.held == nil && len(t.shares) == 0 }

// with is t and what r took.
func (t taken) with(r fitResult, size int) taken {
	if len(r.spos) == 0 && len(r.sshares) == 0 {
		return t
	}
	out := taken{held: t.held.clone(size), shares: append(slices.Clone(t.shares), r.sshares...)}
	for _, p := range r.spos {
		out.held.set(p)
	}
	return out
}

// key tells apart what a node that can use the devices of mask sees of t.
func (t taken) key(c *Cluster, mask bitset) string {
	var b strings.Builder
	b.WriteString(mask.and(t.held).key())
	for _, sh := range t.shares {
		if p, ok := c.sharedPos(sh.Device); !ok || !mask.has(p) {
			continue
		}
		b.WriteString("|" + sh.Device.String())
		for _, name := range slices.Sorted(maps.Keys(sh.Consumed)) {
			q := sh.Consumed[name]
			b.WriteString("," + string(name) + "=" + q.String())
		}
	}
	return b.String()
}
