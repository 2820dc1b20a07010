package cli_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gputopo/gputopo/pkg/cli"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/slices"
	"github.com/gputopo/gputopo/pkg/topology"
)

func node(name, spine, leaf, profile string) v1.Node {
	return v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		topology.LabelTopographLeaf: leaf, topology.LabelTopographSpine: spine, topology.LabelProfile: profile}}}
}

func TestRenderTree(t *testing.T) {
	nodes := []v1.Node{
		node("a1", "spine-0", "leaf-0", "dgx1-v100"),
		node("a2", "spine-0", "leaf-0", "hgx-pcie-pairs"),
		node("b1", "spine-0", "leaf-1", "pcie-only"),
	}
	var rs []resourceapi.ResourceSlice
	for _, n := range nodes {
		p, err := sim.LoadBuiltin(n.Labels[topology.LabelProfile])
		if err != nil {
			t.Fatal(err)
		}
		res, err := slices.Build(p.Inventory(n.Name), slices.Node{Name: n.Name, Labels: n.Labels}, slices.DefaultConfig(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range slices.Objects(n.Name, res) {
			rs = append(rs, *s)
		}
	}
	rs[2].Spec.Devices[7].Taints = []resourceapi.DeviceTaint{{Key: topology.TaintUnhealthy, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	claim := resourceapi.ResourceClaim{}
	claim.Status.Allocation = &resourceapi.AllocationResult{}
	for _, d := range []string{"gpu-4", "gpu-5", "gpu-6", "gpu-7"} {
		claim.Status.Allocation.Devices.Results = append(claim.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Driver: topology.DriverName, Pool: "a1", Device: d})
	}
	var out strings.Builder
	views := cli.BuildViews(nodes, rs, []resourceapi.ResourceClaim{claim}, topology.DefaultLabelMapping())
	if err := cli.RenderTree(&out, views); err != nil {
		t.Fatal(err)
	}
	want := `cluster: 3 nodes, 19/24 GPUs free   (■ allocated  □ free  ✗ unhealthy  [..] NVLink domain)
└── spine-0
    ├── leaf-0  (12/16 free)
    │   ├── a1 dgx1-v100          4/8 free  [□□□□ ■■■■]
    │   └── a2 hgx-pcie-pairs     8/8 free  [□□] [□□] [□□] [□□]
    └── leaf-1  (7/8 free)
        └── b1 pcie-only          7/8 free  □ □ □ □ □ □ □ ✗
`
	if diff := cmp.Diff(want, out.String()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
