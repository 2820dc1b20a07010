package planner_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/topology"
)

// sharedCluster is one leaf of two dgx-h100 nodes whose GPUs are all
// published for sharing:
//
//	leaf-0: l0n0, l0n1 (8 shared GPUs each)
func sharedCluster(t testing.TB) *planner.Cluster {
	t.Helper()
	return sharedClusterOf(t, makeCluster().Leaf("spine-0", 0, "dgx-h100", 2))
}

// sharedClusterOf is the cluster b builds with every GPU shared.
func sharedClusterOf(t testing.TB, b *clusterBuilder) *planner.Cluster {
	t.Helper()
	infos := b.Infos(t)
	for _, in := range infos {
		for _, sl := range in.Slices {
			for i := range sl.Spec.Devices {
				d := &sl.Spec.Devices[i]
				d.AllowMultipleAllocations = ptr.To(true)
				d.Capacity[topology.CapacityMilliGPU] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(topology.MilliPerGPU, resource.DecimalSI)}
				mem := d.Capacity[topology.CapacityMemory]
				mem.RequestPolicy = &resourceapi.CapacityRequestPolicy{Default: resource.NewQuantity(0, resource.BinarySI), ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: resource.NewQuantity(0, resource.BinarySI)}}
				d.Capacity[topology.CapacityMemory] = mem
			}
		}
	}
	c, err := planner.NewCluster(infos, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// shareJob is a one-pod job asking for milli thousandths of a GPU.
func shareJob(t testing.TB, key string, milli int64) planner.Job {
	j := makeJob(t, key).Pods(1, "gpu-share-quarter").Obj()
	j.Pods[0].Claims[0].Spec.Devices.Requests[0].Exactly.Capacity.Requests[topology.CapacityMilliGPU] = *resource.NewQuantity(milli, resource.DecimalSI)
	return j
}

// where is "node/device" of each placed job, in order.
type where []string

// planAll plans the jobs one after the other, each holding what it got.
func planAll(t *testing.T, p *planner.Planner, snap *planner.Snapshot, jobs ...planner.Job) where {
	t.Helper()
	res := planner.NewReservations()
	var out where
	for _, j := range jobs {
		plan, err := p.Plan(context.Background(), snap, res, j)
		if err != nil {
			t.Fatalf("job %s: %v", j.Key, err)
		}
		if err := res.Add(plan.Reservation()); err != nil {
			t.Fatalf("job %s: %v", j.Key, err)
		}
		for _, r := range plan.Allocations[j.Pods[0].Name] {
			for _, d := range r.Devices.Results {
				out = append(out, d.Pool+"/"+d.Device)
			}
		}
	}
	return out
}

func TestFragmentationAwarePlacement(t *testing.T) {
	halves := planner.Workload{{GPUs: 1, MilliGPU: 500, Weight: 1}}
	jobs := func(t *testing.T, strategy planner.Strategy, millis ...int64) []planner.Job {
		var out []planner.Job
		for i, m := range millis {
			j := shareJob(t, fmt.Sprintf("j%d", i), m)
			j.Strategy = strategy
			out = append(out, j)
		}
		return out
	}
	tests := map[string]struct {
		workload planner.Workload
		strategy planner.Strategy
		millis   []int64
		want     where
	}{
		// A second quarter beside the first leaves GPU 1 whole.
		"quarters fill one GPU first": {nil, "", []int64{250, 250, 250, 250, 250},
			where{"l0n0/gpu-0", "l0n0/gpu-0", "l0n0/gpu-0", "l0n0/gpu-0", "l0n0/gpu-1"}},
		// When halves are what comes, a quarter beside a half would strand
		// the last quarter: it goes to a whole GPU instead.
		"a quarter keeps a half free for a half": {halves, "", []int64{500, 250, 250},
			where{"l0n0/gpu-0", "l0n0/gpu-1", "l0n0/gpu-1"}},
		"consolidated packs the fullest GPU": {halves, planner.StrategyConsolidated, []int64{500, 250, 250},
			where{"l0n0/gpu-0", "l0n0/gpu-0", "l0n0/gpu-0"}},
		"distributed spreads over nodes": {nil, planner.StrategyDistributed, []int64{250, 250, 250},
			where{"l0n0/gpu-0", "l0n1/gpu-0", "l0n0/gpu-1"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := sharedCluster(t)
			p := planner.New(newEvaluator(t), planner.WithWorkload(tc.workload))
			got := planAll(t, p, planner.NewSnapshot(c, nil), jobs(t, tc.strategy, tc.millis...)...)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("placements (-want +got):\n%s", diff)
			}
		})
	}
}

