// Package cluster runs a local Kubernetes control plane, real kubelets on a
// fake container runtime or on containerd, and fake (kubelet-less) nodes,
// with the gputopo kubelet plugin on each real node, for the demo and the
// e2e tests.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Config says what cluster to start.
type Config struct {
	// Dir holds everything the cluster writes; required.
	Dir string
	// BinDir holds etcd and the Kubernetes binaries; DefaultBinDir() if empty.
	BinDir string
	// ContainerdBinDir holds containerd, its runc shim and ctr, for nodes
	// with runtime containerd; DefaultContainerdBinDir() if empty.
	ContainerdBinDir string
	// Nodes to create, e.g. from LoadTopology.
	Nodes []NodeSpec
	// PluginBin is the gputopo kubelet plugin. Without it no plugin runs and
	// no ResourceSlices are published.
	PluginBin string
	// PluginArgs are appended to the plugin's command line on real nodes.
	PluginArgs []string
	// NoPluginNodes are real nodes on which the harness runs no plugin of
	// its own: something in the cluster runs it there, e.g. the Helm chart's
	// DaemonSet from the project's image on a containerd node
	// (hack/verify-chart-cluster.sh). Start waits for their kubelets only.
	NoPluginNodes []string
	// Images are OCI image layout tarballs (hack/build-image-oci.sh) that
	// every containerd node imports beside ImageBusybox and ImagePause, for
	// pods with imagePullPolicy IfNotPresent or Never.
	Images []string
	// ControllerBin is the gputopo controller; it runs once the nodes are
	// ready when set. ControllerArgs are appended to its command line.
	ControllerBin  string
	ControllerArgs []string
	// Manifests are applied (server-side) once the control plane is up and
	// before the controller starts, e.g. admission policies.
	Manifests []string
	// FeatureGates are added to DefaultFeatureGates.
	FeatureGates map[string]bool
	// ExtraArgs are appended to the command line of the process they are
	// keyed by: "etcd", "kube-apiserver", "kube-controller-manager" or
	// "kube-scheduler" (e.g. higher API rate limits for a scale benchmark).
	ExtraArgs map[string][]string
	// CPURequests weighs processes as kubelet weighs their pods: each
	// process named here (by the names of ExtraArgs, or "controller" for
	// the gputopo controller) runs in a cpu cgroup of its own with the
	// cpu.shares (cgroup v2: cpu.weight) of a container that requests
	// this many millicores, so that on a saturated machine the CPUs are
	// shared as on a node. Empty leaves every process in the caller's
	// cgroup, equal.
	CPURequests map[string]int64
	// Peers are started once the nodes are ready and Manifests applied,
	// before the controller: their CRDs, their managers and their webhooks
	// (see Peer). None by default, which keeps a cluster quick to start.
	Peers []Peer
	// PeersBinDir holds the peers' managers and manifests;
	// DefaultPeersBinDir() if empty.
	PeersBinDir string
	// Progress receives progress lines; os.Stderr if nil.
	Progress io.Writer
	// Timeout bounds the whole start; 5 minutes if zero.
	Timeout time.Duration
}

// Cluster is a running local cluster. A Cluster from Start owns its
// processes (they die with the calling process); one from Attach finds them
// through DIR/run/*.pid.
type Cluster struct {
	cfg     Config
	dir     string
	owner   bool
	ports   Ports
	server  string
	pki     *PKI
	client  kubernetes.Interface
	rest    *rest.Config
	started time.Time
	version string // of the binaries, "v1.36.3"; empty for a Cluster from Attach

	mu    sync.Mutex
	procs map[string]*proc
	nodes map[string]*nodeState
	order []string // node names in topology order
}

// controlPlaneProcs are the processes Config.ExtraArgs can extend.
var controlPlaneProcs = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}

// DefaultBinDir is $GPUTOPO_K8S_BIN, or where `localcluster build` puts
// the release that $GPUTOPO_K8S_VERSION selects (the newest if unset):
// ~/.cache/gputopo/k8s-v1.37.2/bin. An unknown $GPUTOPO_K8S_VERSION gives
// a directory that does not exist, and Start says so.
func DefaultBinDir() string {
	if d := os.Getenv("GPUTOPO_K8S_BIN"); d != "" {
		return d
	}
	v := os.Getenv(VersionEnv)
	if r, err := Selected(); err == nil {
		v = r.Version
	}
	return DefaultBinDirFor(v)
}

// DefaultBinDirFor is ~/.cache/gputopo/k8s-VERSION/bin.
func DefaultBinDirFor(version string) string {
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "gputopo", "k8s-"+version, "bin")
}

