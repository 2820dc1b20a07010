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

// The paper's figures compare only with a run in the artifact's setup;
// any one thing different rules it out.
func TestPaperSetting(t *testing.T) {
	gpu := &Cluster{Sharing: true, Nodes: []SimNode{{GPUs: 8}, {GPUs: 2}}}
	withCPU := &Cluster{Sharing: true, Nodes: []SimNode{{GPUs: 8}, {GPUs: 0}}}
	unshared := &Cluster{Nodes: gpu.Nodes}
	alibaba, jobs := &Trace{Format: FormatAlibaba}, &Trace{Format: FormatJobs}
	fair := Options{Seed: 42, GPUModels: true, FGDWorkload: true, FGDArrivals: true, CPUPodsOptIn: true}
	with := func(f func(*Options)) Options { o := fair; f(&o); return o }
	for name, tc := range map[string]struct {
		tr   *Trace
		c    *Cluster
		opt  Options
		want bool
	}{
		"the artifact's setup":      {alibaba, gpu, fair, true},
		"a job trace":               {jobs, gpu, fair, false},
		"nodes without GPUs":        {alibaba, withCPU, fair, false},
		"no sharing":                {alibaba, unshared, fair, false},
		"trace order":               {alibaba, gpu, with(func(o *Options) { o.Seed = 0 }), false},
		"GPU models ignored":        {alibaba, gpu, with(func(o *Options) { o.GPUModels = false }), false},
		"another target workload":   {alibaba, gpu, with(func(o *Options) { o.FGDWorkload = false }), false},
		"the replay's own arrivals": {alibaba, gpu, with(func(o *Options) { o.FGDArrivals = false }), false},
		"CPU pods left to default":  {alibaba, gpu, with(func(o *Options) { o.CPUPodsOptIn = false }), false},
	} {
		if got := PaperSetting(tc.tr, tc.c, tc.opt); got != tc.want {
			t.Errorf("%s: PaperSetting = %v, want %v", name, got, tc.want)
		}
	}
}

// BalancedAllocation as kube-scheduler 1.37 scores it, against values
// worked by hand: 50 + (50 + with − without) / 2, with and without being
// (1 − |fCPU − fMemory| / 2) × 100 truncated.
func TestBalancedAllocation(t *testing.T) {
	const cpu, mem = 64000, 262144
	for name, tc := range map[string]struct {
		podCPU, podMem, nodeCPU, nodeMem int64
		want                             int64
	}{
		// Without: 0.5 and 0.25, 87; with: 0.75 and 0.75, 100:
		// 50 + 63/2. The formula before 1.36 gave 100.
		"the pod evens the node out": {16000, 131072, 32000, 65536, 81},
		// Without: 100; with: 0.5 and 0, 75: 50 + 25/2.
		"the pod unbalances an empty node": {32000, 0, 0, 0, 62},
		// CPU is full either way (fractions cap at 1): 50 + 50/2.
		"no change in balance": {8000, 0, 64000, 0, 75},
		// A pod that asks for nothing is not scored.
		"best effort": {0, 0, 32000, 65536, 0},
	} {
		if got := balancedAllocation(tc.podCPU, tc.podMem, tc.nodeCPU, tc.nodeMem, cpu, mem); got != tc.want {
			t.Errorf("%s: %d, want %d", name, got, tc.want)
		}
	}
}

// The FGD artifact's target workload: pod shapes by CPU (100 milli-CPU
// for none), GPUs, milli-GPU and GPU models, pods without GPUs
// included, the most common first until 95 % of the pods are covered;
// no memory.
func TestFGDWorkload(t *testing.T) {
	var jobs []Job
	add := func(n int, j Job) {
		for range n {
			jobs = append(jobs, j)
		}
	}
	add(12, Job{Pods: 1, GPUsPerPod: 1, MilliGPU: 1000, CPUMilli: 4000, MemoryMiB: 9999})
	add(1, Job{Pods: 1, GPUsPerPod: 8, MilliGPU: 8000, GPUModels: []string{"T4", "G2"}})
	add(4, Job{Pods: 1, GPUsPerPod: 1, MilliGPU: 500, Shared: true, CPUMilli: 2000})
	add(2, Job{Pods: 1, MemoryMiB: 100})
	add(1, Job{Pods: 1, GPUsPerPod: 4, MilliGPU: 4000, CPUMilli: 500})
	cpu := func(m int64) v1.ResourceList {
		return v1.ResourceList{v1.ResourceCPU: *resource.NewMilliQuantity(m, resource.DecimalSI)}
	}
	want := planner.Workload{
		{GPUs: 1, MilliGPU: 1000, Requests: cpu(4000), Weight: 12},
		{GPUs: 1, MilliGPU: 500, Requests: cpu(2000), Weight: 4},
		{GPUs: 0, MilliGPU: 0, Requests: cpu(100), Weight: 2},
		// 19 of 20 pods: the 4-GPU pod is left out.
		{GPUs: 8, MilliGPU: 1000, Requests: cpu(100), Weight: 1, NodeAffinity: modelSelector([]string{"T4", "G2"})},
	}
	got := fgdWorkload(jobs, true)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("the workload does not validate: %v", err)
	}
}
