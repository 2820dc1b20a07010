// Package kubeletplugin is gputopo's node agent: it publishes the node's
// GPUs with their topology as ResourceSlices, keeps them current when the
// node's labels or the GPUs' health change, and prepares allocated GPUs for
// containers through CDI.
package kubeletplugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/cdi"
	"github.com/gputopo/gputopo/pkg/checkpoint"
	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/labelmapping"
	"github.com/gputopo/gputopo/pkg/mps"
	"github.com/gputopo/gputopo/pkg/slices"
	"github.com/gputopo/gputopo/pkg/topology"
)

// Config is what the plugin needs to run on one node.
type Config struct {
	NodeName   string
	KubeClient kubernetes.Interface
	Backend    gpu.Backend
	Slices     slices.Config
	// CDIRoot is where CDI specs are written (/var/run/cdi).
	CDIRoot string
	// RegistrarDir is the kubelet's plugin registry
	// (/var/lib/kubelet/plugins_registry).
	RegistrarDir string
	// PluginDir holds the plugin's socket and checkpoint
	// (/var/lib/kubelet/plugins/gpu.gputopo.dev).
	PluginDir string
	// DriverEdits inject the NVIDIA driver into containers with real GPUs;
	// nil for simulated GPUs.
	DriverEdits cdi.DriverEdits
	// BootID identifies the host's current boot (ReadBootID); a checkpoint
	// from another boot is discarded. Empty: unknown, keep the checkpoint.
	BootID string
	// FabricRetry is how often discovery is repeated while a GPU's NVLink
	// fabric registration is in progress or failed; 0 means
	// DefaultFabricRetry.
	FabricRetry time.Duration
	// RefreshInterval is how often discovery is repeated and the driver
	// edits regenerated otherwise, to follow MIG mode changes and driver
	// upgrades; 0 means DefaultRefreshInterval.
	RefreshInterval time.Duration
	// HealthRetry is the first delay before a failed health watch is
	// started again, doubling up to five minutes; 0 means
	// DefaultHealthRetry.
	HealthRetry time.Duration
	Metrics     *Metrics
	// LabelMapping, when set, replaces Slices.Network whenever the
	// cluster's label mapping changes.
	LabelMapping *labelmapping.Watcher
	// MPS runs an MPS control daemon for each GPU that prepared claims
	// hold shares of, with its pipe directory mounted into their
	// containers; nil leaves shares advisory (environment variables only).
	MPS *mps.Manager
	// HealthProbeAddress serves the gRPC health probes (ProbeLiveness,
	// ProbeStartup); empty serves none.
	HealthProbeAddress string
}

// DefaultFabricRetry is how often discovery is repeated while GPUs are
// still registering with the NVLink fabric.
const DefaultFabricRetry = 15 * time.Second

// DefaultRefreshInterval is how often discovery is repeated and the driver
// edits regenerated.
const DefaultRefreshInterval = time.Minute

// DefaultHealthRetry is the first delay before a failed health watch is
// started again.
const DefaultHealthRetry = time.Second

// healthFile records the GPU errors that outlive a plugin restart, in the
// plugin directory.
const healthFile = "health.json"

// publisher is the slice of kubeletplugin.Helper the driver uses, so
// tests can watch what would be published.
type publisher interface {
	PublishResources(ctx context.Context, resources resourceslice.DriverResources) error
}

