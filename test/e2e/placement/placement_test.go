package placement

// The controller's end-to-end tests, in the order of the issue that asked
// for them. Each test creates its own Jobs and deletes them, their pods and
// claims when it ends, so the tests are independent of each other and of
// their order; none depends on which leaf the best-fit rule picks.

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	placementapi "github.com/gputopo/gputopo/api/placement/v1alpha1"
	cluster "github.com/gputopo/gputopo/test/cluster"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// TestTwoPodJobOneLeaf: a Job of two 8-GPU pods lands in one leaf.
func TestTwoPodJobOneLeaf(t *testing.T) {
	dumpOnFailure(t)
	createJob(t, "two-pods", 2, placed(placementapi.PlacementAuto))
	pl := waitJobPlaced(t, "two-pods", 2, waitPlaced)
	if len(pl.leaves) != 1 {
		t.Fatalf("the two pods are in leaves %v, want one leaf: %s", pl.leaves, pl)
	}
	// The nodes say so themselves.
	var leaves []string
	for _, n := range pl.nodes {
		node, err := client.CoreV1().Nodes().Get(framework.Ctx(t), n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		leaves = append(leaves, node.Labels[cluster.LabelLeaf])
	}
	if leaves[0] == "" || leaves[0] != leaves[1] {
		t.Errorf("nodes %v have %s %v, want one leaf", pl.nodes, cluster.LabelLeaf, leaves)
	}
	if want := "leaf:" + leaves[0]; pl.domain != want {
		t.Errorf("%s=%q, want %q", placementapi.AnnotationDomain, pl.domain, want)
	}
}

// TestFourPodJobCompleteLeaf: a Job of four 8-GPU pods needs a whole leaf
// of four nodes, and gets one.
func TestFourPodJobCompleteLeaf(t *testing.T) {
	dumpOnFailure(t)
	createJob(t, "four-pods", 4, placed(placementapi.PlacementAuto))
	wholeLeaf(t, waitJobPlaced(t, "four-pods", 4, waitPlaced))
}

// TestEightPodJobAdjacentLeaves: eight 8-GPU pods fill two leaves, which
// must be neighbours under one spine.
func TestEightPodJobAdjacentLeaves(t *testing.T) {
	dumpOnFailure(t)
	createJob(t, "eight-pods", 8, placed(placementapi.PlacementAuto))
	pl := waitJobPlaced(t, "eight-pods", 8, waitPlaced)
	if len(pl.leaves) != 2 {
		t.Fatalf("pods span leaves %v, want two: %s", pl.leaves, pl)
	}
	a, b := pl.leaves[0], pl.leaves[1]
	spine := topo.spineOf[a]
	if topo.spineOf[b] != spine {
		t.Fatalf("leaves %s (%s) and %s (%s) are under different spines", a, spine, b, topo.spineOf[b])
	}
	order := topo.spineLeaves[spine]
	i, j := slices.Index(order, a), slices.Index(order, b)
	if j-i != 1 && i-j != 1 {
		t.Errorf("leaves %s and %s are not adjacent under %s, whose leaves are %v", a, b, spine, order)
	}
	first, second := a, b
	if j < i {
		first, second = b, a
	}
	if want := "leaves:" + first + "," + second; pl.domain != want {
		t.Errorf("%s=%q, want %q", placementapi.AnnotationDomain, pl.domain, want)
	}
	want := sortedCopy(append(slices.Clone(topo.leafNodes[a]), topo.leafNodes[b]...))
	if got := sortedCopy(pl.nodes); !slices.Equal(got, want) {
		t.Errorf("pods are on %v, want every node of %s and %s: %v", got, a, b, want)
	}
}

// bestCandidate is how the controller names the domain that came closest.
var bestCandidate = regexp.MustCompile(`best: leaf leaf-\d+ holds 4 \(4 nodes with room for a pod\)`)

// TestJobTooBigStaysGated: five 8-GPU pods that must share a leaf of four
// nodes never reach the scheduler; every pod says why and the Job has an
// Unschedulable event naming the best candidate.
func TestJobTooBigStaysGated(t *testing.T) {
	dumpOnFailure(t)
	job := createJob(t, "too-big", 5, placed(placementapi.PlacementSameLeaf))
	msg := waitJobWarning(t, job, "Unschedulable")
	t.Logf("Unschedulable event: %s", msg)
	if !strings.Contains(msg, "no leaf can hold 5 pods") || !bestCandidate.MatchString(msg) {
		t.Errorf("event message %q does not say that no leaf holds 5 pods and which leaf came closest (%s)", msg, bestCandidate)
	}

	check := func(when string) {
		t.Helper()
		pods, err := jobPods(framework.Ctx(t), "too-big")
		if err != nil {
			t.Fatal(err)
		}
		if len(pods) != 5 {
			t.Fatalf("%s: %d pods, want 5", when, len(pods))
		}
		for _, p := range pods {
			status := p.Annotations[placementapi.AnnotationStatus]
			switch {
			case p.Spec.NodeName != "":
				t.Errorf("%s: pod %s of a Job that cannot fit is bound to %s", when, p.Name, p.Spec.NodeName)
			case !hasGate(&p):
				t.Errorf("%s: pod %s lost its %s gate: %s", when, p.Name, placementapi.SchedulingGate, framework.PodState(&p))
			case !strings.Contains(status, "no leaf can hold 5 pods"):
				t.Errorf("%s: pod %s has %s=%q, want the reason", when, p.Name, placementapi.AnnotationStatus, status)
			case p.Annotations[placementapi.AnnotationNode] != "" || pinnedNodes(&p) != nil:
				t.Errorf("%s: waiting pod %s is pinned: %s=%q, affinity %v", when, p.Name, placementapi.AnnotationNode, p.Annotations[placementapi.AnnotationNode], pinnedNodes(&p))
			case !placedConditionSays(&p, corev1.ConditionFalse, "Unschedulable", "no leaf can hold 5 pods"):
				t.Errorf("%s: pod %s has no %s condition False/Unschedulable with the reason: %v", when, p.Name, placementapi.ConditionPlaced, p.Status.Conditions)
			}
			if c, err := framework.PodClaim(framework.Ctx(t), client, &p, claimName); err == nil && c.Status.Allocation != nil {
				t.Errorf("%s: claim %s of waiting pod %s is allocated", when, c.Name, p.Name)
			}
		}
	}
	// Every pod carries the reason once the controller has written it.
	framework.Eventually(t, waitStatus, "every pod of too-big to say why it waits", func() (bool, string) {
		pods, err := jobPods(context.Background(), "too-big")
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods {
			if p.Annotations[placementapi.AnnotationStatus] == "" {
				return false, "pod " + p.Name + " has no status"
			}
			if !placedConditionSays(&p, corev1.ConditionFalse, "Unschedulable", "") {
				return false, "pod " + p.Name + " has no " + placementapi.ConditionPlaced + " condition"
			}
		}
		return len(pods) == 5, fmt.Sprintf("%d pods", len(pods))
	})
	check("at once")
	// Make the controller plan the group again (any change of its Job
	// queues it) and wait until it has said so a second time: the group
	// must still wait, not merely have been left alone.
	job, err := client.BatchV1().Jobs(namespace).Get(framework.Ctx(t), "too-big", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	before := jobEventCount(t, job, "Unschedulable")
	pokeJob(t, "too-big")
	framework.Eventually(t, waitStatus, "the controller to plan too-big again and refuse it", func() (bool, string) {
		n := jobEventCount(t, job, "Unschedulable")
		return n > before, fmt.Sprintf("%d Unschedulable events, %d before the Job changed", n, before)
	})
	check("planned again")
}

// TestConcurrentJobsDoNotCollide: two four-pod Jobs submitted together each
// get a complete leaf of their own.
func TestConcurrentJobsDoNotCollide(t *testing.T) {
	dumpOnFailure(t)
	createJob(t, "pair-a", 4, placed(placementapi.PlacementAuto))
	createJob(t, "pair-b", 4, placed(placementapi.PlacementAuto))
	a := waitJobPlaced(t, "pair-a", 4, waitPlaced)
	b := waitJobPlaced(t, "pair-b", 4, waitPlaced)
	la, lb := wholeLeaf(t, a), wholeLeaf(t, b)
	if la == lb {
		t.Errorf("both Jobs got leaf %s", la)
	}
	for n, pod := range a.byNode {
		if other, ok := b.byNode[n]; ok {
			t.Errorf("node %s holds pod %s of pair-a and pod %s of pair-b", n, pod, other)
		}
	}
}

// TestReplacementReturnsToLeaf force-deletes one pod of a Job that fills a
// leaf: the pod the Job creates instead must go back into that leaf (the
// only room there is the node its predecessor had, once that pod's claim
// is released).
func TestReplacementReturnsToLeaf(t *testing.T) {
	dumpOnFailure(t)
	createJob(t, "replace", 4, placed(placementapi.PlacementAuto))
	before := waitJobPlaced(t, "replace", 4, waitPlaced)
	leaf := wholeLeaf(t, before)
	victim := before.pods[1]
	t.Logf("force-deleting pod %s on %s", victim.Name, victim.Spec.NodeName)
	forceDeletePod(t, victim.Name)

	old := map[types.UID]bool{}
	for _, p := range before.pods {
		old[p.UID] = true
	}
	// The Job controller replaces the pod after its failure backoff.
	framework.Eventually(t, waitPlaced, "Job replace to create a replacement pod", func() (bool, string) {
		pods, err := jobPods(context.Background(), "replace")
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods {
			if !old[p.UID] {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d pods, none new", len(pods))
	})
	after := waitJobPlaced(t, "replace", 4, waitPlaced)
	for i, p := range after.pods {
		if old[p.UID] {
			continue
		}
		node := after.nodes[i]
		t.Logf("replacement %s went to %s (its predecessor was on %s)", p.Name, node, victim.Spec.NodeName)
		if topo.leafOf[node] != leaf {
			t.Errorf("replacement %s went to %s in %s, want the Job's leaf %s", p.Name, node, topo.leafOf[node], leaf)
		}
	}
	if after.domain != before.domain {
		t.Errorf("domain changed from %q to %q", before.domain, after.domain)
	}
	wholeLeaf(t, after)
}

// TestControllerRestart kills the controller: a Job created while it is
// down waits at its gate, and is placed once a new controller runs (after
// the old leader Lease expires). A Job placed before the crash keeps its
// pods, pins and annotations, and no node gets two pods.
func TestControllerRestart(t *testing.T) {
	dumpOnFailure(t)
	t.Cleanup(func() { ensureController(t) })
	createJob(t, "restart-before", 2, placed(placementapi.PlacementAuto))
	before := waitJobPlaced(t, "restart-before", 2, waitPlaced)

	if err := lc.KillController(); err != nil {
		t.Fatal(err)
	}
	createJob(t, "restart-during", 2, placed(placementapi.PlacementAuto))
	// The scheduler has seen both pods and found them gated: with no
	// controller running nothing else may act on them.
	framework.Eventually(t, waitStatus, "the scheduler to report the pods of restart-during gated", func() (bool, string) {
		pods, err := jobPods(context.Background(), "restart-during")
		if err != nil {
			return false, err.Error()
		}
		for _, p := range pods {
			if !podScheduledSays(&p, corev1.PodReasonSchedulingGated) {
				return false, "pod " + p.Name + ": " + framework.PodState(&p)
			}
		}
		return len(pods) == 2, fmt.Sprintf("%d pods", len(pods))
	})
	pods, err := jobPods(framework.Ctx(t), "restart-during")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if !hasGate(&p) || p.Spec.NodeName != "" || p.Annotations[placementapi.AnnotationNode] != "" {
			t.Errorf("pod %s created while no controller runs is not waiting at its gate: %s, %s=%q", p.Name, framework.PodState(&p), placementapi.AnnotationNode, p.Annotations[placementapi.AnnotationNode])
		}
	}

	restarted := time.Now()
	if err := lc.StartController(); err != nil {
		t.Fatal(err)
	}
	during := waitJobPlaced(t, "restart-during", 2, waitRestart)
	t.Logf("placed %s after the restart", time.Since(restarted).Round(100*time.Millisecond))

	// StartController returned once the new process was ready: it has
	// synced every group, restart-before too. Compare it with what it was.
	after := waitJobPlaced(t, "restart-before", 2, waitPlaced)
	for i, p := range after.pods {
		b := before.pods[i]
		switch {
		case p.UID != b.UID:
			t.Errorf("pod %s was replaced across the restart (uid %s → %s)", p.Name, b.UID, p.UID)
		case p.Spec.NodeName != b.Spec.NodeName:
			t.Errorf("pod %s moved from %s to %s", p.Name, b.Spec.NodeName, p.Spec.NodeName)
		}
		for _, k := range []string{placementapi.AnnotationNode, placementapi.AnnotationDomain} {
			if p.Annotations[k] != b.Annotations[k] {
				t.Errorf("pod %s: %s changed across the restart from %q to %q", p.Name, k, b.Annotations[k], p.Annotations[k])
			}
		}
		if got, was := pinnedNodes(&p), pinnedNodes(&b); !slices.Equal(got, was) {
			t.Errorf("pod %s: pinned to %v, was %v", p.Name, got, was)
		}
	}
	for n, pod := range during.byNode {
		if other, ok := after.byNode[n]; ok {
			t.Errorf("node %s holds pod %s of restart-during and pod %s of restart-before", n, pod, other)
		}
	}
	// Each group was placed exactly once, by one of the two processes.
	log, err := os.ReadFile(lc.LogPath("controller"))
	if err != nil {
		t.Fatal(err)
	}
	for _, job := range []string{"restart-before", "restart-during"} {
		key := fmt.Sprintf(`group="%s/job/%s"`, namespace, job)
		n := 0
		for _, line := range strings.Split(string(log), "\n") {
			if strings.Contains(line, "Allocated the claims of the pod group") && strings.Contains(line, key) {
				n++
			}
		}
		if n != 1 {
			t.Errorf("the controller log has %d \"Allocated the claims of the pod group\" lines for %s, want 1", n, key)
		}
	}
}

// TestBadAnnotationRejected: the gputopo-placement admission policy
// refuses Jobs (and pods) whose placement annotations are malformed, and
// says which annotation is wrong.
func TestBadAnnotationRejected(t *testing.T) {
	for _, tc := range []struct {
		name string
		ann  map[string]string
		want string
	}{
		{"placement", map[string]string{placementapi.AnnotationPlacement: "same-rack"},
			`gputopo.dev/placement: "same-rack" is not one of auto, same-leaf, adjacent-leaves, same-spine, none`},
		{"strategy", map[string]string{placementapi.AnnotationPlacement: "auto", placementapi.AnnotationStrategy: "packed"},
			`gputopo.dev/strategy: "packed" is not one of consolidated, balanced, distributed`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "bad-" + tc.name
			job := newJob(name, 2, "gpu-8-node", tc.ann)
			_, err := client.BatchV1().Jobs(namespace).Create(framework.Ctx(t), job, metav1.CreateOptions{})
			if err == nil {
				deleteJob(t, name)
				t.Fatalf("Job with %v was admitted", tc.ann)
			}
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "gputopo-placement") {
				t.Errorf("creating a Job with %v failed with %v (reason %s); want the gputopo-placement policy's %q", tc.ann, err, apierrors.ReasonForError(err), tc.want)
			}
			t.Logf("refused: %v", err)
			if _, err := client.BatchV1().Jobs(namespace).Get(framework.Ctx(t), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("Job %s exists after being refused (get: %v)", name, err)
			}
			// A bare pod with the same annotations is refused as well.
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Annotations: tc.ann}, Spec: job.Spec.Template.Spec}
			if _, err := client.CoreV1().Pods(namespace).Create(framework.Ctx(t), pod, metav1.CreateOptions{}); err == nil {
				_ = client.CoreV1().Pods(namespace).Delete(framework.Ctx(t), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
				t.Errorf("pod with %v was admitted", tc.ann)
			} else if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("creating a pod with %v failed with %v; want %q", tc.ann, err, tc.want)
			}
		})
	}
}

