package controller

import (
	"fmt"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/pkg/topology"
)

// exclusiveLeader is the leader pod (completion index 0) of Job
// js-workers-i of JobSet js, as JobSet's webhook admits it under
// exclusive placement by leaf: required pod affinity to its own Job's
// pods, anti-affinity to every other Job's.
func exclusiveLeader(i int, exclusive bool) *v1.Pod {
	jobName := fmt.Sprintf("js-workers-%d", i)
	p := jobPod(jobName, 0, "gpu-8-node", nil)
	const jobKey = "jobset.sigs.k8s.io/job-key"
	p.Labels = map[string]string{labelJobSetName: "js", labelJobSetJobIndex: fmt.Sprint(i), jobKey: jobName}
	p.Annotations[batchv1.JobCompletionIndexAnnotation] = "0"
	if exclusive {
		p.Annotations[annotationJobSetExclusive] = topology.LabelTopographLeaf
		p.Spec.Affinity = &v1.Affinity{
			PodAffinity: &v1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{TopologyKey: topology.LabelTopographLeaf,
				LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: jobKey, Operator: metav1.LabelSelectorOpIn, Values: []string{jobName}}}}}}},
			PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{TopologyKey: topology.LabelTopographLeaf,
				LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: jobKey, Operator: metav1.LabelSelectorOpExists}, {Key: jobKey, Operator: metav1.LabelSelectorOpNotIn, Values: []string{jobName}}}}}}},
		}
	}
	return p
}

// TestExclusiveJobSetIsPlannedByItsLeaders: a JobSet of two Jobs of two
// whole-node pods under JobSet's exclusive placement, whose webhook
// admits each Job's second pod only once its leader is scheduled. With
// only the leaders there, the group is planned (waiting for the others
// would wait forever): each leader in a leaf of its own with room for
// its whole Job, and the followers' nodes held from other groups until
// they come. The same JobSet without exclusive placement waits for all
// four pods, as any group does.
func TestExclusiveJobSetIsPlannedByItsLeaders(t *testing.T) {
	for _, exclusive := range []bool{true, false} {
		t.Run(fmt.Sprintf("exclusive=%v", exclusive), func(t *testing.T) {
			var extra []any
			for i := range 2 {
				j := job(fmt.Sprintf("js-workers-%d", i), 2)
				j.Labels = map[string]string{labelJobSetName: "js"}
				extra = append(extra, j)
			}
			h := newHarness(t, extra...)
			h.addPod(exclusiveLeader(0, exclusive))
			h.addPod(exclusiveLeader(1, exclusive))
			h.settle()
			h.place("default/jobset/js")
			n0, n1 := h.allocatedNode("js-workers-0-0"), h.allocatedNode("js-workers-1-0")
			if !exclusive {
				if n0 != "" || n1 != "" {
					t.Fatalf("leaders planned onto %q and %q before the other pods exist", n0, n1)
				}
				if got := h.pod("js-workers-0-0").Annotations[placement.AnnotationStatus]; got == "" {
					t.Errorf("leader has no status; want it waiting for the group's pods")
				}
				return
			}
			if n0 == "" || n1 == "" || leafOf(n0) == leafOf(n1) {
				t.Fatalf("leaders planned onto %q and %q; want one in each leaf", n0, n1)
			}
			for _, name := range []string{"js-workers-0-0", "js-workers-1-0"} {
				if hasGate(h.pod(name)) {
					t.Errorf("leader %s still gated; its gate opens so its Job's other pods can be created", name)
				}
			}
			// The followers' nodes, the other node of each leaf, are held:
			// another group's whole-node pod does not get them.
			held := map[string]bool{}
			for _, n := range []string{"n0", "n1", "n2", "n3"} {
				if n != n0 && n != n1 {
					held[n] = true
				}
			}
			h.create(job("other", 1))
			h.addPod(jobPod("other", 0, "gpu-8-node", nil))
			h.settle()
			h.sync("default/job/other")
			if got := h.allocatedNode("other-0"); got != "" {
				t.Errorf("another group's pod planned onto %s; the followers' nodes %v should be held", got, held)
			}
			// A follower created by the Job controller once its leader is
			// scheduled is planned into its leader's leaf.
			h.bind("js-workers-0-0")
			f := jobPod("js-workers-0", 1, "gpu-8-node", nil)
			f.Labels = map[string]string{labelJobSetName: "js", labelJobSetJobIndex: "0"}
			f.Annotations[batchv1.JobCompletionIndexAnnotation] = "1"
			f.Annotations[annotationJobSetExclusive] = topology.LabelTopographLeaf
			f.Spec.NodeSelector = map[string]string{topology.LabelTopographLeaf: leafOf(n0)}
			f.UID = types.UID("js-workers-0-1")
			h.addPod(f)
			h.settle()
			h.place("default/jobset/js")
			if got := h.allocatedNode("js-workers-0-1"); got == "" || leafOf(got) != leafOf(n0) || got == n0 {
				t.Errorf("follower planned onto %q; want the other node of %s", got, leafOf(n0))
			}
		})
	}
}

