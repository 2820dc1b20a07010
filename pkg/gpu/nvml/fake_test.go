package nvml

import (
	"fmt"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// fakeLink is one NVLink lane as the local GPU sees it; a zero value is a
// disabled lane.
type fakeLink struct {
	remoteBus  string
	remoteType gonvml.IntNvLinkDeviceType
}

// fakeGPU describes a GPU the way NVML reports it.
type fakeGPU struct {
	busID  string // NVML spelling, e.g. "00000000:18:00.0"
	arch   gonvml.DeviceArchitecture
	name   string
	memory uint64
	// memoryRet, when set, fails GetMemoryInfo.
	memoryRet gonvml.Return
	ccMajor   int
	ccMinor   int
	numa      int
	numaRet   gonvml.Return
	fabric    gonvml.GpuFabricInfo
	// fabricRet defaults to ERROR_NOT_SUPPORTED, as on GPUs without a
	// multi-node fabric.
	fabricRet gonvml.Return
	// links[i] is lane i; lanes past the end do not exist on this GPU and
	// answer ERROR_INVALID_ARGUMENT, as NVML does.
	links []fakeLink
	// linkStateRet, when set, is returned by every GetNvLinkState call.
	linkStateRet gonvml.Return
	// typeRet, when set, is returned by GetNvLinkRemoteDeviceType.
	typeRet gonvml.Return
}

func fakeUUID(i int) string { return fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i) }

func newFakeDevice(i int, g fakeGPU) *mock.Device {
	fabricRet := g.fabricRet
	if fabricRet == gonvml.SUCCESS && g.fabric == (gonvml.GpuFabricInfo{}) {
		fabricRet = gonvml.ERROR_NOT_SUPPORTED
	}
	link := func(n int) (fakeLink, gonvml.Return) {
		if n < 0 || n >= len(g.links) {
			return fakeLink{}, gonvml.ERROR_INVALID_ARGUMENT
		}
		return g.links[n], gonvml.SUCCESS
	}
	return &mock.Device{
		GetUUIDFunc:         func() (string, gonvml.Return) { return fakeUUID(i), gonvml.SUCCESS },
		GetNameFunc:         func() (string, gonvml.Return) { return g.name, gonvml.SUCCESS },
		GetArchitectureFunc: func() (gonvml.DeviceArchitecture, gonvml.Return) { return g.arch, gonvml.SUCCESS },
		GetCudaComputeCapabilityFunc: func() (int, int, gonvml.Return) {
			return g.ccMajor, g.ccMinor, gonvml.SUCCESS
		},
		GetMemoryInfoFunc: func() (gonvml.Memory, gonvml.Return) {
			return gonvml.Memory{Total: g.memory, Free: g.memory}, g.memoryRet
		},
		GetMinorNumberFunc: func() (int, gonvml.Return) { return i, gonvml.SUCCESS },
		GetPciInfoFunc:     func() (gonvml.PciInfo, gonvml.Return) { return pciInfo(g.busID), gonvml.SUCCESS },
		GetNumaNodeIdFunc:  func() (int, gonvml.Return) { return g.numa, g.numaRet },
		GetGpuFabricInfoFunc: func() (gonvml.GpuFabricInfo, gonvml.Return) {
			return g.fabric, fabricRet
		},
		GetNvLinkStateFunc: func(n int) (gonvml.EnableState, gonvml.Return) {
			if g.linkStateRet != gonvml.SUCCESS {
				return gonvml.FEATURE_DISABLED, g.linkStateRet
			}
			l, ret := link(n)
			if ret != gonvml.SUCCESS || l.remoteBus == "" {
				return gonvml.FEATURE_DISABLED, ret
			}
			return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
		},
		GetNvLinkRemotePciInfoFunc: func(n int) (gonvml.PciInfo, gonvml.Return) {
			l, ret := link(n)
			return pciInfo(l.remoteBus), ret
		},
		GetNvLinkRemoteDeviceTypeFunc: func(n int) (gonvml.IntNvLinkDeviceType, gonvml.Return) {
			if g.typeRet != gonvml.SUCCESS {
				return gonvml.NVLINK_DEVICE_TYPE_UNKNOWN, g.typeRet
			}
			l, ret := link(n)
			return l.remoteType, ret
		},
	}
}

func pciInfo(busID string) gonvml.PciInfo {
	var p gonvml.PciInfo
	copy(p.BusId[:], busID)
	return p
}

