package planner_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/planner"
)

// planDevices lists the devices a plan holds.
func planDevices(p *planner.Plan) map[structured.DeviceID]bool {
	out := map[structured.DeviceID]bool{}
	for _, ids := range p.Reservation().Devices {
		for _, id := range ids {
			out[id] = true
		}
	}
	return out
}

// Two jobs planned one after the other against one snapshot: the second
// sees the first one's reservation and never gets its devices.
func TestJobsInARowNeverCollide(t *testing.T) {
	c := fourLeaves().Obj(t)
	p := newPlanner(t)
	snap := planner.NewSnapshot(c, allocated().Nodes("l0n0").Obj())
	res := planner.NewReservations()
	ctx := context.Background()

	jobA := makeJob(t, "a").Pods(2, "gpu-4-nvlink").Strategy(planner.StrategyConsolidated).Obj()
	a, err := p.Plan(ctx, snap, res, jobA)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(assign("l0n1", "l0n1"), a.Assignments); diff != "" {
		t.Errorf("job a (-want +got):\n%s", diff)
	}
	if err := res.Add(a.Reservation()); err != nil {
		t.Fatal(err)
	}

	// Same shape, same snapshot: without the reservation it would take
	// l0n1 again.
	b, err := p.Plan(ctx, snap, res, makeJob(t, "b").Pods(2, "gpu-4-nvlink").Strategy(planner.StrategyConsolidated).Obj())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(assign("l0n2", "l0n2"), b.Assignments); diff != "" {
		t.Errorf("job b (-want +got):\n%s", diff)
	}
	for id := range planDevices(b) {
		if planDevices(a)[id] {
			t.Errorf("device %s is held by both jobs", id)
		}
	}
	if err := res.Add(b.Reservation()); err != nil {
		t.Fatal(err)
	}

	// Planning a job again ignores its own reservation: the plan is the same.
	again, err := p.Plan(ctx, snap, res, jobA)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(a.Reservation(), again.Reservation(), cmpopts.EquateComparable(structured.DeviceID{})); diff != "" {
		t.Errorf("replanned job a (-want +got):\n%s", diff)
	}

	// A third job cannot take a held device.
	stolen := a.Reservation()
	stolen.Job = "c"
	var conflict *planner.ConflictError
	if err := res.Add(stolen); !errors.As(err, &conflict) || conflict.Holder != "a" {
		t.Errorf("want a conflict with job a, got %v", err)
	}
	if !res.Remove("a") || res.Remove("a") {
		t.Error("Remove should report the reservation once")
	}
	if err := res.Add(stolen); err != nil {
		t.Errorf("after a is removed its devices are free: %v", err)
	}
	if diff := cmp.Diff([]string{"b", "c"}, res.Jobs()); diff != "" {
		t.Errorf("jobs (-want +got):\n%s", diff)
	}
}

