package planner_test

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/planner"
)

// A tree that gained, lost or moved nodes through WithNewNode and
// WithoutNode plans exactly like a tree built from scratch with the same
// nodes, devices in use included, and the tree it came from plans as
// before.
func TestMembershipChangesPlanLikeNewCluster(t *testing.T) {
	three8 := makeJob(t, "j").Pods(3, "gpu-8-node").Obj()
	without := func(infos []planner.NodeInfo, names ...string) []planner.NodeInfo {
		return slices.DeleteFunc(slices.Clone(infos), func(n planner.NodeInfo) bool { return slices.Contains(names, n.Name) })
	}
	moved := func(t *testing.T, name, leaf string) planner.NodeInfo {
		return planner.NodeInfo{Name: name, Leaf: leaf, Spine: "spine-0", Slices: nodeSlices(t, name, "dgx-h100", leaf, "spine-0")}
	}
	remove := func(name string) func(*testing.T, *planner.Cluster) *planner.Cluster {
		return func(t *testing.T, c *planner.Cluster) *planner.Cluster {
			out, ok := c.WithoutNode(name)
			if !ok {
				t.Fatalf("WithoutNode(%s) refused", name)
			}
			return out
		}
	}
	add := func(in func(*testing.T) planner.NodeInfo) func(*testing.T, *planner.Cluster) *planner.Cluster {
		return func(t *testing.T, c *planner.Cluster) *planner.Cluster {
			out, ok := c.WithNewNode(in(t))
			if !ok {
				t.Fatalf("WithNewNode(%s) refused", in(t).Name)
			}
			return out
		}
	}
	full := twoLeaves().Infos(t) // leaf-0: l0n0..l0n2, leaf-1: l1n0..l1n2
	byName := func(name string) func(*testing.T) planner.NodeInfo {
		return func(*testing.T) planner.NodeInfo {
			return full[slices.IndexFunc(full, func(n planner.NodeInfo) bool { return n.Name == name })]
		}
	}
	tests := map[string]struct {
		start, end []planner.NodeInfo
		ops        []func(*testing.T, *planner.Cluster) *planner.Cluster
		used       devicefit.Allocated
		job        planner.Job
	}{
		// leaf-0 loses a node: the job moves to leaf-1.
		"node removed": {start: full, end: without(full, "l0n1"), ops: ops(remove("l0n1")), job: three8},
		// leaf-0 gets its third node: the job fits there.
		"node added": {start: without(full, "l0n2"), end: full, ops: ops(add(byName("l0n2"))), job: three8},
		// The added node's devices are found in the snapshot: its GPUs in
		// use keep the job off leaf-0.
		"added node's devices in use": {start: without(full, "l0n2"), end: full,
			ops: ops(add(byName("l0n2"))), used: allocated().GPUs("l0n2", 3).Obj(), job: three8},
		// l0n0 moves to leaf-1, which then has four nodes and is the best fit.
		"node moved to another leaf": {start: full, end: append(without(full, "l0n0"), moved(t, "l0n0", "leaf-1")),
			ops: ops(remove("l0n0"), add(func(t *testing.T) planner.NodeInfo { return moved(t, "l0n0", "leaf-1") })), job: three8},
		// A removed node's slot is taken by the next node added.
		"slot reused": {start: full, end: append(without(full, "l0n0", "l0n1"), moved(t, "l9", "leaf-1")),
			ops: ops(remove("l0n0"), remove("l0n1"), add(func(t *testing.T) planner.NodeInfo { return moved(t, "l9", "leaf-1") })), job: three8},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			orig := mustCluster(t, tc.start)
			before := planWith(t, orig, tc.used, tc.job)
			want := planWith(t, mustCluster(t, tc.end), tc.used, tc.job)
			if cmp.Equal(want, before) && cmp.Equal(want, planWith(t, mustCluster(t, tc.end), nil, tc.job)) {
				t.Fatalf("the change does not change the plan, so the case proves nothing: %+v", want)
			}
			c := orig
			for _, op := range tc.ops {
				c = op(t, c)
			}
			if c.Len() != len(tc.end) {
				t.Errorf("Len() = %d; want %d", c.Len(), len(tc.end))
			}
			if diff := cmp.Diff(want, planWith(t, c, tc.used, tc.job)); diff != "" {
				t.Errorf("changed tree plans differently from a new one (-new +changed):\n%s", diff)
			}
			if diff := cmp.Diff(before, planWith(t, orig, tc.used, tc.job)); diff != "" {
				t.Errorf("the original tree changed (-before +after):\n%s", diff)
			}
			wantU := planner.Measure(planner.NewSnapshot(mustCluster(t, tc.end), tc.used), nil)
			if diff := cmp.Diff(wantU, planner.Measure(planner.NewSnapshot(c, tc.used), nil)); diff != "" {
				t.Errorf("changed tree measures differently from a new one (-new +changed):\n%s", diff)
			}
		})
	}
}

func TestMembershipRefusesWhatNeedsNewCluster(t *testing.T) {
	infos := twoLeaves().Infos(t)
	c := mustCluster(t, infos)
	other := func(name, leaf, spine string) planner.NodeInfo {
		return planner.NodeInfo{Name: name, Leaf: leaf, Spine: spine, Slices: nodeSlices(t, name, "dgx-h100", leaf, spine)}
	}
	dup := other("x", "leaf-0", "spine-0")
	for name, in := range map[string]planner.NodeInfo{
		"node already there":       infos[0],
		"new leaf":                 other("x", "leaf-7", "spine-0"),
		"leaf under another spine": other("x", "leaf-0", "spine-1"),
		"new spine":                other("x", "", "spine-9"),
		"new resource named": func() planner.NodeInfo {
			n := other("x", "leaf-0", "spine-0")
			n.Allocatable = resources("example.com/fpga", "1")
			return n
		}(),
	} {
		if out, ok := c.WithNewNode(in); ok || out != nil {
			t.Errorf("%s: WithNewNode = %v, %v; want nil, false", name, out, ok)
		}
	}
	// dup names devices of l0n0 as its own: WithNewNode refuses, as
	// NewCluster fails.
	dup.Slices = nodeSlices(t, "l0n0", "dgx-h100", "leaf-0", "spine-0")
	for i := range dup.Slices {
		s := dup.Slices[i].DeepCopy()
		s.Spec.NodeName = &dup.Name
		dup.Slices[i] = s
	}
	if out, ok := c.WithNewNode(dup); ok || out != nil {
		t.Errorf("a node publishing another node's devices: WithNewNode = %v, %v; want nil, false", out, ok)
	}
	if out, ok := c.WithoutNode("nope"); ok || out != nil {
		t.Errorf("unknown node: WithoutNode = %v, %v; want nil, false", out, ok)
	}
	one := mustCluster(t, append(slices.Clone(infos), other("solo", "leaf-5", "spine-0")))
	if out, ok := one.WithoutNode("solo"); ok || out != nil {
		t.Errorf("last node of its leaf: WithoutNode = %v, %v; want nil, false", out, ok)
	}
}

func ops(fs ...func(*testing.T, *planner.Cluster) *planner.Cluster) []func(*testing.T, *planner.Cluster) *planner.Cluster {
	return fs
}

func planWith(t *testing.T, c *planner.Cluster, used devicefit.Allocated, job planner.Job) outcome {
	t.Helper()
	return snapPlan(t, planner.NewSnapshot(c, used), job)
}
