// Package kubeletplugin is gputopo's node agent: it publishes the node's
// GPUs with their topology as ResourceSlices, keeps them current when the
// node's labels or the GPUs' health change, and prepares allocated GPUs for
// containers through CDI.
package kubeletplugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
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
	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/labelmapping"
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
	// fabric registration is in progress; 0 means DefaultFabricRetry.
	FabricRetry time.Duration
	Metrics     *Metrics
	// LabelMapping, when set, replaces Slices.Network whenever the
	// cluster's label mapping changes.
	LabelMapping *labelmapping.Watcher
	// HealthProbeAddress serves the gRPC health probes (ProbeLiveness,
	// ProbeStartup); empty serves none.
	HealthProbeAddress string
}

// DefaultFabricRetry is how often discovery is repeated while GPUs are
// still registering with the NVLink fabric.
const DefaultFabricRetry = 15 * time.Second

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

	mu        sync.Mutex
	labels    map[string]string
	unhealthy map[string]gpu.HealthEvent
	pub       publisher
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
	logger := klog.FromContext(ctx)
	skipped := map[string]int{}
	for _, sk := range inv.Skipped {
		skipped[sk.Reason]++
		logger.Info("GPU not published", "index", sk.Index, "uuid", sk.UUID, "reason", sk.Reason, "detail", sk.Message)
	}
	cfg.Metrics.SkippedDevices.Reset()
	for reason, n := range skipped {
		cfg.Metrics.SkippedDevices.WithLabelValues(reason).Set(float64(n))
	}
	logger.Info("Discovered GPUs", "backend", cfg.Backend.Name(), "gpus", len(inv.Devices), "skipped", len(inv.Skipped),
		"nvlinkDomains", len(nv.Domains), "preparedClaims", len(st.prepared()))
	return &Driver{
		cfg: cfg, inv: inv, nvlink: nv, state: st, cancel: cancel,
		labels: maps.Clone(labels), unhealthy: map[string]gpu.HealthEvent{},
		healthChanged: make(chan struct{}),
	}, nil
}

// Resources builds what the node publishes now.
func (d *Driver) Resources() (resourceslice.DriverResources, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.resourcesLocked()
}

func (d *Driver) resourcesLocked() (resourceslice.DriverResources, error) {
	return slices.Build(d.inv, slices.Node{Name: d.cfg.NodeName, Labels: d.labels}, d.cfg.Slices, d.unhealthy)
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
	d.cfg.Metrics.PublishedDevices.Set(float64(len(d.inv.Devices)))
	d.cfg.Metrics.UnhealthyDevices.Set(float64(len(d.unhealthy)))
	klog.FromContext(ctx).V(2).Info("Published ResourceSlices", "devices", len(d.inv.Devices), "unhealthy", len(d.unhealthy))
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
	_, was := d.unhealthy[ev.UUID]
	if ev.Healthy {
		if !was {
			return nil
		}
		delete(d.unhealthy, ev.UUID)
	} else {
		d.unhealthy[ev.UUID] = ev
	}
	klog.FromContext(ctx).Info("GPU health changed", "uuid", ev.UUID, "healthy", ev.Healthy, "reason", ev.Reason)
	close(d.healthChanged)
	d.healthChanged = make(chan struct{})
	return d.publishLocked(ctx)
}

// watchHealth feeds backend health events into the driver until ctx ends.
func (d *Driver) watchHealth(ctx context.Context) {
	events := make(chan gpu.HealthEvent)
	go func() {
		if err := d.cfg.Backend.WatchHealth(ctx, events); err != nil {
			utilruntime.HandleErrorWithContext(ctx, err, "GPU health watch stopped")
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-events:
			if err := d.applyHealth(ctx, ev); err != nil {
				utilruntime.HandleErrorWithContext(ctx, err, "Republishing after a health change failed")
			}
		}
	}
}

// view snapshots what prepare needs.
func (d *Driver) view() *nodeView {
	d.mu.Lock()
	defer d.mu.Unlock()
	v := &nodeView{
		devices:   map[string]gpu.Device{},
		nvlink:    map[string]topology.GPUPlacement{},
		network:   d.cfg.Slices.Network.Resolve(d.labels),
		unhealthy: maps.Clone(d.unhealthy),
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
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = d.state.unprepare(ctx, c.UID)
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
