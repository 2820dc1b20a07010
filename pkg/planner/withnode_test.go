package planner_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gputopo/gputopo/pkg/planner"
)

// A tree patched with WithNode plans exactly like a tree built from
// scratch with the same change, and the tree it was patched from plans as
// before.
func TestWithNodePlansLikeNewCluster(t *testing.T) {
	three8 := func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(3, "gpu-8-node").Obj() }
	tests := map[string]struct {
		edit func(*planner.NodeInfo)
		job  func(t testing.TB) planner.Job
	}{
		"not ready": {edit: func(n *planner.NodeInfo) { n.NotReady = true }, job: three8},
		"cordoned":  {edit: func(n *planner.NodeInfo) { n.Unschedulable = true }, job: three8},
		"tainted":   {edit: func(n *planner.NodeInfo) { n.Taints = append(n.Taints, parseTaint(maint)) }, job: three8},
		"less allocatable": {edit: func(n *planner.NodeInfo) { n.Allocatable = resources("cpu", "1", "memory", "64Gi", "pods", "10") }, job: func(t testing.TB) planner.Job {
			return makeJob(t, "j").Pods(3, "gpu-8-node").Request(resources("cpu", "4")).Obj()
		}},
		"labelled": {edit: func(n *planner.NodeInfo) { n.Labels = map[string]string{"pool": "a"} }, job: func(t testing.TB) planner.Job {
			return makeJob(t, "j").Pods(1, "gpu-8-node").Selector("pool", "a").Obj()
		}},
		// The node's GPUs are the same devices but one is tainted: the
		// allocator must be asked about this node on its own, not answer
		// from its untainted twins.
		"device tainted": {edit: func(n *planner.NodeInfo) { n.Slices = taintFirstDevice(n.Slices) }, job: three8},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			base := twoLeaves().Allocatable(node8)
			infos := base.Infos(t)
			before := planOn(t, base.Obj(t), tc.job(t))

			tc.edit(&infos[0]) // l0n0
			want := planOn(t, mustCluster(t, infos), tc.job(t))
			if cmp.Equal(want, before) {
				t.Fatalf("the change does not change the plan, so the case proves nothing: %+v", want)
			}
			orig := base.Obj(t)
			patched, ok := orig.WithNode(infos[0])
			if !ok {
				t.Fatal("WithNode refused a change in place")
			}
			if diff := cmp.Diff(want, planOn(t, patched, tc.job(t))); diff != "" {
				t.Errorf("patched tree plans differently from a new one (-new +patched):\n%s", diff)
			}
			if diff := cmp.Diff(before, planOn(t, orig, tc.job(t))); diff != "" {
				t.Errorf("the original tree changed (-before +after):\n%s", diff)
			}
		})
	}
}

func TestWithNodeRefusesWhatNeedsNewCluster(t *testing.T) {
	tests := map[string]func(*planner.NodeInfo){
		"unknown node":       func(n *planner.NodeInfo) { n.Name = "l9n9" },
		"other leaf":         func(n *planner.NodeInfo) { n.Leaf = "leaf-1" },
		"other spine":        func(n *planner.NodeInfo) { n.Spine = "spine-1" },
		"device removed":     func(n *planner.NodeInfo) { n.Slices = dropFirstDevice(n.Slices) },
		"new resource named": func(n *planner.NodeInfo) { n.Allocatable = resources("example.com/fpga", "1") },
	}
	for name, edit := range tests {
		t.Run(name, func(t *testing.T) {
			b := twoLeaves().Allocatable(node8)
			infos := b.Infos(t)
			edit(&infos[0])
			if c, ok := b.Obj(t).WithNode(infos[0]); ok || c != nil {
				t.Errorf("WithNode = %v, %v; want nil, false", c, ok)
			}
		})
	}
}

// outcome is a plan or why there is none.
type outcome struct {
	Placed *placed
	Err    string
}

func planOn(t *testing.T, c *planner.Cluster, job planner.Job) outcome {
	t.Helper()
	return planWith(t, c, nil, job)
}

func mustCluster(t *testing.T, infos []planner.NodeInfo) *planner.Cluster {
	t.Helper()
	c, err := planner.NewCluster(infos, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// editFirstDevice returns copies of the slices with the first device of
// the first slice edited; the originals are shared with other nodes'
// fixtures and stay as they are.
func editFirstDevice(in []*resourceapi.ResourceSlice, edit func(*resourceapi.ResourceSlice)) []*resourceapi.ResourceSlice {
	out := make([]*resourceapi.ResourceSlice, len(in))
	for i, s := range in {
		out[i] = s.DeepCopy()
	}
	edit(out[0])
	return out
}

func taintFirstDevice(in []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	return editFirstDevice(in, func(s *resourceapi.ResourceSlice) {
		s.Spec.Devices[0].Taints = []resourceapi.DeviceTaint{{Key: "gpu.gputopo.dev/xid", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	})
}

func dropFirstDevice(in []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	return editFirstDevice(in, func(s *resourceapi.ResourceSlice) { s.Spec.Devices = s.Spec.Devices[1:] })
}
