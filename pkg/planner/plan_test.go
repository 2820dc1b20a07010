package planner_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/planner"
)

// fourLeaves is the topology most cases use:
//
//	                       spine-0
//	    +------------+------------+------------+
//	  leaf-0       leaf-1       leaf-2       leaf-3
//	l0n0..l0n3   l1n0..l1n3   l2n0..l2n3   l3n0..l3n3
//
// Every node is a dgx-h100: 8 GPUs on NVSwitch, two aligned NVLink quads.
func fourLeaves() *clusterBuilder { return makeCluster().Spines(1, 4, 4, "dgx-h100") }

// twoSpines:
//
//	         spine-0                         spine-1
//	    +------+------+                 +------+------+
//	  leaf-0        leaf-1            leaf-2        leaf-3
//	l0n0,l0n1     l1n0,l1n1         l2n0,l2n1     l3n0,l3n1
func twoSpines() *clusterBuilder { return makeCluster().Spines(2, 2, 2, "dgx-h100") }

func TestPlan(t *testing.T) {
	tests := map[string]struct {
		cluster   *clusterBuilder
		allocated *usage
		job       func(t testing.TB) planner.Job
		want      *placed
		wantErr   *planner.Unschedulable
		// wantReason is a fragment of one Reasons line, for the cases
		// whose point is the explanation.
		wantReason string
	}{
		"2-pod job lands in one leaf": {
			cluster: fourLeaves(),
			job:     func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(2, "gpu-8-node").Obj() },
			want:    &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n1")},
		},
		"4 pods of 8 GPUs take a complete leaf": {
			cluster:   fourLeaves(),
			allocated: allocated().GPUs("l0n2", 0),
			job:       func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(4, "gpu-8-node").Obj() },
			want:      &placed{Domain: leaf("leaf-1"), Assignments: assign("l1n0", "l1n1", "l1n2", "l1n3")},
		},
		// leaf-1 has one GPU in use, so leaf-0 and leaf-3 are the free
		// leaves with the fewest GPUs, but they are not adjacent.
		"8-pod job takes two adjacent leaves": {
			cluster:   fourLeaves(),
			allocated: allocated().GPUs("l1n0", 0),
			job:       func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(8, "gpu-8-node").Obj() },
			want: &placed{Domain: leaves("leaf-2", "leaf-3"),
				Assignments: assign("l2n0", "l2n1", "l2n2", "l2n3", "l3n0", "l3n1", "l3n2", "l3n3")},
		},
		"16-pod job takes the whole spine": {
			cluster: fourLeaves(),
			job:     func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(16, "gpu-8-node").Obj() },
			want: &placed{Domain: planner.Domain{Level: planner.LevelSpine, Names: []string{"spine-0"}}, Assignments: assign(
				"l0n0", "l0n1", "l0n2", "l0n3", "l1n0", "l1n1", "l1n2", "l1n3", "l2n0", "l2n1", "l2n2", "l2n3", "l3n0", "l3n1", "l3n2", "l3n3")},
		},
		"best fit picks the partly used leaf": {
			cluster:   fourLeaves(),
			allocated: allocated().Nodes("l2n0", "l2n1"),
			job:       func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(2, "gpu-8-node").Obj() },
			want:      &placed{Domain: leaf("leaf-2"), Assignments: assign("l2n2", "l2n3")},
		},
		// Nodes alike but for their leaf attribute, which the claim
		// selects on: an answer for one leaf is no answer for another,
		// though the partly used leaf-2 is the best fit otherwise.
		"a leaf chosen in CEL is the leaf the pods get": {
			cluster:   fourLeaves(),
			allocated: allocated().Nodes("l2n0"),
			job:       func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(3, "gpu-4-leaf").Obj() },
			want:      &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n1", "l0n2")},
		},
		"one pod goes to the fullest node that fits": {
			cluster:   fourLeaves(),
			allocated: allocated().GPUs("l3n1", 0, 1, 2, 3).GPUs("l1n2", 0, 1, 2, 3, 4, 5),
			job:       func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(1, "gpu-4-nvlink").Obj() },
			want:      &placed{Domain: planner.Domain{Level: planner.LevelNode, Names: []string{"l3n1"}}, Assignments: assign("l3n1")},
		},
		"preferred leaf is honoured over the best fit": {
			cluster:   fourLeaves(),
			allocated: allocated().Nodes("l2n0", "l2n1"),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(2, "gpu-8-node").Prefer("leaf-3", false).Obj()
			},
			want: &placed{Domain: leaf("leaf-3"), Assignments: assign("l3n0", "l3n1")},
		},
		"full preferred leaf falls back with the reason": {
			cluster:   fourLeaves(),
			allocated: allocated().Nodes("l2n0", "l2n1", "l3n0", "l3n1", "l3n2"),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(2, "gpu-8-node").Prefer("leaf-3", false).Obj()
			},
			want:       &placed{Domain: leaf("leaf-2"), Assignments: assign("l2n2", "l2n3"), Fallback: true},
			wantReason: "preferred leaf leaf-3 cannot hold 2 pods: only 1 fit, on 1 node with room for a pod (8 GPUs each); falling back",
		},
		"required preferred leaf refuses": {
			cluster:   fourLeaves(),
			allocated: allocated().Nodes("l3n0", "l3n1", "l3n2"),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(2, "gpu-8-node").Prefer("leaf-3", true).Obj()
			},
			wantErr: &planner.Unschedulable{Job: "j",
				Reason:     "preferred leaf leaf-3 cannot hold 2 pods: only 1 fit, on 1 node with room for a pod (8 GPUs each)",
				Best:       "leaf leaf-3 holds 1 (1 node with room for a pod)",
				BestDomain: leaf("leaf-3"), BestPods: 1},
		},
		"preferred spine": {
			cluster: twoSpines(),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(2, "gpu-8-node").Prefer("spine-1", false).Obj()
			},
			want: &placed{Domain: leaf("leaf-2"), Assignments: assign("l2n0", "l2n1")},
		},
		"unknown preferred domain is ignored with a fallback": {
			cluster: twoSpines(),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(2, "gpu-8-node").Prefer("leaf-9", false).Obj()
			},
			want:       &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n1"), Fallback: true},
			wantReason: "preferred domain leaf-9 is neither a leaf nor a spine of the cluster; ignoring it",
		},
		"job beyond a spine spans adjacent spines as a last resort": {
			cluster: makeCluster().Spines(3, 1, 2, "dgx-h100"),
			job:     func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(4, "gpu-8-node").Obj() },
			want: &placed{Domain: planner.Domain{Level: planner.LevelCluster, Names: []string{"spine-0", "spine-1"}},
				Assignments: assign("l0n0", "l0n1", "l1n0", "l1n1")},
			wantReason: "last resort: spines spine-0,spine-1",
		},
		"job that cannot fit gets the best candidate": {
			cluster:   fourLeaves(),
			allocated: allocated().Nodes("l0n0", "l0n1", "l1n0", "l1n1", "l2n0", "l3n0", "l3n1"),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(4, "gpu-8-node").Placement(planner.PlacementSameLeaf).Obj()
			},
			wantErr: &planner.Unschedulable{Job: "j",
				Reason:     "no leaf can hold 4 pods (8 GPUs each)",
				Best:       "leaf leaf-2 holds 3 (3 nodes with room for a pod)",
				BestDomain: leaf("leaf-2"), BestPods: 3},
		},
		"same-spine keeps the job under one spine": {
			cluster:   twoSpines(),
			allocated: allocated().Nodes("l0n0"),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(3, "gpu-8-node").Placement(planner.PlacementSameSpine).Obj()
			},
			want: &placed{Domain: planner.Domain{Level: planner.LevelSpine, Names: []string{"spine-0"}},
				Assignments: assign("l0n1", "l1n0", "l1n1")},
		},
		"placement none fills the cluster like the scheduler": {
			cluster:   twoSpines(),
			allocated: allocated().GPUs("l3n1", 0, 1, 2, 3),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(2, "gpu-4-nvlink").Placement(planner.PlacementNone).Strategy(planner.StrategyConsolidated).Obj()
			},
			want: &placed{Domain: planner.Domain{Level: planner.LevelCluster}, Assignments: assign("l3n1", "l0n0")},
		},
		"adjacent-leaves follows the given leaf order": {
			cluster:   fourLeaves().Order("spine-0", "leaf-3", "leaf-0", "leaf-2", "leaf-1"),
			allocated: allocated().GPUs("l2n0", 0),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(8, "gpu-8-node").Placement(planner.PlacementAdjacentLeaves).Obj()
			},
			want: &placed{Domain: leaves("leaf-3", "leaf-0"),
				Assignments: assign("l3n0", "l3n1", "l3n2", "l3n3", "l0n0", "l0n1", "l0n2", "l0n3")},
		},
	}
	for name, tc := range tests {
		// Every case again on slices packed as the controller caches
		// them (pkg/slicepack): the plans must not change.
		for _, packed := range []bool{false, true} {
			if packed {
				name += "/packed"
			}
			t.Run(name, func(t *testing.T) {
				c := tc.cluster.Obj(t)
				if packed {
					c = tc.cluster.PackedObj(t)
				}
				alloc := devicefit.Allocated{}
				if tc.allocated != nil {
					alloc = tc.allocated.Obj()
				}
				plan, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, alloc), nil, tc.job(t))
				checkPlan(t, plan, err, tc.want, tc.wantErr)
				if tc.wantReason != "" && plan != nil && !hasReason(plan.Reasons, tc.wantReason) {
					t.Errorf("no reason contains %q:\n%s", tc.wantReason, strings.Join(plan.Reasons, "\n"))
				}
			})
		}
	}
}

func checkPlan(t *testing.T, plan *planner.Plan, err error, want *placed, wantErr *planner.Unschedulable) {
	t.Helper()
	if wantErr != nil {
		var got *planner.Unschedulable
		if !errors.As(err, &got) {
			t.Fatalf("want Unschedulable, got plan %+v, error %v", project(plan), err)
		}
		got.Details = nil
		if diff := cmp.Diff(wantErr, got); diff != "" {
			t.Errorf("refusal (-want +got):\n%s", diff)
		}
		return
	}
	if err != nil {
		t.Fatalf("Plan: %v", err)
	}
	if diff := cmp.Diff(want, project(plan)); diff != "" {
		t.Errorf("plan (-want +got):\n%s\nreasons:\n%s", diff, strings.Join(plan.Reasons, "\n"))
	}
	for pod, node := range plan.Assignments {
		if len(plan.Allocations[pod]) != 1 {
			t.Errorf("pod %s on %s has %d allocation results, want 1", pod, node, len(plan.Allocations[pod]))
		}
	}
}

func hasReason(reasons []string, fragment string) bool {
	for _, r := range reasons {
		if strings.Contains(r, fragment) {
			return true
		}
	}
	return false
}
