package planner_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gputopo/gputopo/pkg/planner"
)

// Nodes that are alike share allocator answers. Three leaves of
// hgx-pcie-pairs and one of dgx-h100:
//
//	                         spine-0
//	    +--------------+--------------+--------------+
//	  leaf-0         leaf-1         leaf-2         leaf-3
//	4 x pcie-pairs 4 x pcie-pairs 4 x pcie-pairs  4 x dgx-h100
//
// Quads fit only leaf-3. The twelve pcie nodes cost one allocator run, not
// twelve, and the four h100 nodes three (two quads, then no more).
func TestAlikeNodesShareAllocatorRuns(t *testing.T) {
	c := makeCluster().
		Leaf("spine-0", 0, "hgx-pcie-pairs", 4).Leaf("spine-0", 1, "hgx-pcie-pairs", 4).
		Leaf("spine-0", 2, "hgx-pcie-pairs", 4).Leaf("spine-0", 3, "dgx-h100", 4).Obj(t)
	plan, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, nil), nil, makeJob(t, "j").Pods(4, "gpu-4-nvlink").Obj())
	checkPlan(t, plan, err, &placed{Domain: leaf("leaf-3"), Assignments: assign("l3n0", "l3n1", "l3n2", "l3n3")}, nil)
	// 1 (pcie) + 3 (h100) + 4 final checks.
	if plan.AllocatorRuns > 8 {
		t.Errorf("%d allocator runs, want at most 8", plan.AllocatorRuns)
	}
}

// A claim whose selector reads the leaf attribute must not share answers
// between nodes of different leaves, however alike they are otherwise.
//
//	       spine-0
//	  +------+-------+
//	leaf-0         leaf-1
//	 l0n0        l1n0, l1n1      (dgx-h100)
func TestClaimsReadingALeafDoNotShare(t *testing.T) {
	c := makeCluster().Leaf("spine-0", 0, "dgx-h100", 1).Leaf("spine-0", 1, "dgx-h100", 2).Obj(t)
	p := newPlanner(t)
	none := func(n int) planner.Job {
		return makeJob(t, "j").Pods(n, "gpu-4-leaf").Placement(planner.PlacementNone).Strategy(planner.StrategyDistributed).Obj()
	}
	plan, err := p.Plan(context.Background(), planner.NewSnapshot(c, nil), nil, none(2))
	checkPlan(t, plan, err, &placed{Domain: planner.Domain{Level: planner.LevelCluster}, Assignments: assign("l0n0", "l0n0")}, nil)

	_, err = p.Plan(context.Background(), planner.NewSnapshot(c, nil), nil, none(3))
	checkPlan(t, nil, err, nil, &planner.Unschedulable{Job: "j", Reason: "the whole cluster cannot hold 3 pods (4 GPUs each), not even when empty",
		Best: "the whole cluster holds 2 (1 node with room for a pod)", BestDomain: planner.Domain{Level: planner.LevelCluster}, BestPods: 2})
}

// A size that failed is not searched for the domain that comes closest
// when a larger size places the job: that search costs allocator runs on
// every domain of the size. A refused job still gets it.
//
//	            spine-0
//	  +-------+-------+-------+
//	leaf-0  leaf-1  leaf-2  leaf-3     3 x dgx-h100 each
func TestFailedSizeSearchedOnlyWhenRefused(t *testing.T) {
	c := makeCluster().
		Leaf("spine-0", 0, "dgx-h100", 3).Leaf("spine-0", 1, "dgx-h100", 3).
		Leaf("spine-0", 2, "dgx-h100", 3).Leaf("spine-0", 3, "dgx-h100", 3).Obj(t)
	for name, tc := range map[string]struct {
		pods     int
		used     *usage
		line     string
		bestPods int
	}{
		"too small": {pods: 4, used: allocated(), line: "no leaf can hold 4 pods (8 GPUs each), not even when empty", bestPods: 3},
		// Every leaf could hold the job empty, but one node of each is busy.
		"busy": {pods: 3, used: allocated().Nodes("l0n0", "l1n0", "l2n0", "l3n0"), line: "no leaf can hold 3 pods (8 GPUs each)", bestPods: 2},
	} {
		t.Run(name, func(t *testing.T) {
			snap := planner.NewSnapshot(c, tc.used.Obj())
			p := newPlanner(t)
			job := func(pl planner.Placement) planner.Job {
				return makeJob(t, "j").Pods(tc.pods, "gpu-8-node").Placement(pl).Obj()
			}
			plan, err := p.Plan(context.Background(), snap, nil, job(planner.PlacementAuto))
			if err != nil {
				t.Fatal(err)
			}
			found := false
			for _, r := range plan.Reasons {
				if r == tc.line {
					found = true
				}
				if strings.HasPrefix(r, tc.line) && strings.Contains(r, "best:") {
					t.Errorf("placed job: the leaf size was searched for its closest leaf: %q", r)
				}
			}
			if !found {
				t.Errorf("no reason is %q:\n%s", tc.line, strings.Join(plan.Reasons, "\n"))
			}

			_, err = p.Plan(context.Background(), snap, nil, job(planner.PlacementSameLeaf))
			var u *planner.Unschedulable
			if !errors.As(err, &u) {
				t.Fatalf("same-leaf: got %v, want Unschedulable", err)
			}
			if u.Reason != tc.line || u.BestPods != tc.bestPods || !strings.HasPrefix(u.Best, "leaf leaf-") {
				t.Errorf("refusal: reason %q, best %q (%d pods), want %q and a leaf holding %d", u.Reason, u.Best, u.BestPods, tc.line, tc.bestPods)
			}
		})
	}
}
