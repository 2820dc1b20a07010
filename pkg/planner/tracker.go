package planner

import (
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/gputopo/gputopo/pkg/devicefit"
)

// Tracker keeps what a snapshot records (the devices held whole, what the
// pods on each node take from its allocatable) up to date one device and
// one node at a time, so that taking a snapshot for a plan costs what
// changed since the last one, not every allocated device and every used
// node of the cluster. Snapshots it hands out stay as they were: a node's
// entry is copied before the first change after a snapshot shares it.
// Not safe for concurrent use.
type Tracker struct {
	c       *Cluster
	used    nodeVec[bitset]
	usedRes nodeVec[[]int64]
	// mine[n] is set while node n's entries belong to the tracker alone;
	// Snapshot clears it, since the snapshot shares them.
	mine []bool
	// shared is what is held of the non-local devices; sharedMine as
	// mine.
	shared     bitset
	sharedMine bool
	work       TrackerWork
}

// TrackerWork counts what a Tracker has done.
type TrackerWork struct {
	// Devices counts devices marked or cleared one at a time.
	Devices int
	// Nodes counts nodes whose usage was set, or that a new tree made
	// the tracker read again.
	Nodes int
	// Builds counts trackers built from every held device and used node.
	Builds int
}

// NewTracker records the devices held and the usage of every node of c.
func NewTracker(c *Cluster, held devicefit.Allocated, usage NodeUsage) *Tracker {
	s := NewSnapshot(c, held, WithUsed(usage))
	t := &Tracker{c: c, used: s.used, usedRes: s.usedRes, mine: make([]bool, len(c.nodes)), shared: s.sharedUsed, sharedMine: true}
	for i := range t.mine {
		t.mine[i] = true
	}
	t.work.Builds++
	return t
}

// Work returns the counts so far.
func (t *Tracker) Work() TrackerWork { return t.work }

// Cluster is the tree the tracker follows.
func (t *Tracker) Cluster() *Cluster { return t.c }

// SetDevice marks the device, a node's own or a non-local one, as held or
// free. Devices the tree does not know are ignored.
func (t *Tracker) SetDevice(id structured.DeviceID, held bool) {
	ref, ok := t.c.dev(id)
	if !ok {
		if p, ok := t.c.sharedPos(id); ok {
			t.work.Devices++
			t.setShared(p, held)
		}
		return
	}
	t.work.Devices++
	n := int(ref.node)
	if held == t.used.at(n).has(int(ref.pos)) {
		return
	}
	t.own(n)
	if held {
		if t.used.at(n) == nil {
			t.used.set(n, newBitset(len(t.c.nodes[n].devs)))
		}
		t.used.at(n).set(int(ref.pos))
		return
	}
	t.used.at(n).unset(int(ref.pos))
	if t.used.at(n).count() == 0 {
		t.used.set(n, nil)
	}
}

// SetUsage records what the pods on the node take from its allocatable
// in all (NodeUsage's entry for it; nil for nothing).
func (t *Tracker) SetUsage(node string, l v1.ResourceList) {
	i, ok := t.c.byName[node]
	if !ok {
		return
	}
	t.work.Nodes++
	t.own(i)
	var v []int64
	if t.c.nodes[i].alloc != nil && l != nil {
		v = t.c.res.vector(l)
	}
	t.usedRes.set(i, v)
}

func (t *Tracker) setShared(p int, held bool) {
	if held == t.shared.has(p) {
		return
	}
	if !t.sharedMine {
		t.shared, t.sharedMine = t.shared.clone(t.c.sharedLen()), true
	}
	if held {
		if t.shared == nil {
			t.shared = newBitset(t.c.sharedLen())
		}
		t.shared.set(p)
		return
	}
	t.shared.unset(p)
}

// Rebase follows a tree that WithNode, WithNewNode, WithoutNode or
// WithShared made from the tracker's own: the named nodes are the ones
// that changed, came or went, and are read again from held and usage;
// the non-local devices are read again when they changed. Every other
// node keeps its place and its entries.
func (t *Tracker) Rebase(c *Cluster, nodes []string, held devicefit.Allocated, usage NodeUsage) {
	if c.shared != t.c.shared {
		t.shared, t.sharedMine = nil, true
		for p, id := range c.shared.devs {
			if held.Has(id) {
				t.work.Devices++
				if t.shared == nil {
					t.shared = newBitset(len(c.shared.devs))
				}
				t.shared.set(p)
			}
		}
	}
	t.c = c
	if grow := len(c.nodes) - len(t.mine); grow > 0 {
		t.used.grow(len(c.nodes))
		t.usedRes.grow(len(c.nodes))
		t.mine = append(t.mine, make([]bool, grow)...)
	}
	for _, i := range c.vacant {
		t.clear(i)
	}
	for _, name := range nodes {
		i, ok := c.byName[name]
		if !ok {
			continue // gone: its slot is vacant
		}
		t.clear(i)
		for _, id := range c.nodes[i].devs {
			if held.Has(id) {
				t.SetDevice(id, true)
			}
		}
		t.SetUsage(name, usage[name])
	}
}

func (t *Tracker) clear(i int) {
	if t.used.at(i) != nil || t.usedRes.at(i) != nil {
		t.own(i)
		t.used.set(i, nil)
		t.usedRes.set(i, nil)
	}
}

// own makes node n's entries the tracker's own to change.
func (t *Tracker) own(n int) {
	if t.mine[n] {
		return
	}
	t.used.set(n, slices.Clone(t.used.at(n)))
	t.usedRes.set(n, slices.Clone(t.usedRes.at(n)))
	t.mine[n] = true
}

// Snapshot is what the tracker records now, with the shares of shared
// devices in st (its Devices are ignored: the tracker has them).
func (t *Tracker) Snapshot(st devicefit.State) *Snapshot {
	s := &Snapshot{cluster: t.c, used: t.used.share(), usedRes: t.usedRes.share(), shares: newNodeVec[*nodeShares](len(t.c.nodes)), sharedUsed: t.shared}
	clear(t.mine)
	t.sharedMine = false
	s.addShares(st)
	return s
}
