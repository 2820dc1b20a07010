package scale

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/prometheus/procfs"

	cluster "github.com/gputopo/gputopo/test/cluster"
)

// Modes of Run.
const (
	ModeThroughput = "throughput"
	ModeController = "controller"
	ModePlugin     = "plugin"
	ModeNative     = "native"
)

// RunConfig is one benchmark run.
type RunConfig struct {
	Mode string
	// Dir is the cluster directory; BinDir holds gputopo-controller and
	// gputopo-kubelet-plugin; Manifests (a file or directory) are applied
	// before the controller starts: the admission policies.
	Dir, BinDir, Manifests string
	// Topology generates the fake nodes; the plugin mode uses its first
	// profile on one real node.
	Topology cluster.Topology
	Limits   Limits
	// CPURequests weigh the processes' CPU as their pods' requests would
	// (ParseCPURequests); empty shares the CPUs equally.
	CPURequests map[string]int64
	// Throughput mode: the topology workload's mix ("name=weight,...") and
	// the rest of its options (Pods 0 is one per node).
	Mix        string
	Throughput ThroughputOptions
	// Controller mode: Job shapes ("PODSxGPUS=weight,...") and options.
	JobMix         string
	Controller     ControllerOptions
	ControllerArgs []string
	// Native mode: the head-to-head against kube-scheduler's own
	// workload-aware scheduling.
	Native NativeOptions
	// Plugin mode: pods of PluginTemplate run on the real node.
	PluginTemplate string
	PluginPods     int
	// Command is recorded in the report.
	Command string
}

// Run starts the cluster, runs the benchmark and stops the cluster. It
// returns the Markdown report and every figure (for JSON). The cluster's
// directory is left in place: the caller removes it.
func Run(ctx context.Context, cfg RunConfig) (report []byte, result any, err error) {
	opts := ClusterOptions{Dir: cfg.Dir, Limits: cfg.Limits, CPURequests: cfg.CPURequests, Progress: os.Stderr}
	topo := cfg.Topology
	switch cfg.Mode {
	case ModeThroughput:
		if cfg.Throughput.NodeSelectors {
			opts.ControllerBin = filepath.Join(cfg.BinDir, "gputopo-controller")
			opts.ControllerArgs = cfg.ControllerArgs
			opts.Manifests = []string{cfg.Manifests}
		}
	case ModeController:
		opts.AuditLog = true
		if cfg.Controller.Path != "" && cfg.Controller.Path != PathGputopo {
			if _, err := pathTemplates(cfg.Controller.Path); err != nil {
				return nil, nil, err
			}
			if cfg.Controller.ProfileDir != "" {
				return nil, nil, fmt.Errorf("--controller-profile-dir profiles the gputopo controller, which path %s does not run", cfg.Controller.Path)
			}
			break
		}
		opts.ControllerBin = filepath.Join(cfg.BinDir, "gputopo-controller")
		opts.ControllerArgs = cfg.ControllerArgs
		if cfg.Controller.ProfileDir != "" {
			opts.ControllerArgs = append([]string{"--profiling", "--contention-profiling"}, opts.ControllerArgs...)
		}
		opts.Manifests = []string{cfg.Manifests}
	case ModeNative:
		opts.ControllerBin = filepath.Join(cfg.BinDir, "gputopo-controller")
		opts.ControllerArgs = cfg.ControllerArgs
		opts.Manifests = []string{cfg.Manifests}
		opts.FeatureGates = WorkloadGates
	case ModePlugin:
		if len(topo.Profiles) == 0 {
			return nil, nil, fmt.Errorf("the plugin mode needs a profile")
		}
		topo = cluster.Topology{Spines: 1, LeavesPerSpine: 1, NodesPerLeaf: 1, Profiles: topo.Profiles[:1], RealNodes: 1}
		opts.PluginBin = filepath.Join(cfg.BinDir, "gputopo-kubelet-plugin")
	default:
		return nil, nil, fmt.Errorf("mode %q: use %s, %s, %s or %s", cfg.Mode, ModeThroughput, ModeController, ModeNative, ModePlugin)
	}
	for _, b := range []string{opts.ControllerBin, opts.PluginBin} {
		if _, err := os.Stat(b); b != "" && err != nil {
			return nil, nil, fmt.Errorf("%w (run `make build`, or point the benchmark at the binaries' directory)", err)
		}
	}
	var tmix, jmix []Weighted
	if cfg.Mode == ModeThroughput {
		if tmix, err = ParseMix(cfg.Mix); err != nil {
			return nil, nil, err
		}
	}
	if cfg.Mode == ModeController {
		if jmix, err = ParseMix(cfg.JobMix); err != nil {
			return nil, nil, err
		}
	}
	if opts.Nodes, err = topo.Expand(); err != nil {
		return nil, nil, fmt.Errorf("topology: %w", err)
	}
	env, err := StartEnv(ctx, opts)
	if err != nil {
		return nil, nil, err
	}
	defer env.Stop()

	var out bytes.Buffer
	shape := fmt.Sprintf("%d nodes (%d spines × %d leaves × %d nodes, %s), %d GPUs",
		len(opts.Nodes), topo.Spines, topo.LeavesPerSpine, topo.NodesPerLeaf, strings.Join(topo.Profiles, ","), env.GPUs)
	switch cfg.Mode {
	case ModeThroughput:
		o := cfg.Throughput
		o.Mix = tmix
		if o.Pods == 0 {
			o.Pods = len(opts.Nodes)
		}
		runs, err := Throughput(ctx, env, o)
		mem := Memory(env.Cluster.Dir(), ControlPlane...)
		WriteThroughput(&out, fmt.Sprintf("Scheduler throughput: %s; %d pods per workload, topology mix %s", shape, o.Pods, cfg.Mix), runs, mem)
		result = map[string]any{"runs": runs, "memory": mem}
		if err != nil {
			return out.Bytes(), result, err
		}
	case ModeController:
		o := cfg.Controller
		o.Mix = jmix
		r, err := Controller(ctx, env, o)
		WriteController(&out, fmt.Sprintf("Controller: %s; %d Jobs, mix %s, path %s", shape, o.Jobs, cfg.JobMix, r.Path), r)
		result = r
		if err != nil {
			return out.Bytes(), result, err
		}
	case ModeNative:
		o := cfg.Native
		o.NodesPerLeaf, o.NodesPerSpine = topo.NodesPerLeaf, topo.NodesPerLeaf*topo.LeavesPerSpine
		o.GPUsPerNode = env.GPUs / max(len(opts.Nodes), 1)
		rows, err := Native(ctx, env, o)
		WriteNative(&out, fmt.Sprintf("Against kube-scheduler's workload-aware scheduling: %s; seed %d, %d Jobs, a filler pod every %d Jobs, one arrival every %s", shape, o.Seed, o.Jobs, o.FillerEvery, o.Interval), rows)
		result = rows
		if err != nil {
			return out.Bytes(), result, err
		}
	case ModePlugin:
		r, err := PluginMemory(ctx, env, cfg.PluginTemplate, cfg.PluginPods)
		if err != nil {
			return nil, r, err
		}
		WritePlugin(&out, r)
		result = r
	}
	fmt.Fprintf(&out, "Command: `%s`. %s\n\n", cfg.Command, machine())
	return out.Bytes(), result, nil
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
