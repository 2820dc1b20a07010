package sim_test

import (
	"testing"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
)

// A simulated GPU keeps its compute mode, in its directory across
// backends (plugin restarts), as a real GPU does.
func TestSimulatedComputeMode(t *testing.T) {
	p, err := sim.LoadBuiltin("pcie-only")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, opts := range [][]sim.Option{nil, {sim.WithComputeModeDir(dir)}} {
		b := sim.New(p, "n", opts...)
		inv, _ := b.Discover(t.Context())
		uuid := inv.Devices[1].UUID
		if got, err := b.ComputeMode(uuid); err != nil || got != gpu.ComputeModeDefault {
			t.Fatalf("fresh GPU's compute mode = %q, %v; want %s", got, err, gpu.ComputeModeDefault)
		}
		if err := b.SetComputeMode(uuid, gpu.ComputeModeExclusiveProcess); err != nil {
			t.Fatal(err)
		}
		if got, _ := b.ComputeMode(uuid); got != gpu.ComputeModeExclusiveProcess {
			t.Errorf("compute mode after setting %s = %q", gpu.ComputeModeExclusiveProcess, got)
		}
		if got, _ := b.ComputeMode(inv.Devices[0].UUID); got != gpu.ComputeModeDefault {
			t.Errorf("another GPU's compute mode = %q; want it untouched", got)
		}
		if err := b.SetComputeMode("GPU-nope", gpu.ComputeModeDefault); err == nil {
			t.Error("setting an unknown GPU's mode: no error")
		}
		if err := b.SetComputeMode(uuid, gpu.ComputeModeExclusiveThread); err == nil {
			t.Error("setting EXCLUSIVE_THREAD: no error")
		}
	}
	b := sim.New(p, "n", sim.WithComputeModeDir(dir))
	inv, _ := b.Discover(t.Context())
	if got, _ := b.ComputeMode(inv.Devices[1].UUID); got != gpu.ComputeModeExclusiveProcess {
		t.Errorf("a new backend on the same directory reads %q; want the mode set before, %s", got, gpu.ComputeModeExclusiveProcess)
	}
}
