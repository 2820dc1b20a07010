package placement

// End-to-end tests of the controller's events that README "Controller
// events" names and the other tests of the suite do not prove: NodeLost,
// Widened, Released, ReservationExpired, InvalidClaim, and Moved or
// Released for a pod refused on its planned node. Each provokes
// the situation its event reports on the suite's cluster and checks the
// event (reason, type, the object it is about, what its message names) and
// the behaviour the event reports. docs/claims.md maps each to its claim.

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
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	placementapi "github.com/gputopo/gputopo/api/placement/v1alpha1"
	gputopology "github.com/gputopo/gputopo/pkg/topology"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// podEvent is an event of the controller's about a pod.
type podEvent struct {
	pod     string
	uid     types.UID
	message string
}

// waitJobPodEvent waits until the controller recorded an event of type typ
// and reason about a pod of job, and returns it.
func waitJobPodEvent(t *testing.T, job, typ, reason string, timeout time.Duration) podEvent {
	t.Helper()
	var got podEvent
	framework.Eventually(t, timeout, fmt.Sprintf("a %s %s event on a pod of Job %s", typ, reason, job), func() (bool, string) {
		events, err := client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.kind": "Pod", "reason": reason}.String(),
		})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range events.Items {
			if strings.HasPrefix(e.InvolvedObject.Name, job+"-") && e.Type == typ && e.Source.Component == "gputopo-controller" {
				got = podEvent{pod: e.InvolvedObject.Name, uid: e.InvolvedObject.UID, message: e.Message}
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d %s events on pods, none on %s's", len(events.Items), reason, job)
	})
	return got
}

// domainWords is a domain as events name it: "leaves leaf-1,leaf-2" for
// gputopo.dev/domain "leaves:leaf-1,leaf-2".
func domainWords(domain string) string { return strings.Replace(domain, ":", " ", 1) }

// podEventCount is how many times the controller recorded a reason event
// about the pod (repeats of one event are counted in the event).
func podEventCount(t *testing.T, pod string, uid types.UID, reason string) int {
	t.Helper()
	events, err := client.CoreV1().Events(namespace).List(framework.Ctx(t), metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.kind": "Pod", "involvedObject.name": pod, "involvedObject.uid": string(uid), "reason": reason}.String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range events.Items {
		if e.Source.Component == "gputopo-controller" {
			n += int(max(e.Count, 1))
		}
	}
	return n
}

// controllerMetric reads one sample of the running controller's metrics.
func controllerMetric(t *testing.T, sample string) float64 {
	t.Helper()
	m, err := scrapeMetrics(framework.Ctx(t))
	if err != nil {
		t.Fatalf("controller metrics: %v", err)
	}
	return m[sample]
}

// TestClaimEventNodeLost: "NodeLost (the node of the bound pod was
// deleted; the pod garbage collector removes the pod and the replacement
// is planned)". A two-pod Job is placed in a leaf; the node of one bound
// pod is deleted: that pod gets a NodeLost Warning naming the node and the
// group's domain, released_pods_total{reason="NodeDeleted"} counts it
// once, and the pod garbage collector's removal of the pod is followed by
// a replacement that the controller places back into the leaf, off the
// lost node, beside the pod that kept its place.
func TestClaimEventNodeLost(t *testing.T) {
	dumpOnFailure(t)
	leaf := fakeLeaf(t)
	createJob(t, "ev-nodelost", 2, required(leaf))
	pl := waitJobPlaced(t, "ev-nodelost", 2, waitPlaced)
	victim, keeper := pl.pods[0], pl.pods[1]
	lost := victim.Spec.NodeName
	const lostMetric = `gputopo_controller_released_pods_total{reason="NodeDeleted"}`
	before := controllerMetric(t, lostMetric)

	if err := client.CoreV1().Nodes().Delete(framework.Ctx(t), lost, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete node %s: %v", lost, err)
	}
	t.Cleanup(func() { restoreNode(t, lost) })

	msg := waitEvent(t, "Pod", victim.Name, victim.UID, corev1.EventTypeWarning, "NodeLost", waitStatus)
	t.Logf("NodeLost: %s", msg)
	if !strings.Contains(msg, "node "+lost+" was deleted") || !strings.Contains(msg, pl.domain) {
		t.Errorf("NodeLost event %q does not name the deleted node %s and the group's domain %s", msg, lost, pl.domain)
	}
	if n := podEventCount(t, keeper.Name, keeper.UID, "NodeLost"); n != 0 {
		t.Errorf("pod %s, whose node %s is still there, has %d NodeLost event(s)", keeper.Name, keeper.Spec.NodeName, n)
	}

	// The pod garbage collector removes the pod of the deleted node; the
	// Job replaces it and the controller places the replacement.
	var replacement corev1.Pod
	framework.Eventually(t, waitContention, "ev-nodelost to be whole again off "+lost, func() (bool, string) {
		pods, err := jobPods(context.Background(), "ev-nodelost")
		if err != nil {
			return false, err.Error()
		}
		claims, err := claimsByName(context.Background())
		if err != nil {
			return false, err.Error()
		}
		if slices.ContainsFunc(pods, func(p corev1.Pod) bool { return p.UID == victim.UID }) {
			return false, "pod " + victim.Name + " of the deleted node not removed yet"
		}
		if ok, why := allBound(pods, 2, claims, map[string]bool{lost: true}); !ok {
			return false, why
		}
		for _, p := range pods {
			if p.UID != keeper.UID {
				replacement = p
			}
		}
		return true, ""
	})
	if replacement.UID == "" {
		t.Fatalf("pod %s, which kept its place, was replaced too", keeper.Name)
	}
	if got := topo.leafOf[replacement.Spec.NodeName]; got != leaf {
		t.Errorf("replacement %s went to %s in %s, outside the group's leaf %s", replacement.Name, replacement.Spec.NodeName, got, leaf)
	}
	if d := replacement.Annotations[placementapi.AnnotationDomain]; d != pl.domain {
		t.Errorf("replacement %s: %s=%q, want the group's %q", replacement.Name, placementapi.AnnotationDomain, d, pl.domain)
	}
	if got := controllerMetric(t, lostMetric); got != before+1 {
		t.Errorf("%s went from %v to %v, want one more for the one pod whose node was deleted", lostMetric, before, got)
	}
}

