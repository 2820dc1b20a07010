package planner_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/topology"
)

// antiTerm is a required pod anti-affinity term selecting pods labelled
// app=value, in namespaces (the pod's own when none) on key.
func antiTerm(key, value string, namespaces ...string) v1.PodAffinityTerm {
	return v1.PodAffinityTerm{
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": value}},
		TopologyKey:   key,
		Namespaces:    namespaces,
	}
}

// member labels the latest pods app=value in namespace ns and gives them
// terms.
func (b *jobBuilder) member(ns, value string, terms ...v1.PodAffinityTerm) *jobBuilder {
	return b.each(func(p *planner.Pod) {
		p.Members = []planner.Member{{Namespace: ns, Labels: map[string]string{"app": value}}}
		p.AntiAffinity = terms
	})
}

// labelled is one spine of two empty leaves of four dgx-h100 nodes, each
// node labelled with its hostname and its leaf.
func labelled() *clusterBuilder {
	b := makeCluster().Spines(1, 2, 4, "dgx-h100")
	for l := range 2 {
		for n := range 4 {
			name := fmt.Sprintf("l%dn%d", l, n)
			b.Label(v1.LabelHostname, name, name).Label(topology.LabelTopographLeaf, fmt.Sprintf("leaf-%d", l), name)
		}
	}
	return b
}

// TestPodAntiAffinityKeepsTheJobsPodsApart: two four-GPU pods that
// consolidated would share l0n0 go where kube-scheduler's
// InterPodAffinity filter lets both bind.
func TestPodAntiAffinityKeepsTheJobsPodsApart(t *testing.T) {
	hostname := v1.LabelHostname
	c := labelled().Obj(t)
	spine0 := planner.Domain{Level: planner.LevelSpine, Names: []string{"spine-0"}}
	tests := map[string]struct {
		job        func(*jobBuilder) *jobBuilder
		want       *placed
		wantErr    *planner.Unschedulable
		wantReason string
	}{
		"without terms both share the fullest node": {
			job:  func(b *jobBuilder) *jobBuilder { return b.member("ns", "train") },
			want: &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n0")},
		},
		"one pod per node": {
			job:        func(b *jobBuilder) *jobBuilder { return b.member("ns", "train", antiTerm(hostname, "train")) },
			want:       &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n1")},
			wantReason: "the job's pods keep apart by kubernetes.io/hostname",
		},
		"a term that selects no pod of the job changes nothing": {
			job:  func(b *jobBuilder) *jobBuilder { return b.member("ns", "train", antiTerm(hostname, "other")) },
			want: &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n0")},
		},
		"a term for another namespace changes nothing": {
			job: func(b *jobBuilder) *jobBuilder {
				return b.member("ns", "train", antiTerm(hostname, "train", "elsewhere"))
			},
			want: &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n0")},
		},
		// kube-scheduler checks the other pod's term too: one pod with a
		// term keeps the other away as well.
		"one pod's term keeps both apart": {
			job: func(b *jobBuilder) *jobBuilder {
				b.member("ns", "train")
				b.job.Pods[0].AntiAffinity = []v1.PodAffinityTerm{antiTerm(hostname, "train")}
				return b
			},
			want: &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n1")},
		},
		// One pod per leaf: no leaf holds both, so the plan widens.
		"one pod per leaf widens the domain": {
			job: func(b *jobBuilder) *jobBuilder {
				return b.member("ns", "train", antiTerm(topology.LabelTopographLeaf, "train"))
			},
			want: &placed{Domain: spine0, Assignments: assign("l0n0", "l1n0")},
		},
		"one pod per leaf in one leaf is refused": {
			job: func(b *jobBuilder) *jobBuilder {
				return b.member("ns", "train", antiTerm(topology.LabelTopographLeaf, "train")).Placement(planner.PlacementSameLeaf)
			},
			wantErr: &planner.Unschedulable{Job: "j"},
		},
		// A pod already running on l0n0 keeps the new ones off it.
		"a pinned pod's term": {
			job: func(b *jobBuilder) *jobBuilder {
				b.Pinned("old", "l0n0").Domain(planner.LevelSpine, "spine-0")
				b.job.PinnedPods = map[string]planner.Pod{"old": {Members: []planner.Member{{Namespace: "ns", Labels: map[string]string{"app": "old"}}},
					AntiAffinity: []v1.PodAffinityTerm{antiTerm(hostname, "train")}}}
				return b.member("ns", "train")
			},
			want: &placed{Domain: spine0, Assignments: assign("l0n1", "l0n1")},
		},
		"a term against a pinned pod": {
			job: func(b *jobBuilder) *jobBuilder {
				b.Pinned("old", "l0n0").Domain(planner.LevelSpine, "spine-0")
				b.job.PinnedPods = map[string]planner.Pod{"old": {Members: []planner.Member{{Namespace: "ns", Labels: map[string]string{"app": "old"}}}}}
				return b.member("ns", "train", antiTerm(hostname, "old"))
			},
			want: &placed{Domain: spine0, Assignments: assign("l0n1", "l0n1")},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			b := makeJob(t, "j").Pods(2, "gpu-4-nvlink").Strategy(planner.StrategyConsolidated)
			job := tc.job(b).Obj()
			plan, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, nil), nil, job)
			if tc.wantErr != nil {
				var got *planner.Unschedulable
				if !errors.As(err, &got) {
					t.Fatalf("want Unschedulable, got plan %+v, error %v", project(plan), err)
				}
				if !hasReason([]string{got.Reason}, "kept apart by "+topology.LabelTopographLeaf) {
					t.Errorf("refusal %q does not say the pods keep apart by the leaf", got.Reason)
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

// TestPodAntiAffinityOnNodesWithoutTheKey: a node without the term's
// label is in no value, and kube-scheduler lets pods that keep apart by
// that key share it.
func TestPodAntiAffinityOnNodesWithoutTheKey(t *testing.T) {
	c := makeCluster().Spines(1, 2, 4, "dgx-h100").Obj(t)
	job := makeJob(t, "j").Pods(2, "gpu-4-nvlink").Strategy(planner.StrategyConsolidated).
		member("ns", "train", antiTerm(v1.LabelHostname, "train")).Obj()
	plan, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, nil), nil, job)
	checkPlan(t, plan, err, &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n0")}, nil)
}
