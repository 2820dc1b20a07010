package planner_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/pkg/planner"
)

// Inside the chosen domain a pod with a preference ladder goes to the node
// giving its claim the best rung, before the strategy's order: leaf-0 has
// a node of bridged pairs (l0n0: four GPUs share a NUMA node at best) and
// an NVSwitch node (l0n1: two free quads).
//
//	spine-0
//	└── leaf-0: l0n0 hgx-pcie-pairs, l0n1 dgx-h100
func TestPlanTakesBestRungInDomain(t *testing.T) {
	c := makeCluster().LeafFrom("spine-0", 0, 0, "hgx-pcie-pairs", 1).LeafFrom("spine-0", 0, 1, "dgx-h100", 1).Obj(t)
	for name, tc := range map[string]struct {
		used       *usage
		pods       int
		want       map[string]string
		wantRungs  map[string]string
		wantReason string
	}{
		// Balanced order alone would start on l0n0 and spread; both quads
		// of l0n1 are better rungs.
		"two pods: both NVLink quads": {
			used: allocated(), pods: 2,
			want:      assign("l0n1", "l0n1"),
			wantRungs: map[string]string{"p0": "gpus/nvlink", "p1": "gpus/nvlink"},
		},
		// One quad left: the third pod falls back to a NUMA node of l0n0
		// rather than wait.
		"three pods: two quads, then one NUMA node": {
			used: allocated(), pods: 3,
			want:      assign("l0n1", "l0n1", "l0n0"),
			wantRungs: map[string]string{"p0": "gpus/nvlink", "p1": "gpus/nvlink", "p2": "gpus/numa"},
		},
		// With l0n1's quads broken, a NUMA node of l0n0 beats "any four"
		// on l0n1.
		"quads broken: NUMA before any": {
			used: allocated().GPUs("l0n1", 1, 5), pods: 1,
			want:      assign("l0n0"),
			wantRungs: map[string]string{"p0": "gpus/numa"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			job := makeJob(t, "j").Pods(tc.pods, "gpu-4-ladder").Placement(planner.PlacementSameLeaf).Obj()
			plan, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, tc.used.Obj()), nil, job)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, plan.Assignments); diff != "" {
				t.Errorf("assignments (-want +got):\n%s", diff)
			}
			rungs := map[string]string{}
			for pod, results := range plan.Allocations {
				rungs[pod] = results[0].Devices.Results[0].Request
			}
			if diff := cmp.Diff(tc.wantRungs, rungs); diff != "" {
				t.Errorf("rungs (-want +got):\n%s", diff)
			}
		})
	}
}

// Among domains of one size, better rungs win over best fit: leaf-0 (bridged
// pairs, partly used) is the tighter fit, but only leaf-1 gives the two
// pods NVLink quads.
//
//	spine-0
//	├── leaf-0: l0n0 [##......], l0n1 [........]   hgx-pcie-pairs
//	└── leaf-1: l1n0 [........], l1n1 [........]   dgx-h100
func TestPlanPrefersDomainWithBetterRungs(t *testing.T) {
	c := makeCluster().Leaf("spine-0", 0, "hgx-pcie-pairs", 2).Leaf("spine-0", 1, "dgx-h100", 2).Obj(t)
	used := allocated().GPUs("l0n0", 0, 1)
	for name, tc := range map[string]struct {
		rungs int // of gpu-4-ladder's, from the last: 1 is "any four GPUs"
		want  planner.Domain
	}{
		"ladder: the leaf with quads":                  {4, leaf("leaf-1")},
		"only the last rung (any four): best fit wins": {1, leaf("leaf-0")},
	} {
		t.Run(name, func(t *testing.T) {
			job := makeJob(t, "j").Pods(2, "gpu-4-ladder").Placement(planner.PlacementSameLeaf).Obj()
			for _, p := range job.Pods {
				req := &p.Claims[0].Spec.Devices.Requests[0]
				req.FirstAvailable = req.FirstAvailable[len(req.FirstAvailable)-tc.rungs:]
				if tc.rungs == 1 {
					p.Claims[0].Spec.Devices.Constraints = nil
				}
			}
			plan, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, used.Obj()), nil, job)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, plan.Domain); diff != "" {
				t.Errorf("domain (-want +got):\n%s", diff)
			}
		})
	}
}
