package controller

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/pkg/planner"
)

// A big group that has waited ReserveAfter keeps later small groups off
// the domain closest to fitting it, so it is placed as soon as what runs
// there ends; without the reservation a small group created after it
// takes the room and the big group starves.
//
// n0, n1 (leaf-0) and n2 (leaf-1) have one GPU taken each: only n3 is
// free. big needs two whole nodes; small, created a minute later, one.
func TestOldestWaitingGroupReservesItsDomain(t *testing.T) {
	type result struct {
		Reserved  string // the domain big reserved
		SmallNode string // where small was placed while big waited
		BigNodes  []string
	}
	run := func(t *testing.T, reserveAfter time.Duration) result {
		h := newHarness(t, foreignClaim("a", "n0", "gpu-0"), foreignClaim("b", "n1", "gpu-0"), foreignClaim("c", "n2", "gpu-0"))
		h.c.cfg.ReserveAfter = reserveAfter
		now := time.Now()
		big, small := job("big", 2), job("small", 1)
		big.CreationTimestamp = metav1.NewTime(now.Add(-time.Minute))
		small.CreationTimestamp = metav1.NewTime(now)
		h.create(big)
		for i := range 2 {
			h.addPod(jobPod("big", i, "gpu-8-node", nil))
		}
		h.settle()
		h.sync("default/job/big")
		var r result
		h.c.mu.Lock()
		if h.c.reserved != nil {
			r.Reserved = h.c.reserved.domain.String()
		}
		h.c.mu.Unlock()

		h.create(small)
		h.addPod(jobPod("small", 0, "gpu-8-node", nil))
		h.settle()
		h.sync("default/job/small")
		r.SmallNode = h.allocatedNode("small-0")

		// What ran on n2 ends.
		if err := h.client.ResourceV1().ResourceClaims("default").Delete(h.ctx, "c", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		h.eventually("the freed claim", func() bool { _, err := h.c.claims.ResourceClaims("default").Get("c"); return err != nil })
		h.sync("default/job/big")
		for _, p := range []string{"big-0", "big-1"} {
			if n := h.allocatedNode(p); n != "" {
				r.BigNodes = append(r.BigNodes, n)
			}
		}
		h.c.mu.Lock()
		if h.c.reserved != nil && len(r.BigNodes) == 2 {
			t.Errorf("the reservation of %s outlived its placement", h.c.reserved.key)
		}
		h.c.mu.Unlock()
		return r
	}
	leaf1 := planner.Domain{Level: planner.LevelLeaf, Names: []string{"leaf-1"}}.String()
	for name, tc := range map[string]struct {
		reserveAfter time.Duration
		want         result
	}{
		"reserved after waiting": {reserveAfter: 30 * time.Second, want: result{Reserved: leaf1, BigNodes: []string{"n2", "n3"}}},
		// Not waited long enough: backfill takes n3 and big still waits.
		"no reservation yet": {reserveAfter: time.Hour, want: result{SmallNode: "n3"}},
	} {
		t.Run(name, func(t *testing.T) {
			got := run(t, tc.reserveAfter)
			if len(got.BigNodes) == 2 && got.BigNodes[0] > got.BigNodes[1] {
				got.BigNodes[0], got.BigNodes[1] = got.BigNodes[1], got.BigNodes[0]
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
