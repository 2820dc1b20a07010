package simulate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/topology"
)

// Source yields the trace to replay for a seed: a fixed trace, or one
// generated per seed.
type Source func(seed uint64) (*Trace, error)

// Fixed replays tr whatever the seed.
func Fixed(tr *Trace) Source { return func(uint64) (*Trace, error) { return tr, nil } }

// Philly generates a Philly-like trace per seed.
func Philly(cfg PhillyConfig) Source {
	return func(seed uint64) (*Trace, error) { return GeneratePhilly(cfg, seed) }
}

// Options control a simulation.
type Options struct {
	// Demand is the arrived demand of static traces as a multiple of the
	// cluster's GPUs, counted in milli-GPUs as the FGD paper does (1.3 for
	// its 130 %); 0 replays the whole trace. Timed traces ignore it: their
	// load is in the trace.
	Demand float64
	// Seed shuffles the arrival order of static traces (0 keeps the
	// trace order), seeds generated traces and the default scheduler's
	// tie-breaks. Seeds > 1 replays seeds Seed, Seed+1, ... and reports
	// means, like the paper's 10 seeds.
	Seed  uint64
	Seeds int
	// Inflate samples a short static trace with replacement up to the
	// demand, as the FGD artifact does; the CLI sets it for Alibaba.
	Inflate bool
	// Strategy is gputopo's strategy; empty for the planner's default.
	Strategy planner.Strategy
	// CPUPodsOptIn: pods without GPUs opt in to gputopo's placement, as
	// every pod goes through FGD in the paper. Without it the default
	// scheduler's model places them in gputopo's cluster.
	CPUPodsOptIn bool
	// GPUModels enforces the GPU models a job names (an Alibaba pod's
	// gpu_spec): its pods go only to nodes of those models, for every
	// scheduler, as the FGD artifact enforces them. Without it they are
	// ignored.
	GPUModels bool
	// FGDWorkload measures gputopo's fragmentation on an Alibaba trace
	// against the FGD artifact's target workload (see fgdWorkload)
	// instead of every shape of the arrived jobs.
	FGDWorkload bool
	// FGDArrivals builds a static Alibaba trace's arrivals as the FGD
	// artifact's runs do (see FGDArrivals: its generator, shuffle and
	// tuning, no cut) instead of StaticArrivals; Inflate is then moot.
	FGDArrivals bool
	// LimitFactor declares every job of a timed trace a run-time limit
	// of its trace duration times this factor (a user's overestimate,
	// at least 1); 0 declares none. With limits the queue backfills as
	// EASY backfill does: the oldest waiting job holds a reservation at
	// the time the declared limits say enough GPUs free up, and a later
	// job starts before it only if its own limit ends by then or it
	// takes only GPUs the reservation leaves over. Without limits every
	// waiting job that fits starts.
	LimitFactor float64
	// Locality stretches the run time of a job of a timed trace by the
	// highest tier its pods span; nil is DefaultLocality.
	Locality *Locality
	// Schedulers are the schedulers to replay, by name: "gputopo",
	// "default" (the model of the default scheduler), "firstfit" and
	// "fgd" (a transcription of the FGD artifact's scheduler, static
	// Alibaba traces with the artifact's arrivals only); empty: the
	// first three.
	Schedulers []string
	// Progress, when set, gets a line per seed as it is done.
	Progress io.Writer
	// MaxDomainWait is how long gputopo keeps a multi-node job of a timed
	// trace waiting for a domain of its size rule before it may take a
	// bigger one: 0 places it at once wherever it fits, a negative value
	// keeps it waiting as long as it takes. Static traces place at once.
	MaxDomainWait time.Duration
}

// Schedulers are the names Options.Schedulers takes.
var Schedulers = []string{"gputopo", "default", "firstfit", "fgd"}

// Result is one simulation: gputopo's metrics inline, the model of the
// default scheduler under "baseline" and first fit under "firstFit".
type Result struct {
	Cluster    ClusterInfo `json:"cluster"`
	Trace      TraceInfo   `json:"trace"`
	Demand     float64     `json:"demand"`
	DemandUnit string      `json:"demandUnit"`
	// Sharing: the cluster publishes its GPUs for sharing and shared pods
	// take shares; without it they take whole GPUs.
	Sharing bool     `json:"sharing"`
	Seeds   []uint64 `json:"seeds"`
	// Locality is the locality model of timed traces.
	Locality string `json:"locality,omitempty"`
	Metrics
	Baseline Metrics `json:"baseline"`
	FirstFit Metrics `json:"firstFit"`
	// FGD is the transcription of the FGD artifact's scheduler, where
	// replayed (Options.Schedulers).
	FGD *Metrics `json:"fgdArtifact,omitempty"`
	// PerSeed is each seed's headline figures, for the spread of the
	// means.
	PerSeed []SeedResult `json:"perSeed,omitempty"`
	// Published are the FGD paper's allocation ratios, set only when the
	// run is the paper's setting (see PaperSetting).
	Published   []Published `json:"published,omitempty"`
	WallSeconds float64     `json:"wallSeconds"`
}