// Shares held by allocated claims count; a node without the CPU the pod
// asks for is skipped.
func TestOnePodPlansRespectSharesAndNodeFits(t *testing.T) {
	c := sharedCluster(t)
	p := planner.New(newEvaluator(t))
	state := devicefit.NewState()
	for g := range 8 {
		state.AddShare(devicefit.Share{Device: gpuID("l0n0", g), ShareID: fmt.Sprintf("s%d", g),
			Consumed: map[resourceapi.QualifiedName]resource.Quantity{topology.CapacityMilliGPU: resource.MustParse("900")}})
	}
	snap := planner.NewSnapshotFromState(c, state)
	got := planAll(t, p, snap, shareJob(t, "small", 100), shareJob(t, "big", 500))
	if diff := cmp.Diff(where{"l0n0/gpu-0", "l0n1/gpu-0"}, got); diff != "" {
		t.Errorf("placements (-want +got):\n%s", diff)
	}

	// l0n0 offers 3 CPUs; l0n1 does not say, so nothing is checked there.
	fenced := sharedClusterOf(t, makeCluster().Leaf("spine-0", 0, "dgx-h100", 2).Allocatable(resources("cpu", "3", "memory", "1Ti", "pods", "110"), "l0n0"))
	j := shareJob(t, "fenced", 100)
	j.Pods[0].Requests = resources("cpu", "4")
	if got := planAll(t, p, planner.NewSnapshotFromState(fenced, state), j); got[0] != "l0n1/gpu-0" {
		t.Errorf("l0n0 lacks the CPU the pod asks for, got %v", got)
	}
	whole := makeJob(t, "whole").Pods(1, "gpu-8-node").Obj()
	plan, err := p.Plan(context.Background(), snap, nil, whole)
	if err != nil || plan.Assignments["p0"] != "l0n1" {
		t.Fatalf("a whole node's claim must go to the node without shares: %v, %v", plan, err)
	}
	if !hasReason(plan.Reasons, "8 whole GPUs on l0n1") {
		t.Errorf("reasons %q do not say where the GPUs went", plan.Reasons)
	}
}

// Two jobs may each hold a share of one device; whole devices stay
// exclusive.
func TestReservationsHoldShares(t *testing.T) {
	c := sharedCluster(t)
	p := planner.New(newEvaluator(t))
	snap := planner.NewSnapshot(c, nil)
	res := planner.NewReservations()
	for _, key := range []string{"a", "b"} {
		plan, err := p.Plan(context.Background(), snap, res, shareJob(t, key, 500))
		if err != nil {
			t.Fatal(err)
		}
		r := plan.Reservation()
		if len(r.Devices) != 0 || len(r.Shares["l0n0"]) != 1 || r.Shares["l0n0"][0].Device != gpuID("l0n0", 0) {
			t.Fatalf("job %s: reservation %+v, want one share of l0n0 gpu-0 and no whole device", key, r)
		}
		if err := res.Add(r); err != nil {
			t.Fatalf("job %s: %v", key, err)
		}
	}
	plan, err := p.Plan(context.Background(), snap, res, shareJob(t, "c", 100))
	if err != nil {
		t.Fatal(err)
	}
	if d := plan.Allocations["p0"][0].Devices.Results[0]; d.Device != "gpu-1" {
		t.Errorf("gpu-0 is full with two halves reserved, got %s", d.Device)
	}
	u := planner.Measure(snap, res)
	if u.Used != 1 {
		t.Errorf("a GPU held by shares counts as used: %d used, want 1", u.Used)
	}
}

