// Package scale measures gputopo on the local cluster (test/cluster) at the
// size of a real GPU cluster: a real kube-apiserver, kube-scheduler and
// kube-controller-manager, hundreds to thousands of kubelet-less fake nodes
// whose ResourceSlices the benchmark publishes exactly as the kubelet plugin
// would (pkg/slices on a pkg/gpu/sim profile), and workloads created at once.
//
// Three measurements share this package: the scheduler's throughput with
// gputopo's topology claims against count-only claims (Throughput), the
// placement controller with many Jobs at once (Controller), and the kubelet
// plugin's memory on one real node (PluginMemory).
package scale

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gputopo/gputopo/demo/specs"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/slices"
	cluster "github.com/gputopo/gputopo/test/cluster"
)

// Namespace holds every object a benchmark creates.
const Namespace = "gputopo-bench"

// ClusterOptions say which cluster a benchmark runs on.
type ClusterOptions struct {
	// Dir is the cluster directory (logs, audit log, etcd).
	Dir string
	// Nodes are the cluster's nodes (cluster.Topology.Expand labels them as
	// the harness labels every node). The benchmark publishes the slices of
	// fake nodes; real nodes run a kubelet and PluginBin, which publishes
	// theirs. PluginBin requires every node to be real: the harness would
	// otherwise publish the fake nodes' slices too.
	Nodes     []cluster.NodeSpec
	PluginBin string
	// ControllerBin, when set, runs the gputopo controller; it is
	// restarted once the slices are published, so it starts on a complete
	// cluster as it would after an upgrade.
	ControllerBin  string
	ControllerArgs []string
	// Manifests are applied before the controller starts.
	Manifests []string
	// Limits are the control plane's request limits.
	Limits Limits
	// AuditLog records every write with its client, to count who wrote what.
	AuditLog bool
	// FeatureGates are added to the cluster's default gates.
	FeatureGates map[string]bool
	// CPURequests weigh the processes' CPU as kubelet weighs pods with
	// these requests (cluster.Config.CPURequests).
	CPURequests map[string]int64
	Progress    io.Writer
}

// Limits raise the defaults that would otherwise cap the control plane far
// below what the machine can do (a client at 50 QPS binds at most ~25 pods/s).
type Limits struct {
	// MaxRequestsInflight is kube-apiserver's --max-requests-inflight;
	// --max-mutating-requests-inflight gets half of it.
	MaxRequestsInflight int
	// ComponentQPS is the client QPS (and burst) of kube-scheduler and
	// kube-controller-manager.
	ComponentQPS int
	// ClientQPS is the benchmark's own client's QPS (and burst).
	ClientQPS int
}

// DefaultLimits are the limits the documented runs use.
func DefaultLimits() Limits {
	return Limits{MaxRequestsInflight: 800, ComponentQPS: 500, ClientQPS: 1000}
}

// Env is a running benchmark cluster.
type Env struct {
	Cluster *cluster.Cluster
	// Client has the benchmark's own rate limits and speaks protobuf.
	Client kubernetes.Interface
	REST   *rest.Config
	Nodes  []cluster.NodeSpec
	// Leaves are the leaf names in topology order.
	Leaves []string
	// GPUs is the number of devices published.
	GPUs     int
	auditLog string
	progress io.Writer
	start    time.Time
}

// StartEnv starts the cluster, publishes every fake node's ResourceSlices,
// creates the benchmark namespace and installs the DeviceClass and the demo
// claim templates.
func StartEnv(ctx context.Context, opts ClusterOptions) (*Env, error) {
	var fake []cluster.NodeSpec
	for _, n := range opts.Nodes {
		if !n.Real {
			fake = append(fake, n)
		}
	}
	if opts.PluginBin != "" && len(fake) > 0 {
		return nil, fmt.Errorf("%d fake nodes with a plugin binary: the benchmark publishes fake nodes' slices itself, so run the plugin only on a cluster of real nodes", len(fake))
	}
	env := &Env{progress: opts.Progress, start: time.Now(), Nodes: opts.Nodes, Leaves: leavesOf(opts.Nodes)}
	if env.progress == nil {
		env.progress = os.Stderr
	}
	// Build every slice first: a bad profile fails before anything starts.
	objs, gpus, err := BuildSlices(fake)
	if err != nil {
		return nil, err
	}
	env.GPUs = gpus
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("resolve cluster dir: %w", err)
	}
	extra, err := controlPlaneArgs(dir, opts.Limits, opts.AuditLog)
	if err != nil {
		return nil, err
	}
	if opts.AuditLog {
		env.auditLog = filepath.Join(dir, "audit.log")
	}
	c, err := cluster.Start(ctx, cluster.Config{
		Dir: dir, Nodes: opts.Nodes, PluginBin: opts.PluginBin,
		ControllerBin: opts.ControllerBin, ControllerArgs: opts.ControllerArgs,
		Manifests: opts.Manifests, ExtraArgs: extra, FeatureGates: opts.FeatureGates,
		CPURequests: opts.CPURequests, Progress: opts.Progress, Timeout: 30 * time.Minute,
	})
	if err != nil {
		return nil, err
	}
	env.Cluster = c
	env.REST = c.RESTConfig()
	env.REST.QPS, env.REST.Burst = float32(opts.Limits.ClientQPS), opts.Limits.ClientQPS
	env.REST.ContentType = "application/vnd.kubernetes.protobuf"
	if env.Client, err = kubernetes.NewForConfig(env.REST); err != nil {
		c.Stop()
		return nil, fmt.Errorf("create benchmark client: %w", err)
	}
	if err := env.setup(ctx, objs, opts.ControllerBin != ""); err != nil {
		c.Stop()
		return nil, err
	}
	return env, nil
}

