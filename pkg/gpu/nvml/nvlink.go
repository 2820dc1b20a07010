package nvml

import (
	"context"
	"errors"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/gpu"
)

// linkGraph builds the node's undirected NVLink graph and each GPU's count
// of active links (to peers and to NVSwitches; lanes to CPUs do not count).
//
// Direct GPU-to-GPU lanes (DGX-1, HGX boards without switches, NVLink
// bridges) are counted per pair; a lane counts only when both ends report it,
// so a half-trained link does not advertise bandwidth it lacks.
//
// NVSwitch rule: a lane whose remote end is not a GPU of this node and whose
// remote device type is NVSWITCH (or unknown because the driver predates
// GetNvLinkRemoteDeviceType) is a switch lane. NVSwitch fabrics inside a node
// are non-blocking (DGX-2, DGX A100, DGX/HGX H100 and B200), so every pair of
// switch-attached GPUs a, b is joined with
// Count = min(switchLanes(a), switchLanes(b)): the lanes the pair can drive at
// once are bounded by the weaker end. Lanes to CPUs (IBM NPU) or to GPUs this
// process cannot see are ignored.
//
// A link that cannot be read is left out and logged; a GPU whose links
// cannot be read at all (lost) simply has none. Neither stops discovery.
func (b *Backend) linkGraph(ctx context.Context, devs []gpu.Device, handles []gonvml.Device) ([]gpu.Link, []int) {
	logger := klog.FromContext(ctx)
	byBus := make(map[string]int, len(devs))
	for i, d := range devs {
		byBus[d.PCIBusID] = i
	}
	n := len(devs)
	direct := make([][]int, n) // direct[i][j]: lanes i reports towards j
	for i := range direct {
		direct[i] = make([]int, n)
	}
	switchLanes := make([]int, n)
	counts := make([]int, n)
	typed := b.has(symRemoteDeviceType)

	for i, h := range handles {
		for link := range gonvml.NVLINK_MAX_LINKS {
			state, ret := h.GetNvLinkState(link)
			if err := check(ret); err != nil {
				// INVALID_ARGUMENT: this GPU has fewer than NVLINK_MAX_LINKS
				// links (V100 has 6, A100 12).
				if unsupported(err) || errors.Is(err, gonvml.ERROR_INVALID_ARGUMENT) {
					continue
				}
				logger.Error(err, "Cannot read NVLink state; ignoring the GPU's remaining links", "index", devs[i].Index, "uuid", devs[i].UUID, "link", link)
				break
			}
			if state != gonvml.FEATURE_ENABLED {
				continue
			}
			pci, ret := h.GetNvLinkRemotePciInfo(link)
			if err := check(ret); err != nil {
				logger.V(2).Info("Cannot read NVLink remote end; ignoring the link", "index", devs[i].Index, "link", link, "err", err)
				continue
			}
			if j, ok := byBus[pciBusID(pci)]; ok {
				if j != i {
					direct[i][j]++
					counts[i]++
				}
				continue
			}
			toSwitch := true
			if typed {
				typ, ret := h.GetNvLinkRemoteDeviceType(link)
				switch err := check(ret); {
				case err == nil:
					toSwitch = typ == gonvml.NVLINK_DEVICE_TYPE_SWITCH
				case !unsupported(err):
					logger.V(2).Info("Cannot read NVLink remote device type; ignoring the link", "index", devs[i].Index, "link", link, "err", err)
					toSwitch = false
				}
			}
			if toSwitch {
				switchLanes[i]++
				counts[i]++
			}
		}
	}

	var links []gpu.Link
	for a := range n {
		for b := a + 1; b < n; b++ {
			count := min(direct[a][b], direct[b][a])
			if switchLanes[a] > 0 && switchLanes[b] > 0 {
				count += min(switchLanes[a], switchLanes[b])
			}
			if count > 0 {
				links = append(links, gpu.Link{A: devs[a].Index, B: devs[b].Index, Count: count})
			}
		}
	}
	return links, counts
}

// laneBandwidthGBps is the unidirectional bandwidth of one NVLink lane, from
// NVIDIA's published per-generation figures: NVLink 1 (Pascal P100) 20 GB/s;
// NVLink 2 (Volta, Turing bridges) 25 GB/s; NVLink 3 (Ampere, 12 links =
// 600 GB/s bidirectional) 25 GB/s; NVLink 4 (Hopper, 18 links = 900 GB/s)
// 25 GB/s; NVLink 5 (Blackwell, 18 links = 1.8 TB/s) 50 GB/s. The
// architecture is used rather than GetNvLinkVersion because drivers disagree
// on whether that returns a version number or an nvmlNvlinkVersion_t.
func laneBandwidthGBps(arch string) float64 {
	switch arch {
	case "pascal":
		return 20
	case "blackwell":
		return 50
	default:
		// Volta through Hopper, and the conservative guess for anything newer
		// this table does not know yet.
		return 25
	}
}
