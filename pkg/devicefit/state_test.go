package devicefit_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/devicefit"
)

// Shares of one device add up; a device held whole is held whole; admin
// access holds nothing; Remove undoes Add.
func TestState(t *testing.T) {
	result := func(device string, share string, milli int64) resourceapi.AllocationResult {
		d := resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: "d", Pool: "p", Device: device}
		if share != "" {
			d.ShareID = ptr.To(types.UID(share))
			d.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{"milliGPU": *resource.NewQuantity(milli, resource.DecimalSI)}
		}
		return resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{d}}}
	}
	st := devicefit.NewState()
	admin := result("gpu-2", "", 0)
	admin.Devices.Results[0].AdminAccess = ptr.To(true)
	all := []resourceapi.AllocationResult{result("gpu-0", "a", 250), result("gpu-0", "b", 500), result("gpu-1", "", 0), admin}
	st.Add(all...)
	type view struct {
		Whole  []string
		Shares int
		Milli  int64
	}
	look := func() view {
		v := view{Shares: st.ShareIDs.Len()}
		for id := range st.Devices {
			v.Whole = append(v.Whole, id.Device.String())
		}
		if c := st.Allocator().AggregatedCapacity[devicefit.DeviceID("d", "p", "gpu-0")]; c != nil {
			v.Milli = c["milliGPU"].Value()
		}
		return v
	}
	if diff := cmp.Diff(view{Whole: []string{"gpu-1"}, Shares: 2, Milli: 750}, look()); diff != "" {
		t.Errorf("after Add (-want +got):\n%s", diff)
	}
	if shares := devicefit.Shares(all...); len(shares) != 2 || shares[1].ShareID != "b" {
		t.Errorf("Shares: %+v", shares)
	}
	st.Remove(all[0], all[2])
	if diff := cmp.Diff(view{Shares: 1, Milli: 500}, look()); diff != "" {
		t.Errorf("after Remove (-want +got):\n%s", diff)
	}
}

// An admin-access result holds nothing, shared device or not, wherever
// results are turned into what is in use.
func TestAdminAccessHoldsNothing(t *testing.T) {
	admin := resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: "d", Pool: "p", Device: "gpu-0", AdminAccess: ptr.To(true), ShareID: ptr.To(types.UID("s"))}
	res := resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{admin}}}
	if devicefit.Holds(&admin) {
		t.Error("Holds: admin access holds its device")
	}
	if got := devicefit.Shares(res); len(got) != 0 {
		t.Errorf("Shares: %v, want none", got)
	}
	allocated := devicefit.Allocated{}
	devicefit.AddResults(allocated, res)
	if allocated.Len() != 0 {
		t.Errorf("AddResults: %v, want nothing allocated", allocated)
	}
}