// SeedResult is one seed's headline figures, by scheduler.
type SeedResult struct {
	Seed     uint64      `json:"seed"`
	Gputopo  SeedMeasure `json:"gputopo"`
	Baseline SeedMeasure `json:"baseline"`
	FirstFit SeedMeasure `json:"firstFit"`
	FGD      SeedMeasure `json:"fgdArtifact,omitzero"`
}

// SeedMeasure is one scheduler's headline figures on one seed: the
// milli-GPU allocation (at the end, or averaged over time) and, for timed
// traces, the mean job completion time.
type SeedMeasure struct {
	Allocation float64 `json:"allocation"`
	// ArtifactAllocation is the FGD artifact's measure, where set (see
	// Metrics.ArtifactAllocation).
	ArtifactAllocation float64 `json:"artifactAllocation,omitempty"`
	MeanJCTS           float64 `json:"meanJCTS,omitempty"`
}

func seedMeasure(m Metrics) SeedMeasure {
	return SeedMeasure{Allocation: m.MilliAllocationRatio, ArtifactAllocation: m.ArtifactAllocation, MeanJCTS: m.MeanJCTS}
}

// ClusterInfo describes the simulated cluster.
type ClusterInfo struct {
	Nodes        int  `json:"nodes"`
	GPUs         int  `json:"gpus"`
	Leaves       int  `json:"leaves"`
	Spines       int  `json:"spines"`
	NodesPerLeaf int  `json:"nodesPerLeaf"`
	CPUAndMemory bool `json:"cpuAndMemory"` // nodes say what CPU and memory they have
}

// TraceInfo describes the replayed trace (of the first seed).
type TraceInfo struct {
	Format      string `json:"format"`
	Source      string `json:"source"`
	Timed       bool   `json:"timed"`
	TraceJobs   int    `json:"traceJobs"`
	CPUOnlyPods int    `json:"cpuOnlyPods"`
	// Arrived jobs, of which Sampled were drawn again to reach the demand.
	Arrived int `json:"arrived"`
	Sampled int `json:"sampled"`
	// PodsByGPUs is a histogram of arrived pods by GPUs per pod.
	PodsByGPUs string `json:"podsByGPUs"`
	SharedPods int    `json:"sharedPods"`
}

// PaperSetting says whether a run is the FGD artifact's setup, so that
// the paper's published figures compare with it: an Alibaba pod list
// replayed shuffled (the artifact shuffles by seed) on a cluster of GPU
// nodes only (its gpu_node list), with GPU sharing, the pods' GPU models
// enforced, fragmentation measured against the artifact's target
// workload and pods without GPUs placed by gputopo too, as every pod goes
// through FGD there. Demand counts milli-GPUs, always here; CPU and memory
// count when the node list and pod list give them, as the artifact's do.
func PaperSetting(tr *Trace, c *Cluster, opt Options) bool {
	gpuNodesOnly := !slices.ContainsFunc(c.Nodes, func(n SimNode) bool { return n.GPUs == 0 })
	return tr.Format == FormatAlibaba && !tr.Timed && c.Sharing && gpuNodesOnly && opt.Seed != 0 &&
		opt.GPUModels && opt.FGDWorkload && opt.FGDArrivals && opt.CPUPodsOptIn
}

// artifactMeasure says whether a replay of tr is measured as the FGD
// artifact measures its runs too (see artifactAllocation): a static
// Alibaba pod list with the artifact's arrivals, tuned to a demand.
func artifactMeasure(tr *Trace, opt Options) bool {
	return tr.Format == FormatAlibaba && !tr.Timed && opt.FGDArrivals && opt.Demand > 0
}

