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

// neighbour is a pod outside the job labelled app=value in namespace ns
// on node, with terms.
func neighbour(node, ns, value string, terms ...v1.PodAffinityTerm) planner.Neighbour {
	return planner.Neighbour{Node: node, Pod: planner.Pod{Name: "nb-" + node,
		Members: []planner.Member{{Namespace: ns, Labels: map[string]string{"app": value}}}, AntiAffinity: terms}}
}

// teamNeighbour is neighbour in a namespace labelled team=team.
func teamNeighbour(node, ns, team, value string, terms ...v1.PodAffinityTerm) planner.Neighbour {
	nb := neighbour(node, ns, value, terms...)
	nb.Pod.Members[0].NamespaceLabels = map[string]string{"team": team}
	return nb
}

// ofTeam looks for the term's pods in the namespaces labelled team=team
// (every namespace for ""), and in those it names.
func ofTeam(t v1.PodAffinityTerm, team string) v1.PodAffinityTerm {
	t.NamespaceSelector = &metav1.LabelSelector{}
	if team != "" {
		t.NamespaceSelector.MatchLabels = map[string]string{"team": team}
	}
	return t
}

// TestPodAntiAffinityAgainstPodsOutsideTheJob: a pod outside the job on
// l0n0, the node consolidated would fill first, keeps the job's pods out
// of its value when a term ties them, either way round, as
// kube-scheduler's InterPodAffinity filter does; pods it does not tie to
// (another namespace, a key its node lacks) change nothing.
func TestPodAntiAffinityAgainstPodsOutsideTheJob(t *testing.T) {
	hostname, leafKey := v1.LabelHostname, topology.LabelTopographLeaf
	c := labelled().Obj(t)
	tests := map[string]struct {
		pods       int
		terms      []v1.PodAffinityTerm // the job's pods', which are app=train
		neighbours []planner.Neighbour
		edit       func(*planner.Job)
		want       *placed
		wantReason string
	}{
		"without a tie both share l0n0": {
			pods:       2,
			neighbours: []planner.Neighbour{neighbour("l0n0", "ns", "web")},
			want:       &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n0")},
		},
		"the neighbour's term keeps them off its node": {
			pods:       2,
			neighbours: []planner.Neighbour{neighbour("l0n0", "ns", "web", antiTerm(hostname, "train"))},
			want:       &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n1", "l0n1")},
			wantReason: "the job's pods keep apart by kubernetes.io/hostname (their required pod anti-affinity, with 1 pod outside the job)",
		},
		"their term against the neighbour": {
			pods:       2,
			terms:      []v1.PodAffinityTerm{antiTerm(hostname, "web")},
			neighbours: []planner.Neighbour{neighbour("l0n0", "ns", "web")},
			want:       &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n1", "l0n1")},
			wantReason: "with 1 pod outside the job",
		},
		"a neighbour in another namespace is not selected": {
			pods:       2,
			terms:      []v1.PodAffinityTerm{antiTerm(hostname, "web")},
			neighbours: []planner.Neighbour{neighbour("l0n0", "other", "web")},
			want:       &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n0")},
		},
		"a namespace selector leaves out a namespace it does not match": {
			pods:       2,
			terms:      []v1.PodAffinityTerm{ofTeam(antiTerm(hostname, "web"), "red")},
			neighbours: []planner.Neighbour{teamNeighbour("l0n0", "other", "blue", "web"), teamNeighbour("l0n1", "ns", "blue", "web")},
			want:       &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n0")},
		},
		"a namespace selector selects the namespaces it matches": {
			pods:       2,
			terms:      []v1.PodAffinityTerm{ofTeam(antiTerm(hostname, "web"), "red")},
			neighbours: []planner.Neighbour{teamNeighbour("l0n0", "other", "red", "web"), teamNeighbour("l0n1", "ns", "blue", "web")},
			want:       &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n1", "l0n1")},
		},
		"an empty namespace selector selects every namespace": {
			pods:       2,
			terms:      []v1.PodAffinityTerm{ofTeam(antiTerm(hostname, "web"), "")},
			neighbours: []planner.Neighbour{neighbour("l0n0", "other", "web"), neighbour("l0n1", "third", "web")},
			want:       &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n2", "l0n2")},
		},
		"a namespace selector adds to the namespaces named": {
			pods:       2,
			terms:      []v1.PodAffinityTerm{ofTeam(antiTerm(hostname, "web", "third"), "red")},
			neighbours: []planner.Neighbour{teamNeighbour("l0n0", "other", "red", "web"), teamNeighbour("l0n1", "third", "blue", "web")},
			want:       &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n2", "l0n2")},
		},
		"the neighbour's namespace selector matches the job's namespace": {
			pods:       2,
			neighbours: []planner.Neighbour{teamNeighbour("l0n0", "other", "blue", "web", ofTeam(antiTerm(hostname, "train"), "red"))},
			edit:       func(j *planner.Job) { setTeam(j, "red") },
			want:       &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n1", "l0n1")},
		},
		"the neighbour's namespace selector leaves the job's namespace out": {
			pods:       2,
			neighbours: []planner.Neighbour{teamNeighbour("l0n0", "other", "blue", "web", ofTeam(antiTerm(hostname, "train"), "red"))},
			edit:       func(j *planner.Job) { setTeam(j, "blue") },
			want:       &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n0")},
		},
		"a term on a key the nodes lack keeps nothing apart": {
			pods:       2,
			neighbours: []planner.Neighbour{neighbour("l0n0", "ns", "web", antiTerm("example.com/zone", "train"))},
			want:       &placed{Domain: leaf("leaf-0"), Assignments: assign("l0n0", "l0n0")},
		},
		"a term by leaf keeps them out of the leaf": {
			pods:       2,
			neighbours: []planner.Neighbour{neighbour("l0n0", "ns", "web", antiTerm(leafKey, "train"))},
			want:       &placed{Domain: leaf("leaf-1"), Assignments: assign("l1n0", "l1n0")},
		},
		"a one-pod job too": {
			pods:       1,
			neighbours: []planner.Neighbour{neighbour("l0n0", "ns", "web", antiTerm(hostname, "train"))},
			want:       &placed{Domain: planner.Domain{Level: planner.LevelNode, Names: []string{"l0n1"}}, Assignments: assign("l0n1")},
		},
		"a one-pod job without a tie": {
			pods:       1,
			neighbours: []planner.Neighbour{neighbour("l0n0", "ns", "web")},
			want:       &placed{Domain: planner.Domain{Level: planner.LevelNode, Names: []string{"l0n0"}}, Assignments: assign("l0n0")},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			job := makeJob(t, "j").Pods(tc.pods, "gpu-4-nvlink").Strategy(planner.StrategyConsolidated).member("ns", "train", tc.terms...).Obj()
			job.Neighbours = tc.neighbours
			if tc.edit != nil {
				tc.edit(&job)
			}
			plan, err := newPlanner(t).Plan(context.Background(), planner.NewSnapshot(c, nil), nil, job)
			checkPlan(t, plan, err, tc.want, nil)
			if tc.wantReason != "" && !hasReason(plan.Reasons, tc.wantReason) {
				t.Errorf("reasons do not say %q:\n%v", tc.wantReason, plan.Reasons)
			}
		})
	}
}

