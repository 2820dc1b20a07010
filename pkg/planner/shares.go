package planner

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/gputopo/gputopo/pkg/devicefit"
)

// nodeShares is what the shares of a node's shared devices hold, the way
// the allocator counts it.
type nodeShares struct {
	ids      sets.Set[structured.SharedDeviceID]
	consumed structured.ConsumedCapacityCollection
}

func (ns *nodeShares) clone() *nodeShares {
	out := &nodeShares{ids: sets.New[structured.SharedDeviceID](), consumed: structured.NewConsumedCapacityCollection()}
	if ns != nil {
		out.ids = ns.ids.Clone()
		out.consumed = ns.consumed.Clone()
	}
	return out
}

// merge adds what o holds.
func (ns *nodeShares) merge(o *nodeShares) {
	if o == nil {
		return
	}
	ns.ids = ns.ids.Union(o.ids)
	for id, c := range o.consumed {
		ns.consumed.Insert(structured.DeviceConsumedCapacity{DeviceID: id, ConsumedCapacity: c})
	}
}

func (ns *nodeShares) add(sh devicefit.Share) {
	uid := types.UID(sh.ShareID)
	ns.ids.Insert(structured.MakeSharedDeviceID(sh.Device, &uid))
	ns.consumed.Insert(structured.NewDeviceConsumedCapacity(sh.Device, sh.Consumed))
}

// NewSnapshotFromState records what allocated claims hold: devices held
// whole, and the shares of shared devices, which leave the rest of those
// devices to other shares.
func NewSnapshotFromState(c *Cluster, st devicefit.State, opts ...SnapshotOption) *Snapshot {
	s := NewSnapshot(c, st.Devices, opts...)
	s.addShares(st)
	return s
}

// addShares records the shares held in st.
func (s *Snapshot) addShares(st devicefit.State) {
	for id := range st.ShareIDs {
		if ns := s.sharesFor(id.GetDeviceID()); ns != nil {
			ns.ids.Insert(id)
		}
	}
	for id, capacity := range st.Consumed {
		if ns := s.sharesFor(id); ns != nil {
			ns.consumed[id] = capacity.Clone()
		}
	}
	s.shares.freeze()
}

// sharesFor returns the entry of shares a device's shares go to, its
// node's or the non-local devices', creating it; nil for a device the
// cluster does not know.
func (s *Snapshot) sharesFor(id structured.DeviceID) *nodeShares {
	if ref, ok := s.cluster.dev(id); ok {
		return s.sharesOf(int(ref.node))
	}
	if _, ok := s.cluster.sharedPos(id); ok {
		if s.sharedShares == nil {
			s.sharedShares = (*nodeShares)(nil).clone()
		}
		return s.sharedShares
	}
	return nil
}

// sharesOf returns node n's entry of shares, creating it.
func (s *Snapshot) sharesOf(n int) *nodeShares {
	ns := s.shares.at(n)
	if ns == nil {
		ns = (*nodeShares)(nil).clone()
		s.shares.set(n, ns)
	}
	return ns
}

// sharesWithReservations returns the shares held once every reservation
// but the job's own is counted, copying only the nodes reservations touch:
// by node, and of the non-local devices.
func (s *Snapshot) sharesWithReservations(res *Reservations, except string) (nodeVec[*nodeShares], *nodeShares) {
	shares := s.shares // shared when a reservation first touches a node
	shared := s.sharedShares
	var copied map[int32]bool
	sharedCopied := false
	res.eachJob(except, func(r Reservation) {
		for _, held := range r.Shares {
			for _, sh := range held {
				ref, ok := s.cluster.dev(sh.Device)
				if !ok {
					if _, ok := s.cluster.sharedPos(sh.Device); ok {
						if !sharedCopied {
							sharedCopied = true
							shared = shared.clone()
						}
						shared.add(sh)
					}
					continue
				}
				n := int(ref.node)
				if copied == nil {
					copied = map[int32]bool{}
					shares = s.shares.share()
				}
				if !copied[ref.node] {
					copied[ref.node] = true
					shares.set(n, shares.at(n).clone())
				}
				shares.at(n).add(sh)
			}
		}
	})
	return shares, shared
}

// state is what the allocator is told is in use on node n: the devices in
// used held whole, the node's shares, and what more holds on top; for a
// node that can use non-local devices, also what is held of those before
// the plan and what the plan took of them (t).
func (f *fitter) state(n int, used bitset, t taken, more []resourceapi.AllocationResult) structured.AllocatedState {
	nd := f.c.nodes[n]
	a := devicefit.Allocated{}
	for i, id := range nd.devs {
		if used.has(i) {
			a.Insert(id)
		}
	}
	shares := f.shares.at(n)
	if nd.reach.uses() {
		for i, id := range f.c.shared.devs {
			if f.sbase.has(i) || t.held.has(i) {
				a.Insert(id)
			}
		}
		if f.sshares != nil || len(t.shares) > 0 {
			shares = shares.clone()
			shares.merge(f.sshares)
			for _, sh := range t.shares {
				shares.add(sh)
			}
		}
	}
	if len(devicefit.Shares(more...)) > 0 {
		shares = shares.clone()
		for _, sh := range devicefit.Shares(more...) {
			shares.add(sh)
		}
	}
	for _, r := range more {
		for _, d := range r.Devices.Results {
			if d.ShareID == nil && devicefit.Holds(&d) {
				a.Insert(structured.MakeDeviceID(d.Driver, d.Pool, d.Device))
			}
		}
	}
	st := structured.AllocatedState{AllocatedDevices: a}
	if shares != nil {
		st.AllocatedSharedDeviceIDs, st.AggregatedCapacity = shares.ids, shares.consumed
	}
	return st
}

// usedOrShared returns the devices in use, counting every reservation, a
// shared device with any share counting as used.
func (s *Snapshot) usedOrShared(res *Reservations) nodeVec[bitset] {
	used, _ := s.withReservations(res, "")
	used = used.share() // the snapshot's own when no reservation touched it
	shares, _ := s.sharesWithReservations(res, "")
	shares.each(func(n int, ns *nodeShares) {
		if ns == nil || len(ns.consumed) == 0 {
			return
		}
		used.set(n, used.at(n).clone(len(s.cluster.nodes[n].devs)))
		for id := range ns.consumed {
			ref, _ := s.cluster.dev(id)
			used.at(n).set(int(ref.pos))
		}
	})
	return used
}
