package placement

// End-to-end tests of `kubectl gputopo explain` (the real binary, run by
// kubectl as its plugin) on the waits docs/troubleshooting.md describes:
// each asserts the specific reason explain prints, and for pods gputopo
// manages the gputopo.dev/Placed condition, so that a generic "no domain
// can hold the pods" would fail them. Each also checks that the
// troubleshooting guide's sample for the case shows the same state and
// reason, and, with GPUTOPO_EXPLAIN_OUT set to a folder, writes what
// explain printed there (the source of the guide's samples).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	placementapi "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// explained is what `explain -o json` says of one pod.
type explained struct {
	Name     string   `json:"name"`
	State    string   `json:"state"`
	Why      string   `json:"why"`
	Problems []string `json:"problems"`
}

// explainCase is one wait: the target explain is asked about, the state
// and the texts its why and problem lines must hold.
type explainCase struct {
	target   string // job/NAME or pod/NAME
	state    string
	why      []string
	problems []string
	// doc is the heading of the troubleshooting guide's section whose
	// sample must show the same state and texts ("" for none).
	doc string
}

// kubectlGputopo runs `kubectl gputopo ARGS` against the suite's cluster:
// kubectl finds the plugin as kubectl-gputopo on the PATH.
func kubectlGputopo(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(suite.BinDir, "gputopo"), filepath.Join(dir, "kubectl-gputopo")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(suite.K8sBinDir, "kubectl"), append([]string{"gputopo", "--kubeconfig=" + lc.Kubeconfig()}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return append(stdout.Bytes(), stderr.Bytes()...), err
	}
	return stdout.Bytes(), nil
}

// checkExplain waits until explain says of every pod of c.target what c
// wants, then records its text output and compares it with the guide.
func checkExplain(t *testing.T, c explainCase) {
	t.Helper()
	var last []explained
	framework.Eventually(t, waitStatus, "explain "+c.target+" to say why it waits", func() (bool, string) {
		out, err := kubectlGputopo(t, "explain", c.target, "-n", namespace, "-o", "json")
		if err != nil {
			return false, fmt.Sprintf("%v: %s", err, out)
		}
		var e struct{ Pods []explained }
		if err := json.Unmarshal(out, &e); err != nil {
			t.Fatalf("explain -o json: %v\n%s", err, out)
		}
		last = e.Pods
		if len(e.Pods) == 0 {
			return false, "no pods"
		}
		for _, p := range e.Pods {
			if miss := c.missing(p); miss != "" {
				return false, fmt.Sprintf("pod %s: %s; explain says %+v", p.Name, miss, p)
			}
		}
		return true, ""
	})
	out, err := kubectlGputopo(t, "explain", c.target, "-n", namespace)
	if err != nil {
		t.Fatalf("explain %s: %v\n%s", c.target, err, out)
	}
	t.Logf("kubectl gputopo explain %s -n %s:\n%s", c.target, namespace, out)
	if dir := os.Getenv("GPUTOPO_EXPLAIN_OUT"); dir != "" {
		name := strings.NewReplacer("/", "-").Replace(t.Name() + "_" + c.target)
		text := fmt.Sprintf("$ kubectl gputopo explain %s -n %s\n%s", c.target, namespace, out)
		if err := os.WriteFile(filepath.Join(dir, name+".txt"), []byte(text), 0o644); err != nil {
			t.Error(err)
		}
	}
	if c.doc != "" {
		checkGuide(t, c, last[0])
	}
}

// missing says what of c the pod's explanation lacks, "" if nothing.
func (c explainCase) missing(p explained) string {
	if p.State != c.state {
		return fmt.Sprintf("state %q, want %q", p.State, c.state)
	}
	for _, w := range c.why {
		if !strings.Contains(p.Why, w) {
			return fmt.Sprintf("why lacks %q", w)
		}
	}
	problems := strings.Join(p.Problems, "\n")
	for _, w := range c.problems {
		if !strings.Contains(problems, w) {
			return fmt.Sprintf("problems lack %q", w)
		}
	}
	return ""
}

// placeholder matches the parts of a wanted text that are this suite's
// names, which the guide spells as a reader's (namespace ml, pod p, ...).
var placeholder = regexp.MustCompile(`gputopo-placement/[a-z0-9-]+|gputopo-placement|explain-[a-z0-9-]+`)