// TestClaimEventWidened: "when that domain can no longer hold it (the
// group grew, ...), the group widens, as its placement allows, to a larger
// domain that holds the pods that keep their places, and says so in a
// Widened event". A two-pod Job placed in a leaf, whose other two nodes
// are then taken, grows to three pods: the third cannot fit in the leaf,
// the group is placed in a run of two adjacent leaves that holds the two
// bound pods where they are, and the Job gets a Normal Widened event that
// names that run.
func TestClaimEventWidened(t *testing.T) {
	dumpOnFailure(t)
	leaf := fakeLeaf(t)
	job := createJob(t, "ev-widened", 2, map[string]string{
		placementapi.AnnotationPlacement:       string(placementapi.PlacementAuto),
		placementapi.AnnotationPreferredDomain: leaf,
	})
	before := waitJobPlaced(t, "ev-widened", 2, waitPlaced)
	if before.domain != "leaf:"+leaf {
		t.Fatalf("Job preferring %s: domain %q, want leaf:%s", leaf, before.domain, leaf)
	}
	free := slices.DeleteFunc(slices.Clone(topo.leafNodes[leaf]), func(n string) bool { return slices.Contains(before.nodes, n) })
	for i, n := range free {
		occupy(t, fmt.Sprintf("occupier-widen-%d", i), "gpu-8-node", n)
	}
	if n := jobEventCount(t, job, "Widened"); n != 0 {
		t.Fatalf("Job has %d Widened event(s) before it grew", n)
	}

	grow := []byte(`{"spec":{"parallelism":3,"completions":3}}`)
	if _, err := client.BatchV1().Jobs(namespace).Patch(framework.Ctx(t), job.Name, types.MergePatchType, grow, metav1.PatchOptions{}); err != nil {
		t.Fatalf("grow Job %s to 3 pods: %v", job.Name, err)
	}
	msg := waitEvent(t, "Job", job.Name, job.UID, corev1.EventTypeNormal, "Widened", waitPlaced)
	t.Logf("Widened: %s", msg)
	// The bound pods keep the domain they were placed in; the new pod
	// carries the widened one.
	var after []corev1.Pod
	framework.Eventually(t, waitPlaced, "the 3 pods of ev-widened to be bound", func() (bool, string) {
		var err error
		if after, err = jobPods(context.Background(), "ev-widened"); err != nil {
			return false, err.Error()
		}
		claims, err := claimsByName(context.Background())
		if err != nil {
			return false, err.Error()
		}
		return allBound(after, 3, claims, nil)
	})
	var grown corev1.Pod
	for _, p := range after {
		if !slices.ContainsFunc(before.pods, func(b corev1.Pod) bool { return b.UID == p.UID }) {
			grown = p
		}
	}
	for _, b := range before.pods {
		i := slices.IndexFunc(after, func(p corev1.Pod) bool { return p.UID == b.UID })
		if i < 0 || after[i].Spec.NodeName != b.Spec.NodeName {
			t.Errorf("pod %s on %s did not keep its place", b.Name, b.Spec.NodeName)
		}
	}
	if grown.UID == "" {
		t.Fatalf("no new pod among %d", len(after))
	}
	domain := grown.Annotations[placementapi.AnnotationDomain]
	names, ok := strings.CutPrefix(domain, "leaves:")
	if !ok {
		t.Fatalf("new pod %s: %s=%q, want a run of leaves leaves:<a>,<b>", grown.Name, placementapi.AnnotationDomain, domain)
	}
	run := strings.Split(names, ",")
	spine := topo.spineOf[leaf]
	order := topo.spineLeaves[spine]
	if len(run) != 2 || !slices.Contains(run, leaf) || topo.spineOf[run[0]] != spine || topo.spineOf[run[1]] != spine ||
		slices.Index(order, run[1])-slices.Index(order, run[0]) != 1 {
		t.Errorf("widened domain %q: want two adjacent leaves of %s (%v), one of them %s", domain, spine, order, leaf)
	}
	if in := topo.leafOf[grown.Spec.NodeName]; !slices.Contains(run, in) || in == leaf {
		t.Errorf("new pod %s on %s in %s: want the other leaf of %q (%s is full)", grown.Name, grown.Spec.NodeName, in, domain, leaf)
	}
	var runNodes []string
	for _, l := range run {
		runNodes = append(runNodes, topo.leafNodes[l]...)
	}
	checkHeldTo(t, bound{pods: []corev1.Pod{grown}, domain: domain}, runNodes)
	if !strings.Contains(msg, "placed in "+domainWords(domain)) {
		t.Errorf("Widened event %q does not name the new domain %q", msg, domain)
	}
}

// TestClaimEventReleased: "A pod ... whose node is ... NotReady or tainted
// against it, is placed again in its group's domain"; "Released (planned
// again, reason as in gputopo.dev/released)". With the gates held closed
// after the claims are written (--settle-delay), the node of one pod's
// claim is tainted NoSchedule, or in the second case marked NotReady: the
// pod gets a Released Warning with reason NodeTainted (NodeNotReady)
// naming the node (and the taint), its gputopo.dev/released says that
// reason with as many releases as it has Released events,
// released_pods_total counts it under that reason, its claim is allocated
// again in the leaf on another node, and once the gates open every pod is
// bound off the node that failed.
func TestClaimEventReleased(t *testing.T) {
	dumpOnFailure(t)
	const settle = 60 * time.Second
	t.Cleanup(func() { restartController(t) })
	taint := corev1.Taint{Key: "e2e.gputopo.dev/released", Value: "true", Effect: corev1.TaintEffectNoSchedule}
	for _, tc := range []struct {
		job, reason string
		says        []string // besides the node's name
		fail        func(t *testing.T, node string)
	}{
		{"ev-released-taint", placementapi.ReleaseNodeTainted, []string{"has taint " + taint.Key}, func(t *testing.T, node string) {
			setTaint(t, node, &taint)
			t.Cleanup(func() { setTaint(t, node, nil) })
		}},
		{"ev-released-notready", placementapi.ReleaseNodeNotReady, []string{"is not Ready"}, func(t *testing.T, node string) {
			setReady(t, node, false)
			t.Cleanup(func() { setReady(t, node, true); waitNodeReady(t, node) })
		}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			releasedOffFailedNode(t, tc.job, tc.reason, tc.says, settle, tc.fail)
		})
	}
}

