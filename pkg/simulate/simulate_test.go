package simulate_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/pkg/simulate"
)

// smallCluster is one spine over two leaves of two dgx-h100 nodes:
//
//	spine-0
//	├── leaf-0: gpu-s0-l0-n0, gpu-s0-l0-n1
//	└── leaf-1: gpu-s0-l1-n0, gpu-s0-l1-n1
func smallCluster(t testing.TB) *simulate.Cluster {
	return newCluster(t, "spines: 1\nleavesPerSpine: 2\nnodesPerLeaf: 2\nprofiles: [dgx-h100]\n", simulate.ClusterOptions{})
}

func newCluster(t testing.TB, topology string, opt simulate.ClusterOptions) *simulate.Cluster {
	t.Helper()
	specs, err := simulate.ParseTopology([]byte(topology), "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := simulate.NewCluster(specs, opt)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// demoClaims are the demo's DeviceClass and templates, read from files
// as the CLI reads them.
func demoClaims(t testing.TB) *simulate.Claims {
	t.Helper()
	cl, err := simulate.LoadClaims(simulate.DemoClaimFiles("../.."))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func run(t *testing.T, c *simulate.Cluster, tr *simulate.Trace, opt simulate.Options) *simulate.Result {
	t.Helper()
	res, err := simulate.Run(context.Background(), c, demoClaims(t), simulate.Fixed(tr), opt)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// each is the metrics of every scheduler, by name.
func each(res *simulate.Result) []simulate.Metrics {
	return []simulate.Metrics{res.Metrics, res.Baseline, res.FirstFit}
}

// A whole-node job takes the first node; then a two-node job fits in
// leaf-1 as a whole. First fit takes the next two nodes by name, one in
// each leaf.
func TestGputopoKeepsJobsInOneLeaf(t *testing.T) {
	c := smallCluster(t)
	tr, err := simulate.ParseJobs(strings.NewReader("single,1,8\npair,2,8\n"), "jobs.csv")
	if err != nil {
		t.Fatal(err)
	}
	res := run(t, c, tr, simulate.Options{})
	type view struct {
		Placed, MultiNodePlaced, SameDomain int
		SameDomainRatio, AllocationRatio    float64
	}
	got := map[string]view{}
	for _, m := range []simulate.Metrics{res.Metrics, res.FirstFit} {
		got[m.Scheduler] = view{m.Placed, m.MultiNodePlaced, m.SameDomain, m.SameDomainRatio, m.AllocationRatio}
	}
	want := map[string]view{
		"gputopo":   {Placed: 2, MultiNodePlaced: 1, SameDomain: 1, SameDomainRatio: 1, AllocationRatio: 0.75},
		"first fit": {Placed: 2, MultiNodePlaced: 1, SameDomain: 0, SameDomainRatio: 0, AllocationRatio: 0.75},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}

// The default scheduler's model spreads pods over nodes by the CPU they
// ask for (LeastAllocated); first fit piles them on the first node;
// gputopo packs them, which fragments least.
func TestSchedulersSpreadOrPack(t *testing.T) {
	nodes := "sn,cpu_milli,memory_mib,gpu,model\n"
	pods := alibabaHeader
	for i := range 4 {
		nodes += fmt.Sprintf("n%d,16000,65536,8,V100M32\n", i)
		pods += fmt.Sprintf("p%d,2000,1024,1,1000,,,,,,\n", i)
	}
	c, tr := alibabaInput(t, nodes, pods)
	got := map[string]float64{}
	for _, m := range each(run(t, c, tr, simulate.Options{})) {
		got[m.Scheduler] = m.Fragmentation
	}
	// Free GPUs on nodes in use, over all free GPUs (28).
	want := map[string]float64{"gputopo": 4.0 / 28, "default scheduler": 1, "first fit": 4.0 / 28}
	if diff := cmp.Diff(want, got, cmpApprox); diff != "" {
		t.Errorf("node fragmentation (-want +got):\n%s", diff)
	}
}

// alibabaInput parses an Alibaba node list and pod list.
func alibabaInput(t *testing.T, nodes, pods string) (*simulate.Cluster, *simulate.Trace) {
	t.Helper()
	specs, err := simulate.ParseAlibabaNodes(strings.NewReader(nodes), "nodes.csv", simulate.DefaultGrouping())
	if err != nil {
		t.Fatal(err)
	}
	c, err := simulate.NewCluster(specs, simulate.ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := simulate.ParseAlibabaPods(strings.NewReader(pods), "pods.csv")
	if err != nil {
		t.Fatal(err)
	}
	return c, tr
}

// Nodes hold no more pods than their CPU allows, for every scheduler.
func TestCPUAndMemoryCount(t *testing.T) {
	c, tr := alibabaInput(t, "sn,cpu_milli,memory_mib,gpu,model\nn0,8000,65536,2,T4\nn1,8000,65536,2,T4\n",
		alibabaHeader+"p0,6000,1024,1,1000,,,,,,\np1,6000,1024,1,1000,,,,,,\np2,6000,1024,1,1000,,,,,,\ncpu,1000,70000,0,0,,,,,,\n")
	for _, m := range each(run(t, c, tr, simulate.Options{CPUPodsOptIn: true})) {
		if m.Placed != 2 || m.Refused != 1 || m.CPUOnlyPods != 1 || m.CPUOnlyPlaced != 0 {
			t.Errorf("%s: placed %d, refused %d, CPU pods placed %d of %d; want 2, 1, 0 of 1 (the CPU pod asks for more memory than a node has)",
				m.Scheduler, m.Placed, m.Refused, m.CPUOnlyPlaced, m.CPUOnlyPods)
		}
	}
}

// Jobs are all or nothing for both: the baseline rolls back a job whose
// pods do not all fit and says it partly fitted.
func TestRefusalsAreAllOrNothing(t *testing.T) {
	c := smallCluster(t)
	tr, err := simulate.ParseJobs(strings.NewReader("a,3,8\nhuge,2,8\nsmall,1,4\n"), "jobs.csv")
	if err != nil {
		t.Fatal(err)
	}
	res := run(t, c, tr, simulate.Options{})
	for _, m := range each(res) {
		if m.Placed != 2 || m.Refused != 1 || m.AllocatedGPUs != 28 {
			t.Errorf("%s: placed %d, refused %d, %v GPUs allocated; want 2, 1, 28", m.Scheduler, m.Placed, m.Refused, m.AllocatedGPUs)
		}
	}
	if res.FirstFit.PartialJobs != 1 || res.PartialJobs != 0 {
		t.Errorf("partial jobs: first fit %d, gputopo %d; want 1 and 0", res.FirstFit.PartialJobs, res.PartialJobs)
	}
}

// Without sharing a pod asking for a share takes a whole GPU; with it,
// shares of one GPU pack onto it. The milli-GPU ratio counts what pods
// asked for either way.
func TestSharedPods(t *testing.T) {
	in := alibabaHeader +
		"p0,1,1,1,500,,,,,,\n" +
		"p1,1,1,1,250,,,,,,\n" +
		"p2,1,1,1,1000,,,,,,\n" +
		"p3,1,1,0,0,,,,,,\n" +
		"p4,1,1,1,250,,,,,,\n"
	tr, err := simulate.ParseAlibabaPods(strings.NewReader(in), "pods.csv")
	if err != nil {
		t.Fatal(err)
	}
	const topo = "spines: 1\nleavesPerSpine: 2\nnodesPerLeaf: 2\nprofiles: [dgx-h100]\n"
	tests := map[string]struct {
		sharing bool
		gpus    float64 // GPUs holding anything, every scheduler
	}{
		"whole GPUs without sharing":                       {false, 4},
		"one GPU of shares and one whole GPU with sharing": {true, 2},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			res := run(t, newCluster(t, topo, simulate.ClusterOptions{Sharing: tc.sharing}), tr, simulate.Options{})
			if res.Trace.SharedPods != 3 {
				t.Errorf("shared pods: %d, want 3", res.Trace.SharedPods)
			}
			for _, m := range each(res) {
				if m.Placed != 4 || m.MilliAllocationRatio != 2.0/32 {
					t.Errorf("%s: placed %d, milli ratio %v; want 4, 1/16", m.Scheduler, m.Placed, m.MilliAllocationRatio)
				}
			}
			// The default scheduler's model spreads pods over nodes; the
			// others pack the shares onto one GPU.
			for _, m := range []simulate.Metrics{res.Metrics, res.FirstFit} {
				if m.AllocatedGPUs != tc.gpus {
					t.Errorf("%s: %v GPUs hold pods, want %v", m.Scheduler, m.AllocatedGPUs, tc.gpus)
				}
			}
		})
	}
}

// At demand 1 the cluster's 32 GPUs are requested exactly: four
// whole-node pods, then the fifth never arrives.
func TestDemandCutoff(t *testing.T) {
	c := smallCluster(t)
	res := run(t, c, trace(8, 8, 8, 8, 8), simulate.Options{Demand: 1})
	if res.Trace.Arrived != 4 || res.Jobs != 4 || res.Placed != 4 || res.AllocationRatio != 1 || res.Fragmentation != 0 {
		t.Errorf("arrived %d, jobs %d, placed %d, ratio %v, fragmentation %v; want 4, 4, 4, 1, 0",
			res.Trace.Arrived, res.Jobs, res.Placed, res.AllocationRatio, res.Fragmentation)
	}
}

// Timed traces queue: a job that does not fit waits, in arrival order,
// and a later job that fits now starts ahead of it (backfill).
func TestTimedReplayQueues(t *testing.T) {
	tests := map[string]struct {
		jobs                 string
		placed, waited       int
		meanWaitS, p95WaitS  float64
		utilization, refused float64
	}{
		// Each job needs the whole cluster: b and c wait for the one
		// before them to leave.
		"in arrival order": {jobs: "a,4,8,0,10\nb,4,8,10,10\nc,4,8,15,10\n", placed: 3, waited: 1, meanWaitS: 5.0 / 3, p95WaitS: 5, utilization: 1},
		// b (16 GPUs) waits for a; c (8 GPUs) fits beside a and starts.
		"with backfill": {jobs: "a,3,8,0,10\nb,2,8,1,10\nc,1,8,2,10\n", placed: 3, waited: 1, meanWaitS: 3, p95WaitS: 9, utilization: 0.75},
		// A job bigger than the cluster never starts.
		// (Utilization is measured while jobs arrive: b starts with the last
		// arrival.)
		"never fits": {jobs: "a,5,8,0,10\nb,1,8,1,10\n", placed: 1, refused: 1},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tr, err := simulate.ParseJobs(strings.NewReader(tc.jobs), "jobs.csv")
			if err != nil {
				t.Fatal(err)
			}
			type view struct {
				Placed, Waited          int
				Refused                 float64
				MeanWait, P95Wait, Util float64
			}
			want := view{tc.placed, tc.waited, tc.refused, tc.meanWaitS, tc.p95WaitS, tc.utilization}
			none := simulate.NoLocality() // durations as given
			for _, m := range each(run(t, smallCluster(t), tr, simulate.Options{Locality: &none})) {
				got := view{m.Placed, m.Waited, float64(m.Refused), m.MeanQueueWaitS, m.P95QueueWaitS, m.Utilization}
				if diff := cmp.Diff(want, got, cmpApprox); diff != "" {
					t.Errorf("%s (-want +got):\n%s", m.Scheduler, diff)
				}
			}
		})
	}
}

func TestParseAlibabaNodes(t *testing.T) {
	in := "sn,cpu_milli,memory_mib,gpu,model\n" +
		"openb-node-0,64000,262144,2,P100\n" +
		"openb-node-1,64000,262144,0,\n" +
		"openb-node-2,96000,786432,8,G2\n" +
		"openb-node-3,96000,786432,8,G2\n"
	specs, err := simulate.ParseAlibabaNodes(strings.NewReader(in), "nodes.csv", simulate.Grouping{NodesPerLeaf: 2, LeavesPerSpine: 1})
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		Name, Leaf, Spine, Profile string
		CPUMilli                   int64
	}
	var got []row
	for _, s := range specs {
		r := row{s.Name, s.Leaf, s.Spine, "", s.CPUMilli}
		if s.Profile != nil {
			r.Profile = s.Profile.Name
		}
		got = append(got, r)
	}
	// A node without GPUs stays for its CPU.
	want := []row{
		{"openb-node-0", "leaf-0", "spine-0", "alibaba-p100-2g", 64000},
		{"openb-node-1", "leaf-0", "spine-0", "", 64000},
		{"openb-node-2", "leaf-1", "spine-1", "alibaba-g2-8g", 96000},
		{"openb-node-3", "leaf-1", "spine-1", "alibaba-g2-8g", 96000},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
	c, err := simulate.NewCluster(specs, simulate.ClusterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c.GPUs != 18 || c.Leaves != 2 || c.Spines != 2 {
		t.Errorf("cluster: %d GPUs, %d leaves, %d spines; want 18, 2, 2", c.GPUs, c.Leaves, c.Spines)
	}
	_, err = simulate.ParseAlibabaNodes(strings.NewReader("sn,gpu,model\nn0,two,T4\n"), "nodes.csv", simulate.DefaultGrouping())
	if err == nil || !strings.Contains(err.Error(), "nodes.csv:2") {
		t.Errorf("bad GPU count: got %v, want an error naming nodes.csv:2", err)
	}
}

func TestParsePublished(t *testing.T) {
	in := "workload,sc_policy,tune,seed,total_gpus,0,1,2\n" +
		"w,05-BestFit,0.02,42,6212,0,50.0,90.0\n" +
		"w,05-BestFit,0.02,43,6212,0,50.0,92.0\n" +
		"w,06-FGD,0.02,42,6212,0,50.0,95.0\n" +
		"other,06-FGD,0.02,42,6212,0,50.0,10.0\n"
	got, err := simulate.ParsePublished(strings.NewReader(in), "allo.csv", "w", 0.02)
	if err != nil {
		t.Fatal(err)
	}
	want := []simulate.Published{{Policy: "05-BestFit", AllocationRatio: 0.91, Seeds: 2}, {Policy: "06-FGD", AllocationRatio: 0.95, Seeds: 1}}
	if diff := cmp.Diff(want, got, cmpApprox); diff != "" {
		t.Errorf("published (-want +got):\n%s", diff)
	}
}

var cmpApprox = cmp.Comparer(func(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 })

// sharedData is the perf-anchor data beside the repository, or "" when
// this checkout has none.
func sharedData(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
	data := filepath.Join(dir, "..", "shared", "data")
	if _, err := os.Stat(filepath.Join(data, "alibaba-gpu-v2023")); err != nil {
		return ""
	}
	return data
}

// Many jobs exercise the placer's folding of reservations into
// snapshots, with departures from both.
func TestLongReplays(t *testing.T) {
	c := smallCluster(t)
	var static, timed strings.Builder
	for i := range 150 {
		fmt.Fprintf(&static, "s%d,1,1\n", i)
		fmt.Fprintf(&timed, "t%d,1,8,%d,3.5\n", i, i)
	}
	tests := map[string]struct {
		in            string
		placed, ratio float64
	}{
		"static: fills every GPU":    {static.String(), 32, 1},
		"timed: four jobs at a time": {timed.String(), 150, 3.5 / 4},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tr, err := simulate.ParseJobs(strings.NewReader(tc.in), "jobs.csv")
			if err != nil {
				t.Fatal(err)
			}
			res := run(t, c, tr, simulate.Options{})
			for _, m := range []simulate.Metrics{res.Metrics, res.Baseline} {
				if float64(m.Placed) != tc.placed || math.Abs(m.AllocationRatio-tc.ratio) > 0.01 {
					t.Errorf("%s: placed %d, ratio %v; want %v, %v", m.Scheduler, m.Placed, m.AllocationRatio, tc.placed, tc.ratio)
				}
			}
		})
	}
}

// In a timed trace gputopo keeps a multi-node job waiting for a domain of
// its size rule: with one free node in each leaf, the two-node job waits
// for a whole leaf, where the pod schedulers place it across leaves at
// once, and so does gputopo with no wait allowed.
func TestMultiNodeJobsWaitForTheirDomain(t *testing.T) {
	jobs := "x,1,8,0,100\ny,1,8,0.1,5\nw,1,8,0.2,100\nb,2,8,6,10\n"
	tr, err := simulate.ParseJobs(strings.NewReader(jobs), "jobs.csv")
	if err != nil {
		t.Fatal(err)
	}
	type view struct {
		SameDomain int
		WaitS      float64
	}
	tests := map[string]struct {
		maxWait time.Duration
		gputopo view
	}{
		"waiting as long as it takes": {-1, view{SameDomain: 1, WaitS: 94}},
		"placing at once":             {0, view{SameDomain: 0, WaitS: 0}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			res := run(t, smallCluster(t), tr, simulate.Options{MaxDomainWait: tc.maxWait})
			got := map[string]view{}
			for _, m := range each(res) {
				got[m.Scheduler] = view{m.SameDomain, m.P95QueueWaitS}
			}
			want := map[string]view{"gputopo": tc.gputopo, "default scheduler": {}, "first fit": {}}
			if diff := cmp.Diff(want, got, cmpApprox); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// Empty claim file names read the demo's manifests from the binary, from
// any working directory.
func TestLoadClaimsBuiltIn(t *testing.T) {
	t.Chdir(t.TempDir())
	if _, err := simulate.LoadClaims(simulate.ClaimFiles{}); err != nil {
		t.Fatalf("built-in claims: %v", err)
	}
	_, err := simulate.LoadClaims(simulate.ClaimFiles{Whole: "gpu-1.yaml"})
	if err == nil || !strings.Contains(err.Error(), "read ResourceClaimTemplate gpu-1.yaml") {
		t.Errorf("a named file is read from the working directory: err = %v", err)
	}
}