func (e *Env) setup(ctx context.Context, objs []*resourcev1.ResourceSlice, controller bool) error {
	start := time.Now()
	if err := parallel(ctx, len(objs), 16, func(ctx context.Context, i int) error {
		if _, err := e.Client.ResourceV1().ResourceSlices().Create(ctx, objs[i], metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("publish ResourceSlice %s: %w", objs[i].Name, err)
		}
		return nil
	}); err != nil {
		return err
	}
	e.Progressf("published %d ResourceSlices (%d GPUs) in %s", len(objs), e.GPUs, since(start))
	if controller {
		// Start it again on the complete cluster.
		if err := e.Cluster.StopController(); err != nil {
			return err
		}
		if err := e.Cluster.StartController(); err != nil {
			return err
		}
		e.Progressf("controller restarted on the complete cluster")
	}
	if _, err := e.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", Namespace, err)
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := e.Client.CoreV1().ServiceAccounts(Namespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("wait for the default ServiceAccount of %s: %w", Namespace, err)
	}
	class, err := specs.DeviceClass()
	if err != nil {
		return err
	}
	if _, err := e.Client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create DeviceClass %s: %w", class.Name, err)
	}
	return nil
}

// CreateTemplates creates claim templates in the benchmark namespace, each
// name once.
func (e *Env) CreateTemplates(ctx context.Context, tmpls []*resourcev1.ResourceClaimTemplate) error {
	seen := map[string]bool{}
	for _, t := range tmpls {
		if seen[t.Name] {
			continue
		}
		seen[t.Name] = true
		t = t.DeepCopy()
		t.Namespace = Namespace
		if _, err := e.Client.ResourceV1().ResourceClaimTemplates(Namespace).Create(ctx, t, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create ResourceClaimTemplate %s: %w", t.Name, err)
		}
	}
	return nil
}

// Stop stops the cluster.
func (e *Env) Stop() { e.Cluster.Stop() }

// Progressf prints a progress line with the time since the start.
func (e *Env) Progressf(format string, args ...any) {
	fmt.Fprintf(e.progress, "[%7.1fs] %s\n", time.Since(e.start).Seconds(), fmt.Sprintf(format, args...))
}

// BuildSlices returns the ResourceSlices the kubelet plugin would publish on
// every node, and the number of GPUs in them.
func BuildSlices(nodes []cluster.NodeSpec) ([]*resourcev1.ResourceSlice, int, error) {
	profiles := map[string]*sim.Profile{}
	var out []*resourcev1.ResourceSlice
	gpus := 0
	cfg := slices.DefaultConfig()
	for _, n := range nodes {
		p, ok := profiles[n.Profile]
		if !ok {
			var err error
			if p, err = sim.LoadBuiltin(n.Profile); err != nil {
				return nil, 0, fmt.Errorf("node %s: %w (built in: %v)", n.Name, err, sim.Builtin())
			}
			profiles[n.Profile] = p
		}
		res, err := slices.Build(p.Inventory(n.Name), slices.Node{Name: n.Name, Labels: n.AllLabels()}, cfg, nil)
		if err != nil {
			return nil, 0, fmt.Errorf("build ResourceSlices of node %s: %w", n.Name, err)
		}
		for _, s := range slices.Objects(n.Name, res) {
			gpus += len(s.Spec.Devices)
			out = append(out, s)
		}
	}
	return out, gpus, nil
}

// controlPlaneArgs raises the control plane's limits and, with audit, has
// the apiserver log every write.
func controlPlaneArgs(dir string, l Limits, audit bool) (map[string][]string, error) {
	if l.MaxRequestsInflight < 2 || l.ComponentQPS < 1 || l.ClientQPS < 1 {
		return nil, fmt.Errorf("limits %+v: every limit must be positive (max requests in flight at least 2)", l)
	}
	qps := strconv.Itoa(l.ComponentQPS)
	args := map[string][]string{
		"kube-apiserver": {
			"--max-requests-inflight=" + strconv.Itoa(l.MaxRequestsInflight),
			"--max-mutating-requests-inflight=" + strconv.Itoa(l.MaxRequestsInflight/2),
		},
		"kube-scheduler":          {"--kube-api-qps=" + qps, "--kube-api-burst=" + qps},
		"kube-controller-manager": {"--kube-api-qps=" + qps, "--kube-api-burst=" + qps},
	}
	if audit {
		policy := filepath.Join(dir, "audit-policy.yaml")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create cluster dir: %w", err)
		}
		if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
			return nil, fmt.Errorf("write audit policy: %w", err)
		}
		args["kube-apiserver"] = append(args["kube-apiserver"],
			"--audit-policy-file="+policy, "--audit-log-path="+filepath.Join(dir, "audit.log"),
			"--audit-log-format=json", "--audit-log-mode=batch", "--audit-log-maxsize=100000")
	}
	return args, nil
}

// leavesOf lists the nodes' leaves in order of first appearance.
func leavesOf(nodes []cluster.NodeSpec) []string {
	seen := map[string]bool{}
	var out []string
	for _, n := range nodes {
		if !seen[n.Leaf] {
			seen[n.Leaf] = true
			out = append(out, n.Leaf)
		}
	}
	return out
}

// parallel runs fn(0..n-1) on workers goroutines and returns the first error.
func parallel(ctx context.Context, n, workers int, fn func(context.Context, int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := fn(ctx, i); err != nil {
					cancel(err)
				}
			}
		})
	}
feed:
	for i := range n {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return ctx.Err()
}

func since(t time.Time) time.Duration { return time.Since(t).Round(100 * time.Millisecond) }

// percentile returns the p-th percentile (0..1) of xs by nearest rank.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	i := int(p*float64(len(s))+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
}
