package planner_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/pkg/planner"
)

// Moving an allocator answer to an alike node gives the pod exactly what
// an allocator run of its own would: the same devices by position, its own
// pool and a node selector naming its own node. Every job is planned with
// and without moving, and the plans must be equal.
//
//	                 spine-0                                spine-1
//	  +--------+--------+--------+--------+          +--------+--------+
//	leaf-0   leaf-1   leaf-2   leaf-3   leaf-4     leaf-5   leaf-6
//	5 x dgx-h100 each, leaf-6: dgx1-v100; some GPUs of leaf-1 and leaf-5 held
func TestMovedAnswersEqualAllocatorRuns(t *testing.T) {
	b := makeCluster()
	for l := range 6 {
		spine := "spine-0"
		if l >= 5 {
			spine = "spine-1"
		}
		b.Leaf(spine, l, "dgx-h100", 5)
	}
	c := b.Leaf("spine-1", 6, "dgx1-v100", 5).Obj(t)
	used := allocated().GPUs("l1n0", 0, 1, 2, 3).GPUs("l1n1", 4, 5).GPUs("l1n2", 0).Nodes("l5n0", "l5n1").GPUs("l5n2", 6, 7).Obj()
	// moves: whether some pod is alone on a node alike to an earlier one's.
	jobs := map[string]struct {
		job   planner.Job
		moves bool
	}{
		"16 whole nodes":     {makeJob(t, "j").Pods(16, "gpu-8-node").Obj(), true},
		"quads":              {makeJob(t, "j").Pods(12, "gpu-4-nvlink").Obj(), true},
		"pairs, distributed": {makeJob(t, "j").Pods(10, "gpu-2-nvlink-pair").Strategy(planner.StrategyDistributed).Obj(), true},
		"leaf selector":      {makeJob(t, "j").Pods(6, "gpu-4-leaf").Placement(planner.PlacementNone).Obj(), true},
		"spine":              {makeJob(t, "j").Pods(8, "gpu-4-nvlink").Placement(planner.PlacementSameSpine).Prefer("spine:spine-1", false).Obj(), true},
		// Two or more pods on every node: each pod after the first sees
		// the devices of those before it, so each gets a run of its own.
		"mixed, consolidated": {makeJob(t, "j").Pods(4, "gpu-4-nvlink").Pods(6, "gpu-2-nvlink-pair").Strategy(planner.StrategyConsolidated).Obj(), false},
	}
	for name, tc := range jobs {
		job := tc.job
		t.Run(name, func(t *testing.T) {
			plan := func(move bool) *planner.Plan {
				defer planner.SetMoveAnswers(move)()
				p, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, used), nil, job)
				if err != nil {
					t.Fatalf("move %v: %v", move, err)
				}
				return p
			}
			moved, ran := plan(true), plan(false)
			if diff := cmp.Diff(ran.Allocations, moved.Allocations); diff != "" {
				t.Errorf("allocations with moved answers differ from the allocator's own (-own +moved):\n%s", diff)
			}
			if diff := cmp.Diff(ran.Assignments, moved.Assignments); diff != "" {
				t.Errorf("assignments differ (-own +moved):\n%s", diff)
			}
			if fewer := moved.AllocatorRuns < ran.AllocatorRuns; fewer != tc.moves {
				t.Errorf("allocator runs: %d with moved answers, %d without; want fewer: %v", moved.AllocatorRuns, ran.AllocatorRuns, tc.moves)
			}
			t.Logf("allocator runs: %d with moved answers, %d without", moved.AllocatorRuns, ran.AllocatorRuns)
		})
	}
}
