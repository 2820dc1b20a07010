package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	resourcev1client "k8s.io/client-go/kubernetes/typed/resource/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	specs "github.com/gputopo/gputopo/demo/specs"
	"github.com/gputopo/gputopo/pkg/topology"
)

func leafOf(node string) string {
	switch node {
	case "n0", "n1":
		return "leaf-0"
	case "n2", "n3":
		return "leaf-1"
	}
	return ""
}

func TestPlanIsWrittenIntoClaimsBeforeGatesOpen(t *testing.T) {
	h := newHarness(t, job("train", 2))
	h.addPod(jobPod("train", 0, "gpu-8-node", nil))
	h.addPod(jobPod("train", 1, "gpu-8-node", nil))
	h.settle()
	if _, err := h.c.sync(h.ctx, "default/job/train"); err != nil {
		t.Fatal(err)
	}
	h.settle()
	// Written, but the gates stay closed for the settle time.
	for _, pod := range []string{"train-0", "train-1"} {
		c := h.claim(pod + "-gpus")
		if c.Status.Allocation == nil {
			t.Fatalf("claim of %s not allocated", pod)
		}
		if !slices.Contains(c.Finalizers, resourceapi.Finalizer) || c.Annotations[placement.AnnotationAllocatedBy] != "default/job/train" {
			t.Errorf("claim of %s: finalizers %v, annotations %v; want the delete-protection finalizer and allocated-by", pod, c.Finalizers, c.Annotations)
		}
		if !hasGate(h.pod(pod)) {
			t.Errorf("%s ungated before the settle time passed", pod)
		}
	}
	time.Sleep(h.c.cfg.SettleDelay)
	h.sync("default/job/train")
	n0, n1 := h.allocatedNode("train-0"), h.allocatedNode("train-1")
	if n0 == n1 || leafOf(n0) != leafOf(n1) || leafOf(n0) == "" {
		t.Errorf("pods allocated on %s and %s, want two nodes of one leaf", n0, n1)
	}
	for _, pod := range []string{"train-0", "train-1"} {
		p := h.pod(pod)
		if hasGate(p) {
			t.Errorf("%s still gated", pod)
		}
		if p.Annotations[placement.AnnotationNode] != h.allocatedNode(pod) || !strings.HasPrefix(p.Annotations[placement.AnnotationDomain], "leaf:") {
			t.Errorf("%s annotations %v", pod, p.Annotations)
		}
		// kube-scheduler tries the nominated node first: it must name
		// the claims' node before the gate opens.
		if p.Status.NominatedNodeName != h.allocatedNode(pod) {
			t.Errorf("%s nominated to %q, want its claims' node %s", pod, p.Status.NominatedNodeName, h.allocatedNode(pod))
		}
		nominated, opened := -1, -1
		for i, a := range h.client.Actions() {
			if pa, ok := a.(k8stesting.PatchAction); ok && a.GetResource().Resource == "pods" && pa.GetName() == pod {
				switch {
				case a.GetSubresource() == "status" && strings.Contains(string(pa.GetPatch()), "nominatedNodeName") && nominated < 0:
					nominated = i
				case a.GetSubresource() == "" && strings.Contains(string(pa.GetPatch()), placement.SchedulingGate):
					opened = i
				}
			}
		}
		if nominated < 0 || opened < 0 || nominated > opened {
			t.Errorf("%s: nominated in write %d, gate opened in write %d; want the nomination first", pod, nominated, opened)
		}
		// Should the scheduler allocate the claims again by itself, the
		// pod still may only go to its leaf's nodes.
		var want []string
		for _, n := range []string{"n0", "n1", "n2", "n3"} {
			if leafOf(n) == leafOf(n0) {
				want = append(want, "host-"+n)
			}
		}
		wantAff := &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{
			{Key: v1.LabelHostname, Operator: v1.NodeSelectorOpIn, Values: want}}}}}
		var got *v1.NodeSelector
		if p.Spec.Affinity != nil && p.Spec.Affinity.NodeAffinity != nil {
			got = p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
		}
		if diff := cmp.Diff(wantAff, got); diff != "" {
			t.Errorf("%s required node affinity (-want +got):\n%s", pod, diff)
		}
	}
}

func TestNarrowedAffinityKeepsTheUsersTerms(t *testing.T) {
	req := v1.NodeSelectorRequirement{Key: v1.LabelHostname, Operator: v1.NodeSelectorOpIn, Values: []string{"a", "b"}}
	zone := v1.NodeSelectorRequirement{Key: "zone", Operator: v1.NodeSelectorOpIn, Values: []string{"z1"}}
	gpu := v1.NodeSelectorRequirement{Key: "gpu", Operator: v1.NodeSelectorOpExists}
	pod := &v1.Pod{Spec: v1.PodSpec{Affinity: &v1.Affinity{NodeAffinity: &v1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{
			{MatchExpressions: []v1.NodeSelectorRequirement{zone}},
			{MatchExpressions: []v1.NodeSelectorRequirement{gpu}},
		}}}}}}
	// Every term (they are ORed) gains the requirement, nothing is lost.
	want := &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{
		{MatchExpressions: []v1.NodeSelectorRequirement{zone, req}},
		{MatchExpressions: []v1.NodeSelectorRequirement{gpu, req}},
	}}
	got := narrowedAffinity(pod, req)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	if zone := pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions; len(zone) != 1 {
		t.Errorf("the pod's own terms were modified: %v", zone)
	}
	pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = got
	if again := narrowedAffinity(pod, req); again != nil {
		t.Errorf("a pod already narrowed got another change: %v", again)
	}
	if got := narrowedAffinity(&v1.Pod{}, req); got == nil || len(got.NodeSelectorTerms) != 1 {
		t.Errorf("a pod without affinity gets one term, got %v", got)
	}
}

// The defect behind the failing demo: a pod that bypasses gputopo takes
// GPUs of a node. The scheduler writes that into its claim; the plan must
// count it, and a plan made before must be a claim allocation the
// scheduler counts in turn.
func TestForeignAllocationsAreNeverOverbooked(t *testing.T) {
	h := newHarness(t, job("train", 2), foreignClaim("quad", "n0", "gpu-0", "gpu-1", "gpu-2", "gpu-3"))
	h.addPod(jobPod("train", 0, "gpu-8-node", nil))
	h.addPod(jobPod("train", 1, "gpu-8-node", nil))
	h.settle()
	h.sync("default/job/train")
	for _, pod := range []string{"train-0", "train-1"} {
		if n := h.allocatedNode(pod); n == "n0" || n == "" {
			t.Errorf("%s allocated on %q; n0 has four GPUs taken", pod, n)
		}
	}
}

// placeOnePodJob places a one-pod Job with one sync: its claim is
// allocated and, for the settle time, its gate still closed.
func placeOnePodJob(t *testing.T, name, template string) *harness {
	h := newHarness(t, job(name, 1))
	h.addPod(jobPod(name, 0, template, nil))
	h.settle()
	h.allocate("default/job/" + name)
	return h
}

