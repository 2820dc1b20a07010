package nvml

import (
	"context"
	"errors"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/pkg/gpu"
)

func discover(t *testing.T, gpus []fakeGPU) *gpu.Inventory {
	t.Helper()
	inv, err := newTestBackend(t, newFakeNode(gpus)).Discover(context.Background())
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	return inv
}

func TestDiscoverDGX1(t *testing.T) {
	inv := discover(t, dgx1())

	want := []gpu.Link{
		{A: 0, B: 1, Count: 1}, {A: 0, B: 2, Count: 1}, {A: 0, B: 3, Count: 2}, {A: 0, B: 4, Count: 2},
		{A: 1, B: 2, Count: 2}, {A: 1, B: 3, Count: 1}, {A: 1, B: 5, Count: 2},
		{A: 2, B: 3, Count: 2}, {A: 2, B: 6, Count: 1},
		{A: 3, B: 7, Count: 1},
		{A: 4, B: 5, Count: 1}, {A: 4, B: 6, Count: 1}, {A: 4, B: 7, Count: 2},
		{A: 5, B: 6, Count: 2}, {A: 5, B: 7, Count: 1},
		{A: 6, B: 7, Count: 2},
	}
	if diff := cmp.Diff(want, inv.Links); diff != "" {
		t.Errorf("links (-want +got):\n%s", diff)
	}
	if inv.LinkBandwidthGBps != 25 {
		t.Errorf("LinkBandwidthGBps = %v, want 25", inv.LinkBandwidthGBps)
	}
	if inv.DevRoot != "/dev" {
		t.Errorf("DevRoot = %q, want /dev", inv.DevRoot)
	}
	wantDev := gpu.Device{
		Index: 7, Minor: 7, UUID: fakeUUID(7), ProductName: "Tesla V100-SXM2-32GB",
		Architecture: "volta", CUDAComputeCapability: "7.0", DriverVersion: "550.54.15",
		CUDADriverVersion: "12.4", MemoryBytes: 32 << 30, PCIBusID: "0000:8a:00.0", NUMANode: 1,
	}
	if diff := cmp.Diff(wantDev, inv.Devices[7]); diff != "" {
		t.Errorf("device 7 (-want +got):\n%s", diff)
	}
}

func allPairs(n, count int) []gpu.Link {
	var links []gpu.Link
	for a := range n {
		for b := a + 1; b < n; b++ {
			links = append(links, gpu.Link{A: a, B: b, Count: count})
		}
	}
	return links
}

func TestDiscoverNVSwitch(t *testing.T) {
	t.Run("DGX H100", func(t *testing.T) {
		inv := discover(t, dgxH100())
		if diff := cmp.Diff(allPairs(8, 18), inv.Links); diff != "" {
			t.Errorf("links (-want +got):\n%s", diff)
		}
		if inv.LinkBandwidthGBps != 25 {
			t.Errorf("LinkBandwidthGBps = %v, want 25", inv.LinkBandwidthGBps)
		}
	})

	t.Run("degraded GPU bounds its pairs", func(t *testing.T) {
		gpus := dgxH100()[:3]
		gpus[1].links[3] = fakeLink{}
		gpus[1].links[11] = fakeLink{}
		want := []gpu.Link{{A: 0, B: 1, Count: 16}, {A: 0, B: 2, Count: 18}, {A: 1, B: 2, Count: 16}}
		if diff := cmp.Diff(want, discover(t, gpus).Links); diff != "" {
			t.Errorf("links (-want +got):\n%s", diff)
		}
	})

	t.Run("remote type unsupported counts as switch", func(t *testing.T) {
		gpus := dgxH100()[:2]
		for i := range gpus {
			gpus[i].typeRet = gonvml.ERROR_FUNCTION_NOT_FOUND
		}
		if diff := cmp.Diff(allPairs(2, 18), discover(t, gpus).Links); diff != "" {
			t.Errorf("links (-want +got):\n%s", diff)
		}
	})

	t.Run("CPU lanes ignored", func(t *testing.T) {
		gpus := dgxH100()[:2]
		for i := range gpus {
			for l := range gpus[i].links {
				gpus[i].links[l].remoteType = gonvml.NVLINK_DEVICE_TYPE_IBMNPU
			}
		}
		if got := discover(t, gpus).Links; got != nil {
			t.Errorf("links = %v, want none", got)
		}
	})

	t.Run("Blackwell lane bandwidth", func(t *testing.T) {
		gpus := dgxH100()[:2]
		for i := range gpus {
			gpus[i].arch = gonvml.DEVICE_ARCH_BLACKWELL
		}
		if got := discover(t, gpus).LinkBandwidthGBps; got != 50 {
			t.Errorf("LinkBandwidthGBps = %v, want 50", got)
		}
	})
}

