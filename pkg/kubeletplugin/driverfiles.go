package kubeletplugin

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/checkpoint"
)

// syncDriverLocked regenerates the driver edits every container with a
// real GPU gets, and when they changed (a driver upgrade names other
// versioned libraries, a control device node such as /dev/nvidia-uvm
// appeared) rewrites the spec of every prepared claim, so a container
// restarted later gets the driver as it is now. A failure keeps the edits
// there were.
func (s *state) syncDriverLocked(ctx context.Context, view *nodeView) error {
	if s.driver == nil {
		return nil
	}
	common, err := s.driver.Common()
	if err != nil {
		return fmt.Errorf("regenerate the NVIDIA driver edits (kept those generated before): %w", err)
	}
	if reflect.DeepEqual(common, s.common) {
		return nil
	}
	s.common = common
	var errs []error
	rewritten := 0
	for uid, c := range s.cp.Claims {
		if c.State != checkpoint.PrepareCompleted {
			continue
		}
		if _, err := s.writeSpec(uid, c.Devices, view); err != nil {
			errs = append(errs, fmt.Errorf("rewrite the CDI spec of claim %s: %w", s.describe(uid), err))
			continue
		}
		rewritten++
	}
	klog.FromContext(ctx).Info("NVIDIA driver files changed; CDI specs of prepared claims rewritten",
		"mounts", len(common.Mounts), "deviceNodes", len(common.DeviceNodes), "claims", rewritten)
	return errors.Join(errs...)
}

// syncDriver is syncDriverLocked for the refresh loop.
func (s *state) syncDriver(ctx context.Context, view *nodeView) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.syncDriverLocked(ctx, view)
}
