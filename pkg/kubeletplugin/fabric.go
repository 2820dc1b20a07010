package kubeletplugin

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/gpu"
)

// refreshFabric repeats discovery while a GPU is still registering with
// the multi-node NVLink fabric (GB200 NVL72 trays come up before the fabric
// manager has placed them), and republishes once its clique is known.
func (d *Driver) refreshFabric(ctx context.Context) {
	every := cmp.Or(d.cfg.FabricRetry, DefaultFabricRetry)
	for d.fabricPending() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		fresh, err := d.cfg.Backend.Discover(ctx)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Repeating discovery for NVLink fabric registration failed; retrying")
			continue
		}
		if err := d.applyFabric(ctx, fresh); err != nil {
			d.HandleError(ctx, fmt.Errorf("%w: %w", kubeletplugin.ErrRecoverable, err), "republish after NVLink fabric registration")
		}
	}
}

func (d *Driver) fabricPending() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.ContainsFunc(d.inv.Devices, func(g gpu.Device) bool { return g.FabricPending })
}

// applyFabric takes the fabric state of still-pending GPUs from a fresh
// discovery; nothing else changes while the plugin runs.
func (d *Driver) applyFabric(ctx context.Context, fresh *gpu.Inventory) error {
	byUUID := map[string]gpu.Device{}
	for _, g := range fresh.Devices {
		byUUID[g.UUID] = g
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	devs := slices.Clone(d.inv.Devices)
	changed := false
	for i, g := range devs {
		f, ok := byUUID[g.UUID]
		if !g.FabricPending || !ok || f.FabricPending {
			continue
		}
		devs[i].Fabric, devs[i].FabricPending = f.Fabric, false
		changed = true
		klog.FromContext(ctx).Info("GPU registered with the NVLink fabric", "index", g.Index, "uuid", g.UUID, "fabric", f.Fabric)
	}
	if !changed {
		return nil
	}
	inv := *d.inv
	inv.Devices = devs
	d.inv = &inv
	return d.publishLocked(ctx)
}
