package peers

import (
	"testing"

	"github.com/gputopo/gputopo/test/e2e/framework"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestJobSetPlacedInOneLeaf: the real JobSet controller creates a leader
// Job and three worker Jobs from testdata/jobset.yaml; gputopo groups
// their pods by the JobSet's label, sizes the group from its child Jobs and
// places the four whole-node pods in one leaf, every claim allocated for
// the JobSet.
func TestJobSetPlacedInOneLeaf(t *testing.T) {
	js := create(t, readObjects(t, "jobset.yaml")[0])
	pods := waitBound(t, "jobset.sigs.k8s.io/jobset-name="+js.GetName(), 4)
	leaf := oneLeaf(t, pods)
	checkClaims(t, pods, namespace+"/jobset/"+js.GetName())
	jobs, err := client.BatchV1().Jobs(namespace).List(framework.Ctx(t), metav1.ListOptions{LabelSelector: "jobset.sigs.k8s.io/jobset-name=" + js.GetName()})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs.Items) != 4 {
		t.Errorf("the JobSet controller made %d Jobs, want 4 (a leader and three workers)", len(jobs.Items))
	}
	t.Logf("JobSet %s: %d pods of %d Jobs in %s", js.GetName(), len(pods), len(jobs.Items), leaf)
}

// TestJobSetExclusivePlacement: a JobSet with JobSet's exclusive
// placement by leaf (testdata/jobset-exclusive.yaml), two Jobs of two
// whole-node pods. Each Job's pods end in a leaf of their own, as the
// JobSet webhook's affinity asks, every claim allocated by gputopo.
func TestJobSetExclusivePlacement(t *testing.T) {
	js := create(t, readObjects(t, "jobset-exclusive.yaml")[0])
	pods := waitBound(t, "jobset.sigs.k8s.io/jobset-name="+js.GetName(), 4)
	byJob := map[string][]corev1.Pod{}
	for _, p := range pods {
		byJob[p.Labels["jobset.sigs.k8s.io/job-key"]] = append(byJob[p.Labels["jobset.sigs.k8s.io/job-key"]], p)
	}
	if len(byJob) != 2 {
		t.Fatalf("pods of %d Jobs, want 2", len(byJob))
	}
	seen := map[string]bool{}
	for key, ps := range byJob {
		leaf := oneLeaf(t, ps)
		if seen[leaf] {
			t.Errorf("two Jobs in leaf %s, JobSet's exclusive placement wants one each", leaf)
		}
		seen[leaf] = true
		t.Logf("Job %s: %d pods in %s", key, len(ps), leaf)
	}
	checkClaims(t, pods, namespace+"/jobset/"+js.GetName())
}