// releasedOffFailedNode runs a case of TestClaimEventReleased: a two-pod
// Job held in a leaf, fail makes the node of one pod's claim unusable.
func releasedOffFailedNode(t *testing.T, job, reason string, says []string, settle time.Duration, fail func(*testing.T, string)) {
	restartController(t, fmt.Sprintf("--settle-delay=%s", settle))
	leaf := fakeLeaf(t)
	createJob(t, job, 2, required(leaf))

	// The claims are written and the gates still closed.
	var victim corev1.Pod
	var failed string
	framework.Eventually(t, waitPlaced, job+"'s claims to be allocated, its pods still gated", func() (bool, string) {
		pods, err := jobPods(context.Background(), job)
		if err != nil || len(pods) != 2 {
			return false, fmt.Sprintf("%d pods (%v)", len(pods), err)
		}
		claims, err := claimsByName(context.Background())
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods {
			c := claims[generatedClaim(&p)]
			if c == nil || c.Status.Allocation == nil {
				return false, "pod " + p.Name + ": claim not allocated"
			}
			if !hasGate(&p) {
				return false, "pod " + p.Name + " is ungated: " + framework.PodState(&p)
			}
		}
		victim = pods[0]
		failed = allocationNode(claims[generatedClaim(&victim)].Status.Allocation)
		return true, ""
	})
	releasedMetric := `gputopo_controller_released_pods_total{reason="` + reason + `"}`
	before := controllerMetric(t, releasedMetric)
	fail(t, failed)
	// The test is only meaningful if the node failed before the gate
	// opened: the pod must still be held with its claim on the node.
	if p, err := client.CoreV1().Pods(namespace).Get(framework.Ctx(t), victim.Name, metav1.GetOptions{}); err != nil || !hasGate(p) {
		t.Fatalf("pod %s left its gate before node %s failed (%v): the %s settle delay was too short on this machine", victim.Name, failed, err, settle)
	}
	// Node events re-sync the groups with pods bound or steered to the
	// node; a held pod's node is looked at when its group's gates are due,
	// after the settle delay, before they open.
	ev := waitEvent(t, "Pod", victim.Name, victim.UID, corev1.EventTypeWarning, "Released", settle+waitStatus)
	t.Logf("Released: %s", ev)
	if !strings.HasPrefix(ev, reason+": ") || !strings.Contains(ev, "node "+failed+" ") {
		t.Errorf("Released event %q: want reason %s, naming node %s", ev, reason, failed)
	}
	for _, w := range says {
		if !strings.Contains(ev, w) {
			t.Errorf("Released event %q does not say %q", ev, w)
		}
	}
	var cur *corev1.Pod
	framework.Eventually(t, waitStatus, "pod "+victim.Name+"'s claim to be allocated again off "+failed, func() (bool, string) {
		var err error
		if cur, err = client.CoreV1().Pods(namespace).Get(context.Background(), victim.Name, metav1.GetOptions{}); err != nil {
			return false, err.Error()
		}
		c, err := framework.PodClaim(context.Background(), client, cur, claimName)
		if err != nil || c.Status.Allocation == nil {
			return false, fmt.Sprintf("claim not allocated (%v)", err)
		}
		node := allocationNode(c.Status.Allocation)
		if node == failed {
			return false, "claim still allocated on " + failed
		}
		if topo.leafOf[node] != leaf {
			t.Errorf("pod %s planned again on %s in %s, outside its leaf %s", victim.Name, node, topo.leafOf[node], leaf)
		}
		return true, ""
	})
	rel, err := placementapi.ParseRelease(cur.Annotations[placementapi.AnnotationReleased])
	if err != nil {
		t.Errorf("pod %s: %s=%q: %v", victim.Name, placementapi.AnnotationReleased, cur.Annotations[placementapi.AnnotationReleased], err)
	} else if n := podEventCount(t, victim.Name, victim.UID, "Released"); rel.Reason != reason || rel.Count != n {
		t.Errorf("pod %s: %s=%q, want %d release(s) for %s, as its Released events say", victim.Name, placementapi.AnnotationReleased, cur.Annotations[placementapi.AnnotationReleased], n, reason)
	}
	if got := controllerMetric(t, releasedMetric); got != before+1 {
		t.Errorf("%s went from %v to %v, want one more for the one pod released", releasedMetric, before, got)
	}
	// Once the gates open, the Job is bound in its leaf, off the failed
	// node. Not another settle delay: a controller started without one
	// takes the group as it finds it and opens its gates.
	restartController(t)
	framework.Eventually(t, settle+waitPlaced, job+" to be bound in "+leaf+" off "+failed, func() (bool, string) {
		pods, err := jobPods(context.Background(), job)
		if err != nil {
			return false, err.Error()
		}
		claims, err := claimsByName(context.Background())
		if err != nil {
			return false, err.Error()
		}
		return allBound(pods, 2, claims, map[string]bool{failed: true})
	})
	pods, err := jobPods(framework.Ctx(t), job)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if topo.leafOf[p.Spec.NodeName] != leaf || p.Annotations[placementapi.AnnotationNode] != p.Spec.NodeName {
			t.Errorf("pod %s bound to %s (in %s), %s=%q: want its leaf %s and the node it is on", p.Name, p.Spec.NodeName, topo.leafOf[p.Spec.NodeName], placementapi.AnnotationNode, p.Annotations[placementapi.AnnotationNode], leaf)
		}
	}
}

