package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/pkg/cli"
	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/simulate"
)

type simulateFlags struct {
	cluster, trace, format, output, published, strategy string
	locality                                            string
	demand, multiNode, limitFactor                      float64
	seed                                                uint64
	seeds, jobs                                         int
	sharing, cpuPodsOptIn, fair, progress               bool
	maxDomainWait                                       time.Duration
	schedulers                                          []string
	grouping                                            simulate.Grouping
	claims                                              simulate.ClaimFiles
}

func newSimulateCmd(inv cli.Invocation) *cobra.Command {
	f := simulateFlags{grouping: simulate.DefaultGrouping()}
	cmd := &cobra.Command{
		Use:   "simulate --cluster FILE (--trace FILE | --trace-format philly)",
		Short: "Replay a GPU trace offline through gputopo's planner, a model of the default scheduler and first fit",
		Long: `Replays a trace through the same planner, slice generator and structured
allocator as a live cluster, and side by side through a model of the
default kube-scheduler (feasible nodes sampled as it does, scored by
LeastAllocated and BalancedAllocation over CPU and memory, ties broken at
random by --seed) and through first fit over nodes in name order.

The cluster is a cluster topology (the YAML of test/cluster/topologies)
or an Alibaba openb_node_list_*.csv, grouped into leaves of
--nodes-per-leaf nodes and spines of --leaves-per-spine leaves; the node
list's CPU and memory count. With --sharing every GPU is published for
sharing and a pod asking for a share of a GPU takes that share;
without it, it takes a whole GPU. Claims are made from the DeviceClass and
templates named by --device-class, --whole-template and --share-template,
read like any manifest (by default the demo's, built into the binary).

Static traces (Alibaba pod lists, job CSVs without times) arrive until
what they ask for reaches --demand × the cluster's GPUs, counted in
milli-GPUs, and never leave, as in the FGD paper. Timed traces (job CSVs
with arrival_s,duration_s, philly) replay arrivals and departures: a job
that does not fit waits in arrival order, and every job that fits when
GPUs free up starts (backfill).

With --fair (the default) Alibaba lists replay in the FGD artifact's
setup: only the nodes with GPUs, the GPU models a pod's gpu_spec names
enforced for every scheduler, gputopo's fragmentation measured against
the artifact's target workload (the trace's most common pod shapes
covering 95 % of its pods, pods without GPUs and GPU models included, CPU
counted but not memory), and the artifact's arrivals: its random number
generator seeded with --seed, its shuffle, and its tuning to --demand
(pods sampled after the shuffled trace, or removed from it), every tuned
pod arriving; the allocation is also measured as the artifact measures
it (after every pod, averaged over the pods whose arrived demand rounds
to --demand's percent), the figure set beside the paper's.
--fair=false replays every node of the list, ignores gpu_spec, measures
fragmentation against every shape of the arrived pods and builds
arrivals with the replay's own sampling, shuffle and cut. The FGD
paper's published ratios are shown only where the setup is the artifact's: an Alibaba pod list, --fair,
--sharing, a --seed above 0 (the artifact shuffles), pods without GPUs
opted in, and fgd-expected-results beside the trace's directory.`,
		Example: examples(inv,
			"simulate --cluster pkg/simulate/testdata/dgx-h100-2x4x4.yaml --trace-format philly --jobs 1000 --seeds 10",
			"a generated Philly mix on a cluster topology, averaged over 10 seeds"),
		Args:    cobra.NoArgs,
		PreRunE: func(*cobra.Command, []string) error { return f.validate() },
		RunE:    func(cmd *cobra.Command, _ []string) error { return runSimulate(cmd, &f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.cluster, "cluster", "", "Cluster file: YAML topology or Alibaba node list (.csv)")
	fl.StringVar(&f.trace, "trace", "", "Trace file (not for --trace-format philly)")
	fl.StringVar(&f.format, "trace-format", "", "alibaba, jobs or philly (default: from the trace's header)")
	fl.Float64Var(&f.demand, "demand", 1.3, "Static traces: arrived GPU demand as a multiple of the cluster's GPUs (0: whole trace). Philly: offered load")
	fl.Uint64Var(&f.seed, "seed", 0, "Shuffle static arrivals with this seed (0: trace order); seeds the philly generator")
	fl.IntVar(&f.seeds, "seeds", 1, "Replay seeds --seed, --seed+1, ... and report means (the FGD paper uses 10)")
	fl.StringVarP(&f.output, "output", "o", "table", "table or json")
	fl.StringVar(&f.published, "published", "", "FGD artifact results (default: ../fgd-expected-results/analysis_allo_discrete.csv beside an Alibaba trace)")
	fl.StringVar(&f.strategy, "strategy", "", "gputopo strategy: "+strategies()+" (default: the planner's; for one-pod jobs, fragmentation-aware)")
	fl.BoolVar(&f.sharing, "sharing", false, "Publish every GPU for sharing: pods asking for a share of a GPU take that share")
	fl.StringSliceVar(&f.schedulers, "schedulers", nil, "Schedulers to replay: gputopo, default (the model of the default scheduler), firstfit, fgd (a transcription of the FGD artifact's scheduler; Alibaba lists with --fair only); default: the first three")
	fl.DurationVar(&f.maxDomainWait, "max-domain-wait", -1, "Timed traces: how long gputopo keeps a multi-node job waiting for a domain of its size rule before it may take a bigger one (0: place at once; negative: no limit)")
	fl.BoolVar(&f.fair, "fair", true, "Alibaba lists: the FGD artifact's setup (GPU nodes only, gpu_spec's GPU models enforced, its target workload for fragmentation, its arrivals); false: every node, gpu_spec ignored, every arrived pod shape, the replay's own arrivals")
	fl.BoolVar(&f.cpuPodsOptIn, "cpu-pods-opt-in", true, "Pods without GPUs (Alibaba traces) opt in to gputopo's placement, as every pod goes through FGD in the paper; false leaves them to the default scheduler's model")
	fl.StringVar(&f.claims.DeviceClass, "device-class", "", "DeviceClass manifest of the pods' claims (default: the built-in demo/specs/"+simulate.EmbeddedClaimFiles.DeviceClass+")")
	fl.StringVar(&f.claims.Whole, "whole-template", "", "ResourceClaimTemplate for whole GPUs: one request whose count is set to the pod's GPUs (default: the built-in demo/specs/"+simulate.EmbeddedClaimFiles.Whole+")")
	fl.StringVar(&f.claims.Share, "share-template", "", "ResourceClaimTemplate for a share of a GPU: one request whose milliGPU is set to the pod's share (default: the built-in demo/specs/"+simulate.EmbeddedClaimFiles.Share+")")
	fl.StringVar(&f.locality, "locality", simulate.DefaultLocality().String(), "Timed traces: a job runs for its duration times the factor of the highest tier its pods span, as tier=factor pairs (node, leaf, spine, cross; unnamed tiers keep the default), or none")
	fl.Float64Var(&f.limitFactor, "limit-factor", 0, "Timed traces: every job declares a run-time limit of its duration times this factor (at least 1), and the queue backfills as EASY backfill does with those limits; 0: no limits, every waiting job that fits starts")
	fl.BoolVar(&f.progress, "progress", false, "Print a line per seed to stderr as it is done")
	fl.IntVar(&f.jobs, "jobs", 1000, "Philly: number of jobs")
	fl.Float64Var(&f.multiNode, "multinode-fraction", 0.1, "Philly: fraction of multi-node jobs (2-8 pods of 8 GPUs)")
	fl.IntVar(&f.grouping.NodesPerLeaf, "nodes-per-leaf", f.grouping.NodesPerLeaf, "Node-list clusters: consecutive nodes per leaf")
	fl.IntVar(&f.grouping.LeavesPerSpine, "leaves-per-spine", f.grouping.LeavesPerSpine, "Node-list clusters: consecutive leaves per spine")
	_ = cmd.MarkFlagRequired("cluster")
	return cmd
}

// strategies lists the values --strategy takes.
func strategies() string {
	var s []string
	for _, st := range placement.Strategies {
		s = append(s, string(st))
	}
	return strings.Join(s, ", ")
}

// validate refuses flag values the replay cannot use, before any work.
func (f *simulateFlags) validate() error {
	var errs []error
	if f.output != "table" && f.output != "json" {
		errs = append(errs, fmt.Errorf("unknown output format %q: want one of table, json", f.output))
	}
	if f.seeds < 1 {
		errs = append(errs, fmt.Errorf("--seeds %d: want at least 1 (how many seeds to replay and average)", f.seeds))
	}
	if f.grouping.NodesPerLeaf < 1 {
		errs = append(errs, fmt.Errorf("--nodes-per-leaf %d: want at least 1", f.grouping.NodesPerLeaf))
	}
	if f.grouping.LeavesPerSpine < 1 {
		errs = append(errs, fmt.Errorf("--leaves-per-spine %d: want at least 1", f.grouping.LeavesPerSpine))
	}
	if f.strategy != "" && !slices.Contains(placement.Strategies, placement.Strategy(f.strategy)) {
		errs = append(errs, fmt.Errorf("unknown --strategy %q: want one of %s", f.strategy, strategies()))
	}
	if f.limitFactor != 0 && f.limitFactor < 1 {
		errs = append(errs, fmt.Errorf("--limit-factor %v: want 0 (no limits) or at least 1 (a limit never below the run time)", f.limitFactor))
	}
	if _, err := simulate.ParseLocality(f.locality); err != nil {
		errs = append(errs, fmt.Errorf("--locality: %w", err))
	}
	for _, s := range f.schedulers {
		if !slices.Contains(simulate.Schedulers, s) {
			errs = append(errs, fmt.Errorf("unknown --schedulers %q: want some of %s", s, strings.Join(simulate.Schedulers, ", ")))
		}
	}
	return errors.Join(errs...)
}

func runSimulate(cmd *cobra.Command, f *simulateFlags) error {
	if os.Getenv("GOGC") == "" {
		// Planning allocates many short-lived candidates; a lazier GC
		// makes a 1,213-node replay about a third faster for a few
		// hundred MiB.
		debug.SetGCPercent(400)
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt)
	defer stop()
	f.grouping.GPUNodesOnly = f.fair
	c, err := simulate.LoadCluster(f.cluster, f.grouping, simulate.ClusterOptions{Sharing: f.sharing})
	if err != nil {
		return err
	}
	claims, err := simulate.LoadClaims(f.claims)
	if err != nil {
		return err
	}
	opt := simulate.Options{Demand: f.demand, Seed: f.seed, Seeds: f.seeds, Strategy: planner.Strategy(f.strategy), CPUPodsOptIn: f.cpuPodsOptIn, MaxDomainWait: f.maxDomainWait,
		GPUModels: f.fair, FGDWorkload: f.fair, FGDArrivals: f.fair, Schedulers: f.schedulers}
	loc, err := simulate.ParseLocality(f.locality)
	if err != nil {
		return err
	}
	opt.Locality = &loc
	opt.LimitFactor = f.limitFactor
	if f.progress {
		opt.Progress = cmd.ErrOrStderr()
	}
	var src simulate.Source
	var published []simulate.Published
	if f.format == simulate.FormatPhilly {
		if f.trace != "" {
			return fmt.Errorf("--trace-format philly generates its trace: drop --trace %s", f.trace)
		}
		cfg := simulate.DefaultPhilly(c.GPUs)
		cfg.Jobs, cfg.MultiNodeFraction, cfg.Load = f.jobs, f.multiNode, f.demand
		src = simulate.Philly(cfg)
	} else {
		if f.trace == "" {
			return fmt.Errorf("--trace is required unless --trace-format is philly")
		}
		tr, err := simulate.LoadTrace(f.trace, f.format)
		if err != nil {
			return err
		}
		src = simulate.Fixed(tr)
		if tr.Format == simulate.FormatAlibaba {
			opt.Inflate = true
		}
		if simulate.PaperSetting(tr, c, opt) {
			file := f.published
			if file == "" {
				file = simulate.PublishedFile(f.trace)
			}
			if published, err = simulate.LoadPublished(file, simulate.Workload(f.trace), f.demand); err != nil {
				return err
			}
		}
	}
	res, err := simulate.Run(ctx, c, claims, src, opt)
	if err != nil {
		return err
	}
	res.Published = published
	if f.output == "json" {
		return simulate.WriteJSON(cmd.OutOrStdout(), res)
	}
	return simulate.WriteTable(cmd.OutOrStdout(), res)
}
