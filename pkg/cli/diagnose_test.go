package cli_test

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/demo/specs"
	"github.com/gputopo/gputopo/pkg/cli"
	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/topology"
)

// waitCase is the fixture cluster with Ready nodes, the demo's
// DeviceClass, and one pod ml/p that asks for the claim "gpus".
type waitCase struct {
	f    fixture
	pod  v1.Pod
	objs []runtime.Object
}

func newWaitCase(t *testing.T) *waitCase {
	t.Helper()
	w := &waitCase{f: newFixture(t)}
	for i := range w.f.nodes {
		w.f.nodes[i].Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}
	}
	class, err := specs.DeviceClass()
	if err != nil {
		t.Fatal(err)
	}
	w.objs = append(w.objs, class)
	w.pod = v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "p"}}
	w.pod.Spec.Containers = []v1.Container{{Name: "c", Image: "x", Resources: v1.ResourceRequirements{Claims: []v1.ResourceClaim{{Name: "gpus"}}}}}
	w.pod.Status.Phase = v1.PodPending
	return w
}

// fromTemplate gives the pod the claim "gpus" from the demo template name,
// created by the resource claim controller as p-gpus; mutate edits the
// claim.
func (w *waitCase) fromTemplate(t *testing.T, name string, mutate func(*resourceapi.ResourceClaim)) {
	t.Helper()
	tmpl, err := specs.ClaimTemplate(name)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.Namespace = "ml"
	w.objs = append(w.objs, tmpl)
	c := devicefit.ClaimFromTemplate(tmpl, "p-gpus")
	c.UID = types.UID("p-gpus-uid")
	if mutate != nil {
		mutate(c)
	}
	w.objs = append(w.objs, c)
	w.pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: ptr.To(name)}}
	w.pod.Status.ResourceClaimStatuses = []v1.PodResourceClaimStatus{{Name: "gpus", ResourceClaimName: ptr.To("p-gpus")}}
}

func (w *waitCase) event(reason, typ, component, msg string) {
	w.objs = append(w.objs, &v1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "p." + strings.ToLower(reason)},
		InvolvedObject: v1.ObjectReference{Kind: "Pod", Namespace: "ml", Name: "p"}, Reason: reason, Type: typ, Message: msg,
		Source: v1.EventSource{Component: component}})
}

// explain runs explain pod/p and returns the pod's plan and the text.
func (w *waitCase) explain(t *testing.T) (cli.PodPlan, string) {
	t.Helper()
	c := w.f.client(append([]runtime.Object{&w.pod}, w.objs...)...)
	e, err := cli.FetchExplanation(context.Background(), c, "ml", false, cli.Target{Kind: placement.GroupKindPod, Name: "p"})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := cli.RenderExplanation(&out, *e, cli.TreeOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("explain pod/p:\n%s", out.String())
	if len(e.Pods) != 1 {
		t.Fatalf("explain found %d pods, want 1", len(e.Pods))
	}
	return e.Pods[0], out.String()
}

func wantLines(t *testing.T, text string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Errorf("explanation lacks %q:\n%s", w, text)
		}
	}
}

func TestExplainUnmanagedMissingTemplate(t *testing.T) {
	w := newWaitCase(t)
	w.pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: ptr.To("gpu-one")}}
	w.event(cli.EventFailedResourceClaimCreation, v1.EventTypeWarning, "resource_claim",
		`PodResourceClaim gpus: resource claim template "gpu-one": resourceclaimtemplate.resource.k8s.io "gpu-one" not found`)
	p, text := w.explain(t)
	if p.State != cli.StatePending {
		t.Errorf("state %q, want %q", p.State, cli.StatePending)
	}
	wantLines(t, text,
		"p                                pending          node=-\n",
		`problem: ResourceClaimTemplate ml/gpu-one, which the pod's claim "gpus" names, does not exist: create it in namespace ml`,
		"spec.resourceClaims[0].resourceClaimTemplateName")
}

func TestExplainUnmanagedMissingNamedClaim(t *testing.T) {
	w := newWaitCase(t)
	w.pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To("shared-gpus")}}
	_, text := w.explain(t)
	wantLines(t, text, `problem: ResourceClaim ml/shared-gpus, which the pod's claim "gpus" names, does not exist`)
}

