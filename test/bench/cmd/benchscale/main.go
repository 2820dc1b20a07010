// Command benchscale measures gputopo at scale on the local cluster with
// kubelet-less fake nodes (see test/bench/scale and docs/benchmarks.md):
//
//	benchscale --mode=throughput [--spines=5 --leaves-per-spine=10 --nodes-per-leaf=10]
//	benchscale --mode=controller --spines=10 --leaves-per-spine=50 --jobs=1000
//	benchscale --mode=plugin
//
// It prints a Markdown report (also appended to --report) and writes every
// figure as JSON to --json. Run it through `make bench-scale`, which holds
// the local-cluster lock so no other cluster shares the machine.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"

	"github.com/gputopo/gputopo/test/bench/scale"
	cluster "github.com/gputopo/gputopo/test/cluster"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "benchscale: %v\n", err)
		os.Exit(1)
	}
}

type flags struct {
	mode, dir, binDir, report, jsonOut    string
	spines, leaves, perLeaf               int
	profiles, mix, jobMix, controllerArgs string
	pods, rounds, jobs                    int
	stall, settle                         time.Duration
	limits                                scale.Limits
	pluginTemplate                        string
	pluginPods                            int
	keep                                  bool
}

func parse() (*flags, error) {
	f := &flags{limits: scale.DefaultLimits()}
	fs := flag.NewFlagSet("benchscale", flag.ContinueOnError)
	fs.StringVar(&f.mode, "mode", "throughput", "throughput (scheduler, topology vs count-only claims), controller (Jobs through gputopo-controller) or plugin (kubelet plugin memory on one real node)")
	fs.StringVar(&f.dir, "dir", filepath.Join(os.TempDir(), "gputopo-bench"), "cluster directory; removed after a run without errors unless --keep")
	fs.StringVar(&f.binDir, "bin-dir", "bin", "directory holding gputopo-controller and gputopo-kubelet-plugin (`make build`)")
	fs.StringVar(&f.report, "report", "", "append the Markdown report to this file")
	fs.StringVar(&f.jsonOut, "json", "", "write every figure as JSON to this file")
	fs.IntVar(&f.spines, "spines", 5, "spines of the fake cluster")
	fs.IntVar(&f.leaves, "leaves-per-spine", 10, "leaves under each spine")
	fs.IntVar(&f.perLeaf, "nodes-per-leaf", 10, "fake nodes under each leaf")
	fs.StringVar(&f.profiles, "profiles", "dgx-h100", "simulated GPU profiles of the nodes, comma-separated, cycled over the nodes (pkg/gpu/sim/profiles)")
	fs.IntVar(&f.pods, "pods", 0, "throughput: pods per workload; 0 is one per node")
	fs.StringVar(&f.mix, "mix", "gpu-4-nvlink,gpu-2-nvlink-pair,gpu-8-node,gpu-4-leaf", "throughput: the topology workload's demo claim templates as name=weight; gpu-4-leaf is spread over the leaves")
	fs.IntVar(&f.rounds, "rounds", 2, "throughput: rounds of both workloads; odd rounds run the count-only workload first")
	fs.DurationVar(&f.stall, "stall", time.Minute, "throughput: end a workload when no pod was bound for this long")
	fs.IntVar(&f.jobs, "jobs", 1000, "controller: Jobs created at once")
	fs.StringVar(&f.jobMix, "job-mix", "2x8=3,4x8=2,8x8=1,16x8=1,1x1=2,1x2=2,1x4=2", "controller: Job shapes PODSxGPUS with weights")
	fs.DurationVar(&f.settle, "settle", 3*time.Minute, "controller: end the run when no Job was bound for this long")
	fs.StringVar(&f.controllerArgs, "controller-args", "", "controller: extra flags for gputopo-controller, space-separated")
	fs.StringVar(&f.pluginTemplate, "plugin-template", "gpu-2-nvlink-pair", "plugin: the claim template of the pods run on the real node")
	fs.IntVar(&f.pluginPods, "plugin-pods", 4, "plugin: pods run on the real node")
	fs.IntVar(&f.limits.MaxRequestsInflight, "apiserver-max-requests-inflight", f.limits.MaxRequestsInflight, "kube-apiserver --max-requests-inflight (mutating: half)")
	fs.IntVar(&f.limits.ComponentQPS, "component-qps", f.limits.ComponentQPS, "client QPS and burst of kube-scheduler and kube-controller-manager")
	fs.IntVar(&f.limits.ClientQPS, "client-qps", f.limits.ClientQPS, "QPS and burst of the benchmark's own client")
	fs.BoolVar(&f.keep, "keep", false, "keep the cluster directory (logs, audit log) after the run")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q: every setting is a flag (see -h)", fs.Args())
	}
	switch f.mode {
	case "throughput", "controller", "plugin":
	default:
		return nil, fmt.Errorf("--mode=%q: use throughput, controller or plugin", f.mode)
	}
	return f, nil
}

