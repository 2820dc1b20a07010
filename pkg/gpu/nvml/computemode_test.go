package nvml

import (
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gputopo/gputopo/pkg/gpu"
)

func TestComputeModeRoundTrip(t *testing.T) {
	lib, devs := newFakeNode([]fakeGPU{{computeMode: gonvml.COMPUTEMODE_PROHIBITED}, {}})
	b := newTestBackend(t, lib)
	if got, err := b.ComputeMode(fakeUUID(0)); err != nil || got != gpu.ComputeModeProhibited {
		t.Fatalf("ComputeMode(GPU 0) = %q, %v; want %s", got, err, gpu.ComputeModeProhibited)
	}
	if err := b.SetComputeMode(fakeUUID(1), gpu.ComputeModeExclusiveProcess); err != nil {
		t.Fatal(err)
	}
	// NVML was asked for GPU 1, by UUID, and nothing else changed.
	if m, _ := devs[1].GetComputeMode(); m != gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Errorf("GPU 1's NVML mode after SetComputeMode(EXCLUSIVE_PROCESS) = %d, want %d", m, gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS)
	}
	if m, _ := devs[0].GetComputeMode(); m != gonvml.COMPUTEMODE_PROHIBITED {
		t.Errorf("GPU 0's NVML mode changed to %d", m)
	}
	if got, err := b.ComputeMode(fakeUUID(1)); err != nil || got != gpu.ComputeModeExclusiveProcess {
		t.Errorf("ComputeMode(GPU 1) = %q, %v; want %s", got, err, gpu.ComputeModeExclusiveProcess)
	}
	if err := b.SetComputeMode(fakeUUID(1), gpu.ComputeModeDefault); err != nil {
		t.Fatal(err)
	}
	if m, _ := devs[1].GetComputeMode(); m != gonvml.COMPUTEMODE_DEFAULT {
		t.Errorf("GPU 1's NVML mode after SetComputeMode(DEFAULT) = %d", m)
	}
}

func TestComputeModeErrors(t *testing.T) {
	lib, _ := newFakeNode([]fakeGPU{{setModeRet: gonvml.ERROR_NO_PERMISSION}})
	b := newTestBackend(t, lib)
	for _, tc := range []struct {
		name string
		err  error
		want []string
	}{
		{"no permission", b.SetComputeMode(fakeUUID(0), gpu.ComputeModeExclusiveProcess), []string{fakeUUID(0), "EXCLUSIVE_PROCESS", "root"}},
		{"unknown GPU", b.SetComputeMode(fakeUUID(7), gpu.ComputeModeDefault), []string{fakeUUID(7), "NVML"}},
		{"thread mode", b.SetComputeMode(fakeUUID(0), gpu.ComputeModeExclusiveThread), []string{"EXCLUSIVE_THREAD", "is not one NVML sets"}},
		{"unknown mode", b.SetComputeMode(fakeUUID(0), "SHARED"), []string{`"SHARED"`}},
	} {
		if tc.err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(tc.err.Error(), w) {
				t.Errorf("%s: error %q does not say %q", tc.name, tc.err, w)
			}
		}
	}
	if _, err := b.ComputeMode(fakeUUID(7)); err == nil {
		t.Error("ComputeMode of a GPU NVML does not know: no error")
	}
}
