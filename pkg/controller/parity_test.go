package controller

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/topology"
)

// Inputs kube-scheduler honours and the controller must honour the same
// way, because it allocates claims itself.

// taintRule taints every device of pool (a node) with effect.
func taintRule(name, pool string, effect resourceapi.DeviceTaintEffect) *resourceapi.DeviceTaintRule {
	return &resourceapi.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.DeviceTaintRuleSpec{
			DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: ptr.To(topology.DriverName), Pool: ptr.To(pool)},
			Taint:          resourceapi.DeviceTaint{Key: "example.com/broken", Value: "xid-79", Effect: effect},
		},
	}
}

func TestDeviceTaintRulesKeepPlansOffTaintedGPUs(t *testing.T) {
	for _, effect := range []resourceapi.DeviceTaintEffect{resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute} {
		t.Run(string(effect), func(t *testing.T) {
			h := newHarness(t, job("solo", 1), job("pair", 2),
				taintRule("n0", "n0", effect), taintRule("n1", "n1", effect), taintRule("n2", "n2", effect))
			h.addPod(jobPod("solo", 0, "gpu-1", nil))
			h.place("default/job/solo")
			if got := h.allocatedNode("solo-0"); got != "n3" {
				t.Errorf("one-GPU pod allocated on %q, want n3, the only node without tainted GPUs", got)
			}
			// Two whole nodes: only n3 is untainted, so the pair cannot
			// be placed at all.
			h.addPod(jobPod("pair", 0, "gpu-8-node", nil))
			h.addPod(jobPod("pair", 1, "gpu-8-node", nil))
			h.sync("default/job/pair")
			for _, pod := range []string{"pair-0", "pair-1"} {
				if n := h.allocatedNode(pod); n != "" {
					t.Errorf("%s allocated on %s although only n3 has untainted GPUs", pod, n)
				}
			}
		})
	}
}

func TestDeviceTaintRuleRemovedFreesGPUs(t *testing.T) {
	h := newHarness(t, job("pair", 2), taintRule("n0", "n0", resourceapi.DeviceTaintEffectNoSchedule),
		taintRule("n1", "n1", resourceapi.DeviceTaintEffectNoSchedule), taintRule("n2", "n2", resourceapi.DeviceTaintEffectNoSchedule))
	h.addPod(jobPod("pair", 0, "gpu-8-node", nil))
	h.addPod(jobPod("pair", 1, "gpu-8-node", nil))
	h.sync("default/job/pair")
	if n := h.allocatedNode("pair-0"); n != "" {
		t.Fatalf("pair-0 allocated on %s while only n3 has untainted GPUs", n)
	}
	if err := h.client.ResourceV1().DeviceTaintRules().Delete(h.ctx, "n2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the rule's removal", func() bool {
		h.c.mu.Lock()
		defer h.c.mu.Unlock()
		return h.c.topo.changed["n2"]
	})
	h.place("default/job/pair")
	n0, n1 := h.allocatedNode("pair-0"), h.allocatedNode("pair-1")
	if leafOf(n0) != "leaf-1" || leafOf(n1) != "leaf-1" || n0 == n1 {
		t.Errorf("pods allocated on %q and %q, want n2 and n3 once n2's rule is gone", n0, n1)
	}
}

// queueGate is a gate another controller (a queue such as Kueue) owns.
const queueGate = "example.com/admission"

func withGate(p *v1.Pod, gate string) *v1.Pod {
	p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, v1.PodSchedulingGate{Name: gate})
	return p
}

