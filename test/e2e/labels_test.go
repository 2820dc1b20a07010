package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gputopo/gputopo/pkg/topology"
	cluster "github.com/gputopo/gputopo/test/cluster"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// The labels the local cluster gives every node (topograph 1.0's tier-0
// and tier-1) and the older ones topograph wrote before 1.0.
const (
	preLeaf, preSpine, preCore = "network.topology.nvidia.com/leaf", "network.topology.nvidia.com/spine", "network.topology.nvidia.com/core"
)

// TestPrintSlicesTopograph10Labels: a node labelled the topograph 1.0 way
// (tier-0 the switch the node hangs off) publishes that switch as its leaf.
func TestPrintSlicesTopograph10Labels(t *testing.T) {
	out, err := exec.Command(pluginBin, "--backend=sim", "--profile=dgx-h100", "--node-name=gpu-7",
		"--node-labels=fabric.topograph.run/tier-0=leaf-7,fabric.topograph.run/tier-1=spine-2",
		"--print-resource-slices").Output()
	if err != nil {
		t.Fatalf("--print-resource-slices: %v", err)
	}
	parsed, err := cluster.ParseResourceSlices(out)
	if err != nil {
		t.Fatal(err)
	}
	var printed []resourcev1.ResourceSlice
	for _, s := range parsed {
		printed = append(printed, *s)
	}
	devices := devicesOf(printed)
	if len(devices) != 8 {
		t.Fatalf("%d devices printed, want 8", len(devices))
	}
	for name, d := range devices {
		if l, s, c := stringAttr(d, topology.AttrLeaf), stringAttr(d, topology.AttrSpine), stringAttr(d, topology.AttrCore); l != "leaf-7" || s != "spine-2" || c != "" {
			t.Errorf("%s: leaf=%q spine=%q core=%q, want leaf-7, spine-2 and no core", name, l, s, c)
		}
	}
}

// TestPre10AndBothLabels relabels a real node: with topograph's pre-1.0
// labels only, then with both kinds, where topograph 1.0's wins for each
// tier it names. The plugin republishes each time.
func TestPre10AndBothLabels(t *testing.T) {
	n := node(t, "dgx1-v100", true).Name
	dumpOnFailure(t, n)
	orig := nodeLabels(t, n)
	t.Cleanup(func() {
		relabel(t, n, map[string]string{topology.LabelTopographLeaf: orig[topology.LabelTopographLeaf], topology.LabelTopographSpine: orig[topology.LabelTopographSpine],
			preLeaf: "", preSpine: "", preCore: ""})
		waitPlacement(t, n, orig[topology.LabelTopographLeaf], orig[topology.LabelTopographSpine], "")
	})

	relabel(t, n, map[string]string{topology.LabelTopographLeaf: "", topology.LabelTopographSpine: "",
		preLeaf: "sw-leaf-3", preSpine: "sw-spine-1", preCore: "sw-core-0"})
	waitPlacement(t, n, "sw-leaf-3", "sw-spine-1", "sw-core-0")

	relabel(t, n, map[string]string{topology.LabelTopographLeaf: "leaf-both"})
	waitPlacement(t, n, "leaf-both", "sw-spine-1", "sw-core-0")
}

// TestCustomLabelMapping writes the label mapping ConfigMap the plugins
// watch: a real node labelled only with the cluster's own labels moves to
// the leaf they name, the CLI places it there too (reading the same
// ConfigMap), and deleting the ConfigMap brings the defaults back.
func TestCustomLabelMapping(t *testing.T) {
	n := node(t, "dgx-h100", true).Name
	dumpOnFailure(t, n)
	orig := nodeLabels(t, n)
	ctx := framework.Ctx(t)
	cms := client.CoreV1().ConfigMaps("kube-system")
	deleteMapping := func() {
		if err := cms.Delete(context.Background(), topology.LabelMappingConfigMap, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete the label mapping: %v", err)
		}
	}
	t.Cleanup(func() {
		deleteMapping()
		relabel(t, n, map[string]string{"example.com/rack": "", "example.com/row": ""})
		waitPlacement(t, n, orig[topology.LabelTopographLeaf], orig[topology.LabelTopographSpine], "")
	})
	relabel(t, n, map[string]string{"example.com/rack": "rack-9", "example.com/row": "row-b"})
	mapping := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: topology.LabelMappingConfigMap},
		Data:       map[string]string{"leaf": "example.com/rack", "spine": "example.com/row," + topology.LabelTopographSpine},
	}
	if _, err := cms.Create(ctx, mapping, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitPlacement(t, n, "rack-9", "row-b", "")
	// Another real node has no example.com/rack label: no leaf any more,
	// and its spine from the mapping's second choice.
	other := node(t, "hgx-pcie-pairs", true).Name
	waitPlacement(t, other, "", nodeLabels(t, other)[topology.LabelTopographSpine], "")

	topo := cliTopology(t, nil)
	if topo.LabelMapping.Source != "kube-system/"+topology.LabelMappingConfigMap {
		t.Errorf("the CLI read the mapping from %q, want kube-system/%s", topo.LabelMapping.Source, topology.LabelMappingConfigMap)
	}
	if got := topo.node(n); got.Leaf != "rack-9" || got.Spine != "row-b" {
		t.Errorf("the CLI places %s under %s/%s, want row-b/rack-9", n, got.Spine, got.Leaf)
	}

	deleteMapping()
	waitPlacement(t, n, orig[topology.LabelTopographLeaf], orig[topology.LabelTopographSpine], "")
}