func TestDiscoverPCIeOnly(t *testing.T) {
	for name, ret := range map[string]gonvml.Return{
		"not supported": gonvml.ERROR_NOT_SUPPORTED,
		"disabled":      gonvml.SUCCESS,
	} {
		t.Run(name, func(t *testing.T) {
			gpus := []fakeGPU{
				{busID: "00000000:01:00.0", arch: gonvml.DEVICE_ARCH_ADA, linkStateRet: ret},
				{busID: "00000000:02:00.0", arch: gonvml.DEVICE_ARCH_ADA, linkStateRet: ret},
			}
			if ret == gonvml.SUCCESS {
				for i := range gpus {
					gpus[i].links = make([]fakeLink, 4)
				}
			}
			inv := discover(t, gpus)
			if inv.Links != nil || inv.LinkBandwidthGBps != 0 {
				t.Errorf("links = %v at %v GB/s, want none at 0", inv.Links, inv.LinkBandwidthGBps)
			}
			if len(inv.Devices) != 2 {
				t.Errorf("got %d devices, want 2", len(inv.Devices))
			}
		})
	}
}

func TestDiscoverFabric(t *testing.T) {
	cluster := [16]uint8{0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8}
	gpus := []fakeGPU{
		{busID: "00000000:01:00.0", fabric: gonvml.GpuFabricInfo{
			ClusterUuid: cluster, CliqueId: 7, State: gonvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(gonvml.SUCCESS),
		}},
		{busID: "00000000:02:00.0", fabricRet: gonvml.ERROR_NOT_SUPPORTED},
		{busID: "00000000:03:00.0", fabric: gonvml.GpuFabricInfo{
			ClusterUuid: cluster, CliqueId: 7, State: gonvml.GPU_FABRIC_STATE_IN_PROGRESS,
		}},
		{busID: "00000000:04:00.0", fabric: gonvml.GpuFabricInfo{
			ClusterUuid: cluster, CliqueId: 7, State: gonvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(gonvml.ERROR_UNKNOWN),
		}},
	}
	inv := discover(t, gpus)
	var got []*gpu.Fabric
	for _, d := range inv.Devices {
		got = append(got, d.Fabric)
	}
	want := []*gpu.Fabric{{ClusterUUID: "12345678-9abc-def0-0102-030405060708", CliqueID: 7}, nil, nil, nil}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("fabric (-want +got):\n%s", diff)
	}
}

func TestNormaliseBusID(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:18:00.0":  "0000:18:00.0",
		"00000000:8A:00.0":  "0000:8a:00.0",
		"0000:18:00.0":      "0000:18:00.0",
		"00000001:18:00.0":  "0001:18:00.0",
		"00010000:18:00.0":  "10000:18:00.0",
		"18:00.0":           "0000:18:00.0",
		" 00000000:18:00.0": "0000:18:00.0",
		"garbage":           "garbage",
		"zz:18:00.0":        "zz:18:00.0",
	} {
		if got := normaliseBusID(in); got != want {
			t.Errorf("normaliseBusID(%q) = %q, want %q", in, got, want)
		}
	}
	p := gonvml.PciInfo{Domain: 0, Bus: 0x3b, Device: 0}
	if got, want := pciBusID(p), "0000:3b:00.0"; got != want {
		t.Errorf("pciBusID of numeric fields = %q, want %q", got, want)
	}
}

func TestDiscoverNUMA(t *testing.T) {
	gpus := []fakeGPU{
		{busID: "00000000:01:00.0", numa: 1},
		{busID: "00000000:02:00.0", numa: 0, numaRet: gonvml.ERROR_NOT_SUPPORTED},
		{busID: "00000000:03:00.0", numa: -1},
	}
	inv := discover(t, gpus)
	var got []int
	for _, d := range inv.Devices {
		got = append(got, d.NUMANode)
	}
	if diff := cmp.Diff([]int{1, -1, -1}, got); diff != "" {
		t.Errorf("NUMA nodes (-want +got):\n%s", diff)
	}
}

func TestDiscoverErrors(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(gpus []fakeGPU)
		want   string
		is     gonvml.Return
	}{
		{
			name:   "memory info",
			mutate: func(gpus []fakeGPU) { gpus[3].memoryRet = gonvml.ERROR_UNKNOWN },
			want:   "get memory info of GPU 3: ",
			is:     gonvml.ERROR_UNKNOWN,
		},
		{
			name:   "NVLink state",
			mutate: func(gpus []fakeGPU) { gpus[2].linkStateRet = gonvml.ERROR_GPU_IS_LOST },
			want:   "get NVLink 0 state of GPU 2: ",
			is:     gonvml.ERROR_GPU_IS_LOST,
		},
		{
			name:   "fabric",
			mutate: func(gpus []fakeGPU) { gpus[5].fabricRet = gonvml.ERROR_NO_PERMISSION },
			want:   "get fabric info of GPU 5: ",
			is:     gonvml.ERROR_NO_PERMISSION,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			gpus := dgx1()
			tc.mutate(gpus)
			_, err := newTestBackend(t, newFakeNode(gpus)).Discover(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, tc.is) {
				t.Errorf("Discover error = %v, want one containing %q wrapping %v", err, tc.want, tc.is)
			}
		})
	}
}
