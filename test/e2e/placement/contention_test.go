package placement

// The contention test: ungated pods and gated Jobs of every shape arrive at
// once, while a node is deleted, another is tainted NoExecute and the
// controller is killed between claim writes. A watch checks every claim
// event for a device held by two claims.
//
// The budget. The ungated pods (8 × gpu-1, 4 × gpu-2-nvlink-pair, 4 ×
// gpu-4-nvlink: 32 GPUs) may only run in the first two leaves of the first
// spine. The Jobs of small pods (quads, pairs, the Indexed Job: 48 GPUs)
// are required into that spine, whose 128 GPUs hold all 80 even when the
// ungated pods take their 32 first; the best-fit rule sends these Jobs to
// the leaves the ungated pods use, so both race for the same nodes. Each
// whole-node Job has a leaf of the second spine to itself: ct-whole fills
// one; ct-waves (completions 4, parallelism 2) takes half of one, twice;
// ct-gone and ct-tainted take two nodes of a leaf of four and lose one, so
// their replacement has room in the domain. The leaf of ct-tainted holds
// the two real nodes. ct-too-big (five whole nodes in one leaf) never fits
// a leaf of four. So every Job but ct-too-big fits whatever the order of
// events, and the ungated pods that lose the race fit once the Jobs are gone.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	placementapi "github.com/gputopo/gputopo/api/placement/v1alpha1"
	cluster "github.com/gputopo/gputopo/test/cluster"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

const (
	// waitContention bounds Job created → every pod bound (Running on a
	// real node), recovery from the lost nodes included: a pod steered to
	// a lost node may wait out the controller's 60 s bind timeout, one
	// bound there waits for PodGC (40 s) and the Job's 10 s backoff.
	waitContention = 6 * time.Minute
	// contentionTaint is the NoExecute taint put on a node mid-plan.
	contentionTaint = "e2e.gputopo.dev/contention"
	// ungatedLabel marks the test's ungated pods.
	ungatedLabel = "e2e.gputopo.dev/contention"
)

// ctJob is one gated Job of the test and what it measured.
type ctJob struct {
	name        string
	tmpl        string
	pods        int32 // parallelism
	completions int32 // 0: as many as pods
	indexed     bool
	ann         map[string]string
	within      string // the leaf or spine its pods must be in; "" for ct-too-big
	created     time.Time
	bound       time.Duration // created → every pod bound, the first time
	recovered   time.Duration // node lost → every pod bound again off it
	waves       []time.Duration
	stage       int // ct-waves: waves finished
	stageStart  time.Time
}

func (j *ctJob) key() string { return namespace + "/job/" + j.name }

// required asks for placement auto inside domain.
func required(domain string, extra ...string) map[string]string {
	ann := map[string]string{
		placementapi.AnnotationPlacement:         string(placementapi.PlacementAuto),
		placementapi.AnnotationPreferredDomain:   domain,
		placementapi.AnnotationPreferredRequired: "true",
	}
	for i := 0; i+1 < len(extra); i += 2 {
		ann[extra[i]] = extra[i+1]
	}
	return ann
}

