package kubeletplugin

import (
	"context"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gputopo/gputopo/pkg/slices"
)

// healthRefresh re-sends the full report well inside the kubelet's 30 s
// staleness window.
const healthRefresh = 10 * time.Second

// WatchHealthStatus implements kubeletplugin.DRAPlugin.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	ticker := time.NewTicker(healthRefresh)
	defer ticker.Stop()
	for {
		report, changed := d.healthReport()
		select {
		case <-ctx.Done():
			return nil
		case reports <- report:
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		case <-changed:
		}
	}
}

// healthReport covers every GPU, and returns the channel closed on the
// next change.
func (d *Driver) healthReport() (kubeletplugin.DeviceHealthReport, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	var r kubeletplugin.DeviceHealthReport
	for _, g := range d.inv.Devices {
		h := kubeletplugin.DeviceHealth{
			PoolName:           d.cfg.NodeName,
			DeviceName:         slices.DeviceName(g.Index),
			Health:             kubeletplugin.HealthStatusHealthy,
			LastUpdated:        now,
			HealthCheckTimeout: 3 * healthRefresh,
		}
		if ev, bad := d.unhealthy[g.UUID]; bad {
			h.Health = kubeletplugin.HealthStatusUnhealthy
			h.Message = ev.Reason
			if ev.Message != "" {
				h.Message += ": " + ev.Message
			}
		}
		r.Devices = append(r.Devices, h)
	}
	return r, d.healthChanged
}
