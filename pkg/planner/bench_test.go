package planner_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/planner"
)

// bigCluster is 10 spines × 50 leaves × 8 dgx-h100 nodes: 4,000 nodes and
// 32,000 GPUs. In 60% of the leaves one to four nodes have one to eight
// GPUs in use, so best fit has partly used leaves to prefer and the
// adjacent-leaf search has gaps to skip.
var bigCluster = sync.OnceValues(func() ([]planner.NodeInfo, devicefit.Allocated) { return big("dgx-h100") })

// bigPCIeCluster is the same with hgx-pcie-pairs nodes: no NVLink quad.
var bigPCIeCluster = sync.OnceValues(func() ([]planner.NodeInfo, devicefit.Allocated) { return big("hgx-pcie-pairs") })

func big(profile string) ([]planner.NodeInfo, devicefit.Allocated) {
	b := makeCluster().Spines(10, 50, 8, profile)
	infos := b.Infos(benchTB{})
	r := rand.New(rand.NewPCG(1, 2))
	used := allocated()
	for l := range 500 {
		if r.IntN(10) >= 6 {
			continue
		}
		for range r.IntN(4) + 1 {
			node := fmt.Sprintf("l%dn%d", l, r.IntN(8))
			used.GPUs(node, r.Perm(8)[:r.IntN(8)+1]...)
		}
	}
	return infos, used.Obj()
}

// benchTB lets the builders run outside a test; they only fail on broken
// built-in specs.
type benchTB struct{ testing.TB }

func (benchTB) Helper()               {}
func (benchTB) Fatal(args ...any)     { panic(fmt.Sprint(args...)) }
func (benchTB) Fatalf(string, ...any) { panic("bench setup failed") }

// BenchmarkPlan16Pods4000Nodes plans a 16-pod job on bigCluster. The
// target is under 50 ms per plan.
func BenchmarkPlan16Pods4000Nodes(b *testing.B) {
	infos, used := bigCluster()
	c, err := planner.NewCluster(infos, nil)
	if err != nil {
		b.Fatal(err)
	}
	snap := planner.NewSnapshot(c, used)
	p := newPlanner(b)
	for name, tc := range map[string]struct {
		job     planner.Job
		refused bool
	}{
		// Two adjacent leaves with every node free.
		"auto/gpu-8-node": {job: makeJob(b, "j").Pods(16, "gpu-8-node").Obj()},
		// One leaf: 8 nodes with two quads each.
		"auto/gpu-4-nvlink": {job: makeJob(b, "j").Pods(16, "gpu-4-nvlink").Obj()},
		// Preference ladders whose first rung fits: as cheap as plain claims.
		"auto/gpu-4-ladder":      {job: makeJob(b, "j").Pods(16, "gpu-4-ladder").Obj()},
		"auto/gpu-1/distributed": {job: makeJob(b, "j").Pods(16, "gpu-1").Strategy(planner.StrategyDistributed).Obj()},
		"mixed/consolidated":     {job: makeJob(b, "j").Pods(8, "gpu-4-nvlink").Pods(8, "gpu-2-nvlink-pair").Strategy(planner.StrategyConsolidated).Obj()},
		"none/gpu-8-node":        {job: makeJob(b, "j").Pods(16, "gpu-8-node").Placement(planner.PlacementNone).Obj()},
		// 16 whole nodes never fit an 8-node leaf: the refusal path.
		"same-leaf/refused": {job: makeJob(b, "j").Pods(16, "gpu-8-node").Placement(planner.PlacementSameLeaf).Obj(), refused: true},
	} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				_, err := p.Plan(context.Background(), snap, nil, tc.job)
				var u *planner.Unschedulable
				if tc.refused != errors.As(err, &u) || (!tc.refused && err != nil) {
					b.Fatalf("refused %v, want %v: %v", err != nil, tc.refused, err)
				}
			}
		})
	}
}