// setReady sets the Ready condition of a fake node (no kubelet reports
// it), as the node lifecycle controller would see a node go NotReady and
// come back.
func setReady(t *testing.T, node string, ready bool) {
	t.Helper()
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	framework.Eventually(t, waitStatus, fmt.Sprintf("node %s's Ready condition to be set to %s", node, status), func() (bool, string) {
		n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		now := metav1.Now()
		for i := range n.Status.Conditions {
			c := &n.Status.Conditions[i]
			if c.Type == corev1.NodeReady {
				c.Status, c.LastHeartbeatTime, c.LastTransitionTime = status, now, now
				c.Reason, c.Message = "E2E", "set by the test"
			}
		}
		if _, err := client.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

// setTaint adds taint to the node, or with nil removes the test's taints.
func setTaint(t *testing.T, node string, taint *corev1.Taint) {
	t.Helper()
	framework.Eventually(t, waitStatus, "node "+node+"'s taints to be set", func() (bool, string) {
		n, err := client.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(x corev1.Taint) bool { return strings.HasPrefix(x.Key, "e2e.gputopo.dev/") })
		if taint != nil {
			n.Spec.Taints = append(n.Spec.Taints, *taint)
		}
		if _, err := client.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
}

// TestClaimEventReservationExpired: "--reservation-timeout: how long a
// reservation lasts unplaced; then the next waiting group may reserve, and
// this one may again after as long (a ReservationExpired event on its
// first pod)". With --reserve-after=1s and --reservation-timeout=60s, a
// four-pod Job that insists on a leaf with one node taken reserves the
// leaf's three free nodes and a one-pod Job that insists on the leaf is
// kept off them; when the reservation ends, a pod of the first Job gets a
// Normal ReservationExpired event naming the nodes, the leaf and the
// timeout, the reservation is no longer recorded on its pods, and the
// one-pod Job is placed on one of the nodes it was kept off.
func TestClaimEventReservationExpired(t *testing.T) {
	dumpOnFailure(t)
	const timeout = 60 * time.Second
	restartController(t, "--reserve-after=1s", fmt.Sprintf("--reservation-timeout=%s", timeout), "--retry-interval=5s")
	t.Cleanup(func() { restartController(t) })
	leaf := fakeLeaf(t)
	occupy(t, "occupier-expire", "gpu-8-node", topo.leafNodes[leaf][0])
	reserver := createJob(t, "ev-expiring", 4, required(leaf))
	msg := waitEvent(t, "Job", reserver.Name, reserver.UID, corev1.EventTypeNormal, "Reserved", waitReserve)
	t.Logf("Reserved: %s", msg)
	framework.Eventually(t, waitStatus, "the reservation recorded on ev-expiring's pods", func() (bool, string) {
		return reservationOnPods(t, "ev-expiring", true)
	})
	createJob(t, "ev-kept-off", 1, required(leaf))
	if got := waitStatusReason(t, "ev-kept-off", "Unschedulable"); !strings.Contains(got, "reserved for "+namespace+"/job/ev-expiring") {
		t.Fatalf("Job kept off the reserved nodes says %q, want the reservation named", got)
	}
	noClaimAllocated(t, "ev-kept-off")

	ev := waitJobPodEvent(t, "ev-expiring", corev1.EventTypeNormal, "ReservationExpired", timeout+waitStatus)
	t.Logf("ReservationExpired on %s: %s", ev.pod, ev.message)
	if !strings.Contains(ev.message, " in "+domainWords("leaf:"+leaf)+" ended after "+timeout.String()) {
		t.Errorf("ReservationExpired event %q does not name the domain leaf:%s and the timeout %s", ev.message, leaf, timeout)
	}
	for _, n := range topo.leafNodes[leaf][1:] {
		if !strings.Contains(ev.message, n) {
			t.Errorf("ReservationExpired event %q does not name reserved node %s", ev.message, n)
		}
	}
	framework.Eventually(t, waitStatus, "the reservation to go from ev-expiring's pods", func() (bool, string) {
		return reservationOnPods(t, "ev-expiring", false)
	})
	b := waitBound(t, jobSelector("ev-kept-off"), 1)
	if n := b.nodes[0]; topo.leafOf[n] != leaf || n == topo.leafNodes[leaf][0] {
		t.Errorf("ev-kept-off went to %s, want a node of %s it was kept off", n, leaf)
	}
}

// reservationOnPods reports whether every pod of job carries (want) or
// none carries (!want) gputopo.dev/reservation.
func reservationOnPods(t *testing.T, job string, want bool) (bool, string) {
	t.Helper()
	pods, err := jobPods(context.Background(), job)
	if err != nil || len(pods) == 0 {
		return false, fmt.Sprintf("%d pods (%v)", len(pods), err)
	}
	for _, p := range pods {
		if _, has := p.Annotations[placementapi.AnnotationReservation]; has != want {
			return false, fmt.Sprintf("pod %s: %s=%q", p.Name, placementapi.AnnotationReservation, p.Annotations[placementapi.AnnotationReservation])
		}
	}
	return true, ""
}

// TestClaimEventInvalidClaim: "On the Job ...: InvalidClaim"; reason
// InvalidClaim in gputopo.dev/status. A Job whose pod names a
// ResourceClaim that does not exist gets an InvalidClaim Warning naming
// the claim and saying to create it; its pod waits gated with that status
// and nothing allocated, and condition gputopo.dev/Placed False with the
// reason. Once the claim is created, the Job is placed and the condition
// turns True with reason Placed, naming the domain and the node.
func TestClaimEventInvalidClaim(t *testing.T) {
	dumpOnFailure(t)
	const claim = "ev-invalid-missing"
	t.Cleanup(func() { deleteClaim(t, claim) })
	job := createJobFrom(t, "ev-invalid", 1, "gpu-1", required(fakeLeaf(t)), func(j *batchv1.Job) {
		j.Spec.Template.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: claimName, ResourceClaimName: ptr.To(claim)}}
	})
	msg := waitJobWarning(t, job, "InvalidClaim")
	t.Logf("InvalidClaim: %s", msg)
	if !strings.Contains(msg, namespace+"/"+claim) || !strings.Contains(msg, "does not exist: create it") {
		t.Errorf("InvalidClaim event %q does not name the missing claim %s/%s and what to do", msg, namespace, claim)
	}
	if st := waitStatusReason(t, "ev-invalid", placementapi.StatusInvalidClaim); !strings.Contains(st, claim) {
		t.Errorf("status of the pod with the missing claim says %q, want the claim named", st)
	}
	framework.Eventually(t, waitStatus, "ev-invalid's pod to have condition "+placementapi.ConditionPlaced+" False/InvalidClaim", func() (bool, string) {
		pods, err := jobPods(context.Background(), "ev-invalid")
		if err != nil || len(pods) != 1 {
			return false, fmt.Sprintf("%d pods (%v)", len(pods), err)
		}
		if pods[0].Spec.NodeName != "" || !hasGate(&pods[0]) {
			t.Fatalf("pod %s with a missing claim left its gate: %s", pods[0].Name, framework.PodState(&pods[0]))
		}
		return placedConditionSays(&pods[0], corev1.ConditionFalse, placementapi.StatusInvalidClaim, claim), fmt.Sprintf("conditions %v", pods[0].Status.Conditions)
	})

	rc := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: namespace},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: gputopology.DriverName},
		}}}},
	}
	if _, err := client.ResourceV1().ResourceClaims(namespace).Create(framework.Ctx(t), rc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create claim %s: %v", claim, err)
	}
	// The pod uses the claim by name: no status entry points at it.
	var p corev1.Pod
	var got *resourcev1.ResourceClaim
	framework.Eventually(t, waitPlaced, "ev-invalid's pod to be bound with claim "+claim+" allocated", func() (bool, string) {
		pods, err := jobPods(context.Background(), "ev-invalid")
		if err != nil || len(pods) != 1 {
			return false, fmt.Sprintf("%d pods (%v)", len(pods), err)
		}
		p = pods[0]
		if hasGate(&p) || p.Spec.NodeName == "" {
			return false, "pod " + p.Name + ": " + framework.PodState(&p) + " " + p.Annotations[placementapi.AnnotationStatus]
		}
		if got, err = client.ResourceV1().ResourceClaims(namespace).Get(context.Background(), claim, metav1.GetOptions{}); err != nil || got.Status.Allocation == nil {
			return false, fmt.Sprintf("claim %s not allocated (%v)", claim, err)
		}
		return true, ""
	})
	if node := allocationNode(got.Status.Allocation); node != p.Spec.NodeName || !strings.HasSuffix(got.Annotations[placementapi.AnnotationAllocatedBy], "/job/ev-invalid") {
		t.Errorf("pod %s on %s: claim %s allocated on %s by %q, want on the pod's node by the controller for the Job", p.Name, p.Spec.NodeName, claim, node, got.Annotations[placementapi.AnnotationAllocatedBy])
	}
	waitEvent(t, "Job", job.Name, job.UID, corev1.EventTypeNormal, "Placed", waitStatus)
	// The pod waited with the condition False; once its gate is open the
	// controller turns it True (a write after the one that opens the gate).
	domain := p.Annotations[placementapi.AnnotationDomain]
	framework.Eventually(t, waitStatus, "pod "+p.Name+"'s condition "+placementapi.ConditionPlaced+" to turn True", func() (bool, string) {
		cur, err := client.CoreV1().Pods(namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		ok := placedConditionSays(cur, corev1.ConditionTrue, "Placed", "on node "+p.Spec.NodeName) && placedConditionSays(cur, corev1.ConditionTrue, "Placed", domain)
		return ok, fmt.Sprintf("on %s (domain %s), conditions %v", cur.Spec.NodeName, domain, cur.Status.Conditions)
	})
}

// deleteClaim deletes a claim the test created and waits until it is gone.
func deleteClaim(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	if err := client.ResourceV1().ResourceClaims(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete claim %s: %v", name, err)
		return
	}
	framework.Eventually(t, waitCleanup, "claim "+name+" to be gone", func() (bool, string) {
		c, err := client.ResourceV1().ResourceClaims(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, ""
		}
		if err != nil {
			return false, err.Error()
		}
		return false, fmt.Sprintf("finalizers %v, reserved for %v", c.Finalizers, c.Status.ReservedFor)
	})
}

// TestPodAntiAffinityPlansTheGroupApart: two four-GPU pods that the
// consolidated strategy would put onto one node, each refusing to share a
// node with the other (required pod anti-affinity on
// kubernetes.io/hostname, as kube-scheduler weighs it), are planned onto
// two nodes of the leaf and bind where they were planned, neither
// released nor moved.
func TestPodAntiAffinityPlansTheGroupApart(t *testing.T) {
	dumpOnFailure(t)
	leaf := fakeLeaf(t)
	ann := consolidatedIn(leaf)
	job := createJobFrom(t, "ev-apart", 2, "gpu-4-nvlink", ann, antiAffine("ev-apart"))
	b := waitBound(t, jobSelector(job.Name), 2)
	if b.nodes[0] == b.nodes[1] {
		t.Fatalf("both pods on %s despite their pod anti-affinity", b.nodes[0])
	}
	if len(b.leaves) != 1 || b.leaves[0] != leaf {
		t.Errorf("pods in leaves %v, want only %s", b.leaves, leaf)
	}
	keptTheirPlans(t, b.pods, "the plan should have kept the pods apart")
}