func TestWorkloadValidate(t *testing.T) {
	for name, w := range map[string]planner.Workload{
		"empty":             {},
		"share of 2 GPUs":   {{GPUs: 2, MilliGPU: 500, Weight: 1}},
		"over a whole GPU":  {{GPUs: 1, MilliGPU: 1500, Weight: 1}},
		"negative weight":   {{GPUs: 1, MilliGPU: 1000, Weight: -1}},
		"no weight":         {{GPUs: 1, MilliGPU: 1000}},
		"a share of no GPU": {{GPUs: 0, MilliGPU: 500, Weight: 1}},
		"bad node affinity": {{GPUs: 1, MilliGPU: 1000, Weight: 1, NodeAffinity: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
			MatchExpressions: []v1.NodeSelectorRequirement{{Key: "model", Operator: "Near", Values: []string{"a"}}}}}}}},
	} {
		if err := w.Validate(); err == nil {
			t.Errorf("%s: want an error", name)
		}
	}
	if err := planner.DefaultWorkload().Validate(); err != nil {
		t.Errorf("default workload: %v", err)
	}
	if err := (planner.Workload{{GPUs: 0, MilliGPU: 0, Weight: 1}}).Validate(); err != nil {
		t.Errorf("a class of pods without GPUs: %v", err)
	}
}

// A kind of pod that may only run on some nodes finds every free GPU
// elsewhere stranded: a quarter goes where it strands nothing more for
// the halves that may come, which without the affinity is the first
// node and with it the node halves may not use. Pods without GPUs in
// the workload strand every free GPU wherever they go, which changes no
// choice.
func TestFragmentationHonoursWorkloadNodeAffinity(t *testing.T) {
	onModel := func(m string) *v1.NodeSelector {
		return &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
			MatchExpressions: []v1.NodeSelectorRequirement{{Key: "model", Operator: v1.NodeSelectorOpIn, Values: []string{m}}}}}}
	}
	c := sharedClusterOf(t, makeCluster().Leaf("spine-0", 0, "dgx-h100", 2).Label("model", "a", "l0n0").Label("model", "b", "l0n1"))
	for name, tc := range map[string]struct {
		w    planner.Workload
		want where
	}{
		"halves anywhere":       {planner.Workload{{GPUs: 1, MilliGPU: 500, Weight: 1}}, where{"l0n0/gpu-0"}},
		"halves on a only":      {planner.Workload{{GPUs: 1, MilliGPU: 500, Weight: 1, NodeAffinity: onModel("a")}}, where{"l0n1/gpu-0"}},
		"halves on b only":      {planner.Workload{{GPUs: 1, MilliGPU: 500, Weight: 1, NodeAffinity: onModel("b")}}, where{"l0n0/gpu-0"}},
		"and pods without GPUs": {planner.Workload{{GPUs: 1, MilliGPU: 500, Weight: 1, NodeAffinity: onModel("a")}, {Weight: 3}}, where{"l0n1/gpu-0"}},
	} {
		t.Run(name, func(t *testing.T) {
			p := planner.New(newEvaluator(t), planner.WithWorkload(tc.w))
			if got := planAll(t, p, planner.NewSnapshot(c, nil), shareJob(t, "q", 250)); !cmp.Equal(tc.want, got) {
				t.Errorf("placed on %v, want %v", got, tc.want)
			}
		})
	}
}

