package planner_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gputopo/gputopo/pkg/planner"
)

// oneSpineTwoLeaves, with l0n0 half used and l0n1 three-quarters used:
//
//	                spine-0
//	         +---------+---------+
//	       leaf-0              leaf-1
//	l0n0 [####....]         l1n0 [........]
//	l0n1 [######..]         l1n1 [........]
//	l0n2 [........]         l1n2 [........]
//	l0n3 [........]         l1n3 [........]
//
// (dgx-h100 nodes; # is a GPU in use.)
func oneSpineTwoLeaves() (*clusterBuilder, *usage) {
	return makeCluster().Spines(1, 2, 4, "dgx-h100"), allocated().GPUs("l0n0", 0, 1, 2, 3).GPUs("l0n1", 0, 1, 2, 3, 4, 5)
}

// mixedQuads puts NVLink quads in only some nodes of leaf-1:
//
//	                         spine-0
//	         +------------------+------------------+
//	       leaf-0                                leaf-1
//	l0n0..l0n3 hgx-pcie-pairs        l1n0 dgx1-v100, l1n1 dgx-h100,
//	(NVLink pairs, no quad)          l1n2, l1n3 hgx-pcie-pairs
func mixedQuads() *clusterBuilder {
	return makeCluster().
		Leaf("spine-0", 0, "hgx-pcie-pairs", 4).
		LeafFrom("spine-0", 1, 0, "dgx1-v100", 1).
		LeafFrom("spine-0", 1, 1, "dgx-h100", 1).
		LeafFrom("spine-0", 1, 2, "hgx-pcie-pairs", 2)
}

func TestStrategies(t *testing.T) {
	cluster, used := oneSpineTwoLeaves()
	c := cluster.Obj(t)
	tests := map[string]struct {
		strategy planner.Strategy
		want     map[string]string
	}{
		// Fullest first: l0n1's two free GPUs, then l0n0's four.
		"consolidated packs the fullest nodes": {planner.StrategyConsolidated, assign("l0n1", "l0n1", "l0n0", "l0n0")},
		// One pod per node, the partly used nodes before empty ones.
		"balanced fills partly used nodes first": {planner.StrategyBalanced, assign("l0n1", "l0n0", "l0n2", "l0n3")},
		// One pod per node, alternating leaves.
		"distributed spreads across leaves": {planner.StrategyDistributed, assign("l0n1", "l1n0", "l0n0", "l1n1")},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			job := makeJob(t, "j").Pods(4, "gpu-1").Placement(planner.PlacementSameSpine).Strategy(tc.strategy).Obj()
			plan, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, used.Obj()), nil, job)
			spine0 := planner.Domain{Level: planner.LevelSpine, Names: []string{"spine-0"}}
			checkPlan(t, plan, err, &placed{Domain: spine0, Assignments: tc.want}, nil)
		})
	}
}

func TestNVLinkQuads(t *testing.T) {
	c := mixedQuads().Obj(t)
	tests := map[string]struct {
		job        func(t testing.TB) planner.Job
		want       *placed
		wantErr    *planner.Unschedulable
		wantReason string
	}{
		// leaf-0 has 32 free GPUs like leaf-1 and comes first by name, but
		// has no quad: only the v100 and h100 nodes of leaf-1 can serve.
		"quads only on nodes with a free quad": {
			job:  func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(4, "gpu-4-nvlink").Obj() },
			want: &placed{Domain: leaf("leaf-1"), Assignments: assign("l1n0", "l1n1", "l1n0", "l1n1")},
		},
		"distributed quads still avoid the pcie nodes": {
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(2, "gpu-4-nvlink").Strategy(planner.StrategyDistributed).Obj()
			},
			want: &placed{Domain: leaf("leaf-1"), Assignments: assign("l1n0", "l1n1")},
		},
		"preferred pcie leaf falls back with the reason": {
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(2, "gpu-4-nvlink").Prefer("leaf-0", false).Obj()
			},
			want:       &placed{Domain: leaf("leaf-1"), Assignments: assign("l1n0", "l1n1"), Fallback: true},
			wantReason: "preferred leaf leaf-0 cannot hold 2 pods: no node there has room for a pod (4 GPUs each)",
		},
		"pairs fit the pcie leaf": {
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(2, "gpu-2-nvlink-pair").Prefer("leaf-0", true).Obj()
			},
			want: &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n1")},
		},
		"five quads do not fit one leaf": {
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(5, "gpu-4-nvlink").Placement(planner.PlacementSameLeaf).Obj()
			},
			wantErr: &planner.Unschedulable{Job: "j", Reason: "no leaf can hold 5 pods (4 GPUs each), not even when empty",
				Best: "leaf leaf-1 holds 4 (2 nodes with room for a pod)", BestDomain: leaf("leaf-1"), BestPods: 4},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			plan, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, nil), nil, tc.job(t))
			checkPlan(t, plan, err, tc.want, tc.wantErr)
			if tc.wantReason != "" && plan != nil && !hasReason(plan.Reasons, tc.wantReason) {
				t.Errorf("no reason contains %q:\n%s", tc.wantReason, strings.Join(plan.Reasons, "\n"))
			}
		})
	}
}
