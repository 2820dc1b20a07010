package placement

// Inputs kube-scheduler honours that the controller, which allocates the
// claims of the groups it places, must honour too, each checked on the
// real cluster with the components that act on them: the scheduler, the
// device taint eviction controller and the Job controller.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	placementapi "github.com/gputopo/gputopo/api/placement/v1alpha1"
	gputopology "github.com/gputopo/gputopo/pkg/topology"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// taintNodeGPUs taints every gputopo device of node with a DeviceTaintRule
// and removes the rule when the test ends.
func taintNodeGPUs(t *testing.T, name, node string, effect resourcev1.DeviceTaintEffect) {
	t.Helper()
	rule := &resourcev1.DeviceTaintRule{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourcev1.DeviceTaintRuleSpec{
			DeviceSelector: &resourcev1.DeviceTaintSelector{Driver: ptr.To(gputopology.DriverName), Pool: ptr.To(node)},
			Taint:          resourcev1.DeviceTaint{Key: "e2e.gputopo.dev/broken", Value: "xid-79", Effect: effect},
		},
	}
	if _, err := client.ResourceV1().DeviceTaintRules().Create(framework.Ctx(t), rule, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DeviceTaintRule %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := client.ResourceV1().DeviceTaintRules().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete DeviceTaintRule %s: %v", name, err)
		}
	})
}

// onNode keeps a Job's pods to one node by its hostname label.
func onNode(job *batchv1.Job, node string) {
	job.Spec.Template.Spec.NodeSelector = map[string]string{corev1.LabelHostname: node}
}

// plainPod is a pod the controller does not manage, with one claim from
// template, held to node.
func plainPod(name, tmpl, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{"app.kubernetes.io/part-of": "gputopo-e2e"}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			NodeSelector:                  map[string]string{corev1.LabelHostname: node},
			Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: claimName}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: claimName, ResourceClaimTemplateName: ptr.To(tmpl)}},
		},
	}
}

func createPod(t *testing.T, p *corev1.Pod) {
	t.Helper()
	if _, err := client.CoreV1().Pods(namespace).Create(framework.Ctx(t), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", p.Name, err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Pods(namespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
}

// unschedulable reports whether the scheduler tried the pod and found no
// node for it.
func unschedulable(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true
		}
	}
	return false
}

// waitStatus waits until every pod of the Job is gated with a status
// annotation of reason, and returns its message.
func waitStatusReason(t *testing.T, job, reason string) string {
	t.Helper()
	var msg string
	framework.Eventually(t, waitStatus, fmt.Sprintf("Job %s's pods to say %s", job, reason), func() (bool, string) {
		pods, err := jobPods(context.Background(), job)
		if err != nil || len(pods) == 0 {
			return false, fmt.Sprintf("%d pods (%v)", len(pods), err)
		}
		for _, p := range pods {
			st, err := placementapi.ParseStatus(p.Annotations[placementapi.AnnotationStatus])
			if err != nil || st.Reason != reason || !hasGate(&p) {
				return false, fmt.Sprintf("pod %s: gated %v, status %q", p.Name, hasGate(&p), p.Annotations[placementapi.AnnotationStatus])
			}
			msg = st.Message
		}
		return true, ""
	})
	return msg
}

