package controller

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
)

// A pod planned again after it was sent to a node and did not bind there
// (its gate open, no node, gputopo.dev/node naming the planned one) is
// planned off that node: what kept it off may be something the planner
// does not weigh, such as inter-pod anti-affinity, and planning it there
// again would only repeat the refusal. A pod still gated, or one never
// planned, keeps every node.
func TestReplanLeavesTheRefusedNodeOut(t *testing.T) {
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default", UID: "c"}}
	pod := func(gated bool, planned string) *v1.Pod {
		p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", Annotations: map[string]string{}}}
		if gated {
			p.Spec.SchedulingGates = []v1.PodSchedulingGate{{Name: placement.SchedulingGate}}
		}
		if planned != "" {
			p.Annotations[placement.AnnotationNode] = planned
		}
		// The pod's own affinity is kept beside the refused node.
		p.Spec.Affinity = &v1.Affinity{NodeAffinity: &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{
			NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{{Key: "leaf", Operator: v1.NodeSelectorOpIn, Values: []string{"leaf-0"}}}}},
		}}}
		return p
	}
	node := func(name, leaf string) *v1.Node {
		return &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"leaf": leaf}}}
	}
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
		want map[string]bool
	}{
		{"sent to n0, not bound: planned off n0", pod(false, "n0"), map[string]bool{"n0": false, "n1": true, "n2": false}},
		{"still gated: every node of its leaf", pod(true, "n0"), map[string]bool{"n0": true, "n1": true, "n2": false}},
		{"never planned: every node of its leaf", pod(false, ""), map[string]bool{"n0": true, "n1": true, "n2": false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			units := planUnits([]*member{{pod: tc.pod, claims: []*resourceapi.ResourceClaim{claim}}})
			if len(units) != 1 {
				t.Fatalf("%d units, want 1", len(units))
			}
			p := units[0].pod()
			sel, err := nodeaffinity.NewNodeSelector(p.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution)
			if err != nil {
				t.Fatal(err)
			}
			for n, want := range tc.want {
				leaf := "leaf-0"
				if n == "n2" {
					leaf = "leaf-1"
				}
				if got := sel.Match(node(n, leaf)); got != want {
					t.Errorf("node %s may be used: %v, want %v", n, got, want)
				}
			}
		})
	}
}
