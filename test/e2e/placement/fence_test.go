package placement

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gputopology "github.com/gputopo/gputopo/pkg/topology"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// TestClashLeavesNoDeviceToTheScheduler: kube-scheduler counts a device
// that two claims hold once, and forgets it when either gives it back.
// That is what happens when the controller's allocation races one the
// scheduler had in flight and the controller gives its claim back. A
// plain pod's claim holds every GPU of a node; the test writes the same
// devices into a second claim, as the racing write would, then gives them
// back as the controller does, and asks for the node's GPUs again with a
// second plain pod.
//
// Without the controller, kube-scheduler allocates the GPUs a second
// time (the difference this test shows, logged rather than required, so
// that a kube-scheduler that stops losing count does not fail it). With
// the controller, the GPUs are fenced by DeviceTaintRules and the second
// pod waits until the first has gone; then the fences go and it binds.
func TestClashLeavesNoDeviceToTheScheduler(t *testing.T) {
	framework.RequireDeviceTaintRules(t, client)
	dumpOnFailure(t)
	t.Cleanup(func() { ensureController(t) })

	if err := lc.StopController(); err != nil {
		t.Fatalf("stop controller: %v", err)
	}
	first, second := raceAndAsk(t, "unfenced", "gpu-s0-l3-n0")
	if second.Status.Allocation != nil {
		if shared := sharedDevices(first, second); len(shared) > 0 {
			t.Logf("without the controller, kube-scheduler allocated %v of claim %s again, to claim %s", shared, first.Name, second.Name)
		}
	} else {
		t.Log("without the controller, kube-scheduler did not allocate the devices again: it no longer loses count of them")
	}
	forgetRace(t, "unfenced")
	ensureController(t)

	first, second = raceAndAsk(t, "fenced", "gpu-s0-l3-n1")
	if second.Status.Allocation != nil {
		t.Fatalf("with the controller, kube-scheduler allocated claim %s on %s: %v, while claim %s holds %v",
			second.Name, allocationNode(second.Status.Allocation), exclusiveDevices(second.Status.Allocation), first.Name, exclusiveDevices(first.Status.Allocation))
	}
	fences := fenceRules(t)
	held := exclusiveDevices(first.Status.Allocation)
	if len(fences) != len(held) {
		t.Errorf("%d fences (%v) for the %d devices claim %s holds", len(fences), fences, len(held), first.Name)
	}

	// The first pod goes: the fences go, and the second pod gets the GPUs.
	forceDeletePod(t, "fenced-first")
	framework.Eventually(t, waitPlaced, "the fences to go and pod fenced-second to bind", func() (bool, string) {
		if f := fenceRules(t); len(f) > 0 {
			return false, fmt.Sprintf("fences left: %v", f)
		}
		p, err := client.CoreV1().Pods(namespace).Get(context.Background(), "fenced-second", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return p.Spec.NodeName != "", framework.PodState(p)
	})
	forgetRace(t, "fenced")
}

// raceAndAsk binds pod NAME-first with every GPU of node, writes its
// devices into claim NAME-racer and gives them back, then creates pod
// NAME-second for the same GPUs and returns both pods' claims once the
// scheduler has allocated the second or said it cannot (or 20 s passed).
func raceAndAsk(t *testing.T, name, node string) (first, second *resourcev1.ResourceClaim) {
	t.Helper()
	ctx := framework.Ctx(t)
	createPod(t, plainPod(name+"-first", "gpu-8-node", node))
	framework.Eventually(t, waitPlaced, "pod "+name+"-first to bind", func() (bool, string) {
		p, err := client.CoreV1().Pods(namespace).Get(ctx, name+"-first", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if c := podClaim(ctx, p); p.Spec.NodeName != "" && c != nil && c.Status.Allocation != nil {
			first = c
			return true, ""
		}
		return false, framework.PodState(p)
	})

	// The racing write and its undoing.
	racer := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name + "-racer", Namespace: namespace}, Spec: *first.Spec.DeepCopy()}
	racer, err := client.ResourceV1().ResourceClaims(namespace).Create(ctx, racer, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create claim %s-racer: %v", name, err)
	}
	racer.Status.Allocation = first.Status.Allocation.DeepCopy()
	if racer, err = client.ResourceV1().ResourceClaims(namespace).UpdateStatus(ctx, racer, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("allocate claim %s-racer: %v", name, err)
	}
	racer.Status.Allocation = nil
	if _, err = client.ResourceV1().ResourceClaims(namespace).UpdateStatus(ctx, racer, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("give back claim %s-racer: %v", name, err)
	}
	if lc.ControllerRunning() {
		framework.Eventually(t, waitStatus, "the controller to fence the devices of "+first.Name, func() (bool, string) {
			f := fenceRules(t)
			return len(f) == len(exclusiveDevices(first.Status.Allocation)), fmt.Sprintf("fences: %v", f)
		})
	}

	createPod(t, plainPod(name+"-second", "gpu-8-node", node))
	deadline := time.Now().Add(20 * time.Second)
	framework.Eventually(t, waitStatus, "the scheduler to allocate pod "+name+"-second's claim or refuse it", func() (bool, string) {
		p, err := client.CoreV1().Pods(namespace).Get(ctx, name+"-second", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		second = podClaim(ctx, p)
		if second != nil && second.Status.Allocation != nil {
			return true, ""
		}
		return unschedulable(p) && time.Now().After(deadline), framework.PodState(p)
	})
	if second == nil {
		t.Fatalf("pod %s-second has no claim", name)
	}
	return first, second
}

// forgetRace removes what raceAndAsk made and waits until nothing holds
// or fences a device of it.
func forgetRace(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	for _, p := range []string{name + "-first", name + "-second"} {
		if err := client.CoreV1().Pods(namespace).Delete(ctx, p, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete pod %s: %v", p, err)
		}
	}
	if err := client.ResourceV1().ResourceClaims(namespace).Delete(ctx, name+"-racer", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete claim %s-racer: %v", name, err)
	}
	framework.Eventually(t, waitCleanup, "the claims of "+name+" to go", func() (bool, string) {
		claims, err := claimsByName(ctx)
		if err != nil {
			return false, err.Error()
		}
		var left []string
		for n, c := range claims {
			if owner := claimOwner(c); n == name+"-racer" || owner == name+"-first" || owner == name+"-second" {
				left = append(left, n)
			}
		}
		return len(left) == 0, fmt.Sprintf("claims left: %v", left)
	})
	if lc.ControllerRunning() {
		framework.Eventually(t, waitCleanup, "the fences to go", func() (bool, string) {
			f := fenceRules(t)
			return len(f) == 0, fmt.Sprintf("fences: %v", f)
		})
	}
}

// podClaim is the pod's one claim, nil until it exists.
func podClaim(ctx context.Context, p *corev1.Pod) *resourcev1.ResourceClaim {
	name := generatedClaim(p)
	if name == "" {
		return nil
	}
	c, err := client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return c
}

// claimOwner is the pod a claim was made for, "" for none.
func claimOwner(c *resourcev1.ResourceClaim) string {
	for _, o := range c.OwnerReferences {
		if o.Kind == "Pod" {
			return o.Name
		}
	}
	return ""
}

// sharedDevices lists the devices both claims hold whole.
func sharedDevices(a, b *resourcev1.ResourceClaim) []string {
	var out []string
	for _, d := range exclusiveDevices(b.Status.Allocation) {
		if slices.Contains(exclusiveDevices(a.Status.Allocation), d) {
			out = append(out, d)
		}
	}
	return out
}

// fenceRules lists the DeviceTaintRules the controller fences devices
// with.
func fenceRules(t *testing.T) []string {
	t.Helper()
	list, err := client.ResourceV1().DeviceTaintRules().List(context.Background(), metav1.ListOptions{LabelSelector: gputopology.LabelFence + "=true"})
	if err != nil {
		t.Fatalf("list DeviceTaintRules: %v", err)
	}
	var out []string
	for _, r := range list.Items {
		out = append(out, r.Name)
	}
	return out
}
