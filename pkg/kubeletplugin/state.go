package kubeletplugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/cdi"
	"github.com/gputopo/gputopo/pkg/checkpoint"
	"github.com/gputopo/gputopo/pkg/gpu"
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
	devRoot   string
}

// state prepares and unprepares claims. Every change goes through the
// checkpoint first, in two phases, so a crash between writing the CDI spec
// and recording it is rolled back on the next start.
type state struct {
	node    string
	store   *checkpoint.Store
	cdi     *cdi.Writer
	metrics *Metrics

	mu sync.Mutex
	cp *checkpoint.Checkpoint
}

// newState loads the checkpoint and rolls back any preparation that a
// crash interrupted.
func newState(ctx context.Context, node, pluginDir, cdiRoot string, m *Metrics) (*state, error) {
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
	for uid, c := range cp.Claims {
		if c.State == checkpoint.PrepareCompleted {
			continue
		}
		klog.FromContext(ctx).Info("Rolling back interrupted preparation", "claim", klog.KRef(c.Namespace, c.Name), "uid", uid)
		if err := w.RemoveClaimSpec(uid); err != nil {
			return nil, fmt.Errorf("roll back claim %s: %w", uid, err)
		}
		delete(next.Claims, uid)
	}
	if len(next.Claims) != len(cp.Claims) {
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
	if c, ok := s.cp.Claims[uid]; ok && c.State == checkpoint.PrepareCompleted {
		return resultDevices(c), nil
	}
	if claim.Status.Allocation == nil {
		return nil, errors.New("claim is not allocated")
	}
	c := checkpoint.ClaimState{UID: uid, Namespace: claim.Namespace, Name: claim.Name, State: checkpoint.PrepareStarted}
	var edits []cdi.DeviceEdits
	var domains, cliques []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != topology.DriverName || r.Pool != s.node {
			continue
		}
		g, ok := view.devices[r.Device]
		if !ok {
			return nil, fmt.Errorf("%w: %s (pool %s)", ErrUnknownDevice, r.Device, r.Pool)
		}
		pd := preparedDevice(r, g)
		if err := s.checkHolders(uid, pd, g); err != nil {
			return nil, err
		}
		if ev, bad := view.unhealthy[g.UUID]; bad && (r.AdminAccess == nil || !*r.AdminAccess) {
			return nil, fmt.Errorf("%w: %s (%s): %s", ErrUnhealthyDevice, r.Device, g.UUID, ev.Reason)
		}
		c.Devices = append(c.Devices, pd)
		e := cdi.DeviceEdits{Name: r.Device, UUID: g.UUID}
		if view.devRoot != "" {
			e.DeviceNodes = []string{filepath.Join(view.devRoot, fmt.Sprintf("nvidia%d", g.Minor))}
		}
		edits = append(edits, e)
		domains = appendUnique(domains, view.nvlink[r.Device].Domain)
		cliques = appendUnique(cliques, topology.Clique(view.network, g.Fabric))
	}
	if len(c.Devices) == 0 {
		return nil, fmt.Errorf("no device of driver %s on node %s is allocated to this claim", topology.DriverName, s.node)
	}

	// A share's limits go to its containers; real GPUs get MPS limits.
	shares, err := shareEnv(c.Devices, view.devices, view.devRoot != "")
	if err != nil {
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

	spec := cdi.ClaimSpec{ClaimUID: uid, Devices: edits, Env: placementEnv(s.node, domains, cliques, view.network)}
	maps.Copy(spec.Env, shares)
	if view.devRoot != "" {
		for _, n := range []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"} {
			spec.CommonDeviceNodes = append(spec.CommonDeviceNodes, filepath.Join(view.devRoot, n))
		}
	}
	ids, err := s.cdi.WriteClaimSpec(spec)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("write CDI spec: %w", err), s.forgetLocked(uid))
	}

	// Phase two: the spec is in place.
	next = s.cp.Clone()
	for i := range c.Devices {
		c.Devices[i].CDIDeviceIDs = ids[c.Devices[i].Device]
	}
	c.State = checkpoint.PrepareCompleted
	next.Claims[uid] = c
	if err := s.store.Save(next); err != nil {
		return nil, errors.Join(fmt.Errorf("record preparation end: %w", err), s.cdi.RemoveClaimSpec(uid), s.forgetLocked(uid))
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

func (s *state) unprepare(ctx context.Context, uid types.UID) error {
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

// placementEnv tells the application where its GPUs sit.
func placementEnv(node string, domains, cliques []string, net topology.NetworkPlacement) map[string]string {
	env := map[string]string{topology.EnvNode: node}
	set := func(k, v string) {
		if v != "" {
			env[k] = v
		}
	}
	set(topology.EnvNVLinkDomain, strings.Join(domains, ","))
	set(topology.EnvNVLinkClique, strings.Join(cliques, ","))
	set(topology.EnvLeaf, net.Leaf)
	set(topology.EnvSpine, net.Spine)
	return env
}

func appendUnique(list []string, v string) []string {
	if v == "" || slices.Contains(list, v) {
		return list
	}
	return append(list, v)
}
