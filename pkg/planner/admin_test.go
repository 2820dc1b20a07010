package planner_test

import (
	"context"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/planner"
)

// adminAccess makes the latest pods' claims ask for admin access: a
// monitoring pod that reads every GPU of its node takes none of them, as
// the scheduler's allocator sees it.
func (b *jobBuilder) adminAccess() *jobBuilder {
	return b.each(func(p *planner.Pod) {
		for _, cl := range p.Claims {
			for i := range cl.Spec.Devices.Requests {
				if r := cl.Spec.Devices.Requests[i].Exactly; r != nil {
					r.AdminAccess = ptr.To(true)
				}
			}
		}
	})
}

func TestAdminAccessTakesNoDevice(t *testing.T) {
	c := twoSpines().Obj(t)
	for name, tc := range map[string]struct {
		allocated *usage
		job       planner.Job
		want      *placed
	}{
		// Both pods of the group read all 8 GPUs of the one node the
		// selector leaves them; neither takes them from the other.
		"two admin pods on one node": {
			allocated: allocated(),
			job:       makeJob(t, "mon").Pods(2, "gpu-8-node").adminAccess().Requires(v1.NodeSelectorTerm{MatchFields: []v1.NodeSelectorRequirement{{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{"l1n1"}}}}).Obj(),
			want:      &placed{Domain: leaf("leaf-1"), Assignments: assign("l1n1", "l1n1")},
		},
		// Every GPU of the node is held by other claims: admin access
		// still reads them.
		"admin pod on a full node": {
			allocated: allocated().Nodes("l0n0", "l0n1", "l1n0", "l1n1", "l2n0", "l2n1", "l3n0", "l3n1"),
			job:       makeJob(t, "mon").Pods(1, "gpu-8-node").adminAccess().Obj(),
			want:      &placed{Domain: planner.Domain{Level: planner.LevelNode, Names: []string{"l0n0"}}, Assignments: assign("l0n0")},
		},
	} {
		t.Run(name, func(t *testing.T) {
			plan, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, tc.allocated.Obj()), nil, tc.job)
			checkPlan(t, plan, err, tc.want, nil)
		})
	}
}
