package clustertopo_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gputopo/gputopo/pkg/clustertopo"
)

func TestParse(t *testing.T) {
	tests := map[string]struct {
		doc     string
		want    []clustertopo.Node
		wantErr string
	}{
		"generated: 2 spines x 1 leaf x 2 nodes, round-robin profiles": {
			doc: "{spines: 2, leavesPerSpine: 1, nodesPerLeaf: 2, profiles: [a, b, c], realNodes: 3}",
			// spine-0 ── leaf-0 ── n0 n1      spine-1 ── leaf-1 ── n0 n1
			want: []clustertopo.Node{
				{Name: "gpu-s0-l0-n0", Leaf: "leaf-0", Spine: "spine-0", Profile: "a", Real: true},
				{Name: "gpu-s0-l0-n1", Leaf: "leaf-0", Spine: "spine-0", Profile: "b", Real: true},
				{Name: "gpu-s1-l1-n0", Leaf: "leaf-1", Spine: "spine-1", Profile: "c", Real: true},
				{Name: "gpu-s1-l1-n1", Leaf: "leaf-1", Spine: "spine-1", Profile: "a"},
			},
		},
		"leaves are numbered across spines": {
			doc: "{spines: 2, leavesPerSpine: 2, nodesPerLeaf: 1, profiles: [p], namePrefix: x}",
			want: []clustertopo.Node{
				{Name: "x-s0-l0-n0", Leaf: "leaf-0", Spine: "spine-0", Profile: "p"},
				{Name: "x-s0-l1-n0", Leaf: "leaf-1", Spine: "spine-0", Profile: "p"},
				{Name: "x-s1-l2-n0", Leaf: "leaf-2", Spine: "spine-1", Profile: "p"},
				{Name: "x-s1-l3-n0", Leaf: "leaf-3", Spine: "spine-1", Profile: "p"},
			},
		},
		"explicit list": {
			doc: "{nodes: [{name: a, leaf: l9, spine: s3, profile: p, real: true}, {name: b, profile: q, labels: {zone: z1}}]}",
			want: []clustertopo.Node{
				{Name: "a", Leaf: "l9", Spine: "s3", Profile: "p", Real: true},
				{Name: "b", Profile: "q", Labels: map[string]string{"zone": "z1"}},
			},
		},
		"the last real nodes run containerd": {
			doc: "{spines: 1, leavesPerSpine: 1, nodesPerLeaf: 3, profiles: [p], realNodes: 2, containerdNodes: 1}",
			want: []clustertopo.Node{
				{Name: "gpu-s0-l0-n0", Leaf: "leaf-0", Spine: "spine-0", Profile: "p", Real: true},
				{Name: "gpu-s0-l0-n1", Leaf: "leaf-0", Spine: "spine-0", Profile: "p", Real: true, Runtime: "containerd"},
				{Name: "gpu-s0-l0-n2", Leaf: "leaf-0", Spine: "spine-0", Profile: "p"},
			},
		},
		"runtime in an explicit list": {
			doc:  "{nodes: [{name: a, profile: p, real: true, runtime: containerd}]}",
			want: []clustertopo.Node{{Name: "a", Profile: "p", Real: true, Runtime: "containerd"}},
		},
		"more containerd than real nodes": {doc: "{spines: 1, leavesPerSpine: 1, nodesPerLeaf: 2, profiles: [p], realNodes: 1, containerdNodes: 2}", wantErr: "containerdNodes"},
		"unknown runtime":                 {doc: "{nodes: [{name: a, profile: p, real: true, runtime: docker}]}", wantErr: `runtime "docker"`},
		"runtime on a fake node":          {doc: "{nodes: [{name: a, profile: p, runtime: containerd}]}", wantErr: "needs a real node"},
		"both forms":                      {doc: "{spines: 1, leavesPerSpine: 1, nodesPerLeaf: 1, profiles: [p], nodes: [{name: a, profile: p}]}", wantErr: "not both"},
		"no profiles":                     {doc: "{spines: 1, leavesPerSpine: 1, nodesPerLeaf: 1}", wantErr: "profiles"},
		"too many real":                   {doc: "{spines: 1, leavesPerSpine: 1, nodesPerLeaf: 1, profiles: [p], realNodes: 2}", wantErr: "realNodes"},
		"zero leaves":                     {doc: "{spines: 1, nodesPerLeaf: 1, profiles: [p]}", wantErr: "at least 1"},
		"empty":                           {doc: "{}", wantErr: "no nodes"},
		"unknown field":                   {doc: "{spine: 1}", wantErr: "unknown field"},
		"duplicate name":                  {doc: "{nodes: [{name: a, profile: p}, {name: a, profile: p}]}", wantErr: "duplicate"},
		"invalid name":                    {doc: "{nodes: [{name: A_1, profile: p}]}", wantErr: "invalid name"},
		"missing profile":                 {doc: "{nodes: [{name: a}]}", wantErr: "profile is required"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := clustertopo.Parse([]byte(tc.doc))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("want an error containing %q, got %v", tc.wantErr, err)
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

// The harness's demo topology and the simulator's test clusters are the
// same format.
func TestLoadRepositoryTopologies(t *testing.T) {
	for _, file := range []string{
		"../../test/cluster/topologies/demo-topology.yaml",
		"../simulate/testdata/dgx-h100-2x4x4.yaml",
	} {
		nodes, err := clustertopo.Load(file)
		if err != nil {
			t.Errorf("%s: %v", file, err)
			continue
		}
		if len(nodes) == 0 {
			t.Errorf("%s: no nodes", file)
		}
	}
	if _, err := clustertopo.Load("testdata/missing.yaml"); err == nil {
		t.Error("a missing file: want an error")
	}
}
