package peers

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	placementapi "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// workloadOf returns Kueue's Workload for the Job, or nil.
func workloadOf(t *testing.T, job string) *unstructured.Unstructured {
	t.Helper()
	list, err := dyn.Resource(gvrWorkload).Namespace(namespace).List(framework.Ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range list.Items {
		for _, ref := range list.Items[i].GetOwnerReferences() {
			if ref.Kind == "Job" && ref.Name == job {
				return &list.Items[i]
			}
		}
	}
	return nil
}

// condition returns the status, reason and time of a Workload condition.
func condition(w *unstructured.Unstructured, typ string) (status, reason string, at time.Time) {
	conds, _, _ := unstructured.NestedSlice(w.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == typ {
			at, _ = time.Parse(time.RFC3339, fmt.Sprint(m["lastTransitionTime"]))
			return fmt.Sprint(m["status"]), fmt.Sprint(m["reason"]), at
		}
	}
	return "", "", time.Time{}
}

// claimsAllocatedFor counts the claims gputopo allocated for group.
func claimsAllocatedFor(t *testing.T, group string) int {
	t.Helper()
	claims, err := client.ResourceV1().ResourceClaims(namespace).List(framework.Ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range claims.Items {
		if c.Annotations[placementapi.AnnotationAllocatedBy] == group {
			n++
		}
	}
	return n
}

// TestKueueAdmitsGputopoPlaces: Kueue queues Jobs (testdata/kueue-*.yaml,
// a ClusterQueue with room for one Job); gputopo places only what Kueue
// admitted. The first Job is admitted and placed in one leaf; the second
// waits in the queue, suspended, with no pod and no device allocated;
// when the first is deleted, Kueue admits the second, and gputopo places
// it in one leaf with claims made and allocated only after admission.
func TestKueueAdmitsGputopoPlaces(t *testing.T) {
	for _, obj := range readObjects(t, "kueue-queues.yaml") {
		create(t, obj)
	}
	job := readObjects(t, "kueue-job.yaml")[0]
	first, second := job.DeepCopy(), job.DeepCopy()
	first.SetName("queued-first")
	second.SetName("queued-second")

	create(t, first)
	framework.Eventually(t, waitPlaced, "Kueue to admit "+first.GetName(), func() (bool, string) {
		w := workloadOf(t, first.GetName())
		if w == nil {
			return false, "no Workload yet"
		}
		s, r, _ := condition(w, "Admitted")
		return s == "True", "Admitted=" + s + " " + r
	})
	pods := waitBound(t, "batch.kubernetes.io/job-name="+first.GetName(), 2)
	leaf := oneLeaf(t, pods)
	checkClaims(t, pods, namespace+"/job/"+first.GetName())
	t.Logf("%s admitted and placed in %s", first.GetName(), leaf)

	create(t, second)
	secondGroup := namespace + "/job/" + second.GetName()
	framework.Eventually(t, waitPlaced, "Kueue to queue "+second.GetName()+" without admitting it", func() (bool, string) {
		w := workloadOf(t, second.GetName())
		if w == nil {
			return false, "no Workload yet"
		}
		s, r, _ := condition(w, "QuotaReserved")
		return s == "False" && r == "Pending", "QuotaReserved=" + s + " " + r
	})
	j, err := client.BatchV1().Jobs(namespace).Get(framework.Ctx(t), second.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if j.Spec.Suspend == nil || !*j.Spec.Suspend {
		t.Errorf("queued Job %s is not suspended", second.GetName())
	}
	waiting, err := client.CoreV1().Pods(namespace).List(framework.Ctx(t), metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + second.GetName()})
	if err != nil {
		t.Fatal(err)
	}
	if len(waiting.Items) != 0 || claimsAllocatedFor(t, secondGroup) != 0 {
		t.Fatalf("queued Job %s has %d pods and %d claims allocated before Kueue admitted it", second.GetName(), len(waiting.Items), claimsAllocatedFor(t, secondGroup))
	}

	deleteAndWait(t, gvrJob, first.GetName())
	var admitted time.Time
	framework.Eventually(t, waitPlaced, "Kueue to admit "+second.GetName(), func() (bool, string) {
		w := workloadOf(t, second.GetName())
		if w == nil {
			return false, "no Workload"
		}
		s, r, at := condition(w, "Admitted")
		admitted = at
		return s == "True", "Admitted=" + s + " " + r
	})
	pods = waitBound(t, "batch.kubernetes.io/job-name="+second.GetName(), 2)
	leaf = oneLeaf(t, pods)
	for i, created := range checkClaims(t, pods, secondGroup) {
		// Transition times have a resolution of one second.
		if created.Before(admitted.Truncate(time.Second)) {
			t.Errorf("claim of pod %s made at %s, before Kueue admitted the Job at %s", pods[i].Name, created, admitted)
		}
	}
	t.Logf("%s admitted at %s after %s was deleted, placed in %s", second.GetName(), admitted.Format(time.RFC3339), first.GetName(), leaf)
}

// kueueGate is the scheduling gate Kueue's pod integration adds.
const kueueGate = "kueue.x-k8s.io/admission"

// TestKueueGateHoldsGputopo: the gate contract with Kueue's own gate. Two
// plain pods queued in Kueue as a pod group, in a queue without quota,
// carry Kueue's gate and gputopo's; gputopo says WaitingForGates and
// allocates nothing while Kueue's gate is there. Once the queue gets room,
// Kueue admits the group and removes its gate, and gputopo places both pods
// in one leaf.
func TestKueueGateHoldsGputopo(t *testing.T) {
	for _, obj := range readObjects(t, "kueue-held.yaml") {
		create(t, obj)
	}
	for _, obj := range readObjects(t, "kueue-pods.yaml") {
		create(t, obj)
	}
	const selector = "kueue.x-k8s.io/pod-group-name=pair"
	framework.Eventually(t, waitPlaced, "both pods held by Kueue's gate and gputopo's, their claims made", func() (bool, string) {
		pods, err := client.CoreV1().Pods(namespace).List(framework.Ctx(t), metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err.Error()
		}
		held := 0
		var states []string
		for _, p := range pods.Items {
			var gates []string
			for _, g := range p.Spec.SchedulingGates {
				gates = append(gates, g.Name)
			}
			status := p.Annotations[placementapi.AnnotationStatus]
			if slices.Contains(gates, kueueGate) && slices.Contains(gates, placementapi.SchedulingGate) &&
				len(p.Status.ResourceClaimStatuses) == 1 && strings.HasPrefix(status, "WaitingForGates") {
				held++
			}
			states = append(states, fmt.Sprintf("%s: gates %v, status %q", p.Name, gates, status))
		}
		return held == 2, strings.Join(states, "; ")
	})
	pods, err := client.CoreV1().Pods(namespace).List(framework.Ctx(t), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		claim, err := framework.PodClaim(framework.Ctx(t), client, &p, claimName)
		if err != nil {
			t.Fatal(err)
		}
		if claim.Status.Allocation != nil || p.Spec.NodeName != "" {
			t.Fatalf("pod %s is bound to %q or its claim %s allocated while Kueue's gate holds it", p.Name, p.Spec.NodeName, claim.Name)
		}
	}

	patch := []byte(`{"spec":{"resourceGroups":[{"coveredResources":["cpu"],"flavors":[{"name":"held-flavor","resources":[{"name":"cpu","nominalQuota":2}]}]}]}}`)
	if _, err := dyn.Resource(gvrClusterQueue).Patch(framework.Ctx(t), "held-queue", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("give the queue room: %v", err)
	}
	placed := waitBound(t, selector, 2)
	leaf := oneLeaf(t, placed)
	checkClaims(t, placed, namespace+"/group/pair")
	t.Logf("pod group admitted by Kueue, placed by gputopo in %s", leaf)
}
