package nvml

import (
	"context"
	"fmt"
	"math"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/gpu"
)

// healthEventMask selects the events that mean a GPU needs attention. Single-
// bit ECC errors are corrected by hardware and would only add noise.
const healthEventMask = uint64(gonvml.EventTypeXidCriticalError | gonvml.EventTypeDoubleBitEccError)

// ignoredXids are raised by faulty applications, not faulty GPUs, and are
// skipped by default by NVIDIA's k8s-device-plugin as well: 13 graphics engine
// exception, 31 GPU memory page fault, 43 GPU stopped processing, 45
// preemptive cleanup, 68 video processor exception, 109 context switch
// timeout. Taking a GPU out of service for them would let one bad job drain a
// node.
var ignoredXids = map[uint64]bool{13: true, 31: true, 43: true, 45: true, 68: true, 109: true}

// WatchHealth implements gpu.Backend. It reports Xid critical errors and
// double-bit ECC errors as unhealthy; NVML offers no "recovered" event (a GPU
// reset is needed), so it never reports Healthy: true.
func (b *Backend) WatchHealth(ctx context.Context, events chan<- gpu.HealthEvent) error {
	logger := klog.FromContext(ctx)
	set, ret := b.lib.EventSetCreate()
	if err := check(ret); err != nil {
		if unsupported(err) {
			logger.Info("NVML events are not supported, GPU health is not watched", "err", err)
			<-ctx.Done()
			return nil
		}
		return fmt.Errorf("create NVML event set: %w", err)
	}
	defer func() {
		if err := check(set.Free()); err != nil {
			logger.Error(err, "Failed to free NVML event set")
		}
	}()

	uuids, registered, err := b.register(ctx, set)
	if err != nil {
		return err
	}
	if registered == 0 {
		logger.Info("No GPU supports health events, GPU health is not watched")
		<-ctx.Done()
		return nil
	}

	timeoutMs := uint32(max(1, min(b.waitTimeout.Milliseconds(), math.MaxUint32)))
	failing := false
	for ctx.Err() == nil {
		data, ret := set.Wait(timeoutMs)
		if ret == gonvml.ERROR_TIMEOUT {
			failing = false
			continue
		}
		if ret != gonvml.SUCCESS {
			// A failing wait means events can no longer be seen, so no GPU
			// can be vouched for. Report once per failure streak and back
			// off, so a persistent error neither floods nor spins.
			if !failing {
				logger.Error(ret, "Failed to wait for NVML events, marking all GPUs unhealthy")
				reason := "NVML-EVENT-ERROR"
				if ret == gonvml.ERROR_GPU_IS_LOST {
					reason = "GPU-LOST"
				}
				msg := fmt.Sprintf("waiting for NVML events failed: %v", ret)
				for _, u := range uuids {
					if !send(ctx, events, gpu.HealthEvent{UUID: u, Reason: reason, Message: msg}) {
						return nil
					}
				}
			}
			failing = true
			select {
			case <-ctx.Done():
			case <-time.After(b.waitTimeout):
			}
			continue
		}
		failing = false

		ev, ok := toHealthEvent(data)
		if !ok {
			logger.V(4).Info("Ignoring NVML event", "type", data.EventType, "data", data.EventData)
			continue
		}
		targets := uuids
		if data.Device != nil {
			if u, ret := data.Device.GetUUID(); ret == gonvml.SUCCESS {
				targets = []string{u}
			} else {
				logger.Error(ret, "Failed to identify the GPU of an NVML event, marking all GPUs unhealthy", "reason", ev.Reason)
			}
		}
		for _, u := range targets {
			ev.UUID = u
			logger.Info("GPU unhealthy", "uuid", u, "reason", ev.Reason)
			if !send(ctx, events, ev) {
				return nil
			}
		}
	}
	return nil
}

// register subscribes every GPU that supports it to the health events and
// returns the UUIDs of all GPUs, plus how many were subscribed.
func (b *Backend) register(ctx context.Context, set gonvml.EventSet) ([]string, int, error) {
	logger := klog.FromContext(ctx)
	count, ret := b.lib.DeviceGetCount()
	if err := check(ret); err != nil {
		return nil, 0, fmt.Errorf("count GPUs: %w", err)
	}
	var uuids []string
	registered := 0
	for i := range count {
		h, ret := b.lib.DeviceGetHandleByIndex(i)
		if err := check(ret); err != nil {
			return nil, 0, fmt.Errorf("get handle of GPU %d: %w", i, err)
		}
		u, ret := h.GetUUID()
		if err := check(ret); err != nil {
			return nil, 0, fmt.Errorf("get UUID of GPU %d: %w", i, err)
		}
		uuids = append(uuids, u)
		supported, ret := h.GetSupportedEventTypes()
		if err := check(ret); err != nil {
			if unsupported(err) {
				logger.Info("GPU does not support NVML events", "index", i, "uuid", u)
				continue
			}
			return nil, 0, fmt.Errorf("get supported event types of GPU %d: %w", i, err)
		}
		mask := healthEventMask & supported
		if mask == 0 {
			continue
		}
		if err := check(h.RegisterEvents(mask, set)); err != nil {
			if unsupported(err) {
				logger.Info("GPU does not support NVML health events", "index", i, "uuid", u)
				continue
			}
			return nil, 0, fmt.Errorf("register health events of GPU %d: %w", i, err)
		}
		registered++
	}
	return uuids, registered, nil
}

// toHealthEvent maps an NVML event to an unhealthy event without UUID; ok is
// false for events that say nothing about the GPU's health.
func toHealthEvent(data gonvml.EventData) (gpu.HealthEvent, bool) {
	switch data.EventType {
	case gonvml.EventTypeXidCriticalError:
		if ignoredXids[data.EventData] {
			return gpu.HealthEvent{}, false
		}
		return gpu.HealthEvent{
			Reason:  fmt.Sprintf("XID-%d", data.EventData),
			Message: fmt.Sprintf("critical Xid error %d", data.EventData),
		}, true
	case gonvml.EventTypeDoubleBitEccError:
		return gpu.HealthEvent{Reason: "ECC-DBE", Message: "uncorrectable double-bit ECC error"}, true
	default:
		return gpu.HealthEvent{}, false
	}
}

// send delivers ev unless ctx is done first.
func send(ctx context.Context, events chan<- gpu.HealthEvent, ev gpu.HealthEvent) bool {
	select {
	case events <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}