// checkGuide checks that the troubleshooting guide's section c.doc has a
// sample of the same shape as what explain printed: a pod in the same
// state, and each wanted text, with this suite's names as wildcards.
func checkGuide(t *testing.T, c explainCase, got explained) {
	t.Helper()
	root, err := framework.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "troubleshooting.md"))
	if err != nil {
		t.Fatal(err)
	}
	var section string
	for _, s := range strings.Split(string(doc), "\n## ") {
		if strings.HasPrefix(s, c.doc) {
			section = s
		}
	}
	if section == "" {
		t.Errorf("docs/troubleshooting.md has no section %q", c.doc)
		return
	}
	if !strings.Contains(section, " "+got.State+" ") {
		t.Errorf("docs/troubleshooting.md, %q: no sample pod in state %q, which explain prints", c.doc, got.State)
	}
	for _, w := range append(c.why, c.problems...) {
		parts := placeholder.Split(w, -1)
		for i := range parts {
			parts[i] = regexp.QuoteMeta(parts[i])
		}
		re := regexp.MustCompile(strings.Join(parts, `[a-z0-9./-]+`))
		if !re.MatchString(section) {
			t.Errorf("docs/troubleshooting.md, %q: the sample does not say %q (as /%s/), which explain prints", c.doc, w, re)
		}
	}
}

// unmanagedPod creates a pod that gputopo does not manage, with one claim
// from tmpl and no node selector, and removes it and its claim when the
// test ends.
func unmanagedPod(t *testing.T, name, tmpl string, edit ...func(*corev1.Pod)) {
	t.Helper()
	p := plainPod(name, tmpl, "")
	p.Spec.NodeSelector = nil
	for _, e := range edit {
		e(p)
	}
	created, err := client.CoreV1().Pods(namespace).Create(framework.Ctx(t), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", name, err)
	}
	t.Cleanup(func() { removePod(t, created.Name, created.UID) })
}

