package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/pkg/topology"
	cluster "github.com/gputopo/gputopo/test/cluster"
	"github.com/gputopo/gputopo/test/e2e/framework"
)

// profileShape is what a simulated profile must publish: how many GPUs and
// which aligned NVLink blocks exist (see pkg/gpu/sim/profiles).
type profileShape struct {
	gpus   int
	blocks map[int]bool // block size -> every GPU has that block attribute
}

var profiles = map[string]profileShape{
	"dgx-h100":         {gpus: 8, blocks: map[int]bool{2: true, 4: true, 8: true}},   // NVSwitch: all linked
	"dgx1-v100":        {gpus: 8, blocks: map[int]bool{2: true, 4: true, 8: false}},  // cube-mesh: quads 0-3, 4-7
	"hgx-pcie-pairs":   {gpus: 8, blocks: map[int]bool{2: true, 4: false, 8: false}}, // bridged pairs only
	"pcie-only":        {gpus: 8, blocks: map[int]bool{2: false, 4: false, 8: false}},
	"gb200-nvl72-tray": {gpus: 4, blocks: map[int]bool{2: true, 4: true, 8: false}},
}

func checkNodeSlices(t *testing.T, n cluster.NodeInfo) {
	shape, ok := profiles[n.Profile]
	if !ok {
		t.Fatalf("no expectations for profile %s", n.Profile)
	}
	node, err := client.CoreV1().Nodes().Get(framework.Ctx(t), n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantLeaf, wantSpine := node.Labels[topology.LabelTopographLeaf], node.Labels[topology.LabelTopographSpine]
	if wantLeaf == "" || wantSpine == "" {
		t.Fatalf("node %s lacks leaf/spine labels: %v", n.Name, node.Labels)
	}
	slices, err := nodeSlices(framework.Ctx(t), n.Name)
	if err != nil {
		t.Fatal(err)
	}
	if len(slices) == 0 {
		t.Fatalf("node %s has no %s ResourceSlice", n.Name, topology.DriverName)
	}
	for _, s := range slices {
		if s.Spec.Driver != topology.DriverName || s.Spec.Pool.Name != n.Name || s.Spec.NodeName == nil || *s.Spec.NodeName != n.Name {
			t.Errorf("slice %s: driver %s, pool %s, nodeName %v; want %s, pool and node %s", s.Name, s.Spec.Driver, s.Spec.Pool.Name, s.Spec.NodeName, topology.DriverName, n.Name)
		}
		if int(s.Spec.Pool.ResourceSliceCount) != len(slices) {
			t.Errorf("slice %s says the pool has %d slices; %d are published", s.Name, s.Spec.Pool.ResourceSliceCount, len(slices))
		}
	}
	devs := devicesOf(slices)
	if len(devs) != shape.gpus {
		t.Fatalf("node %s publishes %d devices, want %d: %v", n.Name, len(devs), shape.gpus, mapsKeys(devs))
	}
	uuids := map[string]string{}
	for i := range shape.gpus {
		name := fmt.Sprintf("gpu-%d", i)
		d, ok := devs[name]
		if !ok {
			t.Errorf("device %s missing; have %v", name, mapsKeys(devs))
			continue
		}
		if a, ok := attr(d, topology.AttrIndex); !ok || a.IntValue == nil || *a.IntValue != int64(i) {
			t.Errorf("%s: index attribute %+v, want %d", name, a, i)
		}
		u := stringAttr(d, topology.AttrUUID)
		if u == "" {
			t.Errorf("%s: no uuid", name)
		} else if other, dup := uuids[u]; dup {
			t.Errorf("%s and %s share uuid %s", name, other, u)
		}
		uuids[u] = name
		if got := stringAttr(d, topology.AttrLeaf); got != wantLeaf {
			t.Errorf("%s: leaf = %q, want the node's label %q", name, got, wantLeaf)
		}
		if got := stringAttr(d, topology.AttrSpine); got != wantSpine {
			t.Errorf("%s: spine = %q, want the node's label %q", name, got, wantSpine)
		}
		for _, std := range []string{"resource.kubernetes.io/pcieRoot", "resource.kubernetes.io/pciBusID"} {
			if stringAttr(d, std) == "" {
				t.Errorf("%s: standard attribute %s missing", name, std)
			}
		}
		if _, ok := d.Capacity[resourcev1.QualifiedName(topology.CapacityMemory)]; !ok {
			t.Errorf("%s: no memory capacity", name)
		}
		if len(d.Taints) != 0 {
			t.Errorf("%s: unexpected taints %+v", name, d.Taints)
		}
		hasNVLink := shape.blocks[2]
		if got := stringAttr(d, topology.AttrNVLinkDomain) != ""; got != hasNVLink {
			t.Errorf("%s: nvlinkDomain present = %v, want %v", name, got, hasNVLink)
		}
	}
	// Aligned blocks: present exactly where the profile has them; GPUs
	// [k·s, (k+1)·s) share one value, other blocks have other values.
	for _, size := range topology.BlockSizes {
		name := topology.BlockAttr(size)
		ids := map[string]int{} // block ID -> block number k
		for i := range shape.gpus {
			d := devs[fmt.Sprintf("gpu-%d", i)]
			id := stringAttr(d, name)
			if want := shape.blocks[size]; (id != "") != want {
				t.Errorf("gpu-%d: %s present = %v, want %v", i, name, id != "", want)
				continue
			}
			if id == "" {
				continue
			}
			if k, seen := ids[id]; seen && k != i/size {
				t.Errorf("gpu-%d: %s = %q, the ID of block %d; want a block of GPUs %d-%d", i, name, id, k, i/size*size, i/size*size+size-1)
			}
			ids[id] = i / size
		}
		if shape.blocks[size] && len(ids) != shape.gpus/size {
			t.Errorf("%s: %d distinct IDs %v, want %d blocks", name, len(ids), ids, shape.gpus/size)
		}
	}
}

// dryRunPrintedSlices pipes `gputopo-kubelet-plugin --print-resource-slices`
// into `kubectl apply --dry-run=server -f -` against the suite's cluster.
func dryRunPrintedSlices(t *testing.T, profile string) {
	nodeName := "e2e-dry-run-" + profile
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	print := exec.CommandContext(ctx, pluginBin, "--backend=sim", "--profile="+profile, "--node-name="+nodeName,
		"--node-labels="+cluster.LabelString(map[string]string{topology.LabelTopographLeaf: "leaf-9", topology.LabelTopographSpine: "spine-9"}),
		"--print-resource-slices")
	var printed, printErr bytes.Buffer
	print.Stdout, print.Stderr = &printed, &printErr
	if err := print.Run(); err != nil {
		t.Fatalf("%s: %v\n%s", print, err, printErr.String())
	}
	if !strings.Contains(printed.String(), "kind: ResourceSlice") {
		t.Fatalf("--print-resource-slices printed no ResourceSlice:\n%s", printed.String())
	}
	apply := exec.CommandContext(ctx, filepath.Join(k8sBinDir, "kubectl"), "--kubeconfig="+lc.Kubeconfig(),
		"apply", "--dry-run=server", "-f", "-")
	apply.Stdin = &printed
	out, err := apply.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl apply --dry-run=server refused the printed slices of %s: %v\n%s\n--- printed ---\n%s", profile, err, out, printed.String())
	}
	if !strings.Contains(string(out), "(server dry run)") {
		t.Errorf("kubectl apply --dry-run=server said %q", out)
	}
	t.Logf("%s", bytes.TrimSpace(out))
	// A dry run must leave nothing behind.
	parsed, err := cluster.ParseResourceSlices(printed.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range parsed {
		if _, err := client.ResourceV1().ResourceSlices().Get(ctx, s.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("ResourceSlice %s exists after a dry run (err %v)", s.Name, err)
		}
	}
}

// unschedulableReason is what the scheduler's DRA plugin says about a node
// where a pod's claims cannot be allocated.
const unschedulableReason = "cannot allocate all claims"

// sliceContent is what a node publishes, without metadata: each slice's
// spec with the pool generation (which counts republications) cleared,
// sorted by device name.
func sliceContent(in []resourcev1.ResourceSlice) []resourcev1.ResourceSliceSpec {
	var out []resourcev1.ResourceSliceSpec
	for _, s := range in {
		spec := *s.Spec.DeepCopy()
		spec.Pool.Generation = 0
		out = append(out, spec)
	}
	slices.SortFunc(out, func(a, b resourcev1.ResourceSliceSpec) int {
		if len(a.Devices) == 0 || len(b.Devices) == 0 {
			return len(a.Devices) - len(b.Devices)
		}
		return strings.Compare(a.Devices[0].Name, b.Devices[0].Name)
	})
	return out
}

// quantities compares resource.Quantity values, whose fields are unexported.
var quantities = cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })

// waitTaints waits until exactly the devices in want carry the unhealthy
// taint (NoSchedule, value = reason) and no other device has a taint.
func waitTaints(t *testing.T, node string, want map[string]string) {
	t.Helper()
	framework.Eventually(t, waitLong, fmt.Sprintf("devices of %s to be tainted exactly %v", node, want), func() (bool, string) {
		slices, err := nodeSlices(context.Background(), node)
		if err != nil || len(slices) == 0 {
			return false, fmt.Sprintf("slices: %d, %v", len(slices), err)
		}
		for name, d := range devicesOf(slices) {
			reason, bad := want[name]
			switch {
			case !bad && len(d.Taints) != 0:
				return false, fmt.Sprintf("%s has taints %+v", name, d.Taints)
			case bad && (len(d.Taints) != 1 || d.Taints[0].Key != topology.TaintUnhealthy ||
				d.Taints[0].Value != reason || d.Taints[0].Effect != resourcev1.DeviceTaintEffectNoSchedule):
				return false, fmt.Sprintf("%s has taints %+v, want %s=%s:NoSchedule", name, d.Taints, topology.TaintUnhealthy, reason)
			}
		}
		return true, ""
	})
}