// A device the scheduler allocated in memory while the controller wrote
// the same device: the group's own claims are taken back and planned again
// before any gate opens.
func TestClashBeforeGatesOpenIsReplanned(t *testing.T) {
	h := placeOnePodJob(t, "pair", "gpu-4-nvlink")
	node, devs := h.allocatedNode("pair-0"), h.devicesOf("pair-0")
	var names []string
	for _, d := range devs {
		names = append(names, d[strings.LastIndex(d, "/")+1:])
	}
	h.create(foreignClaim("racer", node, names...))
	h.settle()
	time.Sleep(h.c.cfg.SettleDelay)
	h.place("default/job/pair")
	if got := h.devicesOf("pair-0"); cmp.Equal(got, devs) {
		t.Fatalf("claim still holds %v, which the other claim holds too", got)
	}
	if hasGate(h.pod("pair-0")) {
		t.Error("pod still gated after the re-plan")
	}
	if r := h.pod("pair-0").Annotations[placement.AnnotationReleased]; r != "1;"+ReleaseConflict {
		t.Errorf("released annotation %q, want 1;%s", r, ReleaseConflict)
	}
}

// racer creates a pod of a ReplicaSet, bound to node and not started,
// whose claim the scheduler allocated with the given devices: an
// allocation it had in flight when the controller wrote the same devices.
func (h *harness) racer(node string, devices []string) *v1.Pod {
	h.t.Helper()
	var names []string
	for _, d := range devices {
		names = append(names, d[strings.LastIndex(d, "/")+1:])
	}
	return h.foreignPod("racer", node, foreignClaim("racer", node, names...))
}

// foreignPod creates pod name of a ReplicaSet, bound to node and not
// started, and its claim, allocated by the scheduler and reserved for it.
func (h *harness) foreignPod(name, node string, cl *resourceapi.ResourceClaim) *v1.Pod {
	h.t.Helper()
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name),
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs-" + name, UID: types.UID("rs-" + name), Controller: ptr.To(true)}}},
		Spec: v1.PodSpec{NodeName: node, Containers: []v1.Container{{Name: "c", Image: "img"}}}}
	h.create(p)
	cl.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: p.Name, UID: p.UID}}
	h.create(cl)
	h.settle()
	return p
}

func (h *harness) gone(pod string) bool {
	_, err := h.client.CoreV1().Pods("default").Get(h.ctx, pod, metav1.GetOptions{})
	return apierrors.IsNotFound(err)
}

// The gates open as soon as the claims are seen; a device the scheduler
// had in flight may land after that. The pod that has not started gives
// way: here the Job's pod, whose gate is open, is deleted for its Job to
// replace, and the other pod keeps its device.
func TestClashAfterGatesOpenTheUnstartedPodGivesWay(t *testing.T) {
	h := placeOnePodJob(t, "pair", "gpu-4-nvlink")
	h.place("default/job/pair")
	if hasGate(h.pod("pair-0")) {
		t.Fatal("gate still closed after the claims were seen")
	}
	h.racer(h.allocatedNode("pair-0"), h.devicesOf("pair-0"))
	h.sync("default/job/pair")
	if !h.gone("pair-0") {
		t.Error("pair-0 was not deleted although its device is in another claim and it has not started")
	}
	if h.gone("racer") {
		t.Error("the other pod was deleted too")
	}
}

