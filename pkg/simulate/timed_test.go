package simulate

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseLocality(t *testing.T) {
	for in, want := range map[string]Locality{
		"":                         DefaultLocality(),
		"none":                     NoLocality(),
		"spine=1.2":                {1, 1, 1.2, 1.3},
		"leaf=1.1, cross=2":        {1, 1.1, 1.1, 2},
		DefaultLocality().String(): DefaultLocality(),
	} {
		got, err := ParseLocality(in)
		if err != nil || got != want {
			t.Errorf("ParseLocality(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for in, has := range map[string]string{
		"rack=2":    "tiers node, leaf, spine and cross",
		"spine":     "tier=factor",
		"cross=0.5": "from 1 to 100",
		"leaf=1.5":  "the spine factor 1.1 is below the leaf factor 1.5",
		"spine=x":   "from 1 to 100",
	} {
		if _, err := ParseLocality(in); err == nil || !strings.Contains(err.Error(), has) {
			t.Errorf("ParseLocality(%q): got %v, want an error saying %q", in, err, has)
		}
	}
}

// The tier is the highest level of the network a job's nodes span.
func TestTier(t *testing.T) {
	c := &Cluster{Nodes: []SimNode{
		{Name: "a", Leaf: "leaf-0", Spine: "spine-0"}, {Name: "b", Leaf: "leaf-0", Spine: "spine-0"},
		{Name: "c", Leaf: "leaf-1", Spine: "spine-0"}, {Name: "d", Leaf: "leaf-2", Spine: "spine-1"},
		{Name: "e"}, {Name: "f"},
	}}
	for _, tc := range []struct {
		nodes []int
		want  Tier
	}{
		{[]int{0}, TierNode}, {[]int{0, 0}, TierNode}, {[]int{0, 1}, TierLeaf}, {[]int{1, 0, 1}, TierLeaf},
		{[]int{0, 1, 2}, TierSpine}, {[]int{2, 0}, TierSpine}, {[]int{0, 3}, TierCross}, {[]int{0, 1, 2, 3}, TierCross},
		// Nodes the cluster places nowhere are as far apart as it gets.
		{[]int{4, 5}, TierCross},
	} {
		if got := c.tier(tc.nodes); got != tc.want {
			t.Errorf("tier(%v) = %v, want %v", tc.nodes, got, tc.want)
		}
	}
}

// A job runs for its duration times the factor of its tier: two jobs of
// two 8-GPU pods on a cluster of one node per leaf and two leaves per
// spine, each within a spine (factor 2), and a one-node job (factor 1);
// the completion times and the makespan follow.
func TestLocalityStretchesRunTime(t *testing.T) {
	c := clusterOf(t, 1, 2, 2)
	jobs := []Job{
		{Name: "a", Pods: 2, GPUsPerPod: 8, MilliGPU: 8000, Arrival: 0, Duration: time.Hour},
		{Name: "b", Pods: 2, GPUsPerPod: 8, MilliGPU: 8000, Arrival: time.Minute, Duration: time.Hour},
		{Name: "c", Pods: 1, GPUsPerPod: 8, MilliGPU: 8000, Arrival: 2 * time.Minute, Duration: time.Hour},
	}
	m, err := replay(context.Background(), c, jobs, true, newFirstFit(c, demoClaims(t)), Locality{1, 1.5, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	// a: nodes 0 and 1 (spine 0), 2 h; b: nodes 2 and 3 (spine 1), 2 h
	// too; c waits for a, until 2 h, and runs 1 h.
	got := []float64{m.MeanJCTS, m.MakespanS, float64(m.CrossSpine)}
	want := []float64{(2*3600 + 2*3600 + (3*3600 - 120)) / 3.0, 3 * 3600, 0}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("mean JCT, makespan, cross-spine jobs (-want +got):\n%s", diff)
	}
}

// Schedulers are never shown a job's true duration, only its declared
// limit.
func TestSchedulersNeverSeeDurations(t *testing.T) {
	c := clusterOf(t, 1, 2, 2)
	spy := &durationSpy{placer: newFirstFit(c, demoClaims(t))}
	tr, err := GeneratePhilly(PhillyConfig{Jobs: 60, MultiNodeFraction: 0.3, Load: 2, ClusterGPUs: c.GPUs}, 1)
	if err != nil {
		t.Fatal(err)
	}
	tr = withLimits(tr, 1.5)
	if _, err := replay(context.Background(), c, tr.Jobs, true, spy, DefaultLocality()); err != nil {
		t.Fatal(err)
	}
	if spy.calls == 0 || spy.sawDuration != 0 || spy.sawLimit != spy.calls {
		t.Errorf("%d plans: %d saw a duration, %d a limit; want none and all", spy.calls, spy.sawDuration, spy.sawLimit)
	}
}

type durationSpy struct {
	placer
	calls, sawDuration, sawLimit int
}

func (s *durationSpy) place(ctx context.Context, key string, j Job, waited time.Duration) (placement, error) {
	s.calls++
	if j.Duration != 0 {
		s.sawDuration++
	}
	if j.Limit > 0 {
		s.sawLimit++
	}
	return s.placer.place(ctx, key, j, waited)
}

// The reservation of the first waiting job goes by declared ends only.
func TestReservation(t *testing.T) {
	h := time.Hour
	ends := map[int]declaredEnd{0: {3 * h, 8}, 1: {1 * h, 4}, 2: {2 * h, 8}, 3: {0, 2}}
	for _, tc := range []struct {
		free, need int
		shadow     time.Duration
		extra      int
	}{
		{free: 8, need: 8, shadow: h / 2, extra: 0},      // fits now
		{free: 2, need: 4, shadow: h / 2, extra: 0},      // job 3 is past its end: now
		{free: 2, need: 8, shadow: 1 * h, extra: 0},      // 2 + 2 + 4
		{free: 2, need: 10, shadow: 2 * h, extra: 6},     // 2 + 2 + 4 + 8
		{free: 0, need: 30, shadow: 1<<63 - 1, extra: 0}, // never
	} {
		shadow, extra := reservation(h/2, tc.free, tc.need, ends)
		if shadow != tc.shadow || extra != tc.extra {
			t.Errorf("free %d, need %d: reservation at %v with %d extra, want %v with %d", tc.free, tc.need, shadow, extra, tc.shadow, tc.extra)
		}
	}
}

// With declared limits a later job may not start when its limit runs
// past the reservation of the first waiting job and it needs GPUs the
// reservation takes; it may when its limit ends in time.
func TestEASYBackfill(t *testing.T) {
	c := clusterOf(t, 1, 2, 1) // 2 nodes, 16 GPUs
	jobs := []Job{
		{Name: "running", Pods: 1, GPUsPerPod: 8, MilliGPU: 8000, Arrival: 0, Duration: 2 * time.Hour},
		{Name: "big", Pods: 2, GPUsPerPod: 8, MilliGPU: 8000, Arrival: time.Minute, Duration: time.Hour},
		{Name: "long", Pods: 1, GPUsPerPod: 8, MilliGPU: 8000, Arrival: 2 * time.Minute, Duration: 10 * time.Hour},
		{Name: "short", Pods: 1, GPUsPerPod: 8, MilliGPU: 8000, Arrival: 3 * time.Minute, Duration: time.Hour},
	}
	wait := func(limits bool) []float64 {
		js := jobs
		if limits {
			js = withLimits(&Trace{Jobs: jobs}, 1).Jobs
		}
		m, err := replay(context.Background(), c, js, true, newFirstFit(c, demoClaims(t)), NoLocality())
		if err != nil {
			t.Fatal(err)
		}
		return m.waits
	}
	// Greedy: long starts at once, big waits for it (10 h); short waits
	// for running (2 h).
	min := time.Minute.Seconds()
	if diff := cmp.Diff([]float64{0, 0, 120*min - 3*min, 600*min + 2*min - min}, wait(false)); diff != "" {
		t.Errorf("greedy waits (-want +got):\n%s", diff)
	}
	// EASY: big holds the reservation at 2 h; long would run past it and
	// waits, short ends by then and starts at once; big starts at 2 h,
	// long after it, at 3 h.
	if diff := cmp.Diff([]float64{0, 0, 120*min - min, 180*min - 2*min}, wait(true)); diff != "" {
		t.Errorf("EASY waits (-want +got):\n%s", diff)
	}
}

// clusterOf is spines × leavesPerSpine × nodesPerLeaf dgx-h100 nodes.
func clusterOf(t testing.TB, nodesPerLeaf, leavesPerSpine, spines int) *Cluster {
	t.Helper()
	specs, err := ParseTopology([]byte(fmt.Sprintf("spines: %d\nleavesPerSpine: %d\nnodesPerLeaf: %d\nprofiles: [dgx-h100]\n", spines, leavesPerSpine, nodesPerLeaf)), "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCluster(specs, ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func demoClaims(t testing.TB) *Claims {
	t.Helper()
	cl, err := LoadClaims(DemoClaimFiles("../.."))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// The nearest tier of a job packs its pods onto as few nodes as the
// largest node holds, in the largest leaf, then spine.
func TestNearestTier(t *testing.T) {
	c := clusterOf(t, 4, 4, 3) // 8-GPU nodes, 4 per leaf, 16 per spine
	for _, tc := range []struct {
		pods, gpus, milli int
		want              Tier
	}{
		{1, 8, 8000, TierNode},
		{2, 4, 4000, TierNode}, // two halves of one node
		{4, 1, 250, TierNode},  // four shares
		{2, 8, 8000, TierLeaf},
		{4, 8, 8000, TierLeaf},
		{3, 4, 4000, TierLeaf}, // 12 GPUs: two nodes
		{5, 8, 8000, TierSpine},
		{16, 8, 8000, TierSpine},
		{17, 8, 8000, TierCross},
		{2, 16, 16000, TierCross}, // fits no node
	} {
		j := Job{Pods: tc.pods, GPUsPerPod: tc.gpus, MilliGPU: tc.milli}
		if got := c.tierLimits().nearest(j); got != tc.want {
			t.Errorf("%d pods of %d milli-GPUs: nearest tier %v, want %v", tc.pods, tc.milli, got, tc.want)
		}
	}
	// A cluster that says nothing of leaves and spines has no tier
	// between a node and anywhere.
	flat := &Cluster{Nodes: []SimNode{{Name: "a", GPUs: 8}, {Name: "b", GPUs: 8}}}
	if got := flat.tierLimits().nearest(Job{Pods: 2, GPUsPerPod: 8, MilliGPU: 8000}); got != TierCross {
		t.Errorf("two whole nodes of a flat cluster: %v, want cross", got)
	}
}

// No scheduler's mean JCT is below the floor, and a scheduler that
// places every multi-node job in its nearest tier runs every job at the
// floor's speed: its mean JCT less its mean wait is the floor.
func TestFloorJCT(t *testing.T) {
	c := clusterOf(t, 4, 4, 3)
	cl := demoClaims(t)
	tr, err := GeneratePhilly(PhillyConfig{Jobs: 150, MultiNodeFraction: 0.3, Load: 1.3, ClusterGPUs: c.GPUs}, 3)
	if err != nil {
		t.Fatal(err)
	}
	loc := DefaultLocality()
	for _, p := range []placer{
		newGputopo(c, cl, Options{MaxDomainWait: -1}, workloadOf(tr.Jobs, false), 3, true),
		newSchedulerModel(c, cl, 3, newLedger(c)),
		newFirstFit(c, cl),
	} {
		m, err := replay(context.Background(), c, tr.Jobs, true, p, loc)
		if err != nil {
			t.Fatal(err)
		}
		if m.Placed != m.Jobs || m.FloorJCTS <= 0 {
			t.Fatalf("%s: %d of %d jobs placed, floor %v s", p.name(), m.Placed, m.Jobs, m.FloorJCTS)
		}
		if m.MeanJCTS < m.FloorJCTS {
			t.Errorf("%s: mean JCT %.0f s is below the floor %.0f s", p.name(), m.MeanJCTS, m.FloorJCTS)
		}
		run := m.MeanJCTS - m.MeanQueueWaitS
		atFloor := math.Abs(run-m.FloorJCTS) < 1e-6*m.FloorJCTS
		nearest := m.SameDomain == m.MultiNodePlaced
		if nearest != (p.name() == "gputopo") {
			t.Errorf("%s: %d of %d multi-node jobs in their size-rule domain", p.name(), m.SameDomain, m.MultiNodePlaced)
		}
		if nearest != atFloor {
			t.Errorf("%s: %d of %d multi-node jobs in their size-rule domain, and the mean run time %.1f s against the floor %.1f s", p.name(), m.SameDomain, m.MultiNodePlaced, run, m.FloorJCTS)
		}
	}
}
