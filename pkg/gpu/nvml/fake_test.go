package nvml

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

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
	// numa is what sysfs says (written as numa_node); NVML's own
	// GetNumaNodeId answers numaRet, which discovery must not need.
	numa    int
	numaRet gonvml.Return
	// mig enables MIG mode; lost makes every query after GetUUID answer
	// GPU_IS_LOST.
	mig    bool
	lost   bool
	fabric gonvml.GpuFabricInfo
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
	// remotePciRet, when set, is returned by GetNvLinkRemotePciInfo.
	remotePciRet gonvml.Return
	// computeMode is the mode the GPU starts in; SetComputeMode changes
	// it unless setModeRet is set, which it then returns.
	computeMode gonvml.ComputeMode
	setModeRet  gonvml.Return
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
	mode := g.computeMode
	d := &mock.Device{
		GetComputeModeFunc: func() (gonvml.ComputeMode, gonvml.Return) { return mode, gonvml.SUCCESS },
		SetComputeModeFunc: func(m gonvml.ComputeMode) gonvml.Return {
			if g.setModeRet != gonvml.SUCCESS {
				return g.setModeRet
			}
			mode = m
			return gonvml.SUCCESS
		},
		GetUUIDFunc: func() (string, gonvml.Return) { return fakeUUID(i), gonvml.SUCCESS },
		GetMigModeFunc: func() (int, int, gonvml.Return) {
			if g.mig {
				return gonvml.DEVICE_MIG_ENABLE, gonvml.DEVICE_MIG_ENABLE, gonvml.SUCCESS
			}
			return gonvml.DEVICE_MIG_DISABLE, gonvml.DEVICE_MIG_DISABLE, gonvml.SUCCESS
		},
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
			if g.remotePciRet != gonvml.SUCCESS {
				return gonvml.PciInfo{}, g.remotePciRet
			}
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
	if g.lost {
		loseDevice(d)
	}
	return d
}

// loseDevice makes d answer GPU_IS_LOST to everything but GetUUID, as a
// GPU that fell off the bus does.
func loseDevice(d *mock.Device) {
	lost := gonvml.ERROR_GPU_IS_LOST
	d.GetNameFunc = func() (string, gonvml.Return) { return "", lost }
	d.GetMigModeFunc = func() (int, int, gonvml.Return) { return 0, 0, lost }
	d.GetArchitectureFunc = func() (gonvml.DeviceArchitecture, gonvml.Return) { return 0, lost }
	d.GetMemoryInfoFunc = func() (gonvml.Memory, gonvml.Return) { return gonvml.Memory{}, lost }
	d.GetNvLinkStateFunc = func(int) (gonvml.EnableState, gonvml.Return) { return 0, lost }
}

// fakeSysFS is the /sys of gpus: each PCI device with its numa_node.
func fakeSysFS(gpus []fakeGPU) fstest.MapFS {
	sys := fstest.MapFS{}
	for _, g := range gpus {
		bus := normaliseBusID(g.busID)
		sys["bus/pci/devices/"+bus+"/numa_node"] = &fstest.MapFile{Data: []byte(strconv.Itoa(g.numa) + "\n")}
	}
	return sys
}

// withMissingSymbols makes lib's driver lack the named NVML functions:
// looking them up fails, and calling them fails the test.
func withMissingSymbols(t *testing.T, lib *mock.Interface, devs []*mock.Device, names ...string) {
	lib.ExtensionsFunc = func() gonvml.ExtendedInterface {
		return &mock.ExtendedInterface{LookupSymbolFunc: func(s string) error {
			for _, n := range names {
				if s == n {
					return fmt.Errorf("symbol %s not found", s)
				}
			}
			return nil
		}}
	}
	for _, n := range names {
		for _, d := range devs {
			fail := func() { t.Errorf("%s called although the driver lacks it", n) }
			switch n {
			case symFabricInfo:
				d.GetGpuFabricInfoFunc = func() (gonvml.GpuFabricInfo, gonvml.Return) {
					fail()
					return gonvml.GpuFabricInfo{}, gonvml.ERROR_FUNCTION_NOT_FOUND
				}
			case symMIGMode:
				d.GetMigModeFunc = func() (int, int, gonvml.Return) { fail(); return 0, 0, gonvml.ERROR_FUNCTION_NOT_FOUND }
			case symRemoteDeviceType:
				d.GetNvLinkRemoteDeviceTypeFunc = func(int) (gonvml.IntNvLinkDeviceType, gonvml.Return) {
					fail()
					return 0, gonvml.ERROR_FUNCTION_NOT_FOUND
				}
			case symArchitecture:
				d.GetArchitectureFunc = func() (gonvml.DeviceArchitecture, gonvml.Return) { fail(); return 0, gonvml.ERROR_FUNCTION_NOT_FOUND }
			default:
				if !strings.HasPrefix(n, "nvmlSystem") {
					t.Fatalf("withMissingSymbols: no fake for %s", n)
				}
			}
		}
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
		DeviceGetHandleByUUIDFunc: func(uuid string) (gonvml.Device, gonvml.Return) {
			for _, d := range devs {
				if u, _ := d.GetUUID(); u == uuid {
					return d, gonvml.SUCCESS
				}
			}
			return nil, gonvml.ERROR_NOT_FOUND
		},
		SystemGetDriverVersionFunc: func() (string, gonvml.Return) { return "550.54.15", gonvml.SUCCESS },
		SystemGetCudaDriverVersion_v2Func: func() (int, gonvml.Return) {
			return 12040, gonvml.SUCCESS
		},
		ExtensionsFunc: func() gonvml.ExtendedInterface {
			return &mock.ExtendedInterface{LookupSymbolFunc: func(string) error { return nil }}
		},
	}
}

func newFakeNode(gpus []fakeGPU) (*mock.Interface, []*mock.Device) {
	devs := make([]gonvml.Device, len(gpus))
	mocks := make([]*mock.Device, len(gpus))
	for i, g := range gpus {
		mocks[i] = newFakeDevice(i, g)
		devs[i] = mocks[i]
	}
	return newFakeLib(devs...), mocks
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
