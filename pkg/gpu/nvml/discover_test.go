package nvml

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/topology"
)

func discover(t *testing.T, gpus []fakeGPU) *gpu.Inventory {
	t.Helper()
	lib, _ := newFakeNode(gpus)
	return discoverWith(t, lib, gpus)
}

func discoverWith(t *testing.T, lib gonvml.Interface, gpus []fakeGPU) *gpu.Inventory {
	t.Helper()
	inv, err := newTestBackend(t, lib, WithSysFS(fakeSysFS(gpus))).Discover(context.Background())
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
	wantDev := gpu.Device{
		Index: 7, Minor: 7, UUID: fakeUUID(7), ProductName: "Tesla V100-SXM2-32GB",
		Architecture: "volta", CUDAComputeCapability: "7.0", DriverVersion: "550.54.15",
		CUDADriverVersion: "12.4", MemoryBytes: 32 << 30, PCIBusID: "0000:8a:00.0", NUMANode: 1, NVLinks: 6,
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
		// No fabric manager: registration never starts.
		{busID: "00000000:05:00.0", fabric: gonvml.GpuFabricInfo{State: gonvml.GPU_FABRIC_STATE_NOT_STARTED}},
	}
	inv := discover(t, gpus)
	var got []*gpu.Fabric
	for _, d := range inv.Devices {
		got = append(got, d.Fabric)
	}
	want := []*gpu.Fabric{{ClusterUUID: "12345678-9abc-def0-0102-030405060708", CliqueID: 7}, nil, nil, nil, nil}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("fabric (-want +got):\n%s", diff)
	}
	// Registration in progress is pending (discovery is repeated); a
	// completed registration that failed is not.
	var pending []bool
	for _, d := range inv.Devices {
		pending = append(pending, d.FabricPending)
	}
	if diff := cmp.Diff([]bool{false, false, true, false, true}, pending); diff != "" {
		t.Errorf("fabric pending (-want +got):\n%s", diff)
	}
	// CUDA fails on a GPU until its registration completed, and for good
	// when it failed: those GPUs say why.
	var unready []string
	for _, d := range inv.Devices {
		r := ""
		if d.FabricUnready != nil {
			r = d.FabricUnready.Reason
		}
		unready = append(unready, r)
	}
	if diff := cmp.Diff([]string{"", "", gpu.FabricInProgress, gpu.FabricFailed, gpu.FabricNotStarted}, unready); diff != "" {
		t.Errorf("fabric unready (-want +got):\n%s", diff)
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

func TestDiscoverNUMAFromSysfs(t *testing.T) {
	// On x86 servers NVML answers NOT_SUPPORTED, on Grace it names the
	// GPU memory node: the CPU-side node comes from sysfs either way.
	gpus := []fakeGPU{
		{busID: "00000000:01:00.0", numa: 1, numaRet: gonvml.ERROR_NOT_SUPPORTED},
		{busID: "00000000:02:00.0", numa: 0, numaRet: gonvml.ERROR_NOT_SUPPORTED},
		{busID: "00000000:03:00.0", numa: -1},
		{busID: "00000000:04:00.0", numa: 1},
	}
	lib, _ := newFakeNode(gpus)
	sys := fakeSysFS(gpus)
	delete(sys, "bus/pci/devices/0000:04:00.0/numa_node") // a VM without it
	b := newTestBackend(t, lib, WithSysFS(sys))
	inv, err := b.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for _, d := range inv.Devices {
		got = append(got, d.NUMANode)
	}
	if diff := cmp.Diff([]int{1, 0, -1, -1}, got); diff != "" {
		t.Errorf("NUMA nodes (-want +got):\n%s", diff)
	}
	for i := range gpus {
		d, _ := lib.DeviceGetHandleByIndex(i)
		if n := len(d.(*mock.Device).GetNumaNodeIdCalls()); n != 0 {
			t.Errorf("GPU %d: GetNumaNodeId called %d times; NUMA must come from sysfs", i, n)
		}
	}
}

func TestDiscoverDegradesPerGPU(t *testing.T) {
	names := func(inv *gpu.Inventory) (idx []int) {
		for _, d := range inv.Devices {
			idx = append(idx, d.Index)
		}
		return idx
	}
	tests := map[string]struct {
		mutate  func(gpus []fakeGPU)
		devices []int
		skipped []gpu.Skipped
		// linked are the GPUs with at least one link.
		linked []int
	}{
		"lost GPU": {
			mutate:  func(gpus []fakeGPU) { gpus[3].lost = true },
			devices: []int{0, 1, 2, 4, 5, 6, 7},
			skipped: []gpu.Skipped{{Index: 3, UUID: fakeUUID(3), Reason: SkipGPULost}},
			linked:  []int{0, 1, 2, 4, 5, 6, 7},
		},
		"MIG enabled": {
			mutate:  func(gpus []fakeGPU) { gpus[1].mig = true },
			devices: []int{0, 2, 3, 4, 5, 6, 7},
			skipped: []gpu.Skipped{{Index: 1, UUID: fakeUUID(1), Reason: SkipMIGEnabled}},
			linked:  []int{0, 2, 3, 4, 5, 6, 7},
		},
		"memory info fails": {
			mutate:  func(gpus []fakeGPU) { gpus[3].memoryRet = gonvml.ERROR_UNKNOWN },
			devices: []int{0, 1, 2, 4, 5, 6, 7},
			skipped: []gpu.Skipped{{Index: 3, UUID: fakeUUID(3), Reason: SkipDiscoverError}},
			linked:  []int{0, 1, 2, 4, 5, 6, 7},
		},
		"fabric refused": {
			mutate:  func(gpus []fakeGPU) { gpus[5].fabricRet = gonvml.ERROR_NO_PERMISSION },
			devices: []int{0, 1, 2, 3, 4, 6, 7},
			skipped: []gpu.Skipped{{Index: 5, UUID: fakeUUID(5), Reason: SkipDiscoverError}},
			linked:  []int{0, 1, 2, 3, 4, 6, 7},
		},
		// A GPU whose NVLink state cannot be read is published without
		// links; its peers keep theirs to each other.
		"NVLink state lost": {
			mutate:  func(gpus []fakeGPU) { gpus[2].linkStateRet = gonvml.ERROR_GPU_IS_LOST },
			devices: []int{0, 1, 2, 3, 4, 5, 6, 7},
			linked:  []int{0, 1, 3, 4, 5, 6, 7},
		},
		"remote PCI info unsupported": {
			mutate: func(gpus []fakeGPU) {
				for i := range gpus {
					gpus[i].remotePciRet = gonvml.ERROR_NOT_SUPPORTED
				}
			},
			devices: []int{0, 1, 2, 3, 4, 5, 6, 7},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			gpus := dgx1()
			tc.mutate(gpus)
			inv := discover(t, gpus)
			if diff := cmp.Diff(tc.devices, names(inv)); diff != "" {
				t.Errorf("published GPUs (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.skipped, inv.Skipped, cmpopts.IgnoreFields(gpu.Skipped{}, "Message")); diff != "" {
				t.Errorf("skipped (-want +got):\n%s", diff)
			}
			for _, s := range inv.Skipped {
				if !strings.Contains(s.Message, fmt.Sprintf("GPU %d", s.Index)) {
					t.Errorf("skip message %q does not name GPU %d", s.Message, s.Index)
				}
			}
			linked := map[int]bool{}
			for _, l := range inv.Links {
				linked[l.A], linked[l.B] = true, true
			}
			var got []int
			for _, d := range inv.Devices {
				if linked[d.Index] {
					got = append(got, d.Index)
				}
			}
			if diff := cmp.Diff(tc.linked, got); diff != "" {
				t.Errorf("GPUs with links (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDiscoverFailsOnlyWithoutAnyGPU(t *testing.T) {
	lib, _ := newFakeNode(dgx1())
	lib.SystemGetDriverVersionFunc = func() (string, gonvml.Return) { return "", gonvml.ERROR_UNKNOWN }
	_, err := newTestBackend(t, lib).Discover(context.Background())
	if !errors.Is(err, gonvml.ERROR_UNKNOWN) || !strings.Contains(err.Error(), "driver version") {
		t.Errorf("Discover error = %v, want the driver version failure", err)
	}
}

func TestDiscoverOlderDriverLacksSymbols(t *testing.T) {
	gpus := dgxH100()[:2]
	gpus[0].fabric = gonvml.GpuFabricInfo{State: gonvml.GPU_FABRIC_STATE_COMPLETED, ClusterUuid: [16]uint8{1}}
	lib, devs := newFakeNode(gpus)
	withMissingSymbols(t, lib, devs, symFabricInfo, symMIGMode, symRemoteDeviceType, symArchitecture, symCUDAVersion)
	lib.SystemGetCudaDriverVersion_v2Func = func() (int, gonvml.Return) {
		t.Error("SystemGetCudaDriverVersion_v2 called although the driver lacks it")
		return 0, gonvml.ERROR_FUNCTION_NOT_FOUND
	}
	inv := discoverWith(t, lib, gpus)
	if len(inv.Devices) != 2 {
		t.Fatalf("got %d GPUs, want 2", len(inv.Devices))
	}
	d := inv.Devices[0]
	if d.Architecture != "unknown" || d.CUDADriverVersion != "" || d.Fabric != nil {
		t.Errorf("device = %+v, want unknown architecture, no CUDA version, no fabric", d)
	}
	// Without the remote type, lanes to unknown ends count as switch lanes.
	if diff := cmp.Diff(allPairs(2, 18), inv.Links); diff != "" {
		t.Errorf("links (-want +got):\n%s", diff)
	}
}

// analysed discovers gpus and runs the topology model on the result, the
// way the plugin publishes them.
func analysed(t *testing.T, gpus []fakeGPU) (*gpu.Inventory, *topology.NodeNVLink) {
	t.Helper()
	inv := discover(t, gpus)
	nv, err := topology.AnalyzeNVLink("n", inv)
	if err != nil {
		t.Fatal(err)
	}
	return inv, nv
}

// blockMembers lists, per block of size, the GPU indexes in it.
func blockMembers(inv *gpu.Inventory, nv *topology.NodeNVLink, size int) [][]int {
	byID := map[string][]int{}
	var ids []string
	for i, g := range nv.GPUs {
		id, ok := g.Blocks[size]
		if !ok {
			continue
		}
		if byID[id] == nil {
			ids = append(ids, id)
		}
		byID[id] = append(byID[id], inv.Devices[i].Index)
	}
	var out [][]int
	for _, id := range ids {
		out = append(out, byID[id])
	}
	return out
}

func TestDiscoverBridgedPairsInNonAlignedOrder(t *testing.T) {
	// PCIe cards bridged in pairs whose NVML order does not follow the
	// bridges (k8s-device-plugin issue 546): 0-2, 1-3, 4-5, 6-7, four
	// NVLink 3 lanes per bridge.
	buses := []string{
		"00000000:17:00.0", "00000000:31:00.0", "00000000:4B:00.0", "00000000:65:00.0",
		"00000000:98:00.0", "00000000:B1:00.0", "00000000:CA:00.0", "00000000:E3:00.0",
	}
	peer := []int{2, 3, 0, 1, 5, 4, 7, 6}
	gpus := make([]fakeGPU, 8)
	for i := range gpus {
		gpus[i] = fakeGPU{busID: buses[i], arch: gonvml.DEVICE_ARCH_AMPERE, name: "NVIDIA A100 80GB PCIe", memory: 80 << 30, ccMajor: 8}
		for range 4 {
			gpus[i].links = append(gpus[i].links, fakeLink{remoteBus: buses[peer[i]], remoteType: gonvml.NVLINK_DEVICE_TYPE_GPU})
		}
	}
	inv, nv := analysed(t, gpus)
	if diff := cmp.Diff([][]int{{0, 2}, {1, 3}, {4, 5}, {6, 7}}, blockMembers(inv, nv, 2)); diff != "" {
		t.Errorf("nvlinkBlock2 (-want +got):\n%s", diff)
	}
	for i, g := range nv.GPUs {
		if g.Links != 4 || g.BandwidthGBps != 100 || g.Peers != 1 {
			t.Errorf("GPU %d: links=%d bandwidth=%d peers=%d, want 4, 100, 1", i, g.Links, g.BandwidthGBps, g.Peers)
		}
	}
}

func TestDiscoverPermutedCubeMesh(t *testing.T) {
	// A DGX-1 whose NVML indexes are shuffled against the wiring: the
	// quads are wherever the links put them.
	base := dgx1()
	perm := []int{3, 6, 0, 5, 7, 1, 4, 2} // NVML index i is board GPU perm[i]
	gpus := make([]fakeGPU, 8)
	for i, p := range perm {
		gpus[i] = base[p]
	}
	inv, nv := analysed(t, gpus)
	// Board quads {0,1,2,3} and {4,5,6,7} sit at these NVML indexes.
	want := [][]int{{0, 2, 5, 7}, {1, 3, 4, 6}}
	if diff := cmp.Diff(want, blockMembers(inv, nv, 4)); diff != "" {
		t.Errorf("nvlinkBlock4 (-want +got):\n%s", diff)
	}
	if got := blockMembers(inv, nv, 8); got != nil {
		t.Errorf("nvlinkBlock8 = %v, want none (a cube mesh is not fully connected)", got)
	}
	pairs := blockMembers(inv, nv, 2)
	if len(pairs) != 4 {
		t.Fatalf("nvlinkBlock2 = %v, want 4 pairs", pairs)
	}
	quadOf := map[int]int{}
	for q, members := range want {
		for _, m := range members {
			quadOf[m] = q
		}
	}
	for _, p := range pairs {
		if quadOf[p[0]] != quadOf[p[1]] {
			t.Errorf("pair %v straddles two quads", p)
		}
	}
}

func TestDiscoverGB200Tray(t *testing.T) {
	// One GB200 NVL72 compute tray: 4 Blackwell GPUs, 18 NVLink 5 links
	// each, all to the rack's NVSwitch trays; registered in clique 3.
	cluster := [16]uint8{0xaa, 0xbb, 0xcc, 0xdd, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	buses := []string{"00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0"}
	gpus := make([]fakeGPU, 4)
	for i := range gpus {
		gpus[i] = fakeGPU{
			busID: buses[i], arch: gonvml.DEVICE_ARCH_BLACKWELL, name: "NVIDIA GB200", memory: 186 << 30, ccMajor: 10, numa: i / 2,
			fabric: gonvml.GpuFabricInfo{ClusterUuid: cluster, CliqueId: 3, State: gonvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(gonvml.SUCCESS)},
		}
		for l := range 18 {
			gpus[i].links = append(gpus[i].links, fakeLink{remoteBus: fmt.Sprintf("00000000:%02X:00.0", 0x80+l%9), remoteType: gonvml.NVLINK_DEVICE_TYPE_SWITCH})
		}
	}
	inv, nv := analysed(t, gpus)
	if diff := cmp.Diff(allPairs(4, 18), inv.Links); diff != "" {
		t.Errorf("links (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([][]int{{0, 1, 2, 3}}, blockMembers(inv, nv, 4)); diff != "" {
		t.Errorf("nvlinkBlock4 (-want +got):\n%s", diff)
	}
	for i, g := range nv.GPUs {
		// 18 links x 50 GB/s per direction = 900 GB/s, not 3 peers x 18.
		if g.Links != 18 || g.BandwidthGBps != 900 {
			t.Errorf("GPU %d: links=%d bandwidth=%d, want 18 and 900", i, g.Links, g.BandwidthGBps)
		}
		d := inv.Devices[i]
		if d.Fabric == nil || d.Fabric.CliqueID != 3 || d.Fabric.ClusterUUID != "aabbccdd-0102-0304-0506-0708090a0b0c" {
			t.Errorf("GPU %d fabric = %+v, want clique 3 of cluster aabbccdd-...", i, d.Fabric)
		}
		if d.PCIBusID != normaliseBusID(buses[i]) || d.NUMANode != i/2 {
			t.Errorf("GPU %d: bus %s numa %d", i, d.PCIBusID, d.NUMANode)
		}
	}
}

func TestDiscoverAfterTheDriverWasReplaced(t *testing.T) {
	for _, ret := range []gonvml.Return{gonvml.ERROR_LIB_RM_VERSION_MISMATCH, gonvml.ERROR_DRIVER_NOT_LOADED} {
		lib := newFakeLib()
		lib.DeviceGetCountFunc = func() (int, gonvml.Return) { return 0, ret }
		_, err := newTestBackend(t, lib).Discover(context.Background())
		if !errors.Is(err, gpu.ErrDriverReloaded) || !errors.Is(err, ret) {
			t.Errorf("%v: Discover = %v, want ErrDriverReloaded wrapping it", ret, err)
		}
	}
	lib := newFakeLib()
	lib.DeviceGetCountFunc = func() (int, gonvml.Return) { return 0, gonvml.ERROR_UNKNOWN }
	if _, err := newTestBackend(t, lib).Discover(context.Background()); errors.Is(err, gpu.ErrDriverReloaded) {
		t.Errorf("an unknown error is no replaced driver: %v", err)
	}
}
