package cluster

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestParseTopology: the harness reads the shared schema
// (pkg/clustertopo, which tests its own rules) into NodeSpecs and refuses
// labels no node could carry.
func TestParseTopology(t *testing.T) {
	tests := map[string]struct {
		doc     string
		want    []NodeSpec
		wantErr string
	}{
		"generated: 2 spines x 1 leaf x 2 nodes, round-robin profiles": {
			doc: `
spines: 2
leavesPerSpine: 1
nodesPerLeaf: 2
profiles: [dgx-h100, dgx1-v100, hgx-pcie-pairs]
realNodes: 3
`,
			// spine-0 ── leaf-0 ── n0 n1      spine-1 ── leaf-1 ── n0 n1
			want: []NodeSpec{
				{Name: "gpu-s0-l0-n0", Leaf: "leaf-0", Spine: "spine-0", Profile: "dgx-h100", Real: true},
				{Name: "gpu-s0-l0-n1", Leaf: "leaf-0", Spine: "spine-0", Profile: "dgx1-v100", Real: true},
				{Name: "gpu-s1-l1-n0", Leaf: "leaf-1", Spine: "spine-1", Profile: "hgx-pcie-pairs", Real: true},
				{Name: "gpu-s1-l1-n1", Leaf: "leaf-1", Spine: "spine-1", Profile: "dgx-h100"},
			},
		},
		"generated with prefix": {
			doc:  "{spines: 1, leavesPerSpine: 1, nodesPerLeaf: 1, profiles: [p], namePrefix: node}",
			want: []NodeSpec{{Name: "node-s0-l0-n0", Leaf: "leaf-0", Spine: "spine-0", Profile: "p"}},
		},
		"explicit list": {
			doc: `
nodes:
- {name: a, leaf: leaf-9, spine: spine-3, profile: dgx-h100, real: true}
- {name: b, leaf: leaf-9, spine: spine-3, profile: dgx1-v100, labels: {zone: z1}}
`,
			want: []NodeSpec{
				{Name: "a", Leaf: "leaf-9", Spine: "spine-3", Profile: "dgx-h100", Real: true},
				{Name: "b", Leaf: "leaf-9", Spine: "spine-3", Profile: "dgx1-v100", Labels: map[string]string{"zone": "z1"}},
			},
		},
		"invalid label":     {doc: "{nodes: [{name: a, profile: p, leaf: 'bad leaf'}]}", wantErr: "fabric.topograph.run/tier-0"},
		"invalid extra key": {doc: "{nodes: [{name: a, profile: p, labels: {'a b': x}}]}", wantErr: "label key"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ParseTopology([]byte(tc.doc))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("want error containing %q, got %v", tc.wantErr, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("nodes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDemoTopology(t *testing.T) {
	nodes, err := LoadTopology("topologies/demo-topology.yaml")
	if err != nil {
		t.Fatal(err)
	}
	profiles, real := map[string]int{}, 0
	var containerd []string
	for _, n := range nodes {
		profiles[n.Profile]++
		if n.Real {
			real++
		}
		if n.Runtime == RuntimeContainerd {
			containerd = append(containerd, n.Name)
		}
	}
	if len(nodes) != 8 || real != 8 || len(profiles) != 3 {
		t.Errorf("demo topology: %d nodes, %d real, profiles %v; want 8 nodes, all real, 3 profiles", len(nodes), real, profiles)
	}
	// demo/specs/runtime pins its pods to this node by the runtime label.
	if diff := cmp.Diff([]string{"gpu-s1-l3-n1"}, containerd); diff != "" {
		t.Errorf("demo topology: nodes on containerd (-want +got):\n%s", diff)
	}
}

func TestNodeLabels(t *testing.T) {
	n := NodeSpec{Name: "gpu-s0-l1-n0", Leaf: "leaf-1", Spine: "spine-0", Profile: "dgx-h100", Labels: map[string]string{"extra": "x"}}
	want := map[string]string{
		"kubernetes.io/hostname":      "gpu-s0-l1-n0",
		"fabric.topograph.run/tier-0": "leaf-1",
		"fabric.topograph.run/tier-1": "spine-0",
		"gputopo.dev/profile":         "dgx-h100",
		LabelFake:                     "true",
		"extra":                       "x",
	}
	if diff := cmp.Diff(want, n.AllLabels()); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	wantFlag := "extra=x,fabric.topograph.run/tier-0=leaf-1,fabric.topograph.run/tier-1=spine-0,gputopo.dev/profile=dgx-h100,kubernetes.io/hostname=gpu-s0-l1-n0," + LabelFake + "=true"
	if got := LabelString(n.AllLabels()); got != wantFlag {
		t.Errorf("LabelString = %q, want %q", got, wantFlag)
	}
}