// TestContention: see the top of this file.
func TestContention(t *testing.T) {
	dumpOnFailure(t)
	t.Cleanup(func() { ensureController(t) })
	if len(topo.leaves) != 8 || len(topo.spineLeaves) != 2 {
		t.Fatalf("the test is sized for 2 spines × 4 leaves, testdata/topology.yaml has %d leaves under %d spines", len(topo.leaves), len(topo.spineLeaves))
	}
	spineA := topo.spineOf[topo.leaves[0]]
	ungatedLeaves := topo.leaves[:2]
	realLeaf := topo.leaves[7]
	if !slices.ContainsFunc(topo.leafNodes[realLeaf], func(n string) bool { return topo.real[n] }) {
		t.Fatalf("leaf %s has no real node", realLeaf)
	}
	jobs := []*ctJob{
		{name: "ct-quads", tmpl: "gpu-4-nvlink", pods: 4, within: spineA, ann: required(spineA, placementapi.AnnotationStrategy, string(placementapi.StrategyConsolidated))},
		{name: "ct-pairs", tmpl: "gpu-2-nvlink-pair", pods: 4, within: spineA, ann: required(spineA)},
		{name: "ct-indexed", tmpl: "gpu-2-nvlink-pair", pods: 12, indexed: true, within: spineA, ann: required(spineA, placementapi.AnnotationStrategy, string(placementapi.StrategyConsolidated))},
		{name: "ct-whole", tmpl: "gpu-8-node", pods: 4, within: topo.leaves[4], ann: required(topo.leaves[4])},
		{name: "ct-waves", tmpl: "gpu-8-node", pods: 2, completions: 4, within: topo.leaves[5], ann: required(topo.leaves[5])},
		{name: "ct-gone", tmpl: "gpu-8-node", pods: 2, within: topo.leaves[6], ann: required(topo.leaves[6])},
		{name: "ct-tainted", tmpl: "gpu-8-node", pods: 2, within: realLeaf, ann: required(realLeaf)},
		{name: "ct-too-big", tmpl: "gpu-8-node", pods: 5, ann: placed(placementapi.PlacementSameLeaf)},
	}
	byName := map[string]*ctJob{}
	for _, j := range jobs {
		byName[j.name] = j
		t.Cleanup(func() {
			if t.Failed() {
				logJob(t, j.name)
			}
			deleteJob(t, j.name)
		})
	}
	ungatedSel := ungatedLabel + "=ungated"
	t.Cleanup(func() { forceDeletePods(context.Background(), t, ungatedSel, func([]corev1.Pod) {}) })

	ch := &chaos{}
	t.Cleanup(func() { restoreNodes(t, ch) })
	var goneOnce, taintOnce, killOnce sync.Once
	l, stopLedger := startLedger(t, func(c *resourcev1.ResourceClaim, node string) {
		switch c.Annotations[placementapi.AnnotationAllocatedBy] {
		case byName["ct-gone"].key():
			if !topo.real[node] {
				goneOnce.Do(func() { go deleteNodeMidPlan(ch, node) })
			}
		case byName["ct-tainted"].key():
			taintOnce.Do(func() { go taintNodeMidPlan(ch, node) })
		case byName["ct-indexed"].key():
			killOnce.Do(func() { go killController(ch, c.Name) })
		}
	})

	ch.mu.Lock()
	ch.ledger = l
	ch.mu.Unlock()

	// Everything at the same instant.
	ungated := ungatedPods(ungatedLeaves)
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, len(jobs)+len(ungated))
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if _, err := client.BatchV1().Jobs(namespace).Create(context.Background(), ctBatchJob(j), metav1.CreateOptions{}); err != nil {
				errs <- fmt.Errorf("create Job %s: %w", j.name, err)
			}
			j.created = time.Now()
		}()
	}
	for _, p := range ungated {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if _, err := client.CoreV1().Pods(namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
				errs <- fmt.Errorf("create pod %s: %w", p.Name, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("created %d Jobs and %d ungated pods", len(jobs), len(ungated))

	// Every Job that fits gets all its pods bound, the lost nodes' pods
	// again elsewhere in the domain, both waves of ct-waves.
	framework.Eventually(t, waitContention, "every Job that fits to be bound", func() (bool, string) {
		ctx := context.Background()
		claims, err := claimsByName(ctx)
		if err != nil {
			return false, err.Error()
		}
		ch.mu.Lock()
		gone, tainted, goneAt, taintedAt := ch.gone, ch.tainted, ch.goneAt, ch.taintedAt
		ch.mu.Unlock()
		avoid := map[string]bool{gone: gone != "", tainted: tainted != ""}
		var waiting []string
		for _, j := range jobs[:len(jobs)-1] {
			pods, err := jobPods(ctx, j.name)
			if err != nil {
				return false, err.Error()
			}
			ok, why := allBound(pods, int(j.pods), claims, nil)
			if ok && j.bound == 0 {
				j.bound = time.Since(j.created)
			}
			switch j.name {
			case "ct-gone", "ct-tainted":
				lostAt := goneAt
				if j.name == "ct-tainted" {
					lostAt = taintedAt
				}
				if lostAt.IsZero() {
					ok, why = false, "its node is not lost yet"
				} else if ok, why = allBound(pods, int(j.pods), claims, avoid); ok && j.recovered == 0 {
					j.recovered = time.Since(lostAt)
				}
				if ok {
					// A pod the scheduler moved off the lost node gets
					// its gputopo.dev/node updated by the controller.
					ok, why = nodesNoted(pods)
				}
			case "ct-waves":
				ok, why = advanceWaves(ctx, j, pods, claims)
			}
			if !ok {
				waiting = append(waiting, j.name+": "+why)
			}
		}
		return len(waiting) == 0, strings.Join(waiting, "; ")
	})

	ch.mu.Lock()
	for _, n := range ch.notes {
		t.Log(n)
	}
	for _, e := range ch.errs {
		t.Error(e)
	}
	ch.mu.Unlock()
	for _, j := range jobs[:len(jobs)-1] {
		checkCtJob(t, j, ch)
		line := fmt.Sprintf("Job %s (%d × %s in %s): created → all pods bound in %s", j.name, j.pods, j.tmpl, j.within, j.bound.Round(100*time.Millisecond))
		if j.recovered > 0 {
			line += fmt.Sprintf("; its node lost → bound again off it in %s", j.recovered.Round(100*time.Millisecond))
		}
		if len(j.waves) > 0 {
			line += fmt.Sprintf("; waves bound in %v", j.waves)
		}
		t.Log(line)
	}
	ch.mu.Lock()
	gone, tainted := ch.gone, ch.tainted
	ch.mu.Unlock()
	// The controller says so on each pod it takes back from a lost node;
	// a pod already bound on the tainted node is the taint manager's.
	checkLostEvent(t, "ct-gone", gone, "Released", "Moved")
	checkLostEvent(t, "ct-tainted", tainted, "Released", "Moved", "TaintManagerEviction")
	checkTooBig(t, byName["ct-too-big"])
	// While the Jobs' pods are still there to show their records.
	checkReleases(t, jobs, ch.restartedAt())
	logUngated(t, ungatedSel)

	// Once the Jobs are gone every ungated pod fits.
	for _, j := range jobs {
		deleteJob(t, j.name)
	}
	framework.Eventually(t, waitPlaced, "every ungated pod to be bound once the Jobs are gone", func() (bool, string) {
		list, err := client.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: ungatedSel})
		if err != nil {
			return false, err.Error()
		}
		for _, p := range list.Items {
			if p.Spec.NodeName == "" {
				return false, "pod " + p.Name + ": " + framework.PodState(&p)
			}
		}
		return len(list.Items) == len(ungated), fmt.Sprintf("%d pods", len(list.Items))
	})
	forceDeletePods(context.Background(), t, ungatedSel, func([]corev1.Pod) {})

	// Nothing stays allocated once its pods are gone.
	framework.Eventually(t, waitCleanup, "no claim of "+namespace+" to hold a device", func() (bool, string) {
		left := l.allocatedIn(namespace)
		return len(left) == 0, fmt.Sprintf("%v", left)
	})
	all, err := client.ResourceV1().ResourceClaims("").List(framework.Ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range all.Items {
		if c.Status.Allocation != nil {
			t.Errorf("claim %s/%s is still allocated after every pod is gone: %v", c.Namespace, c.Name, exclusiveDevices(c.Status.Allocation))
		}
	}
	stopLedger()
	events, clashes, violations := l.report()
	t.Logf("checked %d claim events for devices held twice; %s", events, clashes)
	for _, v := range violations {
		t.Error(v)
	}
	logControllerMetrics(t)
}

// ctBatchJob is the Job for j, in the suite's namespace.
func ctBatchJob(j *ctJob) *batchv1.Job {
	job := newJob(j.name, j.pods, j.tmpl, j.ann)
	if j.completions > 0 {
		job.Spec.Completions = ptr.To(j.completions)
	}
	if !j.indexed {
		job.Spec.CompletionMode = ptr.To(batchv1.NonIndexedCompletion)
	}
	return job
}

// ungatedPods are plain pods without placement annotations, in leaves.
func ungatedPods(leaves []string) []*corev1.Pod {
	var out []*corev1.Pod
	for _, s := range []struct {
		tmpl string
		n    int
	}{{"gpu-1", 8}, {"gpu-2-nvlink-pair", 4}, {"gpu-4-nvlink", 4}} {
		for i := range s.n {
			spec := newJob("x", 1, s.tmpl, nil).Spec.Template.Spec
			spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: cluster.LabelLeaf, Operator: corev1.NodeSelectorOpIn, Values: leaves}},
				}}},
			}}
			out = append(out, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ct-free-%s-%d", s.tmpl, i), Namespace: namespace,
					Labels: map[string]string{ungatedLabel: "ungated", "app.kubernetes.io/part-of": "gputopo-e2e"}},
				Spec: spec,
			})
		}
	}
	return out
}

