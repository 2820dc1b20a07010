// Package framework is what gputopo's end-to-end suites share: starting a
// local cluster (test/cluster) for one test binary, installing the demo
// DeviceClass and claim templates, polling, and reading what the plugin left
// on a real node. Each suite package (test/e2e, test/e2e/placement) calls
// Main from its TestMain and keeps its own cluster.
//
// Only one suite cluster runs at a time on a machine: Main takes an
// exclusive lock ($TMPDIR/gputopo-e2e.lock) before starting its cluster and
// holds it until the cluster is stopped, so `go test ./...` without -p 1
// runs the suites one after the other instead of two clusters on two cores.
package framework

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/gputopo/gputopo/demo/specs"
	cluster "github.com/gputopo/gputopo/test/cluster"
)

// Options say which cluster a suite needs.
type Options struct {
	// Name prefixes the suite's messages and its cluster directory.
	Name string
	// Topology is the topology file (relative to the package directory).
	Topology string
	// Namespace is created for the suite's objects, with the claim
	// templates of demo/specs/claims in it.
	Namespace string
	// PluginArgs are appended to the kubelet plugin's command line.
	PluginArgs []string
	// Controller starts GPUTOPO_BIN/gputopo-controller with ControllerArgs.
	Controller     bool
	ControllerArgs []string
	// Manifests are applied server-side before the controller starts
	// (files or directories, relative to the repository root).
	Manifests []string
	// FeatureGates are added to the cluster's default gates, for every
	// component.
	FeatureGates map[string]bool
	// Peers are the workload controllers (JobSet, LeaderWorkerSet, Kueue)
	// started beside gputopo, from `make peer-binaries`; none by default.
	Peers []cluster.Peer
}

// Suite is a running suite cluster.
type Suite struct {
	Name      string
	Cluster   *cluster.Cluster
	Client    kubernetes.Interface
	Namespace string
	Nodes     []cluster.NodeSpec
	// BinDir is GPUTOPO_BIN (gputopo-kubelet-plugin, gputopo-controller);
	// K8sBinDir holds kubectl and the control plane.
	BinDir, K8sBinDir string
	PluginBin         string
	ControllerBin     string // empty without Options.Controller
	// Templates are the ResourceClaimTemplates of demo/specs/claims, by name.
	Templates map[string]*resourcev1.ResourceClaimTemplate

	peers []cluster.Peer
}

