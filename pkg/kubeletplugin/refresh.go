package kubeletplugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/gpu/nvml"
	"github.com/gputopo/gputopo/pkg/topology"
)

// refreshLoop repeats discovery and regenerates the driver edits, often
// while a GPU's NVLink fabric registration is pending or failed (GB200
// NVL72 trays come up before the fabric manager has placed them), else
// every RefreshInterval, until ctx ends.
func (d *Driver) refreshLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(d.refreshEvery()):
		}
		if err := d.refresh(ctx); err != nil {
			d.HandleError(ctx, err, "refresh the GPU inventory and driver files")
		}
	}
}

func (d *Driver) refreshEvery() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	if slices.ContainsFunc(d.inv.Devices, func(g gpu.Device) bool { return g.FabricPending || g.FabricUnready != nil }) {
		return cmp.Or(d.cfg.FabricRetry, DefaultFabricRetry)
	}
	return cmp.Or(d.cfg.RefreshInterval, DefaultRefreshInterval)
}

// refresh discovers the GPUs again and takes what changed, then brings the
// driver edits and the prepared claims' specs up to date. A driver that
// was unloaded or replaced under the plugin is fatal: the plugin restarts
// and loads the new driver's NVML.
func (d *Driver) refresh(ctx context.Context) error {
	fresh, err := d.cfg.Backend.Discover(ctx)
	switch {
	case errors.Is(err, gpu.ErrDriverReloaded):
		return fmt.Errorf("repeat GPU discovery: %w", err)
	case err != nil:
		return fmt.Errorf("%w: repeat GPU discovery: %w", kubeletplugin.ErrRecoverable, err)
	}
	if err := d.applyInventory(ctx, fresh); err != nil {
		return fmt.Errorf("%w: %w", kubeletplugin.ErrRecoverable, err)
	}
	if err := d.state.syncDriver(ctx, d.view()); err != nil {
		return fmt.Errorf("%w: %w", kubeletplugin.ErrRecoverable, err)
	}
	return nil
}

// applyInventory takes a fresh discovery and republishes when it changes
// what the node publishes: a GPU's fabric registration, its MIG mode (a
// GPU in MIG mode is withdrawn, one out of it published again), a driver
// upgrade's versions, NVLink. A GPU discovery merely misses (lost,
// failing queries) stays as it was published: its health says the rest.
func (d *Driver) applyInventory(ctx context.Context, fresh *gpu.Inventory) error {
	logger := klog.FromContext(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	old := d.inv
	freshBy := map[string]gpu.Device{}
	for _, g := range fresh.Devices {
		freshBy[g.UUID] = g
	}
	inMIG := map[string]bool{}
	for _, sk := range fresh.Skipped {
		if sk.Reason == nvml.SkipMIGEnabled {
			inMIG[sk.UUID] = true
		}
	}
	next := *fresh
	next.Devices = nil
	kept := false
	for _, g := range old.Devices {
		switch f, ok := freshBy[g.UUID]; {
		case ok:
			next.Devices = append(next.Devices, f)
			delete(freshBy, g.UUID)
		case inMIG[g.UUID]:
			logger.Info("GPU switched to MIG mode; no longer published", "index", g.Index, "uuid", g.UUID)
		default:
			next.Devices = append(next.Devices, g)
			kept = true
		}
	}
	for _, f := range freshBy {
		logger.Info("GPU found (out of MIG mode, or new); publishing it", "index", f.Index, "uuid", f.UUID)
		next.Devices = append(next.Devices, f)
	}
	slices.SortFunc(next.Devices, func(a, b gpu.Device) int { return cmp.Compare(a.Index, b.Index) })
	if kept {
		next.Links, next.LinkBandwidthGBps = old.Links, old.LinkBandwidthGBps
	}
	next.SysFS = old.SysFS
	if reflect.DeepEqual(old, &next) {
		return nil
	}
	nv, err := topology.AnalyzeNVLink(d.cfg.NodeName, &next)
	if err != nil {
		return fmt.Errorf("analyse the NVLink graph of the fresh discovery: %w", err)
	}
	for i, g := range next.Devices {
		if i < len(old.Devices) && old.Devices[i].UUID == g.UUID && old.Devices[i].FabricPending && !g.FabricPending && g.Fabric != nil {
			logger.Info("GPU registered with the NVLink fabric", "index", g.Index, "uuid", g.UUID, "fabric", g.Fabric)
		}
	}
	if !slices.EqualFunc(old.Devices, next.Devices, func(a, b gpu.Device) bool { return a.UUID == b.UUID }) {
		d.restartWatchLocked()
	}
	d.inv, d.nvlink = &next, nv
	d.setSkippedMetrics(ctx)
	d.healthChangedLocked()
	logger.Info("GPU inventory changed; republishing", "gpus", len(next.Devices), "skipped", len(next.Skipped))
	return d.publishLocked(ctx)
}