// A Job's pod that runs keeps its device; the other claim's pod that has
// not started is deleted for its ReplicaSet to replace.
func TestClashWithARunningPodTheOtherGivesWay(t *testing.T) {
	h := placeOnePodJob(t, "pair", "gpu-4-nvlink")
	h.place("default/job/pair")
	h.bind("pair-0")
	p := h.pod("pair-0")
	p.Status.Phase = v1.PodRunning
	if _, err := h.client.CoreV1().Pods("default").UpdateStatus(h.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.racer(h.allocatedNode("pair-0"), h.devicesOf("pair-0"))
	h.sync("default/job/pair")
	if h.gone("pair-0") {
		t.Error("the running pod was deleted")
	}
	if !h.gone("racer") {
		t.Error("the pod that has not started was not deleted although a running pod holds its device")
	}
}

// An interrupted write leaves one pod's claim allocated and the other's
// not: the group is planned again as a whole instead of being squeezed
// around the first pod.
func TestHalfWrittenGroupIsPlannedAgainAsAWhole(t *testing.T) {
	// leaf-1 is full, so the only fit is leaf-0; the stale half sits on n2.
	h := newHarness(t, job("train", 2), foreignClaim("busy", "n3", gpus(8)...))
	h.addPod(jobPod("train", 0, "gpu-8-node", nil))
	h.addPod(jobPod("train", 1, "gpu-8-node", nil))
	stale := foreignClaim("x", "n2", gpus(8)...).Status.Allocation
	c := h.claim("train-0-gpus")
	c.Annotations[placement.AnnotationAllocatedBy] = "default/job/train"
	c.Annotations[placement.AnnotationDomain] = "leaf:leaf-1"
	c.Finalizers = []string{resourceapi.Finalizer}
	c, _ = h.client.ResourceV1().ResourceClaims("default").Update(h.ctx, c, metav1.UpdateOptions{})
	c.Status.Allocation = stale
	if _, err := h.client.ResourceV1().ResourceClaims("default").UpdateStatus(h.ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.settle()
	h.place("default/job/train")
	for _, pod := range []string{"train-0", "train-1"} {
		if n := h.allocatedNode(pod); leafOf(n) != "leaf-0" {
			t.Errorf("%s allocated on %q, want leaf-0", pod, n)
		}
		if hasGate(h.pod(pod)) {
			t.Errorf("%s still gated", pod)
		}
	}
}

func TestIncompleteGroupWaitsWithAStableReason(t *testing.T) {
	h := newHarness(t, job("train", 3))
	h.addPod(jobPod("train", 0, "gpu-8-node", nil))
	h.settle()
	h.sync("default/job/train")
	first := h.pod("train-0").Annotations[placement.AnnotationStatus]
	h.addPod(jobPod("train", 1, "gpu-8-node", nil))
	h.settle()
	h.sync("default/job/train")
	if got := h.pod("train-0").Annotations[placement.AnnotationStatus]; got != first || first == "" {
		t.Errorf("status changed from %q to %q as pods arrived", first, got)
	}
	if h.claim("train-0-gpus").Status.Allocation != nil {
		t.Error("claims allocated before the group is complete")
	}
}

func TestCompletionsAboveParallelismPlansTheFirstWave(t *testing.T) {
	j := job("wave", 2)
	j.Spec.Completions = ptr.To[int32](4)
	h := newHarness(t, j)
	h.addPod(jobPod("wave", 0, "gpu-8-node", nil))
	h.addPod(jobPod("wave", 1, "gpu-8-node", nil))
	h.settle()
	h.place("default/job/wave")
	for _, pod := range []string{"wave-0", "wave-1"} {
		if hasGate(h.pod(pod)) {
			t.Errorf("%s still gated: a Job with completions > parallelism must not wait for all completions", pod)
		}
	}
}

// Once a pod's gate is open the controller never clears its claims: the
// scheduler may be binding it on an allocation of its own. A pod that
// does not bind gets its claims taken back by the scheduler's PostFilter,
// and the controller plans it again and says so.
func TestUngatedPodIsPlannedAgainOnceTheSchedulerTakesItsClaimBack(t *testing.T) {
	h := newHarness(t, job("one", 1))
	h.c.cfg.BindTimeout = 50 * time.Millisecond
	h.addPod(jobPod("one", 0, "gpu-8-node", nil))
	h.settle()
	h.place("default/job/one")
	if hasGate(h.pod("one-0")) {
		t.Fatal("pod still gated")
	}
	node := h.allocatedNode("one-0")
	time.Sleep(100 * time.Millisecond)
	h.sync("default/job/one")
	if got := h.allocatedNode("one-0"); got != node {
		t.Fatalf("the controller moved an ungated pod's claim from %s to %q itself", node, got)
	}
	h.postFilter("one-0")
	h.sync("default/job/one")
	p := h.pod("one-0")
	if r := p.Annotations[placement.AnnotationReleased]; r != "1;"+ReleaseUnschedulable {
		t.Errorf("released annotation %q, want 1;%s", r, ReleaseUnschedulable)
	}
	got := h.allocatedNode("one-0")
	if got == "" {
		t.Fatal("claim not allocated again")
	}
	if p.Annotations[placement.AnnotationNode] != got {
		t.Errorf("%s=%q, want the new allocation's node %s", placement.AnnotationNode, p.Annotations[placement.AnnotationNode], got)
	}
}

func TestPodOfDeletedNodeIsSteeredElsewhere(t *testing.T) {
	for name, break_ := range map[string]func(h *harness, node string){
		"deleted": func(h *harness, node string) {
			if err := h.client.CoreV1().Nodes().Delete(h.ctx, node, metav1.DeleteOptions{}); err != nil {
				h.t.Fatal(err)
			}
		},
		"not ready": func(h *harness, node string) {
			n, _ := h.client.CoreV1().Nodes().Get(h.ctx, node, metav1.GetOptions{})
			n.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionFalse}}
			if _, err := h.client.CoreV1().Nodes().UpdateStatus(h.ctx, n, metav1.UpdateOptions{}); err != nil {
				h.t.Fatal(err)
			}
		},
		"tainted NoExecute": func(h *harness, node string) {
			n, _ := h.client.CoreV1().Nodes().Get(h.ctx, node, metav1.GetOptions{})
			n.Spec.Taints = []v1.Taint{{Key: "maintenance", Effect: v1.TaintEffectNoExecute}}
			if _, err := h.client.CoreV1().Nodes().Update(h.ctx, n, metav1.UpdateOptions{}); err != nil {
				h.t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, job("one", 1))
			h.addPod(jobPod("one", 0, "gpu-8-node", nil))
			h.settle()
			h.place("default/job/one")
			node := h.allocatedNode("one-0")
			break_(h, node)
			h.eventually("the node change", func() bool {
				n, err := h.c.nodes.Get(node)
				return err != nil || !nodeReady(n) || len(n.Spec.Taints) > 0
			})
			h.sync("default/job/one")
			if got := h.allocatedNode("one-0"); got != node {
				t.Fatalf("the controller moved an ungated pod's claim from %s to %q itself", node, got)
			}
			// The pod fits nowhere now: the scheduler takes its claim back.
			h.postFilter("one-0")
			h.sync("default/job/one")
			if got := h.allocatedNode("one-0"); got == node || got == "" {
				t.Errorf("claim allocated on %q after node %s failed", got, node)
			}
			if r := h.pod("one-0").Annotations[placement.AnnotationReleased]; !strings.HasPrefix(r, "1;Node") {
				t.Errorf("released annotation %q, want the node's failure as the reason", r)
			}
		})
	}
}