// TestCLIContextAndJSON runs `kubectl gputopo topology -o json` as kubectl
// runs its plugins, against a kubeconfig whose current context points
// nowhere: --context picks the suite's cluster, and without it the error
// says what to check.
func TestCLIContextAndJSON(t *testing.T) {
	kubeconfig, ctxName := twoContextKubeconfig(t)
	topo := cliTopology(t, []string{"--kubeconfig=" + kubeconfig, "--context=" + ctxName})
	if topo.LabelMapping.Source != "built-in defaults" {
		t.Errorf("labelMapping.source = %q, want built-in defaults (no ConfigMap in this suite)", topo.LabelMapping.Source)
	}
	for _, n := range lc.Nodes() {
		v := topo.node(n.Name)
		want, _ := suite.Node(n.Name)
		if v.Leaf != want.Leaf || v.Spine != want.Spine || len(v.GPUs) == 0 {
			t.Errorf("node %s: %s/%s with %d GPUs, want %s/%s", n.Name, v.Spine, v.Leaf, len(v.GPUs), want.Spine, want.Leaf)
		}
	}
	if topo.GPUs == 0 || topo.FreeGPUs > topo.GPUs {
		t.Errorf("gpus %d, free %d", topo.GPUs, topo.FreeGPUs)
	}

	out, err := kubectlGputopo(t, "--kubeconfig="+kubeconfig, "topology")
	if err == nil || !strings.Contains(string(out), "cannot reach the Kubernetes API server at 127.0.0.1:1") || !strings.Contains(string(out), "--context") {
		t.Errorf("against the unreachable current context: err %v, output %q; want an error naming the server and --context", err, out)
	}
}

// cliTopology is the parsed output of `kubectl gputopo topology -o json`.
type cliTopo struct {
	LabelMapping struct {
		Source string   `json:"source"`
		Leaf   []string `json:"leaf"`
	} `json:"labelMapping"`
	GPUs     int `json:"gpus"`
	FreeGPUs int `json:"freeGPUs"`
	Nodes    []struct {
		Name, Spine, Leaf string
		GPUs              []struct{ Name, State, Holder string }
	} `json:"nodes"`
}

func (c cliTopo) node(name string) (out struct {
	Name, Spine, Leaf string
	GPUs              []struct{ Name, State, Holder string }
}) {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return out
}

func cliTopology(t *testing.T, args []string) cliTopo {
	t.Helper()
	if args == nil {
		args = []string{"--kubeconfig=" + lc.Kubeconfig()}
	}
	out, err := kubectlGputopo(t, append(args, "topology", "-o", "json")...)
	if err != nil {
		t.Fatalf("kubectl gputopo topology -o json: %v\n%s", err, out)
	}
	var topo cliTopo
	if err := json.Unmarshal(out, &topo); err != nil {
		t.Fatalf("-o json is not JSON: %v\n%s", err, out)
	}
	return topo
}

// kubectlGputopo runs `kubectl gputopo ARGS`: kubectl finds the plugin as
// kubectl-gputopo on the PATH.
func kubectlGputopo(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(filepath.Join(suite.BinDir, "gputopo"), filepath.Join(dir, "kubectl-gputopo")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(k8sBinDir, "kubectl"), append([]string{"gputopo"}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"), "KUBECONFIG=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return append(stdout.Bytes(), stderr.Bytes()...), err
	}
	return stdout.Bytes(), nil
}

// twoContextKubeconfig copies the suite's kubeconfig with a second context,
// made current, whose server does not exist.
func twoContextKubeconfig(t *testing.T) (path, suiteContext string) {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(lc.Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	suiteContext = cfg.CurrentContext
	good := cfg.Contexts[suiteContext]
	if good == nil {
		t.Fatalf("kubeconfig %s has no current context", lc.Kubeconfig())
	}
	broken := cfg.Clusters[good.Cluster].DeepCopy()
	broken.Server = "https://127.0.0.1:1"
	cfg.Clusters["nowhere"] = broken
	ctx := good.DeepCopy()
	ctx.Cluster = "nowhere"
	cfg.Contexts["nowhere"] = ctx
	cfg.CurrentContext = "nowhere"
	path = filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path, suiteContext
}

func nodeLabels(t *testing.T, name string) map[string]string {
	t.Helper()
	n, err := client.CoreV1().Nodes().Get(framework.Ctx(t), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Labels
}

// relabel sets labels of a node; "" removes one.
func relabel(t *testing.T, node string, labels map[string]string) {
	t.Helper()
	for k, v := range labels {
		setNodeLabel(t, node, k, v)
	}
}

// waitPlacement waits until every device of the node publishes leaf,
// spine and core ("" for an attribute that must be absent).
func waitPlacement(t *testing.T, node, leaf, spine, core string) {
	t.Helper()
	want := fmt.Sprintf("leaf=%q spine=%q core=%q", leaf, spine, core)
	framework.Eventually(t, waitLong, "the slices of "+node+" to say "+want, func() (bool, string) {
		slices, err := nodeSlices(context.Background(), node)
		if err != nil || len(slices) == 0 {
			return false, fmt.Sprintf("slices: %d, %v", len(slices), err)
		}
		for _, d := range devicesOf(slices) {
			got := fmt.Sprintf("leaf=%q spine=%q core=%q", stringAttr(d, topology.AttrLeaf), stringAttr(d, topology.AttrSpine), stringAttr(d, topology.AttrCore))
			if got != want {
				return false, d.Name + " has " + got
			}
		}
		return true, ""
	})
}