func TestExplainSelectorNamesUnknownAttribute(t *testing.T) {
	w := newWaitCase(t)
	w.fromTemplate(t, "gpu-1", func(c *resourceapi.ResourceClaim) {
		c.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.attributes["gpu.gputopo.dev"].nvlinkDomian == "x"`}}}
	})
	w.event(cli.EventFailedScheduling, v1.EventTypeWarning, "default-scheduler",
		"0/4 nodes are available: 4 cannot allocate all claims.")
	_, text := w.explain(t)
	wantLines(t, text,
		"      why: 0/4 nodes are available: 4 cannot allocate all claims.\n",
		"problem: claim p-gpus cannot be allocated on any node: its selector names the attribute gpu.gputopo.dev/nvlinkDomian, which no device has")
}

func TestExplainSelectorMatchesNothing(t *testing.T) {
	w := newWaitCase(t)
	w.fromTemplate(t, "gpu-1", func(c *resourceapi.ResourceClaim) {
		c.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.attributes["gpu.gputopo.dev"].architecture == "blackwell"`}}}
	})
	_, text := w.explain(t)
	wantLines(t, text,
		`problem: claim p-gpus fits on none of the 3 nodes with devices even with every device free: no device matches its selectors (device.attributes["gpu.gputopo.dev"].architecture == "blackwell")`)
}

func TestExplainShareWithoutSharedGPUs(t *testing.T) {
	w := newWaitCase(t)
	w.fromTemplate(t, "gpu-share-half", nil)
	_, text := w.explain(t)
	wantLines(t, text, "it asks for a share of a GPU (capacity milliGPU), and no GPU is published for sharing: label a node gputopo.dev/shared-gpus=all")
}

func TestExplainDeviceTaintRule(t *testing.T) {
	w := newWaitCase(t)
	w.fromTemplate(t, "gpu-1", nil)
	w.objs = append(w.objs, &resourceapi.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: "maintenance"},
		Spec: resourceapi.DeviceTaintRuleSpec{DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: ptr.To(topology.DriverName)},
			Taint: resourceapi.DeviceTaint{Key: "example.com/maintenance", Effect: resourceapi.DeviceTaintEffectNoSchedule}}})
	_, text := w.explain(t)
	wantLines(t, text, "carry taints it does not tolerate: example.com/maintenance:NoSchedule (DeviceTaintRule maintenance)")
}

func TestExplainNodeTaintsAndNotReady(t *testing.T) {
	w := newWaitCase(t)
	w.fromTemplate(t, "gpu-1", nil)
	w.f.nodes[0].Spec.Taints = []v1.Taint{{Key: "example.com/drain", Effect: v1.TaintEffectNoSchedule}}
	w.f.nodes[1].Spec.Taints = []v1.Taint{{Key: "example.com/drain", Effect: v1.TaintEffectNoSchedule}}
	w.f.nodes[2].Status.Conditions[0].Status = v1.ConditionFalse
	_, text := w.explain(t)
	wantLines(t, text, "problem: the pod's claims fit on nodes a1, a2, b1, but the pod may not run there: 1 NotReady, 2 with untolerated taint example.com/drain:NoSchedule")
}

func TestExplainDevicesTaken(t *testing.T) {
	w := newWaitCase(t)
	w.fromTemplate(t, "gpu-8-node", nil)
	// Hold a GPU on every node: no node has 8 free.
	w.f.claims = append(w.f.claims, allocated("ml", "other", "other", "a2", "gpu-0"))
	w.f.claims[1] = allocated("ml", "solo-gpus", "solo", "b1", "gpu-0")
	_, text := w.explain(t)
	wantLines(t, text, "problem: claim p-gpus fits on ", "when their devices are free, but other claims hold all the devices it matches there now")
}

func TestExplainDevicesFitSchedulerDecides(t *testing.T) {
	w := newWaitCase(t)
	w.fromTemplate(t, "gpu-1", nil)
	w.event(cli.EventFailedScheduling, v1.EventTypeWarning, "default-scheduler", "0/4 nodes are available: 4 Insufficient cpu.")
	_, text := w.explain(t)
	wantLines(t, text, "why: 0/4 nodes are available: 4 Insufficient cpu.", "what stops it is not its devices")
}

