package nvml

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/gputopo/gputopo/pkg/gpu"
)

// fakeEvents is an NVML event set fed from a channel.
type fakeEvents struct {
	queue chan gonvml.EventData
	// waitRet, when set, fails every Wait.
	waitRet atomic.Int32
	freed   atomic.Bool
	set     *mock.EventSet
}

// newHealthNode returns n GPUs that support every event type, recording
// the mask each registers with in masks.
func newHealthNode(n int, masks []atomic.Uint64) (*mock.Interface, *fakeEvents) {
	ev := &fakeEvents{queue: make(chan gonvml.EventData, 8)}
	ev.set = &mock.EventSet{
		WaitFunc: func(ms uint32) (gonvml.EventData, gonvml.Return) {
			if ret := gonvml.Return(ev.waitRet.Load()); ret != gonvml.SUCCESS {
				time.Sleep(time.Millisecond)
				return gonvml.EventData{}, ret
			}
			select {
			case d := <-ev.queue:
				return d, gonvml.SUCCESS
			case <-time.After(time.Duration(ms) * time.Millisecond):
				return gonvml.EventData{}, gonvml.ERROR_TIMEOUT
			}
		},
		FreeFunc: func() gonvml.Return { ev.freed.Store(true); return gonvml.SUCCESS },
	}
	devs := make([]gonvml.Device, n)
	for i := range devs {
		d := newFakeDevice(i, fakeGPU{})
		d.GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) { return ^uint64(0), gonvml.SUCCESS }
		d.RegisterEventsFunc = func(mask uint64, _ gonvml.EventSet) gonvml.Return {
			masks[i].Store(mask)
			return gonvml.SUCCESS
		}
		devs[i] = d
	}
	lib := newFakeLib(devs...)
	lib.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) { return ev.set, gonvml.SUCCESS }
	return lib, ev
}

// watch runs WatchHealth in the background; the returned func cancels it and
// fails the test unless it returns nil promptly.
func watch(t *testing.T, b *Backend, events chan gpu.HealthEvent) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.WatchHealth(ctx, events) }()
	return func() {
		t.Helper()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("WatchHealth: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("WatchHealth did not return after cancel")
		}
	}
}

// receive returns the next event about a GPU, skipping those about the
// watch.
func receive(t *testing.T, events <-chan gpu.HealthEvent) gpu.HealthEvent {
	t.Helper()
	for {
		select {
		case ev := <-events:
			if ev.Watch != "" {
				continue
			}
			return ev
		case <-time.After(5 * time.Second):
			t.Fatal("no health event")
			return gpu.HealthEvent{}
		}
	}
}

// receiveWatch returns the next event about the watch, skipping those
// about GPUs.
func receiveWatch(t *testing.T, events <-chan gpu.HealthEvent) gpu.HealthEvent {
	t.Helper()
	for {
		select {
		case ev := <-events:
			if ev.Watch == "" {
				continue
			}
			return ev
		case <-time.After(5 * time.Second):
			t.Fatal("no event about the watch")
			return gpu.HealthEvent{}
		}
	}
}

// gpuEvents drains what is queued and returns the events about GPUs.
func gpuEvents(events chan gpu.HealthEvent) []gpu.HealthEvent {
	var out []gpu.HealthEvent
	for {
		select {
		case ev := <-events:
			if ev.Watch == "" {
				out = append(out, ev)
			}
		default:
			return out
		}
	}
}

func TestWatchHealthXid(t *testing.T) {
	masks := make([]atomic.Uint64, 2)
	lib, ev := newHealthNode(2, masks)
	b := newTestBackend(t, lib, WithEventWaitTimeout(10*time.Millisecond))
	dev1, _ := lib.DeviceGetHandleByIndex(1)
	// Xid 13 goes first: if it were not ignored it would be received first.
	ev.queue <- gonvml.EventData{Device: dev1, EventType: gonvml.EventTypeXidCriticalError, EventData: 13}
	ev.queue <- gonvml.EventData{Device: dev1, EventType: gonvml.EventTypeXidCriticalError, EventData: 79}

	events := make(chan gpu.HealthEvent)
	stop := watch(t, b, events)
	got := receive(t, events)
	stop()

	want := gpu.HealthEvent{UUID: fakeUUID(1), Healthy: false, Reason: "XID-79", Message: "critical Xid error 79", Persist: true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("event (-want +got):\n%s", diff)
	}
	for i := range masks {
		if got := masks[i].Load(); got != healthEventMask {
			t.Errorf("GPU %d registered mask %#x, want %#x", i, got, healthEventMask)
		}
	}
	if !ev.freed.Load() {
		t.Error("event set not freed")
	}
}

