package slices_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/topology"
)

// The ladder templates of demo/specs take the best rung each node can give
// now, and fall back rather than fail.
func TestLadderTakesBestRungAvailable(t *testing.T) {
	for name, tc := range map[string]struct {
		template, profile string
		taken             []string // GPUs already allocated
		wantRung          string
	}{
		"4 on NVSwitch: a quad":                           {"gpu-4-ladder", "dgx-h100", nil, "nvlink"},
		"4 on a cube-mesh: a quad":                        {"gpu-4-ladder", "dgx1-v100", nil, "nvlink"},
		"4 on a GB200 tray: the tray":                     {"gpu-4-ladder", "gb200-nvl72-tray", nil, "nvlink"},
		"4 on bridged pairs: one NUMA node":               {"gpu-4-ladder", "hgx-pcie-pairs", nil, "numa"},
		"4 on PCIe only: one NUMA node":                   {"gpu-4-ladder", "pcie-only", nil, "numa"},
		"4 on NVSwitch with both quads broken: any":       {"gpu-4-ladder", "dgx-h100", []string{"gpu-1", "gpu-5"}, "any"},
		"2 on bridged pairs: a pair":                      {"gpu-2-ladder", "hgx-pcie-pairs", nil, "nvlink"},
		"2 on PCIe only: one root":                        {"gpu-2-ladder", "pcie-only", nil, "pcie-root"},
		"2 on PCIe only, one GPU left per root: one NUMA": {"gpu-2-ladder", "pcie-only", []string{"gpu-0", "gpu-2", "gpu-4", "gpu-6"}, "numa"},
		"2 on PCIe only, one GPU left per NUMA node: any": {"gpu-2-ladder", "pcie-only", []string{"gpu-0", "gpu-1", "gpu-2", "gpu-4", "gpu-5", "gpu-6"}, "any"},
		"8 on NVSwitch: a block of eight":                 {"gpu-8-ladder", "dgx-h100", nil, "nvlink"},
		"8 on a cube-mesh: one NVLink domain":             {"gpu-8-ladder", "dgx1-v100", nil, "nvlink-domain"},
		"8 on bridged pairs: any":                         {"gpu-8-ladder", "hgx-pcie-pairs", nil, "any"},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, tc.profile, nil)
			taken := devicefit.Allocated{}
			for _, d := range tc.taken {
				taken.Insert(devicefit.DeviceID(topology.DriverName, f.node.Name, d))
			}
			tmpl := loadSpec[resourceapi.ResourceClaimTemplate](t, "claims/"+tc.template+".yaml")
			claim := devicefit.ClaimFromTemplate(tmpl, "c")
			res, err := f.eval.Allocate(context.Background(), f.node, f.slices, taken, []*resourceapi.ResourceClaim{claim})
			if err != nil {
				t.Fatal(err)
			}
			if res == nil {
				t.Fatalf("%s does not fit on %s: a ladder must fall back to any GPUs", tc.template, tc.profile)
			}
			rungs := map[string]bool{}
			for _, r := range res[0].Devices.Results {
				rungs[strings.TrimPrefix(r.Request, "gpus/")] = true
			}
			if diff := cmp.Diff(map[string]bool{tc.wantRung: true}, rungs); diff != "" {
				t.Errorf("rungs (-want +got):\n%s", diff)
			}
		})
	}
}
