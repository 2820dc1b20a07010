package planner_test

import (
	"context"
	"errors"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gputopo/gputopo/pkg/planner"
)

func TestBrokenClaimIsNotUnschedulable(t *testing.T) {
	c := fourLeaves().Obj(t)
	job := makeJob(t, "j").Pods(2, "gpu-1").Obj()
	job.Pods[1].Claims[0].Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{
		CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["gpu.gputopo.dev"].leaf ==`},
	}}
	_, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, nil), nil, job)
	var broken *planner.BrokenClaimError
	if !errors.As(err, &broken) {
		t.Fatalf("want BrokenClaimError, got %v", err)
	}
	if broken.Pod != "p1" {
		t.Errorf("broken pod: want p1, got %s", broken.Pod)
	}
	var unsched *planner.Unschedulable
	if errors.As(err, &unsched) {
		t.Error("a broken claim must not read as unschedulable")
	}
}

// A selector that fails at run time on some nodes (the attribute is
// missing and there is no orValue) is broken too: kube-scheduler would
// fail the pod on those nodes with an error, not a "does not fit".
func TestRuntimeCELErrorIsBroken(t *testing.T) {
	c := makeCluster().Node("bare", "dgx-h100", "", "").Obj(t)
	job := makeJob(t, "j").Pods(1, "gpu-1").Obj()
	job.Pods[0].Claims[0].Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{
		CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["gpu.gputopo.dev"].leaf == "leaf-0"`},
	}}
	_, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, nil), nil, job)
	var broken *planner.BrokenClaimError
	if !errors.As(err, &broken) || broken.Node != "bare" {
		t.Fatalf("want BrokenClaimError on node bare, got %v", err)
	}
}

func TestInvalidJobs(t *testing.T) {
	c := fourLeaves().Obj(t)
	tests := map[string]func(t testing.TB) planner.Job{
		"no pods":           func(t testing.TB) planner.Job { return makeJob(t, "j").Obj() },
		"no key":            func(t testing.TB) planner.Job { return makeJob(t, "").Pods(1, "gpu-1").Obj() },
		"unknown placement": func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(1, "gpu-1").Placement("nearby").Obj() },
		"unknown strategy":  func(t testing.TB) planner.Job { return makeJob(t, "j").Pods(1, "gpu-1").Strategy("random").Obj() },
		"duplicate pods": func(t testing.TB) planner.Job {
			j := makeJob(t, "j").Pods(2, "gpu-1").Obj()
			j.Pods[1].Name = "p0"
			return j
		},
		"pinned on an unknown node": func(t testing.TB) planner.Job {
			return makeJob(t, "j").Pods(1, "gpu-1").Pinned("old", "gone").Obj()
		},
		"unknown domain": func(t testing.TB) planner.Job {
			return makeJob(t, "j").Pods(1, "gpu-1").Domain(planner.LevelLeaf, "leaf-9").Obj()
		},
		"claim already allocated": func(t testing.TB) planner.Job {
			j := makeJob(t, "j").Pods(1, "gpu-1").Obj()
			j.Pods[0].Claims[0].Status.Allocation = &resourceapi.AllocationResult{}
			return j
		},
	}
	for name, job := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, nil), nil, job(t))
			var invalid *planner.InvalidJobError
			if !errors.As(err, &invalid) {
				t.Errorf("want InvalidJobError, got %v", err)
			}
		})
	}
}

func TestContextCancelled(t *testing.T) {
	c := fourLeaves().Obj(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := newPlanner(t).Plan(ctx, planner.NewSnapshot(c, nil), nil, makeJob(t, "j").Pods(2, "gpu-1").Obj())
	if !errors.Is(err, context.Canceled) {
		t.Errorf("want context.Canceled, got %v", err)
	}
}

func TestNewClusterRejects(t *testing.T) {
	tests := map[string]func(t testing.TB) ([]planner.NodeInfo, map[string][]string){
		"duplicate node": func(t testing.TB) ([]planner.NodeInfo, map[string][]string) {
			in := makeCluster().Node("a", "dgx-h100", "leaf-0", "spine-0").Infos(t)
			return append(in, in[0]), nil
		},
		"leaf under two spines": func(t testing.TB) ([]planner.NodeInfo, map[string][]string) {
			return makeCluster().Node("a", "dgx-h100", "leaf-0", "spine-0").Node("b", "dgx-h100", "leaf-0", "spine-1").Infos(t), nil
		},
		"slice of another node": func(t testing.TB) ([]planner.NodeInfo, map[string][]string) {
			in := makeCluster().Node("a", "dgx-h100", "leaf-0", "spine-0").Node("b", "dgx-h100", "leaf-0", "spine-0").Infos(t)
			in[0].Slices = in[1].Slices
			return in, nil
		},
		"leaf order names a foreign leaf": func(t testing.TB) ([]planner.NodeInfo, map[string][]string) {
			in := makeCluster().Node("a", "dgx-h100", "leaf-0", "spine-0").Node("b", "dgx-h100", "leaf-1", "spine-1").Infos(t)
			return in, map[string][]string{"spine-0": {"leaf-1"}}
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := planner.NewCluster(tc(t)); err == nil {
				t.Error("want an error")
			}
		})
	}
}