func TestReplacementGoesBackIntoTheDomain(t *testing.T) {
	h := newHarness(t, job("train", 2))
	h.addPod(jobPod("train", 0, "gpu-4-nvlink", nil))
	h.addPod(jobPod("train", 1, "gpu-4-nvlink", nil))
	h.settle()
	h.place("default/job/train")
	h.bind("train-0")
	h.bind("train-1")
	leaf := leafOf(h.allocatedNode("train-0"))
	if err := h.client.CoreV1().Pods("default").Delete(h.ctx, "train-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// The replacement's claim is new; the old one is gone with its pod.
	if err := h.client.ResourceV1().ResourceClaims("default").Delete(h.ctx, "train-1-gpus", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.addPod(jobPod("train", 2, "gpu-4-nvlink", nil))
	h.settle()
	h.place("default/job/train")
	if got := leafOf(h.allocatedNode("train-2")); got != leaf {
		t.Errorf("replacement on leaf %q, want %q", got, leaf)
	}
}

func TestJobThatCannotFitStaysGatedWithReason(t *testing.T) {
	h := newHarness(t, job("huge", 5))
	for i := range 5 {
		h.addPod(jobPod("huge", i, "gpu-8-node", nil))
	}
	h.settle()
	res, err := h.c.sync(h.ctx, "default/job/huge")
	if err != nil || res != backoff {
		t.Fatalf("sync = %v, %v; want a backoff", res, err)
	}
	h.settle()
	if s := h.pod("huge-0").Annotations[placement.AnnotationStatus]; !strings.Contains(s, "huge") {
		t.Errorf("status %q does not say why", s)
	}
	if h.claim("huge-0-gpus").Status.Allocation != nil || !hasGate(h.pod("huge-0")) {
		t.Error("a group that does not fit got claims or lost its gate")
	}
}

// Waiting groups are retried on their own schedules: many of them must not
// push each other's retries minutes out through one shared bucket.
func TestPendingGroupsDoNotShareABackoffBucket(t *testing.T) {
	h := newHarness(t)
	for i := range 1000 {
		h.c.setPending(fmt.Sprintf("default/job/j%d", i), true, waiting{})
	}
	for range 3 {
		h.c.requeuePending()
	}
	if n := h.c.queue.Len(); n != 1000 {
		t.Errorf("queue holds %d groups right away, want all 1000", n)
	}
	if r := h.c.queue.NumRequeues("default/job/j0"); r != 0 {
		t.Errorf("requeue of a pending group counted %d rate-limited retries", r)
	}
}

// Room that frees up goes to the group created first: pending groups are
// retried in order of creation, whatever order they failed in.
func TestPendingGroupsAreRetriedOldestFirst(t *testing.T) {
	h := newHarness(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, p := range []struct {
		key     string
		created time.Time
	}{
		{"default/job/small-late", t0.Add(2 * time.Second)},
		{"default/job/big-first", t0},
		{"default/job/b-same-second", t0.Add(time.Second)},
		{"default/job/a-same-second", t0.Add(time.Second)},
	} {
		h.c.setPending(p.key, true, waiting{created: p.created})
	}
	h.c.requeuePending()
	got := h.drain()
	want := []string{"default/job/big-first", "default/job/a-same-second", "default/job/b-same-second", "default/job/small-late"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("retry order (-want +got):\n%s", diff)
	}
}

func TestGroupKeys(t *testing.T) {
	base := func(labels, ann map[string]string, owner string) *v1.Pod {
		a := map[string]string{placement.AnnotationPlacement: "auto"}
		for k, v := range ann {
			a[k] = v
		}
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: labels, Annotations: a}}
		if owner != "" {
			p.OwnerReferences = []metav1.OwnerReference{{Kind: "Job", Name: owner, Controller: ptr.To(true)}}
		}
		return p
	}
	for name, tc := range map[string]struct {
		pod  *v1.Pod
		want string
	}{
		"lone pod":        {base(nil, nil, ""), "ns/pod/p"},
		"job":             {base(nil, nil, "j"), "ns/job/j"},
		"jobset":          {base(map[string]string{labelJobSetName: "js"}, nil, "js-workers-0"), "ns/jobset/js"},
		"lws group":       {base(map[string]string{labelLWSName: "lws", labelLWSGroupIndex: "3"}, nil, ""), "ns/lws/lws-3"},
		"group overrides": {base(map[string]string{labelJobSetName: "js"}, map[string]string{placement.AnnotationGroup: "g", placement.AnnotationGroupSize: "2"}, "j"), "ns/group/g"},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := groupKey(tc.pod)
			if !ok || got != tc.want {
				t.Errorf("groupKey = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
}

func TestRankPodsByCompletionIndex(t *testing.T) {
	var pods []*v1.Pod
	for _, i := range []int{10, 2, 0, 1} {
		pods = append(pods, &v1.Pod{ObjectMeta: metav1.ObjectMeta{
			Name:        fmt.Sprintf("j-%d-abcde", i),
			Annotations: map[string]string{batchv1.JobCompletionIndexAnnotation: fmt.Sprint(i)},
		}})
	}
	rankPods(pods)
	var got []string
	for _, p := range pods {
		got = append(got, p.Annotations[batchv1.JobCompletionIndexAnnotation])
	}
	if diff := cmp.Diff([]string{"0", "1", "2", "10"}, got); diff != "" {
		t.Errorf("rank (-want +got):\n%s", diff)
	}
}

// Rank order is the JobSet job index, then the completion index, then the
// LeaderWorkerSet worker index; the name breaks ties only.
func TestRankPodsJobIndexThenCompletionIndexThenWorkerIndex(t *testing.T) {
	pod := func(name string, idx map[string]string) *v1.Pod {
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}, Annotations: map[string]string{}}}
		for k, v := range idx {
			if k == batchv1.JobCompletionIndexAnnotation {
				p.Annotations[k] = v
			} else {
				p.Labels[k] = v
			}
		}
		return p
	}
	pods := []*v1.Pod{
		pod("a", map[string]string{labelJobSetJobIndex: "1", batchv1.JobCompletionIndexAnnotation: "0"}),
		pod("b", map[string]string{labelJobSetJobIndex: "0", batchv1.JobCompletionIndexAnnotation: "1"}),
		pod("c", map[string]string{labelJobSetJobIndex: "0", batchv1.JobCompletionIndexAnnotation: "0"}),
		pod("d", map[string]string{labelJobSetJobIndex: "10", batchv1.JobCompletionIndexAnnotation: "0"}),
		pod("e", map[string]string{labelLWSWorkerIndex: "2"}),
		pod("f", map[string]string{labelLWSWorkerIndex: "1"}),
	}
	rankPods(pods)
	var got []string
	for _, p := range pods {
		got = append(got, p.Name)
	}
	// Pods without a job index rank first (an LWS group has none), by
	// worker index; then the JobSet's by job index, then completion index.
	if diff := cmp.Diff([]string{"f", "e", "c", "b", "a", "d"}, got); diff != "" {
		t.Errorf("rank (-want +got):\n%s", diff)
	}
}

// A JobSet's pods are placed in rank order: in an empty leaf the pod of
// job index 0 gets the leaf's first node and that of job index 1 the
// second, though their names sort the other way.
func TestJobSetPodsArePlacedInRankOrder(t *testing.T) {
	jobs := []*batchv1.Job{job("js-workers-0", 1), job("js-workers-1", 1)}
	var extra []any
	for _, j := range jobs {
		j.Labels = map[string]string{labelJobSetName: "js"}
		extra = append(extra, j)
	}
	h := newHarness(t, extra...)
	for _, tc := range []struct{ name, jobName, index string }{{"js-a", "js-workers-1", "1"}, {"js-b", "js-workers-0", "0"}} {
		p := jobPod(tc.jobName, 0, "gpu-8-node", nil)
		p.Name, p.UID = tc.name, types.UID(tc.name)
		p.Labels = map[string]string{labelJobSetName: "js", labelJobSetJobIndex: tc.index}
		p.Annotations[batchv1.JobCompletionIndexAnnotation] = "0"
		h.addPod(p)
	}
	h.place("default/jobset/js")
	first, second := h.allocatedNode("js-b"), h.allocatedNode("js-a")
	if !slices.Contains([][2]string{{"n0", "n1"}, {"n2", "n3"}}, [2]string{first, second}) {
		t.Errorf("job index 0 on %q and job index 1 on %q; want the first and the second node of one leaf", first, second)
	}
}

func TestJobSize(t *testing.T) {
	j := job("j", 4)
	j.Spec.Completions = ptr.To[int32](10)
	j.Status.Succeeded = 8
	if got := jobSize(j); got != 2 {
		t.Errorf("jobSize = %d, want the 2 remaining completions", got)
	}
}

// kube-controller-manager's claim controller may change a claim between
// the controller's two writes (it drops the finalizer of a claim that is
// not allocated yet): the allocation is written from a fresh read, not
// abandoned.
func TestAllocationWriteSurvivesAConflict(t *testing.T) {
	h := newHarness(t, job("train", 2))
	var mu sync.Mutex // the claims are written in parallel
	conflicts := 0
	h.client.PrependReactor("update", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if a.GetSubresource() == "status" && conflicts < 2 {
			conflicts++
			return true, nil, apierrors.NewConflict(resourceapi.Resource("resourceclaims"), "x", errors.New("the object has been modified"))
		}
		return false, nil, nil
	})
	h.addPod(jobPod("train", 0, "gpu-8-node", nil))
	h.addPod(jobPod("train", 1, "gpu-8-node", nil))
	h.settle()
	if _, err := h.c.sync(h.ctx, "default/job/train"); err != nil {
		t.Fatalf("sync failed on a conflict it should have retried: %v", err)
	}
	if conflicts != 2 {
		t.Fatalf("%d conflicts injected, want 2", conflicts)
	}
	for _, pod := range []string{"train-0", "train-1"} {
		if h.claim(pod+"-gpus").Status.Allocation == nil {
			t.Errorf("claim of %s not allocated", pod)
		}
	}
}

