package planner_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/pkg/planner"
)

// The four-leaf cluster with:
//
//	leaf-0: l0n0 [########]  l0n1 [####....]  l0n2, l0n3 free
//	leaf-1: free
//	leaf-2: l2n0 [#.......]  l2n1..l2n3 free
//	leaf-3: one reserved GPU on l3n0
func TestMeasure(t *testing.T) {
	c := fourLeaves().Obj(t)
	snap := planner.NewSnapshot(c, allocated().Nodes("l0n0").GPUs("l0n1", 0, 1, 2, 3).GPUs("l2n0", 0).Obj())
	res := planner.NewReservations()
	if err := res.Add(planner.Reservation{Job: "r", Devices: map[string][]structuredID{"l3n0": {gpuID("l3n0", 5)}}}); err != nil {
		t.Fatal(err)
	}
	got := planner.Measure(snap, res)
	want := planner.Usage{
		Leaves: []planner.LeafUsage{
			{Spine: "spine-0", Leaf: "leaf-0", Nodes: 4, GPUs: 32, Used: 12, Free: 20, FreeNodes: 2, Utilization: 12.0 / 32},
			{Spine: "spine-0", Leaf: "leaf-1", Nodes: 4, GPUs: 32, Free: 32, FreeNodes: 4},
			{Spine: "spine-0", Leaf: "leaf-2", Nodes: 4, GPUs: 32, Used: 1, Free: 31, FreeNodes: 3, Utilization: 1.0 / 32},
			{Spine: "spine-0", Leaf: "leaf-3", Nodes: 4, GPUs: 32, Used: 1, Free: 31, FreeNodes: 3, Utilization: 1.0 / 32},
		},
		GPUs: 128, Used: 14, Free: 114, Utilization: 14.0 / 128,
		// l0n1 strands 4 free GPUs, l2n0 and l3n0 7 each.
		Fragmentation: 18.0 / 114,
		// Of 12 completely free nodes only leaf-1's 4 make a free leaf.
		LeafFragmentation: 8.0 / 12,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("usage (-want +got):\n%s", diff)
	}
}