// noClaimAllocated fails the test if a claim of the Job's pods holds
// devices.
func noClaimAllocated(t *testing.T, job string) {
	t.Helper()
	ctx := context.Background()
	pods, err := jobPods(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := claimsByName(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if c := claims[generatedClaim(&p)]; c != nil && c.Status.Allocation != nil {
			t.Errorf("claim %s of pod %s is allocated on %s", c.Name, p.Name, allocationNode(c.Status.Allocation))
		}
	}
}

// TestDeviceTaintRuleAsTheSchedulerSeesIt: with a NoSchedule rule on a
// node's GPUs, kube-scheduler refuses a plain pod held to that node, and
// the controller refuses a managed one the same way; once the rules are
// gone both run there. Each has a node of its own, so neither takes the
// other's GPUs when the rules go.
func TestDeviceTaintRuleAsTheSchedulerSeesIt(t *testing.T) {
	framework.RequireDeviceTaintRules(t, client)
	dumpOnFailure(t)
	const plainNode, managedNode = "gpu-s0-l3-n2", "gpu-s0-l3-n3"
	taintNodeGPUs(t, "e2e-noschedule-plain", plainNode, resourcev1.DeviceTaintEffectNoSchedule)
	taintNodeGPUs(t, "e2e-noschedule-managed", managedNode, resourcev1.DeviceTaintEffectNoSchedule)
	createPod(t, plainPod("plain-tainted", "gpu-8-node", plainNode))
	job := newJob("managed-tainted", 1, "gpu-8-node", placed(placementapi.PlacementAuto))
	onNode(job, managedNode)
	if _, err := client.BatchV1().Jobs(namespace).Create(framework.Ctx(t), job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteJob(t, "managed-tainted") })

	framework.Eventually(t, waitStatus, "the scheduler to refuse the plain pod", func() (bool, string) {
		p, err := client.CoreV1().Pods(namespace).Get(context.Background(), "plain-tainted", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return unschedulable(p), framework.PodState(p)
	})
	msg := waitStatusReason(t, "managed-tainted", placementapi.StatusUnschedulable)
	noClaimAllocated(t, "managed-tainted")
	t.Logf("refused by both; the controller says: %s", msg)

	for _, rule := range []string{"e2e-noschedule-plain", "e2e-noschedule-managed"} {
		if err := client.ResourceV1().DeviceTaintRules().Delete(framework.Ctx(t), rule, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pl := waitJobPlaced(t, "managed-tainted", 1, waitPlaced)
	if pl.nodes[0] != managedNode {
		t.Errorf("managed pod bound to %s, want %s", pl.nodes[0], managedNode)
	}
	framework.Eventually(t, waitPlaced, "the scheduler to bind the plain pod", func() (bool, string) {
		p, err := client.CoreV1().Pods(namespace).Get(context.Background(), "plain-tainted", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Spec.NodeName == plainNode, framework.PodState(p)
	})
}

// TestDeviceTaintRuleNoExecuteReplacesOffTheNode: a NoExecute rule on the
// GPUs of a running managed pod's node makes the device taint eviction
// controller evict it; the Job replaces it, and the controller places the
// replacement off the tainted GPUs instead of on them again.
func TestDeviceTaintRuleNoExecuteReplacesOffTheNode(t *testing.T) {
	framework.RequireDeviceTaintRules(t, client)
	dumpOnFailure(t)
	createJob(t, "evicted", 1, required("leaf-2"))
	pl := waitJobPlaced(t, "evicted", 1, waitPlaced)
	tainted, first := pl.nodes[0], pl.pods[0].Name
	taintNodeGPUs(t, "e2e-noexecute", tainted, resourcev1.DeviceTaintEffectNoExecute)

	framework.Eventually(t, waitPlaced, "the eviction of "+first, func() (bool, string) {
		p, err := client.CoreV1().Pods(namespace).Get(context.Background(), first, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return true, ""
		case err != nil:
			return false, err.Error()
		case p.DeletionTimestamp != nil:
			// A fake node never confirms a deletion: finish it as the
			// kubelet would.
			forceDeletePod(t, first)
			return true, ""
		}
		return false, framework.PodState(p)
	})
	pl = waitJobPlaced(t, "evicted", 1, waitPlaced)
	if pl.nodes[0] == tainted {
		t.Fatalf("replacement %s placed on %s again, whose GPUs are tainted NoExecute", pl.pods[0].Name, tainted)
	}
	for _, c := range pl.claims {
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Pool == tainted {
				t.Errorf("replacement's claim %s holds %s/%s of the tainted node", c.Name, r.Pool, r.Device)
			}
		}
	}
}

// TestClaimSharedByAJobsPods: the pods of a Job that name one user
// ResourceClaim are placed on the claim's one node, the claim allocated
// once and reserved for both, and nothing writes it again afterwards.
func TestClaimSharedByAJobsPods(t *testing.T) {
	dumpOnFailure(t)
	ctx := framework.Ctx(t)
	tmpl, err := client.ResourceV1().ResourceClaimTemplates(namespace).Get(ctx, "gpu-4-nvlink", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "team-gpus", Namespace: namespace}, Spec: tmpl.Spec.Spec}
	if _, err := client.ResourceV1().ResourceClaims(namespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	job := newJob("shared-claim", 2, "gpu-4-nvlink", placed(placementapi.PlacementAuto))
	job.Spec.Template.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: claimName, ResourceClaimName: ptr.To("team-gpus")}}
	if _, err := client.BatchV1().Jobs(namespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		deleteJob(t, "shared-claim")
		_ = client.ResourceV1().ResourceClaims(namespace).Delete(context.Background(), "team-gpus", metav1.DeleteOptions{})
	})
	var c *resourcev1.ResourceClaim
	framework.Eventually(t, waitPlaced, "both pods bound where the shared claim is", func() (bool, string) {
		pods, err := jobPods(context.Background(), "shared-claim")
		if err != nil || len(pods) != 2 {
			return false, fmt.Sprintf("%d pods (%v)", len(pods), err)
		}
		if c, err = client.ResourceV1().ResourceClaims(namespace).Get(context.Background(), "team-gpus", metav1.GetOptions{}); err != nil {
			return false, err.Error()
		}
		node := allocationNode(c.Status.Allocation)
		for _, p := range pods {
			if p.Spec.NodeName == "" || p.Spec.NodeName != node {
				return false, fmt.Sprintf("pod %s: %s; claim on %q", p.Name, framework.PodState(&p), node)
			}
		}
		return true, ""
	})
	var reserved []string
	for _, r := range c.Status.ReservedFor {
		reserved = append(reserved, r.Name)
	}
	slices.Sort(reserved)
	if len(reserved) != 2 || !strings.HasPrefix(reserved[0], "shared-claim-") {
		t.Errorf("the shared claim is reserved for %v, want both pods", reserved)
	}
	if by := c.Annotations[placementapi.AnnotationAllocatedBy]; by != namespace+"/job/shared-claim" {
		t.Errorf("the shared claim was allocated by %q, want the Job's group", by)
	}
	if n := len(c.Status.Allocation.Devices.Results); n != 4 {
		t.Errorf("%d devices allocated, want the claim's 4", n)
	}
}

