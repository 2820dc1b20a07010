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

// Health reasons (gpu.HealthEvent.Reason) besides "XID-<n>" and "ECC-DBE".
const (
	ReasonGPULost   = "GPU-LOST"
	ReasonRecovered = "Recovered"
)

// DefaultIgnoredXids are raised by faulty applications, not faulty GPUs,
// and are skipped by NVIDIA's k8s-device-plugin and DRA driver as well: 13
// graphics engine exception, 31 GPU memory page fault, 43 GPU stopped
// processing, 45 preemptive cleanup, 68 video processor exception, 109
// context switch timeout. Taking a GPU out of service for them would let one
// bad job drain a node.
func DefaultIgnoredXids() []uint64 { return []uint64{13, 31, 43, 45, 68, 109} }

// HealthConfig says which errors make a GPU unhealthy.
type HealthConfig struct {
	// IgnoredXids never make a GPU unhealthy.
	IgnoredXids []uint64
	// ProbeInterval is how often a GPU reported lost is queried again to
	// see whether it is back; 0 means DefaultProbeInterval.
	ProbeInterval time.Duration
}

// failingAfter is how many NVML event waits must fail in a row before the
// watch reports that it cannot follow the GPUs' health: one failure can be
// a blip.
const failingAfter = 3

// DefaultProbeInterval is how often lost GPUs are probed for recovery.
const DefaultProbeInterval = 30 * time.Second

// DefaultHealthConfig ignores DefaultIgnoredXids.
func DefaultHealthConfig() HealthConfig {
	return HealthConfig{IgnoredXids: DefaultIgnoredXids(), ProbeInterval: DefaultProbeInterval}
}

// watched is one GPU whose health is followed.
type watched struct {
	uuid   string
	handle gonvml.Device
}

// healthState is what WatchHealth has reported. Xid and ECC errors are
// sticky: NVML has no event for their repair (a GPU reset), so only a
// restart of the plugin clears them. A lost GPU is probed and reported
// healthy again once it answers.
type healthState struct {
	sticky map[string]bool
	lost   map[string]bool
}

