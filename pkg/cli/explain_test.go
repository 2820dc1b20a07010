package cli_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/demo/specs"
	"github.com/gputopo/gputopo/pkg/cli"
	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/topology"
)

// ladderClaim is the demo's 4-GPU ladder claim of pod, allocated on node
// with the subrequest rung.
func ladderClaim(t *testing.T, pod, node, rung string, devices ...string) resourceapi.ResourceClaim {
	t.Helper()
	tmpl, err := specs.ClaimTemplate("gpu-4-ladder")
	if err != nil {
		t.Fatal(err)
	}
	c := devicefit.ClaimFromTemplate(tmpl, pod+"-gpus")
	c.Namespace = "ml"
	c.Status.Allocation = &resourceapi.AllocationResult{NodeSelector: &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
		MatchFields: []v1.NodeSelectorRequirement{{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{node}}}}}}}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "gpus/" + rung, Driver: topology.DriverName, Pool: node, Device: d})
	}
	return *c
}

func jobPod(name, node string, gated bool) v1.Pod {
	p := v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: name,
		Annotations: map[string]string{placement.AnnotationDomain: "leaf:leaf-0"}}}
	p.Spec.NodeName = node
	if gated {
		p.Spec.NodeName = ""
		p.Spec.SchedulingGates = []v1.PodSchedulingGate{{Name: placement.SchedulingGate}}
		p.Annotations = map[string]string{placement.AnnotationStatus: "no leaf has room"}
	}
	p.Status.ResourceClaimStatuses = []v1.PodResourceClaimStatus{{Name: "gpus", ResourceClaimName: ptr.To(name + "-gpus")}}
	return p
}

func TestExplainShowsRungs(t *testing.T) {
	pods := []v1.Pod{jobPod("train-1", "b", false), jobPod("train-0", "a", false), jobPod("train-2", "", true)}
	claims := []resourceapi.ResourceClaim{
		ladderClaim(t, "train-0", "a", "nvlink", "gpu-0", "gpu-1", "gpu-2", "gpu-3"),
		ladderClaim(t, "train-1", "b", "numa", "gpu-4", "gpu-5", "gpu-6", "gpu-7"),
	}
	at := metav1.NewTime(time.Date(2026, 11, 23, 9, 30, 0, 0, time.UTC))
	events := []v1.Event{
		{Reason: "Placed", Type: "Normal", Message: "leaf leaf-0", LastTimestamp: at, Source: v1.EventSource{Component: "gputopo-controller"}},
		{Reason: "Scheduled", Type: "Normal", Message: "by the scheduler", LastTimestamp: at, Source: v1.EventSource{Component: "default-scheduler"}},
	}
	e := cli.BuildExplanation("ml/train", pods, claims, events)
	want := cli.Explanation{
		Group:   "ml/train",
		Domains: []string{"leaf:leaf-0"},
		Pods: []cli.PodPlan{
			{Name: "train-0", State: "placed", Node: "a", Claims: []cli.ClaimPlan{{Claim: "train-0-gpus", Request: "gpus", Rung: "nvlink", RungIndex: 1, Rungs: 4, Node: "a", Devices: []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}}}},
			{Name: "train-1", State: "placed", Node: "b", Claims: []cli.ClaimPlan{{Claim: "train-1-gpus", Request: "gpus", Rung: "numa", RungIndex: 3, Rungs: 4, Node: "b", Devices: []string{"gpu-4", "gpu-5", "gpu-6", "gpu-7"}}}},
			{Name: "train-2", State: "waiting (gated)", Why: "no leaf has room"},
		},
		Decisions: []cli.Decision{{Time: at.Time, Type: "Normal", Reason: "Placed", Message: "leaf leaf-0"}},
	}
	if diff := cmp.Diff(want, e); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	var out strings.Builder
	if err := cli.RenderExplanation(&out, e, cli.TreeOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{
		"      gpus → nvlink (1st choice of 4): 4 GPUs\n",
		"      gpus → numa (3rd choice of 4): 4 GPUs\n",
		"      why: no leaf has room\n",
		"domain: leaf:leaf-0\n",
		"  09:30:00 Normal Placed: leaf leaf-0\n",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("explanation lacks %q:\n%s", line, out.String())
		}
	}
}
