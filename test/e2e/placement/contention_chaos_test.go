package placement

// What TestContention does to the cluster while it places Jobs: delete a
// node, taint one NoExecute, kill the controller; and how it undoes it.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"github.com/gputopo/gputopo/test/e2e/framework"
)

// chaos is what the test did to the cluster while Jobs were placed.
type chaos struct {
	mu                sync.Mutex
	gone, tainted     string
	goneAt, taintedAt time.Time
	restarted         time.Time // when the controller was started again
	notes, errs       []string
	ledger            *ledger
}

func ledgerOf(c *chaos) *ledger {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ledger
}

func (c *chaos) note(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.notes = append(c.notes, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
}

func (c *chaos) fail(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs = append(c.errs, fmt.Sprintf(format, args...))
}

// deleteNodeMidPlan deletes a fake node as soon as the controller wrote a
// claim on it. Its ResourceSlices stay behind, as fake nodes' slices have
// no owner reference: the controller must plan only on nodes that exist.
func deleteNodeMidPlan(ch *chaos, node string) {
	ctx := context.Background()
	if err := client.CoreV1().Nodes().Delete(ctx, node, metav1.DeleteOptions{}); err != nil {
		ch.fail("delete node %s: %v", node, err)
		return
	}
	ch.mu.Lock()
	ch.gone, ch.goneAt = node, time.Now()
	ch.mu.Unlock()
	slices, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourcev1.ResourceSliceSelectorNodeName + "=" + node})
	if err == nil {
		ch.note("deleted node %s mid-plan; %d of its ResourceSlices are left", node, len(slices.Items))
	}
	if err := waitLossHandled(ctx, "ct-gone", node); err != nil {
		ch.fail("%v", err)
		return
	}
	if err := ledgerOf(ch).close(ctx, node, "was deleted"); err != nil {
		ch.fail("%v", err)
	}
}

// taintNodeMidPlan taints the node of a claim the controller just wrote.
func taintNodeMidPlan(ch *chaos, node string) {
	ctx := context.Background()
	err := editTaints(ctx, node, func(ts []corev1.Taint) []corev1.Taint {
		return append(ts, corev1.Taint{Key: contentionTaint, Effect: corev1.TaintEffectNoExecute})
	})
	if err != nil {
		ch.fail("taint node %s: %v", node, err)
		return
	}
	ch.mu.Lock()
	ch.tainted, ch.taintedAt = node, time.Now()
	ch.mu.Unlock()
	ch.note("tainted node %s (real: %v) %s:NoExecute mid-plan", node, topo.real[node], contentionTaint)
	if err := waitLossHandled(ctx, "ct-tainted", node); err != nil {
		ch.fail("%v", err)
		return
	}
	if err := ledgerOf(ch).close(ctx, node, "was tainted NoExecute"); err != nil {
		ch.fail("%v", err)
	}
}

// lossReasons are the events that say a pod's node was lost and what was
// done about it: the controller's, and the taint manager's eviction.
var lossReasons = []string{"Released", "Moved", "NotBound", "NodeLost", "TaintManagerEviction"}

// waitLossHandled waits until a pod of job has an event saying its node
// was lost (the controller's naming the node, or the taint manager's
// eviction): the controller has seen the loss, and, as it plans one group
// at a time, the plan that was writing claims on the node when it went has
// ended. From then on no claim write may land there.
func waitLossHandled(ctx context.Context, job, node string) error {
	last := ""
	err := wait.PollUntilContextTimeout(ctx, framework.PollEvery, waitContention, true, func(ctx context.Context) (bool, error) {
		events, err := client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Pod"})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		var seen []string
		for _, e := range events.Items {
			if !strings.HasPrefix(e.InvolvedObject.Name, job+"-") {
				continue
			}
			seen = append(seen, e.Reason)
			if slices.Contains(lossReasons, e.Reason) && (e.Reason == "TaintManagerEviction" || strings.Contains(e.Message, node)) {
				return true, nil
			}
		}
		last = fmt.Sprintf("events of %s's pods: %v", job, seen)
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("no pod of %s has an event about its lost node %s (%s): %w", job, node, last, err)
	}
	return nil
}

// editTaints changes a node's taints.
func editTaints(ctx context.Context, node string, edit func([]corev1.Taint) []corev1.Taint) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Taints = edit(n.Spec.Taints)
		_, err = client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
}

// killController kills the controller as soon as it wrote the first claim
// of a group, so that it dies between that group's claim writes, and starts
// a new one at once.
func killController(ch *chaos, first string) {
	if err := lc.KillController(); err != nil {
		ch.fail("kill controller: %v", err)
		return
	}
	if claims, err := claimsByName(context.Background()); err == nil {
		n := 0
		for _, c := range claims {
			if strings.HasPrefix(c.Name, "ct-indexed-") && c.Status.Allocation != nil {
				n++
			}
		}
		ch.note("killed the controller after it wrote claim %s: %d of the 12 claims of ct-indexed allocated", first, n)
	}
	started := time.Now()
	if err := lc.StartController(); err != nil {
		ch.fail("restart controller: %v", err)
		return
	}
	ch.mu.Lock()
	ch.restarted = started
	ch.mu.Unlock()
	ch.note("controller restarted")
}

// restartedAt is when the running controller was started, or zero when the
// test did not restart it (the suite's controller then counted earlier
// tests too; the events of this test's pods bound its counts from below only
// through their own).
func (c *chaos) restartedAt() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.restarted
}

// restoreNodes lifts the taint and brings the deleted node back, so the
// suite's other tests find the whole cluster.
func restoreNodes(t *testing.T, ch *chaos) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitCleanup)
	defer cancel()
	ch.mu.Lock()
	gone, tainted := ch.gone, ch.tainted
	ch.mu.Unlock()
	if tainted != "" {
		err := editTaints(ctx, tainted, func(ts []corev1.Taint) []corev1.Taint {
			return slices.DeleteFunc(ts, func(tt corev1.Taint) bool { return tt.Key == contentionTaint })
		})
		if err != nil {
			t.Errorf("remove taint from %s: %v", tainted, err)
		}
	}
	if gone != "" {
		if err := lc.RestoreFakeNode(ctx, gone); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Errorf("restore node %s: %v", gone, err)
		}
	}
	for _, n := range []string{gone, tainted} {
		if n != "" {
			waitNodeReady(t, n)
		}
	}
}