// DefaultContainerdBinDir is $GPUTOPO_CONTAINERD_BIN, or
// ~/.cache/gputopo/containerd-v2.4.2/bin.
func DefaultContainerdBinDir() string {
	if d := os.Getenv("GPUTOPO_CONTAINERD_BIN"); d != "" {
		return d
	}
	home, err := os.UserHomeDir()
	if err != nil {
		home = os.TempDir()
	}
	return filepath.Join(home, ".cache", "gputopo", "containerd-"+ContainerdVersion, "bin")
}

// longestSocketSuffix is the longest path under DIR the harness puts a unix
// socket at, without the node name (sockets are limited to 107 bytes).
const longestSocketSuffix = len("/nodes//kubelet/plugins_registry/" + DriverName + "-reg.sock")

// Start starts a cluster and returns once every node is Ready and, with a
// plugin, has its ResourceSlices. On error everything started is stopped.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	c, err := newCluster(cfg)
	if err != nil {
		return nil, err
	}
	if running := RunningPID(c.dir); running != 0 {
		return nil, fmt.Errorf("a cluster (pid %d) is already running in %s; run down first", running, c.dir)
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = 5 * time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.start(ctx); err != nil {
		c.Stop()
		return nil, fmt.Errorf("start local cluster in %s: %w", c.dir, err)
	}
	return c, nil
}

// Validate checks the configuration as Start would, without starting anything.
func (cfg Config) Validate() error {
	_, err := newCluster(cfg)
	return err
}