func run() error {
	f, err := parse()
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	binDir, err := filepath.Abs(f.binDir)
	if err != nil {
		return err
	}
	opts := scale.ClusterOptions{Dir: f.dir, Limits: f.limits, Progress: os.Stderr}
	topo := cluster.Topology{Spines: f.spines, LeavesPerSpine: f.leaves, NodesPerLeaf: f.perLeaf, Profiles: strings.Split(f.profiles, ",")}
	if f.mode == "plugin" {
		topo = cluster.Topology{Spines: 1, LeavesPerSpine: 1, NodesPerLeaf: 1, Profiles: topo.Profiles[:1], RealNodes: 1}
		opts.PluginBin = filepath.Join(binDir, "gputopo-kubelet-plugin")
	}
	if opts.Nodes, err = topo.Expand(); err != nil {
		return fmt.Errorf("topology: %w", err)
	}
	if f.mode == "controller" {
		opts.ControllerBin = filepath.Join(binDir, "gputopo-controller")
		opts.ControllerArgs = strings.Fields(f.controllerArgs)
		root, err := repoRoot()
		if err != nil {
			return err
		}
		opts.Manifests = []string{filepath.Join(root, "deployments", "admission")}
		opts.AuditLog = true
	}
	for _, b := range []string{opts.ControllerBin, opts.PluginBin} {
		if _, err := os.Stat(b); b != "" && err != nil {
			return fmt.Errorf("%w (run `make build`, or point --bin-dir at the binaries)", err)
		}
	}

	env, err := scale.StartEnv(ctx, opts)
	if err != nil {
		return err
	}
	var report bytes.Buffer
	var result any
	nodes := len(opts.Nodes)
	shape := fmt.Sprintf("%d nodes (%d spines × %d leaves × %d nodes, %s), %d GPUs", nodes, f.spines, f.leaves, f.perLeaf, f.profiles, env.GPUs)
	switch f.mode {
	case "throughput":
		mix, err := scale.ParseMix(f.mix)
		if err == nil {
			pods := f.pods
			if pods == 0 {
				pods = nodes
			}
			var runs []scale.WorkloadResult
			runs, err = scale.Throughput(ctx, env, scale.ThroughputOptions{Pods: pods, Mix: mix, Rounds: f.rounds, Stall: f.stall, Creators: 32})
			mem := scale.Memory(env.Cluster.Dir(), scale.ControlPlane...)
			scale.WriteThroughput(&report, fmt.Sprintf("Scheduler throughput: %s; %d pods per workload, topology mix %s", shape, pods, f.mix), runs, mem)
			result = map[string]any{"runs": runs, "memory": mem}
		}
		if err != nil {
			return finish(env, f, err)
		}
	case "controller":
		mix, err := scale.ParseMix(f.jobMix)
		if err == nil {
			var r scale.ControllerResult
			r, err = scale.Controller(ctx, env, scale.ControllerOptions{Jobs: f.jobs, Mix: mix, Settle: f.settle, Creators: 32})
			scale.WriteController(&report, fmt.Sprintf("Controller: %s; %d Jobs, mix %s", shape, f.jobs, f.jobMix), r)
			result = r
		}
		if err != nil {
			return finish(env, f, err)
		}
	case "plugin":
		r, err := scale.PluginMemory(ctx, env, f.pluginTemplate, f.pluginPods)
		if err != nil {
			return finish(env, f, err)
		}
		scale.WritePlugin(&report, r)
		result = r
	}
	fmt.Fprintf(&report, "Command: `%s`. %s\n\n", strings.Join(os.Args, " "), machine())
	os.Stdout.Write(report.Bytes())
	if err := writeOutputs(f, report.Bytes(), result); err != nil {
		return finish(env, f, err)
	}
	return finish(env, f, nil)
}

// finish stops the cluster and removes its directory unless the run failed
// or --keep asks to keep it.
func finish(env *scale.Env, f *flags, runErr error) error {
	env.Stop()
	if runErr != nil || f.keep {
		fmt.Fprintf(os.Stderr, "benchscale: cluster directory kept: %s\n", env.Cluster.Dir())
		return runErr
	}
	if err := os.RemoveAll(env.Cluster.Dir()); err != nil {
		return fmt.Errorf("remove cluster directory: %w", err)
	}
	return nil
}

func writeOutputs(f *flags, report []byte, result any) error {
	if f.report != "" {
		out, err := os.OpenFile(f.report, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("open report: %w", err)
		}
		_, err = out.Write(report)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write report: %w", err)
		}
	}
	if f.jsonOut != "" {
		data, err := json.MarshalIndent(result, "", "  ")
		if err != nil {
			return fmt.Errorf("encode JSON: %w", err)
		}
		if err := os.WriteFile(f.jsonOut, append(data, '\n'), 0o644); err != nil {
			return fmt.Errorf("write JSON: %w", err)
		}
	}
	return nil
}

// machine describes where the figures come from.
func machine() string {
	desc := fmt.Sprintf("Machine: %d CPU cores", runtime.NumCPU())
	if fs, err := procfs.NewDefaultFS(); err == nil {
		if mi, err := fs.Meminfo(); err == nil && mi.MemTotal != nil {
			desc += fmt.Sprintf(", %.0f GiB memory", float64(*mi.MemTotal)/(1<<20))
		}
	}
	return desc + "."
}

// repoRoot is the nearest parent of the working directory holding the
// gputopo module.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if data, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && bytes.HasPrefix(data, []byte("module github.com/gputopo/gputopo\n")) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("run from the gputopo repository: no go.mod of github.com/gputopo/gputopo above %s", dir)
		}
	}
}
