package devicefit

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
)

// State is what allocated claims hold, the way the scheduler counts it:
// devices held whole, and for shared devices (allowMultipleAllocations)
// each share and the capacity all shares of a device consume together.
type State struct {
	Devices  Allocated
	ShareIDs sets.Set[structured.SharedDeviceID]
	Consumed structured.ConsumedCapacityCollection
}

// NewState returns an empty state.
func NewState() State {
	return State{Devices: Allocated{}, ShareIDs: sets.New[structured.SharedDeviceID](), Consumed: structured.NewConsumedCapacityCollection()}
}

// Share is the part of a shared device one allocation result holds.
type Share struct {
	Device   structured.DeviceID
	ShareID  string
	Consumed map[resourceapi.QualifiedName]resource.Quantity
}

// Holds reports whether the result takes its device (or its share) from
// other claims: admin access holds nothing, as the scheduler counts it.
func Holds(d *resourceapi.DeviceRequestAllocationResult) bool {
	return d.AdminAccess == nil || !*d.AdminAccess
}

// Shares lists the shares among results.
func Shares(results ...resourceapi.AllocationResult) []Share {
	var out []Share
	for _, r := range results {
		for _, d := range r.Devices.Results {
			if d.ShareID != nil && Holds(&d) {
				out = append(out, Share{Device: structured.MakeDeviceID(d.Driver, d.Pool, d.Device), ShareID: string(*d.ShareID), Consumed: d.ConsumedCapacity})
			}
		}
	}
	return out
}

// Add records what the results hold: shares as shares, other devices
// whole.
func (s State) Add(results ...resourceapi.AllocationResult) {
	each(results, func(id structured.DeviceID) { s.Devices.Insert(id) }, s.AddShare)
}

// Remove forgets what Add recorded for the results.
func (s State) Remove(results ...resourceapi.AllocationResult) {
	each(results, func(id structured.DeviceID) { s.Devices.Delete(id) }, s.RemoveShare)
}

// each calls whole for every device held whole and share for every share.
// Admin access holds nothing, as the scheduler counts it.
func each(results []resourceapi.AllocationResult, whole func(structured.DeviceID), share func(Share)) {
	for _, r := range results {
		for _, d := range r.Devices.Results {
			if !Holds(&d) {
				continue
			}
			id := structured.MakeDeviceID(d.Driver, d.Pool, d.Device)
			if d.ShareID == nil {
				whole(id)
				continue
			}
			share(Share{Device: id, ShareID: string(*d.ShareID), Consumed: d.ConsumedCapacity})
		}
	}
}

// AddShare records one share.
func (s State) AddShare(sh Share) {
	uid := types.UID(sh.ShareID)
	s.ShareIDs.Insert(structured.MakeSharedDeviceID(sh.Device, &uid))
	s.Consumed.Insert(structured.NewDeviceConsumedCapacity(sh.Device, sh.Consumed))
}

// RemoveShare forgets one share recorded with AddShare.
func (s State) RemoveShare(sh Share) {
	uid := types.UID(sh.ShareID)
	s.ShareIDs.Delete(structured.MakeSharedDeviceID(sh.Device, &uid))
	s.Consumed.Remove(structured.NewDeviceConsumedCapacity(sh.Device, sh.Consumed))
}

// Allocator is the state as the structured allocator takes it. The
// allocator only reads it.
func (s State) Allocator() structured.AllocatedState {
	return structured.AllocatedState{AllocatedDevices: s.Devices, AllocatedSharedDeviceIDs: s.ShareIDs, AggregatedCapacity: s.Consumed}
}