// consolidatedIn asks for the consolidated strategy in one leaf, leaf
// required.
func consolidatedIn(leaf string) map[string]string {
	ann := withStrategy(placementapi.PlacementSameLeaf, placementapi.StrategyConsolidated)
	ann[placementapi.AnnotationPreferredDomain] = leaf
	ann[placementapi.AnnotationPreferredRequired] = "true"
	return ann
}

// antiAffine gives a Job's pods required pod anti-affinity on
// kubernetes.io/hostname against the pods of Job other.
func antiAffine(other string) func(*batchv1.Job) {
	return func(j *batchv1.Job) {
		j.Spec.Template.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{batchv1.JobNameLabel: other}},
				TopologyKey:   corev1.LabelHostname,
			}},
		}}
	}
}

// TestPodAntiAffinityAgainstAnotherJob: a four-GPU pod of one Job runs
// on a node of the leaf; a four-GPU pod of a second Job, consolidated
// into the same leaf, would be planned onto that node, the fullest, but
// required pod anti-affinity on kubernetes.io/hostname ties the two, by
// the second pod's term or by the first's, and kube-scheduler's
// InterPodAffinity filter would refuse it there. The controller weighs
// the term as the scheduler does and plans the pod onto another node of
// the leaf, where it binds: neither released nor moved.
func TestPodAntiAffinityAgainstAnotherJob(t *testing.T) {
	for _, tc := range []struct {
		name          string
		anchor, later string
		theirs        bool // the term is the running pod's, against the later Job
	}{
		{name: "the new pod's term", anchor: "ev-tied-a1", later: "ev-tied-b1"},
		{name: "the running pod's term", anchor: "ev-tied-a2", later: "ev-tied-b2", theirs: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dumpOnFailure(t)
			leaf := fakeLeaf(t)
			ann := consolidatedIn(leaf)
			var anchorEdit, laterEdit []func(*batchv1.Job)
			if tc.theirs {
				anchorEdit = append(anchorEdit, antiAffine(tc.later))
			} else {
				laterEdit = append(laterEdit, antiAffine(tc.anchor))
			}
			anchor := createJobFrom(t, tc.anchor, 1, "gpu-4-nvlink", ann, anchorEdit...)
			a := waitBound(t, jobSelector(anchor.Name), 1)
			job := createJobFrom(t, tc.later, 1, "gpu-4-nvlink", ann, laterEdit...)
			b := waitBound(t, jobSelector(job.Name), 1)
			p := &b.pods[0]
			if p.Spec.NodeName == a.nodes[0] {
				t.Fatalf("pod %s on %s beside %s despite the pod anti-affinity", p.Name, p.Spec.NodeName, a.pods[0].Name)
			}
			if len(b.leaves) != 1 || b.leaves[0] != leaf {
				t.Errorf("pod in leaves %v, want only %s", b.leaves, leaf)
			}
			keptTheirPlans(t, b.pods, "the plan should have kept it off "+a.nodes[0])
		})
	}
}

// TestPodAffinityPlacesBesideAnotherJob: a four-GPU pod of one Job runs
// on a node of the leaf; the two two-GPU pods of a second Job, which the
// distributed strategy would spread over empty nodes of the leaf, have
// required pod affinity on kubernetes.io/hostname to the first Job's
// pods, which kube-scheduler's InterPodAffinity filter enforces. The
// controller weighs it as the scheduler does: both pods are planned onto
// the first pod's node and bind there, neither released nor moved.
func TestPodAffinityPlacesBesideAnotherJob(t *testing.T) {
	dumpOnFailure(t)
	leaf := fakeLeaf(t)
	anchor := createJobFrom(t, "ev-near-a", 1, "gpu-4-nvlink", consolidatedIn(leaf))
	a := waitBound(t, jobSelector(anchor.Name), 1)
	ann := withStrategy(placementapi.PlacementSameLeaf, placementapi.StrategyDistributed)
	ann[placementapi.AnnotationPreferredDomain] = leaf
	ann[placementapi.AnnotationPreferredRequired] = "true"
	job := createJobFrom(t, "ev-near-b", 2, "gpu-2-nvlink-pair", ann, func(j *batchv1.Job) {
		j.Spec.Template.Spec.Affinity = &corev1.Affinity{PodAffinity: &corev1.PodAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{batchv1.JobNameLabel: anchor.Name}},
				TopologyKey:   corev1.LabelHostname,
			}},
		}}
	})
	b := waitBound(t, jobSelector(job.Name), 2)
	for i := range b.pods {
		p := &b.pods[i]
		if p.Spec.NodeName != a.nodes[0] {
			t.Errorf("pod %s on %s, not beside %s on %s as its pod affinity asks", p.Name, p.Spec.NodeName, a.pods[0].Name, a.nodes[0])
		}
	}
	keptTheirPlans(t, b.pods, "the plan should have put it beside "+a.pods[0].Name)
}

// TestPodAffinityNamespaceSelector: two pods labelled app=ns-cache, one
// in a namespace labelled for team blue on the node of the leaf that a
// four-GPU Job fills, one in a namespace labelled for team red on another
// node of the leaf. A two-GPU pod consolidated into the leaf, which
// would go onto the fuller node, has required pod affinity on
// kubernetes.io/hostname to app=ns-cache pods in team red's namespaces
// (a namespace selector). kube-scheduler reads the selector against the
// namespaces' labels, and so does the controller: the pod is planned
// beside the red pod and binds there, neither released nor moved.
func TestPodAffinityNamespaceSelector(t *testing.T) {
	dumpOnFailure(t)
	leaf := fakeLeaf(t)
	a, other := anchorIn(t, "ev-ns-a", leaf)
	const team = "gputopo.dev/e2e-team"
	cacheOn := map[string]string{"blue": a.nodes[0], "red": other}
	for _, colour := range []string{"blue", "red"} {
		ns := "gputopo-placement-" + colour
		_, err := client.CoreV1().Namespaces().Create(framework.Ctx(t), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{team: colour}}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("create namespace %s: %v", ns, err)
		}
		t.Cleanup(func() {
			_ = client.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
		})
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "ns-cache", Namespace: ns, Labels: map[string]string{"app": "ns-cache"}},
			Spec: corev1.PodSpec{NodeName: cacheOn[colour], AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}},
		}
		// The namespace's default ServiceAccount, which admission
		// looks up, comes a moment after the namespace.
		framework.Eventually(t, waitStatus, "pod "+ns+"/ns-cache created", func() (bool, string) {
			_, err := client.CoreV1().Pods(ns).Create(framework.Ctx(t), pod, metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				return false, err.Error()
			}
			return true, ""
		})
		// No kubelet runs on the leaf's nodes to finish a graceful
		// deletion.
		t.Cleanup(func() {
			_ = client.CoreV1().Pods(ns).Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		})
	}
	job := createJobFrom(t, "ev-ns-b", 1, "gpu-2-nvlink-pair", consolidatedIn(leaf), func(j *batchv1.Job) {
		j.Spec.Template.Spec.Affinity = &corev1.Affinity{PodAffinity: &corev1.PodAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
				LabelSelector:     &metav1.LabelSelector{MatchLabels: map[string]string{"app": "ns-cache"}},
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{team: "red"}},
				TopologyKey:       corev1.LabelHostname,
			}},
		}}
	})
	b := waitBound(t, jobSelector(job.Name), 1)
	p := &b.pods[0]
	if p.Spec.NodeName != other {
		t.Errorf("pod %s on %s, want %s beside team red's ns-cache pod (team blue's is on %s)", p.Name, p.Spec.NodeName, other, a.nodes[0])
	}
	keptTheirPlans(t, b.pods, "the plan should have read the namespace selector")
}

