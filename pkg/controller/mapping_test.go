package controller

import (
	"testing"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/pkg/topology"
)

// A new label mapping rebuilds the tree: with a mapping that reads no
// label the nodes have no leaf and a same-leaf job waits; with the
// topograph labels back it is placed on one leaf.
func TestLabelMappingChangeRebuildsTree(t *testing.T) {
	same := map[string]string{placement.AnnotationPlacement: placement.PlacementSameLeaf}
	h := newHarness(t, job("j", 2), jobPod("j", 0, "gpu-8-node", same), jobPod("j", 1, "gpu-8-node", same))
	elsewhere, err := topology.ParseLabelMapping(map[string]string{"leaf": "example.com/rack", "spine": "example.com/row"})
	if err != nil {
		t.Fatal(err)
	}
	h.c.SetLabelMapping(elsewhere)
	h.sync("default/job/j", 2)
	if p := h.pod("j-0"); !hasGate(p) || pinnedNode(p) != "" {
		t.Fatal("a same-leaf job was placed although no node has a leaf under the mapping")
	}

	h.c.SetLabelMapping(topology.DefaultLabelMapping())
	h.sync("default/job/j", 2)
	if d := h.pod("j-0").Annotations[placement.AnnotationDomain]; d != "leaf:leaf-0" && d != "leaf:leaf-1" {
		t.Errorf("domain %q after the mapping came back, want one leaf", d)
	}
}