// selectorTemplate creates a copy of the demo template gpu-1 named name
// whose request has the CEL selector expr, deleted when the test ends.
func selectorTemplate(t *testing.T, name, expr string) {
	t.Helper()
	tmpl := suite.Templates["gpu-1"].DeepCopy()
	tmpl.ObjectMeta = metav1.ObjectMeta{Name: name, Namespace: namespace}
	tmpl.Spec.Spec.Devices.Requests[0].Exactly.Selectors = []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: expr}}}
	if _, err := client.ResourceV1().ResourceClaimTemplates(namespace).Create(framework.Ctx(t), tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = client.ResourceV1().ResourceClaimTemplates(namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// waitCondition waits until every pod of the Job carries the
// gputopo.dev/Placed condition False with reason and a message holding
// text.
func waitCondition(t *testing.T, job, reason, text string) {
	t.Helper()
	framework.Eventually(t, waitStatus, fmt.Sprintf("the pods of %s to have condition %s False/%s", job, placementapi.ConditionPlaced, reason), func() (bool, string) {
		pods, err := jobPods(context.Background(), job)
		if err != nil || len(pods) == 0 {
			return false, fmt.Sprintf("%d pods (%v)", len(pods), err)
		}
		for _, p := range pods {
			if !hasGate(&p) || !placedConditionSays(&p, corev1.ConditionFalse, reason, text) {
				return false, fmt.Sprintf("pod %s: gated %v, conditions %+v", p.Name, hasGate(&p), p.Status.Conditions)
			}
		}
		return true, ""
	})
}

// TestExplainMissingTemplate: a pod whose claim names a
// ResourceClaimTemplate that does not exist. The resource claim controller
// never creates the claim; explain names the template, for a Job gputopo
// manages (whose pods say InvalidClaim in their condition, as does an
// event on the Job) and for a pod it does not.
func TestExplainMissingTemplate(t *testing.T) {
	dumpOnFailure(t)
	const tmpl = "explain-no-such-template"
	problem := `ResourceClaimTemplate ` + namespace + `/` + tmpl + `, which the pod's claim "gpus" names, does not exist: create it in namespace ` + namespace
	job := createJobFrom(t, "explain-notmpl", 1, tmpl, placed(placementapi.PlacementAuto))
	waitCondition(t, "explain-notmpl", placementapi.StatusInvalidClaim, "ResourceClaimTemplate "+namespace+"/"+tmpl+", which does not exist")
	if msg := waitEvent(t, "Job", job.Name, job.UID, corev1.EventTypeWarning, placementapi.StatusInvalidClaim, waitStatus); !strings.Contains(msg, tmpl) {
		t.Errorf("InvalidClaim event %q does not name the template %s", msg, tmpl)
	}
	checkExplain(t, explainCase{target: "job/explain-notmpl", state: "waiting (gated)",
		why:      []string{`InvalidClaim: pod explain-notmpl-0-`, `its claim "gpus" names ResourceClaimTemplate ` + namespace + `/` + tmpl + `, which does not exist`},
		problems: []string{problem}, doc: "5. "})

	unmanagedPod(t, "plain-explain-notmpl", tmpl)
	checkExplain(t, explainCase{target: "pod/plain-explain-notmpl", state: "pending", problems: []string{problem}, doc: "5. "})
}

// TestExplainSelectorMatchesNothing: a claim whose selector no device in
// the cluster matches (every GPU here is a hopper), and one whose selector
// names an attribute no device has. explain says so per claim, with the
// selector or the attribute, beside the controller's reason for a Job
// (Unschedulable; InvalidClaim for the attribute).
func TestExplainSelectorMatchesNothing(t *testing.T) {
	dumpOnFailure(t)
	const expr = `device.attributes["gpu.gputopo.dev"].architecture == "blackwell"`
	selectorTemplate(t, "explain-blackwell", expr)
	selectorTemplate(t, "explain-misspelt", `device.attributes["gpu.gputopo.dev"].nvlinkDomian == "x"`)
	problem := "even with every device free: no device matches its selectors (" + expr + ")"
	misspelt := "cannot be allocated on any node: its selector names the attribute gpu.gputopo.dev/nvlinkDomian, which no device has"

	createJobFrom(t, "explain-blackwell", 1, "explain-blackwell", placed(placementapi.PlacementAuto))
	createJobFrom(t, "explain-misspelt", 1, "explain-misspelt", placed(placementapi.PlacementAuto))
	// The controller checks with the allocator, on nodes with every device
	// free, that the Job could ever fit: it says it could not, and holds
	// no node for it.
	waitCondition(t, "explain-blackwell", placementapi.StatusUnschedulable, "not even when empty")
	pods, err := jobPods(context.Background(), "explain-blackwell")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if r, ok := p.Annotations[placementapi.AnnotationReservation]; ok {
			t.Errorf("pod %s of a Job no node could ever hold reserves %q", p.Name, r)
		}
	}
	checkExplain(t, explainCase{target: "job/explain-blackwell", state: "waiting (gated)",
		why: []string{"Unschedulable: ", "not even when empty"}, problems: []string{problem}, doc: "6. "})
	waitCondition(t, "explain-misspelt", placementapi.StatusInvalidClaim, "nvlinkDomian")
	checkExplain(t, explainCase{target: "job/explain-misspelt", state: "waiting (gated)",
		why: []string{"InvalidClaim: ", "nvlinkDomian"}, problems: []string{misspelt}, doc: "6. "})

	unmanagedPod(t, "plain-explain-blackwell", "explain-blackwell")
	checkExplain(t, explainCase{target: "pod/plain-explain-blackwell", state: "pending", problems: []string{problem}, doc: "6. "})

	// A single pod gputopo manages (no Job): the same answer, for the pod.
	unmanagedPod(t, "solo-explain-blackwell", "explain-blackwell", func(p *corev1.Pod) {
		p.Annotations = map[string]string{placementapi.AnnotationPlacement: string(placementapi.PlacementAuto)}
	})
	framework.Eventually(t, waitStatus, "the single pod's condition "+placementapi.ConditionPlaced+" False/Unschedulable", func() (bool, string) {
		p, err := client.CoreV1().Pods(namespace).Get(context.Background(), "solo-explain-blackwell", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return hasGate(p) && placedConditionSays(p, corev1.ConditionFalse, placementapi.StatusUnschedulable, "not even when empty"),
			fmt.Sprintf("gated %v, conditions %+v", hasGate(p), p.Status.Conditions)
	})
	checkExplain(t, explainCase{target: "pod/solo-explain-blackwell", state: "waiting (gated)",
		why: []string{"Unschedulable: ", "not even when empty"}, problems: []string{problem}})
}

// TestExplainShareWithoutSharedGPU: a share of a GPU (gpu-share-quarter)
// on a cluster where no GPU is published for sharing. explain says that
// no GPU is shared and how to share one, for a Job gputopo manages and
// for a pod it does not.
func TestExplainShareWithoutSharedGPU(t *testing.T) {
	dumpOnFailure(t)
	slices, err := client.ResourceV1().ResourceSlices().List(framework.Ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slices.Items {
		for _, d := range s.Spec.Devices {
			if ptr.Deref(d.AllowMultipleAllocations, false) {
				t.Fatalf("device %s of slice %s is published for sharing: the test needs a cluster with no shared GPU", d.Name, s.Name)
			}
		}
	}
	problem := "it asks for a share of a GPU (capacity milliGPU), and no GPU is published for sharing: label a node gputopo.dev/shared-gpus=all"
	createJobFrom(t, "explain-share", 1, "gpu-share-quarter", placed(placementapi.PlacementAuto))
	waitCondition(t, "explain-share", placementapi.StatusUnschedulable, "")
	checkExplain(t, explainCase{target: "job/explain-share", state: "waiting (gated)",
		why: []string{"Unschedulable: "}, problems: []string{problem}, doc: "7. "})

	unmanagedPod(t, "plain-explain-share", "gpu-share-quarter")
	checkExplain(t, explainCase{target: "pod/plain-explain-share", state: "pending", problems: []string{problem}, doc: "7. "})
}

// TestExplainReservedDomain: a four-pod Job that insists on a leaf where
// one node is taken waits and, after --reserve-after, reserves the leaf's
// free nodes; a one-pod Job that insists on the same leaf is kept off
// them. explain says for it whose reservation holds the nodes, as does its
// condition.
func TestExplainReservedDomain(t *testing.T) {
	dumpOnFailure(t)
	leaf := fakeLeaf(t)
	occupy(t, "occupier-explain", "gpu-8-node", topo.leafNodes[leaf][0])
	job := createJob(t, "explain-reserver", 4, required(leaf))
	waitStatusReason(t, "explain-reserver", placementapi.StatusUnschedulable)
	waitEvent(t, "Job", job.Name, job.UID, corev1.EventTypeNormal, "Reserved", waitReserve)

	holder := "is reserved for " + namespace + "/job/explain-reserver since "
	createJob(t, "explain-reserved-out", 1, required(leaf))
	waitCondition(t, "explain-reserved-out", placementapi.StatusUnschedulable, holder)
	checkExplain(t, explainCase{target: "job/explain-reserved-out", state: "waiting (gated)",
		why: []string{"Unschedulable: ", "of leaf " + leaf + ") " + holder, ", until "}, doc: "2. "})
	noClaimAllocated(t, "explain-reserved-out")
}

// TestExplainGroupWaits: the waits of a group as a whole, as the guide's
// first cases show them: a Job no leaf can hold, a Job whose pods another
// controller's gate also holds (and a pod only that gate holds), and a
// gputopo.dev/group that waits for its other pods.
func TestExplainGroupWaits(t *testing.T) {
	dumpOnFailure(t)
	const queueGate = "kueue.x-k8s.io/admission"

	createJob(t, "explain-too-big", 5, placed(placementapi.PlacementSameLeaf))
	tooBig := "no leaf can hold 5 pods (8 GPUs each), not even when empty"
	waitCondition(t, "explain-too-big", placementapi.StatusUnschedulable, tooBig)
	checkExplain(t, explainCase{target: "job/explain-too-big", state: "waiting (gated)",
		why: []string{"Unschedulable: job " + namespace + "/job/explain-too-big: " + tooBig + "; best: leaf "}, doc: "1. "})

	createJobFrom(t, "explain-queued", 2, "gpu-8-node", placed(placementapi.PlacementSameLeaf), func(j *batchv1.Job) {
		j.Spec.Template.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: queueGate}}
	})
	waitCondition(t, "explain-queued", placementapi.StatusWaitingForGates, queueGate)
	checkExplain(t, explainCase{target: "job/explain-queued", state: "waiting (gated)",
		why: []string{"WaitingForGates: 2 of the group's pods are held by scheduling gate " + queueGate + " of another controller"}, doc: "3. "})
	unmanagedPod(t, "plain-explain-queued", "gpu-1", func(p *corev1.Pod) {
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: queueGate}}
	})
	checkExplain(t, explainCase{target: "pod/plain-explain-queued", state: "waiting (gated)",
		why: []string{"held by the scheduling gates " + queueGate + ": the controller that added them (a queue such as Kueue) removes them when it admits the pod"}, doc: "3. "})

	// One pod of a group of two: it waits, gated, with no condition (a
	// group's pods and claims come a moment apart, too short a wait to
	// write one).
	unmanagedPod(t, "explain-pair-0", "gpu-8-node", func(p *corev1.Pod) {
		p.Annotations = map[string]string{
			placementapi.AnnotationPlacement: string(placementapi.PlacementAuto),
			placementapi.AnnotationGroup:     "explain-pair",
			placementapi.AnnotationGroupSize: "2",
		}
	})
	checkExplain(t, explainCase{target: "pod/explain-pair-0", state: "waiting (gated)",
		why: []string{"WaitingForPods: waiting for the group's pods and their ResourceClaims to exist"}, doc: "4. "})
	p, err := client.CoreV1().Pods(namespace).Get(framework.Ctx(t), "explain-pair-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range p.Status.Conditions {
		if string(c.Type) == placementapi.ConditionPlaced {
			t.Errorf("a pod waiting for its group's other pods has condition %+v", c)
		}
	}
}