// A node left without the CPU the expected pods ask for strands its free
// GPUs: the pod goes where its CPU strands nothing, and so does a pod
// without GPUs.
func TestFragmentationCountsCPU(t *testing.T) {
	halves := planner.Workload{{GPUs: 1, MilliGPU: 500, Requests: resources("cpu", "8"), Weight: 1}}
	p := planner.New(newEvaluator(t), planner.WithWorkload(halves))
	leaf := func() *clusterBuilder { return makeCluster().Leaf("spine-0", 0, "dgx-h100", 2) }
	uncounted := sharedCluster(t)
	counted := sharedClusterOf(t, leaf().
		Allocatable(resources("cpu", "10", "memory", "1Ti", "pods", "110"), "l0n0").
		Allocatable(resources("cpu", "40", "memory", "1Ti", "pods", "110"), "l0n1"))

	half := shareJob(t, "half", 500)
	half.Pods[0].Requests = resources("cpu", "4")
	cpuOnly := planner.Job{Key: "cpu", Pods: []planner.Pod{{Name: "p0", Requests: resources("cpu", "4")}}}
	tests := map[string]struct {
		job     planner.Job
		cluster *planner.Cluster
		want    string
	}{
		"CPU not counted: the first node":          {half, uncounted, "l0n0"},
		"CPU counted: the node it does not strand": {half, counted, "l0n1"},
		"a pod without GPUs":                       {cpuOnly, counted, "l0n1"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			plan, err := p.Plan(context.Background(), planner.NewSnapshot(tc.cluster, nil), nil, tc.job)
			if err != nil {
				t.Fatal(err)
			}
			if got := plan.Assignments["p0"]; got != tc.want {
				t.Errorf("placed on %s, want %s (%q)", got, tc.want, plan.Reasons)
			}
		})
	}
	// What the pods on a node already take counts too, several WithUsed
	// adding up: with 38 of l0n1's CPUs in use, the pod only fits on l0n0.
	half19 := planner.WithUsed(onNodes(resources("cpu", "19"), "l0n1"))
	snap := planner.NewSnapshot(counted, nil, half19, half19)
	if plan, err := p.Plan(context.Background(), snap, nil, half); err != nil || plan.Assignments["p0"] != "l0n0" {
		t.Errorf("with l0n1 busy, want l0n0: %v, %v", plan, err)
	}
	// No node has the CPU: a refusal that says what is missing.
	big := shareJob(t, "big", 500)
	big.Pods[0].Requests = resources("cpu", "64")
	var refused *planner.Unschedulable
	if _, err := p.Plan(context.Background(), planner.NewSnapshot(counted, nil), nil, big); !errors.As(err, &refused) || !strings.Contains(err.Error(), "2 without enough cpu") {
		t.Errorf("want Unschedulable naming the CPU, got %v", err)
	}
}

// When the nodes a one-pod job may use lack only GPUs, the refusal says
// so at once and names the nodes its filters rule out.
func TestOnePodRefusalWhenGPUsAreFull(t *testing.T) {
	c := sharedClusterOf(t, makeCluster().Leaf("spine-0", 0, "dgx-h100", 3).Cordon("l0n2"))
	state := devicefit.NewState()
	for _, node := range []string{"l0n0", "l0n1"} {
		for g := range 8 {
			state.Devices.Insert(gpuID(node, g))
		}
	}
	p := planner.New(newEvaluator(t))
	_, err := p.Plan(context.Background(), planner.NewSnapshotFromState(c, state), nil, shareJob(t, "late", 250))
	var refused *planner.Unschedulable
	if !errors.As(err, &refused) {
		t.Fatalf("want Unschedulable, got %v", err)
	}
	want := []planner.FilteredNodes{{Filter: planner.FilterCordoned, Nodes: 1}}
	if diff := cmp.Diff(want, refused.Filtered); diff != "" || !strings.Contains(refused.Reason, "2 nodes the pod may use have too little free") {
		t.Errorf("refusal %q, filtered (-want +got):\n%s", refused.Reason, diff)
	}
}

// Places whose rise in fragmentation lies within a few milliGPU of the
// least count as equal, and the planner packs among them. With wholes
// and a few halves expected, a quarter on l0n1's gpu-0 (750 free) strands
// 2.5 milliGPU less per expected pod than on l0n0's gpu-0 (500 free); the
// difference is noise (the two places have the same FGD score), and l0n0
// comes first (and is the fuller node). A larger difference still
// decides: with l0n0's gpu-0 whole, a quarter there would strand three
// quarters of a GPU, so it goes to l0n1 although l0n0 comes first.
func TestNearEqualFragmentationPacks(t *testing.T) {
	mostlyWholes := planner.Workload{{GPUs: 1, MilliGPU: 1000, Weight: 99}, {GPUs: 1, MilliGPU: 500, Weight: 1}}
	p := planner.New(newEvaluator(t), planner.WithWorkload(mostlyWholes))
	share := func(state devicefit.State, node string, gpu int, milli string) {
		state.AddShare(devicefit.Share{Device: gpuID(node, gpu), ShareID: fmt.Sprintf("%s-%d", node, gpu),
			Consumed: map[resourceapi.QualifiedName]resource.Quantity{topology.CapacityMilliGPU: resource.MustParse(milli)}})
	}
	tests := map[string]struct {
		l0n0, l0n1 string // consumed of gpu-0 (none: whole); l0n0's other GPUs hold 900 each
		want       string
	}{
		"the same score: the first node": {"500", "250", "l0n0/gpu-0"},
		"a lower score: the least rise":  {"", "500", "l0n1/gpu-0"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			state := devicefit.NewState()
			if tc.l0n0 != "" {
				share(state, "l0n0", 0, tc.l0n0)
			}
			for g := 1; g < 8; g++ {
				share(state, "l0n0", g, "900")
			}
			share(state, "l0n1", 0, tc.l0n1)
			got := planAll(t, p, planner.NewSnapshotFromState(sharedCluster(t), state), shareJob(t, "q", 250))
			if diff := cmp.Diff(where{tc.want}, got); diff != "" {
				t.Errorf("placements (-want +got):\n%s", diff)
			}
		})
	}
}

