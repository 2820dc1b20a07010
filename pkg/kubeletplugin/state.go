package kubeletplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gputopo/gputopo/pkg/cdi"
	"github.com/gputopo/gputopo/pkg/checkpoint"
	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/mps"
	"github.com/gputopo/gputopo/pkg/topology"
)

// ErrDeviceInUse is returned for a claim whose device is already prepared
// for another claim.
var ErrDeviceInUse = errors.New("device already prepared for another claim")

// ErrUnknownDevice is returned for an allocation naming a device this
// node does not publish.
var ErrUnknownDevice = errors.New("device not published by this node")

// ErrUnhealthyDevice is returned for an allocation of an unhealthy GPU.
var ErrUnhealthyDevice = errors.New("device is unhealthy")

// nodeView is the part of the node's state that prepare needs: which GPU
// each published device is, and the placement to tell containers.
type nodeView struct {
	devices   map[string]gpu.Device // by slice device name
	nvlink    map[string]topology.GPUPlacement
	network   topology.NetworkPlacement
	unhealthy map[string]gpu.HealthEvent // by UUID
}

// state prepares and unprepares claims. Every change goes through the
// checkpoint first, in two phases, so a crash between writing the CDI spec
// and recording it is rolled back on the next start.
type state struct {
	node    string
	store   *checkpoint.Store
	cdi     *cdi.Writer
	metrics *Metrics
	// driver gives real GPUs to containers, with common, its edits for
	// every container, regenerated at each prepare and refresh (see
	// syncDriverLocked); nil for simulated GPUs.
	driver cdi.DriverEdits
	common *cdispec.ContainerEdits
	// mps runs the MPS control daemons of shared GPUs; nil where shares
	// are not enforced (simulated GPUs without a stand-in control program).
	mps *mps.Manager

	mu sync.Mutex
	cp *checkpoint.Checkpoint
}

// newState loads the checkpoint, forgets it if the node rebooted since it
// was written (bootID differs; empty means unknown), and rolls back any
// preparation that a crash interrupted.
func newState(ctx context.Context, node, pluginDir, cdiRoot, bootID string, m *Metrics) (*state, error) {
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return nil, fmt.Errorf("create plugin directory: %w", err)
	}
	w, err := cdi.NewWriter(cdiRoot)
	if err != nil {
		return nil, fmt.Errorf("open CDI directory %s: %w", cdiRoot, err)
	}
	s := &state{node: node, store: checkpoint.NewStore(filepath.Join(pluginDir, "checkpoint.json")), cdi: w, metrics: m}
	cp, err := s.store.Load()
	if err != nil {
		return nil, fmt.Errorf("load checkpoint: %w", err)
	}
	s.cp = cp
	next := cp.Clone()
	rebooted := bootID != "" && cp.BootID != "" && cp.BootID != bootID
	if rebooted && len(cp.Claims) > 0 {
		klog.FromContext(ctx).Info("Node rebooted since the checkpoint was written; forgetting its prepared claims", "claims", len(cp.Claims))
	}
	next.BootID = bootID
	for uid, c := range cp.Claims {
		if c.State == checkpoint.PrepareCompleted && !rebooted {
			continue
		}
		klog.FromContext(ctx).Info("Rolling back interrupted preparation", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid)
		if err := w.RemoveClaimSpec(uid); err != nil {
			return nil, fmt.Errorf("roll back claim %s: %w", uid, err)
		}
		delete(next.Claims, uid)
	}
	if len(next.Claims) != len(cp.Claims) || next.BootID != cp.BootID {
		if err := s.store.Save(next); err != nil {
			return nil, fmt.Errorf("save checkpoint after roll-back: %w", err)
		}
		s.cp = next
	}
	s.updateGauges()
	return s, nil
}

// prepared returns the claims in the checkpoint, for tests and start-up.
func (s *state) prepared() map[string]checkpoint.ClaimState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cp.Clone().Claims
}

func (s *state) prepare(ctx context.Context, claim *resourceapi.ResourceClaim, view *nodeView) kubeletplugin.PrepareResult {
	start := time.Now()
	defer func() { s.metrics.PrepareDuration.Observe(time.Since(start).Seconds()) }()
	s.mu.Lock()
	defer s.mu.Unlock()
	devs, err := s.prepareLocked(ctx, claim, view)
	if err != nil {
		s.metrics.PrepareErrors.Inc()
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s/%s: %w", claim.Namespace, claim.Name, err)}
	}
	return kubeletplugin.PrepareResult{Devices: devs}
}

