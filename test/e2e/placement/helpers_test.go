package placement

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	placementapi "github.com/gputopo/gputopo/api/placement/v1alpha1"
	gputopology "github.com/gputopo/gputopo/pkg/topology"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// Timeouts: the machine is slow, the controller plans one group at a time
// and the Job controller backs off before replacing a pod, so waits are
// generous; polls return as soon as the condition holds.
const (
	waitPlaced  = 3 * time.Minute
	waitCleanup = 3 * time.Minute
	waitRestart = 4 * time.Minute // includes a leader Lease that must expire
	waitStatus  = 2 * time.Minute
)

// claimName is the pod-level name of every test pod's one claim.
const claimName = "gpus"

// ---- Jobs ----

// newJob is an Indexed Job of pods parallel pods, each taking one claim
// from the demo template tmpl, with ann on its pod template.
func newJob(name string, pods int32, tmpl string, ann map[string]string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: batchv1.JobSpec{
			Parallelism:    ptr.To(pods),
			Completions:    ptr.To(pods),
			CompletionMode: ptr.To(batchv1.IndexedCompletion),
			// A force-deleted pod counts as failed; the Job replaces it.
			BackoffLimit: ptr.To[int32](6),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Annotations: ann, Labels: map[string]string{"app.kubernetes.io/part-of": "gputopo-e2e"}},
				Spec: corev1.PodSpec{
					RestartPolicy:                 corev1.RestartPolicyNever,
					TerminationGracePeriodSeconds: ptr.To[int64](0),
					Containers: []corev1.Container{{
						Name: "train", Image: "registry.k8s.io/pause:3.10",
						Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: claimName}}},
					}},
					ResourceClaims: []corev1.PodResourceClaim{{Name: claimName, ResourceClaimTemplateName: ptr.To(tmpl)}},
				},
			},
		},
	}
}

// placed asks for placement p and nothing else.
func placed(p placementapi.Placement) map[string]string {
	return map[string]string{placementapi.AnnotationPlacement: string(p)}
}

// createJob creates a Job of 8-GPU pods (gpu-8-node) and deletes it with
// its pods and claims when the test ends. On failure it logs the Job's
// pods and the tail of the controller's log.
func createJob(t *testing.T, name string, pods int32, ann map[string]string) *batchv1.Job {
	t.Helper()
	job, err := client.BatchV1().Jobs(namespace).Create(framework.Ctx(t), newJob(name, pods, "gpu-8-node", ann), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Job %s: %v", name, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			logJob(t, name)
		}
		deleteJob(t, name)
	})
	return job
}

