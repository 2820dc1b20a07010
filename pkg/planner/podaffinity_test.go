package planner_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/topology"
)

// affinityTerm is a required pod affinity term selecting pods labelled
// app=value in the pod's namespace on key.
func affinityTerm(key, value string) v1.PodAffinityTerm {
	return v1.PodAffinityTerm{LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": value}}, TopologyKey: key}
}

// exclusive is JobSet's exclusive placement on key for a pod of child
// Job child: together with its own Job's pods, apart from every other
// Job's.
func exclusive(key, child string) (members []planner.Member, affinity, anti []v1.PodAffinityTerm) {
	const jobKey = "jobset.sigs.k8s.io/job-key"
	members = []planner.Member{{Namespace: "ns", Labels: map[string]string{jobKey: child}}}
	affinity = []v1.PodAffinityTerm{{TopologyKey: key, LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: jobKey, Operator: metav1.LabelSelectorOpIn, Values: []string{child}}}}}}
	anti = []v1.PodAffinityTerm{{TopologyKey: key, LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: jobKey, Operator: metav1.LabelSelectorOpExists}, {Key: jobKey, Operator: metav1.LabelSelectorOpNotIn, Values: []string{child}}}}}}
	return members, affinity, anti
}

// TestPodAffinityKeepsPodsTogether: required pod affinity as
// kube-scheduler's InterPodAffinity filter weighs it. The job's pods go
// where a pod their term selects is, or together into one value when the
// term selects only the job's own pods; a term selecting no pod at all,
// or on a key the nodes lack, fits nowhere.
func TestPodAffinityKeepsPodsTogether(t *testing.T) {
	hostname, leafKey := v1.LabelHostname, topology.LabelTopographLeaf
	c := labelled().Obj(t)
	spine0 := planner.Domain{Level: planner.LevelSpine, Names: []string{"spine-0"}}
	tests := map[string]struct {
		pods       int
		template   string
		strategy   planner.Strategy
		edit       func(*planner.Job)
		want       *placed
		refused    string // a phrase of the refusal
		wantReason string
	}{
		"distributed without terms spreads": {
			pods: 2, template: "gpu-4-nvlink", strategy: planner.StrategyDistributed,
			edit: func(j *planner.Job) { setAll(j, "train", nil) },
			want: &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n1")},
		},
		"distributed with a term selecting the job's own pods keeps them on one node": {
			pods: 2, template: "gpu-4-nvlink", strategy: planner.StrategyDistributed,
			edit:       func(j *planner.Job) { setAll(j, "train", []v1.PodAffinityTerm{affinityTerm(hostname, "train")}) },
			want:       &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n0")},
			wantReason: "the job's pods keep together by kubernetes.io/hostname (their required pod affinity)",
		},
		"a term selecting a pod outside the job goes to its node": {
			pods: 2, template: "gpu-4-nvlink", strategy: planner.StrategyConsolidated,
			edit: func(j *planner.Job) {
				setAll(j, "train", []v1.PodAffinityTerm{affinityTerm(hostname, "cache")})
				j.Neighbours = []planner.Neighbour{neighbour("l1n2", "ns", "cache")}
			},
			want: &placed{Domain: leaf("leaf-1"), Assignments: assign("l1n2", "l1n2")},
		},
		"a namespace selector goes to the pod it selects, not one beside it in another namespace": {
			pods: 2, template: "gpu-4-nvlink", strategy: planner.StrategyConsolidated,
			edit: func(j *planner.Job) {
				setAll(j, "train", []v1.PodAffinityTerm{ofTeam(affinityTerm(hostname, "cache"), "red")})
				j.Neighbours = []planner.Neighbour{teamNeighbour("l0n0", "ns", "blue", "cache"), teamNeighbour("l1n2", "cache-ns", "red", "cache")}
			},
			want: &placed{Domain: leaf("leaf-1"), Assignments: assign("l1n2", "l1n2")},
		},
		"a namespace selector matching no namespace of the pods fits nowhere": {
			pods: 2, template: "gpu-4-nvlink", strategy: planner.StrategyConsolidated,
			edit: func(j *planner.Job) {
				setAll(j, "train", []v1.PodAffinityTerm{ofTeam(affinityTerm(hostname, "cache"), "green")})
				j.Neighbours = []planner.Neighbour{teamNeighbour("l0n0", "ns", "blue", "cache"), teamNeighbour("l1n2", "cache-ns", "red", "cache")}
			},
			refused: "selects no pod, so it fits nowhere",
		},
		"a term by leaf goes to its leaf": {
			pods: 2, template: "gpu-4-nvlink", strategy: planner.StrategyConsolidated,
			edit: func(j *planner.Job) {
				setAll(j, "train", []v1.PodAffinityTerm{affinityTerm(leafKey, "cache")})
				j.Neighbours = []planner.Neighbour{neighbour("l1n2", "ns", "cache")}
			},
			want: &placed{Domain: leaf("leaf-1"), Assignments: assign("l1n0", "l1n0")},
		},
		"a pinned pod selected by the term holds the others to its leaf": {
			pods: 1, template: "gpu-8-node", strategy: planner.StrategyConsolidated,
			edit: func(j *planner.Job) {
				setAll(j, "train", []v1.PodAffinityTerm{affinityTerm(leafKey, "train")})
				j.Pinned = map[string]string{"old": "l1n3"}
				j.PinnedPods = map[string]planner.Pod{"old": {Members: []planner.Member{{Namespace: "ns", Labels: map[string]string{"app": "train"}}}}}
				j.Domain = &spine0
			},
			want: &placed{Domain: spine0, Assignments: assign("l1n0")},
		},
		"a term selecting no pod fits nowhere": {
			pods: 2, template: "gpu-4-nvlink", strategy: planner.StrategyConsolidated,
			edit:    func(j *planner.Job) { setAll(j, "train", []v1.PodAffinityTerm{affinityTerm(hostname, "ghost")}) },
			refused: "kept together by kubernetes.io/hostname (their required pod affinity); the required pod affinity of p0, p1 selects no pod, so it fits nowhere",
		},
		"a key no node has fits nowhere": {
			pods: 2, template: "gpu-4-nvlink", strategy: planner.StrategyConsolidated,
			edit: func(j *planner.Job) {
				setAll(j, "train", []v1.PodAffinityTerm{affinityTerm("example.com/zone", "train")})
			},
			refused: "kept together by example.com/zone",
		},
		"six whole-node pods together by leaf do not fit a leaf of four": {
			pods: 6, template: "gpu-8-node", strategy: planner.StrategyConsolidated,
			edit:    func(j *planner.Job) { setAll(j, "train", []v1.PodAffinityTerm{affinityTerm(leafKey, "train")}) },
			refused: "kept together by " + leafKey,
		},
		// JobSet's exclusive placement by leaf: a pod of child Job a
		// runs in leaf-1; the new pod of a joins it there, and b's pod
		// takes the other leaf.
		"exclusive placement": {
			pods: 2, template: "gpu-8-node", strategy: planner.StrategyConsolidated,
			edit: func(j *planner.Job) {
				for i, child := range []string{"a", "b"} {
					j.Pods[i].Members, j.Pods[i].Affinity, j.Pods[i].AntiAffinity = exclusive(leafKey, child)
				}
				old := planner.Pod{}
				old.Members, old.Affinity, old.AntiAffinity = exclusive(leafKey, "a")
				j.Pinned = map[string]string{"old": "l1n3"}
				j.PinnedPods = map[string]planner.Pod{"old": old}
				j.Domain = &spine0
			},
			want: &placed{Domain: spine0, Assignments: assign("l1n0", "l0n0")},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			job := makeJob(t, "j").Pods(tc.pods, tc.template).Strategy(tc.strategy).Obj()
			tc.edit(&job)
			plan, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, nil), nil, job)
			if tc.refused != "" {
				var u *planner.Unschedulable
				if !errors.As(err, &u) {
					t.Fatalf("want Unschedulable, got plan %+v, error %v", project(plan), err)
				}
				if !strings.Contains(u.Reason, tc.refused) {
					t.Errorf("refusal %q does not say %q", u.Reason, tc.refused)
				}
				return
			}
			checkPlan(t, plan, err, tc.want, nil)
			if tc.wantReason != "" && !hasReason(plan.Reasons, tc.wantReason) {
				t.Errorf("reasons do not say %q:\n%v", tc.wantReason, plan.Reasons)
			}
		})
	}
}

// setAll labels every pod of the job app=value in namespace ns and gives
// it the affinity terms.
func setAll(j *planner.Job, value string, affinity []v1.PodAffinityTerm) {
	for i := range j.Pods {
		j.Pods[i].Members = []planner.Member{{Namespace: "ns", Labels: map[string]string{"app": value}}}
		j.Pods[i].Affinity = affinity
	}
}
