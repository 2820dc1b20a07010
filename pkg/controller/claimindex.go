package controller

import (
	"slices"
	"strconv"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/planner"
)

// claimIndex tracks which claim holds which device, kept current from
// claim events and from the controller's own writes, so a plan never needs
// to list every claim and a device allocated to two claims is seen at
// once. Shares of shared devices (consumable capacity) are kept apart:
// several claims may hold shares of one device, and the allocator keeps
// them within its capacity. Admin access holds nothing and is not indexed.
type claimIndex struct {
	mu       sync.Mutex
	byDevice map[structured.DeviceID][]types.UID
	claims   map[types.UID]indexedClaim
	// held is the set of byDevice's keys, kept alongside so a plan's
	// snapshot reads it without a copy.
	held devicefit.Allocated
	// sharing lists the claims that hold shares; sharedBy lists, per
	// shared device, the claims that hold shares of it.
	sharing  map[types.UID]bool
	sharedBy map[structured.DeviceID][]types.UID
	// changed lists the devices that entered or left held since the
	// last drain; overflow is set when there were too many to keep.
	changed  []structured.DeviceID
	overflow bool
	// streamed counts, per device, the claims that hold it as the claim
	// events say, in their order, never ahead of them with the
	// controller's own writes; sched is the set of allocated devices
	// kube-scheduler keeps from the same events (observe). A device with
	// a holder that is not in sched is blind: kube-scheduler would
	// allocate it again (fence.go).
	streamed map[structured.DeviceID]int
	sched    sets.Set[structured.DeviceID]
	// gaveBack, when set, hears of every device that went blind or that
	// no claim holds any more, with the index unlocked.
	gaveBack func(structured.DeviceID)
}

// maxChanged bounds the change list; past it the next plan's snapshot
// is taken from the whole index again.
const maxChanged = 1 << 16

func (ix *claimIndex) noteLocked(d structured.DeviceID) {
	if len(ix.changed) >= maxChanged {
		ix.changed, ix.overflow = ix.changed[:0], true
	}
	if !ix.overflow {
		ix.changed = append(ix.changed, d)
	}
}

type indexedClaim struct {
	key     string // namespace/name
	version uint64 // resourceVersion, 0 when unknown
	devices []structured.DeviceID
	shares  []devicefit.Share
}

func newClaimIndex() *claimIndex {
	return &claimIndex{byDevice: map[structured.DeviceID][]types.UID{}, claims: map[types.UID]indexedClaim{}, held: devicefit.Allocated{}, sharing: map[types.UID]bool{}, sharedBy: map[structured.DeviceID][]types.UID{},
		streamed: map[structured.DeviceID]int{}, sched: sets.New[structured.DeviceID]()}
}

// exclusiveDevices lists the devices an allocation holds on its own.
func exclusiveDevices(a *resourceapi.AllocationResult) []structured.DeviceID {
	if a == nil {
		return nil
	}
	var out []structured.DeviceID
	for _, r := range a.Devices.Results {
		if r.ShareID != nil || (r.AdminAccess != nil && *r.AdminAccess) {
			continue
		}
		out = append(out, structured.MakeDeviceID(r.Driver, r.Pool, r.Device))
	}
	return out
}

func parseVersion(rv string) uint64 {
	v, _ := strconv.ParseUint(rv, 10, 64)
	return v
}

// update records the claim's allocation. An event older than what the
// index already holds (the controller's own write arrived first) is
// ignored. It returns the other claims that now share a device with it:
// those that hold it too, and for a share, every other claim with a
// share of the device, whose groups look again whether the shares
// together fit the device (sharers).
func (ix *claimIndex) update(claim *resourceapi.ResourceClaim) []types.UID {
	ix.mu.Lock()
	v := parseVersion(claim.ResourceVersion)
	if old, ok := ix.claims[claim.UID]; ok && v != 0 && old.version >= v {
		ix.mu.Unlock()
		return nil // older, or the same version: the controller's own write
	}
	ix.removeLocked(claim.UID)
	devs := exclusiveDevices(claim.Status.Allocation)
	var shares []devicefit.Share
	if a := claim.Status.Allocation; a != nil {
		shares = devicefit.Shares(*a)
	}
	ix.claims[claim.UID] = indexedClaim{key: claim.Namespace + "/" + claim.Name, version: v, devices: devs, shares: shares}
	if len(shares) > 0 {
		ix.sharing[claim.UID] = true
	}
	var clash []types.UID
	note := func(others []types.UID) {
		for _, other := range others {
			if other != claim.UID && !slices.Contains(clash, other) {
				clash = append(clash, other)
			}
		}
	}
	for _, sh := range shares {
		note(ix.byDevice[sh.Device])
		note(ix.sharedBy[sh.Device])
		if !slices.Contains(ix.sharedBy[sh.Device], claim.UID) {
			ix.sharedBy[sh.Device] = append(ix.sharedBy[sh.Device], claim.UID)
		}
	}
	for _, d := range devs {
		note(ix.byDevice[d])
		note(ix.sharedBy[d])
		ix.byDevice[d] = append(ix.byDevice[d], claim.UID)
		if !ix.held.Has(d) {
			ix.held.Insert(d)
			ix.noteLocked(d)
		}
	}
	ix.mu.Unlock()
	return clash
}

