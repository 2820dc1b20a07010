// Package checkpoint persists which ResourceClaims the kubelet plugin has
// prepared on this node, so that a restarted plugin can answer
// NodePrepareResources/NodeUnprepareResources idempotently and never hands a
// GPU to two claims.
//
// Preparation is two-phase: a claim is recorded as PrepareStarted before any
// side effect (CDI spec file) is created and flipped to PrepareCompleted
// afterwards. A claim found in PrepareStarted after a restart therefore marks
// side effects that may exist partially and must be rolled back or redone.
package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
)

// Version identifies the on-disk schema. Bump it for any incompatible change
// so that an old plugin refuses a newer file instead of misreading it.
const Version = "gputopo.dev/checkpoint/v1"

// State is the preparation phase of one claim.
type State string

const (
	// PrepareStarted is written before any side effect of preparing a claim.
	PrepareStarted State = "PrepareStarted"
	// PrepareCompleted is written once the claim's CDI spec exists and the
	// device IDs have been returned to the kubelet.
	PrepareCompleted State = "PrepareCompleted"
)

var (
	// ErrCorrupt reports a checkpoint file that cannot be trusted: invalid
	// JSON, a checksum mismatch, or internally inconsistent content.
	ErrCorrupt = errors.New("checkpoint corrupt")
	// ErrUnsupportedVersion reports a well-formed checkpoint written with a
	// schema version this binary does not understand.
	ErrUnsupportedVersion = errors.New("unsupported checkpoint version")
)

// PreparedDevice is one device allocated to a claim on this node.
type PreparedDevice struct {
	// Request is the request name in the claim; it may be "req/subreq" for
	// requests with prioritized alternatives.
	Request string `json:"request"`
	Pool    string `json:"pool"`
	// Device is the device name in the ResourceSlice, e.g. "gpu-3".
	Device string `json:"device"`
	// UUID is the GPU UUID.
	UUID         string   `json:"uuid"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
	// AdminAccess marks a device prepared for an admin-access request
	// (monitoring): it does not hold the device against other claims.
	AdminAccess bool `json:"adminAccess,omitempty"`
}

// ClaimState is the preparation record of one claim.
type ClaimState struct {
	UID       string           `json:"uid"`
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	State     State            `json:"state"`
	Devices   []PreparedDevice `json:"devices"`
}

// Checkpoint is the whole on-disk document.
type Checkpoint struct {
	Version string `json:"version"`
	// BootID is the host's boot ID when the checkpoint was written. CDI
	// specs live on tmpfs and GPUs are reset by a reboot, so a checkpoint
	// from an earlier boot describes nothing that still exists.
	BootID string `json:"bootID,omitempty"`
	// Claims is keyed by claim UID.
	Claims map[string]ClaimState `json:"claims"`
	// Checksum is a CRC-32C over the canonical JSON encoding of Claims. It
	// is maintained by Store.Save and verified by Store.Load so that a torn
	// or hand-edited file is detected rather than silently trusted.
	Checksum uint32 `json:"checksum"`
}

// New returns an empty checkpoint of the current version.
func New() *Checkpoint {
	return &Checkpoint{Version: Version, Claims: map[string]ClaimState{}}
}

// DeviceOwner reports which claim holds device in pool, in any state. A
// claim in PrepareStarted counts as owner because its side effects may
// already exist. Admin-access preparations hold nothing.
func (cp *Checkpoint) DeviceOwner(pool, device string) (claimUID string, ok bool) {
	// Iterate in UID order so the answer is deterministic even if a damaged
	// checkpoint lists the same device under two claims.
	uids := make([]string, 0, len(cp.Claims))
	for uid := range cp.Claims {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	for _, uid := range uids {
		for _, d := range cp.Claims[uid].Devices {
			if d.Pool == pool && d.Device == device && !d.AdminAccess {
				return uid, true
			}
		}
	}
	return "", false
}

// checksum computes the CRC over the canonical encoding of the claims.
// encoding/json sorts map keys and the structs have a fixed field order, so
// the encoding of decoded data is stable; this makes the checksum semantic
// (re-indenting the file is harmless, changing a value is not).
func checksum(claims map[string]ClaimState) (uint32, error) {
	data, err := json.Marshal(claims)
	if err != nil {
		return 0, fmt.Errorf("encode claims for checksum: %w", err)
	}
	return crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli)), nil
}

// validate checks invariants that Save must never violate and Load must
// never accept.
func (cp *Checkpoint) validate() error {
	for key, c := range cp.Claims {
		if key == "" {
			return errors.New("claim with empty UID")
		}
		if key != c.UID {
			return fmt.Errorf("claim stored under key %q has UID %q", key, c.UID)
		}
		switch c.State {
		case PrepareStarted, PrepareCompleted:
		default:
			return fmt.Errorf("claim %s has unknown state %q", key, c.State)
		}
	}
	return nil
}

// Clone returns a deep copy of cp, so a caller can stage changes and adopt
// them only once Save has succeeded.
func (cp *Checkpoint) Clone() *Checkpoint {
	out := &Checkpoint{
		Version:  cp.Version,
		BootID:   cp.BootID,
		Checksum: cp.Checksum,
		Claims:   make(map[string]ClaimState, len(cp.Claims)),
	}
	for uid, c := range cp.Claims {
		// slices.Clone keeps nil and empty apart, so a clone encodes
		// exactly like the original.
		c.Devices = slices.Clone(c.Devices)
		for i := range c.Devices {
			c.Devices[i].CDIDeviceIDs = slices.Clone(c.Devices[i].CDIDeviceIDs)
		}
		out.Claims[uid] = c
	}
	return out
}