// A group of eight 8-GPU pods ran on leaf-1 and leaf-2; one pod is being
// replaced. The other seven are pinned:
//
//	                     spine-0
//	  +------------+------------+------------+
//	leaf-0       leaf-1       leaf-2       leaf-3
//	(free)     l1n0 job       l2n0 job      (free)
//	           l1n1 job       l2n1 job
//	           l1n2 job       l2n2 job
//	           l1n3 job       l2n3 free/other
func TestReplacementKeepsTheDomain(t *testing.T) {
	group := []string{"l1n0", "l1n1", "l1n2", "l1n3", "l2n0", "l2n1", "l2n2"}
	c := fourLeaves().Obj(t)
	pinned := func(b *jobBuilder) *jobBuilder {
		for i, n := range group {
			b.Pinned("old-"+string(rune('a'+i)), n)
		}
		return b
	}
	tests := map[string]struct {
		allocated *usage
		job       func(t testing.TB) planner.Job
		want      *placed
		wantErr   *planner.Unschedulable
	}{
		"replacement returns to the group's leaves": {
			allocated: allocated().Nodes(group...),
			job:       func(t testing.TB) planner.Job { return pinned(makeJob(t, "j").Pods(1, "gpu-8-node")).Obj() },
			want:      &placed{Domain: leaves("leaf-1", "leaf-2"), Assignments: assign("l2n3")},
		},
		"replacement widens to adjacent leaves that hold the group when its leaves are full": {
			allocated: allocated().Nodes(group...).Nodes("l2n3"),
			job:       func(t testing.TB) planner.Job { return pinned(makeJob(t, "j").Pods(1, "gpu-8-node")).Obj() },
			want:      &placed{Domain: leaves("leaf-0", "leaf-1", "leaf-2"), Assignments: assign("l0n0"), Widened: true},
		},
		"a same-leaf group does not widen": {
			allocated: allocated().Nodes("l3n0", "l3n1", "l3n2", "l3n3"),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(1, "gpu-8-node").Placement(planner.PlacementSameLeaf).Pinned("old", "l3n0").Obj()
			},
			wantErr: &planner.Unschedulable{Job: "j",
				Reason: "the domain of the job's running pods, leaf leaf-3 cannot hold 1 pod (8 GPUs each)"},
		},
		"a full recorded domain widens around the pinned pods, not elsewhere": {
			allocated: allocated().Nodes("l3n0", "l3n1", "l3n2", "l3n3"),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(1, "gpu-8-node").Domain(planner.LevelLeaf, "leaf-3").Pinned("old", "l3n0").Obj()
			},
			want: &placed{Domain: leaves("leaf-2", "leaf-3"), Assignments: assign("l2n0"), Widened: true},
		},
		"a preference does not move a running group": {
			allocated: allocated().Nodes(group...),
			job: func(t testing.TB) planner.Job {
				return pinned(makeJob(t, "j").Pods(1, "gpu-8-node").Prefer("leaf-0", true)).Obj()
			},
			want: &placed{Domain: leaves("leaf-1", "leaf-2"), Assignments: assign("l2n3")},
		},
		"pinned pods in one leaf keep the replacement there": {
			allocated: allocated().Nodes("l3n0"),
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(1, "gpu-8-node").Pinned("old", "l3n0").Obj()
			},
			want: &placed{Domain: leaf("leaf-3"), Assignments: assign("l3n1")},
		},
		"explicit domain": {
			job: func(t testing.TB) planner.Job {
				return makeJob(t, "j").Pods(2, "gpu-8-node").Domain(planner.LevelLeaves, "leaf-2", "leaf-3").Strategy(planner.StrategyDistributed).Obj()
			},
			want: &placed{Domain: leaves("leaf-2", "leaf-3"), Assignments: assign("l2n0", "l3n0")},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			alloc := devicefit.Allocated{}
			if tc.allocated != nil {
				alloc = tc.allocated.Obj()
			}
			plan, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, alloc), nil, tc.job(t))
			checkPlan(t, plan, err, tc.want, tc.wantErr)
		})
	}
}

// Plans share the cluster, the snapshot and the reservations, and only
// read them: the same job planned from many goroutines at once gets the
// same plan as alone. Run with -race.
func TestConcurrentPlans(t *testing.T) {
	c := fourLeaves().Obj(t)
	p := newPlanner(t)
	snap := planner.NewSnapshot(c, allocated().Nodes("l1n0").GPUs("l2n1", 0, 1).Obj())
	res := planner.NewReservations()
	jobs := []planner.Job{
		makeJob(t, "a").Pods(3, "gpu-8-node").Obj(),
		makeJob(t, "b").Pods(4, "gpu-4-nvlink").Strategy(planner.StrategyDistributed).Obj(),
		makeJob(t, "c").Pods(2, "gpu-2-nvlink-pair").Pods(2, "gpu-1").Strategy(planner.StrategyConsolidated).Obj(),
	}
	want := make([]map[string]string, len(jobs))
	for i, j := range jobs {
		plan, err := p.Plan(context.Background(), snap, res, j)
		if err != nil {
			t.Fatal(err)
		}
		want[i] = plan.Assignments
	}
	errs := make(chan error, 4*len(jobs))
	for range 4 {
		for i, j := range jobs {
			go func() {
				plan, err := p.Plan(context.Background(), snap, res, j)
				if err == nil && !cmp.Equal(want[i], plan.Assignments) {
					err = errors.New("job " + j.Key + " planned differently: " + cmp.Diff(want[i], plan.Assignments))
				}
				errs <- err
			}()
		}
	}
	for range 4 * len(jobs) {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