// A group's claims are written in parallel: the allocations of a 4-pod
// Job are all in flight at once, not one after the other. (The fake
// client runs its reactors under one lock, so the writes are held up in
// front of it.)
func TestGroupClaimsAreWrittenInParallel(t *testing.T) {
	h := newHarness(t, job("train", 4))
	var mu sync.Mutex
	inFlight, most := 0, 0
	all := make(chan struct{})
	h.c.cfg.Client = heldClaimWrites{Interface: h.client, hold: func(cl *resourceapi.ResourceClaim) func() {
		if cl.Status.Allocation == nil {
			return func() {}
		}
		mu.Lock()
		inFlight++
		most = max(most, inFlight)
		if inFlight == 4 && most == 4 {
			close(all)
		}
		mu.Unlock()
		select { // each write waits (up to 2 s) until all four are in flight
		case <-all:
		case <-time.After(2 * time.Second):
		}
		return func() {
			mu.Lock()
			inFlight--
			mu.Unlock()
		}
	}}
	for i := range 4 {
		h.addPod(jobPod("train", i, "gpu-8-node", nil))
	}
	h.settle()
	if _, err := h.c.sync(h.ctx, "default/job/train"); err != nil {
		t.Fatal(err)
	}
	if most != 4 {
		t.Errorf("at most %d of the 4 claims' allocations were written at once, want 4", most)
	}
	for i := range 4 {
		if name := fmt.Sprintf("train-%d", i); h.claim(name+"-gpus").Status.Allocation == nil {
			t.Errorf("pod %s: claim not allocated", name)
		}
	}
}

// heldClaimWrites is a client whose claim status writes call hold first
// and its result after.
type heldClaimWrites struct {
	kubernetes.Interface
	hold func(*resourceapi.ResourceClaim) func()
}

func (c heldClaimWrites) ResourceV1() resourcev1client.ResourceV1Interface {
	return heldResourceV1{c.Interface.ResourceV1(), c.hold}
}

type heldResourceV1 struct {
	resourcev1client.ResourceV1Interface
	hold func(*resourceapi.ResourceClaim) func()
}

func (c heldResourceV1) ResourceClaims(ns string) resourcev1client.ResourceClaimInterface {
	return heldClaims{c.ResourceV1Interface.ResourceClaims(ns), c.hold}
}

type heldClaims struct {
	resourcev1client.ResourceClaimInterface
	hold func(*resourceapi.ResourceClaim) func()
}

func (c heldClaims) UpdateStatus(ctx context.Context, cl *resourceapi.ResourceClaim, opts metav1.UpdateOptions) (*resourceapi.ResourceClaim, error) {
	defer c.hold(cl)()
	return c.ResourceClaimInterface.UpdateStatus(ctx, cl, opts)
}

// All or nothing: when one claim's allocation cannot be written, the
// claims written beside it are given back, and no gate opens.
func TestFailedClaimWriteGivesTheOthersBack(t *testing.T) {
	h := newHarness(t, job("train", 4))
	h.client.PrependReactor("update", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if u, ok := a.(k8stesting.UpdateAction); ok && a.GetSubresource() == "status" && u.GetObject().(*resourceapi.ResourceClaim).Name == "train-2-gpus" && u.GetObject().(*resourceapi.ResourceClaim).Status.Allocation != nil {
			return true, nil, apierrors.NewInternalError(errors.New("etcd is down"))
		}
		return false, nil, nil
	})
	for i := range 4 {
		h.addPod(jobPod("train", i, "gpu-8-node", nil))
	}
	h.settle()
	if _, err := h.c.sync(h.ctx, "default/job/train"); err == nil || !strings.Contains(err.Error(), "train-2-gpus") {
		t.Fatalf("sync = %v, want the failed write of train-2-gpus", err)
	}
	for i := range 4 {
		name := fmt.Sprintf("train-%d", i)
		if cl := h.claim(name + "-gpus"); cl.Status.Allocation != nil || len(cl.Status.ReservedFor) > 0 {
			t.Errorf("claim of %s still allocated after the group's write failed: %+v", name, cl.Status)
		}
		if !hasGate(h.pod(name)) {
			t.Errorf("pod %s lost its gate although its group was not placed", name)
		}
	}
}