func newCluster(cfg Config) (*Cluster, error) {
	if cfg.Dir == "" {
		return nil, errors.New("cluster config: Dir is required")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("resolve cluster dir: %w", err)
	}
	for _, hidden := range []string{"/var/lib", "/var/log"} {
		if dir == hidden || strings.HasPrefix(dir, hidden+"/") {
			return nil, fmt.Errorf("cluster dir %s is under %s, which kubelets see as a private tmpfs", dir, hidden)
		}
	}
	if cfg.BinDir == "" {
		if os.Getenv("GPUTOPO_K8S_BIN") == "" {
			if _, err := Selected(); err != nil {
				return nil, err
			}
		}
		cfg.BinDir = DefaultBinDir()
	}
	for _, b := range Binaries {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b.Name)); err != nil {
			return nil, fmt.Errorf("find Kubernetes binaries (run `localcluster build`, with --version for a release other than %s): %w",
				KubernetesVersion, err)
		}
	}
	if cfg.ControllerBin != "" {
		if cfg.ControllerBin, err = filepath.Abs(cfg.ControllerBin); err != nil {
			return nil, fmt.Errorf("resolve controller binary: %w", err)
		}
	}
	if cfg.PluginBin != "" {
		if cfg.PluginBin, err = filepath.Abs(cfg.PluginBin); err != nil {
			return nil, fmt.Errorf("resolve plugin binary: %w", err)
		}
		if _, err := os.Stat(cfg.PluginBin); err != nil {
			return nil, fmt.Errorf("find plugin binary: %w", err)
		}
	}
	if err := validateNodes(cfg.Nodes); err != nil {
		return nil, fmt.Errorf("cluster config: %w", err)
	}
	for _, name := range cfg.NoPluginNodes {
		if !slices.ContainsFunc(cfg.Nodes, func(n NodeSpec) bool { return n.Name == name && n.Real }) {
			return nil, fmt.Errorf("cluster config: NoPluginNodes names %q, which is not a real node of the topology", name)
		}
	}
	for i, img := range cfg.Images {
		if cfg.Images[i], err = filepath.Abs(img); err != nil {
			return nil, fmt.Errorf("resolve image %s: %w", img, err)
		}
		if _, err := os.Stat(cfg.Images[i]); err != nil {
			return nil, fmt.Errorf("cluster config: image tarball: %w (build it with hack/build-image-oci.sh)", err)
		}
	}
	if len(cfg.Images) > 0 && !slices.ContainsFunc(cfg.Nodes, func(n NodeSpec) bool { return n.Runtime == RuntimeContainerd }) {
		return nil, errors.New("cluster config: Images are imported into containerd nodes, and the topology has none (runtime: containerd)")
	}
	if cfg.ContainerdBinDir == "" {
		cfg.ContainerdBinDir = DefaultContainerdBinDir()
	}
	for _, n := range cfg.Nodes {
		if n.Runtime == RuntimeContainerd {
			if err := checkRuntimeDeps(cfg.ContainerdBinDir); err != nil {
				return nil, fmt.Errorf("node %s runs containerd, which this machine cannot run yet: %w", n.Name, err)
			}
			break
		}
	}
	if cfg.PeersBinDir == "" {
		cfg.PeersBinDir = DefaultPeersBinDir()
	}
	if err := checkPeers(cfg.PeersBinDir, cfg.Peers); err != nil {
		return nil, err
	}
	for name := range cfg.ExtraArgs {
		if !slices.Contains(controlPlaneProcs, name) {
			return nil, fmt.Errorf("cluster config: ExtraArgs for %q: only %s take extra arguments", name, strings.Join(controlPlaneProcs, ", "))
		}
	}
	for _, n := range cfg.Nodes {
		if l := len(dir) + len(n.Name) + longestSocketSuffix; l > 107 {
			return nil, fmt.Errorf("cluster dir %s is too long: the socket paths of node %s would have %d bytes, more than 107", dir, n.Name, l)
		}
	}
	gates := maps.Clone(DefaultFeatureGates)
	maps.Copy(gates, cfg.FeatureGates)
	cfg.FeatureGates = gates
	if cfg.Progress == nil {
		cfg.Progress = os.Stderr
	}
	c := &Cluster{cfg: cfg, dir: dir, owner: true, procs: map[string]*proc{}, nodes: map[string]*nodeState{}}
	for _, n := range cfg.Nodes {
		c.nodes[n.Name] = &nodeState{spec: n}
		c.order = append(c.order, n.Name)
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context) error {
	c.started = time.Now()
	version, err := binaryVersion(c.bin("kube-apiserver"))
	if err != nil {
		return err
	}
	c.version = version
	fmt.Fprintf(c.cfg.Progress, "Kubernetes %s from %s\n", version, c.cfg.BinDir)
	if err := c.resetDir(); err != nil {
		return err
	}
	if err := c.writeSupervisorPID(); err != nil {
		return err
	}
	realNodes := 0
	for _, n := range c.nodes {
		if n.spec.Real {
			realNodes++
		}
	}
	if err := EnsureHostLimits(realNodes, len(c.nodes), c.progress); err != nil {
		return err
	}
	if err := c.startControlPlane(ctx); err != nil {
		return err
	}
	var real []*nodeState
	for _, name := range c.order {
		if n := c.nodes[name]; n.spec.Real {
			real = append(real, n)
		}
	}
	ports, err := freePorts(3 * len(real))
	if err != nil {
		return err
	}
	subnet := 0
	for _, n := range real {
		if n.spec.Runtime == RuntimeContainerd {
			subnet++
			n.podSubnet = fmt.Sprintf("198.18.%d", subnet)
		}
	}
	if subnet > 0 {
		if err := writeLocalImages(c.imagesPath()); err != nil {
			return err
		}
	}
	for i, n := range real {
		n.kubeletPort, n.healthzPort, n.metricsPort = ports[3*i], ports[3*i+1], ports[3*i+2]
		c.progress("starting kubelet of %s", n.spec.Name)
		if err := c.startRealNode(ctx, n); err != nil {
			return err
		}
	}
	for _, name := range c.order {
		if n := c.nodes[name]; !n.spec.Real {
			if err := c.createFakeNode(ctx, n.spec); err != nil {
				return err
			}
		}
	}
	c.progress("created %d fake nodes", len(c.order)-len(real))
	if err := c.waitNodes(ctx); err != nil {
		return err
	}
	if err := c.applyManifests(ctx); err != nil {
		return err
	}
	if err := c.startPeers(ctx); err != nil {
		return err
	}
	if c.cfg.ControllerBin != "" {
		if err := c.StartController(); err != nil {
			return err
		}
	}
	if err := c.writeReady(); err != nil {
		return err
	}
	c.progress("cluster ready in %s: export KUBECONFIG=%s", time.Since(c.started).Round(100*time.Millisecond), c.Kubeconfig())
	return nil
}

// resetDir removes what an earlier cluster left in the directory.
func (c *Cluster) resetDir() error {
	for _, sub := range []string{"etcd", "nodes", "run", "pki", "logs", "ready", "kubeconfig", "failed", "images", "hosts"} {
		if err := os.RemoveAll(filepath.Join(c.dir, sub)); err != nil {
			return fmt.Errorf("clean cluster dir: %w", err)
		}
	}
	if err := os.MkdirAll(filepath.Join(c.dir, "logs"), 0o755); err != nil {
		return fmt.Errorf("create cluster dir: %w", err)
	}
	return nil
}