// claimsByName lists the namespace's claims.
func claimsByName(ctx context.Context) (map[string]*resourcev1.ResourceClaim, error) {
	list, err := client.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := map[string]*resourcev1.ResourceClaim{}
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out, nil
}

func activePods(pods []corev1.Pod) []corev1.Pod {
	return slices.DeleteFunc(slices.Clone(pods), func(p corev1.Pod) bool {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
	})
}

// allBound reports whether want active pods are all bound off the avoided
// nodes, each with its claim allocated on its node, and Running on a real
// node.
func allBound(pods []corev1.Pod, want int, claims map[string]*resourcev1.ResourceClaim, avoid map[string]bool) (bool, string) {
	pods = activePods(pods)
	if len(pods) != want {
		return false, fmt.Sprintf("%d of %d pods", len(pods), want)
	}
	for _, p := range pods {
		node := p.Spec.NodeName
		c := claims[generatedClaim(&p)]
		switch {
		case hasGate(&p):
			return false, fmt.Sprintf("pod %s gated (%q)", p.Name, p.Annotations[placementapi.AnnotationStatus])
		case node == "":
			return false, "pod " + p.Name + ": " + framework.PodState(&p)
		case avoid[node]:
			return false, fmt.Sprintf("pod %s on lost node %s", p.Name, node)
		case c == nil || c.Status.Allocation == nil:
			return false, fmt.Sprintf("pod %s on %s: claim not allocated", p.Name, node)
		case allocationNode(c.Status.Allocation) != node:
			return false, fmt.Sprintf("pod %s on %s: claim allocated on %s", p.Name, node, allocationNode(c.Status.Allocation))
		case topo.real[node] && p.Status.Phase != corev1.PodRunning:
			return false, fmt.Sprintf("pod %s on real node %s: %s", p.Name, node, framework.PodState(&p))
		}
	}
	return true, ""
}

