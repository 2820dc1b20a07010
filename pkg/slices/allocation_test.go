package slices_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	specs "github.com/gputopo/gputopo/demo/specs"
	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/slices"
	"github.com/gputopo/gputopo/pkg/topology"
)

// loadSpec decodes a demo manifest, the same file users apply.
func loadSpec[T any](t testing.TB, name string) *T {
	t.Helper()
	obj, err := specs.Load[T](name)
	if err != nil {
		t.Fatal(err)
	}
	return obj
}

type fixture struct {
	node   *v1.Node
	slices []*resourceapi.ResourceSlice
	eval   *devicefit.Evaluator
}

func newFixture(t testing.TB, profile string, labels map[string]string) *fixture {
	t.Helper()
	p, err := sim.LoadBuiltin(profile)
	if err != nil {
		t.Fatal(err)
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-" + profile, Labels: labels}}
	res, err := slices.Build(p.Inventory(node.Name), slices.Node{Name: node.Name, Labels: labels}, slices.DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	class := loadSpec[resourceapi.DeviceClass](t, "deviceclass.yaml")
	return &fixture{node: node, slices: slices.Objects(node.Name, res), eval: devicefit.NewEvaluator(devicefit.NewClasses(class))}
}

// exhaust allocates the template again and again, marking each result as
// used, and returns every device set it got, as GPU indexes.
func (f *fixture) exhaust(t testing.TB, template string) [][]int {
	t.Helper()
	tmpl := loadSpec[resourceapi.ResourceClaimTemplate](t, "claims/"+template+".yaml")
	allocated := devicefit.Allocated{}
	var sets [][]int
	for i := 0; ; i++ {
		claim := devicefit.ClaimFromTemplate(tmpl, fmt.Sprintf("c%d", i))
		res, err := f.eval.Allocate(context.Background(), f.node, f.slices, allocated, []*resourceapi.ResourceClaim{claim})
		if err != nil {
			t.Fatalf("allocate %s: %v", template, err)
		}
		if res == nil {
			return sets
		}
		var idx []int
		for _, d := range res[0].Devices.Results {
			var n int
			if _, err := fmt.Sscanf(d.Device, "gpu-%d", &n); err != nil {
				t.Fatalf("unexpected device name %q", d.Device)
			}
			idx = append(idx, n)
		}
		sort.Ints(idx)
		sets = append(sets, idx)
		devicefit.AddResults(allocated, res...)
	}
}

func TestClaimTemplatesAllocateExactSets(t *testing.T) {
	leaf0 := map[string]string{topology.LabelTopographLeaf: "leaf-0", topology.LabelTopographSpine: "spine-0"}
	leaf1 := map[string]string{topology.LabelTopographLeaf: "leaf-1", topology.LabelTopographSpine: "spine-0"}
	quads := [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}
	pairs := [][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}}
	singles := [][]int{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}
	all8 := [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}
	// Per-root pairs: every profile puts consecutive GPUs behind a root.
	tests := map[string]struct {
		profile  string
		labels   map[string]string
		template string
		want     [][]int
	}{
		"v100 quad":            {"dgx1-v100", leaf0, "gpu-4-nvlink", quads},
		"h100 quad":            {"dgx-h100", leaf0, "gpu-4-nvlink", quads},
		"pcie pairs no quad":   {"hgx-pcie-pairs", leaf0, "gpu-4-nvlink", nil},
		"pcie-only no quad":    {"pcie-only", leaf0, "gpu-4-nvlink", nil},
		"gb200 quad":           {"gb200-nvl72-tray", leaf0, "gpu-4-nvlink", [][]int{{0, 1, 2, 3}}},
		"bridged pairs":        {"hgx-pcie-pairs", leaf0, "gpu-2-nvlink-pair", pairs},
		"v100 pairs":           {"dgx1-v100", leaf0, "gpu-2-nvlink-pair", pairs},
		"pcie-only no pair":    {"pcie-only", leaf0, "gpu-2-nvlink-pair", nil},
		"single GPUs":          {"dgx-h100", leaf0, "gpu-1", singles},
		"whole node":           {"dgx1-v100", leaf0, "gpu-8-node", all8},
		"whole node on a tray": {"gb200-nvl72-tray", leaf0, "gpu-8-node", nil},
		"named leaf":           {"pcie-only", leaf0, "gpu-4-leaf", quads},
		"other leaf":           {"dgx-h100", leaf1, "gpu-4-leaf", nil},
		"unlabelled node":      {"dgx-h100", nil, "gpu-4-leaf", nil},
		"pcie root pairs":      {"dgx-h100", leaf0, "gpu-2-pcie-root", pairs},
		"v100 root pairs":      {"dgx1-v100", leaf0, "gpu-2-pcie-root", pairs},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := newFixture(t, tc.profile, tc.labels).exhaust(t, tc.template)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("%s on %s (-want +got):\n%s", tc.template, tc.profile, diff)
			}
		})
	}
}

