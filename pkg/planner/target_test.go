package planner_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/gputopo/gputopo/pkg/planner"
)

// A job that waits holds only nodes its claims could ever use, and holds
// nothing when no domain could hold it even empty: counting GPUs is not
// enough when the claims' selectors rule devices out (here gpu-4-leaf's
// CEL keeps every pod in leaf-0, whose one node holds two of them).
//
//	       spine-0
//	  +------+-------+
//	leaf-0         leaf-1
//	 l0n0        l1n0, l1n1      (dgx-h100)
func TestTargetHoldsOnlyNodesTheClaimsCanUse(t *testing.T) {
	c := makeCluster().Leaf("spine-0", 0, "dgx-h100", 1).Leaf("spine-0", 1, "dgx-h100", 2).Obj(t)
	job := func(n int) planner.Job {
		return makeJob(t, "j").Pods(n, "gpu-4-leaf").Placement(planner.PlacementNone).Obj()
	}
	// l0n0 busy: the nodes with the most GPUs free now are leaf-1's,
	// which the claims cannot use.
	snap := planner.NewSnapshot(c, allocated().Nodes("l0n0").Obj())
	hold, err := newPlanner(t).Target(context.Background(), snap, job(2))
	if err != nil {
		t.Fatalf("Target for 2 pods: %v", err)
	}
	if !slices.Equal(hold.Nodes, []string{"l0n0"}) {
		t.Errorf("2 pods hold %v, want [l0n0]: leaf-1's GPUs never match the claims", hold.Nodes)
	}

	_, err = newPlanner(t).Target(context.Background(), snap, job(3))
	var u *planner.Unschedulable
	if !errors.As(err, &u) {
		t.Fatalf("Target for 3 pods: %v, want Unschedulable: only l0n0 matches and it holds two", err)
	}
}
