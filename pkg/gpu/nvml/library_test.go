package nvml

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/gpu/nvml/nvmltest"
)

// TestDiscoverThroughALoadedLibrary runs discovery through go-nvml's own
// dlopen and cgo calls, against the NVML stand-in loaded from a path as a
// driver's libnvidia-ml.so.1 would be: what the mocks of the other tests
// cannot show (the C symbols the backend needs resolve, the structs
// decode, the optional functions are found).
func TestDiscoverThroughALoadedLibrary(t *testing.T) {
	gpus := nvmltest.H100s(2)
	gpus[1].MemoryBytes = 94 << 30
	dir := t.TempDir()
	lib, eventsFile := filepath.Join(dir, "libnvidia-ml.so.1"), filepath.Join(dir, "event")
	nvmltest.Build(t, lib, "libnvidia-ml.so.1", nvmltest.Config{DriverVersion: "570.86.15", CUDAVersion: 12080, GPUs: gpus, EventsFile: eventsFile})

	b, err := New(WithLibraryPath(lib), WithEventWaitTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	inv, err := b.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.Skipped) != 0 || len(inv.Devices) != len(gpus) {
		t.Fatalf("discovered %d GPUs, skipped %v; want %d", len(inv.Devices), inv.Skipped, len(gpus))
	}
	for i, d := range inv.Devices {
		want := gpus[i]
		if d.UUID != want.UUID || d.ProductName != want.Name || d.PCIBusID != want.BusID || d.Minor != want.Minor ||
			d.MemoryBytes != int64(want.MemoryBytes) || d.Architecture != "hopper" || d.CUDAComputeCapability != "9.0" ||
			d.DriverVersion != "570.86.15" || d.CUDADriverVersion != "12.8" || d.NVLinks != 18 {
			t.Errorf("GPU %d discovered as %+v, want %+v with driver 570.86.15, CUDA 12.8 and 18 NVLinks", i, d, want)
		}
	}
	if len(inv.Links) != 1 || inv.Links[0] != (gpu.Link{A: 0, B: 1, Count: 18}) || inv.LinkBandwidthGBps != 25 {
		t.Errorf("NVLink graph %v at %v GB/s a lane, want the two GPUs joined by 18 lanes through the NVSwitch at 25", inv.Links, inv.LinkBandwidthGBps)
	}

	// Compute modes go through NVML and stay set.
	uuid := gpus[1].UUID
	if err := b.SetComputeMode(uuid, gpu.ComputeModeExclusiveProcess); err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{gpus[0].UUID, uuid} {
		m, err := b.ComputeMode(u)
		want := gpu.ComputeModeDefault
		if u == uuid {
			want = gpu.ComputeModeExclusiveProcess
		}
		if err != nil || m != want {
			t.Errorf("compute mode of %s: %v, %v; want %v", u, m, err, want)
		}
	}
	if _, err := b.ComputeMode("GPU-not-here"); err == nil {
		t.Error("the compute mode of a GPU NVML does not know was read without error")
	}

	// Health through NVML's event set: an Xid on GPU 1, then an Xid the
	// default configuration ignores (13) and a double-bit ECC error on GPU 0.
	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan gpu.HealthEvent, 8)
	done := make(chan error, 1)
	go func() { done <- b.WatchHealth(ctx, events) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	next := func() gpu.HealthEvent {
		t.Helper()
		select {
		case ev := <-events:
			return ev
		case <-time.After(30 * time.Second):
			t.Fatal("no health event within 30 s")
			return gpu.HealthEvent{}
		}
	}
	if ev := next(); ev.Watch != gpu.WatchActive {
		t.Fatalf("first health event %+v, want the watch active", ev)
	}
	inject := func(index int, xid uint64) {
		t.Helper()
		if err := nvmltest.InjectEvent(eventsFile, index, xid, 10*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	inject(1, 79)
	if ev := next(); ev.UUID != gpus[1].UUID || ev.Healthy || ev.Reason != "XID-79" {
		t.Errorf("after Xid 79 on GPU 1: %+v, want GPU 1 unhealthy with XID-79", ev)
	}
	inject(0, 13)
	inject(0, 0)
	if ev := next(); ev.UUID != gpus[0].UUID || ev.Healthy || ev.Reason != "ECC-DBE" {
		t.Errorf("after Xid 13 (ignored) and a double-bit ECC error on GPU 0: %+v, want GPU 0 unhealthy with ECC-DBE", ev)
	}
}
