package e2e

// End-to-end tests of README claims about the kubelet plugin, the claim
// templates and the CLI that the other tests of the suite do not prove:
// the templates gpu-2-pcie-root, gpu-2-ladder, gpu-8-ladder,
// gpu-share-half and gpu-share-20gi on real nodes, the plugin's metrics,
// --taint-effect NoExecute, NO_COLOR and `topology -o svg`. docs/claims.md
// maps each claim to its test.

import (
	"bytes"
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/pkg/topology"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// attrPCIeRoot is the attribute the README names for a template's constraint.
const attrPCIeRoot = "resource.kubernetes.io/pcieRoot"

// sameAttr checks that every device in names has one value of attribute
// name (string or int) and returns it.
func sameAttr(t *testing.T, devices map[string]resourcev1.Device, names []string, name string) string {
	t.Helper()
	var values []string
	for _, n := range names {
		a, ok := attr(devices[n], name)
		if !ok {
			t.Errorf("device %s has no attribute %s", n, name)
			continue
		}
		v := ""
		switch {
		case a.StringValue != nil:
			v = *a.StringValue
		case a.IntValue != nil:
			v = strconv.FormatInt(*a.IntValue, 10)
		}
		values = append(values, v)
	}
	if len(values) == 0 || len(slices.Compact(slices.Clone(values))) != 1 || values[0] == "" {
		t.Errorf("devices %v have %s %v, want one value", names, name, values)
		return ""
	}
	return values[0]
}

// TestClaimTemplatePCIeRoot: "gpu-2-pcie-root: two GPUs behind one PCIe
// root (matchAttribute: resource.kubernetes.io/pcieRoot)". On a real node
// of bridged PCIe pairs the pod runs with two GPUs of one root.
func TestClaimTemplatePCIeRoot(t *testing.T) {
	n := node(t, "hgx-pcie-pairs", true).Name
	dumpOnFailure(t, n)
	createPod(t, "pcie-root", n, "gpu-2-pcie-root")
	p := verifyPrepared(t, "pcie-root", n)
	if len(p.devices) != 2 {
		t.Fatalf("gpu-2-pcie-root got %v, want two GPUs", p.devices)
	}
	root := sameAttr(t, nodeDevices(t, n), p.devices, attrPCIeRoot)
	t.Logf("gpu-2-pcie-root on %s: %v behind %s", n, p.devices, root)
}

// rungOf returns the one rung (request) a ladder claim's results name.
func rungOf(t *testing.T, c *resourcev1.ResourceClaim) string {
	t.Helper()
	rung := ""
	for _, r := range c.Status.Allocation.Devices.Results {
		if rung != "" && r.Request != rung {
			t.Errorf("claim %s has results of two rungs: %s and %s", c.Name, rung, r.Request)
		}
		rung = r.Request
	}
	return rung
}

// TestClaimTemplateLadders: "gpu-2-ladder: preference ladder: an NVLink
// block (nvlink), else one PCIe root (pcie-root), ...; gpu-8-ladder: an
// NVLink block of eight (nvlink), else one NVLink domain (nvlink-domain),
// ...". gpu-2-ladder runs on an NVSwitch node with an NVLink pair and, on
// a node without NVLink, gets two GPUs of one PCIe root; gpu-8-ladder runs
// on an NVSwitch node with its block of eight and on a DGX-1 (no block of
// eight) with one NVLink domain. Each allocation has the devices its rung
// promises.
func TestClaimTemplateLadders(t *testing.T) {
	nvswitch := node(t, "dgx-h100", true).Name
	cube := node(t, "dgx1-v100", true).Name
	nolink := node(t, "pcie-only", false).Name
	dumpOnFailure(t, nvswitch, cube)
	for _, tc := range []struct {
		pod, tmpl, node, rung, attr string
		gpus                        int
	}{
		{"ladder2-nvswitch", "gpu-2-ladder", nvswitch, "gpus/nvlink", "nvlinkBlock2", 2},
		{"ladder2-nolink", "gpu-2-ladder", nolink, "gpus/pcie-root", attrPCIeRoot, 2},
		{"ladder8-nvswitch", "gpu-8-ladder", nvswitch, "gpus/nvlink", "nvlinkBlock8", 8},
		{"ladder8-cube", "gpu-8-ladder", cube, "gpus/nvlink-domain", topology.AttrNVLinkDomain, 8},
	} {
		t.Run(tc.pod, func(t *testing.T) {
			createPod(t, tc.pod, tc.node, tc.tmpl)
			var c *resourcev1.ResourceClaim
			var devs []string
			if isReal(tc.node) {
				p := verifyPrepared(t, tc.pod, tc.node)
				c, devs = p.claim, p.devices
			} else { // a fake node: the scheduler's allocation is what there is to check
				c = waitAllocated(t, tc.pod, tc.node)
				devs = allocatedDevices(t, c, tc.node)
			}
			if got := rungOf(t, c); got != tc.rung {
				t.Errorf("%s on %s got rung %q, want %q", tc.tmpl, tc.node, got, tc.rung)
			}
			if len(devs) != tc.gpus {
				t.Fatalf("%s on %s got %v, want %d GPUs", tc.tmpl, tc.node, devs, tc.gpus)
			}
			v := sameAttr(t, nodeDevices(t, tc.node), devs, tc.attr)
			t.Logf("%s on %s: %s, %v with %s=%s", tc.tmpl, tc.node, tc.rung, devs, tc.attr, v)
			deletePod(t, tc.pod)
		})
	}
}

// TestClaimTemplateShares: "gpu-share-half: half of one shared GPU's
// compute (capacity.requests.milliGPU: 500)"; "gpu-share-20gi: 20 GiB of
// one shared GPU's memory and a quarter of its compute"; each claim's
// container gets "GPUTOPO_SHARE_MILLIGPU and GPUTOPO_SHARE_MEMORY_BYTES
// (what the claim asked for, or its compute share of the GPU's memory)".
// On a real node whose GPUs are shared both pods run; their allocations
// consume exactly that capacity and their CDI specs say so.
func TestClaimTemplateShares(t *testing.T) {
	n := node(t, "dgx-h100", true).Name
	dumpOnFailure(t, n)
	setNodeLabel(t, n, topology.LabelSharedGPUs, "all")
	t.Cleanup(func() {
		setNodeLabel(t, n, topology.LabelSharedGPUs, "")
		waitShared(t, n, false)
	})
	waitShared(t, n, true)

	createPod(t, "share-half", n, "gpu-share-half")
	verifyShare(t, "share-half", n, 500) // milliGPU, and memory as the compute share

	createPod(t, "share-20gi", n, "gpu-share-20gi")
	p := verifyPrepared(t, "share-20gi", n)
	results := p.claim.Status.Allocation.Devices.Results
	if len(results) != 1 || results[0].ShareID == nil {
		t.Fatalf("gpu-share-20gi: results %+v, want one share", results)
	}
	gi20 := resource.MustParse("20Gi")
	want := map[resourcev1.QualifiedName]resource.Quantity{topology.CapacityMilliGPU: resource.MustParse("250"), topology.CapacityMemory: gi20}
	for k, q := range want {
		if got, ok := results[0].ConsumedCapacity[k]; !ok || got.Cmp(q) != 0 {
			t.Errorf("gpu-share-20gi consumes %s=%s, want %s", k, got.String(), q.String())
		}
	}
	_, spec, err := findCDISpec(n, string(p.claim.UID))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{topology.EnvShareMilliGPU: "250", topology.EnvShareMemory: strconv.FormatInt(gi20.Value(), 10)} {
		if got, _ := envOf(spec.ContainerEdits.Env, k); got != v {
			t.Errorf("CDI spec of gpu-share-20gi: %s=%q, want %q", k, got, v)
		}
	}
}

// pluginMetrics scrapes the kubelet plugin of a real node.
func pluginMetrics(t *testing.T, node string) map[string]float64 {
	t.Helper()
	for _, n := range lc.Nodes() {
		if n.Name == node {
			m, err := framework.ScrapeMetrics(framework.Ctx(t), fmt.Sprintf("http://127.0.0.1:%d/metrics", n.MetricsPort))
			if err != nil {
				t.Fatalf("metrics of the plugin of %s: %v", node, err)
			}
			return m
		}
	}
	t.Fatalf("no node %s", node)
	return nil
}

// TestClaimPluginMetrics: the plugin's metrics table. Its endpoint serves
// gputopo_plugin_published_devices (the node's eight GPUs) and, around one
// pod of two GPUs, prepared_claims and prepared_devices go up by one and
// two and back, and the prepare and unprepare histograms count one more
// each; prepare_errors_total does not move.
func TestClaimPluginMetrics(t *testing.T) {
	n := node(t, "dgx1-v100", true).Name
	dumpOnFailure(t, n)
	before := pluginMetrics(t, n)
	if got := before["gputopo_plugin_published_devices"]; got != 8 {
		t.Errorf("gputopo_plugin_published_devices=%v, want 8", got)
	}
	createPod(t, "metrics-pair", n, "gpu-2-nvlink-pair")
	verifyPrepared(t, "metrics-pair", n)
	during := pluginMetrics(t, n)
	delta := func(m map[string]float64, name string) float64 { return m[name] - before[name] }
	for name, want := range map[string]float64{
		"gputopo_plugin_prepared_claims":                1,
		"gputopo_plugin_prepared_devices":               2,
		"gputopo_plugin_prepare_duration_seconds_count": 1,
		"gputopo_plugin_prepare_errors_total":           0,
	} {
		if got := delta(during, name); got != want {
			t.Errorf("with the pod running: %s changed by %v (%v → %v), want %v", name, got, before[name], during[name], want)
		}
	}
	deletePod(t, "metrics-pair") // waits until the plugin unprepared the claim
	// The plugin records the unprepare when its call returns, a moment
	// after the claim's files are gone: wait for the count itself.
	wantAfter := map[string]float64{
		"gputopo_plugin_prepared_claims":                  0,
		"gputopo_plugin_prepared_devices":                 0,
		"gputopo_plugin_unprepare_duration_seconds_count": 1,
	}
	framework.Eventually(t, time.Minute, "the plugin's unprepare counted", func() (bool, string) {
		after := pluginMetrics(t, n)
		return delta(after, "gputopo_plugin_unprepare_duration_seconds_count") >= 1, fmt.Sprintf("unprepare count %v → %v", before["gputopo_plugin_unprepare_duration_seconds_count"], after["gputopo_plugin_unprepare_duration_seconds_count"])
	})
	after := pluginMetrics(t, n)
	for name, want := range wantAfter {
		if got := delta(after, name); got != want {
			t.Errorf("after the pod went: %s changed by %v (%v → %v), want %v", name, got, before[name], after[name], want)
		}
	}
}

// TestClaimTaintEffectNoExecute: "--taint-effect: effect of the unhealthy
// taint: NoSchedule or NoExecute (also evicts)". With the plugin started
// with --taint-effect=NoExecute, a GPU that fails gets the unhealthy taint
// with effect NoExecute, and the running pod that uses it is evicted.
func TestClaimTaintEffectNoExecute(t *testing.T) {
	n := node(t, "dgx1-v100", true).Name
	dumpOnFailure(t, n)
	healthFile := filepath.Join(lc.NodeDir(n), "unhealthy")
	t.Cleanup(func() {
		if err := os.Remove(healthFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Error(err)
		}
		if err := lc.RestartPlugin(n); err != nil { // with the cluster's arguments again
			t.Errorf("restart plugin of %s: %v", n, err)
		}
		waitTaints(t, n, nil)
	})
	if err := lc.StopPlugin(n); err != nil {
		t.Fatal(err)
	}
	if err := lc.StartPluginWith(n, "--taint-effect=NoExecute"); err != nil {
		t.Fatal(err)
	}

	pod := createPod(t, "noexecute", n, "gpu-1")
	p := verifyPrepared(t, "noexecute", n)
	gpu := p.devices[0]
	if err := os.WriteFile(healthFile, []byte(strconv.Itoa(deviceIndex(t, gpu))+" XID-79\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, waitLong, gpu+" of "+n+" to be tainted NoExecute", func() (bool, string) {
		s, err := nodeSlices(context.Background(), n)
		if err != nil {
			return false, err.Error()
		}
		d := devicesOf(s)[gpu]
		for _, tn := range d.Taints {
			if tn.Key == topology.TaintUnhealthy && tn.Value == "XID-79" && tn.Effect == resourcev1.DeviceTaintEffectNoExecute {
				return true, ""
			}
		}
		return false, fmt.Sprintf("taints %+v", d.Taints)
	})
	framework.Eventually(t, 2*waitLong, "pod noexecute, which uses the tainted GPU, to be evicted", func() (bool, string) {
		cur, err := client.CoreV1().Pods(namespace).Get(context.Background(), "noexecute", metav1.GetOptions{})
		if err != nil || cur.UID != pod.UID {
			return true, "" // gone
		}
		if cur.DeletionTimestamp != nil || cur.Status.Phase == corev1.PodFailed {
			return true, ""
		}
		return false, framework.PodState(cur)
	})
}

// gputopoOnTTY runs `gputopo ARGS` with its output on a terminal (util-linux
// script(1) gives it a pseudo-terminal) and env added to its environment,
// and returns what it printed.
func gputopoOnTTY(t *testing.T, env []string, args ...string) string {
	t.Helper()
	script, err := exec.LookPath("script")
	if err != nil {
		t.Fatalf("script (util-linux) gives the CLI a terminal: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	line := strings.Join(append([]string{filepath.Join(suite.BinDir, "gputopo")}, args...), " ")
	cmd := exec.CommandContext(ctx, script, "-qec", line, "/dev/null")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader("")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s on a terminal: %v\n%s", line, err, out)
	}
	return string(out)
}

// TestClaimNoColor: the CLI "colours its tables only on a terminal (and
// never with NO_COLOR set)". `gputopo topology` on a terminal writes ANSI
// colour sequences; with NO_COLOR=1 on the same terminal, and into a pipe,
// none, and the same tree otherwise.
func TestClaimNoColor(t *testing.T) {
	args := []string{"topology", "--kubeconfig=" + lc.Kubeconfig()}
	const esc = "\x1b["
	colour := gputopoOnTTY(t, []string{"NO_COLOR="}, args...)
	if !strings.Contains(colour, esc) {
		t.Errorf("gputopo topology on a terminal has no colour:\n%s", colour)
	}
	plain := gputopoOnTTY(t, []string{"NO_COLOR=1"}, args...)
	if strings.Contains(plain, esc) {
		t.Errorf("gputopo topology on a terminal with NO_COLOR=1 has ANSI sequences:\n%q", plain)
	}
	piped, err := exec.Command(filepath.Join(suite.BinDir, "gputopo"), args...).Output()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(piped, []byte(esc)) {
		t.Errorf("gputopo topology into a pipe has ANSI sequences:\n%q", piped)
	}
	for _, n := range lc.Nodes() {
		if !strings.Contains(plain, n.Name) {
			t.Errorf("NO_COLOR output lacks node %s:\n%s", n.Name, plain)
		}
	}
}

// TestClaimTopologySVG: "make demo writes _output/topology.svg: core →
// spine → leaf → node, each leaf with its free GPUs, each GPU a square".
// `kubectl gputopo topology -o svg`, as demo/local.sh runs it, on the
// suite's cluster with one pod of two GPUs: well-formed XML whose root is
// <svg>, naming every node and leaf, each leaf with its free GPUs
// ("leaf-0 · 14/16 free" with the pod's two taken), and a square per GPU.
func TestClaimTopologySVG(t *testing.T) {
	n := node(t, "dgx-h100", true)
	dumpOnFailure(t, n.Name)
	createPod(t, "svg-pair", n.Name, "gpu-2-nvlink-pair")
	verifyPrepared(t, "svg-pair", n.Name)

	out, err := kubectlGputopo(t, "--kubeconfig="+lc.Kubeconfig(), "topology", "-o", "svg")
	if err != nil {
		t.Fatalf("kubectl gputopo topology -o svg: %v\n%s", err, out)
	}
	dec := xml.NewDecoder(bytes.NewReader(out))
	var texts []string
	root, rects := "", 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("topology -o svg is not well-formed XML: %v", err)
		}
		switch tk := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tk.Name.Local
			}
			if tk.Name.Local == "rect" {
				rects++
			}
		case xml.CharData:
			if s := strings.TrimSpace(string(tk)); s != "" {
				texts = append(texts, s)
			}
		}
	}
	if root != "svg" {
		t.Fatalf("root element <%s>, want <svg>", root)
	}
	has := func(s string) bool {
		return slices.ContainsFunc(texts, func(x string) bool { return strings.Contains(x, s) })
	}
	gpus := map[string]int{}  // leaf → GPUs
	taken := map[string]int{} // leaf → GPUs taken
	for _, node := range lc.Nodes() {
		if !has(node.Name) {
			t.Errorf("the SVG does not name node %s", node.Name)
		}
		gpus[node.Leaf] += len(nodeDevices(t, node.Name))
	}
	taken[n.Leaf] = 2
	total := 0
	for leaf, g := range gpus {
		want := fmt.Sprintf("%s · %d/%d free", leaf, g-taken[leaf], g)
		if !has(want) {
			t.Errorf("the SVG does not say %q", want)
		}
		total += g
	}
	if rects < total {
		t.Errorf("the SVG has %d rectangles, fewer than the cluster's %d GPUs", rects, total)
	}
	if want := fmt.Sprintf("%d/%d GPUs free", total-2, total); !has(want) {
		t.Errorf("the SVG's title does not say %q", want)
	}
}