// A lost node re-syncs the groups with pods bound or steered there at once,
// not at their next bind timeout; groups elsewhere are left alone.
func TestLostNodeResyncsTheGroupsOnIt(t *testing.T) {
	h := newHarness(t, job("train", 2), job("other", 1))
	h.addPod(jobPod("train", 0, "gpu-8-node", nil))
	h.addPod(jobPod("train", 1, "gpu-8-node", nil))
	h.addPod(jobPod("other", 0, "gpu-8-node", nil))
	h.settle()
	h.place("default/job/train")
	h.place("default/job/other")
	h.bind("train-0") // train-1 stays steered
	lost := h.allocatedNode("train-1")
	for h.c.queue.Len() > 0 {
		k, _ := h.c.queue.Get()
		h.c.queue.Forget(k)
		h.c.queue.Done(k)
	}
	for _, node := range []string{h.allocatedNode("train-0"), lost} {
		if err := h.client.CoreV1().Nodes().Delete(h.ctx, node, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		h.eventually("the group on node "+node+" queued", func() bool { return h.c.queue.Len() == 1 })
		k, _ := h.c.queue.Get()
		if k != "default/job/train" {
			t.Errorf("deleting node %s queued %q, want the group on it", node, k)
		}
		h.c.queue.Forget(k)
		h.c.queue.Done(k)
	}
}

// Opening the gates of a placed group does not wait until every group
// queued ahead of it has been synced.
func TestPlacedGroupOpensGatesAheadOfTheBacklog(t *testing.T) {
	h := placeOnePodJob(t, "j", "gpu-8-node")
	if !hasGate(h.pod("j-0")) || h.allocatedNode("j-0") == "" {
		t.Fatal("the group was not placed with its gate still closed")
	}
	for h.c.queue.Len() > 0 { // the claim events queued the group: forget that
		key, _ := h.c.queue.Get()
		h.c.queue.Done(key)
	}
	const backlog = 50
	for i := range backlog {
		h.c.queue.Add(fmt.Sprintf("default/job/backlog-%d", i))
	}
	h.eventually("the settle time to pass", func() bool {
		h.c.mu.Lock()
		defer h.c.mu.Unlock()
		return time.Now().After(h.c.settle["default/job/j"])
	})
	h.eventually("the release to be due", func() bool { return h.c.releases.Len() > 0 })
	if !h.c.processNext(h.ctx) {
		t.Fatal("the queue shut down")
	}
	h.settle()
	if hasGate(h.pod("j-0")) {
		t.Error("the placed group's gate stayed closed behind the backlog")
	}
	if n := h.c.queue.Len(); n < backlog-1 {
		t.Errorf("%d groups left in the queue, want the %d of the backlog not synced yet", n, backlog-1)
	}
}

// Right after the controller opened a gate its informer may still show the
// pod gated; the pod's claims must count as the scheduler's already.
func TestClaimOfAPodWhoseGateWasJustOpenedIsNotReleasable(t *testing.T) {
	h := newHarness(t, job("one", 1))
	h.addPod(jobPod("one", 0, "gpu-8-node", nil))
	h.settle()
	h.allocate("default/job/one")
	claim, err := h.c.claims.ResourceClaims("default").Get("one-0-gpus")
	if err != nil {
		t.Fatal(err)
	}
	if !hasGate(h.pod("one-0")) || !h.c.releasable(claim) {
		t.Fatal("a held pod's claim should be releasable")
	}
	h.c.mu.Lock()
	h.c.opened[h.pod("one-0").UID] = time.Now()
	h.c.mu.Unlock()
	if h.c.releasable(claim) {
		t.Error("the claim of a pod whose gate was just opened is releasable")
	}
}

// A pod kept waiting says so in its gputopo.dev/Placed condition, False
// with the reason, and True once its gate opens; a pod placed once its
// claims exist gets no condition.
func TestPlacedConditionFollowsTheWait(t *testing.T) {
	h := newHarness(t, job("wide", 2), foreignClaim("busy", "n0", gpus(8)...), foreignClaim("busy2", "n2", gpus(8)...), job("quick", 1))
	for i := range 2 {
		p := jobPod("wide", i, "gpu-8-node", map[string]string{placement.AnnotationPlacement: string(placement.PlacementSameLeaf)})
		if i == 1 {
			// Nominated by a plan whose claims were taken back before the
			// gate opened.
			p.Status.NominatedNodeName = "n3"
		}
		h.addPod(p)
	}
	h.addPod(jobPod("quick", 0, "gpu-1", nil))
	h.place("default/job/quick")
	if c := placedCondition(h.pod("quick-0")); c != nil {
		t.Errorf("a pod placed at once got condition %+v", c)
	}
	h.place("default/job/wide")
	c := placedCondition(h.pod("wide-0"))
	if c == nil || c.Status != v1.ConditionFalse || c.Reason != ReasonUnschedulable || !strings.Contains(c.Message, "leaf") || c.LastTransitionTime.IsZero() {
		t.Fatalf("condition of a waiting pod: %+v", c)
	}
	if n := h.pod("wide-1").Status.NominatedNodeName; n != "" {
		t.Errorf("a waiting pod is still nominated to %s", n)
	}
	for _, name := range []string{"busy", "busy2"} {
		if err := h.client.ResourceV1().ResourceClaims("default").Delete(h.ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		h.eventually("the claim index to drop "+name, func() bool { return !h.c.index.seen(types.UID("claim-"+name), "0") })
	}
	h.place("default/job/wide")
	c = placedCondition(h.pod("wide-0"))
	if hasGate(h.pod("wide-0")) || c == nil || c.Status != v1.ConditionTrue || c.Reason != ReasonPlaced || !strings.Contains(c.Message, "placed in leaf:") {
		t.Errorf("condition of a placed pod: %+v (gated %v)", c, hasGate(h.pod("wide-0")))
	}
}

// A Job whose pod template names a ResourceClaimTemplate that does not
// exist never gets its claims: its pods say so (InvalidClaim, naming the
// template) in their status and gputopo.dev/Placed condition, rather than
// waiting for claims that will not come. Once the template exists and the
// claim is made, the Job is placed.
func TestMissingTemplateIsNamed(t *testing.T) {
	h := newHarness(t, job("orphan", 1))
	h.create(jobPod("orphan", 0, "gpu-none", nil))
	h.settle()
	h.sync("default/job/orphan")
	p := h.pod("orphan-0")
	want := `its claim "gpus" names ResourceClaimTemplate default/gpu-none, which does not exist`
	st, err := placement.ParseStatus(p.Annotations[placement.AnnotationStatus])
	if err != nil || st.Reason != placement.StatusInvalidClaim || !strings.Contains(st.Message, want) {
		t.Errorf("status of a pod whose template is missing: %q (%v), want %s naming the template", p.Annotations[placement.AnnotationStatus], err, placement.StatusInvalidClaim)
	}
	c := placedCondition(p)
	if c == nil || c.Status != v1.ConditionFalse || c.Reason != ReasonInvalidClaim || !strings.Contains(c.Message, want) {
		t.Errorf("condition of a pod whose template is missing: %+v", c)
	}

	// The template arrives; the resource claim controller makes the claim.
	tmpl, err := specs.ClaimTemplate("gpu-1")
	if err != nil {
		t.Fatal(err)
	}
	tmpl.Name, tmpl.Namespace = "gpu-none", "default"
	h.create(tmpl)
	h.eventually("the template in the informer", func() bool {
		_, err := h.c.tmpls.ResourceClaimTemplates("default").Get("gpu-none")
		return err == nil
	})
	if err := h.client.CoreV1().Pods("default").Delete(h.ctx, "orphan-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.addPod(jobPod("orphan", 0, "gpu-none", nil))
	h.place("default/job/orphan")
	if p := h.pod("orphan-0"); hasGate(p) {
		t.Errorf("pod still gated once its template exists: %s", p.Annotations[placement.AnnotationStatus])
	}
}

// TestPodAntiAffinityKeepsTheGroupApart: two four-GPU pods that the
// consolidated strategy would plan onto one node, each refusing to share
// a node with the other (required pod anti-affinity on the hostname, as
// kube-scheduler weighs it), are planned onto two nodes; so is a
// replacement, away from the pod of the group that still runs.
func TestPodAntiAffinityKeepsTheGroupApart(t *testing.T) {
	apart := func(p *v1.Pod, terms bool) *v1.Pod {
		p.Labels = map[string]string{"app": "train"}
		if terms {
			p.Spec.Affinity = &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "train"}}, TopologyKey: v1.LabelHostname}}}}
		}
		return p
	}
	consolidated := map[string]string{placement.AnnotationStrategy: "consolidated"}
	for _, terms := range []bool{false, true} {
		t.Run(fmt.Sprintf("terms=%v", terms), func(t *testing.T) {
			h := newHarness(t, job("train", 2))
			h.addPod(apart(jobPod("train", 0, "gpu-4-nvlink", consolidated), terms))
			h.addPod(apart(jobPod("train", 1, "gpu-4-nvlink", consolidated), terms))
			h.settle()
			h.place("default/job/train")
			n0, n1 := h.allocatedNode("train-0"), h.allocatedNode("train-1")
			if n0 == "" || (n0 == n1) == terms {
				t.Fatalf("pods planned onto %s and %s; want one node without the terms, two with them", n0, n1)
			}
			if !terms {
				return
			}
			h.bind("train-0")
			h.bind("train-1")
			if err := h.client.CoreV1().Pods("default").Delete(h.ctx, "train-1", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := h.client.ResourceV1().ResourceClaims("default").Delete(h.ctx, "train-1-gpus", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			h.addPod(apart(jobPod("train", 2, "gpu-4-nvlink", consolidated), terms))
			h.settle()
			h.place("default/job/train")
			if got := h.allocatedNode("train-2"); got == "" || got == n0 {
				t.Errorf("replacement planned onto %q, want a node other than %s, where train-0 runs", got, n0)
			}
		})
	}
}

// TestPodAntiAffinityAgainstPodsOutsideTheGroup: a pod outside the group
// on the node consolidated would fill first keeps the group's pods off
// it when a required anti-affinity term ties them, its own term or
// theirs, as kube-scheduler's InterPodAffinity filter does. The pod is
// bound there without gputopo, or nominated there, or another group's
// pod whose claims the controller allocated there while its gate is
// still closed.
func TestPodAntiAffinityAgainstPodsOutsideTheGroup(t *testing.T) {
	consolidated := map[string]string{placement.AnnotationStrategy: "consolidated"}
	against := func(p *v1.Pod, app string, selects string) *v1.Pod {
		p.Labels = map[string]string{"app": app}
		if selects != "" {
			p.Spec.Affinity = &v1.Affinity{PodAntiAffinity: &v1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": selects}}, TopologyKey: v1.LabelHostname}}}}
		}
		return p
	}
	// alone is where the group's first pod goes with no one else there.
	alone := func() string {
		h := newHarness(t, job("train", 2))
		h.addPod(jobPod("train", 0, "gpu-4-nvlink", consolidated))
		h.addPod(jobPod("train", 1, "gpu-4-nvlink", consolidated))
		h.settle()
		h.place("default/job/train")
		return h.allocatedNode("train-0")
	}()
	for _, where := range []string{"bound", "nominated", "held"} {
		held := where == "held"
		for name, tc := range map[string]struct {
			webSelects, trainSelects string
			tied                     bool
		}{
			"no term":           {},
			"the other's term":  {webSelects: "train", tied: true},
			"the group's term":  {trainSelects: "web", tied: true},
			"a term not for it": {webSelects: "infer", trainSelects: "infer"},
		} {
			t.Run(where+"/"+name, func(t *testing.T) {
				h := newHarness(t, job("train", 2), job("web", 1))
				var webNode string
				if held {
					h.addPod(against(jobPod("web", 0, "gpu-4-nvlink", consolidated), "web", tc.webSelects))
					h.allocate("default/job/web")
					webNode = h.allocatedNode("web-0")
					if webNode == "" || !hasGate(h.pod("web-0")) {
						t.Fatalf("web-0 not held: allocated on %q, gated %v", webNode, hasGate(h.pod("web-0")))
					}
				} else {
					webNode = alone
					web := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "web"},
						Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "img"}}}}
					if where == "bound" {
						web.Spec.NodeName = webNode
					} else {
						web.Status.NominatedNodeName = webNode // kube-scheduler weighs nominated pods in its filters
					}
					h.create(against(web, "web", tc.webSelects))
				}
				h.addPod(against(jobPod("train", 0, "gpu-4-nvlink", consolidated), "train", tc.trainSelects))
				h.addPod(against(jobPod("train", 1, "gpu-4-nvlink", consolidated), "train", tc.trainSelects))
				h.settle()
				h.place("default/job/train")
				n0, n1 := h.allocatedNode("train-0"), h.allocatedNode("train-1")
				if n0 == "" || n1 == "" {
					t.Fatalf("group not planned: %q, %q", n0, n1)
				}
				if beside := n0 == webNode || n1 == webNode; beside == tc.tied {
					t.Errorf("pods planned onto %s and %s, the other pod on %s; want them off its node: %v", n0, n1, webNode, tc.tied)
				}
			})
		}
	}
}

