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
	"k8s.io/client-go/util/retry"

	"github.com/gputopo/gputopo/test/e2e/framework"
)

// chaos is what the test did to the cluster while Jobs were placed.
type chaos struct {
	mu                sync.Mutex
	gone, tainted     string
	goneAt, taintedAt time.Time
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
	time.Sleep(closeGrace)
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
	time.Sleep(closeGrace)
	if err := ledgerOf(ch).close(ctx, node, "was tainted NoExecute"); err != nil {
		ch.fail("%v", err)
	}
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
	if err := lc.StartController(); err != nil {
		ch.fail("restart controller: %v", err)
		return
	}
	ch.note("controller restarted")
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
		if n == "" {
			continue
		}
		framework.Eventually(t, waitCleanup, "node "+n+" to be Ready without taints", func() (bool, string) {
			node, err := client.CoreV1().Nodes().Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && len(node.Spec.Taints) == 0 {
					return true, ""
				}
			}
			return false, fmt.Sprintf("taints %v, conditions %v", node.Spec.Taints, node.Status.Conditions)
		})
	}
}
