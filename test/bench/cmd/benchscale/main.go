// Command benchscale measures gputopo at scale on the local cluster with
// kubelet-less fake nodes (see test/bench/scale and docs/benchmarks.md):
//
//	benchscale --mode=throughput [--spines=5 --leaves-per-spine=10 --nodes-per-leaf=10]
//	benchscale --mode=controller --spines=10 --leaves-per-spine=50 --jobs=1000
//	benchscale --mode=native [--spines=10 --leaves-per-spine=10]   # 100 nodes, or 1,000
//	benchscale --mode=plugin
//
// It prints a Markdown report (also appended to --report) and writes every
// figure as JSON to --json. Run it through `make bench-scale`, which holds
// the local-cluster lock so no other cluster shares the machine.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/gputopo/gputopo/test/bench/scale"
)

func main() {
	if err := run(); err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(os.Stderr, "benchscale: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	cfg := scale.RunConfig{Limits: scale.DefaultLimits(), Command: strings.Join(os.Args, " ")}
	var profiles, controllerArgs, cpuRequests, reportFile, jsonFile, paths string
	var keep bool
	fs := flag.NewFlagSet("benchscale", flag.ContinueOnError)
	fs.StringVar(&cfg.Mode, "mode", scale.ModeThroughput, "throughput (scheduler: topology vs count-only claims), controller (Jobs through gputopo-controller), native (one stream of Jobs through kube-scheduler's gang and topology placement and through gputopo) or plugin (kubelet plugin memory on one real node)")
	fs.StringVar(&cfg.Dir, "dir", filepath.Join(os.TempDir(), "gputopo-bench"), "cluster directory; removed after a run without errors unless --keep")
	fs.StringVar(&cfg.BinDir, "bin-dir", "bin", "directory holding gputopo-controller and gputopo-kubelet-plugin (`make build`)")
	fs.StringVar(&cfg.Manifests, "manifests", filepath.Join("deployments", "admission"), "controller: admission manifests applied before the controller starts (the scheduling gate)")
	fs.StringVar(&reportFile, "report", "", "append the Markdown report to this file")
	fs.StringVar(&jsonFile, "json", "", "write every figure as JSON to this file")
	fs.IntVar(&cfg.Topology.Spines, "spines", 5, "spines of the fake cluster")
	fs.IntVar(&cfg.Topology.LeavesPerSpine, "leaves-per-spine", 10, "leaves under each spine")
	fs.IntVar(&cfg.Topology.NodesPerLeaf, "nodes-per-leaf", 10, "fake nodes under each leaf")
	fs.StringVar(&profiles, "profiles", "dgx-h100", "simulated GPU profiles, comma-separated, cycled over the nodes (pkg/gpu/sim/profiles)")
	fs.IntVar(&cfg.Throughput.Pods, "pods", 0, "throughput: pods per workload; 0 is one per node")
	fs.StringVar(&cfg.Mix, "mix", "gpu-4-nvlink,gpu-2-nvlink-pair,gpu-8-node,gpu-4-leaf", "throughput: the topology workload's demo claim templates as name=weight; gpu-4-leaf is spread over the leaves")
	fs.BoolVar(&cfg.Throughput.NodeSelectors, "claim-node-selectors", false, "throughput: run gputopo-controller and the admission policies, so pods whose claims pin a leaf in CEL get the equivalent node selector")
	fs.IntVar(&cfg.Throughput.Rounds, "rounds", 2, "throughput: rounds of both workloads; odd rounds run the count-only workload first")
	fs.DurationVar(&cfg.Throughput.Stall, "stall", time.Minute, "throughput: end a workload when no pod was bound for this long")
	fs.IntVar(&cfg.Controller.Jobs, "jobs", 1000, "controller: Jobs created at once")
	fs.StringVar(&cfg.Controller.Path, "path", scale.PathGputopo, "controller: how the Jobs are placed: "+scale.PathGputopo+" (claims from the demo templates, through gputopo-controller), "+scale.PathCountOnly+" (claims for the same GPU counts and nothing else, kube-scheduler alone) or "+scale.PathNoClaims+" (pods with no claim, kube-scheduler alone: the floor of the other two)")
	fs.StringVar(&cfg.JobMix, "job-mix", "2x8=3,4x8=2,8x8=1,16x8=1,1x1=2,1x2=2,1x4=2", "controller: Job shapes PODSxGPUS with weights")
	fs.DurationVar(&cfg.Controller.Settle, "settle", 3*time.Minute, "controller: end the run when no Job was bound for this long")
	fs.DurationVar(&cfg.Controller.Spread, "spread", 0, "controller: create the Jobs evenly over this long instead of at once (0: at once)")
	fs.DurationVar(&cfg.Controller.Hold, "hold", 0, "controller: delete each Job and its pods this long after all its pods are bound, as if it completed, so more GPUs than the cluster has can be asked for (0: Jobs stay)")
	fs.StringVar(&cfg.Controller.ProfileDir, "controller-profile-dir", "", "controller: save the controller's and kube-apiserver's CPU profiles (from the first create, for --controller-profile-for) and the controller's heap, mutex and block profiles here")
	fs.DurationVar(&cfg.Controller.ProfileFor, "controller-profile-for", time.Minute, "controller: how long the CPU profile runs")
	fs.DurationVar(&cfg.Controller.TraceFor, "controller-trace-for", 0, "controller: with --controller-profile-dir, also record the controller's Go execution trace (controller-trace.pprof, read with `go tool trace`) for this long from the first create; the report then breaks down where the slowest plans' time went")
	fs.StringVar(&controllerArgs, "controller-args", "", "controller: extra flags for gputopo-controller, space-separated")
	fs.StringVar(&cpuRequests, "cpu-requests", "", "weigh the processes' CPU as kubelet weighs pods with these CPU requests, each in a cpu cgroup of its own: kubeadm (its static pods' requests) and/or NAME=QUANTITY for etcd, kube-apiserver, kube-controller-manager, kube-scheduler, controller; e.g. kubeadm,controller=250m. Empty: every process shares the CPUs equally")
	fs.Uint64Var(&cfg.Native.Seed, "seed", 1, "native: the stream's seed; one seed is one stream for every path")
	fs.IntVar(&cfg.Native.Jobs, "native-jobs", 60, "native: Jobs in the stream")
	fs.IntVar(&cfg.Native.FillerEvery, "filler-every", 3, "native: a plain one-GPU filler pod after every this many Jobs (0: none)")
	fs.DurationVar(&cfg.Native.Interval, "interval", 250*time.Millisecond, "native: time between two arrivals of the stream")
	fs.DurationVar(&cfg.Native.Settle, "native-settle", 30*time.Second, "native: end a path's stream when no pod was bound for this long")
	fs.IntVar(&cfg.Native.Probes, "probes", 3, "native: capacity-freed probes per path")
	fs.StringVar(&paths, "paths", strings.Join(scale.AllPaths, ","), "native: the paths to run, comma-separated")
	fs.StringVar(&cfg.PluginTemplate, "plugin-template", "gpu-2-nvlink-pair", "plugin: the claim template of the pods run on the real node")
	fs.IntVar(&cfg.PluginPods, "plugin-pods", 4, "plugin: pods run on the real node")
	fs.IntVar(&cfg.Limits.MaxRequestsInflight, "apiserver-max-requests-inflight", cfg.Limits.MaxRequestsInflight, "kube-apiserver --max-requests-inflight (mutating: half)")
	fs.IntVar(&cfg.Limits.ComponentQPS, "component-qps", cfg.Limits.ComponentQPS, "client QPS and burst of kube-scheduler and kube-controller-manager")
	fs.IntVar(&cfg.Limits.ClientQPS, "client-qps", cfg.Limits.ClientQPS, "QPS and burst of the benchmark's own client")
	fs.BoolVar(&keep, "keep", false, "keep the cluster directory (logs, audit log) after the run")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: every setting is a flag (see -h)", fs.Args())
	}
	cfg.Topology.Profiles = strings.Split(profiles, ",")
	if cfg.Mode == scale.ModeNative {
		// 100 nodes unless the shape is given: 2 spines × 5 leaves × 10.
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["spines"] {
			cfg.Topology.Spines = 2
		}
		if !set["leaves-per-spine"] {
			cfg.Topology.LeavesPerSpine = 5
		}
		for _, p := range strings.Split(paths, ",") {
			if !slices.Contains(scale.AllPaths, p) {
				return fmt.Errorf("--paths: %q is no path; use some of %s", p, strings.Join(scale.AllPaths, ","))
			}
			cfg.Native.Paths = append(cfg.Native.Paths, p)
		}
	}
	cfg.ControllerArgs = strings.Fields(controllerArgs)
	cfg.Throughput.Creators, cfg.Controller.Creators = 32, 32
	var err error
	if cfg.CPURequests, err = scale.ParseCPURequests(cpuRequests); err != nil {
		return err
	}
	if cfg.BinDir, err = filepath.Abs(cfg.BinDir); err != nil {
		return err
	}
	if cfg.Manifests, err = filepath.Abs(cfg.Manifests); err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	report, result, err := scale.Run(ctx, cfg)
	os.Stdout.Write(report)
	if werr := writeOutputs(reportFile, jsonFile, report, result); err == nil {
		err = werr
	}
	if err != nil || keep {
		fmt.Fprintf(os.Stderr, "benchscale: cluster directory kept: %s\n", cfg.Dir)
		return err
	}
	return os.RemoveAll(cfg.Dir)
}

func writeOutputs(reportFile, jsonFile string, report []byte, result any) error {
	if reportFile != "" && len(report) > 0 {
		f, err := os.OpenFile(reportFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("open report: %w", err)
		}
		_, err = f.Write(report)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write report: %w", err)
		}
	}
	if jsonFile != "" && result != nil {
		data, err := json.MarshalIndent(result, "", "  ")
		if err != nil {
			return fmt.Errorf("encode JSON: %w", err)
		}
		if err := os.WriteFile(jsonFile, append(data, '\n'), 0o644); err != nil {
			return fmt.Errorf("write JSON: %w", err)
		}
	}
	return nil
}