// Run replays the source through gputopo's planner, the default
// scheduler's model and first fit, one after the other, once per seed.
func Run(ctx context.Context, c *Cluster, cl *Claims, src Source, opt Options) (*Result, error) {
	start := time.Now()
	if opt.Seeds < 1 {
		opt.Seeds = 1
	}
	if opt.Seeds > 1 && opt.Seed == 0 {
		return nil, errors.New("several seeds need a first seed above 0 (seed 0 is the trace order)")
	}
	res := &Result{Demand: opt.Demand, DemandUnit: "milliGPU", Sharing: c.Sharing, Cluster: ClusterInfo{
		Nodes: len(c.Nodes), GPUs: c.GPUs, Leaves: c.Leaves, Spines: c.Spines, NodesPerLeaf: c.NodesPerLeaf, CPUAndMemory: c.Nodes[0].CPUMilli > 0}}
	var ours, base, first, fgd []Metrics
	// The schedulers replayed, in the order of the report.
	var scheds []struct {
		key, label string
		out        *[]Metrics
	}
	for _, sc := range []struct {
		key, label string
		out        *[]Metrics
	}{{"gputopo", "gputopo", &ours}, {"default", "default scheduler", &base}, {"firstfit", "first fit", &first}, {"fgd", "FGD (artifact)", &fgd}} {
		if len(opt.Schedulers) == 0 && sc.key != "fgd" || slices.Contains(opt.Schedulers, sc.key) {
			scheds = append(scheds, sc)
		}
	}
	for k := range opt.Seeds {
		seed := opt.Seed + uint64(k)
		res.Seeds = append(res.Seeds, seed)
		tr, err := src(seed)
		if err != nil {
			return nil, err
		}
		if !opt.GPUModels && tr.ModelPods > 0 {
			tr = withoutModels(tr)
		}
		if tr.Timed && opt.LimitFactor > 0 {
			tr = withLimits(tr, opt.LimitFactor)
		}
		jobs := tr.Jobs
		sampled := 0
		var nodePerm func(int) []int
		if !tr.Timed {
			var a Arrivals
			if opt.FGDArrivals && tr.Format == FormatAlibaba {
				a, err = FGDArrivals(tr, c.GPUs, opt.Demand, seed)
			} else {
				a, err = StaticArrivals(tr, c.GPUs, opt.Demand, seed, opt.Inflate)
			}
			if err != nil {
				return nil, err
			}
			jobs, sampled, nodePerm = a.Jobs, a.Sampled, a.nodePerm
		}
		if len(jobs) == 0 {
			return nil, fmt.Errorf("no job of %s arrives at demand %v", tr.Source, opt.Demand)
		}
		if k == 0 {
			res.Trace = traceInfo(tr, jobs, sampled)
			if tr.Timed {
				res.Locality = opt.locality().String()
			}
		}
		w := workloadOf(jobs, c.Sharing)
		if opt.FGDWorkload && tr.Format == FormatAlibaba {
			w = fgdWorkload(tr.Jobs, c.Sharing)
		}
		for _, sc := range scheds {
			var p placer
			switch sc.key {
			case "gputopo":
				p = newGputopo(c, cl, opt, w, seed, tr.Timed)
			case "default":
				p = newSchedulerModel(c, cl, seed, newLedger(c))
			case "firstfit":
				p = newFirstFit(c, cl)
			case "fgd":
				if nodePerm == nil {
					return nil, errors.New("the FGD artifact's scheduler replays static Alibaba traces with the artifact's arrivals only")
				}
				prio := fgdNodePriority(c, nodePerm(len(c.Nodes)))
				p = newFGDArtifact(c, cl, fgdTypical(tr.Jobs, c.Sharing), prio, newLedger(c))
			}
			m, err := replay(ctx, c, jobs, tr.Timed, p, opt.locality())
			if err != nil {
				return nil, fmt.Errorf("seed %d, %s: %w", seed, p.name(), err)
			}
			if artifactMeasure(tr, opt) {
				m.ArtifactAllocation, _ = artifactAllocation(m.arrivals, c.GPUs, opt.Demand)
			}
			m.arrivals = nil
			*sc.out = append(*sc.out, m)
		}
		at := func(ms []Metrics) Metrics {
			if len(ms) > k {
				return ms[k]
			}
			return Metrics{}
		}
		res.PerSeed = append(res.PerSeed, SeedResult{Seed: seed, Gputopo: seedMeasure(at(ours)), Baseline: seedMeasure(at(base)), FirstFit: seedMeasure(at(first)), FGD: seedMeasure(at(fgd))})
		if opt.Progress != nil {
			var alloc, artifact, jct []string
			for _, sc := range scheds {
				m := at(*sc.out)
				alloc = append(alloc, fmt.Sprintf("%s %.4f", sc.label, m.MilliAllocationRatio))
				artifact = append(artifact, fmt.Sprintf("%.4f", m.ArtifactAllocation))
				jct = append(jct, fmt.Sprintf("%.0f s", m.MeanJCTS))
			}
			fmt.Fprintf(opt.Progress, "seed %d: milli-GPU allocation %s", seed, strings.Join(alloc, ", "))
			if artifactMeasure(tr, opt) {
				fmt.Fprintf(opt.Progress, "; FGD artifact's measure %s", strings.Join(artifact, ", "))
			}
			if tr.Timed {
				fmt.Fprintf(opt.Progress, "; mean JCT %s", strings.Join(jct, ", "))
			}
			fmt.Fprintln(opt.Progress)
		}
	}
	res.Metrics, res.Baseline, res.FirstFit = mean(ours), mean(base), mean(first)
	if len(fgd) > 0 {
		m := mean(fgd)
		res.FGD = &m
	}
	res.WallSeconds = time.Since(start).Seconds()
	return res, nil
}