// advanceWaves finishes each bound wave of ct-waves as its pods' kubelet
// would (phase Succeeded; its nodes are fake), until the Job is Complete.
func advanceWaves(ctx context.Context, j *ctJob, pods []corev1.Pod, claims map[string]*resourcev1.ResourceClaim) (bool, string) {
	if j.stage == 2 {
		job, err := client.BatchV1().Jobs(namespace).Get(ctx, j.name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range job.Status.Conditions {
			if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
				return true, ""
			}
		}
		return false, fmt.Sprintf("not Complete: %d succeeded", job.Status.Succeeded)
	}
	if ok, why := allBound(pods, int(j.pods), claims, nil); !ok {
		return false, fmt.Sprintf("wave %d: %s", j.stage+1, why)
	}
	from := j.created
	if j.stage > 0 {
		from = j.stageStart
	}
	for _, p := range activePods(pods) {
		if topo.real[p.Spec.NodeName] {
			return false, fmt.Sprintf("pod %s is on real node %s, outside %s", p.Name, p.Spec.NodeName, j.within)
		}
		p.Status.Phase = corev1.PodSucceeded
		if _, err := client.CoreV1().Pods(namespace).UpdateStatus(ctx, &p, metav1.UpdateOptions{}); err != nil {
			return false, fmt.Sprintf("finish pod %s: %v", p.Name, err)
		}
	}
	j.waves = append(j.waves, time.Since(from).Round(100*time.Millisecond))
	j.stage++
	j.stageStart = time.Now()
	return false, fmt.Sprintf("wave %d finished", j.stage)
}