// TestPodAffinityHoldsTheGroupToThePodsItSelects: a group whose pods'
// required pod affinity selects a pod outside it, on n3 without gputopo,
// is planned where kube-scheduler's InterPodAffinity filter lets it bind:
// on n3 by hostname, in n3's leaf by leaf. With no pod the term selects
// (the group's own pods are not selected either) it fits nowhere and
// waits, as the scheduler would leave it pending.
func TestPodAffinityHoldsTheGroupToThePodsItSelects(t *testing.T) {
	consolidated := map[string]string{placement.AnnotationStrategy: "consolidated"}
	near := func(p *v1.Pod, key string, teams *metav1.LabelSelector) *v1.Pod {
		p.Labels = map[string]string{"app": "train"}
		p.Spec.Affinity = &v1.Affinity{PodAffinity: &v1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []v1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "cache"}}, TopologyKey: key, NamespaceSelector: teams}}}}
		return p
	}
	red := &metav1.LabelSelector{MatchLabels: map[string]string{"team": "red"}}
	type cache struct{ namespace, node string }
	for name, tc := range map[string]struct {
		key       string
		caches    []cache
		teams     *metav1.LabelSelector // the term's namespace selector
		wantNodes []string              // where each pod may be planned; none: not planned
	}{
		"by hostname":       {key: v1.LabelHostname, caches: []cache{{"default", "n3"}}, wantNodes: []string{"n3"}},
		"by leaf":           {key: topology.LabelTopographLeaf, caches: []cache{{"default", "n3"}}, wantNodes: []string{"n2", "n3"}},
		"no pod it selects": {key: v1.LabelHostname},
		// Namespaces team-red (team=red) and team-blue (team=blue).
		"a namespace selector holds it to the pod in a namespace it matches": {
			key: v1.LabelHostname, caches: []cache{{"team-blue", "n0"}, {"team-red", "n3"}}, teams: red, wantNodes: []string{"n3"},
		},
		"a namespace selector matching no namespace with the pod": {
			key: v1.LabelHostname, caches: []cache{{"team-blue", "n0"}, {"default", "n3"}}, teams: red,
		},
		"an empty namespace selector looks in every namespace": {
			key: v1.LabelHostname, caches: []cache{{"team-blue", "n1"}}, teams: &metav1.LabelSelector{}, wantNodes: []string{"n1"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, job("train", 2))
			for _, team := range []string{"red", "blue"} {
				h.create(&v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-" + team, Labels: map[string]string{"team": team}}})
			}
			for _, c := range tc.caches {
				h.create(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "cache", Namespace: c.namespace, UID: types.UID("cache-" + c.namespace), Labels: map[string]string{"app": "cache"}},
					Spec: v1.PodSpec{NodeName: c.node, Containers: []v1.Container{{Name: "c", Image: "img"}}}})
			}
			h.addPod(near(jobPod("train", 0, "gpu-4-nvlink", consolidated), tc.key, tc.teams))
			h.addPod(near(jobPod("train", 1, "gpu-4-nvlink", consolidated), tc.key, tc.teams))
			h.settle()
			h.place("default/job/train")
			for _, pod := range []string{"train-0", "train-1"} {
				got := h.allocatedNode(pod)
				switch {
				case tc.wantNodes == nil && got != "":
					t.Errorf("%s planned onto %s; its affinity selects no pod, so it should wait", pod, got)
				case tc.wantNodes != nil && !slices.Contains(tc.wantNodes, got):
					t.Errorf("%s planned onto %q, want one of %v", pod, got, tc.wantNodes)
				}
			}
		})
	}
}

