package scale

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourcev1 "k8s.io/api/resource/v1"

	"github.com/gputopo/gputopo/demo/specs"
	cluster "github.com/gputopo/gputopo/test/cluster"
)

func TestParseMix(t *testing.T) {
	got, err := ParseMix("a=3, b ,c=1")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Weighted{{"a", 3}, {"b", 1}, {"c", 1}}, got); diff != "" {
		t.Errorf("ParseMix (-want +got):\n%s", diff)
	}
	for in, wantErr := range map[string]string{
		"":        "is empty",
		"a=0":     "at least 1",
		"a=x":     "whole number",
		"a=1,a=2": "listed twice",
	} {
		if _, err := ParseMix(in); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("ParseMix(%q) = %v, want an error saying %q", in, err, wantErr)
		}
	}
}

func TestSequenceInterleavesByWeight(t *testing.T) {
	got := Sequence([]Weighted{{"a", 3}, {"b", 1}, {"c", 2}}, 8)
	want := []string{"a", "b", "c", "a", "c", "a", "a", "b"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Sequence (-want +got):\n%s", diff)
	}
}

func TestTopologyAndCountAskForTheSameGPUs(t *testing.T) {
	mix := []Weighted{{"gpu-4-nvlink", 1}, {"gpu-2-nvlink-pair", 1}, {"gpu-8-node", 1}, {LeafTemplate, 1}}
	topo, count, err := TopologyAndCount(mix, 9, []string{"leaf-0", "leaf-7"})
	if err != nil {
		t.Fatal(err)
	}
	wantTopo := []string{"gpu-4-nvlink", "gpu-2-nvlink-pair", "gpu-8-node", "gpu-4-leaf-leaf-0",
		"gpu-4-nvlink", "gpu-2-nvlink-pair", "gpu-8-node", "gpu-4-leaf-leaf-7", "gpu-4-nvlink"}
	if diff := cmp.Diff(wantTopo, topo.Pods); diff != "" {
		t.Errorf("topology pods (-want +got):\n%s", diff)
	}
	wantCount := []string{"gpu-count-4", "gpu-count-2", "gpu-count-8", "gpu-count-4",
		"gpu-count-4", "gpu-count-2", "gpu-count-8", "gpu-count-4", "gpu-count-4"}
	if diff := cmp.Diff(wantCount, count.Pods); diff != "" {
		t.Errorf("count-only pods (-want +got):\n%s", diff)
	}
	if topo.GPUs != 40 || count.GPUs != 40 {
		t.Errorf("GPUs asked: topology %d, count-only %d, want 40 each", topo.GPUs, count.GPUs)
	}

	tmpls := map[string]*resourcev1.ResourceClaimTemplate{}
	for _, tm := range append(topo.Templates, count.Templates...) {
		tmpls[tm.Name] = tm
	}
	for _, name := range append(wantTopo, wantCount...) {
		if tmpls[name] == nil {
			t.Errorf("pods use template %s, which the plan does not create", name)
		}
	}
	leaf7 := tmpls["gpu-4-leaf-leaf-7"].Spec.Spec.Devices.Requests[0].Exactly.Selectors[0].CEL.Expression
	if !strings.Contains(leaf7, `"leaf-7"`) || strings.Contains(leaf7, `"leaf-0"`) {
		t.Errorf("leaf-7 template selects %q, want leaf-7 only", leaf7)
	}
	c8 := tmpls["gpu-count-8"].Spec.Spec.Devices
	if c8.Requests[0].Exactly.Count != 8 || len(c8.Constraints) > 0 || len(c8.Requests[0].Exactly.Selectors) > 0 {
		t.Errorf("gpu-count-8 = %+v, want 8 devices with no selector or constraint", c8)
	}
	// The demo templates themselves are not changed by the copies.
	demo, err := specs.ClaimTemplate(LeafTemplate)
	if err != nil {
		t.Fatal(err)
	}
	if e := demo.Spec.Spec.Devices.Requests[0].Exactly.Selectors[0].CEL.Expression; !strings.Contains(e, leafInDemo) {
		t.Errorf("demo leaf template reads %q after planning", e)
	}
}

func TestTopologyAndCountErrors(t *testing.T) {
	if _, _, err := TopologyAndCount([]Weighted{{"no-such-template", 1}}, 1, nil); err == nil || !strings.Contains(err.Error(), "no-such-template") {
		t.Errorf("unknown template: err = %v, want one naming it", err)
	}
	if _, _, err := TopologyAndCount([]Weighted{{LeafTemplate, 1}}, 1, nil); err == nil || !strings.Contains(err.Error(), "leaves") {
		t.Errorf("leaf template without leaves: err = %v, want one saying leaves are needed", err)
	}
}

func TestClaimGPUs(t *testing.T) {
	for name, want := range map[string]int{"gpu-1": 1, "gpu-2-nvlink-pair": 2, "gpu-4-nvlink": 4, "gpu-8-node": 8} {
		tm, err := specs.ClaimTemplate(name)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := ClaimGPUs(tm); err != nil || got != want {
			t.Errorf("ClaimGPUs(%s) = %d, %v; want %d", name, got, err, want)
		}
	}
	all := &resourcev1.ResourceClaimTemplate{}
	all.Name = "all"
	all.Spec.Spec.Devices.Requests = []resourcev1.DeviceRequest{{Name: "r", Exactly: &resourcev1.ExactDeviceRequest{AllocationMode: resourcev1.DeviceAllocationModeAll}}}
	if _, err := ClaimGPUs(all); err == nil {
		t.Error("ClaimGPUs(allocation mode All) succeeded, want an error")
	}
}

func TestLeafNodeSelectorEntry(t *testing.T) {
	topo, count, err := TopologyAndCount([]Weighted{{LeafNodeSelector, 1}, {"gpu-2-nvlink-pair", 1}}, 4, []string{"leaf-0", "leaf-1"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"gpu-count-4", "gpu-2-nvlink-pair", "gpu-count-4", "gpu-2-nvlink-pair"}, topo.Pods); diff != "" {
		t.Errorf("topology pods (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"leaf-0", "", "leaf-1", ""}, topo.Leaves); diff != "" {
		t.Errorf("topology pods' leaves (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"", "", "", ""}, count.Leaves); diff != "" {
		t.Errorf("count-only pods' leaves (-want +got):\n%s", diff)
	}
	pod := NewPod("p", "topology", topo.Pods[2], topo.Leaves[2])
	if diff := cmp.Diff(map[string]string{cluster.LabelLeaf: "leaf-1"}, pod.Spec.NodeSelector); diff != "" {
		t.Errorf("nodeSelector (-want +got):\n%s", diff)
	}
	if _, _, err := TopologyAndCount([]Weighted{{LeafNodeSelector, 1}}, 1, nil); err == nil {
		t.Errorf("%s without leaves succeeded", LeafNodeSelector)
	}
}
