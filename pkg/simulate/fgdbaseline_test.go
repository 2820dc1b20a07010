package simulate

import (
	"math/rand"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// fgdNodeFrag counts as the artifact's NodeGpuShareFragAmount does: a
// typical pod that fits strands the GPUs with too little free for it;
// one that lacks GPUs, CPU or the node's model, and a pod without GPUs,
// strand every free milli-GPU.
func TestFGDNodeFrag(t *testing.T) {
	typical := []fgdClass{
		{gpus: 1, milli: 500, cpu: 1000, weight: 0.5},
		{gpus: 2, milli: 1000, cpu: 1000, weight: 0.25},
		{cpu: 1000, weight: 0.25},
	}
	free := []int{1000, 300}
	for _, c := range []struct {
		name    string
		typical []fgdClass
		cpuLeft int64
		want    float64
	}{
		// share: 300 stranded (×0.5); two GPUs: too few whole, all 1300
		// (×0.25); no GPUs: all 1300 (×0.25).
		{"fits", typical, 4000, 150 + 325 + 325},
		// too little CPU: every pod strands all 1300.
		{"lacks CPU", typical, 500, 1300},
		// the share asks for another model: all 1300 for it.
		{"other model", []fgdClass{{gpus: 1, milli: 500, cpu: 1000, models: []string{"B"}, weight: 1}}, 4000, 1300},
		{"its model", []fgdClass{{gpus: 1, milli: 500, cpu: 1000, models: []string{"B", "A"}, weight: 1}}, 4000, 300},
	} {
		if got := fgdNodeFrag(c.typical, "A", c.cpuLeft, free); got != c.want {
			t.Errorf("%s: frag = %v, want %v", c.name, got, c.want)
		}
	}
}

// Nodes sorted by name take the permutation's numbers in turn, as the
// artifact prefixes their names.
func TestFGDNodePriority(t *testing.T) {
	c := &Cluster{Nodes: []SimNode{{Name: "n-b"}, {Name: "n-a"}, {Name: "n-c"}}}
	if diff := cmp.Diff([]int{0, 2, 1}, fgdNodePriority(c, []int{2, 0, 1})); diff != "" {
		t.Errorf("priority (-want +got):\n%s", diff)
	}
}

// The node permutation comes from the artifact's generator where the
// arrivals leave it: after the first number, the shuffle and the
// tuning's draws.
func TestFGDArrivalsNodePerm(t *testing.T) {
	tr := &Trace{Format: FormatAlibaba, Source: "t", Jobs: []Job{
		{Name: "p0", Pods: 1, GPUsPerPod: 1, MilliGPU: 1000},
		{Name: "p1", Pods: 1, GPUsPerPod: 1, MilliGPU: 500, Shared: true},
	}}
	a, err := FGDArrivals(tr, 2, 1.3, 42)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(42))
	rng.Int()
	rng.Shuffle(2, func(int, int) {})
	// Tuning up to 2600 from 1500: draws until a drawn pod does not fit.
	total := int64(1500)
	for {
		j := []Job{tr.Jobs[0], tr.Jobs[1]}[rng.Intn(2)]
		if float64(total+j.milliPerGPU()) > 2600 {
			break
		}
		total += j.milli()
	}
	if diff := cmp.Diff(rng.Perm(5), a.nodePerm(5)); diff != "" {
		t.Errorf("node permutation (-want +got):\n%s", diff)
	}
}

// The target workload: the most common shapes until 95 % of the pods,
// CPU defaulted to 100 milli-CPU, weights summing to 1.
func TestFGDTypical(t *testing.T) {
	var jobs []Job
	add := func(n int, j Job) {
		for range n {
			jobs = append(jobs, j)
		}
	}
	add(60, Job{Pods: 1, GPUsPerPod: 1, MilliGPU: 500, Shared: true, CPUMilli: 4000})
	add(36, Job{Pods: 1, GPUsPerPod: 2, MilliGPU: 2000, CPUMilli: 8000, GPUModels: []string{"T4"}})
	add(3, Job{Pods: 1})
	add(1, Job{Pods: 1, GPUsPerPod: 8, MilliGPU: 8000, CPUMilli: 64000})
	got := fgdTypical(jobs, true)
	want := []fgdClass{
		{gpus: 1, milli: 500, cpu: 4000, weight: 60.0 / 96},
		{gpus: 2, milli: 1000, cpu: 8000, models: []string{"T4"}, weight: 36.0 / 96},
	}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(fgdClass{})); diff != "" {
		t.Errorf("typical pods (-want +got):\n%s", diff)
	}
	got = fgdTypical(jobs[:99], true) // 60, 36, 3: 96 % after two
	if len(got) != 2 {
		t.Errorf("%d classes, want 2", len(got))
	}
	got = fgdTypical(append(jobs[:60:60], jobs[96:99]...), true) // 60 of 63: past 95 % alone
	if len(got) != 1 {
		t.Errorf("%d classes, want 1", len(got))
	}
	got = fgdTypical(append(jobs[:20:20], jobs[96:99]...), true) // 20, 3: 87 % after one
	if len(got) != 2 || got[1].milli != 0 || got[1].cpu != defaultCPUMilli {
		t.Errorf("typical pods %+v, want the share and the pod without GPUs at %d milli-CPU", got, defaultCPUMilli)
	}
}

// Equal scores go to the node first in the artifact's order, and a
// share to the first GPU of the best score on its node, not the fullest.
func TestFGDArtifactTies(t *testing.T) {
	specs, err := ParseAlibabaNodes(strings.NewReader("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,T4\nn1,64000,262144,2,T4\n"),
		"nodes.csv", Grouping{NodesPerLeaf: 2, LeavesPerSpine: 1, GPUNodesOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCluster(specs, ClusterOptions{Sharing: true})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := LoadClaims(ClaimFiles{})
	if err != nil {
		t.Fatal(err)
	}
	typical := []fgdClass{{gpus: 1, milli: 100, cpu: 1000, weight: 1}}
	s := newFGDArtifact(c, cl, typical, []int{1, 0}, newLedger(c))
	j := Job{Pods: 1, GPUsPerPod: 1, MilliGPU: 500, Shared: true, CPUMilli: 1000}
	if got := s.choose(j, 500); !slices.Equal(got, []int{1, 0}) {
		t.Errorf("free nodes in order %v, want n1 then n0", got)
	}
	// On n0 the share leaves 500 and 600, or 1000 and 100: nothing
	// stranded for a pod of 100 either way, so the first GPU.
	s.free[0][1] = 600
	s.choose(j, 500)
	if got := s.device(0); got != "gpu-0" {
		t.Errorf("share on %s, want gpu-0", got)
	}
}
