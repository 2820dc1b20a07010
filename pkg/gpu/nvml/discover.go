package nvml

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/gpu"
)

// Reasons a GPU is left out of the inventory (gpu.Skipped.Reason).
const (
	SkipMIGEnabled    = "MIG-ENABLED"
	SkipGPULost       = "GPU-LOST"
	SkipDiscoverError = "DISCOVERY-ERROR"
)

// NVML functions newer than the oldest driver gputopo runs on. go-nvml
// resolves symbols lazily, so calling one the driver lacks ends the
// process; each is looked up before its first use.
const (
	symArchitecture     = "nvmlDeviceGetArchitecture"
	symCUDAVersion      = "nvmlSystemGetCudaDriverVersion_v2"
	symRemoteDeviceType = "nvmlDeviceGetNvLinkRemoteDeviceType"
	symFabricInfo       = "nvmlDeviceGetGpuFabricInfo"
	symMIGMode          = "nvmlDeviceGetMigMode"
)

// Discover implements gpu.Backend. A GPU that cannot be described (lost,
// failing queries, MIG mode) is listed in Skipped and the others are
// published; a link that cannot be read is left out of the graph. Only a
// failure that says nothing about any GPU can be read fails discovery.
func (b *Backend) Discover(ctx context.Context) (*gpu.Inventory, error) {
	logger := klog.FromContext(ctx)
	count, ret := b.lib.DeviceGetCount()
	if err := check(ret); err != nil {
		if errors.Is(err, gonvml.ERROR_LIB_RM_VERSION_MISMATCH) || errors.Is(err, gonvml.ERROR_DRIVER_NOT_LOADED) {
			return nil, fmt.Errorf("count GPUs: %w: %w", gpu.ErrDriverReloaded, err)
		}
		return nil, fmt.Errorf("count GPUs: %w", err)
	}
	driver, ret := b.lib.SystemGetDriverVersion()
	if err := check(ret); err != nil {
		return nil, fmt.Errorf("get driver version: %w", err)
	}
	var cudaVersion string
	if b.has(symCUDAVersion) {
		if v, ret := b.lib.SystemGetCudaDriverVersion_v2(); ret == gonvml.SUCCESS {
			cudaVersion = formatCUDAVersion(v)
		} else {
			logger.Info("CUDA driver version unknown", "err", ret)
		}
	}

	inv := &gpu.Inventory{Devices: make([]gpu.Device, 0, max(count, 0)), SysFS: b.sysfs}
	handles := make([]gonvml.Device, 0, max(count, 0))
	for i := range count {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		h, ret := b.lib.DeviceGetHandleByIndex(i)
		var d gpu.Device
		err := check(ret)
		if err != nil {
			err = fmt.Errorf("get handle of GPU %d: %w", i, err)
		} else {
			d, err = b.describe(i, h)
		}
		if err != nil {
			s := gpu.Skipped{Index: i, UUID: d.UUID, Reason: skipReason(err), Message: err.Error()}
			logger.Error(err, "GPU not published", "index", i, "uuid", d.UUID, "reason", s.Reason)
			inv.Skipped = append(inv.Skipped, s)
			continue
		}
		d.DriverVersion = driver
		d.CUDADriverVersion = cudaVersion
		inv.Devices = append(inv.Devices, d)
		handles = append(handles, h)
	}

	links, counts := b.linkGraph(ctx, inv.Devices, handles)
	inv.Links = links
	for i := range inv.Devices {
		inv.Devices[i].NVLinks = counts[i]
	}
	if len(links) > 0 {
		inv.LinkBandwidthGBps = laneBandwidthGBps(inv.Devices[0].Architecture)
	}
	return inv, nil
}

// migEnabledError marks a GPU in MIG mode: CUDA sees its MIG devices, not
// the GPU, so publishing it whole would hand out a GPU a pod cannot use.
type migEnabledError struct{ index int }

func (e *migEnabledError) Error() string {
	return fmt.Sprintf("GPU %d has MIG mode enabled; gputopo publishes whole GPUs only: disable MIG (nvidia-smi -i %d -mig 0) to publish it", e.index, e.index)
}

func skipReason(err error) string {
	var mig *migEnabledError
	switch {
	case errors.As(err, &mig):
		return SkipMIGEnabled
	case errors.Is(err, gonvml.ERROR_GPU_IS_LOST):
		return SkipGPULost
	default:
		return SkipDiscoverError
	}
}