func (s *state) prepareLocked(ctx context.Context, claim *resourceapi.ResourceClaim, view *nodeView) ([]kubeletplugin.Device, error) {
	uid := string(claim.UID)
	// The driver as it is now: a claim prepared after a driver upgrade, or
	// after /dev/nvidia-uvm appeared, must get it.
	if err := s.syncDriverLocked(ctx, view); err != nil {
		klog.FromContext(ctx).Error(err, "Preparing with the driver edits generated before", "claim", klog.KObj(claim))
	}
	if c, ok := s.cp.Claims[uid]; ok && c.State == checkpoint.PrepareCompleted {
		// Write the spec again: the kubelet retries a prepare when the
		// container could not start, e.g. because the CDI directory was
		// cleaned, and the retry must repair that (and start a daemon that
		// died).
		if hasShare(c.Devices) {
			if err := s.syncMPSLocked(ctx, view); err != nil {
				return nil, err
			}
		}
		if _, err := s.writeSpec(uid, c.Devices, view); err != nil {
			return nil, err
		}
		return resultDevices(c), nil
	}
	if claim.Status.Allocation == nil {
		return nil, errors.New("claim is not allocated")
	}
	c := checkpoint.ClaimState{UID: uid, Namespace: claim.Namespace, Name: claim.Name, State: checkpoint.PrepareStarted}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != topology.DriverName || r.Pool != s.node {
			continue
		}
		g, ok := view.devices[r.Device]
		if !ok {
			return nil, fmt.Errorf("%w: %s (pool %s)", ErrUnknownDevice, r.Device, r.Pool)
		}
		// Admin access (monitoring, DCGM) is granted on a busy or
		// unhealthy GPU and holds it against nobody.
		admin := r.AdminAccess != nil && *r.AdminAccess
		pd := preparedDevice(r, g, admin)
		if err := s.checkHolders(uid, pd, g); err != nil {
			return nil, err
		}
		if ev, bad := view.unhealthy[g.UUID]; bad && !admin {
			return nil, fmt.Errorf("%w: %s (%s): %s", ErrUnhealthyDevice, r.Device, g.UUID, ev.Reason)
		}
		c.Devices = append(c.Devices, pd)
	}
	if len(c.Devices) == 0 {
		return nil, fmt.Errorf("no device of driver %s on node %s is allocated to this claim", topology.DriverName, s.node)
	}
	if err := s.checkMPS(c.Devices); err != nil {
		return nil, err
	}

	// Phase one: record the intent, so a crash after the CDI spec is
	// written can be rolled back.
	next := s.cp.Clone()
	next.Claims[uid] = c
	if err := s.store.Save(next); err != nil {
		return nil, fmt.Errorf("record preparation start: %w", err)
	}
	s.cp = next

	// The daemon first: the spec mounts its pipe directory.
	if hasShare(c.Devices) {
		if err := s.syncMPSLocked(ctx, view); err != nil {
			return nil, errors.Join(err, s.forgetLocked(uid), s.syncMPSLocked(ctx, view))
		}
	}
	ids, err := s.writeSpec(uid, c.Devices, view)
	if err != nil {
		return nil, errors.Join(err, s.forgetLocked(uid), s.syncMPSLocked(ctx, view))
	}

	// Phase two: the spec is in place.
	next = s.cp.Clone()
	for i := range c.Devices {
		c.Devices[i].CDIDeviceIDs = ids[c.Devices[i].Device]
	}
	c.State = checkpoint.PrepareCompleted
	next.Claims[uid] = c
	if err := s.store.Save(next); err != nil {
		return nil, errors.Join(fmt.Errorf("record preparation end: %w", err), s.cdi.RemoveClaimSpec(uid), s.forgetLocked(uid), s.syncMPSLocked(ctx, view))
	}
	s.cp = next
	s.updateGauges()
	klog.FromContext(ctx).V(2).Info("Prepared claim", "claim", klog.KObj(claim), "devices", len(c.Devices))
	return resultDevices(c), nil
}

func (s *state) describe(uid string) string {
	if c, ok := s.cp.Claims[uid]; ok {
		return c.Namespace + "/" + c.Name + " (" + uid + ")"
	}
	return uid
}

// forgetLocked drops a claim from the checkpoint.
func (s *state) forgetLocked(uid string) error {
	if _, ok := s.cp.Claims[uid]; !ok {
		return nil
	}
	next := s.cp.Clone()
	delete(next.Claims, uid)
	if err := s.store.Save(next); err != nil {
		return fmt.Errorf("remove claim %s from checkpoint: %w", uid, err)
	}
	s.cp = next
	s.updateGauges()
	return nil
}

func (s *state) unprepare(ctx context.Context, uid types.UID, view *nodeView) error {
	start := time.Now()
	defer func() { s.metrics.UnprepareDuration.Observe(time.Since(start).Seconds()) }()
	s.mu.Lock()
	defer s.mu.Unlock()
	// The spec goes first: a crash in between leaves a checkpoint entry
	// whose unprepare is simply repeated by the kubelet.
	if err := s.cdi.RemoveClaimSpec(string(uid)); err != nil {
		return fmt.Errorf("unprepare claim %s: %w", uid, err)
	}
	if err := s.forgetLocked(string(uid)); err != nil {
		return fmt.Errorf("unprepare claim %s: %w", uid, err)
	}
	// Also when the claim was gone already: a retried unprepare stops a
	// daemon the first attempt failed to.
	if err := s.syncMPSLocked(ctx, view); err != nil {
		return fmt.Errorf("unprepare claim %s: %w", uid, err)
	}
	klog.FromContext(ctx).V(2).Info("Unprepared claim", "uid", uid)
	return nil
}

func (s *state) updateGauges() {
	devices := 0
	for _, c := range s.cp.Claims {
		devices += len(c.Devices)
	}
	s.metrics.PreparedClaims.Set(float64(len(s.cp.Claims)))
	s.metrics.PreparedDevices.Set(float64(devices))
}

func resultDevices(c checkpoint.ClaimState) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(c.Devices))
	for _, d := range c.Devices {
		out = append(out, kubeletplugin.Device{
			Requests:     []string{d.Request},
			PoolName:     d.Pool,
			DeviceName:   d.Device,
			CDIDeviceIDs: d.CDIDeviceIDs,
		})
	}
	return out
}
