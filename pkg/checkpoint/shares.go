package checkpoint

import (
	"maps"
	"slices"
)

// Holder is a claim that holds a device, whole or a share of it.
type Holder struct {
	ClaimUID string
	Device   PreparedDevice
}

// Holders lists the claims other than except that hold device in pool,
// in any state, in UID order. A device handed out whole has at most one
// holder; a shared device has one per share. Admin-access preparations
// hold nothing and are not listed.
func (cp *Checkpoint) Holders(pool, device, except string) []Holder {
	var out []Holder
	for _, uid := range slices.Sorted(maps.Keys(cp.Claims)) {
		if uid == except {
			continue
		}
		for _, d := range cp.Claims[uid].Devices {
			if d.Pool == pool && d.Device == device && !d.AdminAccess {
				out = append(out, Holder{ClaimUID: uid, Device: d})
			}
		}
	}
	return out
}
