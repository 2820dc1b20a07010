package controller

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/topology"
)

// shareClaim holds milli thousandths of a shared GPU of node n0.
func shareClaim(name, device string, milli int64) *resourceapi.ResourceClaim {
	return shareClaimOn(name, "n0", device, milli)
}

// shareClaimOn holds milli thousandths of a shared GPU of node.
func shareClaimOn(name, node, device string, milli int64) *resourceapi.ResourceClaim {
	c := foreignClaim(name, node, device)
	r := &c.Status.Allocation.Devices.Results[0]
	r.ShareID = ptr.To(types.UID("share-" + name))
	r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{topology.CapacityMilliGPU: *resource.NewQuantity(milli, resource.DecimalSI)}
	return c
}

// oneGPU is the capacity of every shared device: 1000 milliGPU.
func oneGPU(structured.DeviceID) (map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, bool) {
	return map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{topology.CapacityMilliGPU: {Value: resource.MustParse("1000")}}, true
}

// Shares of one device within its capacity are no clash; every plan sees
// what they consume together, beside the devices held whole. Admin access
// holds nothing.
func TestClaimIndexCountsShares(t *testing.T) {
	ix := newClaimIndex()
	monitor := foreignClaim("dcgm", "n0", "gpu-0", "gpu-1")
	for i := range monitor.Status.Allocation.Devices.Results {
		monitor.Status.Allocation.Devices.Results[i].AdminAccess = ptr.To(true)
	}
	for _, c := range []*resourceapi.ResourceClaim{shareClaim("a", "gpu-0", 250), shareClaim("b", "gpu-0", 500), foreignClaim("whole", "n0", "gpu-1"), monitor} {
		ix.update(c)
		if clash := ix.sharers(c.UID, oneGPU); len(clash) > 0 {
			t.Errorf("claim %s clashes with %v", c.Name, clash)
		}
	}
	type view struct {
		Whole  []string
		Shares int
		Milli  int64
	}
	look := func() view {
		ix.mu.Lock()
		defer ix.mu.Unlock()
		st := ix.stateLocked()
		v := view{Shares: st.ShareIDs.Len()}
		for id := range st.Devices {
			v.Whole = append(v.Whole, id.Device.String())
		}
		if c := st.Consumed[devicefit.DeviceID(topology.DriverName, "n0", "gpu-0")]; c != nil {
			v.Milli = c[topology.CapacityMilliGPU].Value()
		}
		return v
	}
	if diff := cmp.Diff(view{Whole: []string{"gpu-1"}, Shares: 2, Milli: 750}, look()); diff != "" {
		t.Errorf("allocated (-want +got):\n%s", diff)
	}
	ix.remove("claim-b")
	if diff := cmp.Diff(view{Whole: []string{"gpu-1"}, Shares: 1, Milli: 250}, look()); diff != "" {
		t.Errorf("allocated after a share is gone (-want +got):\n%s", diff)
	}
}

