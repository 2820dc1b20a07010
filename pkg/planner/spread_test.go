package planner_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/topology"
)

// spreadBy is a DoNotSchedule topology spread constraint on key over the
// pods labelled app=train.
func spreadBy(key string, maxSkew int32) v1.TopologySpreadConstraint {
	return v1.TopologySpreadConstraint{MaxSkew: maxSkew, TopologyKey: key, WhenUnsatisfiable: v1.DoNotSchedule,
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "train"}}}
}

// counted is a pod labelled app=train (and run=run) in namespace ns on
// node, bound or on its way there.
func counted(node, ns, run string, bound bool) planner.Neighbour {
	return planner.Neighbour{Node: node, Bound: bound, Pod: planner.Pod{Name: "c-" + node,
		Members: []planner.Member{{Namespace: ns, Labels: map[string]string{"app": "train", "run": run}}}}}
}

// everyNode is a bound app=train pod of namespace ns on each node of the
// labelled cluster but skip.
func everyNode(ns string, skip ...string) []planner.Neighbour {
	var out []planner.Neighbour
	for l := range 2 {
		for n := range 4 {
			name := fmt.Sprintf("l%dn%d", l, n)
			if !contains(skip, name) {
				out = append(out, counted(name, ns, "a", true))
			}
		}
	}
	return out
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestTopologySpreadConstraints: the planner keeps the job's pods within
// what kube-scheduler's PodTopologySpread filter allows, whatever order
// they bind in: the pods a constraint selects in a value where a pod
// carrying it goes exceed the fewest in any eligible value by at most
// maxSkew, counting the pods outside the job (bound or on their way) in
// the pod's namespace. Where no domain allows that, the job is planned
// without them and says so.
func TestTopologySpreadConstraints(t *testing.T) {
	hostname, leafKey := v1.LabelHostname, topology.LabelTopographLeaf
	c := labelled().Obj(t)
	spine0 := planner.Domain{Level: planner.LevelSpine, Names: []string{"spine-0"}}
	tests := map[string]struct {
		pods       int
		spread     []v1.TopologySpreadConstraint
		counted    []planner.Neighbour
		edit       func(*planner.Pod)
		job        func(*planner.Job)
		tainted    string // a node tainted NoSchedule, which the pods do not tolerate
		want       *placed
		refused    bool // Unschedulable, as the scheduler leaves the pods pending
		wantReason string
	}{
		"without a constraint both share l0n0": {
			pods: 2,
			want: &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n0")},
		},
		"one pod per node by hostname": {
			pods: 2, spread: []v1.TopologySpreadConstraint{spreadBy(hostname, 1)},
			want:       &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n1")},
			wantReason: "the job's pods spread by kubernetes.io/hostname (their topology spread constraints)",
		},
		"maxSkew 2 lets two share a node": {
			pods: 2, spread: []v1.TopologySpreadConstraint{spreadBy(hostname, 2)},
			want: &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n0")},
		},
		"a pod outside the job counts": {
			pods: 2, spread: []v1.TopologySpreadConstraint{spreadBy(hostname, 1)},
			counted: []planner.Neighbour{counted("l0n0", "ns", "a", true)},
			want:    &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n1", "l0n2")},
		},
		"a pod in another namespace does not": {
			pods: 1, spread: []v1.TopologySpreadConstraint{spreadBy(hostname, 1)},
			counted: []planner.Neighbour{counted("l0n0", "other", "a", true)},
			want:    &placed{Domain: planner.Domain{Level: planner.LevelNode, Names: []string{"l0n0"}}, Assignments: assign("l0n0")},
		},
		"a one-pod job leaves the node another pod is on": {
			pods: 1, spread: []v1.TopologySpreadConstraint{spreadBy(hostname, 1)},
			counted: []planner.Neighbour{counted("l0n0", "ns", "a", true)},
			want:    &placed{Domain: planner.Domain{Level: planner.LevelNode, Names: []string{"l0n1"}}, Assignments: assign("l0n1")},
		},
		"the minimum rises with a pod on every node": {
			pods: 1, spread: []v1.TopologySpreadConstraint{spreadBy(hostname, 1)},
			counted: everyNode("ns"),
			want:    &placed{Domain: planner.Domain{Level: planner.LevelNode, Names: []string{"l0n0"}}, Assignments: assign("l0n0")},
		},
		"a pod on its way counts where it goes": {
			pods: 1, spread: []v1.TopologySpreadConstraint{spreadBy(hostname, 1)},
			counted: append(everyNode("ns"), counted("l0n0", "ns", "b", false)),
			want:    &placed{Domain: planner.Domain{Level: planner.LevelNode, Names: []string{"l0n1"}}, Assignments: assign("l0n1")},
		},
		"the only node below the others takes the pod": {
			pods: 1, spread: []v1.TopologySpreadConstraint{spreadBy(hostname, 1)},
			counted: everyNode("ns", "l1n2"),
			want:    &placed{Domain: planner.Domain{Level: planner.LevelNode, Names: []string{"l1n2"}}, Assignments: assign("l1n2")},
		},
		"matchLabelKeys counts only the pods of the same run": {
			pods: 1, spread: []v1.TopologySpreadConstraint{func() v1.TopologySpreadConstraint {
				c := spreadBy(hostname, 1)
				c.MatchLabelKeys = []string{"run"}
				return c
			}()},
			counted: []planner.Neighbour{counted("l0n0", "ns", "a", true), counted("l0n1", "ns", "b", true)},
			want:    &placed{Domain: planner.Domain{Level: planner.LevelNode, Names: []string{"l0n1"}}, Assignments: assign("l0n1")},
		},
		"by leaf, one pod per leaf": {
			pods: 2, spread: []v1.TopologySpreadConstraint{spreadBy(leafKey, 1)},
			want: &placed{Domain: spine0, Assignments: assign("l0n0", "l1n0")},
		},
		"node affinity honoured: the minimum is over the nodes the pod may use": {
			pods: 1, spread: []v1.TopologySpreadConstraint{spreadBy(hostname, 1)},
			counted: everyNode("ns", "l1n2"),
			edit:    func(p *planner.Pod) { p.NodeSelector = map[string]string{leafKey: "leaf-0"} },
			want:    &placed{Domain: planner.Domain{Level: planner.LevelNode, Names: []string{"l0n0"}}, Assignments: assign("l0n0")},
		},
		"node affinity ignored: the minimum is over every node": {
			pods: 1, spread: []v1.TopologySpreadConstraint{func() v1.TopologySpreadConstraint {
				c := spreadBy(hostname, 1)
				c.NodeAffinityPolicy = ptr.To(v1.NodeInclusionPolicyIgnore)
				return c
			}()},
			counted: everyNode("ns", "l1n2"),
			edit:    func(p *planner.Pod) { p.NodeSelector = map[string]string{leafKey: "leaf-0"} },
			refused: true,
		},
		"taints honoured: a tainted node's value is not counted": {
			pods: 1, spread: []v1.TopologySpreadConstraint{func() v1.TopologySpreadConstraint {
				c := spreadBy(hostname, 1)
				c.NodeTaintsPolicy = ptr.To(v1.NodeInclusionPolicyHonor)
				return c
			}()},
			counted: everyNode("ns", "l1n3"), tainted: "l1n3",
			want: &placed{Domain: planner.Domain{Level: planner.LevelNode, Names: []string{"l0n0"}}, Assignments: assign("l0n0")},
		},
		"taints ignored: the tainted node's empty value is the minimum": {
			pods: 1, spread: []v1.TopologySpreadConstraint{spreadBy(hostname, 1)},
			counted: everyNode("ns", "l1n3"), tainted: "l1n3",
			refused: true,
		},
		"the nodes counted follow the pod's own affinity, not what the caller narrowed it to": {
			pods: 1, spread: []v1.TopologySpreadConstraint{spreadBy(hostname, 1)},
			counted: everyNode("ns", "l1n2"),
			edit: func(p *planner.Pod) {
				p.OwnNodeAffinity = &v1.NodeAffinity{}
				p.NodeAffinity = &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
					MatchFields: []v1.NodeSelectorRequirement{{Key: "metadata.name", Operator: v1.NodeSelectorOpNotIn, Values: []string{"l1n2"}}}}}}}
			},
			refused: true,
		},
		"a pinned pod on its way does not raise the minimum": {
			pods: 1, spread: []v1.TopologySpreadConstraint{spreadBy(hostname, 1)},
			counted: everyNode("ns", "l0n0"),
			job: func(j *planner.Job) {
				j.Placement = planner.PlacementNone
				j.Pinned = map[string]string{"old": "l0n0"}
				j.PinnedPods = map[string]planner.Pod{"old": {Members: []planner.Member{{Namespace: "ns", Labels: map[string]string{"app": "train", "run": "a"}}}}}
				j.Unbound = map[string]bool{"old": true}
			},
			wantReason: "planned so they hold in the order placed",
		},
		"minDomains above the values counts the minimum as 0": {
			pods: 1, spread: []v1.TopologySpreadConstraint{func() v1.TopologySpreadConstraint {
				c := spreadBy(hostname, 1)
				c.MinDomains = ptr.To[int32](9)
				return c
			}()},
			counted: everyNode("ns"),
			refused: true,
		},
		"a key no node has fits nowhere": {
			pods: 2, spread: []v1.TopologySpreadConstraint{spreadBy("example.com/zone", 1)},
			refused: true,
		},
		"more pods than leaves: kept in the order placed": {
			pods: 4, spread: []v1.TopologySpreadConstraint{spreadBy(leafKey, 1)},
			want:       &placed{Domain: spine0, Assignments: assign("l0n0", "l1n0", "l0n0", "l1n0")},
			wantReason: "no domain keeps the pods' topology spread constraints whatever order they bind in",
		},
		"ScheduleAnyway is not weighed": {
			pods: 2, spread: []v1.TopologySpreadConstraint{func() v1.TopologySpreadConstraint {
				c := spreadBy(hostname, 1)
				c.WhenUnsatisfiable = v1.ScheduleAnyway
				return c
			}()},
			want: &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n0")},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			job := makeJob(t, "j").Pods(tc.pods, "gpu-4-nvlink").Strategy(planner.StrategyConsolidated).member("ns", "train").Obj()
			for i := range job.Pods {
				job.Pods[i].Spread = tc.spread
				job.Pods[i].Members[0].Labels["run"] = "a"
				if tc.edit != nil {
					tc.edit(&job.Pods[i])
				}
			}
			job.Spread = tc.counted
			if tc.job != nil {
				tc.job(&job)
			}
			cluster := c
			if tc.tainted != "" {
				cluster = labelled().Taint("example.com/down=yes:NoSchedule", tc.tainted).Obj(t)
			}
			plan, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(cluster, nil), nil, job)
			if tc.refused {
				var u *planner.Unschedulable
				if !errors.As(err, &u) {
					t.Fatalf("want Unschedulable, got plan %v, error %v", plan, err)
				}
				if !strings.Contains(u.Reason, "its pods spread by") {
					t.Errorf("the refusal %q does not name the spread constraints", u.Reason)
				}
				return
			}
			if tc.want != nil {
				checkPlan(t, plan, err, tc.want, nil)
			} else if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			if tc.wantReason != "" && !hasReason(plan.Reasons, tc.wantReason) {
				t.Errorf("reasons do not say %q:\n%v", tc.wantReason, plan.Reasons)
			}
		})
	}
}