// jobPods lists the Job's pods that are not being deleted, by name.
func jobPods(ctx context.Context, job string) ([]corev1.Pod, error) {
	list, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
	if err != nil {
		return nil, err
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// deleteJob suspends a Job, force-deletes its pods (pods on fake nodes
// never finish a graceful deletion), deletes the Job and waits until the
// pods and their claims are gone and, on real nodes, the plugin has
// unprepared the claims. Deleting a Job that does not exist is fine.
//
// Suspending first keeps the Job, and with it the group's size, in place
// while its pods go: the controller sees a group waiting for its pods, not
// a smaller group to place (see TestDeletedJobIsNotPlaced).
func deleteJob(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitCleanup)
	defer cancel()
	// The claims to wait for, by the UID of the pod that owns them.
	type claimRef struct{ name, uid, node string }
	claims := map[types.UID]claimRef{}
	notePods := func(pods []corev1.Pod) {
		for _, p := range pods {
			if _, seen := claims[p.UID]; seen {
				continue
			}
			if c, err := framework.PodClaim(ctx, client, &p, claimName); err == nil {
				claims[p.UID] = claimRef{c.Name, string(c.UID), p.Spec.NodeName}
			}
		}
	}
	suspend := []byte(`{"spec":{"suspend":true}}`)
	if _, err := client.BatchV1().Jobs(namespace).Patch(ctx, name, types.MergePatchType, suspend, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("suspend Job %s: %v", name, err)
	}
	forceDeletePods(ctx, t, batchv1.JobNameLabel+"="+name, notePods)
	err := client.BatchV1().Jobs(namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete Job %s: %v", name, err)
	}
	framework.Eventually(t, waitCleanup, "Job "+name+" to be gone", func() (bool, string) {
		_, err := client.BatchV1().Jobs(namespace).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("get: %v", err)
	})
	// A pod the Job controller created just before the suspension.
	forceDeletePods(ctx, t, batchv1.JobNameLabel+"="+name, notePods)
	framework.Eventually(t, waitCleanup, "the claims of Job "+name+" to be gone", func() (bool, string) {
		list, err := client.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var left []string
		for _, c := range list.Items {
			for _, ref := range c.OwnerReferences {
				if _, ours := claims[ref.UID]; ours || ref.Kind == "Pod" && strings.HasPrefix(ref.Name, name+"-") {
					left = append(left, c.Name)
				}
			}
		}
		return len(left) == 0, fmt.Sprintf("claims left: %v", left)
	})
	for _, c := range claims {
		if c.node != "" && topo.real[c.node] {
			framework.Eventually(t, waitCleanup, "claim "+c.name+" to be unprepared on "+c.node, func() (bool, string) {
				return framework.Unprepared(lc, c.node, c.uid)
			})
		}
	}
}

// forceDeletePods force-deletes the pods that match selector until none
// is left, showing each list to note first.
func forceDeletePods(ctx context.Context, t *testing.T, selector string, note func([]corev1.Pod)) {
	t.Helper()
	framework.Eventually(t, waitCleanup, "pods "+selector+" to be gone", func() (bool, string) {
		list, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err.Error()
		}
		note(list.Items)
		var left []string
		for _, p := range list.Items {
			left = append(left, p.Name)
			if p.DeletionTimestamp == nil || p.DeletionGracePeriodSeconds == nil || *p.DeletionGracePeriodSeconds != 0 {
				err := client.CoreV1().Pods(namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
				if err != nil && !apierrors.IsNotFound(err) {
					t.Logf("force-delete pod %s: %v", p.Name, err)
				}
			} else if len(p.Finalizers) > 0 && time.Since(p.DeletionTimestamp.Time) > 10*time.Second {
				// The Job controller removes its tracking finalizer; if it
				// has not, do it here.
				patch := []byte(`{"metadata":{"finalizers":null}}`)
				if _, err := client.CoreV1().Pods(namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
					t.Logf("remove finalizers of pod %s: %v", p.Name, err)
				}
			}
		}
		return len(left) == 0, fmt.Sprintf("pods left: %v", left)
	})
}

// forceDeletePod deletes a pod with grace period 0, as `kubectl delete
// --force` does.
func forceDeletePod(t *testing.T, name string) {
	t.Helper()
	if err := client.CoreV1().Pods(namespace).Delete(framework.Ctx(t), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatalf("force-delete pod %s: %v", name, err)
	}
}

// ---- placement ----

// placement is where the controller and the scheduler put a Job.
type placement struct {
	pods   []corev1.Pod
	nodes  []string          // pod i's node
	byNode map[string]string // node → pod
	leaves []string          // sorted, distinct
	domain string            // the gputopo.dev/domain every pod carries
	claims map[string]*resourcev1.ResourceClaim
}

func (p placement) String() string {
	var parts []string
	for i, pod := range p.pods {
		parts = append(parts, pod.Name+"→"+p.nodes[i])
	}
	return fmt.Sprintf("domain %q, leaves %v: %s", p.domain, p.leaves, strings.Join(parts, " "))
}

// waitJobPlaced waits until the Job has n pods, each ungated, bound and
// with its claim allocated, and checks what the controller recorded on
// each (see checkPlaced).
func waitJobPlaced(t *testing.T, job string, n int, timeout time.Duration) placement {
	t.Helper()
	var pods []corev1.Pod
	claims := map[string]*resourcev1.ResourceClaim{}
	framework.Eventually(t, timeout, fmt.Sprintf("the %d pods of Job %s to be placed, bound and allocated", n, job), func() (bool, string) {
		var err error
		if pods, err = jobPods(context.Background(), job); err != nil {
			return false, err.Error()
		}
		if len(pods) != n {
			return false, fmt.Sprintf("%d pods", len(pods))
		}
		list, err := client.ResourceV1().ResourceClaims(namespace).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		byName := map[string]*resourcev1.ResourceClaim{}
		for i := range list.Items {
			byName[list.Items[i].Name] = &list.Items[i]
		}
		for _, p := range pods {
			if hasGate(&p) {
				return false, fmt.Sprintf("pod %s gated (status %q)", p.Name, p.Annotations[placementapi.AnnotationStatus])
			}
			if p.Spec.NodeName == "" {
				return false, "pod " + p.Name + ": " + framework.PodState(&p)
			}
			c := byName[generatedClaim(&p)]
			if c == nil || c.Status.Allocation == nil {
				return false, fmt.Sprintf("pod %s on %s: claim %q not allocated", p.Name, p.Spec.NodeName, generatedClaim(&p))
			}
			claims[p.Name] = c
		}
		return true, ""
	})
	pl := checkPlaced(t, pods, claims)
	t.Logf("Job %s: %s", job, pl)
	return pl
}

func generatedClaim(p *corev1.Pod) string {
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.Name == claimName && s.ResourceClaimName != nil {
			return *s.ResourceClaimName
		}
	}
	return ""
}

