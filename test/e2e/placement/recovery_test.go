package placement

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/test/e2e/framework"
)

// recoveryRounds is how many times TestRecoveryTime loses a planned node.
const recoveryRounds = 3

// TestRecoveryTime measures how long a group takes to be whole again in its
// leaf after the node a pod was planned on is deleted: once while the pod
// is on its way (claims allocated, gate open or about to, not bound), once
// after it was bound. The figures go to docs/benchmarks.md.
func TestRecoveryTime(t *testing.T) {
	dumpOnFailure(t)
	leaf := fakeLeaf(t)
	var steered, bound []time.Duration
	for i := range recoveryRounds {
		bound = append(bound, loseNode(t, fmt.Sprintf("rec-bound-%d", i), leaf, true))
	}
	// A fake node binds at once once the gates open: the node is lost
	// before the pod binds when the gates stay closed a while longer
	// (--settle-delay=3s), as on a busy scheduler.
	restartController(t, "--settle-delay=3s")
	defer restartController(t)
	for i := range recoveryRounds {
		steered = append(steered, loseNode(t, fmt.Sprintf("rec-steered-%d", i), leaf, false))
	}
	t.Logf("planned node deleted before its pod bound → group bound again in %s: %s", leaf, durations(steered))
	t.Logf("node of a bound pod deleted → replacement bound in %s: %s", leaf, durations(bound))
}

// loseNode creates a 2-pod whole-node Job required into leaf, deletes the
// node of its first allocated claim (after that pod bound, with afterBind),
// and returns the time from the deletion until every pod of the Job is
// bound again in the leaf, off the deleted node. The node comes back after.
func loseNode(t *testing.T, name, leaf string, afterBind bool) time.Duration {
	t.Helper()
	ctx := context.Background()
	job := newJob(name, 2, "gpu-8-node", required(leaf))
	if _, err := client.BatchV1().Jobs(namespace).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer deleteJob(t, name)

	// The node to lose: where the controller allocated the first claim.
	var lost string
	framework.Eventually(t, waitPlaced, name+" to have a claim allocated", func() (bool, string) {
		pods, err := jobPods(ctx, name)
		if err != nil {
			return false, err.Error()
		}
		claims, err := claimsByName(ctx)
		if err != nil {
			return false, err.Error()
		}
		if afterBind {
			if ok, why := allBound(pods, 2, claims, nil); !ok {
				return false, why
			}
			lost = pods[0].Spec.NodeName
			return true, ""
		}
		for _, p := range pods {
			if c := claims[generatedClaim(&p)]; c != nil && c.Status.Allocation != nil && p.Spec.NodeName == "" {
				lost = allocationNode(c.Status.Allocation)
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d pods, none allocated and unbound", len(pods))
	})
	if err := client.CoreV1().Nodes().Delete(ctx, lost, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	lostAt := time.Now()
	defer restoreNode(t, lost)

	var took time.Duration
	framework.Eventually(t, waitContention, name+" to be bound again in "+leaf+" off "+lost, func() (bool, string) {
		pods, err := jobPods(ctx, name)
		if err != nil {
			return false, err.Error()
		}
		claims, err := claimsByName(ctx)
		if err != nil {
			return false, err.Error()
		}
		if ok, why := allBound(pods, 2, claims, map[string]bool{lost: true}); !ok {
			return false, why
		}
		took = time.Since(lostAt)
		for _, p := range activePods(pods) {
			if topo.leafOf[p.Spec.NodeName] != leaf {
				t.Errorf("pod %s of %s went to %s in %s, outside its leaf %s", p.Name, name, p.Spec.NodeName, topo.leafOf[p.Spec.NodeName], leaf)
			}
		}
		return true, ""
	})
	how := "steered"
	if afterBind {
		how = "bound"
	}
	t.Logf("%s: lost %s (%s pod) → whole again in %s after %s%s", name, lost, how, leaf, took.Round(10*time.Millisecond), recoveryEvents(ctx, name))
	return took
}

// recoveryEvents lists the controller's events about the Job's pods that
// say how they left the lost node.
func recoveryEvents(ctx context.Context, job string) string {
	events, err := client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Pod"})
	if err != nil {
		return ""
	}
	var out []string
	for _, e := range events.Items {
		if strings.HasPrefix(e.InvolvedObject.Name, job+"-") && (e.Reason == "Released" || e.Reason == "Moved") {
			out = append(out, e.Reason)
		}
	}
	if len(out) == 0 {
		return ""
	}
	return fmt.Sprintf(" (%s)", strings.Join(out, ", "))
}

// restoreNode brings a deleted fake node back and waits until it is
// Ready again.
func restoreNode(t *testing.T, node string) {
	t.Helper()
	ctx := context.Background()
	if err := lc.RestoreFakeNode(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Errorf("restore node %s: %v", node, err)
		return
	}
	waitNodeReady(t, node)
}

// durations reads as "p50 1.2s, max 2.3s over 5 runs".
func durations(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return "no runs"
	}
	return fmt.Sprintf("p50 %s, max %s over %d runs (%v)", s[(len(s)-1)/2].Round(10*time.Millisecond), s[len(s)-1].Round(10*time.Millisecond), len(s), roundAll(ds))
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(10 * time.Millisecond)
	}
	return out
}

// waitNodeReady waits until the node is Ready and has no taints.
func waitNodeReady(t *testing.T, node string) {
	t.Helper()
	framework.Eventually(t, waitCleanup, "node "+node+" to be Ready without taints", func() (bool, string) {
		n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && len(n.Spec.Taints) == 0 {
				return true, ""
			}
		}
		return false, fmt.Sprintf("taints %v, conditions %v", n.Spec.Taints, n.Status.Conditions)
	})
}

// restartController restarts the suite's controller with extra flags.
func restartController(t *testing.T, extra ...string) {
	t.Helper()
	if err := lc.StopController(); err != nil {
		t.Fatalf("stop controller: %v", err)
	}
	if err := lc.StartControllerWith(extra...); err != nil {
		t.Fatalf("start controller with %v: %v", extra, err)
	}
}
