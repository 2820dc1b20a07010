package cli_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/cli"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/slices"
	"github.com/gputopo/gputopo/pkg/topology"
)

func node(name, spine, leaf, profile string) v1.Node {
	return v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		topology.LabelTopographLeaf: leaf, topology.LabelTopographSpine: spine, topology.LabelTopographCore: "core-0", topology.LabelProfile: profile}}}
}

// fixture is a small cluster:
//
//	core-0
//	└── spine-0
//	    ├── leaf-0: a1 (dgx1-v100, GPUs 4-7 held by Job ml/train), a2 (hgx-pcie-pairs)
//	    └── leaf-1: b1 (pcie-only, GPU 7 unhealthy, GPU 0 held by pod ml/solo)
//
// plus a node without gputopo GPUs, which is left out.
type fixture struct {
	nodes  []v1.Node
	slices []resourceapi.ResourceSlice
	claims []resourceapi.ResourceClaim
	pods   []v1.Pod
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	var f fixture
	f.nodes = []v1.Node{
		node("a1", "spine-0", "leaf-0", "dgx1-v100"),
		node("a2", "spine-0", "leaf-0", "hgx-pcie-pairs"),
		node("b1", "spine-0", "leaf-1", "pcie-only"),
	}
	for _, n := range f.nodes {
		p, err := sim.LoadBuiltin(n.Labels[topology.LabelProfile])
		if err != nil {
			t.Fatal(err)
		}
		res, err := slices.Build(p.Inventory(n.Name), slices.Node{Name: n.Name, Labels: n.Labels}, slices.DefaultConfig(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range slices.Objects(n.Name, res) {
			f.slices = append(f.slices, *s)
		}
	}
	f.nodes = append(f.nodes, v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cpu-only"}})
	f.slices[2].Spec.Devices[7].Taints = []resourceapi.DeviceTaint{{Key: topology.TaintUnhealthy, Value: "XID-79", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	f.claims = []resourceapi.ResourceClaim{
		allocated("ml", "train-0-gpus", "train-0", "a1", "gpu-4", "gpu-5", "gpu-6", "gpu-7"),
		allocated("ml", "solo-gpus", "solo", "b1", "gpu-0"),
	}
	f.pods = []v1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "train-0", Labels: map[string]string{"batch.kubernetes.io/job-name": "train"}}, Spec: v1.PodSpec{NodeName: "a1"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "solo"}, Spec: v1.PodSpec{NodeName: "b1"}},
	}
	return f
}

func allocated(ns, name, pod, pool string, devices ...string) resourceapi.ResourceClaim {
	c := resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "gpus", Driver: topology.DriverName, Pool: pool, Device: d})
	}
	return c
}

func (f fixture) views() []cli.NodeView {
	return cli.BuildViews(f.nodes, f.slices, f.claims, f.pods, topology.DefaultLabelMapping())
}

