package controller

import (
	"cmp"
	"fmt"
	"math"
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
	// shareCount counts the claims whose shares the index took in.
	shareCount uint64
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
	// sharedAt is the resourceVersion of the first version of the claim
	// the index saw with these shares: the order in which the API server
	// took the shares of a device, as the claim events come in that order.
	// seenAt orders claims of the same (or no) version as the index saw
	// their shares.
	sharedAt, seenAt uint64
	// writer is the group whose write of this allocation is in flight
	// (assume); empty once the index holds the claim as stored.
	writer string
	// unheld: the index held no entry for the claim when it was assumed
	// (its deletion came between the plan and the assumption).
	unheld bool
	// node is the one node the allocation names, "" for none.
	node string
}

// sameShares reports whether two lists hold the same shares.
func sameShares(a, b []devicefit.Share) bool {
	return slices.EqualFunc(a, b, func(x, y devicefit.Share) bool { return x.Device == y.Device && x.ShareID == y.ShareID })
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
// ignored, and so is one without an allocation for a claim whose
// allocation the controller is writing (assume): the write lands after
// it. It returns the other claims that now share a device with it: those
// that hold it too, and, when the claim's shares are new, every other
// claim with a share of the same device, whose groups look again whether
// the shares together fit the device (sharers).
func (ix *claimIndex) update(claim *resourceapi.ResourceClaim) []types.UID {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	old, had := ix.claims[claim.UID]
	if v := parseVersion(claim.ResourceVersion); had && v != 0 && old.version >= v {
		return nil // older, or the same version: the controller's own write
	}
	if had && old.writer != "" && claim.Status.Allocation == nil {
		return nil
	}
	return ix.putLocked(claim, "")
}

// assume records alloc as claim's allocation before group writer writes
// it, so that every plan made while the write is in flight counts its
// devices as taken. The stored claim the write returns (update) replaces
// it; unassume withdraws it when the write fails.
func (ix *claimIndex) assume(claim *resourceapi.ResourceClaim, alloc *resourceapi.AllocationResult, writer string) {
	cl := *claim
	cl.Status.Allocation = alloc
	ix.mu.Lock()
	defer ix.mu.Unlock()
	_, had := ix.claims[claim.UID]
	ix.putLocked(&cl, writer)
	if !had {
		e := ix.claims[claim.UID]
		e.unheld = true
		ix.claims[claim.UID] = e
	}
}

// assumedNode is the node of the allocation assumed for the claim while
// its write is in flight, "" when none is: the informer does not show it
// yet.
func (ix *claimIndex) assumedNode(uid types.UID) string {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if e, ok := ix.claims[uid]; ok && e.writer != "" {
		return e.node
	}
	return ""
}

// unassume withdraws what group writer assumed of the claim, if the
// claim's write has not replaced it.
func (ix *claimIndex) unassume(uid types.UID, writer string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	old, ok := ix.claims[uid]
	if !ok || old.writer != writer {
		return
	}
	ix.removeLocked(uid)
	if old.unheld {
		// Deleted before it was assumed: no event will remove it now.
		delete(ix.claims, uid)
		return
	}
	ix.claims[uid] = indexedClaim{key: old.key, version: old.version}
}

// putLocked indexes the claim as it is, assumed by writer when that is
// set, and returns the other claims that now share a device with it.
func (ix *claimIndex) putLocked(claim *resourceapi.ResourceClaim, writer string) []types.UID {
	v := parseVersion(claim.ResourceVersion)
	old, had := ix.claims[claim.UID]
	ix.removeLocked(claim.UID)
	devs := exclusiveDevices(claim.Status.Allocation)
	var shares []devicefit.Share
	if a := claim.Status.Allocation; a != nil {
		shares = devicefit.Shares(*a)
	}
	sharedAt, newShares := v, len(shares) > 0
	var seenAt uint64
	if had && sameShares(old.shares, shares) {
		sharedAt, seenAt, newShares = old.sharedAt, old.seenAt, false
		if old.writer != "" && writer == "" {
			// An assumed allocation's write is stored: the API server took
			// its shares at this version, after any share stored between
			// the plan and the write, not at the version planned from.
			sharedAt = v
		}
	} else if newShares {
		ix.shareCount++
		seenAt = ix.shareCount
	}
	if writer != "" {
		// Assumed: the API server has not taken these shares yet, so they
		// come after every share it has.
		sharedAt = math.MaxUint64
	}
	ix.claims[claim.UID] = indexedClaim{key: claim.Namespace + "/" + claim.Name, version: v, devices: devs, shares: shares, sharedAt: sharedAt, seenAt: seenAt, writer: writer,
		node: allocationNode(claim.Status.Allocation)}
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
		if newShares {
			note(ix.byDevice[sh.Device])
			note(ix.sharedBy[sh.Device])
		}
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

// deviceClash is one device of a claim that other claims hold too: with
// lists the claims (namespace/name) the claim's pod and theirs settle it
// between; over, for shares, says what the shares consume past the
// device's capacity.
type deviceClash struct {
	with []string
	over string
}

// sharers returns the devices of the claim that other claims hold too: a
// device held whole by two claims, held whole and shared at once, or
// shared by claims that together consume more of a capacity than
// capacity says the device has (devices capacity does not know, or a
// nil capacity, are not judged on capacity). The scheduler never
// allocates past a device's capacity; two allocators that did not see
// each other's shares can. Of such shares, in the order the API server
// took them, those that fit come first and the rest are over: a share
// that fits clashes with the shares over, one over with those that fit,
// so a pod that runs makes only those give way that must.
func (ix *claimIndex) sharers(uid types.UID, capacity func(structured.DeviceID) (map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, bool)) map[structured.DeviceID]deviceClash {
	type holder struct {
		uid      types.UID
		key      string
		at, seen uint64
		consumed map[resourceapi.QualifiedName]resource.Quantity
	}
	out := map[structured.DeviceID]deviceClash{}
	var check map[structured.DeviceID][]holder
	ix.mu.Lock()
	me := ix.claims[uid]
	keys := func(uids []types.UID) []string {
		var ks []string
		for _, u := range uids {
			if u != uid && !slices.Contains(ks, ix.claims[u].key) {
				ks = append(ks, ix.claims[u].key)
			}
		}
		return ks
	}
	for _, d := range me.devices {
		if with := keys(append(slices.Clone(ix.byDevice[d]), ix.sharedBy[d]...)); len(with) > 0 {
			out[d] = deviceClash{with: with}
		}
	}
	for _, sh := range me.shares {
		if _, done := out[sh.Device]; done || check[sh.Device] != nil {
			continue
		}
		if with := keys(ix.byDevice[sh.Device]); len(with) > 0 {
			out[sh.Device] = deviceClash{with: with}
			continue
		}
		if len(ix.sharedBy[sh.Device]) < 2 || capacity == nil {
			continue
		}
		var hs []holder
		for _, u := range ix.sharedBy[sh.Device] {
			c := ix.claims[u]
			h := holder{uid: u, key: c.key, at: c.sharedAt, seen: c.seenAt, consumed: map[resourceapi.QualifiedName]resource.Quantity{}}
			for _, s := range c.shares {
				if s.Device != sh.Device {
					continue
				}
				for name, q := range s.Consumed {
					sum := h.consumed[name]
					sum.Add(q)
					h.consumed[name] = sum
				}
			}
			hs = append(hs, h)
		}
		if check == nil {
			check = map[structured.DeviceID][]holder{}
		}
		check[sh.Device] = hs
	}
	ix.mu.Unlock()
	// The capacity is looked up without the index's lock.
	for d, hs := range check {
		has, ok := capacity(d)
		if !ok {
			continue
		}
		slices.SortFunc(hs, func(a, b holder) int {
			if a.at != b.at {
				return cmp.Compare(a.at, b.at)
			}
			return cmp.Compare(a.seen, b.seen)
		})
		sum := map[resourceapi.QualifiedName]resource.Quantity{}
		var fit, over []string
		past, meOver, detail := false, false, ""
		for _, h := range hs {
			for name, q := range h.consumed {
				s := sum[name]
				s.Add(q)
				sum[name] = s
				if c, ok := has[name]; ok && s.Cmp(c.Value) > 0 && !past {
					past, detail = true, fmt.Sprintf("%s %s of %s", name, s.String(), c.Value.String())
				}
			}
			switch {
			case h.uid == uid:
				meOver = past
			case past:
				over = append(over, h.key)
			default:
				fit = append(fit, h.key)
			}
		}
		if !meOver && len(over) == 0 {
			continue
		}
		with := over
		if meOver {
			with = fit
		}
		if len(with) == 0 {
			continue // over on its own: no other claim to settle it with
		}
		out[d] = deviceClash{with: with, over: detail}
	}
	return out
}

// wholeSharers returns, for each device the claim holds whole, the
// other claims that hold it whole too: the devices kube-scheduler may
// count free once one of them gives it back (fence.go).
func (ix *claimIndex) wholeSharers(uid types.UID) map[structured.DeviceID][]string {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	out := map[structured.DeviceID][]string{}
	for _, d := range ix.claims[uid].devices {
		for _, other := range ix.byDevice[d] {
			if other != uid {
				out[d] = append(out[d], ix.claims[other].key)
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
// rv (the controller wrote it and the informer has not caught up yet), or
// an allocation of the claim that group writer is writing.
func (ix *claimIndex) ahead(uid types.UID, rv string) (ahead bool, writer string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	c, ok := ix.claims[uid]
	v := parseVersion(rv)
	return ok && (c.writer != "" || v != 0 && c.version > v), c.writer
}