func TestUnhealthyGPUIsNotAllocated(t *testing.T) {
	f := newFixture(t, "dgx1-v100", nil)
	// Taint GPU 1: the quad 0-3 is broken, only 4-7 remains.
	for i := range f.slices[0].Spec.Devices {
		d := &f.slices[0].Spec.Devices[i]
		if d.Name == "gpu-1" {
			d.Taints = []resourceapi.DeviceTaint{{Key: topology.TaintUnhealthy, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
		}
	}
	got := f.exhaust(t, "gpu-4-nvlink")
	if diff := cmp.Diff([][]int{{4, 5, 6, 7}}, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestBrokenSelectorIsAnError(t *testing.T) {
	f := newFixture(t, "dgx-h100", nil)
	tmpl := loadSpec[resourceapi.ResourceClaimTemplate](t, "claims/gpu-1.yaml")
	tmpl.Spec.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["gpu.gputopo.dev"].leaf ==`}}}
	_, err := f.eval.Allocate(context.Background(), f.node, f.slices, devicefit.Allocated{}, []*resourceapi.ResourceClaim{devicefit.ClaimFromTemplate(tmpl, "bad")})
	if err == nil || !strings.Contains(err.Error(), "CEL") {
		t.Errorf("want a CEL compile error, got %v", err)
	}
}

// BenchmarkAllocate measures the scheduler's allocator on one node per
// claim shape, satisfiable and not. "gpu-1xN" is the count-only claim
// (gpu-1 asking for N devices), the baseline of the topology claims with
// the same count.
func BenchmarkAllocate(b *testing.B) {
	for _, tc := range []struct {
		profile, template string
		count             int64
	}{
		{"dgx-h100", "gpu-1", 0},
		{"dgx-h100", "gpu-1", 2},
		{"dgx-h100", "gpu-1", 4},
		{"dgx-h100", "gpu-1", 8},
		{"dgx-h100", "gpu-2-nvlink-pair", 0},
		{"dgx-h100", "gpu-4-nvlink", 0},
		{"dgx-h100", "gpu-4-leaf", 0}, // the node has no leaf: unsatisfiable
		{"dgx-h100", "gpu-8-node", 0},
		{"dgx1-v100", "gpu-4-nvlink", 0},
		{"hgx-pcie-pairs", "gpu-2-nvlink-pair", 0},
		{"hgx-pcie-pairs", "gpu-4-nvlink", 0}, // unsatisfiable
		{"pcie-only", "gpu-2-nvlink-pair", 0}, // unsatisfiable
		{"dgx-h100", "gpu-2-pcie-root", 0},
		{"dgx-h100", "gpu-4-ladder", 0},       // first rung
		{"hgx-pcie-pairs", "gpu-4-ladder", 0}, // third rung, after two that fail
	} {
		name := tc.profile + "/" + tc.template
		tmpl := loadSpec[resourceapi.ResourceClaimTemplate](b, "claims/"+tc.template+".yaml")
		if tc.count > 0 {
			name += fmt.Sprintf("x%d", tc.count)
			tmpl.Spec.Spec.Devices.Requests[0].Exactly.Count = tc.count
		}
		b.Run(name, func(b *testing.B) {
			f := newFixture(b, tc.profile, nil)
			claim := devicefit.ClaimFromTemplate(tmpl, "c")
			ctx := context.Background()
			for b.Loop() {
				if _, err := f.eval.Allocate(ctx, f.node, f.slices, devicefit.Allocated{}, []*resourceapi.ResourceClaim{claim}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLeafRefusalAttributes is what one node costs kube-scheduler
// when a gpu-4-leaf claim names another leaf: every device is refused,
// each after its DeviceClass selector and the claim's selector ran. The
// DRA CEL library builds a map of all of a device's attributes for every
// selector it runs, so the cost follows the number of attributes; this
// compares the devices as published with the same devices cut down to the
// one attribute the selector reads.
func BenchmarkLeafRefusalAttributes(b *testing.B) {
	tmpl := loadSpec[resourceapi.ResourceClaimTemplate](b, "claims/gpu-4-leaf.yaml")
	for _, keep := range []string{"", topology.AttrLeaf} {
		name := "published"
		if keep != "" {
			name = "only-" + keep
		}
		b.Run(name, func(b *testing.B) {
			f := newFixture(b, "dgx-h100", map[string]string{topology.LabelTopographLeaf: "leaf-1"})
			attrs := 0
			for _, s := range f.slices {
				for i := range s.Spec.Devices {
					d := &s.Spec.Devices[i]
					if keep != "" {
						for k := range d.Attributes {
							if string(k) != keep {
								delete(d.Attributes, k)
							}
						}
					}
					attrs = len(d.Attributes)
				}
			}
			claim := devicefit.ClaimFromTemplate(tmpl, "c")
			ctx := context.Background()
			for b.Loop() {
				res, err := f.eval.Allocate(ctx, f.node, f.slices, devicefit.Allocated{}, []*resourceapi.ResourceClaim{claim})
				if err != nil || res != nil {
					b.Fatalf("want a refusal, got %v, %v", res, err)
				}
			}
			b.ReportMetric(float64(attrs), "attributes")
		})
	}
}