// checkCtJob checks where a placed Job's pods are and what the controller
// wrote: its domain, the Job's claims, the pod's node.
func checkCtJob(t *testing.T, j *ctJob, ch *chaos) {
	t.Helper()
	ctx := framework.Ctx(t)
	pods, err := jobPods(ctx, j.name)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := claimsByName(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range activePods(pods) {
		node := p.Spec.NodeName
		if in := topo.leafOf[node]; in != j.within && topo.spineOf[in] != j.within {
			t.Errorf("pod %s of %s is on %s in %s, outside its required %s", p.Name, j.name, node, in, j.within)
		}
		if got := p.Annotations[placementapi.AnnotationNode]; got != node {
			t.Errorf("pod %s is on %s but %s=%q", p.Name, node, placementapi.AnnotationNode, got)
		}
		if c := claims[generatedClaim(&p)]; c != nil && c.Annotations[placementapi.AnnotationAllocatedBy] != j.key() {
			t.Errorf("claim %s of pod %s on %s: %s=%q, want %q: the controller allocates its groups' claims",
				c.Name, p.Name, node, placementapi.AnnotationAllocatedBy, c.Annotations[placementapi.AnnotationAllocatedBy], j.key())
		}
		ch.mu.Lock()
		if node == ch.gone || node == ch.tainted {
			t.Errorf("pod %s of %s is on lost node %s", p.Name, j.name, node)
		}
		ch.mu.Unlock()
		if v := p.Annotations[placementapi.AnnotationReleased]; v != "" {
			if r, err := placementapi.ParseRelease(v); err != nil {
				t.Errorf("pod %s of %s: %v", p.Name, j.name, err)
			} else {
				t.Logf("pod %s of %s was released %d time(s), last for %s, before it landed on %s", p.Name, j.name, r.Count, r.Reason, node)
			}
		}
	}
}

// nodesNoted says whether every active pod's gputopo.dev/node names the
// node it is bound to.
func nodesNoted(pods []corev1.Pod) (bool, string) {
	for _, p := range activePods(pods) {
		if got := p.Annotations[placementapi.AnnotationNode]; p.Spec.NodeName != "" && got != p.Spec.NodeName {
			return false, fmt.Sprintf("pod %s is on %s but %s=%q", p.Name, p.Spec.NodeName, placementapi.AnnotationNode, got)
		}
	}
	return true, ""
}

// checkLostEvent checks that a pod of job has an event with one of
// reasons that names the lost node.
func checkLostEvent(t *testing.T, job, node string, reasons ...string) {
	t.Helper()
	events, err := client.CoreV1().Events(namespace).List(framework.Ctx(t), metav1.ListOptions{FieldSelector: "involvedObject.kind=Pod"})
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, e := range events.Items {
		if !strings.HasPrefix(e.InvolvedObject.Name, job+"-") {
			continue
		}
		seen = append(seen, e.Reason)
		if slices.Contains(reasons, e.Reason) && (e.Reason == "TaintManagerEviction" || strings.Contains(e.Message, node)) {
			t.Logf("pod %s: %s event: %s", e.InvolvedObject.Name, e.Reason, e.Message)
			return
		}
	}
	t.Errorf("no pod of %s has a %v event about its lost node %s; its pods' events: %v", job, reasons, node, seen)
}

// checkTooBig: the Job that cannot fit stays gated and says why.
func checkTooBig(t *testing.T, j *ctJob) {
	t.Helper()
	job, err := client.BatchV1().Jobs(namespace).Get(framework.Ctx(t), j.name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	msg := waitJobWarning(t, job, "Unschedulable")
	if !strings.Contains(msg, "no leaf can hold 5 pods") {
		t.Errorf("Unschedulable event of %s says %q, want that no leaf holds 5 pods", j.name, msg)
	}
	claims, err := claimsByName(framework.Ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	pods, err := jobPods(framework.Ctx(t), j.name)
	if err != nil {
		t.Fatal(err)
	}
	if len(pods) != int(j.pods) {
		t.Errorf("%s has %d pods, want %d", j.name, len(pods), j.pods)
	}
	for _, p := range pods {
		status := p.Annotations[placementapi.AnnotationStatus]
		switch {
		case !hasGate(&p) || p.Spec.NodeName != "":
			t.Errorf("pod %s of %s, which cannot fit, left its gate: %s", p.Name, j.name, framework.PodState(&p))
		case !strings.Contains(status, "no leaf can hold 5 pods"):
			t.Errorf("pod %s of %s has %s=%q, want the reason", p.Name, j.name, placementapi.AnnotationStatus, status)
		}
		if c := claims[generatedClaim(&p)]; c != nil && c.Status.Allocation != nil {
			t.Errorf("claim %s of waiting pod %s is allocated on %s", c.Name, p.Name, allocationNode(c.Status.Allocation))
		}
	}
}

// logUngated says where the ungated pods are while the Jobs hold their GPUs.
func logUngated(t *testing.T, sel string) {
	t.Helper()
	list, err := client.CoreV1().Pods(namespace).List(framework.Ctx(t), metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	bound := 0
	for _, p := range list.Items {
		if p.Spec.NodeName != "" {
			bound++
		} else {
			t.Logf("ungated pod %s waits while the Jobs run: %s", p.Name, framework.PodState(&p))
		}
	}
	t.Logf("%d of %d ungated pods bound while the Jobs run", bound, len(list.Items))
}

// checkReleases checks what the controller says of every pod it took
// claims back from, against each other: each Released event of the test's
// Jobs (after since) has its pod's gputopo.dev/released record, with the
// event's reason and a count at least the number of such events; and the
// running controller's released_pods_total and device_conflicts_total
// count, per reason, at least the releases and conflicts it recorded in
// events after it started, and at most all of them.
func checkReleases(t *testing.T, jobs []*ctJob, restarted time.Time) {
	t.Helper()
	ctx := framework.Ctx(t)
	m, err := scrapeMetrics(ctx)
	if err != nil {
		t.Fatalf("controller metrics: %v", err)
	}
	events, err := client.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Pod"})
	if err != nil {
		t.Fatal(err)
	}
	ours := func(pod string) bool {
		return slices.ContainsFunc(jobs, func(j *ctJob) bool { return strings.HasPrefix(pod, j.name+"-") })
	}
	released := map[string]*tally{} // release reason → events
	conflicts := tally{}
	perPod := map[string]int{}                 // pod → Released events
	podReasons := map[string]map[string]bool{} // pod → their reasons
	for _, e := range events.Items {
		if e.Source.Component != "gputopo-controller" || !ours(e.InvolvedObject.Name) {
			continue
		}
		n := int(max(e.Count, 1))
		after := !e.LastTimestamp.Time.Before(restarted.Truncate(time.Second).Add(time.Second))
		switch e.Reason {
		case "Released", "Moved":
			reason := "Moved"
			if e.Reason == "Released" {
				reason, _, _ = strings.Cut(e.Message, ":")
				perPod[e.InvolvedObject.Name] += n
				if podReasons[e.InvolvedObject.Name] == nil {
					podReasons[e.InvolvedObject.Name] = map[string]bool{}
				}
				podReasons[e.InvolvedObject.Name][reason] = true
			}
			if released[reason] == nil {
				released[reason] = &tally{}
			}
			released[reason].all += n
			if after && e.FirstTimestamp.Equal(&e.LastTimestamp) {
				released[reason].since += n
			}
		case "DeviceConflict":
			conflicts.all += n
			if after && e.FirstTimestamp.Equal(&e.LastTimestamp) {
				conflicts.since += n
			}
		}
	}
	for pod, n := range perPod {
		p, err := client.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			continue // replaced, or deleted with its node
		}
		r, err := placementapi.ParseRelease(p.Annotations[placementapi.AnnotationReleased])
		switch {
		case err != nil:
			t.Errorf("pod %s has %d Released event(s) but %s=%q: %v", pod, n, placementapi.AnnotationReleased, p.Annotations[placementapi.AnnotationReleased], err)
		case r.Count < n:
			t.Errorf("pod %s has %d Released event(s) but %s counts %d", pod, n, placementapi.AnnotationReleased, r.Count)
		case !podReasons[pod][r.Reason]:
			t.Errorf("pod %s: %s says %s, its Released events %v", pod, placementapi.AnnotationReleased, r.Reason, podReasons[pod])
		}
	}
	for reason, c := range released {
		got := int(m[`gputopo_controller_released_pods_total{reason="`+reason+`"}`])
		if got < c.since || (!restarted.IsZero() && got > c.all) {
			t.Errorf(`released_pods_total{reason=%q} = %d; the controller recorded %d such events since it restarted and %d in all`, reason, got, c.since, c.all)
		}
	}
	if got := int(m["gputopo_controller_device_conflicts_total"]); got < conflicts.since || (!restarted.IsZero() && got > conflicts.all) {
		t.Errorf("device_conflicts_total = %d; the controller recorded %d DeviceConflict events since it restarted and %d in all", got, conflicts.since, conflicts.all)
	}
	t.Logf("released pods by reason (events since the restart / in all): %s; device conflicts %s", fmtTallies(released), &conflicts)
}

// tally counts events: since the controller restarted, and in all.
type tally struct{ since, all int }

func (t *tally) String() string { return fmt.Sprintf("%d/%d", t.since, t.all) }

func fmtTallies(m map[string]*tally) string {
	var out []string
	for k, v := range m {
		out = append(out, fmt.Sprintf("%s=%v", k, v))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

// logControllerMetrics logs what the running controller counted.
func logControllerMetrics(t *testing.T) {
	t.Helper()
	m, err := scrapeMetrics(framework.Ctx(t))
	if err != nil {
		t.Logf("controller metrics: %v", err)
		return
	}
	var lines []string
	for k, v := range m {
		if strings.HasPrefix(k, "gputopo_controller_released_pods_total") || strings.HasPrefix(k, "gputopo_controller_device_conflicts_total") ||
			strings.HasPrefix(k, "gputopo_controller_decisions_total") {
			lines = append(lines, fmt.Sprintf("%s %v", k, v))
		}
	}
	slices.Sort(lines)
	t.Logf("controller metrics since its restart:\n%s", strings.Join(lines, "\n"))
}