// observe follows one claim event (old nil for an added claim, cur nil
// for a deleted one) as kube-scheduler's allocatedDevices does: a device
// enters its set when a claim is added allocated or gets allocated, and
// leaves it when a claim holding it is deallocated or deleted, however
// many other claims still hold it. When two claims held a device and one
// gave it back, the device is blind: held, and free as far as
// kube-scheduler knows.
func (ix *claimIndex) observe(old, cur *resourceapi.ResourceClaim) {
	var oldDevs, curDevs []structured.DeviceID
	if old != nil {
		oldDevs = exclusiveDevices(old.Status.Allocation)
	}
	if cur != nil {
		curDevs = exclusiveDevices(cur.Status.Allocation)
	}
	oldAlloc := old != nil && old.Status.Allocation != nil
	curAlloc := cur != nil && cur.Status.Allocation != nil
	var tell []structured.DeviceID
	ix.mu.Lock()
	for _, d := range oldDevs {
		if ix.streamed[d]--; ix.streamed[d] <= 0 {
			delete(ix.streamed, d)
		}
	}
	for _, d := range curDevs {
		ix.streamed[d]++
	}
	switch {
	case !oldAlloc && curAlloc:
		ix.sched.Insert(curDevs...)
	case oldAlloc && !curAlloc:
		ix.sched.Delete(oldDevs...)
	}
	for _, d := range oldDevs {
		if ix.streamed[d] == 0 || !ix.sched.Has(d) {
			tell = append(tell, d)
		}
	}
	ix.mu.Unlock()
	if ix.gaveBack != nil {
		for _, d := range tell {
			ix.gaveBack(d)
		}
	}
}

// isBlind reports whether a claim holds the device that kube-scheduler
// does not count as allocated (observe), and how many claims hold it as
// the claim events say.
func (ix *claimIndex) isBlind(d structured.DeviceID) (blind bool, holders int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	n := ix.streamed[d]
	return n > 0 && !ix.sched.Has(d), n
}

// remove forgets a deleted claim.
func (ix *claimIndex) remove(uid types.UID) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.removeLocked(uid)
}

func (ix *claimIndex) removeLocked(uid types.UID) {
	old, ok := ix.claims[uid]
	if !ok {
		return
	}
	for _, d := range old.devices {
		holders := slices.DeleteFunc(ix.byDevice[d], func(u types.UID) bool { return u == uid })
		if len(holders) == 0 {
			delete(ix.byDevice, d)
			ix.held.Delete(d)
			ix.noteLocked(d)
		} else {
			ix.byDevice[d] = holders
		}
	}
	for _, sh := range old.shares {
		if holders := slices.DeleteFunc(ix.sharedBy[sh.Device], func(u types.UID) bool { return u == uid }); len(holders) == 0 {
			delete(ix.sharedBy, sh.Device)
		} else {
			ix.sharedBy[sh.Device] = holders
		}
	}
	delete(ix.claims, uid)
	delete(ix.sharing, uid)
}

// snapshot records the devices held whole by some claim, and the shares
// of shared devices, in a snapshot of cl, reading the index's own set
// under its lock instead of copying it.
func (ix *claimIndex) snapshot(cl *planner.Cluster, opts ...planner.SnapshotOption) *planner.Snapshot {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return planner.NewSnapshotFromState(cl, ix.stateLocked(), opts...)
}