// Driver implements kubeletplugin.DRAPlugin.
type Driver struct {
	cfg    Config
	inv    *gpu.Inventory
	nvlink *topology.NodeNVLink
	state  *state
	cancel context.CancelCauseFunc

	mu     sync.Mutex
	labels map[string]string
	// unhealthy holds what the health watch reported, by GPU UUID; the
	// events with Persist are also in health.
	unhealthy map[string]gpu.HealthEvent
	health    *checkpoint.HealthStore
	// unmonitored says why the GPUs' health cannot be watched now; empty
	// while it is.
	unmonitored string
	// watchWorked is set when the watch reports itself active, so the
	// next failure starts its retries from the shortest delay again.
	watchWorked bool
	// watchRestart ends the running health watch, which then starts again.
	watchRestart context.CancelFunc
	pub          publisher
	// healthChanged is closed and replaced whenever a GPU's health changes,
	// waking every kubelet health stream.
	healthChanged chan struct{}
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// New discovers the GPUs and loads the checkpoint, rolling back any
// preparation a crash interrupted. labels are the node's current labels.
func New(ctx context.Context, cfg Config, labels map[string]string, cancel context.CancelCauseFunc) (*Driver, error) {
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	inv, err := cfg.Backend.Discover(ctx)
	if err != nil {
		return nil, fmt.Errorf("discover GPUs with the %s backend: %w", cfg.Backend.Name(), err)
	}
	nv, err := topology.AnalyzeNVLink(cfg.NodeName, inv)
	if err != nil {
		return nil, err
	}
	st, err := newState(ctx, cfg.NodeName, cfg.PluginDir, cfg.CDIRoot, cfg.BootID, cfg.Metrics)
	if err != nil {
		return nil, err
	}
	if cfg.DriverEdits != nil {
		common, err := cfg.DriverEdits.Common()
		if err != nil {
			return nil, fmt.Errorf("find the NVIDIA driver files to give containers (is the driver root right?): %w", err)
		}
		st.driver, st.common = cfg.DriverEdits, common
	}
	st.mps = cfg.MPS
	logger := klog.FromContext(ctx)
	d := &Driver{
		cfg: cfg, inv: inv, nvlink: nv, state: st, cancel: cancel,
		labels: maps.Clone(labels), healthChanged: make(chan struct{}),
	}
	d.setSkippedMetrics(ctx)
	logger.Info("Discovered GPUs", "backend", cfg.Backend.Name(), "gpus", len(inv.Devices), "skipped", len(inv.Skipped),
		"nvlinkDomains", len(nv.Domains), "preparedClaims", len(st.prepared()))
	d.health = checkpoint.NewHealthStore(filepath.Join(cfg.PluginDir, healthFile))
	d.unhealthy = recordedErrors(ctx, d.health, cfg.BootID)
	if st.mps != nil {
		// Daemons as the prepared shares need them: after a restart, those
		// that died with the plugin's container start again, and those of
		// shares unprepared meanwhile stop. A failure here is retried by
		// the next prepare or unprepare.
		view := d.view()
		st.mu.Lock()
		err := st.syncMPSLocked(ctx, view)
		st.mu.Unlock()
		if err != nil {
			logger.Error(err, "Starting the MPS control daemons of prepared shares failed")
		}
	}
	return d, nil
}

// setSkippedMetrics logs the GPUs discovery left out and counts them by
// reason.
func (d *Driver) setSkippedMetrics(ctx context.Context) {
	skipped := map[string]int{}
	for _, sk := range d.inv.Skipped {
		skipped[sk.Reason]++
		klog.FromContext(ctx).Info("GPU not published", "index", sk.Index, "uuid", sk.UUID, "reason", sk.Reason, "detail", sk.Message)
	}
	d.cfg.Metrics.SkippedDevices.Reset()
	for reason, n := range skipped {
		d.cfg.Metrics.SkippedDevices.WithLabelValues(reason).Set(float64(n))
	}
}

// recordedErrors are the GPU errors a previous run of the plugin recorded
// in this boot: NVML does not report them again.
func recordedErrors(ctx context.Context, store *checkpoint.HealthStore, bootID string) map[string]gpu.HealthEvent {
	logger := klog.FromContext(ctx)
	out := map[string]gpu.HealthEvent{}
	rec, err := store.Load()
	switch {
	case err != nil:
		logger.Error(err, "GPU errors recorded before this start cannot be read and are forgotten; GPUs that had Xid or ECC errors are published healthy until they report again", "path", store.Path())
		return out
	case bootID != "" && rec.BootID != "" && rec.BootID != bootID:
		if len(rec.GPUs) > 0 {
			logger.Info("Node rebooted since GPU errors were recorded; the reset GPUs are healthy again", "gpus", len(rec.GPUs))
		}
		return out
	}
	for uuid, c := range rec.GPUs {
		out[uuid] = gpu.HealthEvent{UUID: uuid, Reason: c.Reason, Message: c.Message, Persist: true}
		logger.Info("GPU error recorded before this start: the GPU stays unhealthy until the node reboots (or "+healthFile+" is removed and the plugin restarted)", "uuid", uuid, "reason", c.Reason)
	}
	return out
}

// Resources builds what the node publishes now.
func (d *Driver) Resources() (resourceslice.DriverResources, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.resourcesLocked()
}

func (d *Driver) resourcesLocked() (resourceslice.DriverResources, error) {
	res, err := slices.Build(d.inv, slices.Node{Name: d.cfg.NodeName, Labels: d.labels}, d.cfg.Slices, d.unhealthyLocked())
	if err != nil || d.unmonitored == "" {
		return res, err
	}
	// Unwatched GPUs may be failing unseen: no new claims for them, but
	// running pods stay.
	for _, pool := range res.Pools {
		for i := range pool.Slices {
			for j := range pool.Slices[i].Devices {
				dev := &pool.Slices[i].Devices[j]
				dev.Taints = append(dev.Taints, resourceapi.DeviceTaint{
					Key: topology.TaintUnmonitored, Value: UnmonitoredWatchFailing, Effect: resourceapi.DeviceTaintEffectNoSchedule,
				})
			}
		}
	}
	return res, nil
}

// UnmonitoredWatchFailing is the unmonitored taint's value.
const UnmonitoredWatchFailing = "HEALTH-WATCH-FAILING"

// unhealthyLocked is every GPU that must not be used, by UUID: what the
// health watch reported, and GPUs whose NVLink fabric makes CUDA fail.
func (d *Driver) unhealthyLocked() map[string]gpu.HealthEvent {
	out := maps.Clone(d.unhealthy)
	for _, g := range d.inv.Devices {
		if _, bad := out[g.UUID]; bad || g.FabricUnready == nil {
			continue
		}
		out[g.UUID] = gpu.HealthEvent{UUID: g.UUID, Reason: g.FabricUnready.Reason, Message: g.FabricUnready.Message}
	}
	return out
}

// setPublisher starts publishing through pub.
func (d *Driver) setPublisher(ctx context.Context, pub publisher) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.pub = pub
	return d.publishLocked(ctx)
}

