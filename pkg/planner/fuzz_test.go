package planner_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/planner"
)

var fuzzTemplates = []string{"gpu-1", "gpu-2-nvlink-pair", "gpu-2-pcie-root", "gpu-4-leaf", "gpu-4-nvlink", "gpu-8-node"}

// world is a random small cluster with some GPUs in use.
type world struct {
	infos     []planner.NodeInfo
	byName    map[string]planner.NodeInfo
	cluster   *planner.Cluster
	allocated devicefit.Allocated
}

func randomWorld(t *testing.T, r *rand.Rand) *world {
	b := makeCluster()
	profiles := sim.Builtin()
	leafN := 0
	for s := range r.IntN(3) + 1 {
		spine := fmt.Sprintf("spine-%d", s)
		for range r.IntN(3) + 1 {
			for i := range r.IntN(3) + 1 {
				b.LeafFrom(spine, leafN, i, profiles[r.IntN(len(profiles))], 1)
			}
			leafN++
		}
	}
	if r.IntN(4) == 0 {
		b.Node("loose", profiles[r.IntN(len(profiles))], "", "")
	}
	w := &world{infos: b.Infos(t), byName: map[string]planner.NodeInfo{}, allocated: devicefit.Allocated{}}
	for i := range w.infos {
		w.infos[i].Unschedulable = r.IntN(10) == 0
		w.byName[w.infos[i].Name] = w.infos[i]
		for _, sl := range w.infos[i].Slices {
			for _, d := range sl.Spec.Devices {
				if r.IntN(10) < 3 {
					w.allocated.Insert(devicefit.DeviceID(sl.Spec.Driver, sl.Spec.Pool.Name, d.Name))
				}
			}
		}
	}
	var err error
	if w.cluster, err = planner.NewCluster(w.infos, nil); err != nil {
		t.Fatal(err)
	}
	return w
}

func randomJob(t *testing.T, r *rand.Rand, w *world, key string) planner.Job {
	b := makeJob(t, key)
	for range r.IntN(2) + 1 {
		b.Pods(r.IntN(3)+1, fuzzTemplates[r.IntN(len(fuzzTemplates))])
	}
	placements := []planner.Placement{"", planner.PlacementAuto, planner.PlacementSameLeaf, planner.PlacementAdjacentLeaves, planner.PlacementSameSpine, planner.PlacementNone}
	strategies := []planner.Strategy{"", planner.StrategyConsolidated, planner.StrategyBalanced, planner.StrategyDistributed}
	b.Placement(placements[r.IntN(len(placements))]).Strategy(strategies[r.IntN(len(strategies))])
	if r.IntN(3) == 0 {
		names := []string{"leaf-0", "leaf-1", "spine-0", "spine-1", "leaf-9"}
		b.Prefer(names[r.IntN(len(names))], r.IntN(2) == 0)
	}
	return b.Obj()
}

// FuzzPlan plans two random jobs in a row on a random cluster and checks
// what must always hold: no device is given out twice, every pod fits its
// node according to the allocator on its own, and the domain respects the
// placement mode and a required preference.
func FuzzPlan(f *testing.F) {
	for seed := range uint64(12) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, seed uint64) {
		r := rand.New(rand.NewPCG(seed, seed>>7))
		w := randomWorld(t, r)
		eval := newEvaluator(t)
		p := planner.New(eval)
		snap := planner.NewSnapshot(w.cluster, w.allocated)
		res := planner.NewReservations()
		for _, key := range []string{"a", "b"} {
			job := randomJob(t, r, w, key)
			plan, err := p.Plan(context.Background(), snap, res, job)
			var unsched *planner.Unschedulable
			if errors.As(err, &unsched) {
				if unsched.BestPods >= len(job.Pods) {
					t.Errorf("job %s refused although %s holds all %d pods", key, unsched.BestDomain, unsched.BestPods)
				}
				continue
			}
			if err != nil {
				t.Fatalf("job %s: %v", key, err)
			}
			t.Logf("job %s %s/%s %d pods: %s %v", key, job.Placement, job.Strategy, len(job.Pods), plan.Domain, plan.Assignments)
			w.check(t, eval, res, job, plan)
			if err := res.Add(plan.Reservation()); err != nil {
				t.Fatalf("job %s: reserve: %v", key, err)
			}
		}
	})
}

