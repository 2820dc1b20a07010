package controller

import (
	"fmt"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	specs "github.com/gputopo/gputopo/demo/specs"
)

const extGPU = v1.ResourceName("gputopo.dev/gpu")

// extClass is the chart's DeviceClass with extendedResourceName set.
func extClass(t *testing.T) *resourceapi.DeviceClass {
	dc, err := specs.DeviceClass()
	if err != nil {
		t.Fatal(err)
	}
	dc.Name = "gpu-ext.gputopo.dev"
	dc.Spec.ExtendedResourceName = ptr.To(string(extGPU))
	return dc
}

// extPod is a gated Job pod that asks for n GPUs as an extended resource
// and has no claim.
func extPod(jobName string, i int, n int64) *v1.Pod {
	p := jobPod(jobName, i, "unused", nil)
	p.Spec.ResourceClaims = nil
	q := *resource.NewQuantity(n, resource.DecimalSI)
	p.Spec.Containers[0].Resources = v1.ResourceRequirements{Limits: v1.ResourceList{extGPU: q}, Requests: v1.ResourceList{extGPU: q}}
	return p
}

// Pods that ask for GPUs as a DRA extended resource are planned like pods
// with claims: the devices must fit, the nodes' allocatable (which has no
// gputopo.dev/gpu) is not checked for them, and kube-scheduler allocates
// them, within the group's domain.
func TestExtendedResourcePodsArePlannedAndTheSchedulerAllocates(t *testing.T) {
	h := newHarness(t, extClass(t), job("ext", 2))
	for i := range 2 {
		h.create(extPod("ext", i, 8))
	}
	h.place("default/job/ext")
	var nodes []string
	for i := range 2 {
		p := h.pod(fmt.Sprintf("ext-%d", i))
		if hasGate(p) {
			t.Fatalf("%s still gated: %s", p.Name, p.Annotations[placement.AnnotationStatus])
		}
		d, err := placement.ParseDomain(p.Annotations[placement.AnnotationDomain])
		if err != nil || d.Level != placement.LevelLeaf {
			t.Errorf("%s domain %q, want a leaf", p.Name, p.Annotations[placement.AnnotationDomain])
		}
		req := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
		if req == nil || !strings.Contains(fmt.Sprint(req), v1.LabelHostname) {
			t.Errorf("%s not held to its domain by node affinity: %v", p.Name, req)
		}
		nodes = append(nodes, p.Annotations[placement.AnnotationNode])
	}
	if nodes[0] == nodes[1] || leafOf(nodes[0]) != leafOf(nodes[1]) {
		t.Errorf("8-GPU pods planned on %v; want two nodes of one leaf", nodes)
	}
	claims, err := h.client.ResourceV1().ResourceClaims("").List(h.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(claims.Items) != 0 {
		t.Errorf("the controller wrote %d claims; kube-scheduler creates the extended resource claim", len(claims.Items))
	}
}

// A group whose extended-resource devices fit in no leaf is refused for
// the devices, not for the nodes' allocatable.
func TestExtendedResourceGroupThatCannotFitSaysWhy(t *testing.T) {
	h := newHarness(t, extClass(t), job("big", 3))
	for i := range 3 {
		p := extPod("big", i, 8)
		p.Annotations[placement.AnnotationPlacement] = string(placement.PlacementSameLeaf)
		h.create(p)
	}
	h.place("default/job/big")
	p := h.pod("big-0")
	status := p.Annotations[placement.AnnotationStatus]
	if !hasGate(p) || !strings.Contains(status, ReasonUnschedulable) {
		t.Fatalf("gated %v, status %q; want refused", hasGate(p), status)
	}
	if strings.Contains(status, string(extGPU)) {
		t.Errorf("status %q counts %s against the nodes' allocatable", status, extGPU)
	}
}