// TestPlacedJobRuns places a Job on the leaf that holds the real nodes
// (gputopo.dev/preferred-domain, required): the pods on real nodes reach
// Running with their claim's GPUs handed to the container through CDI.
func TestPlacedJobRuns(t *testing.T) {
	dumpOnFailure(t)
	leaf := ""
	for _, l := range topo.leaves {
		for _, n := range topo.leafNodes[l] {
			if topo.real[n] {
				leaf = l
			}
		}
	}
	if leaf == "" {
		t.Fatal("testdata/topology.yaml has no real node")
	}
	createJob(t, "runs", 4, map[string]string{
		placementapi.AnnotationPlacement:         string(placementapi.PlacementSameLeaf),
		placementapi.AnnotationPreferredDomain:   leaf,
		placementapi.AnnotationPreferredRequired: "true",
	})
	pl := waitJobPlaced(t, "runs", 4, waitPlaced)
	if got := wholeLeaf(t, pl); got != leaf {
		t.Fatalf("Job went to %s, want the required preferred %s", got, leaf)
	}
	ran := 0
	for i, p := range pl.pods {
		node := pl.nodes[i]
		if !topo.real[node] {
			continue
		}
		var pod *corev1.Pod
		framework.Eventually(t, waitPlaced, "pod "+p.Name+" on real node "+node+" to be Running", func() (bool, string) {
			got, err := client.CoreV1().Pods(namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			pod = got
			return got.Status.Phase == corev1.PodRunning, framework.PodState(got)
		})
		claim := pl.claims[p.Name]
		var want []string
		for _, r := range claim.Status.Allocation.Devices.Results {
			want = append(want, "gputopo.dev/gpu="+string(claim.UID)+"-"+r.Device)
		}
		recs, err := lc.ContainerRecords(node)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, r := range recs {
			if r.PodUID == string(pod.UID) && r.Container == "train" {
				found = true
				if !slices.Equal(sortedCopy(r.CDIDevices), sortedCopy(want)) {
					t.Errorf("container of pod %s on %s got CDI devices %v, want %v", p.Name, node, r.CDIDevices, want)
				}
			}
		}
		if !found {
			t.Errorf("the fake CRI of %s saw no container of pod %s", node, p.Name)
		}
		ran++
	}
	if ran == 0 {
		t.Errorf("no pod of the Job ran on a real node: %s", pl)
	}
}

// TestControllerMetrics reads the controller's /metrics around placing a
// Job: the placed decisions grow by the Job's one, its plan is timed
// under its size (plan_duration_seconds{pods="2-4"}), a tree update was
// timed, pending_groups and the two fragmentation ratios are served (the
// ratios within 0 to 1), and every leaf has a utilization series.
func TestControllerMetrics(t *testing.T) {
	dumpOnFailure(t)
	const placedSeries = `gputopo_controller_decisions_total{outcome="placed"}`
	const startSeries = "process_start_time_seconds"
	const planCount = `gputopo_controller_plan_duration_seconds_count{pods="2-4"}`
	const treeCount = "gputopo_controller_tree_update_duration_seconds_count"
	before, err := scrapeMetrics(framework.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	createJob(t, "metrics", 2, placed(placementapi.PlacementAuto))
	pl := waitJobPlaced(t, "metrics", 2, waitPlaced)
	jobLeaf := pl.leaves[0]
	var last map[string]float64
	// Utilization is refreshed every 15 s.
	framework.Eventually(t, time.Minute, "the controller's metrics to show the placement", func() (bool, string) {
		m, err := scrapeMetrics(context.Background())
		if err != nil {
			return false, err.Error()
		}
		last = m
		if m[startSeries] != before[startSeries] {
			t.Fatalf("the controller restarted during the test (%s %v → %v): its counters started again", startSeries, before[startSeries], m[startSeries])
		}
		if d := m[placedSeries] - before[placedSeries]; d != 1 {
			return false, fmt.Sprintf("%s grew by %v while the test placed one Job, want 1", placedSeries, d)
		}
		// The plan of the two-pod Job is timed under its size.
		if d := m[planCount] - before[planCount]; d < 1 {
			return false, fmt.Sprintf("%s grew by %v while the test placed a two-pod Job", planCount, d)
		}
		if n := m[treeCount+`{kind="build"}`] + m[treeCount+`{kind="patch"}`]; n < 1 {
			return false, "no tree update timed in " + treeCount + " though the controller planned"
		}
		for _, g := range []string{"gputopo_controller_pending_groups", "gputopo_controller_writing_groups", "gputopo_controller_fragmentation_ratio", "gputopo_controller_leaf_fragmentation_ratio"} {
			v, ok := m[g]
			if !ok {
				return false, "no " + g + " series"
			}
			if v < 0 || (strings.HasSuffix(g, "_ratio") && v > 1) {
				t.Errorf("%s = %v, out of range", g, v)
			}
		}
		for _, leaf := range topo.leaves {
			v, ok := leafUtilization(m, topo.spineOf[leaf], leaf)
			if !ok {
				return false, "no gputopo_controller_leaf_gpu_utilization series for " + leaf
			}
			if leaf == jobLeaf && v <= 0 {
				return false, fmt.Sprintf("utilization of %s, which holds Job metrics, is %v", leaf, v)
			}
		}
		return true, ""
	})
	var lines []string
	for k, v := range last {
		if strings.HasPrefix(k, "gputopo_controller_") {
			lines = append(lines, fmt.Sprintf("%s %v", k, v))
		}
	}
	slices.Sort(lines)
	t.Logf("controller metrics:\n%s", strings.Join(lines, "\n"))
	n := 0
	for k := range last {
		if strings.HasPrefix(k, "gputopo_controller_leaf_gpu_utilization{") {
			n++
		}
	}
	if n != len(topo.leaves) {
		t.Errorf("%d leaf utilization series, want one per leaf (%d)", n, len(topo.leaves))
	}
}

// leafUtilization finds the utilization sample of a leaf, whatever the
// order of its labels.
func leafUtilization(m map[string]float64, spine, leaf string) (float64, bool) {
	for k, v := range m {
		if strings.HasPrefix(k, "gputopo_controller_leaf_gpu_utilization{") &&
			strings.Contains(k, `leaf="`+leaf+`"`) && strings.Contains(k, `spine="`+spine+`"`) {
			return v, true
		}
	}
	return 0, false
}

// placedConditionSays reports whether the pod's gputopo.dev/Placed
// condition has the status and reason, and its message contains text.
func placedConditionSays(p *corev1.Pod, status corev1.ConditionStatus, reason, text string) bool {
	for _, c := range p.Status.Conditions {
		if string(c.Type) == placementapi.ConditionPlaced {
			return c.Status == status && c.Reason == reason && strings.Contains(c.Message, text)
		}
	}
	return false
}