// Scoring alike nodes once gives one-pod plans exactly what scoring every
// node does. Nodes differ in which GPUs are held and in how much cpu their
// pods take, so some keys are shared and some not.
func TestScoreMemoPlansLikeScoringEveryNode(t *testing.T) {
	b := makeCluster()
	for l := range 4 {
		b.Leaf("spine-0", l, "dgx-h100", 6)
	}
	b.Allocatable(node8)
	c := b.Obj(t)
	held := allocated()
	pods := planner.NodeUsage{}
	for l := range 4 {
		for i := range 6 {
			name := fmt.Sprintf("l%dn%d", l, i)
			switch (l*6 + i) % 5 {
			case 0:
				held.GPUs(name, 0, 1, 2, 3)
			case 1:
				held.GPUs(name, 0, 1, 2, 3, 4, 5, 6)
			case 2:
				held.GPUs(name, 2)
			}
			if i%3 == 0 {
				pods[name] = resources("cpu", fmt.Sprint(1+2*l))
			}
		}
	}
	snap := planner.NewSnapshot(c, held.Obj(), planner.WithUsed(pods))
	// Expected pods that need cpu make what is left of it count.
	w := planner.DefaultWorkload()
	for i := range w {
		if w[i].GPUs > 1 {
			w[i].Requests = resources("cpu", "3")
		}
	}
	// Two nodes alike in their GPUs, but the first would be left with too
	// little cpu for the expected 2-GPU pods: only the cpu tells them apart.
	twins := makeCluster().Leaf("spine-0", 0, "dgx-h100", 2).Allocatable(node8).Obj(t)
	snaps := map[string]*planner.Snapshot{
		"varied": snap,
		"twins":  planner.NewSnapshot(twins, nil, planner.WithUsed(planner.NodeUsage{"l0n0": resources("cpu", "5")})),
	}
	for _, tmpl := range []string{"gpu-1", "gpu-2-nvlink-pair", "gpu-4-nvlink", "gpu-8-node"} {
		for _, strategy := range []planner.Strategy{planner.StrategyBalanced, planner.StrategyConsolidated, planner.StrategyDistributed} {
			for name, snap := range snaps {
				t.Run(name+"/"+tmpl+"/"+string(strategy), func(t *testing.T) {
					job := makeJob(t, "j").Pods(1, tmpl).Request(resources("cpu", "2")).Strategy(strategy).Obj()
					plan := func(memo bool) *planner.Plan {
						defer planner.SetScoreMemo(memo)()
						p, err := planner.New(newEvaluator(t), planner.WithWorkload(w)).Plan(context.Background(), snap, nil, job)
						if err != nil {
							t.Fatalf("memo %v: %v", memo, err)
						}
						return p
					}
					memo, every := plan(true), plan(false)
					if diff := cmp.Diff(every, memo); diff != "" {
						t.Errorf("plan with shared scores differs (-every node +shared):\n%s", diff)
					}
				})
			}
		}
	}
}

