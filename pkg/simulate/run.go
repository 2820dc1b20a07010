package simulate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gputopo/gputopo/pkg/planner"
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
	// Demand is the arrived GPU demand of static traces as a multiple of
	// the cluster's GPUs (1.3 for the FGD paper's 130 %); 0 replays the
	// whole trace. Timed traces ignore it: their load is in the trace.
	Demand float64
	// Seed shuffles the arrival order of static traces (0 keeps the
	// trace order) and seeds generated traces. Seeds > 1 replays seeds
	// Seed, Seed+1, ... and reports means, like the paper's 10 seeds.
	Seed  uint64
	Seeds int
	// Inflate samples a short static trace with replacement up to the
	// demand, as the FGD artifact does; the CLI sets it for Alibaba.
	Inflate bool
	// Strategy is gputopo's strategy inside a domain; empty for the
	// planner's default.
	Strategy planner.Strategy
}

// Result is one simulation: gputopo's metrics inline, the baseline's
// under "baseline".
type Result struct {
	Cluster ClusterInfo `json:"cluster"`
	Trace   TraceInfo   `json:"trace"`
	Demand  float64     `json:"demand"`
	Seeds   []uint64    `json:"seeds"`
	Metrics
	SharedPodsRoundedUp int     `json:"sharedPodsRoundedUp"`
	Baseline            Metrics `json:"baseline"`
	// Published are the FGD paper's allocation ratios for the same
	// workload and demand, when known.
	Published   []Published `json:"published,omitempty"`
	WallSeconds float64     `json:"wallSeconds"`
}

// ClusterInfo describes the simulated cluster.
type ClusterInfo struct {
	Nodes        int `json:"nodes"`
	GPUs         int `json:"gpus"`
	Leaves       int `json:"leaves"`
	Spines       int `json:"spines"`
	NodesPerLeaf int `json:"nodesPerLeaf"`
}

// TraceInfo describes the replayed trace (of the first seed).
type TraceInfo struct {
	Format       string `json:"format"`
	Source       string `json:"source"`
	Timed        bool   `json:"timed"`
	TraceJobs    int    `json:"traceJobs"`
	SkippedNoGPU int    `json:"skippedNoGPU"`
	// Arrived jobs, of which Sampled were drawn again to reach the demand.
	Arrived int `json:"arrived"`
	Sampled int `json:"sampled"`
	// PodsByGPUs is a histogram of arrived pods by GPUs per pod.
	PodsByGPUs string `json:"podsByGPUs"`
}

// Run replays the source through gputopo's planner and through the
// baseline, side by side, once per seed.
func Run(ctx context.Context, c *Cluster, src Source, opt Options) (*Result, error) {
	start := time.Now()
	if opt.Seeds < 1 {
		opt.Seeds = 1
	}
	if opt.Seeds > 1 && opt.Seed == 0 {
		return nil, errors.New("several seeds need a first seed above 0 (seed 0 is the trace order)")
	}
	cl, err := loadClaims()
	if err != nil {
		return nil, err
	}
	res := &Result{Demand: opt.Demand, Cluster: ClusterInfo{Nodes: len(c.Nodes), GPUs: c.GPUs, Leaves: c.Leaves, Spines: c.Spines, NodesPerLeaf: c.NodesPerLeaf}}
	var ours, base []Metrics
	for k := range opt.Seeds {
		seed := opt.Seed + uint64(k)
		res.Seeds = append(res.Seeds, seed)
		tr, err := src(seed)
		if err != nil {
			return nil, err
		}
		jobs := tr.Jobs
		sampled := 0
		if !tr.Timed {
			a, err := StaticArrivals(tr, c.GPUs, opt.Demand, seed, opt.Inflate)
			if err != nil {
				return nil, err
			}
			jobs, sampled = a.Jobs, a.Sampled
		}
		if len(jobs) == 0 {
			return nil, fmt.Errorf("no job of %s arrives at demand %v", tr.Source, opt.Demand)
		}
		if k == 0 {
			shared := 0
			hist := map[int]int{}
			for _, j := range jobs {
				hist[j.GPUsPerPod] += j.Pods
				if j.Shared {
					shared += j.Pods
				}
			}
			res.SharedPodsRoundedUp = shared
			res.Trace = TraceInfo{Format: tr.Format, Source: tr.Source, Timed: tr.Timed, TraceJobs: len(tr.Jobs), SkippedNoGPU: tr.SkippedNoGPU,
				Arrived: len(jobs), Sampled: sampled, PodsByGPUs: sortedCounts(hist)}
		}
		m, b, err := replayBoth(ctx, c, cl, jobs, tr.Timed, opt.Strategy)
		if err != nil {
			return nil, fmt.Errorf("seed %d: %w", seed, err)
		}
		ours, base = append(ours, m), append(base, b)
	}
	res.Metrics, res.Baseline = mean(ours), mean(base)
	res.WallSeconds = time.Since(start).Seconds()
	return res, nil
}

// replayBoth runs gputopo, then the baseline: one after the other, so
// neither's latencies include the other's garbage collection.
func replayBoth(ctx context.Context, c *Cluster, cl *claims, jobs []Job, timed bool, strategy planner.Strategy) (Metrics, Metrics, error) {
	ours, err := replay(ctx, c, jobs, timed, "gputopo", newGputopo(c, cl, strategy))
	if err != nil {
		return ours, Metrics{}, fmt.Errorf("gputopo: %w", err)
	}
	base, err := replay(ctx, c, jobs, timed, "baseline", newBaseline(c, cl))
	if err != nil {
		return ours, base, fmt.Errorf("baseline: %w", err)
	}
	return ours, base, nil
}
