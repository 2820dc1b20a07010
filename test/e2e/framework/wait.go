package framework

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// PollEvery is how often Eventually asks again.
const PollEvery = 250 * time.Millisecond

// Eventually polls cond until it reports done or timeout passes, then fails
// the test with what cond said last. cond may fail the test itself.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() (done bool, state string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var state string
	for {
		var done bool
		done, state = cond()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s; last state: %s", timeout, what, state)
		}
		time.Sleep(PollEvery)
	}
}

// PodState describes a pod for failure messages: phase, node, the
// conditions that are not true and waiting containers.
func PodState(p *corev1.Pod) string {
	s := fmt.Sprintf("phase=%s node=%q", p.Status.Phase, p.Spec.NodeName)
	if len(p.Spec.SchedulingGates) > 0 {
		s += fmt.Sprintf("; gates=%v", p.Spec.SchedulingGates)
	}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			s += fmt.Sprintf("; %s=%s %s: %s", c.Type, c.Status, c.Reason, c.Message)
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			s += fmt.Sprintf("; container %s waiting: %s %s", cs.Name, w.Reason, w.Message)
		}
	}
	return s
}

// PodClaim returns the claim generated for the pod's resource claim of
// that name (an entry of spec.resourceClaims).
func PodClaim(ctx context.Context, client kubernetes.Interface, p *corev1.Pod, name string) (*resourcev1.ResourceClaim, error) {
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.Name == name && s.ResourceClaimName != nil {
			return client.ResourceV1().ResourceClaims(p.Namespace).Get(ctx, *s.ResourceClaimName, metav1.GetOptions{})
		}
	}
	return nil, fmt.Errorf("pod %s has no generated claim %q yet", p.Name, name)
}

// Ctx returns a context for API calls outside a wait, cancelled when the
// test ends.
func Ctx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