// A share the controller is writing comes after every share the API
// server holds, and once stored it is ordered by the version it was stored
// at, not by the claim's version it was planned from: a share the
// scheduler stored between the plan and the write came first.
func TestAssumedSharesComeAfterSharesStoredMeanwhile(t *testing.T) {
	dev := structured.MakeDeviceID("gpu.example.com", "pool", "gpu-0")
	alloc := func(id string, gi int64) *resourceapi.AllocationResult {
		return &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "r", Driver: "gpu.example.com", Pool: "pool", Device: "gpu-0", ShareID: ptr.To(types.UID(id)),
			ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": *resource.NewQuantity(gi, resource.DecimalSI)},
		}}}}
	}
	claim := func(name, rv string, a *resourceapi.AllocationResult) *resourceapi.ResourceClaim {
		cl := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name), ResourceVersion: rv}}
		cl.Status.Allocation = a
		return cl
	}
	capacity := func(structured.DeviceID) (map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, bool) {
		return map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: *resource.NewQuantity(100, resource.DecimalSI)}}, true
	}
	ix := newClaimIndex()
	ix.update(claim("z", "5", alloc("z", 30)))                        // stored at 5
	ix.assume(claim("x", "10", nil), alloc("x", 40), "default/job/x") // planned from x at 10
	ix.update(claim("y", "11", alloc("y", 40)))                       // the scheduler's, stored at 11
	// z (30) and y (40) fit; x (40) is the one past 100, in flight.
	if got := ix.sharers("z", capacity)[dev].with; !cmp.Equal(got, []string{"default/x"}) {
		t.Errorf("while x is written, z clashes with %v, want [default/x]", got)
	}
	ix.update(claim("x", "12", alloc("x", 40))) // x's write, stored at 12
	if got := ix.sharers("z", capacity)[dev].with; !cmp.Equal(got, []string{"default/x"}) {
		t.Errorf("once x is stored, z clashes with %v, want [default/x]: y, stored before x, is judged over", got)
	}
	// A share stored after x's write comes after x: past 100 as well.
	ix.update(claim("w", "13", alloc("w", 20)))
	if got := ix.sharers("z", capacity)[dev].with; !cmp.Equal(got, []string{"default/x", "default/w"}) {
		t.Errorf("after w, z clashes with %v, want [default/x default/w]: x, stored before w, still counts as taken last", got)
	}
}

// A write that fails withdraws what it assumed, and leaves the index as
// it was: a claim deleted between the plan and the assumption (its
// deletion event already handled) leaves no entry behind, as no later
// event would remove one; a claim the index holds keeps its entry and
// version.
func TestFailedWriteOfADeletedClaimLeavesNoEntry(t *testing.T) {
	alloc := foreignClaim("any", "n0", "gpu-0").Status.Allocation
	claim := func(name string) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name), ResourceVersion: "5"}}
	}
	ix := newClaimIndex()
	gone, kept := claim("gone"), claim("kept")
	ix.update(gone)
	ix.update(kept)
	ix.remove(gone.UID) // deleted; the plan read it just before
	for _, c := range []*resourceapi.ResourceClaim{gone, kept} {
		ix.assume(c, alloc, "default/job/j")
		ix.unassume(c.UID, "default/job/j")
	}
	if e, ok := ix.claims[gone.UID]; ok {
		t.Errorf("the deleted claim keeps an entry %+v", e)
	}
	if e, ok := ix.claims[kept.UID]; !ok || e.version != 5 || len(e.devices) != 0 {
		t.Errorf("the held claim's entry is %+v (present %v), want version 5 and no devices", e, ok)
	}
	if len(ix.byDevice) != 0 || ix.held.Len() != 0 {
		t.Errorf("devices still held: %v", ix.byDevice)
	}
}

// TestAssumedNodeWhileTheWriteIsInFlight: a plan's allocation names its
// node while its write is in flight, which the informer does not show
// yet; once the stored claim replaces it, or the write fails, it names
// none.
func TestAssumedNodeWhileTheWriteIsInFlight(t *testing.T) {
	alloc := foreignClaim("any", "n2", "gpu-0").Status.Allocation
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default", UID: "c", ResourceVersion: "5"}}
	ix := newClaimIndex()
	ix.update(claim)
	if got := ix.assumedNode(claim.UID); got != "" {
		t.Errorf("before the plan: assumedNode = %q, want none", got)
	}
	ix.assume(claim, alloc, "default/job/j")
	if got := ix.assumedNode(claim.UID); got != "n2" {
		t.Errorf("write in flight: assumedNode = %q, want n2", got)
	}
	stored := claim.DeepCopy()
	stored.ResourceVersion, stored.Status.Allocation = "6", alloc
	ix.update(stored)
	if got := ix.assumedNode(claim.UID); got != "" {
		t.Errorf("stored: assumedNode = %q, want none (the informer shows it)", got)
	}
	ix.assume(stored, alloc, "default/job/k")
	ix.unassume(stored.UID, "default/job/k")
	if got := ix.assumedNode(claim.UID); got != "" {
		t.Errorf("after a failed write: assumedNode = %q, want none", got)
	}
}