func TestExplainOtherGates(t *testing.T) {
	w := newWaitCase(t)
	w.fromTemplate(t, "gpu-1", nil)
	w.pod.Spec.SchedulingGates = []v1.PodSchedulingGate{{Name: "kueue.x-k8s.io/admission"}}
	p, text := w.explain(t)
	if p.State != cli.StateGated {
		t.Errorf("state %q, want %q", p.State, cli.StateGated)
	}
	wantLines(t, text, "why: held by the scheduling gates kueue.x-k8s.io/admission: the controller that added them (a queue such as Kueue) removes them")
}

func TestExplainManagedWaitingForClaimsShowsCreationFailure(t *testing.T) {
	w := newWaitCase(t)
	w.pod.Spec.SchedulingGates = []v1.PodSchedulingGate{{Name: placement.SchedulingGate}}
	w.pod.Annotations = map[string]string{placement.AnnotationStatus: placement.Status{Reason: placement.StatusWaitingForPods,
		Message: placement.WaitingForPodsMessage}.Format()}
	w.pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: ptr.To("gpu-one")}}
	msg := `PodResourceClaim gpus: resource claim template "gpu-one": resourceclaimtemplate.resource.k8s.io "gpu-one" not found`
	w.event(cli.EventFailedResourceClaimCreation, v1.EventTypeWarning, "resource_claim", msg)
	_, text := w.explain(t)
	wantLines(t, text, "      why: "+msg+"\n", "problem: ResourceClaimTemplate ml/gpu-one")
}

func TestExplainBoundNotStarting(t *testing.T) {
	w := newWaitCase(t)
	w.pod.Spec.NodeName = "a1"
	w.event("DeviceConflict", v1.EventTypeWarning, "gputopo-controller", "device gpu-0 of claim p-gpus is also in claim q-gpus; deleting the pod")
	p, text := w.explain(t)
	if p.State != cli.StateStarting {
		t.Errorf("state %q, want %q", p.State, cli.StateStarting)
	}
	wantLines(t, text, "why: DeviceConflict: device gpu-0 of claim p-gpus is also in claim q-gpus")
}

func TestExplainEveryPendingPodOfAJobNamesItsOwnClaim(t *testing.T) {
	w := newWaitCase(t)
	w.fromTemplate(t, "gpu-share-half", nil)
	w.pod.Labels = map[string]string{"batch.kubernetes.io/job-name": "sweep"}
	q := w.pod.DeepCopy()
	q.Name = "q"
	q.Status.ResourceClaimStatuses = []v1.PodResourceClaimStatus{{Name: "gpus", ResourceClaimName: ptr.To("q-gpus")}}
	qc := w.objs[len(w.objs)-1].(*resourceapi.ResourceClaim).DeepCopy()
	qc.Name, qc.UID = "q-gpus", "q-gpus-uid"
	c := w.f.client(append([]runtime.Object{&w.pod, q, qc}, w.objs...)...)
	e, err := cli.FetchExplanation(context.Background(), c, "ml", false, cli.Target{Kind: placement.GroupKindJob, Name: "sweep"})
	if err != nil {
		t.Fatal(err)
	}
	if len(e.Pods) != 2 {
		t.Fatalf("explain found %d pods, want 2", len(e.Pods))
	}
	for _, p := range e.Pods {
		if len(p.Problems) != 1 || !strings.HasPrefix(p.Problems[0], "claim "+p.Name+"-gpus fits on none") {
			t.Errorf("pod %s: problems %q, want one about claim %s-gpus", p.Name, p.Problems, p.Name)
		}
	}
}

// gatedByGputopo makes the pod one that gputopo holds with status st.
func (w *waitCase) gatedByGputopo(st placement.Status) {
	w.pod.Spec.SchedulingGates = []v1.PodSchedulingGate{{Name: placement.SchedulingGate}}
	w.pod.Annotations = map[string]string{placement.AnnotationStatus: st.Format()}
}

