package planner_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/planner"
)

// A Tracker's snapshot, after devices, usage and nodes changed one at a
// time, is the snapshot NewSnapshot takes of the same state, and the
// snapshots it handed out before stay as they were.
func TestTrackerSnapshotIsNewSnapshot(t *testing.T) {
	infos := twoLeaves().Allocatable(node8).Infos(t)
	c := mustCluster(t, infos)
	held := allocated().GPUs("l0n0", 0, 1).Obj()
	usage := onNodes(resources("cpu", "2"), "l0n0", "l1n1")
	tr := planner.NewTracker(c, held, usage)
	job := makeJob(t, "j").Pods(3, "gpu-4-nvlink").Request(resources("cpu", "3")).Strategy(planner.StrategyConsolidated).Obj()
	same := func(step string, snap *planner.Snapshot, c *planner.Cluster, held devicefit.Allocated, usage planner.NodeUsage) {
		t.Helper()
		want := planner.NewSnapshot(c, held, planner.WithUsed(usage))
		if diff := cmp.Diff(planner.Measure(want, nil), planner.Measure(snap, nil)); diff != "" {
			t.Errorf("%s: tracker's snapshot measures differently (-new +tracker):\n%s", step, diff)
		}
		if diff := cmp.Diff(snapPlan(t, want, job), snapPlan(t, snap, job)); diff != "" {
			t.Errorf("%s: tracker's snapshot plans differently (-new +tracker):\n%s", step, diff)
		}
	}
	first := tr.Snapshot(devicefit.State{})
	same("built", first, c, held.Clone(), cloneUsage(usage))
	firstHeld, firstUsage := held.Clone(), cloneUsage(usage)

	// Devices and pods come and go.
	for _, d := range allocated().GPUs("l0n1", 0, 1, 2, 3).GPUs("l1n0", 4).Obj().UnsortedList() {
		held.Insert(d)
		tr.SetDevice(d, true)
	}
	gone := allocated().GPUs("l0n0", 1).Obj().UnsortedList()[0]
	held.Delete(gone)
	tr.SetDevice(gone, false)
	usage.Add("l0n1", podRequesting("x", resources("cpu", "4")))
	tr.SetUsage("l0n1", usage["l0n1"])
	same("devices and usage changed", tr.Snapshot(devicefit.State{}), c, held, usage)
	same("the first snapshot", first, c, firstHeld, firstUsage)

	// A node goes, another comes into its slot with GPUs already held
	// by a claim, a third is tainted in place.
	c2, ok := c.WithoutNode("l0n1")
	if !ok {
		t.Fatal("WithoutNode refused")
	}
	extra := planner.NodeInfo{Name: "l1n7", Leaf: "leaf-1", Spine: "spine-0", Slices: nodeSlices(t, "l1n7", "dgx-h100", "leaf-1", "spine-0"), Allocatable: node8}
	c3, ok := c2.WithNewNode(extra)
	if !ok {
		t.Fatal("WithNewNode refused")
	}
	tainted := infos[3]
	tainted.Taints = append(tainted.Taints, parseTaint(maint))
	c4, ok := c3.WithNode(tainted)
	if !ok {
		t.Fatal("WithNode refused")
	}
	for _, d := range allocated().GPUs("l1n7", 0, 5).Obj().UnsortedList() {
		held.Insert(d)
	}
	usage.Add("l1n7", podRequesting("y", resources("cpu", "6")))
	tr.Rebase(c4, []string{"l0n1", "l1n7", tainted.Name}, held, usage)
	same("nodes changed", tr.Snapshot(devicefit.State{}), c4, held, usage)

	if w := tr.Work(); w.Builds != 1 {
		t.Errorf("%d builds; want 1: every change after the first is applied one by one", w.Builds)
	}
}

func snapPlan(t *testing.T, s *planner.Snapshot, job planner.Job) outcome {
	t.Helper()
	plan, err := newPlanner(t).Plan(context.Background(), s, nil, job)
	if err != nil {
		return outcome{Err: err.Error()}
	}
	return outcome{Placed: project(plan)}
}

func cloneUsage(u planner.NodeUsage) planner.NodeUsage {
	out := planner.NodeUsage{}
	for n, l := range u {
		out[n] = l.DeepCopy()
	}
	return out
}