func traceInfo(tr *Trace, jobs []Job, sampled int) TraceInfo {
	hist := map[int]int{}
	shared := 0
	for _, j := range jobs {
		hist[j.GPUsPerPod] += j.Pods
		if j.Shared {
			shared += j.Pods
		}
	}
	return TraceInfo{Format: tr.Format, Source: tr.Source, Timed: tr.Timed, TraceJobs: len(tr.Jobs), CPUOnlyPods: tr.CPUOnlyPods,
		Arrived: len(jobs), Sampled: sampled, PodsByGPUs: sortedCounts(hist), SharedPods: shared}
}

// workloadOf is the mix of pods the jobs ask for, what gputopo measures
// fragmentation against: the FGD paper's "target workload" taken from
// the trace itself.
func workloadOf(jobs []Job, sharing bool) planner.Workload {
	type class struct {
		gpus, milli int
		cpu, mem    int64
	}
	count := map[class]float64{}
	var order []class
	for _, j := range jobs {
		if j.GPUsPerPod == 0 {
			continue
		}
		k := class{j.GPUsPerPod, topology.MilliPerGPU, j.CPUMilli, j.MemoryMiB}
		if share := shareOf(j, sharing); share > 0 {
			k.milli = share
		}
		if _, ok := count[k]; !ok {
			order = append(order, k)
		}
		count[k] += float64(j.Pods)
	}
	w := make(planner.Workload, len(order))
	for i, k := range order {
		w[i] = planner.WorkloadClass{GPUs: k.gpus, MilliGPU: k.milli, Requests: requests(k.cpu, k.mem), Weight: count[k]}
	}
	return w
}

func (o Options) locality() Locality {
	if o.Locality == nil {
		return DefaultLocality()
	}
	return *o.Locality
}

// withLimits is tr with every job declaring a run-time limit of its
// duration times factor.
func withLimits(tr *Trace, factor float64) *Trace {
	out := *tr
	out.Jobs = slices.Clone(tr.Jobs)
	for i := range out.Jobs {
		out.Jobs[i].Limit = time.Duration(float64(out.Jobs[i].Duration) * factor)
	}
	return &out
}

// withoutModels is tr with no job naming GPU models.
func withoutModels(tr *Trace) *Trace {
	out := *tr
	out.Jobs = slices.Clone(tr.Jobs)
	for i := range out.Jobs {
		out.Jobs[i].GPUModels = nil
	}
	out.ModelPods = 0
	return &out
}

// fgdTypicalShare is the share of pods the FGD artifact's target workload
// covers with the trace's most common pod shapes (its
// podPopularityThreshold, 95 in the artifact's runs).
const fgdTypicalShare = 0.95

// fgdWorkload is the FGD artifact's target workload ("typical pods",
// GetTypicalPods with the settings of its published runs), taken from
// the whole trace as the artifact takes it from the pod list before
// tuning: a pod's shape is the CPU it asks for (100 milli-CPU when it asks
// none, as kube-scheduler counts it), its GPUs, the milli-GPU it asks of
// each (a share only where GPUs are shared) and the GPU models it may use;
// pods without GPUs are shapes too (every free GPU is stranded for them).
// The most common shapes, one at a time, make the workload until they
// cover fgdTypicalShare of the pods, weighted by how many pods have them
// (ties in the order they first appear). Memory is left out, as the
// artifact's fragmentation counts only CPU besides GPUs.
func fgdWorkload(jobs []Job, sharing bool) planner.Workload {
	var w planner.Workload
	for _, c := range fgdShapes(jobs, sharing) {
		w = append(w, planner.WorkloadClass{GPUs: c.gpus, MilliGPU: c.milli, Requests: requests(c.cpu, 0),
			NodeAffinity: modelSelector(c.models), Weight: c.weight})
	}
	return w
}