// TestTopologySpreadAgainstAnotherJob: a four-GPU pod of one Job runs on
// a node of the leaf; the two two-GPU pods of a second Job, consolidated
// into the same leaf, would both go onto that node, the fullest, but
// they carry a topology spread constraint on kubernetes.io/hostname over
// both Jobs' pods (at most one more on a node than on the emptiest),
// which kube-scheduler's PodTopologySpread filter enforces. The
// controller counts the first Job's pod as the scheduler does and plans
// the two pods onto two other nodes of the leaf, where they bind:
// neither released nor moved.
func TestTopologySpreadAgainstAnotherJob(t *testing.T) {
	dumpOnFailure(t)
	leaf := fakeLeaf(t)
	ann := consolidatedIn(leaf)
	anchor := createJobFrom(t, "ev-spread-a", 1, "gpu-4-nvlink", ann)
	a := waitBound(t, jobSelector(anchor.Name), 1)
	job := createJobFrom(t, "ev-spread-b", 2, "gpu-2-nvlink-pair", ann, spreadOver(anchor.Name, "ev-spread-b"))
	b := waitBound(t, jobSelector(job.Name), 2)
	if b.nodes[0] == b.nodes[1] || slices.Contains(b.nodes, a.nodes[0]) {
		t.Errorf("pods on %v with %s's pod on %s: the spread constraint allows one of the Jobs' pods per node", b.nodes, anchor.Name, a.nodes[0])
	}
	keptTheirPlans(t, b.pods, "the plan should have kept the spread")
}

// spreadOver gives a Job's pods a topology spread constraint on
// kubernetes.io/hostname over the pods of the Jobs named: at most one
// more of them on a node than on any other, else not scheduled.
func spreadOver(jobs ...string) func(*batchv1.Job) {
	return func(j *batchv1.Job) {
		j.Spec.Template.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{
			MaxSkew: 1, TopologyKey: corev1.LabelHostname, WhenUnsatisfiable: corev1.DoNotSchedule,
			LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: batchv1.JobNameLabel, Operator: metav1.LabelSelectorOpIn, Values: jobs}}},
		}}
	}
}

// withHostPort has a Job's pods ask for host port port, which two pods
// cannot share on one node (kube-scheduler's NodePorts filter).
func withHostPort(port int32) func(*batchv1.Job) {
	return func(j *batchv1.Job) {
		c := &j.Spec.Template.Spec.Containers[0]
		c.Ports = append(c.Ports, corev1.ContainerPort{ContainerPort: 8080, HostPort: port, Protocol: corev1.ProtocolTCP})
	}
}

// TestHostPortAgainstAnotherJob: a four-GPU pod of one Job, holding host
// port 30777, runs on a node of the leaf; a four-GPU pod of a second Job
// asking for the same port, consolidated into the same leaf, would go onto
// that node, the fullest, where kube-scheduler's NodePorts filter refuses
// it. The controller counts the port as the scheduler does and plans the
// pod onto another node of the leaf, where it binds: neither released nor
// moved.
func TestHostPortAgainstAnotherJob(t *testing.T) {
	dumpOnFailure(t)
	leaf := fakeLeaf(t)
	ann := consolidatedIn(leaf)
	anchor := createJobFrom(t, "ev-port-a", 1, "gpu-4-nvlink", ann, withHostPort(30777))
	a := waitBound(t, jobSelector(anchor.Name), 1)
	job := createJobFrom(t, "ev-port-b", 1, "gpu-4-nvlink", ann, withHostPort(30777))
	b := waitBound(t, jobSelector(job.Name), 1)
	if b.nodes[0] == a.nodes[0] {
		t.Errorf("pod %s on %s beside %s, which holds the host port both ask for", b.pods[0].Name, b.nodes[0], a.pods[0].Name)
	}
	keptTheirPlans(t, b.pods, "the plan should have kept it off the node holding its host port")
}

// offNode gives a Job's pods a PersistentVolumeClaim bound to a
// PersistentVolume whose node affinity leaves node out, which
// kube-scheduler's VolumeBinding filter weighs.
func offNode(t *testing.T, name, node string) func(*batchv1.Job) {
	t.Helper()
	return withVolume(t, name, localOffNode(node))
}

// localOffNode makes a host-path volume whose node affinity leaves node
// out.
func localOffNode(node string) func(*corev1.PersistentVolume) {
	return func(pv *corev1.PersistentVolume) {
		pv.Spec.HostPath = &corev1.HostPathVolumeSource{Path: "/tmp/" + pv.Name}
		pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpNotIn, Values: []string{node}}}}}}}
	}
}

// overVolumeLimit gives a Job's pods a PersistentVolumeClaim bound to a
// volume of a CSI driver that node, through its CSINode, says it can
// attach no volume of: kube-scheduler's NodeVolumeLimits filter weighs
// that, and the controller does not. node must have no kubelet, which
// would own its CSINode.
func overVolumeLimit(t *testing.T, name, node string) func(*batchv1.Job) {
	t.Helper()
	const driver = "e2e.csi.gputopo.dev"
	ctx := framework.Ctx(t)
	csiNode := &storagev1.CSINode{ObjectMeta: metav1.ObjectMeta{Name: node},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: driver, NodeID: node, Allocatable: &storagev1.VolumeNodeResources{Count: ptr.To[int32](0)}}}}}
	if _, err := client.StorageV1().CSINodes().Create(ctx, csiNode, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create CSINode %s: %v", node, err)
	}
	t.Cleanup(func() { _ = client.StorageV1().CSINodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	return withVolume(t, name, func(pv *corev1.PersistentVolume) {
		pv.Spec.CSI = &corev1.CSIPersistentVolumeSource{Driver: driver, VolumeHandle: pv.Name}
	})
}

// withVolume gives a Job's pods a PersistentVolumeClaim bound to a
// PersistentVolume that source fills in. It creates both, named name and
// a suffix of its own, and waits until they are bound.
func withVolume(t *testing.T, name string, source func(*corev1.PersistentVolume)) func(*batchv1.Job) {
	t.Helper()
	return boundVolume(t, fmt.Sprintf("%s-%d", name, time.Now().UnixNano()%1000000), source)
}

// boundVolume is withVolume with the claim and volume named name.
func boundVolume(t *testing.T, name string, source func(*corev1.PersistentVolume)) func(*batchv1.Job) {
	t.Helper()
	ctx := framework.Ctx(t)
	newVolume(t, name, "gputopo-e2e-manual", true, source)
	framework.Eventually(t, waitStatus, "PersistentVolumeClaim "+name+" bound", func() (bool, string) {
		c, err := client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return c.Status.Phase == corev1.ClaimBound, "phase " + string(c.Status.Phase)
	})
	return withClaim(name)
}

// newVolume creates a PersistentVolume of class, of 1Gi, that source
// fills in, and a PersistentVolumeClaim of class asking for 1Gi in the
// volume's access modes, both named name; prebind names the volume in the
// claim. Both are deleted when
// the test ends.
func newVolume(t *testing.T, name, class string, prebind bool, source func(*corev1.PersistentVolume)) {
	t.Helper()
	ctx := framework.Ctx(t)
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              class,
		},
	}
	source(pv)
	if _, err := client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create PersistentVolume %s: %v", name, err)
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: pv.Spec.AccessModes, StorageClassName: ptr.To(class),
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	}
	if prebind {
		pvc.Spec.VolumeName = name
	}
	if _, err := client.CoreV1().PersistentVolumeClaims(namespace).Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create PersistentVolumeClaim %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().PersistentVolumeClaims(namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = client.CoreV1().PersistentVolumes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// withClaim gives a Job's pods a volume of PersistentVolumeClaim claim.
func withClaim(claim string) func(*batchv1.Job) {
	return func(j *batchv1.Job) {
		spec := &j.Spec.Template.Spec
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}})
	}
}

