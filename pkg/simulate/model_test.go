package simulate

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gputopo/gputopo/pkg/planner"
)

// kube-scheduler's adaptive percentageOfNodesToScore.
func TestNumFeasibleNodesToFind(t *testing.T) {
	got := map[int]int{}
	for _, n := range []int{50, 99, 100, 500, 1213, 5000, 10000} {
		got[n] = numFeasibleNodesToFind(n)
	}
	// 500: 46 %; 1213: 41 %; 5000: 10 %; 10000: the 5 % floor.
	want := map[int]int{50: 50, 99: 99, 100: 100, 500: 230, 1213: 497, 5000: 500, 10000: 500}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// The workload gputopo measures fragmentation against is the trace's own
// mix, shares as shares only when GPUs are shared, pods without GPUs left
// out.
func TestWorkloadOf(t *testing.T) {
	jobs := []Job{
		{Pods: 1, GPUsPerPod: 1, MilliGPU: 500, Shared: true, CPUMilli: 4000},
		{Pods: 1, GPUsPerPod: 1, MilliGPU: 500, Shared: true, CPUMilli: 4000},
		{Pods: 2, GPUsPerPod: 8, MilliGPU: 8000},
		{Pods: 1, CPUMilli: 8000},
	}
	tests := map[string]struct {
		sharing bool
		want    planner.Workload
	}{
		"shared": {true, planner.Workload{
			{GPUs: 1, MilliGPU: 500, Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("4")}, Weight: 2},
			{GPUs: 8, MilliGPU: 1000, Weight: 2},
		}},
		"whole GPUs": {false, planner.Workload{
			{GPUs: 1, MilliGPU: 1000, Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("4")}, Weight: 2},
			{GPUs: 8, MilliGPU: 1000, Weight: 2},
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, workloadOf(jobs, tc.sharing)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestPaperSetting(t *testing.T) {
	alibaba, jobs := &Trace{Format: FormatAlibaba}, &Trace{Format: FormatJobs}
	got := []bool{PaperSetting(alibaba, true), PaperSetting(alibaba, false), PaperSetting(jobs, true)}
	if diff := cmp.Diff([]bool{true, false, false}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