func (c *Cluster) connect() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig())
	if err != nil {
		return fmt.Errorf("load admin kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	c.rest, c.client = cfg, client
	return nil
}

func (c *Cluster) launch(name string, argv ...string) error {
	argv = append(argv, c.cfg.ExtraArgs[name]...)
	return c.launchOpts(name, procOpts{workDir: c.dir}, argv...)
}

func (c *Cluster) launchOpts(name string, opts procOpts, argv ...string) error {
	opts.ownedByParent = c.owner
	p, err := startProc(c.dir, name, argv, opts)
	if err != nil {
		return err
	}
	if milli, ok := c.cfg.CPURequests[name]; ok {
		if err := weighCPU(c.dir, name, p.pid, milli); err != nil {
			p.stop(10 * time.Second)
			return err
		}
	}
	c.mu.Lock()
	c.procs[name] = p
	c.mu.Unlock()
	return nil
}

func (c *Cluster) procByName(name string) *proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.procs[name]; p != nil {
		return p
	}
	if c.owner {
		return nil
	}
	return procFromPidFile(filepath.Join(c.dir, "run", name+".pid"))
}

func (c *Cluster) progress(format string, args ...any) {
	fmt.Fprintf(c.cfg.Progress, "[%6.1fs] %s\n", time.Since(c.started).Seconds(), fmt.Sprintf(format, args...))
}

func (c *Cluster) bin(name string) string { return filepath.Join(c.cfg.BinDir, name) }

// Dir is the cluster's directory.
func (c *Cluster) Dir() string { return c.dir }

// Kubeconfig is the path of the admin kubeconfig.
func (c *Cluster) Kubeconfig() string { return filepath.Join(c.dir, "kubeconfig") }

// Client is an admin client.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// KubernetesVersion is the version of the cluster's binaries, e.g.
// "v1.36.3", as kube-apiserver --version gives it (for a Cluster from
// Attach, as the API server reports it).
func (c *Cluster) KubernetesVersion() string {
	if c.version == "" && c.client != nil {
		if info, err := c.client.Discovery().ServerVersion(); err == nil {
			c.version = info.GitVersion
		}
	}
	return c.version
}

// RESTConfig is the admin client configuration.
func (c *Cluster) RESTConfig() *rest.Config { return rest.CopyConfig(c.rest) }

// NodeDir is where a node's files live.
func (c *Cluster) NodeDir(node string) string { return filepath.Join(c.dir, "nodes", node) }

// LogPath is the log of a process: etcd, kube-apiserver, kubelet-NODE, plugin-NODE, ...
func (c *Cluster) LogPath(proc string) string { return c.logPath(proc) }

func (c *Cluster) logPath(proc string) string { return filepath.Join(c.dir, "logs", proc+".log") }

func (c *Cluster) kubeletRoot(node string) string { return filepath.Join(c.NodeDir(node), "kubelet") }

// imagesPath is the OCI layout tarball of the local images.
func (c *Cluster) imagesPath() string { return filepath.Join(c.dir, "images", "local-images.tar") }

func (c *Cluster) recordFile(node string) string {
	return filepath.Join(c.NodeDir(node), "containers.jsonl")
}

// Nodes describes the nodes in topology order.
func (c *Cluster) Nodes() []NodeInfo {
	out := make([]NodeInfo, 0, len(c.order))
	for _, name := range c.order {
		out = append(out, c.nodes[name].info())
	}
	return out
}

// PluginDirs returns the plugin's CDI spec directory and its data directory,
// which holds checkpoint.json.
func (c *Cluster) PluginDirs(node string) (cdiDir, checkpointDir string) {
	return filepath.Join(c.NodeDir(node), "cdi"), filepath.Join(c.kubeletRoot(node), "plugins", DriverName)
}

// ContainerRecords returns the CreateContainer requests the node's fake CRI
// has seen, oldest first.
func (c *Cluster) ContainerRecords(node string) ([]Record, error) {
	if _, err := c.realNode(node); err != nil {
		return nil, err
	}
	return ReadRecords(c.recordFile(node))
}

// runsPlugin reports whether the harness runs the plugin of a real node.
func (c *Cluster) runsPlugin(node string) bool {
	return c.cfg.PluginBin != "" && !slices.Contains(c.cfg.NoPluginNodes, node)
}

func (c *Cluster) realNode(node string) (*nodeState, error) {
	n := c.nodes[node]
	if n == nil {
		return nil, fmt.Errorf("no node %q in this cluster", node)
	}
	if !n.spec.Real {
		return nil, fmt.Errorf("node %s is a fake node: no kubelet, CRI or plugin process", node)
	}
	return n, nil
}