func TestForeignGateHoldsNoDevices(t *testing.T) {
	h := newHarness(t, job("queued", 2))
	h.addPod(withGate(jobPod("queued", 0, "gpu-8-node", nil), queueGate))
	h.addPod(withGate(jobPod("queued", 1, "gpu-8-node", nil), queueGate))
	h.place("default/job/queued")
	for _, pod := range []string{"queued-0", "queued-1"} {
		if n := h.allocatedNode(pod); n != "" {
			t.Errorf("%s allocated on %s while the queue's gate still holds it", pod, n)
		}
		st, err := placement.ParseStatus(h.pod(pod).Annotations[placement.AnnotationStatus])
		if err != nil || st.Reason != placement.StatusWaitingForGates || !strings.Contains(st.Message, queueGate) {
			t.Errorf("%s status %+v (%v), want %s naming %s", pod, st, err, placement.StatusWaitingForGates, queueGate)
		}
	}
	// The queue admits the Job: its gate goes, gputopo's is the last one.
	for _, pod := range []string{"queued-0", "queued-1"} {
		p := h.pod(pod)
		p.Spec.SchedulingGates = slices.DeleteFunc(p.Spec.SchedulingGates, func(g v1.PodSchedulingGate) bool { return g.Name == queueGate })
		if _, err := h.client.CoreV1().Pods("default").Update(h.ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h.settle()
	h.place("default/job/queued")
	n0, n1 := h.allocatedNode("queued-0"), h.allocatedNode("queued-1")
	if n0 == "" || n1 == "" || n0 == n1 || leafOf(n0) != leafOf(n1) {
		t.Errorf("after the queue's gate went: allocated on %q and %q, want two nodes of one leaf", n0, n1)
	}
	for _, pod := range []string{"queued-0", "queued-1"} {
		if hasGate(h.pod(pod)) {
			t.Errorf("%s still gated by gputopo", pod)
		}
	}
}

// Once the queue removes its gate, the group is queued at once, without
// waiting for the retry interval, and its sync places it.
func TestAdmittedGroupIsPlannedAtOnce(t *testing.T) {
	h := newHarness(t, job("queued", 2))
	h.addPod(withGate(jobPod("queued", 0, "gpu-8-node", nil), queueGate))
	h.addPod(withGate(jobPod("queued", 1, "gpu-8-node", nil), queueGate))
	h.sync("default/job/queued")
	if st, _ := placement.ParseStatus(h.pod("queued-0").Annotations[placement.AnnotationStatus]); st.Reason != placement.StatusWaitingForGates {
		t.Fatalf("status %+v, want %s", st, placement.StatusWaitingForGates)
	}
	// The harness runs no worker and no retry loop (Run is not called),
	// and a group waiting for gates is not requeued after a delay: from
	// here only an event queues it.
	h.queued()
	p := h.pod("queued-0")
	p.Spec.SchedulingGates = slices.DeleteFunc(p.Spec.SchedulingGates, func(g v1.PodSchedulingGate) bool { return g.Name == queueGate })
	if _, err := h.client.CoreV1().Pods("default").Update(h.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the group queued once a pod's gate went", func() bool { return h.queued()["default/job/queued"] })
	p = h.pod("queued-1")
	p.Spec.SchedulingGates = slices.DeleteFunc(p.Spec.SchedulingGates, func(g v1.PodSchedulingGate) bool { return g.Name == queueGate })
	if _, err := h.client.CoreV1().Pods("default").Update(h.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the group queued once the last foreign gate went", func() bool { return h.queued()["default/job/queued"] })
	h.place("default/job/queued")
	n0, n1 := h.allocatedNode("queued-0"), h.allocatedNode("queued-1")
	if n0 == "" || n1 == "" || n0 == n1 || leafOf(n0) != leafOf(n1) {
		t.Errorf("after the queue's gate went: allocated on %q and %q, want two nodes of one leaf", n0, n1)
	}
}

func TestForeignGatedPodReleasesWhatItHolds(t *testing.T) {
	// A pod allocated by an earlier controller version while another gate
	// held it gives its devices back.
	h := newHarness(t, job("queued", 1))
	h.addPod(jobPod("queued", 0, "gpu-1", nil))
	h.allocate("default/job/queued")
	if h.allocatedNode("queued-0") == "" {
		t.Fatal("queued-0 not allocated")
	}
	p := h.pod("queued-0")
	p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, v1.PodSchedulingGate{Name: queueGate})
	if _, err := h.client.CoreV1().Pods("default").Update(h.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.settle()
	h.sync("default/job/queued")
	if n := h.allocatedNode("queued-0"); n != "" {
		t.Errorf("queued-0 still holds devices on %s while %s holds it", n, queueGate)
	}
	if r, _ := placement.ParseRelease(h.pod("queued-0").Annotations[placement.AnnotationReleased]); r.Reason != placement.ReleaseForeignGate {
		t.Errorf("released annotation %+v, want reason %s", r, placement.ReleaseForeignGate)
	}
}

// queued drains the controller's queue and returns the keys it held.
func (h *harness) queued() map[string]bool {
	out := map[string]bool{}
	for h.c.queue.Len() > 0 {
		k, _ := h.c.queue.Get()
		out[k] = true
		h.c.queue.Done(k)
		h.c.queue.Forget(k)
	}
	return out
}

func TestOrphanedPodIsPlannedUnderItsNewKey(t *testing.T) {
	h := newHarness(t, job("orph", 1))
	h.addPod(jobPod("orph", 0, "gpu-1", nil))
	h.allocate("default/job/orph")
	if h.claim("orph-0-gpus").Annotations[placement.AnnotationAllocatedBy] != "default/job/orph" {
		t.Fatal("orph-0's claim not allocated for its Job")
	}
	h.queued()
	// kubectl delete job --cascade=orphan: the Job goes, the pod stays
	// without its controller reference.
	if err := h.client.BatchV1().Jobs("default").Delete(h.ctx, "orph", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	p := h.pod("orph-0")
	p.OwnerReferences = nil
	if _, err := h.client.CoreV1().Pods("default").Update(h.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.settle()
	h.eventually("the pod's new group queued", func() bool {
		q := h.queued()
		return q["default/pod/orph-0"] && q["default/job/orph"]
	})
	h.place("default/pod/orph-0")
	c := h.claim("orph-0-gpus")
	if got := c.Annotations[placement.AnnotationAllocatedBy]; got != "default/pod/orph-0" || c.Status.Allocation == nil {
		t.Errorf("claim allocated by %q (allocated: %v), want the pod's own group default/pod/orph-0", got, c.Status.Allocation != nil)
	}
	if hasGate(h.pod("orph-0")) {
		t.Error("orphaned pod still gated")
	}
}

func TestFixedAnnotationIsRetriedAtOnce(t *testing.T) {
	h := newHarness(t)
	p := jobPod("solo", 0, "gpu-1", map[string]string{placement.AnnotationStrategy: "packed"})
	p.OwnerReferences = nil
	h.addPod(p)
	h.sync("default/pod/solo-0")
	if st, _ := placement.ParseStatus(h.pod("solo-0").Annotations[placement.AnnotationStatus]); st.Reason != placement.StatusInvalidPlacement {
		t.Fatalf("status %+v, want %s", st, placement.StatusInvalidPlacement)
	}
	h.queued()
	p = h.pod("solo-0")
	p.Annotations[placement.AnnotationStrategy] = "consolidated"
	if _, err := h.client.CoreV1().Pods("default").Update(h.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the fixed pod queued", func() bool { return h.queued()["default/pod/solo-0"] })
}

// userClaim is a ResourceClaim a user created, of the template's spec.
func (h *harness) userClaim(name, template string) *resourceapi.ResourceClaim {
	h.t.Helper()
	tmpl, err := h.client.ResourceV1().ResourceClaimTemplates("default").Get(h.ctx, template, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	cl := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("claim-" + name)},
		Spec: *devicefit.Defaulted(&tmpl.Spec.Spec)}
	h.create(cl)
	return cl
}

// usingClaim is a gated pod of job that uses the ResourceClaim claim.
func usingClaim(jobName string, i int, claim string) *v1.Pod {
	p := jobPod(jobName, i, "", nil)
	p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "shared", ResourceClaimName: ptr.To(claim)}}
	return p
}

func TestClaimSharedByAJobsPodsIsAllocatedOnceForAll(t *testing.T) {
	h := newHarness(t, job("team", 2))
	h.userClaim("team-gpus", "gpu-4-nvlink")
	h.addPod(usingClaim("team", 0, "team-gpus"))
	h.addPod(usingClaim("team", 1, "team-gpus"))
	writes := 0
	h.client.PrependReactor("update", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		writes++
		return false, nil, nil
	})
	h.place("default/job/team")
	c := h.claim("team-gpus")
	if c.Status.Allocation == nil {
		t.Fatal("the shared claim is not allocated")
	}
	var reserved []string
	for _, r := range c.Status.ReservedFor {
		reserved = append(reserved, r.Name)
	}
	if diff := cmp.Diff([]string{"team-0", "team-1"}, reserved); diff != "" {
		t.Errorf("reservedFor (-want +got):\n%s", diff)
	}
	if n := len(exclusiveDevices(c.Status.Allocation)); n != 4 {
		t.Errorf("%d devices allocated, want the claim's 4", n)
	}
	for _, pod := range []string{"team-0", "team-1"} {
		p := h.pod(pod)
		if hasGate(p) {
			t.Errorf("%s still gated", pod)
		}
		if p.Annotations[placement.AnnotationNode] != allocationNode(c.Status.Allocation) {
			t.Errorf("%s noted on node %q, the claim is on %q", pod, p.Annotations[placement.AnnotationNode], allocationNode(c.Status.Allocation))
		}
	}
	// Finalizer and annotations, then the status: two writes, once.
	if writes != 2 {
		t.Errorf("%d claim writes, want 2: the shared claim written once", writes)
	}
}

func TestAllocatedClaimHoldsThePodToItsNode(t *testing.T) {
	pre := foreignClaim("pre", "n2", "gpu-0")
	pre.Spec = resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpus",
		Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.gputopo.dev", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}}}
	h := newHarness(t, job("late", 1), pre)
	// The pod uses the allocated claim and one GPU of its own.
	p := jobPod("late", 0, "gpu-1", nil)
	p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, v1.PodResourceClaim{Name: "pre", ResourceClaimName: ptr.To("pre")})
	h.addPod(p)
	h.place("default/job/late")
	if got := h.allocatedNode("late-0"); got != "n2" {
		t.Errorf("the pod's own claim allocated on %q, want n2, where its allocated claim is", got)
	}
	if c := h.claim("pre"); allocationNode(c.Status.Allocation) != "n2" || c.Annotations[placement.AnnotationAllocatedBy] != "" {
		t.Errorf("the allocated claim was changed: %+v %v", c.Status.Allocation, c.Annotations)
	}
	if hasGate(h.pod("late-0")) {
		t.Error("late-0 still gated")
	}
}

func TestPodWhoseClaimsAreAllAllocatedIsReleasedNotReplanned(t *testing.T) {
	pre := foreignClaim("pre", "n1", "gpu-0")
	h := newHarness(t, job("only", 1), pre)
	p := jobPod("only", 0, "", nil)
	p.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "pre", ResourceClaimName: ptr.To("pre")}}
	h.addPod(p)
	h.place("default/job/only")
	if hasGate(h.pod("only-0")) {
		t.Error("only-0 still gated although its claim is allocated")
	}
	if n := h.pod("only-0").Annotations[placement.AnnotationNode]; n != "n1" {
		t.Errorf("only-0 noted on %q, want n1", n)
	}
}