// BenchmarkPlanFiltered4000Nodes is BenchmarkPlan16Pods4000Nodes with
// every node filter at work: each node offers 64 cpus, 1 in 20 nodes is
// NotReady, 1 in 20 is tainted, and pods already take cpu on 3 in 10.
// The pods ask for 24 cpus each.
func BenchmarkPlanFiltered4000Nodes(b *testing.B) {
	base, used := bigCluster()
	infos := slices.Clone(base)
	r := rand.New(rand.NewPCG(3, 4))
	usage := planner.NodeUsage{}
	for i := range infos {
		infos[i].Allocatable = resources("cpu", "64", "memory", "1Ti", "pods", "110")
		switch r.IntN(20) {
		case 0:
			infos[i].NotReady = true
		case 1:
			infos[i].Taints = []v1.Taint{parseTaint(maint)}
		}
		if r.IntN(10) < 3 {
			usage.Add(infos[i].Name, podRequesting("other", resources("cpu", fmt.Sprint(8*(r.IntN(8)+1)))))
		}
	}
	c, err := planner.NewCluster(infos, nil)
	if err != nil {
		b.Fatal(err)
	}
	snap := planner.NewSnapshot(c, used, planner.WithUsed(usage))
	p := newPlanner(b)
	cpu := resources("cpu", "24")
	for name, job := range map[string]planner.Job{
		"auto/gpu-8-node": makeJob(b, "j").Pods(16, "gpu-8-node").Request(cpu).Obj(),
		"mixed/consolidated": makeJob(b, "j").Pods(8, "gpu-4-nvlink").Request(cpu).Tolerate(maint).
			Pods(8, "gpu-2-nvlink-pair").Request(cpu).Strategy(planner.StrategyConsolidated).Obj(),
	} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := p.Plan(context.Background(), snap, nil, job); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// pcieSnapshot is bigPCIeCluster as a snapshot, with a planner.
func pcieSnapshot(b *testing.B) (*planner.Snapshot, *planner.Planner) {
	infos, used := bigPCIeCluster()
	c, err := planner.NewCluster(infos, nil)
	if err != nil {
		b.Fatal(err)
	}
	return planner.NewSnapshot(c, used), newPlanner(b)
}

// BenchmarkPlanLadderNoQuads4000Nodes is the worst case for ladders: no
// node has an NVLink quad, so no domain gives the first rung and every
// feasible leaf is tried for the best one.
func BenchmarkPlanLadderNoQuads4000Nodes(b *testing.B) {
	snap, p := pcieSnapshot(b)
	job := makeJob(b, "j").Pods(16, "gpu-4-ladder").Obj()
	for b.Loop() {
		if _, err := p.Plan(context.Background(), snap, nil, job); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPlanRefused4000Nodes is the worst case for the pre-filter:
// every node has enough free GPUs by count, none has a quad, so only the
// allocator can say no, on every node, at every size up to the whole
// cluster.
func BenchmarkPlanRefused4000Nodes(b *testing.B) {
	snap, p := pcieSnapshot(b)
	job := makeJob(b, "j").Pods(16, "gpu-4-nvlink").Obj()
	for b.Loop() {
		var u *planner.Unschedulable
		if _, err := p.Plan(context.Background(), snap, nil, job); !errors.As(err, &u) {
			b.Fatalf("want a refusal, got %v", err)
		}
	}
}

func BenchmarkNewCluster4000Nodes(b *testing.B) {
	infos, _ := bigCluster()
	for b.Loop() {
		if _, err := planner.NewCluster(infos, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNewCluster4000NodesPacked is BenchmarkNewCluster4000Nodes on
// slices packed as the controller caches them (pkg/slicepack): every
// node's signature unpacks its slices.
func BenchmarkNewCluster4000NodesPacked(b *testing.B) {
	infos, _ := bigCluster()
	packed := packInfos(b, infos)
	for b.Loop() {
		if _, err := planner.NewCluster(packed, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSnapshot4000Nodes(b *testing.B) {
	infos, used := bigCluster()
	c, err := planner.NewCluster(infos, nil)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		planner.Measure(planner.NewSnapshot(c, used), nil)
	}
}

// BenchmarkPlanNonLocal4000Nodes is BenchmarkPlan16Pods4000Nodes with 64
// NICs of another driver in a pool every node can use (allNodes): jobs
// that ask for GPUs only, and jobs whose pods ask for a GPU block and a
// NIC each. Every node can use the NICs, so each is planned on its own.
func BenchmarkPlanNonLocal4000Nodes(b *testing.B) {
	infos, used := bigCluster()
	c, err := planner.NewCluster(infos, nil, nicSlice("all", 64, allNodes))
	if err != nil {
		b.Fatal(err)
	}
	snap := planner.NewSnapshot(c, used)
	p := planner.New(nicEvaluator(b))
	for name, job := range map[string]planner.Job{
		"auto/gpu-8-node":       makeJob(b, "j").Pods(16, "gpu-8-node").Obj(),
		"auto/gpu-4-nvlink":     makeJob(b, "j").Pods(16, "gpu-4-nvlink").Obj(),
		"auto/gpu-8-node+nic":   makeJob(b, "j").Pods(16, "gpu-8-node").Nics("").Obj(),
		"auto/gpu-4-nvlink+nic": makeJob(b, "j").Pods(16, "gpu-4-nvlink").Nics("").Obj(),
	} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, err := p.Plan(context.Background(), snap, nil, job); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