// TestForeignGateHoldsNothing: pods that another controller's gate also
// holds (a queue admitting Jobs) get no devices until that gate goes;
// then the controller places them as usual.
func TestForeignGateHoldsNothing(t *testing.T) {
	dumpOnFailure(t)
	const queueGate = "e2e.gputopo.dev/queue"
	job := newJob("queued", 2, "gpu-8-node", placed(placementapi.PlacementSameLeaf))
	job.Spec.Template.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: queueGate}}
	if _, err := client.BatchV1().Jobs(namespace).Create(framework.Ctx(t), job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteJob(t, "queued") })
	msg := waitStatusReason(t, "queued", placementapi.StatusWaitingForGates)
	if !strings.Contains(msg, queueGate) {
		t.Errorf("status %q does not name the gate %s", msg, queueGate)
	}
	noClaimAllocated(t, "queued")

	// The queue admits the Job.
	pods, err := jobPods(framework.Ctx(t), "queued")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for _, p := range pods {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := client.CoreV1().Pods(namespace).Get(framework.Ctx(t), p.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Spec.SchedulingGates = slices.DeleteFunc(cur.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == queueGate })
			_, err = client.CoreV1().Pods(namespace).Update(framework.Ctx(t), cur, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatalf("remove %s from %s: %v", queueGate, p.Name, err)
		}
	}
	pl := waitJobPlaced(t, "queued", 2, waitPlaced)
	if len(pl.leaves) != 1 {
		t.Errorf("placed across leaves %v, want one", pl.leaves)
	}
	t.Logf("placed %s after the queue's gate went", time.Since(start).Round(10*time.Millisecond))
}