// Among places of equal FGD score a pod with GPUs goes to a node in use
// before a free one, to the first in the cluster's order (spine, leaf,
// name), fuller nodes elsewhere or not; when it must take a free node, it
// takes one from the leaf with the fewest, keeping whole leaves whole.
// A pod without GPUs, among places within the tolerance, goes to the
// node with the fewest free GPUs, and among free nodes to the leaf with
// the fewest, spending CPU where GPUs are already in use.
func TestEqualPlacesPack(t *testing.T) {
	halves := planner.Workload{{GPUs: 1, MilliGPU: 500, Requests: resources("cpu", "8"), Weight: 1}}
	p := planner.New(newEvaluator(t), planner.WithWorkload(halves))
	cpuOnly := planner.Job{Key: "cpu", Pods: []planner.Pod{{Name: "p0", Requests: resources("cpu", "4")}}}
	tests := map[string]struct {
		job  planner.Job
		full map[string]int // GPUs held whole, by node
		want string
	}{
		// l1n0 is the fullest; l0n0 comes first.
		"a share: the first node, not the fullest": {shareJob(t, "h", 500), map[string]int{"l0n0": 4, "l1n0": 7}, "l0n0/gpu-4"},
		"a share: a node in use before a free one": {shareJob(t, "h", 500), map[string]int{"l0n0": 8, "l1n0": 7}, "l1n0/gpu-7"},
		// Only free nodes have room: leaf-1 has two, leaf-0 three.
		"a share on a free node: the leaf with the fewest": {shareJob(t, "h", 500), nil, "l1n0/gpu-0"},
		"no GPUs: the fullest node":                        {cpuOnly, map[string]int{"l0n0": 4, "l1n0": 7}, "l1n0"},
		"no GPUs: a node whose GPUs are all held":          {cpuOnly, map[string]int{"l0n0": 8, "l1n0": 7}, "l0n0"},
		// Every node free: leaf-1 has two free nodes, leaf-0 three.
		"no GPUs: the leaf with the fewest free nodes": {cpuOnly, nil, "l1n0"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			state := devicefit.NewState()
			for node, n := range tc.full {
				for g := range n {
					state.AddShare(devicefit.Share{Device: gpuID(node, g), ShareID: fmt.Sprintf("%s-%d", node, g),
						Consumed: map[resourceapi.QualifiedName]resource.Quantity{topology.CapacityMilliGPU: resource.MustParse("1000")}})
				}
			}
			c := sharedClusterOf(t, makeCluster().Leaf("spine-0", 0, "dgx-h100", 3).Leaf("spine-0", 1, "dgx-h100", 2).
				Allocatable(resources("cpu", "64", "memory", "1Ti", "pods", "110"), "l0n0", "l0n1", "l0n2", "l1n0", "l1n1"))
			snap := planner.NewSnapshotFromState(c, state)
			if len(tc.job.Pods[0].Claims) == 0 {
				plan, err := p.Plan(context.Background(), snap, nil, tc.job)
				if err != nil {
					t.Fatal(err)
				}
				if got := plan.Assignments["p0"]; got != tc.want {
					t.Errorf("placed on %s, want %s (%q)", got, tc.want, plan.Reasons)
				}
				return
			}
			if diff := cmp.Diff(where{tc.want}, planAll(t, p, snap, tc.job)); diff != "" {
				t.Errorf("placements (-want +got):\n%s", diff)
			}
		})
	}
}

// Measuring a snapshot changes nothing a later plan sees: a GPU with a
// share held counts as in use for the measure only, and still takes the
// next share.
func TestMeasureLeavesTheSnapshotAsItWas(t *testing.T) {
	state := devicefit.NewState()
	for _, node := range []string{"l0n0", "l0n1"} {
		for g := range 8 {
			if node != "l0n0" || g != 0 {
				state.Devices.Insert(gpuID(node, g))
			}
		}
	}
	state.AddShare(devicefit.Share{Device: gpuID("l0n0", 0), ShareID: "half",
		Consumed: map[resourceapi.QualifiedName]resource.Quantity{topology.CapacityMilliGPU: resource.MustParse("500")}})
	snap := planner.NewSnapshotFromState(sharedCluster(t), state)
	if u := planner.Measure(snap, nil); u.Used != 16 {
		t.Errorf("measured %d GPUs in use, want 16 (one of them shared)", u.Used)
	}
	got := planAll(t, planner.New(newEvaluator(t)), snap, shareJob(t, "q", 250))
	if diff := cmp.Diff(where{"l0n0/gpu-0"}, got); diff != "" {
		t.Errorf("after Measure, placements (-want +got):\n%s", diff)
	}
}
