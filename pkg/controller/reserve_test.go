package controller

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
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
		Recorded  string // domain and nodes of big's pods' reservation annotation
		SmallNode string // where small was placed while big waited
		BigNodes  []string
		Left      []string // big's pods that still carry the annotation once placed
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
			r.Reserved = h.c.reserved.hold.Domain.String()
		}
		h.c.mu.Unlock()
		if v, ok := h.pod("big-0").Annotations[placement.AnnotationReservation]; ok {
			res, err := placement.ParseReservation(v)
			if err != nil {
				t.Fatalf("big-0's reservation annotation: %v", err)
			}
			if !res.Active(time.Now()) {
				t.Errorf("big-0's reservation ends at %s, already past", res.Until)
			}
			r.Recorded = res.Domain.Format() + " " + strings.Join(res.Nodes, ",")
		}

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
		if len(r.BigNodes) == 2 {
			// The gates open: the pods no longer wait for the reservation.
			h.place("default/job/big")
			for _, p := range []string{"big-0", "big-1"} {
				if _, ok := h.pod(p).Annotations[placement.AnnotationReservation]; ok {
					r.Left = append(r.Left, p)
				}
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
		"reserved after waiting": {reserveAfter: 30 * time.Second, want: result{Reserved: leaf1, Recorded: "leaf:leaf-1 n3,n2", BigNodes: []string{"n2", "n3"}}},
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

func TestWaitOrder(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	for name, tc := range map[string]struct {
		pending map[string]waiting
		want    []string
	}{
		"oldest first in one namespace": {
			pending: map[string]waiting{"a/job/late": {created: at(2)}, "a/job/early": {created: at(0)}, "a/job/mid": {created: at(1)}},
			want:    []string{"a/job/early", "a/job/mid", "a/job/late"},
		},
		"higher priority first, however young": {
			pending: map[string]waiting{"a/job/old": {created: at(0)}, "b/job/urgent": {created: at(9), priority: 1000}},
			want:    []string{"b/job/urgent", "a/job/old"},
		},
		// team-a submitted three groups before team-b's first: the
		// namespaces take turns, so team-b does not wait behind them all.
		"namespaces take turns": {
			pending: map[string]waiting{
				"team-a/job/a1": {created: at(0)}, "team-a/job/a2": {created: at(1)}, "team-a/job/a3": {created: at(2)},
				"team-b/job/b1": {created: at(3)}, "team-b/job/b2": {created: at(4)},
			},
			want: []string{"team-a/job/a1", "team-b/job/b1", "team-a/job/a2", "team-b/job/b2", "team-a/job/a3"},
		},
		"turns within each priority": {
			pending: map[string]waiting{
				"x/job/low": {created: at(0)}, "y/job/high1": {created: at(1), priority: 10}, "y/job/high2": {created: at(2), priority: 10},
				"z/job/high": {created: at(3), priority: 10},
			},
			want: []string{"y/job/high1", "z/job/high", "y/job/high2", "x/job/low"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, waitOrder(tc.pending)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// A big group that can never fit in the time it reserves gives the next
// waiting group its turn; meanwhile, groups that fit outside the reserved
// nodes are placed, and a group that fits only on them is told whose they
// are.
func TestReservationIsBoundedAndSaysWhoHoldsIt(t *testing.T) {
	// n0 and n1 have one GPU taken each, n2 and n3 are free. big needs
	// three whole nodes of one spine: it reserves the three emptiest.
	h := newHarness(t, foreignClaim("a", "n0", "gpu-0"), foreignClaim("b", "n1", "gpu-0"))
	h.c.cfg.ReserveAfter = time.Second
	h.c.cfg.ReservationTimeout = time.Hour
	old := time.Now().Add(-time.Minute)
	big := job("big", 3)
	big.CreationTimestamp = metav1.NewTime(old)
	h.create(big)
	for i := range 3 {
		h.addPod(jobPod("big", i, "gpu-8-node", nil))
	}
	h.settle()
	h.sync("default/job/big")
	h.c.mu.Lock()
	r := h.c.reserved
	h.c.mu.Unlock()
	if r == nil || r.key != "default/job/big" {
		t.Fatalf("reservation %v, want one for default/job/big", r)
	}
	if diff := cmp.Diff([]string{"n2", "n3", "n0"}, r.hold.Nodes); diff != "" {
		t.Errorf("reserved nodes (-want +got):\n%s", diff)
	}
	// A one-GPU group fits on n1, outside the reservation.
	h.create(job("one", 1))
	h.addPod(jobPod("one", 0, "gpu-1", nil))
	h.place("default/job/one")
	if n := h.allocatedNode("one-0"); n != "n1" {
		t.Errorf("one-GPU group allocated on %q, want n1, the node the reservation leaves open", n)
	}
	// A whole-node group fits only on reserved nodes: it is told so.
	h.create(job("node", 1))
	h.addPod(jobPod("node", 0, "gpu-8-node", nil))
	h.sync("default/job/node")
	st, _ := placement.ParseStatus(h.pod("node-0").Annotations[placement.AnnotationStatus])
	if !strings.Contains(st.Message, "reserved for default/job/big since") {
		t.Errorf("status of the whole-node group %q, want it to say the nodes are reserved for default/job/big", st.Message)
	}
	// The reservation's time runs out unplaced; the whole-node group
	// goes ahead.
	h.c.mu.Lock()
	h.c.reserved.until = time.Now()
	h.c.mu.Unlock()
	h.place("default/job/node")
	if n := h.allocatedNode("node-0"); n == "" {
		t.Error("the whole-node group still waits after the reservation expired")
	}
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	if h.c.reserved != nil && h.c.reserved.key == "default/job/big" {
		t.Error("big still holds its reservation after it expired")
	}
	if _, ok := h.c.expired["default/job/big"]; !ok {
		t.Error("big's expiry not recorded, so it could reserve again at once")
	}
}

// A group that insists on its preferred leaf reserves in that leaf, not in
// the one closest to fitting it: nodes held elsewhere would keep other
// groups off a place it refuses. Cluster as in
// TestOldestWaitingGroupReservesItsDomain: leaf-1 has more GPUs free, and
// big requires leaf-0.
func TestRequiredPreferenceReservesInThePreferredDomain(t *testing.T) {
	h := newHarness(t, foreignClaim("a", "n0", "gpu-0"), foreignClaim("b", "n1", "gpu-0"), foreignClaim("c", "n2", "gpu-0"))
	h.c.cfg.ReserveAfter = 30 * time.Second
	big := job("big", 2)
	big.CreationTimestamp = metav1.NewTime(time.Now().Add(-time.Minute))
	h.create(big)
	insist := map[string]string{placement.AnnotationPreferredDomain: "leaf-0", placement.AnnotationPreferredRequired: "true"}
	for i := range 2 {
		h.addPod(jobPod("big", i, "gpu-8-node", insist))
	}
	h.settle()
	h.sync("default/job/big")
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	want := planner.Domain{Level: planner.LevelLeaf, Names: []string{"leaf-0"}}.String()
	if h.c.reserved == nil || h.c.reserved.hold.Domain.String() != want {
		t.Errorf("reserved %v, want %s, the domain the group insists on", h.c.reserved, want)
	}
}
