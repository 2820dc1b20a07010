package kubeletplugin

import (
	"cmp"
	"context"
	"errors"
	"math"
	"time"

	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/slices"
	"github.com/gputopo/gputopo/pkg/topology"
)

// maxHealthRetry caps the delay between attempts to start a failed health
// watch.
const maxHealthRetry = 5 * time.Minute

// watchHealth feeds backend health events into the driver until ctx ends.
func (d *Driver) watchHealth(ctx context.Context) {
	events := make(chan gpu.HealthEvent)
	go d.runHealthWatch(ctx, events)
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

// runHealthWatch runs the backend's health watch, and starts it again
// whenever it ends, sooner after it had worked, later after each failure in
// a row. Meanwhile every GPU is tainted unmonitored.
func (d *Driver) runHealthWatch(ctx context.Context, events chan<- gpu.HealthEvent) {
	logger := klog.FromContext(ctx)
	backoff := d.healthBackoff()
	for {
		watchCtx, restart := context.WithCancel(ctx)
		d.setWatchRestart(restart)
		err := d.cfg.Backend.WatchHealth(watchCtx, events)
		restarted := watchCtx.Err() != nil
		restart()
		if ctx.Err() != nil {
			return
		}
		if restarted {
			// The GPUs changed (restartWatch): watch the new set.
			logger.V(2).Info("GPU health watch started again for the changed GPUs")
			continue
		}
		if err == nil {
			err = errors.New("the GPU health watch ended")
		}
		if d.takeWatchWorked() {
			backoff = d.healthBackoff()
		}
		delay := backoff.Step()
		logger.Error(err, "GPU health watch failed; starting it again", "retryIn", delay)
		select {
		case events <- gpu.HealthEvent{Watch: gpu.WatchFailing, Message: err.Error()}:
		case <-ctx.Done():
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}

func (d *Driver) setWatchRestart(restart context.CancelFunc) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.watchRestart = restart
}

// restartWatchLocked starts the health watch again, on the GPUs as they
// are now: a GPU switched in or out of MIG mode was reset, and what the
// watch registered for it is stale.
func (d *Driver) restartWatchLocked() {
	if d.watchRestart != nil {
		d.watchRestart()
	}
}

func (d *Driver) healthBackoff() wait.Backoff {
	return wait.Backoff{Duration: cmp.Or(d.cfg.HealthRetry, DefaultHealthRetry), Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: maxHealthRetry}
}

// takeWatchWorked reports whether the watch said it was active since the
// last call.
func (d *Driver) takeWatchWorked() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	worked := d.watchWorked
	d.watchWorked = false
	return worked
}

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
	unhealthy := d.unhealthyLocked()
	for _, g := range d.inv.Devices {
		h := kubeletplugin.DeviceHealth{
			PoolName:           d.cfg.NodeName,
			DeviceName:         slices.DeviceName(g.Index),
			Health:             kubeletplugin.HealthStatusHealthy,
			LastUpdated:        now,
			HealthCheckTimeout: 3 * healthRefresh,
		}
		if ev, bad := unhealthy[g.UUID]; bad {
			h.Health = kubeletplugin.HealthStatusUnhealthy
			h.Message = ev.Reason
			if ev.Message != "" {
				h.Message += ": " + ev.Message
			}
		} else if d.unmonitored != "" {
			h.Health = kubeletplugin.HealthStatusUnknown
			h.Message = topology.TaintUnmonitored + ": " + d.unmonitored
		}
		r.Devices = append(r.Devices, h)
	}
	return r, d.healthChanged
}