// boundOff waits for the one pod of job to bind off node, the fullest of
// its leaf, where it was planned, neither released nor moved: the plan
// weighed what keeps it off node (why).
func boundOff(t *testing.T, job, node, why string) bound {
	t.Helper()
	b := waitBound(t, jobSelector(job), 1)
	if b.nodes[0] == node {
		t.Fatalf("pod %s on %s, which %s", b.pods[0].Name, b.nodes[0], why)
	}
	keptTheirPlans(t, b.pods, "the plan should have weighed what keeps it off "+node+": "+why)
	return b
}

// TestVolumeNodeAffinityAgainstAnotherJob: a pod whose volume's node
// affinity leaves out the node the plan would otherwise pick is planned
// onto another node at once, as kube-scheduler's VolumeBinding filter
// would have it, and binds where it was planned. A four-GPU pod of one
// Job runs on a node of the leaf; a four-GPU pod of a second Job,
// consolidated into the same leaf, would go onto that node, the fullest.
func TestVolumeNodeAffinityAgainstAnotherJob(t *testing.T) {
	dumpOnFailure(t)
	leaf := fakeLeaf(t)
	a, _ := anchorIn(t, "ev-anchor-vol", leaf)
	job := createJobFrom(t, "ev-volume", 1, "gpu-4-nvlink", consolidatedIn(leaf), offNode(t, "ev-vol-data", a.nodes[0]))
	boundOff(t, job.Name, a.nodes[0], "its volume's node affinity leaves out")
}

// TestJobWaitsForItsVolumeClaim: a Job whose pod names a
// PersistentVolumeClaim that does not exist yet is not placed: its pod
// says WaitingForVolumes, naming the claim, as kube-scheduler leaves such
// a pod pending. Once the claim exists, bound to a volume whose node
// affinity leaves out the node the plan would otherwise pick (the fullest
// of the leaf, where another Job's pod runs), the claim's events requeue
// the Job: it is placed off that node and binds where it was planned.
func TestJobWaitsForItsVolumeClaim(t *testing.T) {
	dumpOnFailure(t)
	ctx := framework.Ctx(t)
	leaf := fakeLeaf(t)
	a, _ := anchorIn(t, "ev-anchor-later", leaf)
	claim := fmt.Sprintf("ev-later-data-%d", time.Now().UnixNano()%1000000)
	job := createJobFrom(t, "ev-later", 1, "gpu-4-nvlink", consolidatedIn(leaf), withClaim(claim))
	framework.Eventually(t, waitStatus, "the pod of "+job.Name+" to wait for its volume claim", func() (bool, string) {
		pods, err := jobPods(ctx, job.Name)
		if err != nil || len(pods) != 1 {
			return false, fmt.Sprintf("%d pods (%v)", len(pods), err)
		}
		st, _ := placementapi.ParseStatus(pods[0].Annotations[placementapi.AnnotationStatus])
		if !hasGate(&pods[0]) {
			t.Fatalf("pod %s ungated while its volume claim %s does not exist (status %+v)", pods[0].Name, claim, st)
		}
		return st.Reason == placementapi.StatusWaitingForVolumes && strings.Contains(st.Message, claim), fmt.Sprintf("status %+v", st)
	})
	boundVolume(t, claim, localOffNode(a.nodes[0]))
	boundOff(t, job.Name, a.nodes[0], "its volume's node affinity, once the claim was bound, leaves out")
}

// TestJobWaitsForAReadWriteOncePodClaim: a Job whose pod names a
// ReadWriteOncePod claim that a pod on a node uses is not placed: its pod
// says WaitingForVolumes, naming that pod, as kube-scheduler's
// VolumeRestrictions filter leaves it pending. Once that pod is gone, its
// deletion requeues the Job, which is placed and binds where it was
// planned.
func TestJobWaitsForAReadWriteOncePodClaim(t *testing.T) {
	dumpOnFailure(t)
	ctx := framework.Ctx(t)
	leaf := fakeLeaf(t)
	name := fmt.Sprintf("ev-rwop-data-%d", time.Now().UnixNano()%1000000)
	claim := boundVolume(t, name, func(pv *corev1.PersistentVolume) {
		pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOncePod}
		pv.Spec.HostPath = &corev1.HostPathVolumeSource{Path: "/tmp/" + name}
	})
	holder := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name + "-holder", Namespace: namespace},
		Spec: corev1.PodSpec{NodeName: topo.leafNodes[leaf][0], TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{Name: "hold", Image: "registry.k8s.io/pause:3.10"}}}}
	holder.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}}
	if _, err := client.CoreV1().Pods(namespace).Create(ctx, holder, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod %s: %v", holder.Name, err)
	}
	t.Cleanup(func() {
		_ = client.CoreV1().Pods(namespace).Delete(context.Background(), holder.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	})
	job := createJobFrom(t, "ev-rwop", 1, "gpu-4-nvlink", consolidatedIn(leaf), claim)
	framework.Eventually(t, waitStatus, "the pod of "+job.Name+" to wait for the claim "+holder.Name+" holds", func() (bool, string) {
		pods, err := jobPods(ctx, job.Name)
		if err != nil || len(pods) != 1 {
			return false, fmt.Sprintf("%d pods (%v)", len(pods), err)
		}
		st, _ := placementapi.ParseStatus(pods[0].Annotations[placementapi.AnnotationStatus])
		if !hasGate(&pods[0]) {
			t.Fatalf("pod %s ungated while pod %s uses its ReadWriteOncePod claim (status %+v)", pods[0].Name, holder.Name, st)
		}
		return st.Reason == placementapi.StatusWaitingForVolumes && strings.Contains(st.Message, holder.Name), fmt.Sprintf("status %+v", st)
	})
	forceDeletePod(t, holder.Name)
	b := waitBound(t, jobSelector(job.Name), 1)
	keptTheirPlans(t, b.pods, "the claim was free once the other pod was gone")
}

