package planner_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/planner"
)

// rackKey stands for a PodGroup's topology key. In these clusters it
// follows the leaves, except where a case relabels nodes:
//
//	                     spine-0
//	  +------------+------------+------------+
//	leaf-0       leaf-1       leaf-2       leaf-3
//	rack a       rack b       rack c       rack d
const rackKey = "example.com/rack"

func racked() *clusterBuilder {
	return fourLeaves().
		Label(rackKey, "a", "l0n0", "l0n1", "l0n2", "l0n3").
		Label(rackKey, "b", "l1n0", "l1n1", "l1n2", "l1n3").
		Label(rackKey, "c", "l2n0", "l2n1", "l2n2", "l2n3").
		Label(rackKey, "d", "l3n0", "l3n1", "l3n2", "l3n3")
}

func TestPlanTopologyKey(t *testing.T) {
	tests := map[string]struct {
		cluster   *clusterBuilder
		allocated *usage
		job       func(t testing.TB) planner.Job
		want      *placed
		// wantRefusal is a fragment of the refusal; wantFiltered the
		// nodes ruled out by the key.
		wantRefusal  string
		wantFiltered int
	}{
		"a gang that fits in one value lands there": {
			cluster: racked(),
			job: func(t testing.TB) planner.Job {
				return keyed(makeJob(t, "j").Pods(3, "gpu-8-node").Obj())
			},
			want: &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n1", "l0n2")},
		},
		// Without the key, auto widens to two adjacent leaves; the
		// scheduler would refuse that gang, so the planner must too.
		"a gang no value holds is refused, not widened": {
			cluster:   racked(),
			allocated: allocated().Nodes("l0n0", "l0n1", "l1n0", "l1n1", "l2n0", "l2n1", "l3n0", "l3n1"),
			job: func(t testing.TB) planner.Job {
				return keyed(makeJob(t, "j").Pods(3, "gpu-8-node").Obj())
			},
			wantRefusal: "topology constraint allows no larger domain than one value of node label " + rackKey,
		},
		"nodes without the label are ruled out": {
			cluster: fourLeaves().
				Label(rackKey, "a", "l0n2", "l0n3").
				Label(rackKey, "b", "l1n0", "l1n1", "l1n2", "l1n3"),
			job: func(t testing.TB) planner.Job {
				return keyed(makeJob(t, "j").Pods(2, "gpu-8-node").Obj())
			},
			want: &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n2", "l0n3")},
		},
		"a leaf split between two values is not a domain": {
			cluster: racked().Label(rackKey, "a2", "l0n2", "l0n3"),
			job: func(t testing.TB) planner.Job {
				return keyed(makeJob(t, "j").Pods(3, "gpu-8-node").Obj())
			},
			want: &placed{Domain: leaf("leaf-1"), Assignments: assign("l1n0", "l1n1", "l1n2")},
		},
		// A key coarser than a leaf (a spine label) lets runs of leaves
		// under it be used.
		"a coarser key allows a run of leaves": {
			cluster: fourLeaves().Label(rackKey, "spine-0"),
			job: func(t testing.TB) planner.Job {
				return keyed(makeJob(t, "j").Pods(6, "gpu-8-node").Obj())
			},
			want: &placed{Domain: leaves("leaf-0", "leaf-1"), Assignments: assign("l0n0", "l0n1", "l0n2", "l0n3", "l1n0", "l1n1")},
		},
		"the whole cluster across values is refused for placement none": {
			cluster: racked(),
			job: func(t testing.TB) planner.Job {
				return keyed(makeJob(t, "j").Pods(2, "gpu-8-node").Placement(planner.PlacementNone).Obj())
			},
			wantRefusal: "no the whole cluster lies within one value",
		},
		"one pod only needs a labelled node": {
			cluster: fourLeaves().Label(rackKey, "x", "l3n3"),
			job: func(t testing.TB) planner.Job {
				return keyed(makeJob(t, "j").Pods(1, "gpu-8-node").Obj())
			},
			want: &placed{Domain: planner.Domain{Level: planner.LevelNode, Names: []string{"l3n3"}}, Assignments: assign("l3n3")},
		},
		"no labelled node at all says so": {
			cluster: fourLeaves(),
			job: func(t testing.TB) planner.Job {
				return keyed(makeJob(t, "j").Pods(2, "gpu-8-node").Obj())
			},
			wantRefusal:  "16 without node label " + rackKey,
			wantFiltered: 16,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := tc.cluster.Obj(t)
			alloc := devicefit.Allocated{}
			if tc.allocated != nil {
				alloc = tc.allocated.Obj()
			}
			plan, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, alloc), nil, tc.job(t))
			if tc.wantRefusal != "" {
				var u *planner.Unschedulable
				if !errors.As(err, &u) {
					t.Fatalf("want Unschedulable, got plan %+v, error %v", project(plan), err)
				}
				if !strings.Contains(u.Error(), tc.wantRefusal) {
					t.Errorf("refusal %q does not say %q", u.Error(), tc.wantRefusal)
				}
				filtered := 0
				for _, f := range u.Filtered {
					if f.Filter == planner.FilterTopologyKey {
						filtered += f.Nodes
					}
				}
				if filtered != tc.wantFiltered {
					t.Errorf("%d nodes ruled out by the key, want %d", filtered, tc.wantFiltered)
				}
				return
			}
			checkPlan(t, plan, err, tc.want, nil)
		})
	}
}

// TestPlanTopologyKeyAgreesWithoutKey: where every domain the planner
// would choose lies within one value anyway, the key changes nothing.
func TestPlanTopologyKeyAgreesWithoutKey(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		job := makeJob(t, "j").Pods(n, "gpu-8-node").Obj()
		c := racked().Obj(t)
		free, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, devicefit.Allocated{}), nil, job)
		if err != nil {
			t.Fatal(err)
		}
		kept, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, devicefit.Allocated{}), nil, keyed(job))
		if err != nil {
			t.Fatal(err)
		}
		if free.Domain.String() != kept.Domain.String() {
			t.Errorf("%d pods: %s without the key, %s with it", n, free.Domain, kept.Domain)
		}
	}
}

func keyed(j planner.Job) planner.Job {
	j.TopologyKeys = []string{rackKey}
	return j
}