// track brings tr up to date with the devices held, building a new
// tracker on cl when tr is nil or the change list overflowed, and
// returns the snapshot for a plan.
func (ix *claimIndex) track(tr *planner.Tracker, cl *planner.Cluster, usage planner.NodeUsage) (*planner.Tracker, *planner.Snapshot) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if tr == nil || ix.overflow {
		tr = planner.NewTracker(cl, ix.held, usage)
	} else {
		seen := make(map[structured.DeviceID]bool, len(ix.changed))
		for _, d := range ix.changed {
			if !seen[d] { // a claim updated twice lists its devices twice
				seen[d] = true
				tr.SetDevice(d, ix.held.Has(d))
			}
		}
	}
	ix.changed, ix.overflow = ix.changed[:0], false
	return tr, tr.Snapshot(ix.sharesLocked())
}

// stateLocked is what the claims hold: the index's own set of devices
// held whole, not a copy, and every share of a shared device.
func (ix *claimIndex) stateLocked() devicefit.State {
	st := ix.sharesLocked()
	st.Devices = ix.held
	return st
}

// sharesLocked is every share of a shared device the claims hold.
func (ix *claimIndex) sharesLocked() devicefit.State {
	var st devicefit.State
	if len(ix.sharing) == 0 {
		return st
	}
	shares := devicefit.NewState()
	st.ShareIDs, st.Consumed = shares.ShareIDs, shares.Consumed
	for uid := range ix.sharing {
		for _, sh := range ix.claims[uid].shares {
			st.AddShare(sh)
		}
	}
	return st
}

// sharers returns, for each device of the claim, the other claims that
// hold it too, keyed by namespace/name: a device held whole by two
// claims, held whole and shared at once, or shared by claims that
// together consume more of a capacity than capacity says the device
// has (devices capacity does not know are not judged on capacity). The
// scheduler never allocates past a device's capacity; two allocators
// that did not see each other's shares can.
func (ix *claimIndex) sharers(uid types.UID, capacity func(structured.DeviceID) (map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, bool)) map[structured.DeviceID][]string {
	type shared struct {
		others   []string
		consumed map[resourceapi.QualifiedName]resource.Quantity
	}
	out := map[structured.DeviceID][]string{}
	var check map[structured.DeviceID]*shared
	ix.mu.Lock()
	me := ix.claims[uid]
	for _, d := range me.devices {
		for _, other := range append(slices.Clone(ix.byDevice[d]), ix.sharedBy[d]...) {
			if other != uid {
				out[d] = append(out[d], ix.claims[other].key)
			}
		}
	}
	for _, sh := range me.shares {
		if _, done := out[sh.Device]; done || check[sh.Device] != nil {
			continue
		}
		var whole []string
		for _, other := range ix.byDevice[sh.Device] {
			whole = append(whole, ix.claims[other].key)
		}
		if len(whole) > 0 {
			out[sh.Device] = whole
			continue
		}
		s := &shared{consumed: map[resourceapi.QualifiedName]resource.Quantity{}}
		for _, holder := range ix.sharedBy[sh.Device] {
			if holder != uid {
				s.others = append(s.others, ix.claims[holder].key)
			}
			for _, hs := range ix.claims[holder].shares {
				if hs.Device != sh.Device {
					continue
				}
				for name, q := range hs.Consumed {
					sum := s.consumed[name]
					sum.Add(q)
					s.consumed[name] = sum
				}
			}
		}
		if len(s.others) > 0 {
			if check == nil {
				check = map[structured.DeviceID]*shared{}
			}
			check[sh.Device] = s
		}
	}
	ix.mu.Unlock()
	// The capacity is looked up without the index's lock.
	for d, s := range check {
		if capacity == nil {
			break
		}
		has, ok := capacity(d)
		if !ok {
			continue
		}
		for name, sum := range s.consumed {
			if c, ok := has[name]; ok && sum.Cmp(c.Value) > 0 {
				out[d] = s.others
				break
			}
		}
	}
	return out
}

// holderKeys lists the claims that hold the device, as namespace/name.
func (ix *claimIndex) holderKeys(d structured.DeviceID) []string {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	var out []string
	for _, uid := range ix.byDevice[d] {
		out = append(out, ix.claims[uid].key)
	}
	return out
}

// seen reports whether the index holds the claim at version rv or newer.
func (ix *claimIndex) seen(uid types.UID, rv string) bool {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	c, ok := ix.claims[uid]
	return ok && c.version >= parseVersion(rv)
}

// key returns namespace/name of an indexed claim.
func (ix *claimIndex) key(uid types.UID) string {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.claims[uid].key
}

// ahead reports whether the index holds a newer version of the claim than
// rv: the controller wrote it and the informer has not caught up yet.
func (ix *claimIndex) ahead(uid types.UID, rv string) bool {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	c, ok := ix.claims[uid]
	v := parseVersion(rv)
	return ok && v != 0 && c.version > v
}
