package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
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

// namespace holds every namespaced object the suite creates.
const namespace = "gputopo-e2e"

// The suite's cluster, started once by TestMain.
var (
	lc        *cluster.Cluster
	client    kubernetes.Interface
	binDir    string // GPUTOPO_BIN: gputopo-kubelet-plugin
	k8sBinDir string // kubectl and the control plane
	pluginBin string
	// templates are the ResourceClaimTemplates of demo/specs/claims, by name.
	templates = map[string]*resourcev1.ResourceClaimTemplate{}
)

func TestMain(m *testing.M) { os.Exit(runSuite(m)) }

func runSuite(m *testing.M) int {
	binDir = os.Getenv("GPUTOPO_BIN")
	if binDir == "" {
		binDir = filepath.Join("..", "..", "bin")
	}
	var err error
	if binDir, err = filepath.Abs(binDir); err != nil {
		return fail("resolve GPUTOPO_BIN: %v", err)
	}
	pluginBin = filepath.Join(binDir, "gputopo-kubelet-plugin")
	if _, err := os.Stat(pluginBin); err != nil {
		return fail("no kubelet plugin binary (run `make build` or set GPUTOPO_BIN): %v", err)
	}
	k8sBinDir = cluster.DefaultBinDir()
	nodes, err := cluster.LoadTopology(filepath.Join("testdata", "topology.yaml"))
	if err != nil {
		return fail("%v", err)
	}
	// Short: unix socket paths under it are limited to 107 bytes.
	dir, err := os.MkdirTemp("", "gte2e")
	if err != nil {
		return fail("create cluster dir: %v", err)
	}
	start := time.Now()
	c, err := cluster.Start(context.Background(), cluster.Config{
		Dir: dir, BinDir: k8sBinDir, Nodes: nodes, PluginBin: pluginBin,
		// -v=2 logs each prepare, unprepare and publication: what a
		// failure's log tail needs.
		PluginArgs: []string{"-v=2"},
		Progress:   prefixWriter{"e2e cluster: "},
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: start cluster: %v\n", err)
		dumpLogs(dir, nodes)
		fmt.Fprintf(os.Stderr, "e2e: cluster directory kept for inspection: %s\n", dir)
		return 1
	}
	lc, client = c, c.Client()
	fmt.Fprintf(os.Stderr, "e2e: cluster of %d nodes ready in %s in %s\n", len(nodes), time.Since(start).Round(100*time.Millisecond), dir)

	code := 1
	if err := setupSuite(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: set up suite: %v\n", err)
	} else {
		code = m.Run()
	}
	if code != 0 {
		dumpLogs(dir, nodes) // before Stop, which fills the tails with shutdown noise
	}
	c.Stop()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "e2e: FAILED; cluster directory kept for inspection: %s (logs/*.log, nodes/NODE/)\n", dir)
		return code
	}
	if os.Getenv("GPUTOPO_E2E_KEEP") != "" {
		fmt.Fprintf(os.Stderr, "e2e: suite passed; GPUTOPO_E2E_KEEP is set, cluster directory kept: %s\n", dir)
		return 0
	}
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: remove cluster dir: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "e2e: suite passed in %s; cluster stopped and removed\n", time.Since(start).Round(100*time.Millisecond))
	return 0
}

func fail(format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "e2e: "+format+"\n", args...)
	return 1
}

// setupSuite creates the namespace and applies demo/specs: the DeviceClass
// and every claim template.
func setupSuite() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	// Pods are refused until the namespace's default ServiceAccount exists.
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("wait for the default ServiceAccount of %s: %w", namespace, err)
	}

	data, err := fs.ReadFile(specs.FS, "deviceclass.yaml")
	if err != nil {
		return err
	}
	var class resourcev1.DeviceClass
	if err := yaml.UnmarshalStrict(data, &class); err != nil {
		return fmt.Errorf("decode demo/specs/deviceclass.yaml: %w", err)
	}
	if _, err := client.ResourceV1().DeviceClasses().Create(ctx, &class, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
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
		tmpl.Namespace = namespace
		created, err := client.ResourceV1().ResourceClaimTemplates(namespace).Create(ctx, &tmpl, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create ResourceClaimTemplate from demo/specs/%s: %w", f, err)
		}
		templates[created.Name] = created
	}
	return nil
}

// dumpLogs prints the tail of the logs that explain most failures.
func dumpLogs(dir string, nodes []cluster.NodeSpec) {
	procs := []string{"kube-scheduler", "kube-controller-manager"}
	for _, n := range nodes {
		if n.Real {
			procs = append(procs, "plugin-"+n.Name, "kubelet-"+n.Name)
		}
	}
	for _, p := range procs {
		path := filepath.Join(dir, "logs", p+".log")
		fmt.Fprintf(os.Stderr, "----- %s (tail) -----\n%s\n", path, tail(path, 25))
	}
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// prefixWriter writes the harness's progress lines to stderr.
type prefixWriter struct{ prefix string }

func (w prefixWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.SplitAfter(p, []byte("\n")) {
		if len(line) > 0 {
			fmt.Fprintf(os.Stderr, "%s%s", w.prefix, line)
		}
	}
	return len(p), nil
}
