package controller

import (
	"testing"
	"time"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/pkg/topology"
)

// A new label mapping rebuilds the tree: with a mapping that reads no
// label the nodes have no leaf and a same-leaf job waits; with the
// topograph labels back it is placed on one leaf.
func TestLabelMappingChangeRebuildsTree(t *testing.T) {
	same := map[string]string{placement.AnnotationPlacement: string(placement.PlacementSameLeaf)}
	h := newHarness(t, job("j", 2))
	h.addPod(jobPod("j", 0, "gpu-8-node", same))
	h.addPod(jobPod("j", 1, "gpu-8-node", same))
	h.settle()
	elsewhere, err := topology.ParseLabelMapping(map[string]string{"leaf": "example.com/rack", "spine": "example.com/row"})
	if err != nil {
		t.Fatal(err)
	}
	h.c.SetLabelMapping(elsewhere)
	if res, err := h.c.sync(h.ctx, "default/job/j"); err != nil || res != backoff {
		t.Fatalf("sync = %v, %v; want a backoff while no node has a leaf", res, err)
	}
	h.settle()
	if h.claim("j-0-gpus").Status.Allocation != nil || !hasGate(h.pod("j-0")) {
		t.Fatal("a same-leaf job was placed although no node has a leaf under the mapping")
	}

	h.c.SetLabelMapping(topology.DefaultLabelMapping())
	h.sync("default/job/j")
	time.Sleep(h.c.cfg.SettleDelay)
	h.sync("default/job/j")
	n0, n1 := h.allocatedNode("j-0"), h.allocatedNode("j-1")
	if leafOf(n0) == "" || leafOf(n0) != leafOf(n1) {
		t.Errorf("pods allocated on %q and %q after the mapping came back, want one leaf", n0, n1)
	}
	if d := h.pod("j-0").Annotations[placement.AnnotationDomain]; d != "leaf:leaf-0" && d != "leaf:leaf-1" {
		t.Errorf("domain %q after the mapping came back, want one leaf", d)
	}
}
