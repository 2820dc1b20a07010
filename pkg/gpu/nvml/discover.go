package nvml

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gputopo/gputopo/pkg/gpu"
)

// Discover implements gpu.Backend.
func (b *Backend) Discover(ctx context.Context) (*gpu.Inventory, error) {
	count, ret := b.lib.DeviceGetCount()
	if err := check(ret); err != nil {
		return nil, fmt.Errorf("count GPUs: %w", err)
	}
	driver, ret := b.lib.SystemGetDriverVersion()
	if err := check(ret); err != nil {
		return nil, fmt.Errorf("get driver version: %w", err)
	}
	cudaVersion, ret := b.lib.SystemGetCudaDriverVersion_v2()
	if err := check(ret); err != nil {
		return nil, fmt.Errorf("get CUDA driver version: %w", err)
	}

	inv := &gpu.Inventory{Devices: make([]gpu.Device, 0, max(count, 0)), DevRoot: "/dev"}
	handles := make([]gonvml.Device, 0, max(count, 0))
	for i := range count {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		h, ret := b.lib.DeviceGetHandleByIndex(i)
		if err := check(ret); err != nil {
			return nil, fmt.Errorf("get handle of GPU %d: %w", i, err)
		}
		d, err := describe(i, h)
		if err != nil {
			return nil, err
		}
		d.DriverVersion = driver
		d.CUDADriverVersion = formatCUDAVersion(cudaVersion)
		inv.Devices = append(inv.Devices, d)
		handles = append(handles, h)
	}

	links, err := linkGraph(inv.Devices, handles)
	if err != nil {
		return nil, err
	}
	inv.Links = links
	if len(links) > 0 {
		inv.LinkBandwidthGBps = laneBandwidthGBps(inv.Devices[links[0].A].Architecture)
	}
	return inv, nil
}

// describe reads the per-GPU facts; driver versions are node-wide and set by
// the caller.
func describe(i int, h gonvml.Device) (gpu.Device, error) {
	d := gpu.Device{Index: i, NUMANode: -1}
	var ret gonvml.Return

	if d.UUID, ret = h.GetUUID(); ret != gonvml.SUCCESS {
		return d, fmt.Errorf("get UUID of GPU %d: %w", i, ret)
	}
	if d.ProductName, ret = h.GetName(); ret != gonvml.SUCCESS {
		return d, fmt.Errorf("get name of GPU %d: %w", i, ret)
	}
	arch, ret := h.GetArchitecture()
	switch err := check(ret); {
	case err == nil:
		d.Architecture = architectureName(arch)
	case unsupported(err):
		d.Architecture = "unknown"
	default:
		return d, fmt.Errorf("get architecture of GPU %d: %w", i, err)
	}
	major, minor, ret := h.GetCudaComputeCapability()
	if err := check(ret); err != nil {
		return d, fmt.Errorf("get CUDA compute capability of GPU %d: %w", i, err)
	}
	d.CUDAComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	mem, ret := h.GetMemoryInfo()
	if err := check(ret); err != nil {
		return d, fmt.Errorf("get memory info of GPU %d: %w", i, err)
	}
	d.MemoryBytes = int64(min(mem.Total, math.MaxInt64))
	if d.Minor, ret = h.GetMinorNumber(); ret != gonvml.SUCCESS {
		return d, fmt.Errorf("get minor number of GPU %d: %w", i, ret)
	}
	pci, ret := h.GetPciInfo()
	if err := check(ret); err != nil {
		return d, fmt.Errorf("get PCI info of GPU %d: %w", i, err)
	}
	d.PCIBusID = pciBusID(pci)
	// Single-socket hosts and VMs commonly have no NUMA affinity to report;
	// -1 is the documented "none" value rather than a discovery failure.
	if numa, ret := h.GetNumaNodeId(); ret == gonvml.SUCCESS && numa >= 0 {
		d.NUMANode = numa
	}
	fabric, err := fabricOf(h)
	if err != nil {
		return d, fmt.Errorf("get fabric info of GPU %d: %w", i, err)
	}
	d.Fabric = fabric
	return d, nil
}

// fabricOf uses the v1 GetGpuFabricInfo rather than GetGpuFabricInfoV: the
// latter returns a handler bound to the concrete NVML device type, which
// cannot be mocked, and the v1 fields are all this needs.
func fabricOf(h gonvml.Device) (*gpu.Fabric, error) {
	info, ret := h.GetGpuFabricInfo()
	if err := check(ret); err != nil {
		if unsupported(err) {
			return nil, nil
		}
		return nil, err
	}
	// Until registration with the fabric manager completes, the clique is
	// not final; publishing it would let claims span GPUs that cannot talk.
	if info.State != gonvml.GPU_FABRIC_STATE_COMPLETED || gonvml.Return(info.Status) != gonvml.SUCCESS {
		return nil, nil
	}
	if info.ClusterUuid == ([16]uint8{}) {
		return nil, nil
	}
	return &gpu.Fabric{ClusterUUID: formatUUID(info.ClusterUuid), CliqueID: info.CliqueId}, nil
}

func formatUUID(b [16]uint8) string {
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func architectureName(a gonvml.DeviceArchitecture) string {
	switch a {
	case gonvml.DEVICE_ARCH_KEPLER:
		return "kepler"
	case gonvml.DEVICE_ARCH_MAXWELL:
		return "maxwell"
	case gonvml.DEVICE_ARCH_PASCAL:
		return "pascal"
	case gonvml.DEVICE_ARCH_VOLTA:
		return "volta"
	case gonvml.DEVICE_ARCH_TURING:
		return "turing"
	case gonvml.DEVICE_ARCH_AMPERE:
		return "ampere"
	case gonvml.DEVICE_ARCH_ADA:
		return "ada"
	case gonvml.DEVICE_ARCH_HOPPER:
		return "hopper"
	case gonvml.DEVICE_ARCH_BLACKWELL:
		return "blackwell"
	default:
		return "unknown"
	}
}

// formatCUDAVersion turns NVML's 1000*major + 10*minor (12040) into "12.4".
func formatCUDAVersion(v int) string {
	if v <= 0 {
		return ""
	}
	return fmt.Sprintf("%d.%d", v/1000, (v%1000)/10)
}

// pciBusID prefers NVML's bus ID string and falls back to the numeric fields
// (function 0: GPUs are single-function for our purposes) when it is empty.
func pciBusID(p gonvml.PciInfo) string {
	s := cString(p.BusId[:])
	if s == "" {
		s = cString(p.BusIdLegacy[:])
	}
	if s == "" {
		return fmt.Sprintf("%04x:%02x:%02x.0", p.Domain, p.Bus, p.Device)
	}
	return normaliseBusID(s)
}

func cString(b []uint8) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// normaliseBusID maps NVML's "00000000:18:00.0" to the sysfs spelling
// "0000:18:00.0" so that bus IDs compare equal to those read from /sys.
// Domains wider than 16 bits (some hypervisors) keep their significant
// digits; IDs without a domain get domain 0.
func normaliseBusID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	domain, rest, ok := strings.Cut(s, ":")
	if !ok {
		return s
	}
	if !strings.Contains(rest, ":") {
		return "0000:" + s
	}
	n, err := strconv.ParseUint(domain, 16, 64)
	if err != nil {
		return s
	}
	return fmt.Sprintf("%04x:%s", n, rest)
}