func TestGrownOnePodGroupIsNotHeldToItsNode(t *testing.T) {
	h := newHarness(t, job("grow", 1))
	h.addPod(jobPod("grow", 0, "gpu-8-node", nil))
	h.place("default/job/grow")
	first := h.allocatedNode("grow-0")
	if d := h.pod("grow-0").Annotations[placement.AnnotationDomain]; d != "node:"+first {
		t.Fatalf("one-pod plan recorded domain %q, want node:%s", d, first)
	}
	h.bind("grow-0")
	// kubectl patch job grow -p '{"spec":{"parallelism":2,"completions":2}}'
	j, err := h.client.BatchV1().Jobs("default").Get(h.ctx, "grow", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	j.Spec.Parallelism, j.Spec.Completions = ptr.To[int32](2), ptr.To[int32](2)
	if _, err := h.client.BatchV1().Jobs("default").Update(h.ctx, j, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.addPod(jobPod("grow", 1, "gpu-8-node", nil))
	h.place("default/job/grow")
	second := h.allocatedNode("grow-1")
	if second == "" || second == first || leafOf(second) != leafOf(first) {
		t.Errorf("the grown group's second pod allocated on %q, want the other node of %s's leaf", second, first)
	}
}

func TestFullLeafWidensAroundTheRunningPods(t *testing.T) {
	h := boundPair(t)
	stays, lost := h.allocatedNode("pair-0"), h.allocatedNode("pair-1")
	// pair-1 is lost; before its replacement comes, a plain pod's claim
	// takes its node's GPUs, so the pair's leaf cannot hold it again.
	for _, del := range []func() error{
		func() error { return h.client.CoreV1().Pods("default").Delete(h.ctx, "pair-1", metav1.DeleteOptions{}) },
		func() error {
			return h.client.ResourceV1().ResourceClaims("default").Delete(h.ctx, "pair-1-gpus", metav1.DeleteOptions{})
		},
	} {
		if err := del(); err != nil {
			t.Fatal(err)
		}
	}
	h.create(foreignClaim("other", lost, gpus(8)...))
	h.settle()
	h.addPod(jobPod("pair", 2, "gpu-8-node", nil))
	h.place("default/job/pair")
	got := h.allocatedNode("pair-2")
	if got == "" || leafOf(got) == leafOf(stays) {
		t.Fatalf("replacement allocated on %q, want a node of the other leaf than %s's, the only room left", got, stays)
	}
	if d := h.claim("pair-2-gpus").Annotations[placement.AnnotationDomain]; d == "leaf:"+leafOf(stays) || d == "" {
		t.Errorf("replacement's domain %q, want one wider than leaf %s", d, leafOf(stays))
	}
	if hasGate(h.pod("pair-2")) {
		t.Error("replacement still gated")
	}
}

func TestBoundPodOfDeletedNodeIsLeftToThePodGarbageCollector(t *testing.T) {
	h := boundPair(t)
	lost := h.allocatedNode("pair-1")
	if err := h.client.CoreV1().Nodes().Delete(h.ctx, lost, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the node's deletion", func() bool { _, err := h.c.nodes.Get(lost); return err != nil })
	h.sync("default/job/pair")
	h.sync("default/job/pair")
	if p := h.pod("pair-1"); p.DeletionTimestamp != nil {
		t.Errorf("pair-1 deleted by the controller, want it left to the pod garbage collector")
	}
	h.c.mu.Lock()
	noted := h.c.noted[h.pod("pair-1").UID]
	h.c.mu.Unlock()
	if !noted {
		t.Error("the lost node of pair-1 was not reported")
	}
}

// boundPair is a harness with the Job "pair" of two whole-node pods,
// placed and bound.
func boundPair(t *testing.T) *harness {
	t.Helper()
	h := newHarness(t, job("pair", 2))
	h.addPod(jobPod("pair", 0, "gpu-8-node", nil))
	h.addPod(jobPod("pair", 1, "gpu-8-node", nil))
	h.place("default/job/pair")
	h.bind("pair-0")
	h.bind("pair-1")
	return h
}

// A claim one group allocated and runs with holds a second group's pod
// that uses it too to its node: the second group is placed there once,
// and its syncs after that write nothing.
func TestClaimAnotherGroupRunsWithHoldsThePod(t *testing.T) {
	h := newHarness(t, job("a", 1), job("b", 1))
	h.userClaim("team", "gpu-1")
	h.addPod(usingClaim("a", 0, "team"))
	h.place("default/job/a")
	c := h.claim("team")
	node := allocationNode(c.Status.Allocation)
	if node == "" {
		t.Fatal("the shared claim is not allocated for a")
	}
	// a-0 binds; the scheduler keeps the claim reserved for it.
	p := h.pod("a-0")
	p.Spec.NodeName = node
	if _, err := h.client.CoreV1().Pods("default").Update(h.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.settle()

	b := jobPod("b", 0, "gpu-1", nil)
	b.Spec.ResourceClaims = append(b.Spec.ResourceClaims, v1.PodResourceClaim{Name: "shared", ResourceClaimName: ptr.To("team")})
	h.addPod(b)
	h.place("default/job/b")
	if got := h.allocatedNode("b-0"); got != node {
		t.Errorf("b-0's own claim allocated on %q, want %s, where the claim it shares with a-0 is", got, node)
	}
	if hasGate(h.pod("b-0")) {
		t.Error("b-0 still gated")
	}
	if c := h.claim("team"); allocationNode(c.Status.Allocation) != node || c.Annotations[placement.AnnotationAllocatedBy] != "default/job/a" {
		t.Errorf("the shared claim changed: on %q, allocated by %q", allocationNode(c.Status.Allocation), c.Annotations[placement.AnnotationAllocatedBy])
	}
	writes := 0
	h.client.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetVerb() != "get" && a.GetVerb() != "list" && a.GetVerb() != "watch" {
			writes++
		}
		return false, nil, nil
	})
	h.sync("default/job/b")
	if writes != 0 {
		t.Errorf("%d writes by syncs of a placed group, want none", writes)
	}
}