// podScheduledSays reports whether the scheduler's PodScheduled condition
// on p is False with reason.
func podScheduledSays(p *corev1.Pod, reason string) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Status == corev1.ConditionFalse && c.Reason == reason
		}
	}
	return false
}

// jobEventCount is how many times the controller recorded a reason event
// on the Job (repeats of one event are counted in the event).
func jobEventCount(t *testing.T, job *batchv1.Job, reason string) int32 {
	t.Helper()
	events, err := client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.kind": "Job", "involvedObject.name": job.Name, "involvedObject.uid": string(job.UID), "reason": reason}.String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	var n int32
	for _, e := range events.Items {
		if e.Source.Component == "gputopo-controller" {
			n += max(e.Count, 1)
		}
	}
	return n
}

// pokeJob changes an annotation of the test's own on a Job, which makes
// the controller sync the Job's group again.
func pokeJob(t *testing.T, name string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{"e2e.gputopo.dev/poke":"%d"}}}`, time.Now().UnixNano())
	if _, err := client.BatchV1().Jobs(namespace).Patch(framework.Ctx(t), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("annotate Job %s: %v", name, err)
	}
}

func hasGate(p *corev1.Pod) bool {
	return slices.ContainsFunc(p.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == placementapi.SchedulingGate })
}

// checkPlaced checks a placed group: every pod bound to the one node it
// was pinned to (gputopo.dev/node and a required node affinity on
// metadata.name naming exactly that node), no waiting status left, one
// gputopo.dev/domain for all, each claim allocated with all 8 GPUs of the
// pod's node by the controller (allocated-by), reserved for the pod,
// and no two pods on one node.
func checkPlaced(t *testing.T, pods []corev1.Pod, claims map[string]*resourcev1.ResourceClaim) placement {
	t.Helper()
	pl := placement{pods: pods, byNode: map[string]string{}, claims: claims}
	leaves := map[string]bool{}
	for i := range pods {
		p := &pods[i]
		node := p.Spec.NodeName
		pl.nodes = append(pl.nodes, node)
		if other, dup := pl.byNode[node]; dup {
			t.Errorf("pods %s and %s are both on node %s, whose 8 GPUs fit one pod", other, p.Name, node)
		}
		pl.byNode[node] = p.Name
		leaves[topo.leafOf[node]] = true
		if got := p.Annotations[placementapi.AnnotationNode]; got != node {
			t.Errorf("pod %s is on %s but %s says %q", p.Name, node, placementapi.AnnotationNode, got)
		}
		if pinned := pinnedNodes(p); pinned != nil {
			t.Errorf("pod %s on %s: required node affinity pins it to %v; the claims' allocation alone steers it", p.Name, node, pinned)
		}
		if s, ok := p.Annotations[placementapi.AnnotationStatus]; ok {
			t.Errorf("pod %s is placed but still has %s=%q", p.Name, placementapi.AnnotationStatus, s)
		}
		d := p.Annotations[placementapi.AnnotationDomain]
		if i == 0 {
			pl.domain = d
		} else if d != pl.domain {
			t.Errorf("pod %s has %s=%q, pod %s has %q", p.Name, placementapi.AnnotationDomain, d, pods[0].Name, pl.domain)
		}
		c := claims[p.Name]
		var got []string
		for _, r := range c.Status.Allocation.Devices.Results {
			got = append(got, r.Driver+"/"+r.Pool+"/"+r.Device)
		}
		slices.Sort(got)
		var want []string
		for i := range 8 {
			want = append(want, fmt.Sprintf("%s/%s/gpu-%d", gputopology.DriverName, node, i))
		}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("claim %s of pod %s on %s got %v, want every GPU of the node %v", c.Name, p.Name, node, got, want)
		}
		if by := c.Annotations[placementapi.AnnotationAllocatedBy]; !strings.HasSuffix(by, "/job/"+p.Labels["job-name"]) {
			t.Errorf("claim %s of pod %s: %s=%q, want the pod's Job: the controller allocates the claims it plans", c.Name, p.Name, placementapi.AnnotationAllocatedBy, by)
		}
		if !slices.ContainsFunc(c.Status.ReservedFor, func(r resourcev1.ResourceClaimConsumerReference) bool { return r.UID == p.UID }) {
			t.Errorf("claim %s is not reserved for pod %s: %+v", c.Name, p.Name, c.Status.ReservedFor)
		}
	}
	for l := range leaves {
		pl.leaves = append(pl.leaves, l)
	}
	slices.Sort(pl.leaves)
	return pl
}

// pinnedNodes returns the node names that the pod's required node
// affinity allows through metadata.name, over all terms; nil if a term
// does not restrict metadata.name (the pod is not pinned).
func pinnedNodes(p *corev1.Pod) []string {
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil
	}
	var out []string
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		var names []string
		for _, f := range term.MatchFields {
			if f.Key == "metadata.name" && f.Operator == corev1.NodeSelectorOpIn {
				if names == nil {
					names = slices.Clone(f.Values)
				} else { // several requirements in a term: their intersection
					names = slices.DeleteFunc(names, func(n string) bool { return !slices.Contains(f.Values, n) })
				}
			}
		}
		if names == nil {
			return nil
		}
		for _, n := range names {
			if !slices.Contains(out, n) {
				out = append(out, n)
			}
		}
	}
	slices.Sort(out)
	return out
}

// wholeLeaf checks that the pods fill exactly the nodes of one leaf and
// returns it.
func wholeLeaf(t *testing.T, pl placement) string {
	t.Helper()
	if len(pl.leaves) != 1 {
		t.Fatalf("pods span leaves %v, want one: %s", pl.leaves, pl)
	}
	leaf := pl.leaves[0]
	if got, want := sortedCopy(pl.nodes), sortedCopy(topo.leafNodes[leaf]); !slices.Equal(got, want) {
		t.Errorf("pods are on %v, want every node of %s: %v", got, leaf, want)
	}
	if want := "leaf:" + leaf; pl.domain != want {
		t.Errorf("%s=%q, want %q", placementapi.AnnotationDomain, pl.domain, want)
	}
	return leaf
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// waitJobWarning waits for a Warning event with reason on the Job and
// returns its message.
func waitJobWarning(t *testing.T, job *batchv1.Job, reason string) string {
	t.Helper()
	var msg string
	framework.Eventually(t, waitStatus, "a "+reason+" event on Job "+job.Name, func() (bool, string) {
		events, err := client.CoreV1().Events(namespace).List(context.Background(), metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.kind": "Job", "involvedObject.name": job.Name, "involvedObject.uid": string(job.UID), "reason": reason}.String(),
		})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range events.Items {
			if e.Type == corev1.EventTypeWarning {
				msg = e.Message
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d matching events", len(events.Items))
	})
	return msg
}

// logJob logs the Job's pods with what the controller wrote on them.
func logJob(t *testing.T, job string) {
	t.Helper()
	list, err := client.CoreV1().Pods(namespace).List(context.Background(), metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
	if err != nil {
		t.Logf("list pods of Job %s: %v", job, err)
		return
	}
	for _, p := range list.Items {
		ann := map[string]string{}
		for k, v := range p.Annotations {
			if strings.HasPrefix(k, placementapi.Prefix) {
				ann[k] = v
			}
		}
		data, _ := json.Marshal(ann)
		t.Logf("pod %s (uid %s, deleting %v): %s; pinned to %v; %s", p.Name, p.UID, p.DeletionTimestamp != nil, framework.PodState(&p), pinnedNodes(&p), data)
	}
}

// dumpOnFailure logs the tails of the controller's and the scheduler's
// logs when the test fails.
func dumpOnFailure(t *testing.T) {
	t.Helper()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, p := range []string{"controller", "kube-scheduler"} {
			t.Logf("----- %s (tail) -----\n%s", lc.LogPath(p), framework.Tail(lc.LogPath(p), 40))
		}
	})
}

// ---- the controller ----

// ensureController starts the controller if it is not running, so that a
// test that stopped it never leaves the suite without one.
func ensureController(t *testing.T) {
	t.Helper()
	if err := lc.StartController(); err != nil && !strings.Contains(err.Error(), "already running") {
		t.Errorf("start controller: %v", err)
	}
}

// scrapeMetrics reads the controller's /metrics and returns the samples as
// "name{labels}" → value, labels as Prometheus prints them.
func scrapeMetrics(ctx context.Context) (map[string]float64, error) {
	url, err := lc.ControllerMetricsURL()
	if err != nil {
		return nil, err
	}
	return framework.ScrapeMetrics(ctx, url)
}