// Main starts the suite's cluster, calls ready with it (an error fails the
// suite), runs the tests and stops the cluster. It returns the exit code for os.Exit. The cluster
// directory is removed after a pass (kept with GPUTOPO_E2E_KEEP=1) and kept
// after a failure, whose log tails are printed.
func Main(m *testing.M, opts Options, ready func(*Suite) error) int {
	s := &Suite{Name: opts.Name, Namespace: opts.Namespace, Templates: map[string]*resourcev1.ResourceClaimTemplate{}, peers: opts.Peers}
	root, err := RepoRoot()
	if err != nil {
		return s.fail("%v", err)
	}
	binDir := os.Getenv("GPUTOPO_BIN")
	if binDir == "" {
		binDir = filepath.Join(root, "bin")
	}
	if s.BinDir, err = filepath.Abs(binDir); err != nil {
		return s.fail("resolve GPUTOPO_BIN: %v", err)
	}
	s.PluginBin = filepath.Join(s.BinDir, "gputopo-kubelet-plugin")
	if _, err := os.Stat(s.PluginBin); err != nil {
		return s.fail("no kubelet plugin binary (run `make build` or set GPUTOPO_BIN): %v", err)
	}
	if opts.Controller {
		s.ControllerBin = filepath.Join(s.BinDir, "gputopo-controller")
		if _, err := os.Stat(s.ControllerBin); err != nil {
			return s.fail("no controller binary (run `make build` or set GPUTOPO_BIN): %v", err)
		}
	}
	var manifests []string
	for _, m := range opts.Manifests {
		manifests = append(manifests, filepath.Join(root, m))
	}
	s.K8sBinDir = cluster.DefaultBinDir()
	if s.Nodes, err = cluster.LoadTopology(opts.Topology); err != nil {
		return s.fail("%v", err)
	}

	unlock, err := s.lock()
	if err != nil {
		return s.fail("%v", err)
	}
	defer unlock()

	// Short: unix socket paths under it are limited to 107 bytes.
	dir, err := os.MkdirTemp("", "gt"+opts.Name)
	if err != nil {
		return s.fail("create cluster dir: %v", err)
	}
	start := time.Now()
	c, err := cluster.Start(context.Background(), cluster.Config{
		Dir: dir, BinDir: s.K8sBinDir, Nodes: s.Nodes, PluginBin: s.PluginBin,
		// -v=2 logs each prepare, unprepare and publication: what a
		// failure's log tail needs.
		PluginArgs:    append([]string{"-v=2"}, opts.PluginArgs...),
		ControllerBin: s.ControllerBin, ControllerArgs: opts.ControllerArgs,
		FeatureGates: opts.FeatureGates,
		Manifests:    manifests, Peers: opts.Peers,
		Progress: PrefixWriter{opts.Name + " cluster: "},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: start cluster: %v\n", opts.Name, err)
		s.dumpLogs(dir)
		fmt.Fprintf(os.Stderr, "%s: cluster directory kept for inspection: %s\n", opts.Name, dir)
		return 1
	}
	s.Cluster, s.Client = c, c.Client()
	fmt.Fprintf(os.Stderr, "%s: cluster of %d nodes ready in %s in %s\n", opts.Name, len(s.Nodes), time.Since(start).Round(100*time.Millisecond), dir)

	code := 1
	if err := s.setup(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: set up suite: %v\n", opts.Name, err)
	} else if err := ready(s); err != nil {
		fmt.Fprintf(os.Stderr, "%s: set up suite: %v\n", opts.Name, err)
	} else {
		code = m.Run()
	}
	if code != 0 {
		s.dumpLogs(dir) // before Stop, which fills the tails with shutdown noise
	}
	c.Stop()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "%s: FAILED; cluster directory kept for inspection: %s (logs/*.log, nodes/NODE/)\n", opts.Name, dir)
		return code
	}
	if os.Getenv("GPUTOPO_E2E_KEEP") != "" {
		fmt.Fprintf(os.Stderr, "%s: suite passed; GPUTOPO_E2E_KEEP is set, cluster directory kept: %s\n", opts.Name, dir)
		return 0
	}
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintf(os.Stderr, "%s: remove cluster dir: %v\n", opts.Name, err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "%s: suite passed in %s; cluster stopped and removed\n", opts.Name, time.Since(start).Round(100*time.Millisecond))
	return 0
}

func (s *Suite) fail(format string, args ...any) int {
	fmt.Fprintf(os.Stderr, s.Name+": "+format+"\n", args...)
	return 1
}

// lock takes the machine-wide suite lock, waiting for another suite's
// cluster to stop. The kernel drops the lock when the process dies.
func (s *Suite) lock() (unlock func(), err error) {
	path := filepath.Join(os.TempDir(), "gputopo-e2e.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open suite lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); errors.Is(err, syscall.EWOULDBLOCK) {
		holder, _ := os.ReadFile(path)
		fmt.Fprintf(os.Stderr, "%s: another e2e suite runs a cluster (%s); waiting for it to finish (run go test with -p 1 to avoid this)\n",
			s.Name, strings.TrimSpace(string(holder)))
		start := time.Now()
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err == nil {
			fmt.Fprintf(os.Stderr, "%s: waited %s for the other suite\n", s.Name, time.Since(start).Round(time.Second))
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(fmt.Sprintf("suite %s, pid %d", s.Name, os.Getpid())), 0)
	return func() { f.Close() }, nil
}

// setup creates the namespace and applies demo/specs: the DeviceClass and
// every claim template.
// createNamespace creates ns and waits for its default ServiceAccount:
// pods are refused until it exists.
func (s *Suite) createNamespace(ctx context.Context, ns *corev1.Namespace) error {
	if _, err := s.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace %s: %w", ns.Name, err)
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := s.Client.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("wait for the default ServiceAccount of %s: %w", ns.Name, err)
	}
	return nil
}