// describe reads the per-GPU facts; driver versions are node-wide and set by
// the caller. The UUID is set on the returned device as soon as it is known,
// even on error, so a skipped GPU can be named.
func (b *Backend) describe(i int, h gonvml.Device) (gpu.Device, error) {
	d := gpu.Device{Index: i, NUMANode: -1}
	var ret gonvml.Return

	if d.UUID, ret = h.GetUUID(); ret != gonvml.SUCCESS {
		return d, fmt.Errorf("get UUID of GPU %d: %w", i, ret)
	}
	if b.has(symMIGMode) {
		current, _, ret := h.GetMigMode()
		if ret == gonvml.SUCCESS && current == gonvml.DEVICE_MIG_ENABLE {
			return d, &migEnabledError{index: i}
		}
	}
	if d.ProductName, ret = h.GetName(); ret != gonvml.SUCCESS {
		return d, fmt.Errorf("get name of GPU %d: %w", i, ret)
	}
	d.Architecture = "unknown"
	if b.has(symArchitecture) {
		arch, ret := h.GetArchitecture()
		switch err := check(ret); {
		case err == nil:
			d.Architecture = architectureName(arch)
		case !unsupported(err):
			return d, fmt.Errorf("get architecture of GPU %d: %w", i, err)
		}
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
	d.NUMANode = b.numaNode(d.PCIBusID)
	if b.has(symFabricInfo) {
		fabric, pending, unready, err := fabricOf(h)
		if err != nil {
			return d, fmt.Errorf("get fabric info of GPU %d: %w", i, err)
		}
		d.Fabric, d.FabricPending, d.FabricUnready = fabric, pending, unready
	}
	return d, nil
}

// numaNode reads the CPU NUMA node the GPU's PCI device is attached to from
// sysfs, as the standard attribute helper does. NVML's GetNumaNodeId is not
// used: it is NOT_SUPPORTED on x86 servers and on Grace names the GPU's own
// memory node rather than the CPU's. -1 when sysfs reports no affinity.
func (b *Backend) numaNode(busID string) int {
	var mods []deviceattribute.MachineModifier
	if b.sysfs != nil {
		mods = append(mods, deviceattribute.WithFS(b.sysfs))
	}
	attr, err := deviceattribute.GetNUMANodeAttributeByPCIBusID(busID, deviceattribute.ScalarAttribute, mods...)
	if err != nil || attr.Value.IntValue == nil {
		return -1
	}
	return int(*attr.Value.IntValue)
}

// fabricOf uses the v1 GetGpuFabricInfo rather than GetGpuFabricInfoV: the
// latter returns a handler bound to the concrete NVML device type, which
// cannot be mocked, and the v1 fields are all this needs. pending is true
// while registration with the fabric manager is still under way; unready
// says why CUDA cannot use the GPU meanwhile (CUDA fails with "system not
// yet initialized" until a GPU on an NVLink fabric is registered), or
// that its registration failed.
func fabricOf(h gonvml.Device) (fabric *gpu.Fabric, pending bool, unready *gpu.Condition, err error) {
	info, ret := h.GetGpuFabricInfo()
	if err := check(ret); err != nil {
		if unsupported(err) {
			return nil, false, nil, nil
		}
		return nil, false, nil, err
	}
	switch info.State {
	case gonvml.GPU_FABRIC_STATE_NOT_STARTED:
		// Until registration completes, the clique is not final;
		// publishing it would let claims span GPUs that cannot talk.
		return nil, true, &gpu.Condition{Reason: gpu.FabricNotStarted,
			Message: "NVLink fabric registration has not started: is nvidia-fabricmanager running on the node?"}, nil
	case gonvml.GPU_FABRIC_STATE_IN_PROGRESS:
		return nil, true, &gpu.Condition{Reason: gpu.FabricInProgress, Message: "NVLink fabric registration is in progress"}, nil
	case gonvml.GPU_FABRIC_STATE_COMPLETED:
	default:
		return nil, false, nil, nil
	}
	if st := gonvml.Return(info.Status); st != gonvml.SUCCESS {
		return nil, false, &gpu.Condition{Reason: gpu.FabricFailed,
			Message: fmt.Sprintf("NVLink fabric registration failed: %v; check the fabric manager's log", st)}, nil
	}
	if info.ClusterUuid == ([16]uint8{}) {
		return nil, false, nil, nil
	}
	return &gpu.Fabric{ClusterUUID: formatUUID(info.ClusterUuid), CliqueID: info.CliqueId}, false, nil, nil
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