func TestRenderTree(t *testing.T) {
	views := newFixture(t).views()
	for name, tc := range map[string]struct {
		opts cli.TreeOptions
		want string
	}{
		"table": {want: `cluster: 3 nodes, 18/24 GPUs free   (■ allocated  □ free  ✗ unhealthy  [..] NVLink domain)
└── spine-0
    ├── leaf-0  (12/16 free)
    │   ├── a1 dgx1-v100          4/8 free  [□□□□ ■■■■]
    │   └── a2 hgx-pcie-pairs     8/8 free  [□□] [□□] [□□] [□□]
    └── leaf-1  (6/8 free)
        └── b1 pcie-only          6/8 free  ■ □ □ □ □ □ □ ✗
`},
		"wide names the core and the holders": {opts: cli.TreeOptions{Wide: true}, want: `cluster: 3 nodes, 18/24 GPUs free   (■ allocated  □ free  ✗ unhealthy  [..] NVLink domain)
└── spine-0  (core core-0)
    ├── leaf-0  (12/16 free)
    │   ├── a1 dgx1-v100          4/8 free  [□□□□ ■■■■]  ml/train×4
    │   └── a2 hgx-pcie-pairs     8/8 free  [□□] [□□] [□□] [□□]
    └── leaf-1  (6/8 free)
        └── b1 pcie-only          6/8 free  ■ □ □ □ □ □ □ ✗  ml/solo×1
`},
	} {
		t.Run(name, func(t *testing.T) {
			var out strings.Builder
			if err := cli.RenderTree(&out, views, tc.opts); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, out.String()); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestRenderTreeColorOnlyWhenAsked(t *testing.T) {
	views := newFixture(t).views()
	var plain, color strings.Builder
	if err := cli.RenderTree(&plain, views, cli.TreeOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cli.RenderTree(&color, views, cli.TreeOptions{Color: true}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(plain.String(), "\x1b[") {
		t.Error("plain output has escape codes")
	}
	if !strings.Contains(color.String(), "\x1b[31m✗\x1b[0m") {
		t.Errorf("coloured output does not paint the unhealthy GPU red:\n%q", color.String())
	}
}

func TestBuildViewsHoldersAndStates(t *testing.T) {
	views := newFixture(t).views()
	got := map[string][]string{}
	for _, v := range views {
		for _, g := range v.GPUs {
			if g.State != cli.StateFree {
				got[v.Name] = append(got[v.Name], g.Name+"="+string(g.State)+":"+g.Holder+g.Reason)
			}
		}
	}
	want := map[string][]string{
		"a1": {"gpu-4=allocated:ml/train", "gpu-5=allocated:ml/train", "gpu-6=allocated:ml/train", "gpu-7=allocated:ml/train"},
		"b1": {"gpu-0=allocated:ml/solo", "gpu-7=unhealthy:XID-79"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// A custom mapping places the same nodes elsewhere.
func TestBuildViewsReadsMapping(t *testing.T) {
	f := newFixture(t)
	f.nodes[0].Labels["example.com/rack"] = "rack-9"
	m, err := topology.ParseLabelMapping(map[string]string{"leaf": "example.com/rack"})
	if err != nil {
		t.Fatal(err)
	}
	views := cli.BuildViews(f.nodes, f.slices, f.claims, f.pods, m)
	got := map[string]string{}
	for _, v := range views {
		got[v.Name] = v.Spine + "/" + v.Leaf
	}
	if diff := cmp.Diff(map[string]string{"a1": "spine-0/rack-9", "a2": "spine-0/", "b1": "spine-0/"}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// shareGPU publishes GPU 0 of a2 for sharing and gives it two shares,
// 250 and 500 milliGPU, of the pods ml/a and ml/b.
func shareGPU(t *testing.T, f *fixture) {
	t.Helper()
	for i := range f.slices {
		s := &f.slices[i]
		if s.Spec.Pool.Name != "a2" {
			continue
		}
		d := &s.Spec.Devices[0]
		d.AllowMultipleAllocations = ptr.To(true)
		d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{topology.CapacityMilliGPU: {Value: resource.MustParse("1000")}}
	}
	for _, sh := range []struct {
		pod   string
		milli string
	}{{"a", "250"}, {"b", "500"}} {
		c := allocated("ml", sh.pod+"-gpu", sh.pod, "a2", "gpu-0")
		r := &c.Status.Allocation.Devices.Results[0]
		r.ShareID = ptr.To(types.UID("share-" + sh.pod))
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{topology.CapacityMilliGPU: resource.MustParse(sh.milli)}
		f.claims = append(f.claims, c)
	}
}

func TestSharedGPUPartlyUsed(t *testing.T) {
	f := newFixture(t)
	shareGPU(t, &f)
	views := f.views()
	var g cli.GPU
	for _, v := range views {
		if v.Name == "a2" {
			g = v.GPUs[0]
		}
	}
	want := cli.GPU{Name: "gpu-0", State: cli.StateShared, Holder: "ml/a", MilliGPU: 1000, UsedMilliGPU: 750, SharedBy: []string{"ml/a", "ml/b"},
		NVLinkDomain: g.NVLinkDomain, NVLinkBlock4: g.NVLinkBlock4}
	if diff := cmp.Diff(want, g); diff != "" {
		t.Errorf("a2's shared GPU 0 (-want +got):\n%s", diff)
	}
	var tree strings.Builder
	if err := cli.RenderTree(&tree, views, cli.TreeOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"◐ shared, partly used", "│   └── a2 hgx-pcie-pairs     7/8 free  [◐□] [□□] [□□] [□□]  gpu-0 250m free\n"} {
		if !strings.Contains(tree.String(), s) {
			t.Errorf("tree lacks %q:\n%s", s, tree.String())
		}
	}
	var svg strings.Builder
	if err := cli.RenderSVG(&svg, views, nil); err != nil {
		t.Fatal(err)
	}
	// Three quarters of the 16-pixel square filled from the bottom.
	for _, s := range []string{"gpu-0: shared by ml/a, ml/b, 250/1000 milliGPU free", `height="12.0" fill="`} {
		if !strings.Contains(svg.String(), s) {
			t.Errorf("SVG lacks %q", s)
		}
	}
}

// legendColor is the fill of holder's square in an SVG's legend.
func legendColor(t *testing.T, views []cli.NodeView, holder string) string {
	t.Helper()
	var svg strings.Builder
	if err := cli.RenderSVG(&svg, views, nil); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`fill="(#[0-9a-f]+)" stroke="#333" class="gpu"/><text [^>]*>` + regexp.QuoteMeta(holder) + `</text>`).FindStringSubmatch(svg.String())
	if m == nil {
		t.Fatalf("no legend entry for %s", holder)
	}
	return m[1]
}

func TestHolderColorsDoNotDependOnOtherJobs(t *testing.T) {
	f := newFixture(t)
	with := legendColor(t, f.views(), "ml/train")
	f.claims = f.claims[:1] // ml/solo, before ml/train in name order, gone
	if without := legendColor(t, f.views(), "ml/train"); with != without {
		t.Errorf("ml/train is %s next to ml/solo and %s alone: a Job's colour must not depend on the others", with, without)
	}
}
