package scale

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestStreamIsSeededAndInRange(t *testing.T) {
	a, b := Stream(7, 200, 3), Stream(7, 200, 3)
	if diff := cmp.Diff(a, b); diff != "" {
		t.Fatalf("one seed gave two streams (-first +second):\n%s", diff)
	}
	if cmp.Equal(a, Stream(8, 200, 3)) {
		t.Errorf("seeds 7 and 8 gave the same stream")
	}
	jobs, fillers := 0, 0
	sizes, tmpls := map[int]bool{}, map[string]bool{}
	names := map[string]bool{}
	for i, it := range a {
		if names[it.Name] {
			t.Errorf("name %s twice", it.Name)
		}
		names[it.Name] = true
		if it.Filler {
			fillers++
			if it.Pods != 1 || it.Template != "gpu-1" {
				t.Errorf("filler %+v: want one pod of gpu-1", it)
			}
			if i == 0 || a[i-1].Filler {
				t.Errorf("filler at %d does not follow a Job", i)
			}
			continue
		}
		jobs++
		if it.Pods < 1 || it.Pods > 16 {
			t.Errorf("Job %s has %d pods, want 1 to 16", it.Name, it.Pods)
		}
		sizes[it.Pods], tmpls[it.Template] = true, true
	}
	if jobs != 200 || fillers != 66 {
		t.Errorf("got %d Jobs and %d fillers, want 200 and 66 (one after every third Job)", jobs, fillers)
	}
	for _, n := range []int{1, 16} {
		if !sizes[n] {
			t.Errorf("no Job of %d pods in 200 draws", n)
		}
	}
	for _, tm := range StreamTemplates {
		if !tmpls[tm] {
			t.Errorf("no Job of template %s in 200 draws", tm)
		}
	}
	if got := Stream(7, 10, 0); len(got) != 10 {
		t.Errorf("fillerEvery 0: %d items, want 10 Jobs and no filler", len(got))
	}
}

func TestNodesNeededAndDomain(t *testing.T) {
	for _, tc := range []struct {
		it         StreamItem
		nodes      int
		wantDomain string
	}{
		{StreamItem{Pods: 8, Template: "gpu-8-node"}, 8, "leaf"},
		{StreamItem{Pods: 16, Template: "gpu-8-node"}, 16, "spine"},
		{StreamItem{Pods: 5, Template: "gpu-4-nvlink"}, 3, "leaf"},
		{StreamItem{Pods: 9, Template: "gpu-1"}, 2, "leaf"},
		{StreamItem{Pods: 16, Template: "gpu-4-nvlink"}, 8, "leaf"},
	} {
		if got := tc.it.NodesNeeded(8); got != tc.nodes {
			t.Errorf("%+v: %d nodes, want %d", tc.it, got, tc.nodes)
		}
		if got := Domain(tc.nodes, 10, 50); got != tc.wantDomain {
			t.Errorf("%+v: domain %s, want %s", tc.it, got, tc.wantDomain)
		}
	}
	if got := Domain(51, 10, 50); got != "cluster" {
		t.Errorf("51 nodes: domain %s, want cluster", got)
	}
}

func TestSummarize(t *testing.T) {
	t0 := time.Unix(1000, 0)
	set := func(xs ...string) map[string]bool {
		m := map[string]bool{}
		for _, x := range xs {
			m[x] = true
		}
		return m
	}
	jobs := []JobOutcome{
		// In one leaf: in its domain.
		{Item: StreamItem{Pods: 4, Template: "gpu-8-node"}, Created: t0, Bound: t0.Add(1 * time.Second), BoundPods: 4, Leaves: set("l0"), Spines: set("s0")},
		// Across two leaves though it fits in one: outside.
		{Item: StreamItem{Pods: 4, Template: "gpu-8-node"}, Created: t0, Bound: t0.Add(3 * time.Second), BoundPods: 4, Leaves: set("l0", "l1"), Spines: set("s0")},
		// 16 nodes: its domain is a spine; two leaves of one spine is in.
		{Item: StreamItem{Pods: 16, Template: "gpu-8-node"}, Created: t0, Bound: t0.Add(2 * time.Second), BoundPods: 16, Leaves: set("l0", "l1"), Spines: set("s0")},
		// One pod: bound, not multi-pod.
		{Item: StreamItem{Pods: 1, Template: "gpu-1"}, Created: t0, Bound: t0.Add(10 * time.Second), BoundPods: 1, Leaves: set("l3"), Spines: set("s1")},
		// Part-bound and refused.
		{Item: StreamItem{Pods: 8, Template: "gpu-8-node"}, Created: t0, BoundPods: 3, Refused: true},
		// Nothing bound, refused.
		{Item: StreamItem{Pods: 12, Template: "gpu-8-node"}, Created: t0, Refused: true},
		// Fillers do not count.
		{Item: StreamItem{Pods: 1, Template: "gpu-1", Filler: true}, Created: t0, Bound: t0.Add(time.Hour), BoundPods: 1},
	}
	var r NativeRow
	Summarize(&r, jobs, 8, 10, 50)
	want := NativeRow{Multi: 3, InDomain: 2, BoundP50: 2, BoundP95: 10, Jobs: 6, JobsBound: 4, Refused: 2, Partial: 1,
		GPUsBound: 4*8 + 4*8 + 16*8 + 1, GPUsAsked: 4*8 + 4*8 + 16*8 + 1 + 8*8 + 12*8}
	if diff := cmp.Diff(want, r); diff != "" {
		t.Errorf("Summarize (-want +got):\n%s", diff)
	}
}

func TestHeldIntegral(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	// 8 GPUs for 2 s, 0 for 1 s, 16 for 0.5 s up to the end; out of order.
	ts := []time.Time{at(3), at(0), at(2)}
	held := []int{16, 8, 0}
	if got := HeldIntegral(ts, held, at(3.5)); math.Abs(got-24) > 1e-9 {
		t.Errorf("HeldIntegral = %v, want 24 GPU-seconds", got)
	}
	if got := HeldIntegral(nil, nil, t0); got != 0 {
		t.Errorf("no samples: %v, want 0", got)
	}
}

func TestWriteNativeRendersEveryPath(t *testing.T) {
	var b strings.Builder
	WriteNative(&b, "t", []NativeRow{{Path: PathGputopo, Multi: 4, InDomain: 3, FreedN: 2, FreedP50: 0.5, Leaves: 10, LeavesFree: 2}})
	for _, want := range []string{"(c) gputopo allocating", "75% (3/4)", "0.50 s (2)", "2 / 10", "| – |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
}