// TestLocalVolumeWaitingForItsFirstConsumer: a pod whose claim waits for
// its first consumer (a StorageClass without a provisioner, binding
// WaitForFirstConsumer: the usual class of local volumes) and whose one
// available volume lies on a node of the leaf other than the fullest (where
// another Job's pod runs) is planned onto the volume's node. kube-scheduler
// binds the claim to that volume and the pod to that node: neither
// released nor moved.
func TestLocalVolumeWaitingForItsFirstConsumer(t *testing.T) {
	dumpOnFailure(t)
	ctx := framework.Ctx(t)
	leaf := fakeLeaf(t)
	a, node := anchorIn(t, "ev-anchor-local", leaf)
	name := fmt.Sprintf("ev-local-data-%d", time.Now().UnixNano()%1000000)
	class := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: "kubernetes.io/no-provisioner",
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingWaitForFirstConsumer)}
	if _, err := client.StorageV1().StorageClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create StorageClass %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = client.StorageV1().StorageClasses().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	newVolume(t, name, name, false, func(pv *corev1.PersistentVolume) {
		pv.Spec.Local = &corev1.LocalVolumeSource{Path: "/mnt/" + name}
		pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}}
	})
	job := createJobFrom(t, "ev-local", 1, "gpu-4-nvlink", consolidatedIn(leaf), withClaim(name))
	b := waitBound(t, jobSelector(job.Name), 1)
	if b.nodes[0] != node {
		t.Fatalf("pod %s on %s, want %s, the node of the one volume its claim can bind (not %s, beside the other Job's pod)", b.pods[0].Name, b.nodes[0], node, a.nodes[0])
	}
	keptTheirPlans(t, b.pods, "the plan should have sent it to the node of the one volume its claim can bind")
	framework.Eventually(t, waitStatus, "PersistentVolumeClaim "+name+" bound to its volume", func() (bool, string) {
		c, err := client.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return c.Status.Phase == corev1.ClaimBound && c.Spec.VolumeName == name, fmt.Sprintf("phase %s, volume %q", c.Status.Phase, c.Spec.VolumeName)
	})
}

// TestRefusedPodEndsOffItsPlannedNode: a pod kept off its planned node
// by something the controller does not weigh ends on another node of its
// domain, at once. A four-GPU pod of one Job runs on a node of the leaf;
// a four-GPU pod of a second Job, consolidated into the same leaf, is
// planned onto that node, the fullest, but its CSI volume is over that
// node's volume limit, so kube-scheduler's NodeVolumeLimits filter
// refuses it, which the controller leaves to the scheduler. The scheduler finds no node for it and takes
// its claim back (DynamicResources PostFilter: reserved for that pod
// alone). Then either the scheduler allocates it again on another node
// of the leaf, which the node affinity the gate opened with keeps it in,
// and the controller says so (a Normal Moved event naming the planned
// node), or the controller plans it again first, leaving the refused
// node out (a Released event, Unschedulable): never back onto the
// refused node, so at most one release. Either way gputopo.dev/node
// follows the pod.
func TestRefusedPodEndsOffItsPlannedNode(t *testing.T) {
	dumpOnFailure(t)
	leaf := fakeLeaf(t)
	ann := consolidatedIn(leaf)
	a, _ := anchorIn(t, "ev-anchor", leaf)
	job := createJobFrom(t, "ev-moved", 1, "gpu-4-nvlink", ann, overVolumeLimit(t, "ev-moved-data", a.nodes[0]))
	b := waitBound(t, jobSelector(job.Name), 1)
	if b.nodes[0] == a.nodes[0] {
		t.Fatalf("pod %s on %s, where its volume is over the node's volume limit", b.pods[0].Name, b.nodes[0])
	}
	if len(b.leaves) != 1 || b.leaves[0] != leaf {
		t.Errorf("pod in leaves %v, want only %s: the domain affinity keeps a moved pod in its leaf", b.leaves, leaf)
	}
	// Which pod was refused: the one with a Moved or a Released event.
	var refused *corev1.Pod
	var how string
	framework.Eventually(t, waitStatus, "a Moved or Released event on a pod of "+job.Name, func() (bool, string) {
		for i := range b.pods {
			p := &b.pods[i]
			for _, reason := range []string{"Moved", "Released"} {
				if msg := podEventMessage(t, p, reason); msg != "" {
					refused, how = p, reason+": "+msg
					return true, ""
				}
			}
		}
		return false, "no Moved or Released event yet"
	})
	t.Logf("pod %s %s", refused.Name, how)
	if other := a.nodes[0]; !strings.Contains(how, other) {
		t.Errorf("the event %q should name the node %s the pod was refused on (where the other Job's pod is)", how, other)
	}
	framework.Eventually(t, waitStatus, "gputopo.dev/node of "+refused.Name+" to follow it", func() (bool, string) {
		p, err := client.CoreV1().Pods(namespace).Get(context.Background(), refused.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		got := p.Annotations[placementapi.AnnotationNode]
		return got == p.Spec.NodeName, fmt.Sprintf("%s=%q, bound to %s", placementapi.AnnotationNode, got, p.Spec.NodeName)
	})
	p, err := client.CoreV1().Pods(namespace).Get(context.Background(), refused.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := placementapi.ParseRelease(p.Annotations[placementapi.AnnotationReleased]); err == nil && r.Count > 1 {
		t.Errorf("pod %s was released %d times (%s): it was planned back onto the node that refused it", p.Name, r.Count, r.Reason)
	}
	if c := b.claims[refused.Name]; c == nil || allocationNode(c.Status.Allocation) != refused.Spec.NodeName {
		t.Errorf("claim of pod %s not allocated on its node %s", refused.Name, refused.Spec.NodeName)
	}
}

// anchorIn runs a one-pod four-GPU Job, consolidated into leaf, and
// returns where it went and another node of the leaf.
func anchorIn(t *testing.T, name, leaf string) (bound, string) {
	t.Helper()
	anchor := createJobFrom(t, name, 1, "gpu-4-nvlink", consolidatedIn(leaf))
	a := waitBound(t, jobSelector(anchor.Name), 1)
	for _, n := range topo.leafNodes[leaf] {
		if n != a.nodes[0] {
			return a, n
		}
	}
	t.Fatalf("leaf %s has no node but %s", leaf, a.nodes[0])
	return a, ""
}

// keptTheirPlans checks that each pod bound where the controller planned
// it, neither released nor moved. The controller records those events
// just after it updates the pod, so it watches for them a few seconds.
func keptTheirPlans(t *testing.T, pods []corev1.Pod, why string) {
	t.Helper()
	for i := range pods {
		p := &pods[i]
		if got := p.Annotations[placementapi.AnnotationNode]; got != p.Spec.NodeName {
			t.Errorf("pod %s planned onto %q, bound to %s: %s", p.Name, got, p.Spec.NodeName, why)
		}
		if r, ok := p.Annotations[placementapi.AnnotationReleased]; ok {
			t.Errorf("pod %s was released (%s): %s", p.Name, r, why)
		}
	}
	for end := time.Now().Add(3 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		for i := range pods {
			for _, reason := range []string{"Moved", "Released"} {
				if msg := podEventMessage(t, &pods[i], reason); msg != "" {
					t.Errorf("pod %s: %s event %q; %s", pods[i].Name, reason, msg, why)
					return
				}
			}
		}
		if time.Now().After(end) {
			return
		}
	}
}

// podEventMessage is the message of the gputopo controller's event of
// reason about the pod, "" when there is none.
func podEventMessage(t *testing.T, p *corev1.Pod, reason string) string {
	t.Helper()
	events, err := client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.kind": "Pod", "involvedObject.uid": string(p.UID), "reason": reason}.String(),
	})
	if err != nil {
		t.Fatalf("list events of pod %s: %v", p.Name, err)
	}
	for _, e := range events.Items {
		if e.Source.Component == "gputopo-controller" {
			return e.Message
		}
	}
	return ""
}