// newFakeLib serves devs as NVML's device list.
func newFakeLib(devs ...gonvml.Device) *mock.Interface {
	return &mock.Interface{
		InitFunc:     func() gonvml.Return { return gonvml.SUCCESS },
		ShutdownFunc: func() gonvml.Return { return gonvml.SUCCESS },
		DeviceGetCountFunc: func() (int, gonvml.Return) {
			return len(devs), gonvml.SUCCESS
		},
		DeviceGetHandleByIndexFunc: func(i int) (gonvml.Device, gonvml.Return) {
			if i < 0 || i >= len(devs) {
				return nil, gonvml.ERROR_INVALID_ARGUMENT
			}
			return devs[i], gonvml.SUCCESS
		},
		SystemGetDriverVersionFunc: func() (string, gonvml.Return) { return "550.54.15", gonvml.SUCCESS },
		SystemGetCudaDriverVersion_v2Func: func() (int, gonvml.Return) {
			return 12040, gonvml.SUCCESS
		},
	}
}

func newFakeNode(gpus []fakeGPU) *mock.Interface {
	devs := make([]gonvml.Device, len(gpus))
	for i, g := range gpus {
		devs[i] = newFakeDevice(i, g)
	}
	return newFakeLib(devs...)
}

func newTestBackend(t *testing.T, lib gonvml.Interface, opts ...Option) *Backend {
	t.Helper()
	b, err := New(append([]Option{WithInterface(lib)}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return b
}

// dgx1Buses are the GPU bus IDs of a DGX-1, in NVML's upper-case spelling.
var dgx1Buses = []string{
	"00000000:06:00.0", "00000000:07:00.0", "00000000:0A:00.0", "00000000:0B:00.0",
	"00000000:85:00.0", "00000000:86:00.0", "00000000:89:00.0", "00000000:8A:00.0",
}

// dgx1Lanes is `nvidia-smi topo -m` of a DGX-1 V100 (hybrid cube-mesh): each
// GPU's six NVLink 2 lanes split 1/1/2/2 over its quad and its peer i±4.
var dgx1Lanes = [8][8]int{
	{0, 1, 1, 2, 2, 0, 0, 0},
	{1, 0, 2, 1, 0, 2, 0, 0},
	{1, 2, 0, 2, 0, 0, 1, 0},
	{2, 1, 2, 0, 0, 0, 0, 1},
	{2, 0, 0, 0, 0, 1, 1, 2},
	{0, 2, 0, 0, 1, 0, 2, 1},
	{0, 0, 1, 0, 1, 2, 0, 2},
	{0, 0, 0, 1, 2, 1, 2, 0},
}

func dgx1() []fakeGPU {
	gpus := make([]fakeGPU, 8)
	for i := range gpus {
		g := fakeGPU{
			busID: dgx1Buses[i], arch: gonvml.DEVICE_ARCH_VOLTA, name: "Tesla V100-SXM2-32GB",
			memory: 32 << 30, ccMajor: 7, ccMinor: 0, numa: i / 4,
		}
		for j, n := range dgx1Lanes[i] {
			for range n {
				g.links = append(g.links, fakeLink{remoteBus: dgx1Buses[j], remoteType: gonvml.NVLINK_DEVICE_TYPE_GPU})
			}
		}
		gpus[i] = g
	}
	return gpus
}

// dgxH100 builds a DGX H100: every GPU's 18 NVLink 4 lanes go to the four
// NVSwitch chips (5+4+4+5 lanes), none to another GPU.
func dgxH100() []fakeGPU {
	buses := []string{
		"00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0",
		"00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0",
	}
	switches := []string{"00000000:05:00.0", "00000000:06:00.0", "00000000:07:00.0", "00000000:08:00.0"}
	perSwitch := []int{5, 4, 4, 5}
	gpus := make([]fakeGPU, len(buses))
	for i, bus := range buses {
		g := fakeGPU{
			busID: bus, arch: gonvml.DEVICE_ARCH_HOPPER, name: "NVIDIA H100 80GB HBM3",
			memory: 80 << 30, ccMajor: 9, ccMinor: 0, numa: i / 4,
		}
		for s, n := range perSwitch {
			for range n {
				g.links = append(g.links, fakeLink{remoteBus: switches[s], remoteType: gonvml.NVLINK_DEVICE_TYPE_SWITCH})
			}
		}
		gpus[i] = g
	}
	return gpus
}