// WatchHealth implements gpu.Backend. It reports Xid critical errors (but
// the ignored ones) and double-bit ECC errors as unhealthy, and GPUs NVML
// reports lost; a lost GPU that answers again is reported healthy. Any
// other failure to wait for events is logged and retried without marking
// GPUs: it says nothing about them.
func (b *Backend) WatchHealth(ctx context.Context, events chan<- gpu.HealthEvent) error {
	logger := klog.FromContext(ctx)
	set, ret := b.lib.EventSetCreate()
	if err := check(ret); err != nil {
		if unsupported(err) {
			logger.Info("NVML events are not supported, GPU health is not watched", "err", err)
			send(ctx, events, gpu.HealthEvent{Watch: gpu.WatchActive, Message: "NVML events are not supported"})
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

	gpus, registered, err := b.register(ctx, set)
	if err != nil {
		return err
	}
	if registered == 0 {
		logger.Info("No GPU supports health events, GPU health is not watched")
		send(ctx, events, gpu.HealthEvent{Watch: gpu.WatchActive, Message: "no GPU supports health events"})
		<-ctx.Done()
		return nil
	}
	if !send(ctx, events, gpu.HealthEvent{Watch: gpu.WatchActive}) {
		return nil
	}

	ignored := map[uint64]bool{}
	for _, x := range b.health.IgnoredXids {
		ignored[x] = true
	}
	probeEvery := b.health.ProbeInterval
	if probeEvery <= 0 {
		probeEvery = DefaultProbeInterval
	}
	st := healthState{sticky: map[string]bool{}, lost: map[string]bool{}}
	emit := func(ev gpu.HealthEvent) bool {
		logger.Info("GPU health changed", "uuid", ev.UUID, "healthy", ev.Healthy, "reason", ev.Reason)
		return send(ctx, events, ev)
	}

	timeoutMs := uint32(max(1, min(b.waitTimeout.Milliseconds(), math.MaxUint32)))
	// failures counts waits failed in a row; at failingAfter the watch
	// reports itself failing, and active again at the next good wait.
	failures, logged := 0, false
	lastProbe := time.Now()
	for ctx.Err() == nil {
		if len(st.lost) > 0 && time.Since(lastProbe) >= probeEvery {
			lastProbe = time.Now()
			for _, g := range gpus {
				if st.lost[g.uuid] && probe(g.handle) == nil {
					delete(st.lost, g.uuid)
					if !st.sticky[g.uuid] && !emit(gpu.HealthEvent{UUID: g.uuid, Healthy: true, Reason: ReasonRecovered, Message: "the GPU answers NVML again"}) {
						return nil
					}
				}
			}
		}

		data, ret := set.Wait(timeoutMs)
		if ret == gonvml.SUCCESS || ret == gonvml.ERROR_TIMEOUT {
			if failures >= failingAfter && !send(ctx, events, gpu.HealthEvent{Watch: gpu.WatchActive}) {
				return nil
			}
			failures, logged = 0, false
		}
		if ret == gonvml.ERROR_TIMEOUT {
			continue
		}
		if ret != gonvml.SUCCESS {
			if ret == gonvml.ERROR_GPU_IS_LOST {
				// The wait does not say which GPU; ask each.
				for _, g := range gpus {
					if st.lost[g.uuid] {
						continue
					}
					if err := probe(g.handle); err != nil {
						st.lost[g.uuid] = true
						lastProbe = time.Now()
						if !emit(gpu.HealthEvent{UUID: g.uuid, Reason: ReasonGPULost, Message: fmt.Sprintf("GPU does not answer NVML: %v", err)}) {
							return nil
						}
					}
				}
			}
			// Report once per failure streak and back off, so a persistent
			// error neither floods nor spins.
			// A lost GPU is tainted as such, and the set's waits answer
			// GPU_IS_LOST until it is back: that is no failing watch.
			if ret != gonvml.ERROR_GPU_IS_LOST {
				failures++
			}
			if !logged {
				logger.Error(ret, "Failed to wait for NVML events; retrying")
				logged = true
			}
			if failures == failingAfter && !send(ctx, events, gpu.HealthEvent{Watch: gpu.WatchFailing, Message: fmt.Sprintf("waiting for NVML events failed %d times in a row: %v", failures, ret)}) {
				return nil
			}
			select {
			case <-ctx.Done():
			case <-time.After(b.waitTimeout):
			}
			continue
		}

		ev, ok := toHealthEvent(data, ignored)
		if !ok {
			logger.V(4).Info("Ignoring NVML event", "type", data.EventType, "data", data.EventData)
			continue
		}
		var targets []string
		if data.Device != nil {
			if u, ret := data.Device.GetUUID(); ret == gonvml.SUCCESS {
				targets = []string{u}
			} else {
				logger.Error(ret, "Failed to identify the GPU of an NVML event, marking all GPUs unhealthy", "reason", ev.Reason)
			}
		}
		if targets == nil {
			for _, g := range gpus {
				targets = append(targets, g.uuid)
			}
		}
		for _, u := range targets {
			st.sticky[u] = true
			ev.UUID = u
			if !emit(ev) {
				return nil
			}
		}
	}
	return nil
}

// probe asks the GPU something only a working GPU answers.
func probe(h gonvml.Device) error {
	_, ret := h.GetMemoryInfo()
	return check(ret)
}

// register subscribes every GPU that supports it to the health events and
// returns the GPUs it could open, plus how many were subscribed. A GPU that
// cannot be opened is logged and left out; it is not published either.
func (b *Backend) register(ctx context.Context, set gonvml.EventSet) ([]watched, int, error) {
	logger := klog.FromContext(ctx)
	count, ret := b.lib.DeviceGetCount()
	if err := check(ret); err != nil {
		return nil, 0, fmt.Errorf("count GPUs: %w", err)
	}
	var gpus []watched
	registered := 0
	for i := range count {
		h, ret := b.lib.DeviceGetHandleByIndex(i)
		if err := check(ret); err != nil {
			logger.Error(err, "GPU health not watched: cannot open the GPU", "index", i)
			continue
		}
		u, ret := h.GetUUID()
		if err := check(ret); err != nil {
			logger.Error(err, "GPU health not watched: cannot read its UUID", "index", i)
			continue
		}
		gpus = append(gpus, watched{uuid: u, handle: h})
		supported, ret := h.GetSupportedEventTypes()
		if err := check(ret); err != nil {
			logger.Info("GPU health not watched: NVML events unavailable", "index", i, "uuid", u, "err", err)
			continue
		}
		mask := healthEventMask & supported
		if mask == 0 {
			continue
		}
		if err := check(h.RegisterEvents(mask, set)); err != nil {
			logger.Info("GPU health not watched: cannot register NVML events", "index", i, "uuid", u, "err", err)
			continue
		}
		registered++
	}
	return gpus, registered, nil
}

// toHealthEvent maps an NVML event to an unhealthy event without UUID; ok is
// false for events that say nothing about the GPU's health.
func toHealthEvent(data gonvml.EventData, ignored map[uint64]bool) (gpu.HealthEvent, bool) {
	switch data.EventType {
	case gonvml.EventTypeXidCriticalError:
		if ignored[data.EventData] {
			return gpu.HealthEvent{}, false
		}
		return gpu.HealthEvent{
			Reason:  fmt.Sprintf("XID-%d", data.EventData),
			Message: fmt.Sprintf("critical Xid error %d", data.EventData),
			Persist: true,
		}, true
	case gonvml.EventTypeDoubleBitEccError:
		return gpu.HealthEvent{Reason: "ECC-DBE", Message: "uncorrectable double-bit ECC error", Persist: true}, true
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