// AddNamespace creates another namespace like the suite's: ns, its default
// ServiceAccount waited for, and a copy of every demo claim template.
func (s *Suite) AddNamespace(ctx context.Context, ns *corev1.Namespace) error {
	if err := s.createNamespace(ctx, ns); err != nil {
		return err
	}
	for _, t := range s.Templates {
		c := t.DeepCopy()
		c.ObjectMeta = metav1.ObjectMeta{Name: t.Name, Namespace: ns.Name}
		if _, err := s.Client.ResourceV1().ResourceClaimTemplates(ns.Name).Create(ctx, c, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create claim template %s in %s: %w", t.Name, ns.Name, err)
		}
	}
	return nil
}

func (s *Suite) setup() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.createNamespace(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: s.Namespace}}); err != nil {
		return err
	}

	data, err := fs.ReadFile(specs.FS, "deviceclass.yaml")
	if err != nil {
		return err
	}
	var class resourcev1.DeviceClass
	if err := yaml.UnmarshalStrict(data, &class); err != nil {
		return fmt.Errorf("decode demo/specs/deviceclass.yaml: %w", err)
	}
	if _, err := s.Client.ResourceV1().DeviceClasses().Create(ctx, &class, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create DeviceClass: %w", err)
	}
	files, err := fs.Glob(specs.FS, "claims/*.yaml")
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no claim templates in demo/specs: %v", err)
	}
	for _, f := range files {
		data, err := fs.ReadFile(specs.FS, f)
		if err != nil {
			return err
		}
		var tmpl resourcev1.ResourceClaimTemplate
		if err := yaml.UnmarshalStrict(data, &tmpl); err != nil {
			return fmt.Errorf("decode demo/specs/%s: %w", f, err)
		}
		tmpl.Namespace = s.Namespace
		created, err := s.Client.ResourceV1().ResourceClaimTemplates(s.Namespace).Create(ctx, &tmpl, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create ResourceClaimTemplate from demo/specs/%s: %w", f, err)
		}
		s.Templates[created.Name] = created
	}
	return nil
}

// dumpLogs prints the tail of the logs that explain most failures.
func (s *Suite) dumpLogs(dir string) {
	procs := []string{"kube-scheduler", "kube-controller-manager"}
	if s.ControllerBin != "" {
		procs = append(procs, "controller")
	}
	for _, p := range s.peers {
		procs = append(procs, "peer-"+string(p))
	}
	for _, n := range s.Nodes {
		if n.Real {
			procs = append(procs, "plugin-"+n.Name, "kubelet-"+n.Name)
		}
		if n.Runtime == cluster.RuntimeContainerd {
			procs = append(procs, "containerd-"+n.Name)
		}
	}
	for _, p := range procs {
		path := filepath.Join(dir, "logs", p+".log")
		fmt.Fprintf(os.Stderr, "----- %s (tail) -----\n%s\n", path, Tail(path, 25))
	}
}

// Node returns the suite's node of that name.
func (s *Suite) Node(name string) (cluster.NodeSpec, bool) {
	for _, n := range s.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return cluster.NodeSpec{}, false
}

// IsReal reports whether a node runs a kubelet and the plugin.
func (s *Suite) IsReal(node string) bool {
	n, ok := s.Node(node)
	return ok && n.Real
}

// RepoRoot finds the gputopo repository from the working directory (a
// test's package directory): the nearest parent whose go.mod declares
// module github.com/gputopo/gputopo.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if data, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil && bytes.HasPrefix(data, []byte("module github.com/gputopo/gputopo\n")) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("no gputopo repository (go.mod of github.com/gputopo/gputopo) above %s", dir)
		}
	}
}

// Tail returns the last n lines of a file.
func Tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// PrefixWriter writes the harness's progress lines to stderr.
type PrefixWriter struct{ Prefix string }

func (w PrefixWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.SplitAfter(p, []byte("\n")) {
		if len(line) > 0 {
			fmt.Fprintf(os.Stderr, "%s%s", w.Prefix, line)
		}
	}
	return len(p), nil
}