// setTeam labels the namespace of the job's pods team=team.
func setTeam(j *planner.Job, team string) {
	for i := range j.Pods {
		for m := range j.Pods[i].Members {
			j.Pods[i].Members[m].NamespaceLabels = map[string]string{"team": team}
		}
	}
}

// TestTies: the controller passes the planner only the pods outside a
// job that a term ties to it: anti-affinity either way round, the job's
// affinity one way.
func TestTies(t *testing.T) {
	train := planner.Pod{Members: []planner.Member{{Namespace: "ns", Labels: map[string]string{"app": "train"}}}}
	against := func(p planner.Pod, terms ...v1.PodAffinityTerm) planner.Pod { p.AntiAffinity = terms; return p }
	near := func(p planner.Pod, terms ...v1.PodAffinityTerm) planner.Pod { p.Affinity = terms; return p }
	web := neighbour("n", "ns", "web").Pod
	for name, tc := range map[string]struct {
		q    planner.Pod
		pods []planner.Pod
		want bool
	}{
		"no terms":                     {q: web, pods: []planner.Pod{train}},
		"the outside pod's term":       {q: against(web, antiTerm(v1.LabelHostname, "train")), pods: []planner.Pod{train}, want: true},
		"the job's term":               {q: web, pods: []planner.Pod{against(train, antiTerm(v1.LabelHostname, "web"))}, want: true},
		"a term for another namespace": {q: web, pods: []planner.Pod{against(train, antiTerm(v1.LabelHostname, "web", "other"))}},
		"a namespace selector matching the outside pod's": {q: teamNeighbour("n", "web-ns", "red", "web").Pod, pods: []planner.Pod{near(train, ofTeam(antiTerm(v1.LabelHostname, "web"), "red"))}, want: true},
		"a namespace selector leaving it out":             {q: teamNeighbour("n", "web-ns", "blue", "web").Pod, pods: []planner.Pod{near(train, ofTeam(antiTerm(v1.LabelHostname, "web"), "red"))}},
		"a term selecting no one":                         {q: against(web, antiTerm(v1.LabelHostname, "infer")), pods: []planner.Pod{train}},
		"the job's affinity":                              {q: web, pods: []planner.Pod{near(train, antiTerm(v1.LabelHostname, "web"))}, want: true},
		// The outside pod's affinity binds only itself.
		"the outside pod's affinity": {q: near(web, antiTerm(v1.LabelHostname, "train")), pods: []planner.Pod{train}},
	} {
		if got := planner.NewTies(tc.pods).Tied(tc.q); got != tc.want {
			t.Errorf("%s: Tied = %v, want %v", name, got, tc.want)
		}
	}
}
