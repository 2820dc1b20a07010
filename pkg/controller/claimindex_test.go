package controller

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/topology"
)

// shareClaim holds milli thousandths of a shared GPU of node n0.
func shareClaim(name, device string, milli int64) *resourceapi.ResourceClaim {
	c := foreignClaim(name, "n0", device)
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

// Shares that together consume more than their device has clash, as a
// share beside a device held whole does; the claims' groups are synced
// whenever another claim takes a share of a device they share. Capacity
// the index cannot look up is not judged.
func TestClaimIndexShareClashes(t *testing.T) {
	ix := newClaimIndex()
	ix.update(shareClaim("a", "gpu-0", 250))
	ix.update(shareClaim("b", "gpu-0", 500))
	if got := ix.update(shareClaim("c", "gpu-0", 500)); !cmp.Equal(got, []types.UID{"claim-a", "claim-b"}) {
		t.Errorf("a new share of gpu-0 syncs %v, want claim-a and claim-b", got)
	}
	gpu0 := devicefit.DeviceID(topology.DriverName, "n0", "gpu-0")
	for uid, want := range map[types.UID][]string{"claim-a": {"default/b", "default/c"}, "claim-c": {"default/a", "default/b"}} {
		if got := ix.sharers(uid, oneGPU)[gpu0]; !cmp.Equal(got, want) {
			t.Errorf("%s shares gpu-0 past its capacity with %v, want %v", uid, got, want)
		}
	}
	if got := ix.sharers("claim-a", nil); len(got) > 0 {
		t.Errorf("without capacities, shares clash: %v", got)
	}
	ix.remove("claim-c")
	if got := ix.sharers("claim-a", oneGPU); len(got) > 0 {
		t.Errorf("after the third share went, the two left (750 of 1000) clash: %v", got)
	}
	if got := ix.update(foreignClaim("whole", "n0", "gpu-0")); len(got) != 2 {
		t.Errorf("gpu-0 held whole beside two shares syncs %v, want both sharers", got)
	}
	if got := ix.sharers("claim-a", nil)[gpu0]; !cmp.Equal(got, []string{"default/whole"}) {
		t.Errorf("a share beside the device held whole clashes with %v, want default/whole", got)
	}
	if got := ix.sharers("claim-whole", nil)[gpu0]; len(got) != 2 {
		t.Errorf("the device held whole clashes with %v, want both sharers", got)
	}
}