func (d *Driver) publishLocked(ctx context.Context) error {
	if d.pub == nil {
		return nil
	}
	res, err := d.resourcesLocked()
	if err != nil {
		return fmt.Errorf("build ResourceSlices: %w", err)
	}
	if err := d.pub.PublishResources(ctx, res); err != nil {
		return fmt.Errorf("publish ResourceSlices: %w", err)
	}
	unhealthy := d.unhealthyLocked()
	d.cfg.Metrics.PublishedDevices.Set(float64(len(d.inv.Devices)))
	d.cfg.Metrics.UnhealthyDevices.Set(float64(len(unhealthy)))
	klog.FromContext(ctx).V(2).Info("Published ResourceSlices", "devices", len(d.inv.Devices), "unhealthy", len(unhealthy), "unmonitored", d.unmonitored != "")
	return nil
}

// SetLabels records the node's labels and republishes when they move the
// node in the network tree or change which GPUs are shared.
func (d *Driver) SetLabels(ctx context.Context, labels map[string]string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.moveLocked(ctx, labels, d.cfg.Slices.Network)
}

// SetLabelMapping reads the node's labels with a new mapping and
// republishes when that moves the node in the network tree.
func (d *Driver) SetLabelMapping(ctx context.Context, m topology.LabelMapping) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.moveLocked(ctx, d.labels, m)
}

func (d *Driver) moveLocked(ctx context.Context, labels map[string]string, m topology.LabelMapping) error {
	before, after := d.cfg.Slices.Network.Resolve(d.labels), m.Resolve(labels)
	sharingBefore := d.labels[topology.LabelSharedGPUs]
	d.labels, d.cfg.Slices.Network = maps.Clone(labels), m
	if sharingBefore != labels[topology.LabelSharedGPUs] {
		klog.FromContext(ctx).Info("Node label changed which GPUs are shared; republishing", "label", topology.LabelSharedGPUs, "value", labels[topology.LabelSharedGPUs])
		return d.publishLocked(ctx)
	}
	if before.Equal(after) {
		return nil
	}
	klog.FromContext(ctx).Info("Node moved in the network tree; republishing", "leaf", after.Leaf, "spine", after.Spine, "core", after.Core)
	return d.publishLocked(ctx)
}