func TestWatchHealthUnknownDevice(t *testing.T) {
	lib, ev := newHealthNode(2, make([]atomic.Uint64, 2))
	b := newTestBackend(t, lib, WithEventWaitTimeout(10*time.Millisecond))
	ev.queue <- gonvml.EventData{EventType: gonvml.EventTypeDoubleBitEccError}

	events := make(chan gpu.HealthEvent, 2)
	stop := watch(t, b, events)
	got := []gpu.HealthEvent{receive(t, events), receive(t, events)}
	stop()

	want := []gpu.HealthEvent{
		{UUID: fakeUUID(0), Reason: "ECC-DBE", Message: "uncorrectable double-bit ECC error", Persist: true},
		{UUID: fakeUUID(1), Reason: "ECC-DBE", Message: "uncorrectable double-bit ECC error", Persist: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestWatchHealthGPULostAndBack(t *testing.T) {
	lib, ev := newHealthNode(2, make([]atomic.Uint64, 2))
	dev1, _ := lib.DeviceGetHandleByIndex(1)
	var gone atomic.Bool
	dev1.(*mock.Device).GetMemoryInfoFunc = func() (gonvml.Memory, gonvml.Return) {
		if gone.Load() {
			return gonvml.Memory{}, gonvml.ERROR_GPU_IS_LOST
		}
		return gonvml.Memory{Total: 1}, gonvml.SUCCESS
	}
	gone.Store(true)
	ev.waitRet.Store(int32(gonvml.ERROR_GPU_IS_LOST))
	b := newTestBackend(t, lib, WithEventWaitTimeout(10*time.Millisecond),
		WithHealth(HealthConfig{ProbeInterval: 20 * time.Millisecond}))

	events := make(chan gpu.HealthEvent, 8)
	stop := watch(t, b, events)
	lost := receive(t, events)
	time.Sleep(50 * time.Millisecond) // several failing waits: one event only
	if n := len(events); n != 0 {
		t.Errorf("%d more events while GPU 1 stays lost, want 0: %v", n, <-events)
	}
	// The GPU answers again and waits work again.
	gone.Store(false)
	ev.waitRet.Store(int32(gonvml.SUCCESS))
	back := receive(t, events)
	stop()

	want := []gpu.HealthEvent{
		{UUID: fakeUUID(1), Reason: ReasonGPULost},
		{UUID: fakeUUID(1), Healthy: true, Reason: ReasonRecovered},
	}
	if diff := cmp.Diff(want, []gpu.HealthEvent{lost, back}, cmpopts.IgnoreFields(gpu.HealthEvent{}, "Message")); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
}

func TestWatchHealthOtherWaitErrorsMarkNothing(t *testing.T) {
	lib, ev := newHealthNode(2, make([]atomic.Uint64, 2))
	ev.waitRet.Store(int32(gonvml.ERROR_UNKNOWN))
	b := newTestBackend(t, lib, WithEventWaitTimeout(5*time.Millisecond))
	events := make(chan gpu.HealthEvent, 8)
	stop := watch(t, b, events)
	if ev := receiveWatch(t, events); ev.Watch != gpu.WatchActive {
		t.Errorf("first watch event %+v, want Active", ev)
	}
	// Waits that keep failing make the watch say it is failing, never
	// a GPU unhealthy; good waits make it active again.
	if ev := receiveWatch(t, events); ev.Watch != gpu.WatchFailing || !strings.Contains(ev.Message, "ERROR_UNKNOWN") {
		t.Errorf("watch event %+v, want Failing with NVML's error", ev)
	}
	ev.waitRet.Store(int32(gonvml.SUCCESS))
	if ev := receiveWatch(t, events); ev.Watch != gpu.WatchActive {
		t.Errorf("watch event after the waits recovered %+v, want Active", ev)
	}
	stop()
	if got := gpuEvents(events); len(got) != 0 {
		t.Errorf("a failing wait marked GPUs: %v", got)
	}
}

func TestWatchHealthIgnoredXidsAreConfigurable(t *testing.T) {
	lib, ev := newHealthNode(1, make([]atomic.Uint64, 1))
	b := newTestBackend(t, lib, WithEventWaitTimeout(10*time.Millisecond),
		WithHealth(HealthConfig{IgnoredXids: []uint64{79}}))
	dev0, _ := lib.DeviceGetHandleByIndex(0)
	ev.queue <- gonvml.EventData{Device: dev0, EventType: gonvml.EventTypeXidCriticalError, EventData: 79}
	ev.queue <- gonvml.EventData{Device: dev0, EventType: gonvml.EventTypeXidCriticalError, EventData: 13}

	events := make(chan gpu.HealthEvent, 2)
	stop := watch(t, b, events)
	got := receive(t, events)
	stop()
	if got.Reason != "XID-13" {
		t.Errorf("first event %+v, want XID-13 (79 is ignored, 13 no longer is)", got)
	}
}

func TestWatchHealthSkipsAGPUItCannotOpen(t *testing.T) {
	lib, ev := newHealthNode(2, make([]atomic.Uint64, 2))
	open := lib.DeviceGetHandleByIndexFunc
	lib.DeviceGetHandleByIndexFunc = func(i int) (gonvml.Device, gonvml.Return) {
		if i == 0 {
			return nil, gonvml.ERROR_GPU_IS_LOST
		}
		return open(i)
	}
	dev1, _ := open(1)
	ev.queue <- gonvml.EventData{Device: dev1, EventType: gonvml.EventTypeXidCriticalError, EventData: 79}
	b := newTestBackend(t, lib, WithEventWaitTimeout(10*time.Millisecond))
	events := make(chan gpu.HealthEvent, 1)
	stop := watch(t, b, events)
	got := receive(t, events)
	stop()
	if got.UUID != fakeUUID(1) || got.Reason != "XID-79" {
		t.Errorf("event %+v, want XID-79 on GPU 1", got)
	}
}

func TestWatchHealthCancelWhileSending(t *testing.T) {
	lib, ev := newHealthNode(1, make([]atomic.Uint64, 1))
	b := newTestBackend(t, lib, WithEventWaitTimeout(10*time.Millisecond))
	dev0, _ := lib.DeviceGetHandleByIndex(0)
	ev.queue <- gonvml.EventData{Device: dev0, EventType: gonvml.EventTypeXidCriticalError, EventData: 48}

	stop := watch(t, b, make(chan gpu.HealthEvent)) // nobody reads
	time.Sleep(50 * time.Millisecond)
	stop()
}

func TestWatchHealthUnsupported(t *testing.T) {
	t.Run("event sets", func(t *testing.T) {
		lib := newFakeLib()
		lib.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED }
		events := make(chan gpu.HealthEvent, 1)
		stop := watch(t, newTestBackend(t, lib), events)
		// Nothing to follow is not a failing watch: the GPUs must
		// not be tainted as unmonitored for good.
		if ev := receiveWatch(t, events); ev.Watch != gpu.WatchActive {
			t.Errorf("watch event %+v, want Active", ev)
		}
		stop()
		if got := gpuEvents(events); len(got) != 0 {
			t.Errorf("got %v, want no events", got)
		}
	})
	t.Run("devices", func(t *testing.T) {
		lib, ev := newHealthNode(1, make([]atomic.Uint64, 1))
		dev0, _ := lib.DeviceGetHandleByIndex(0)
		dev0.(*mock.Device).GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) {
			return 0, gonvml.ERROR_NOT_SUPPORTED
		}
		events := make(chan gpu.HealthEvent, 1)
		stop := watch(t, newTestBackend(t, lib), events)
		if ev := receiveWatch(t, events); ev.Watch != gpu.WatchActive {
			t.Errorf("watch event %+v, want Active", ev)
		}
		stop()
		if got := gpuEvents(events); len(got) != 0 {
			t.Errorf("got %v, want no events", got)
		}
		if len(ev.set.WaitCalls()) != 0 {
			t.Error("waited on an event set with no registered GPU")
		}
	})
}
