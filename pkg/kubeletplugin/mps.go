package kubeletplugin

import (
	"context"
	"fmt"
	"slices"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gputopo/gputopo/pkg/checkpoint"
	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/mps"
	"github.com/gputopo/gputopo/pkg/topology"
)

// syncMPSLocked runs an MPS control daemon for each GPU that prepared (or
// preparing) claims hold shares of, and none for any other: the first
// share starts it, the last one gone stops it. Its defaults are the
// smallest share's limits, so a client that drops its own
// CUDA_MPS_* variables gets no more than any share; each share's own
// limits reach its containers through those variables (shareEnv).
func (s *state) syncMPSLocked(ctx context.Context, view *nodeView) error {
	if s.mps == nil {
		return nil
	}
	want := map[string]mps.Limits{}
	for _, c := range s.cp.Claims {
		for _, d := range c.Devices {
			if !mpsServes(d) {
				continue
			}
			g, ok := view.devices[d.Device]
			if !ok {
				g = gpu.Device{UUID: d.UUID}
			}
			milli, mem, err := shareOf(d, g)
			if err != nil {
				return err
			}
			l := mps.Limits{ActiveThreadPercentage: percentOf(milli), PinnedMemoryBytes: mem}
			if have, ok := want[d.UUID]; ok {
				l.ActiveThreadPercentage = min(l.ActiveThreadPercentage, have.ActiveThreadPercentage)
				l.PinnedMemoryBytes = min(l.PinnedMemoryBytes, have.PinnedMemoryBytes)
			}
			want[d.UUID] = l
		}
	}
	if err := s.mps.Sync(ctx, want); err != nil {
		return fmt.Errorf("MPS control daemons of the shared GPUs: %w", err)
	}
	return nil
}

// checkMPS refuses a claim that MPS cannot serve: a CUDA process connects
// to one MPS daemon, which sees only its own GPU, so a claim holding a
// share holds nothing else.
func (s *state) checkMPS(devs []checkpoint.PreparedDevice) error {
	if s.mps == nil {
		return nil
	}
	var shared, other []string
	for _, d := range devs {
		switch {
		case d.AdminAccess:
		case mpsServes(d):
			shared = append(shared, d.Device)
		default:
			other = append(other, d.Device)
		}
	}
	switch {
	case len(shared) == 0 || (len(shared) == 1 && len(other) == 0):
		return nil
	case len(other) == 0:
		return fmt.Errorf("the claim holds shares of several GPUs (%s); each shared GPU has its own MPS control daemon and a CUDA process connects to one: claim a share of one GPU per pod", strings.Join(shared, ", "))
	}
	return fmt.Errorf("the claim holds a share of %s and whole GPUs (%s); a CUDA process connected to the shared GPU's MPS control daemon sees that GPU alone: claim whole GPUs in another pod", strings.Join(shared, ", "), strings.Join(other, ", "))
}

// mpsEdits mounts a shared GPU's pipe directory, and the directory its
// daemon sees as /dev/shm, into its claim's containers.
func (s *state) mpsEdits(d checkpoint.PreparedDevice, edits *cdispec.ContainerEdits) *cdispec.ContainerEdits {
	if s.mps == nil || !mpsServes(d) {
		return edits
	}
	if edits == nil {
		edits = &cdispec.ContainerEdits{}
	}
	edits.Mounts = append(edits.Mounts, &cdispec.Mount{
		HostPath: s.mps.PipeDir(d.UUID), ContainerPath: topology.MPSContainerPipeDir,
		Type: "bind", Options: []string{"rw", "nosuid", "nodev", "bind"},
	})
	if s.mps.SharesShm() {
		// The MPS server and its clients share /dev/shm.
		edits.Mounts = append(edits.Mounts, &cdispec.Mount{
			HostPath: s.mps.ShmDir(d.UUID), ContainerPath: topology.MPSContainerShmDir,
			Type: "bind", Options: []string{"rw", "nosuid", "nodev", "bind"},
		})
	}
	return edits
}

func hasShare(devs []checkpoint.PreparedDevice) bool {
	return slices.ContainsFunc(devs, mpsServes)
}

// mpsServes says whether a device of a claim is a share that MPS serves:
// one that leaves room for others. A claim for a whole GPU that lands on
// a shared GPU holding no share consumes all of its milliGPU, and holds
// the GPU as it would one handed out whole (and may come with GPUs that
// are, as in an NVLink pair): no daemon for it.
func mpsServes(d checkpoint.PreparedDevice) bool {
	if d.ShareID == "" || d.AdminAccess {
		return false
	}
	milli, err := consumed(d, topology.CapacityMilliGPU)
	if _, ok := d.Consumed[topology.CapacityMilliGPU]; !ok || err != nil {
		return err != nil // unparsable: let the sync report it
	}
	return milli < topology.MilliPerGPU
}

// percentOf is a compute share as an MPS active-thread percentage.
func percentOf(milli int64) int64 { return max(1, milli*100/topology.MilliPerGPU) }