// TestDueFollowers: a Job's pods not created yet are due only once its
// leader (completion index 0) exists; a Job being deleted has none due;
// JobSet's node-selector strategy admits every pod at once, so its
// JobSets are not planned by their leaders.
func TestDueFollowers(t *testing.T) {
	owned := func(jobName string, index string) *v1.Pod {
		p := jobPod(jobName, 0, "gpu-8-node", nil)
		p.Name = jobName + "-" + index
		p.Annotations[batchv1.JobCompletionIndexAnnotation] = index
		return p
	}
	jobs := []*batchv1.Job{job("a", 3), job("b", 2), job("c", 2)}
	now := metav1.Now()
	jobs[2].DeletionTimestamp = &now
	pods := []*v1.Pod{owned("a", "0"), owned("a", "1"), owned("b", "1"), owned("c", "0")}
	due := dueFollowers(jobs, pods)
	if len(due) != 1 || due[0].leader.Name != "a-0" || due[0].n != 1 {
		var got []string
		for _, d := range due {
			got = append(got, fmt.Sprintf("%s:%d", d.leader.Name, d.n))
		}
		t.Errorf("due = %v, want [a-0:1] (b has no leader yet, c is being deleted)", got)
	}
	lead := exclusiveLeader(0, true)
	if !leadersFirst([]*v1.Pod{lead}) {
		t.Error("exclusive placement not seen")
	}
	lead.Annotations[annotationJobSetNodeSelector] = "true"
	if leadersFirst([]*v1.Pod{lead}) {
		t.Error("the node-selector strategy admits every pod at once; its JobSets wait for all their pods")
	}
	if leadersFirst([]*v1.Pod{exclusiveLeader(0, false)}) {
		t.Error("a JobSet without exclusive placement is planned by its leaders")
	}
}

// TestExclusiveJobSetStepsWithTheSchedulerAllocating: with kube-scheduler
// allocating (mode scheduler), the controller keeps the leaders' planned
// devices and its followers' held together for the JobSet.
func TestExclusiveJobSetStepsWithTheSchedulerAllocating(t *testing.T) {
	var extra []any
	for i := range 2 {
		j := job(fmt.Sprintf("js-workers-%d", i), 2)
		j.Labels = map[string]string{labelJobSetName: "js"}
		extra = append(extra, j)
	}
	h := newHarnessWith(t, func(h *harness) { h.edit = func(c *Config) { c.AllocationMode = AllocationScheduler } }, extra...)
	h.addPod(exclusiveLeader(0, true))
	h.addPod(exclusiveLeader(1, true))
	h.settle()
	h.place("default/jobset/js")
	r, ok := h.c.inflight.Get("default/jobset/js")
	if !ok {
		t.Fatal("nothing held for the JobSet")
	}
	if len(r.Pods) != 4 {
		t.Errorf("held pods %v, want the two leaders and their two followers", r.Pods)
	}
	leaves := map[string]int{}
	for _, n := range r.Pods {
		leaves[leafOf(n)]++
	}
	if leaves["leaf-0"] != 2 || leaves["leaf-1"] != 2 {
		t.Errorf("held pods %v, want two in each leaf", r.Pods)
	}
}
