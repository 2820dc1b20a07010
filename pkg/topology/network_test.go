package topology_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/pkg/topology"
)

func TestLabelMappingResolve(t *testing.T) {
	custom, err := topology.ParseLabelMapping(map[string]string{"leaf": "example.com/rack", "spine": "example.com/row, example.com/pod", "core": "", "tierPrefix": ""})
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		mapping topology.LabelMapping
		labels  map[string]string
		want    topology.NetworkPlacement
	}{
		"topograph 1.0: tier-0 is the leaf": {
			labels: map[string]string{
				"fabric.topograph.run/tier-0": "leaf-7", "fabric.topograph.run/tier-1": "spine-2", "fabric.topograph.run/tier-2": "core-0",
				"fabric.topograph.run/tier-3": "zone-a", "fabric.topograph.run/tier-x": "ignored",
				"accelerator.topograph.run/domain": "nvl72-rack4",
			},
			want: topology.NetworkPlacement{Leaf: "leaf-7", Spine: "spine-2", Core: "core-0", Tiers: map[int]string{3: "zone-a"}, Clique: "nvl72-rack4"},
		},
		"topograph before 1.0": {
			labels: map[string]string{
				"network.topology.nvidia.com/leaf": "sw-l1", "network.topology.nvidia.com/spine": "sw-s1",
				"network.topology.nvidia.com/core": "sw-c1", "network.topology.nvidia.com/accelerator": "nvl-a",
			},
			want: topology.NetworkPlacement{Leaf: "sw-l1", Spine: "sw-s1", Core: "sw-c1", Clique: "nvl-a"},
		},
		"labelled both ways: topograph 1.0 wins per tier": {
			labels: map[string]string{
				"fabric.topograph.run/tier-0": "leaf-7", "network.topology.nvidia.com/leaf": "sw-l1",
				"network.topology.nvidia.com/spine": "sw-s1",
				"nvidia.com/gpu.clique":             "uuid.3", "network.topology.nvidia.com/accelerator": "nvl-a",
			},
			want: topology.NetworkPlacement{Leaf: "leaf-7", Spine: "sw-s1", Clique: "nvl-a"},
		},
		"GPU feature discovery clique alone": {
			labels: map[string]string{"nvidia.com/gpu.clique": "uuid.3"},
			want:   topology.NetworkPlacement{Clique: "uuid.3"},
		},
		"custom mapping ignores the defaults it replaced": {
			mapping: custom,
			labels: map[string]string{
				"example.com/rack": "r12", "example.com/pod": "p1", "fabric.topograph.run/tier-0": "leaf-7",
				"fabric.topograph.run/tier-2": "core-0", "fabric.topograph.run/tier-4": "x", "nvidia.com/gpu.clique": "uuid.3",
			},
			want: topology.NetworkPlacement{Leaf: "r12", Spine: "p1", Clique: "uuid.3"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			m := tc.mapping
			if m.Leaf == nil {
				m = topology.DefaultLabelMapping()
			}
			if diff := cmp.Diff(tc.want, m.Resolve(tc.labels)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestLabelMappingDataRoundTrip(t *testing.T) {
	def := topology.DefaultLabelMapping()
	got, err := topology.ParseLabelMapping(def.Data())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(def, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	// An empty ConfigMap is the defaults.
	if got, err := topology.ParseLabelMapping(nil); err != nil || !cmp.Equal(def, got) {
		t.Errorf("ParseLabelMapping(nil) = %+v, %v; want the defaults", got, err)
	}
	wantData := map[string]string{
		"leaf":       "fabric.topograph.run/tier-0,network.topology.nvidia.com/leaf",
		"spine":      "fabric.topograph.run/tier-1,network.topology.nvidia.com/spine",
		"core":       "fabric.topograph.run/tier-2,network.topology.nvidia.com/core",
		"clique":     "accelerator.topograph.run/domain,network.topology.nvidia.com/accelerator,nvidia.com/gpu.clique",
		"tierPrefix": "fabric.topograph.run/tier-",
	}
	if diff := cmp.Diff(wantData, def.Data()); diff != "" {
		t.Errorf("default data (-want +got):\n%s", diff)
	}
}

func TestParseLabelMappingErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		data map[string]string
		want []string
	}{
		"unknown key":         {map[string]string{"leafs": "a/b"}, []string{`unknown key "leafs"`, "want leaf, spine, core, clique or tierPrefix"}},
		"bad label key":       {map[string]string{"spine": "ok/one, not a label"}, []string{`spine label "not a label" is not a label key`}},
		"bad tier prefix":     {map[string]string{"tierPrefix": "bad prefix/"}, []string{`tierPrefix "bad prefix/"`}},
		"every error at once": {map[string]string{"x": "", "leaf": "a b"}, []string{`unknown key "x"`, `leaf label "a b"`}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := topology.ParseLabelMapping(tc.data)
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
