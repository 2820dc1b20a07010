package nvml

import (
	"errors"
	"fmt"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gputopo/gputopo/pkg/gpu"
)

// linkGraph builds the node's undirected NVLink graph.
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
func linkGraph(devs []gpu.Device, handles []gonvml.Device) ([]gpu.Link, error) {
	byBus := make(map[string]int, len(devs))
	for _, d := range devs {
		byBus[d.PCIBusID] = d.Index
	}
	n := len(devs)
	direct := make([][]int, n) // direct[i][j]: lanes i reports towards j
	for i := range direct {
		direct[i] = make([]int, n)
	}
	switchLanes := make([]int, n)

	for i, h := range handles {
		for link := range gonvml.NVLINK_MAX_LINKS {
			state, ret := h.GetNvLinkState(link)
			if err := check(ret); err != nil {
				// INVALID_ARGUMENT: this GPU has fewer than NVLINK_MAX_LINKS
				// links (V100 has 6, A100 12).
				if unsupported(err) || errors.Is(err, gonvml.ERROR_INVALID_ARGUMENT) {
					continue
				}
				return nil, fmt.Errorf("get NVLink %d state of GPU %d: %w", link, i, err)
			}
			if state != gonvml.FEATURE_ENABLED {
				continue
			}
			pci, ret := h.GetNvLinkRemotePciInfo(link)
			if err := check(ret); err != nil {
				return nil, fmt.Errorf("get NVLink %d remote PCI info of GPU %d: %w", link, i, err)
			}
			if j, ok := byBus[pciBusID(pci)]; ok {
				if j != i {
					direct[i][j]++
				}
				continue
			}
			toSwitch, err := remoteIsSwitch(h, link)
			if err != nil {
				return nil, fmt.Errorf("get NVLink %d remote device type of GPU %d: %w", link, i, err)
			}
			if toSwitch {
				switchLanes[i]++
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
				links = append(links, gpu.Link{A: a, B: b, Count: count})
			}
		}
	}
	return links, nil
}

func remoteIsSwitch(h gonvml.Device, link int) (bool, error) {
	typ, ret := h.GetNvLinkRemoteDeviceType(link)
	if err := check(ret); err != nil {
		if unsupported(err) {
			return true, nil
		}
		return false, err
	}
	return typ == gonvml.NVLINK_DEVICE_TYPE_SWITCH, nil
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