// applyHealth records a health change, republishes with the device taint
// and wakes the kubelet's health streams.
func (d *Driver) applyHealth(ctx context.Context, ev gpu.HealthEvent) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	logger := klog.FromContext(ctx)
	if ev.Watch != "" {
		return d.applyWatchLocked(ctx, ev)
	}
	prev, was := d.unhealthy[ev.UUID]
	switch {
	case ev.Healthy && !was:
		return nil
	case was && prev.Persist && !ev.Persist:
		// A lost GPU that answers again still has the Xid it had.
		logger.V(2).Info("GPU keeps its recorded error", "uuid", ev.UUID, "reason", prev.Reason, "event", ev.Reason)
		return nil
	case ev.Healthy:
		delete(d.unhealthy, ev.UUID)
	default:
		d.unhealthy[ev.UUID] = ev
	}
	logger.Info("GPU health changed", "uuid", ev.UUID, "healthy", ev.Healthy, "reason", ev.Reason)
	if ev.Persist {
		d.recordLocked(ctx)
	}
	d.healthChangedLocked()
	return d.publishLocked(ctx)
}

// recordLocked writes the errors that outlive a restart.
func (d *Driver) recordLocked(ctx context.Context) {
	rec := map[string]checkpoint.GPUCondition{}
	for uuid, ev := range d.unhealthy {
		if ev.Persist {
			rec[uuid] = checkpoint.GPUCondition{Reason: ev.Reason, Message: ev.Message}
		}
	}
	if err := d.health.Save(d.cfg.BootID, rec); err != nil {
		klog.FromContext(ctx).Error(err, "Recording GPU errors failed: after a plugin restart these GPUs would be published healthy")
	}
}

// applyWatchLocked taints every GPU while their health cannot be watched.
func (d *Driver) applyWatchLocked(ctx context.Context, ev gpu.HealthEvent) error {
	logger := klog.FromContext(ctx)
	switch ev.Watch {
	case gpu.WatchActive:
		d.watchWorked = true
		if d.unmonitored == "" {
			return nil
		}
		d.unmonitored = ""
		logger.Info("GPU health is watched again; unmonitored taint removed", "taint", topology.TaintUnmonitored)
	case gpu.WatchFailing:
		why := cmp.Or(ev.Message, "the GPU health watch is failing")
		if d.unmonitored == why {
			return nil
		}
		d.unmonitored = why
		logger.Error(errors.New(why), "GPU health cannot be watched; GPUs tainted until it can", "taint", topology.TaintUnmonitored)
	default:
		return fmt.Errorf("unknown health watch state %q", ev.Watch)
	}
	d.healthChangedLocked()
	return d.publishLocked(ctx)
}

// healthChangedLocked wakes every kubelet health stream.
func (d *Driver) healthChangedLocked() {
	close(d.healthChanged)
	d.healthChanged = make(chan struct{})
}

// view snapshots what prepare needs.
func (d *Driver) view() *nodeView {
	d.mu.Lock()
	defer d.mu.Unlock()
	v := &nodeView{
		devices:   map[string]gpu.Device{},
		nvlink:    map[string]topology.GPUPlacement{},
		network:   d.cfg.Slices.Network.Resolve(d.labels),
		unhealthy: d.unhealthyLocked(),
	}
	for i, g := range d.inv.Devices {
		name := slices.DeviceName(g.Index)
		v.devices[name] = g
		v.nvlink[name] = d.nvlink.GPUs[i]
	}
	return v
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin. A failure of
// one claim never fails the others.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	view := d.view()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		out[c.UID] = d.state.prepare(ctx, c, view)
	}
	return out, nil
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	view := d.view()
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = d.state.unprepare(ctx, c.UID, view)
	}
	return out, nil
}

// HandleError implements kubeletplugin.DRAPlugin: recoverable errors are
// logged, anything else stops the plugin so it restarts cleanly.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	utilruntime.HandleErrorWithContext(ctx, err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) && d.cancel != nil {
		d.cancel(fmt.Errorf("fatal background error: %s: %w", msg, err))
	}
}