func (w *world) check(t *testing.T, eval *devicefit.Evaluator, res *planner.Reservations, job planner.Job, plan *planner.Plan) {
	t.Helper()
	taken := devicefit.Allocated{}
	for id := range w.allocated {
		taken.Insert(id)
	}
	for _, other := range res.Jobs() {
		r, _ := res.Get(other)
		for _, ids := range r.Devices {
			taken.Insert(ids...)
		}
	}
	mine := map[structured.DeviceID]string{}
	for _, pod := range job.Pods {
		node, ok := plan.Assignments[pod.Name]
		if !ok || !w.cluster.Has(node) || w.byName[node].Unschedulable {
			t.Fatalf("pod %s is assigned to %q", pod.Name, node)
		}
		for _, result := range plan.Allocations[pod.Name] {
			for _, d := range result.Devices.Results {
				id := devicefit.DeviceID(d.Driver, d.Pool, d.Device)
				if d.Pool != node {
					t.Errorf("pod %s on %s got device %s of another node", pod.Name, node, id)
				}
				if taken.Has(id) {
					t.Errorf("pod %s got device %s, which is allocated or reserved", pod.Name, id)
				}
				if holder, dup := mine[id]; dup {
					t.Errorf("device %s given to pods %s and %s", id, holder, pod.Name)
				}
				mine[id] = pod.Name
			}
		}
	}
	// Each pod must fit on its own, with everything else taken.
	for _, pod := range job.Pods {
		node := plan.Assignments[pod.Name]
		others := taken.Clone()
		for id, holder := range mine {
			if holder != pod.Name {
				others.Insert(id)
			}
		}
		info := w.byName[node]
		got, err := eval.Allocate(context.Background(), nodeObj(info), info.Slices, others, pod.Claims)
		if err != nil || got == nil {
			t.Errorf("pod %s does not fit on %s next to the rest of the plan (err %v)", pod.Name, node, err)
		}
	}
	w.checkDomain(t, job, plan)
}

func (w *world) checkDomain(t *testing.T, job planner.Job, plan *planner.Plan) {
	t.Helper()
	d := plan.Domain
	allowed := map[planner.Placement][]planner.Level{
		planner.PlacementSameLeaf:       {planner.LevelLeaf},
		planner.PlacementAdjacentLeaves: {planner.LevelLeaf, planner.LevelLeaves, planner.LevelSpine},
		planner.PlacementSameSpine:      {planner.LevelSpine},
	}
	if lv, ok := allowed[job.Placement]; ok && !slices.Contains(lv, d.Level) {
		t.Errorf("placement %s got a %s domain", job.Placement, d.Level)
	}
	for _, node := range plan.Assignments {
		info := w.byName[node]
		var in bool
		switch d.Level {
		case planner.LevelNode:
			in = d.Names[0] == node
		case planner.LevelLeaf, planner.LevelLeaves:
			in = slices.Contains(d.Names, info.Leaf)
		case planner.LevelSpine:
			in = info.Spine == d.Names[0]
		case planner.LevelCluster:
			in = len(d.Names) == 0 || slices.Contains(d.Names, info.Spine)
		}
		if !in {
			t.Errorf("node %s (leaf %q, spine %q) is outside %s", node, info.Leaf, info.Spine, d)
		}
		if job.PreferredRequired && (d.Level == planner.LevelLeaf || d.Level == planner.LevelNode) &&
			info.Leaf != job.PreferredDomain && info.Spine != job.PreferredDomain {
			t.Errorf("node %s is outside the required %s", node, job.PreferredDomain)
		}
	}
	if d.Level == planner.LevelLeaves {
		spine := w.cluster.Leaves(w.spineOf(d.Names[0]))
		i := slices.Index(spine, d.Names[0])
		if i < 0 || i+len(d.Names) > len(spine) || !slices.Equal(spine[i:i+len(d.Names)], d.Names) {
			t.Errorf("leaves %v are not adjacent under one spine (%v)", d.Names, spine)
		}
	}
}

func (w *world) spineOf(leaf string) string {
	for _, in := range w.infos {
		if in.Leaf == leaf {
			return in.Spine
		}
	}
	return ""
}

func nodeObj(info planner.NodeInfo) *v1.Node {
	return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: info.Name, Labels: info.Labels}}
}