// A pod gputopo holds gets, beside the controller's reason, what the
// allocator says of each of its claims on the live devices: here a share
// of a GPU while no GPU is shared, which the controller can only report
// as a domain that cannot hold the pod.
func TestExplainManagedShareWithoutSharedGPUs(t *testing.T) {
	w := newWaitCase(t)
	w.fromTemplate(t, "gpu-share-half", nil)
	reason := "no node can hold 1 pod (1 × gpu.gputopo.dev each), not even when empty"
	w.gatedByGputopo(placement.Status{Reason: placement.StatusUnschedulable, Message: reason})
	p, text := w.explain(t)
	if p.State != cli.StateGated {
		t.Errorf("state %q, want %q", p.State, cli.StateGated)
	}
	wantLines(t, text,
		"      why: Unschedulable: "+reason+"\n",
		"problem: claim p-gpus fits on none of the 3 nodes with devices even with every device free: it asks for a share of a GPU (capacity milliGPU), and no GPU is published for sharing")
}

func TestExplainManagedSelectorMatchesNothing(t *testing.T) {
	w := newWaitCase(t)
	w.fromTemplate(t, "gpu-1", func(c *resourceapi.ResourceClaim) {
		c.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.attributes["gpu.gputopo.dev"].architecture == "blackwell"`}}}
	})
	w.gatedByGputopo(placement.Status{Reason: placement.StatusUnschedulable, Message: "no node can hold 1 pod, not even when empty"})
	_, text := w.explain(t)
	wantLines(t, text, `problem: claim p-gpus fits on none of the 3 nodes with devices even with every device free: no device matches its selectors (device.attributes["gpu.gputopo.dev"].architecture == "blackwell")`)
}

func TestExplainManagedSelectorNamesUnknownAttribute(t *testing.T) {
	w := newWaitCase(t)
	w.fromTemplate(t, "gpu-1", func(c *resourceapi.ResourceClaim) {
		c.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.attributes["gpu.gputopo.dev"].nvlinkDomian == "x"`}}}
	})
	w.gatedByGputopo(placement.Status{Reason: placement.StatusInvalidClaim, Message: "job ml/job/p: claims of pod p cannot be evaluated on node a1: no such key: nvlinkDomian"})
	_, text := w.explain(t)
	wantLines(t, text, "problem: claim p-gpus cannot be allocated on any node: its selector names the attribute gpu.gputopo.dev/nvlinkDomian, which no device has")
}

func TestExplainManagedDevicesTaken(t *testing.T) {
	w := newWaitCase(t)
	w.fromTemplate(t, "gpu-8-node", nil)
	w.f.claims = append(w.f.claims, allocated("ml", "other", "other", "a2", "gpu-0"))
	w.f.claims[1] = allocated("ml", "solo-gpus", "solo", "b1", "gpu-0")
	w.gatedByGputopo(placement.Status{Reason: placement.StatusUnschedulable, Message: "no node can hold 1 pod (8 GPUs each)"})
	_, text := w.explain(t)
	wantLines(t, text, "problem: claim p-gpus fits on ", "when their devices are free, but other claims hold all the devices it matches there now")
}

// When the controller's reason is the whole story (the group is too big
// for the free domains, each pod's claim fits a node on its own), explain
// adds no problem.
func TestExplainManagedClaimsFitNoProblem(t *testing.T) {
	w := newWaitCase(t)
	w.fromTemplate(t, "gpu-8-node", nil)
	w.gatedByGputopo(placement.Status{Reason: placement.StatusUnschedulable, Message: "no leaf can hold 4 pods (8 GPUs each)"})
	p, _ := w.explain(t)
	if len(p.Problems) != 0 {
		t.Errorf("problems %q for a pod whose claim fits", p.Problems)
	}
}

func TestExplainManagedMissingTemplate(t *testing.T) {
	w := newWaitCase(t)
	w.pod.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: ptr.To("gpu-one")}}
	w.gatedByGputopo(placement.Status{Reason: placement.StatusInvalidClaim,
		Message: `pod p: its claim "gpus" names ResourceClaimTemplate ml/gpu-one, which does not exist`})
	_, text := w.explain(t)
	wantLines(t, text,
		`why: InvalidClaim: pod p: its claim "gpus" names ResourceClaimTemplate ml/gpu-one, which does not exist`,
		`problem: ResourceClaimTemplate ml/gpu-one, which the pod's claim "gpus" names, does not exist: create it in namespace ml`)
}