// mean averages per-seed metrics: ratios exactly, counts rounded;
// latency and waiting percentiles are taken over every seed together.
func mean(runs []Metrics) Metrics {
	if len(runs) == 0 {
		return Metrics{}
	}
	if len(runs) == 1 {
		return runs[0]
	}
	out := Metrics{Scheduler: runs[0].Scheduler, ClusterGPUs: runs[0].ClusterGPUs}
	n := float64(len(runs))
	avg := func(get func(Metrics) float64) float64 {
		s := 0.0
		for _, r := range runs {
			s += get(r)
		}
		return s / n
	}
	count := func(get func(Metrics) int) int {
		return int(math.Round(avg(func(m Metrics) float64 { return float64(get(m)) })))
	}
	out.Jobs = count(func(m Metrics) int { return m.Jobs })
	out.CPUOnlyPods = count(func(m Metrics) int { return m.CPUOnlyPods })
	out.CPUOnlyPlaced = count(func(m Metrics) int { return m.CPUOnlyPlaced })
	out.Placed = count(func(m Metrics) int { return m.Placed })
	out.Refused = count(func(m Metrics) int { return m.Refused })
	out.PartialJobs = count(func(m Metrics) int { return m.PartialJobs })
	out.Pods = count(func(m Metrics) int { return m.Pods })
	out.PodsPlaced = count(func(m Metrics) int { return m.PodsPlaced })
	out.RequestedGPUs = count(func(m Metrics) int { return m.RequestedGPUs })
	out.RequestedMilliGPU = int64(avg(func(m Metrics) float64 { return float64(m.RequestedMilliGPU) }))
	out.MultiNodeJobs = count(func(m Metrics) int { return m.MultiNodeJobs })
	out.MultiNodePlaced = count(func(m Metrics) int { return m.MultiNodePlaced })
	out.SameDomain = count(func(m Metrics) int { return m.SameDomain })
	out.CrossSpine = count(func(m Metrics) int { return m.CrossSpine })
	out.Waited = count(func(m Metrics) int { return m.Waited })
	out.AllocatorRuns = count(func(m Metrics) int { return m.AllocatorRuns })
	out.AllocatedGPUs = avg(func(m Metrics) float64 { return m.AllocatedGPUs })
	out.AllocationRatio = avg(func(m Metrics) float64 { return m.AllocationRatio })
	out.MilliAllocationRatio = avg(func(m Metrics) float64 { return m.MilliAllocationRatio })
	// The artifact's measure over the seeds that have it, as pandas'
	// mean skips a seed without a value.
	measured := 0
	for _, r := range runs {
		if r.ArtifactAllocation > 0 {
			out.ArtifactAllocation += r.ArtifactAllocation
			measured++
		}
	}
	if measured > 0 {
		out.ArtifactAllocation /= float64(measured)
	}
	out.Utilization = avg(func(m Metrics) float64 { return m.Utilization })
	out.UsefulUtilization = avg(func(m Metrics) float64 { return m.UsefulUtilization })
	out.SameDomainRatio = avg(func(m Metrics) float64 { return m.SameDomainRatio })
	out.Fragmentation = avg(func(m Metrics) float64 { return m.Fragmentation })
	out.LeafFragmentation = avg(func(m Metrics) float64 { return m.LeafFragmentation })
	out.ReplaySeconds = avg(func(m Metrics) float64 { return m.ReplaySeconds })
	out.MakespanS = avg(func(m Metrics) float64 { return m.MakespanS })
	for _, r := range runs {
		out.latencies = append(out.latencies, r.latencies...)
		out.waits = append(out.waits, r.waits...)
		out.jcts = append(out.jcts, r.jcts...)
		out.multiJCTs = append(out.multiJCTs, r.multiJCTs...)
		out.floors = append(out.floors, r.floors...)
	}
	out.PlanLatencyP50Ms, out.PlanLatencyP99Ms, out.PlanLatencyMaxMs = percentile(out.latencies, 0.50), percentile(out.latencies, 0.99), percentile(out.latencies, 1)
	out.MeanQueueWaitS, out.P95QueueWaitS = average(out.waits), percentile(out.waits, 0.95)
	out.MeanJCTS, out.P95JCTS = average(out.jcts), percentile(out.jcts, 0.95)
	out.MultiNodeMeanJCTS = average(out.multiJCTs)
	out.FloorJCTS = average(out.floors)
	return out
}