// TestTopologySpreadCountsThePodsOutsideTheGroup: the group's pods carry a
// topology spread constraint on kubernetes.io/hostname, at most one more
// app=train pod on a node than on the emptiest. The controller passes the
// planner the app=train pods outside the group that kube-scheduler's
// PodTopologySpread filter counts (the pod's namespace, not terminating,
// bound or on its way), so the two pods, which consolidated would put
// together, go onto two nodes, neither of them a node such a pod is on.
func TestTopologySpreadCountsThePodsOutsideTheGroup(t *testing.T) {
	spread := func(p *v1.Pod) *v1.Pod {
		p.Labels = map[string]string{"app": "train"}
		p.Spec.TopologySpreadConstraints = []v1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: v1.LabelHostname, WhenUnsatisfiable: v1.DoNotSchedule,
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "train"}}}}
		return p
	}
	type other struct {
		namespace, node string
		terminating     bool
	}
	for name, tc := range map[string]struct {
		others  []other
		offNode []string // nodes neither pod may be planned onto
		onN0    bool     // a pod goes onto n0, which consolidated fills first
	}{
		"none":                                {onN0: true},
		"a pod of the namespace counts":       {others: []other{{namespace: "default", node: "n0"}}, offNode: []string{"n0"}},
		"two pods of the namespace":           {others: []other{{namespace: "default", node: "n0"}, {namespace: "default", node: "n1"}}, offNode: []string{"n0", "n1"}},
		"a pod of another namespace does not": {others: []other{{namespace: "elsewhere", node: "n0"}}, onN0: true},
		"a terminating pod does not":          {others: []other{{namespace: "default", node: "n0", terminating: true}}, onN0: true},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, job("train", 2))
			for i, o := range tc.others {
				p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("other-%d", i), Namespace: o.namespace, UID: types.UID(fmt.Sprintf("other-%d", i)), Labels: map[string]string{"app": "train"}},
					Spec: v1.PodSpec{NodeName: o.node, Containers: []v1.Container{{Name: "c", Image: "img"}}}}
				if o.terminating {
					p.DeletionTimestamp = &metav1.Time{Time: time.Now()}
					p.Finalizers = []string{"example.com/hold"}
				}
				h.create(p)
			}
			planTwoApart(t, h, spread, tc.offNode, tc.onN0, "an app=train pod of its namespace is already there")
		})
	}
}

// TestHostPortsKeepTheGroupOffHeldNodes: the group's pods ask for host
// port 29500. The controller passes the planner the pods outside the
// group that hold it, in any namespace, unless finished (kube-scheduler's
// NodePorts filter counts every pod on the node), so the two pods, which
// consolidated would put together, go onto two nodes where no other pod
// holds the port.
func TestHostPortsKeepTheGroupOffHeldNodes(t *testing.T) {
	withPort := func(p *v1.Pod) *v1.Pod {
		p.Spec.Containers[0].Ports = []v1.ContainerPort{{ContainerPort: 29500, HostPort: 29500}}
		return p
	}
	type other struct {
		namespace, node string
		finished        bool
		ofGroup         bool // a terminating pod of Job train
	}
	for name, tc := range map[string]struct {
		others  []other
		offNode []string // nodes neither pod may be planned onto
		onN0    bool     // a pod goes onto n0, which consolidated fills first
	}{
		"none":                         {onN0: true},
		"a pod holding the port":       {others: []other{{namespace: "default", node: "n0"}}, offNode: []string{"n0"}},
		"one in another namespace too": {others: []other{{namespace: "elsewhere", node: "n0"}, {namespace: "default", node: "n1"}}, offNode: []string{"n0", "n1"}},
		"a finished pod holds nothing": {others: []other{{namespace: "default", node: "n0", finished: true}}, onN0: true},
		// The Job's old pod, terminating, while its replacement waits.
		"a terminating pod of the group holds it": {others: []other{{namespace: "default", node: "n0", ofGroup: true}}, offNode: []string{"n0"}},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, job("train", 2))
			for i, o := range tc.others {
				p := withPort(&v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("other-%d", i), Namespace: o.namespace, UID: types.UID(fmt.Sprintf("other-%d", i))},
					Spec: v1.PodSpec{NodeName: o.node, Containers: []v1.Container{{Name: "c", Image: "img"}}}})
				if o.finished {
					p.Status.Phase = v1.PodSucceeded
				}
				if o.ofGroup {
					p = withPort(jobPod("train", 9, "gpu-4-nvlink", nil))
					p.Spec.NodeName, p.Spec.SchedulingGates = o.node, nil
					p.DeletionTimestamp, p.Finalizers = &metav1.Time{Time: time.Now()}, []string{"example.com/hold"}
				}
				h.create(p)
			}
			planTwoApart(t, h, withPort, tc.offNode, tc.onN0, "another pod holds host port 29500 there")
		})
	}
}

// planTwoApart adds the two consolidated four-GPU pods of Job train, each
// edited by edit, plans them, and checks that they went onto two nodes,
// neither of them in offNode (where what), and one onto n0, which
// consolidated fills first, with onN0.
func planTwoApart(t *testing.T, h *harness, edit func(*v1.Pod) *v1.Pod, offNode []string, onN0 bool, what string) {
	t.Helper()
	consolidated := map[string]string{placement.AnnotationStrategy: "consolidated"}
	h.addPod(edit(jobPod("train", 0, "gpu-4-nvlink", consolidated)))
	h.addPod(edit(jobPod("train", 1, "gpu-4-nvlink", consolidated)))
	h.settle()
	h.place("default/job/train")
	a, b := h.allocatedNode("train-0"), h.allocatedNode("train-1")
	if a == "" || b == "" || a == b {
		t.Fatalf("pods planned onto %q and %q; want two nodes, one pod each", a, b)
	}
	for _, n := range []string{a, b} {
		if slices.Contains(offNode, n) {
			t.Errorf("a pod planned onto %s, where %s", n, what)
		}
	}
	if onN0 && a != "n0" && b != "n0" {
		t.Errorf("pods planned onto %s and %s; nothing keeps them off n0, which consolidated fills first", a, b)
	}
}
