// Package clustertopo is the one schema of a cluster's shape: spines over
// leaves over nodes, each node with a GPU profile. The local cluster
// harness (test/cluster) starts kubelets from it and `gputopo simulate`
// replays traces on it, so both read the same files and name nodes the
// same way. It is pure: it decodes and expands, nothing more.
package clustertopo

import (
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// Topology is the file format. Either the generator fields (Spines,
// LeavesPerSpine, NodesPerLeaf, Profiles, RealNodes, NamePrefix) or Nodes
// is set.
type Topology struct {
	Spines         int      `json:"spines,omitempty"`
	LeavesPerSpine int      `json:"leavesPerSpine,omitempty"`
	NodesPerLeaf   int      `json:"nodesPerLeaf,omitempty"`
	Profiles       []string `json:"profiles,omitempty"`
	// RealNodes is how many of the generated nodes, in spine→leaf→node
	// order, the local cluster runs with a real kubelet; the rest are fake.
	// The simulator has no kubelets and ignores it.
	RealNodes int `json:"realNodes,omitempty"`
	// ContainerdNodes is how many of the real nodes, the last ones, run
	// containerd instead of the fake container runtime.
	ContainerdNodes int `json:"containerdNodes,omitempty"`
	// NamePrefix of generated node names; "gpu" when empty.
	NamePrefix string `json:"namePrefix,omitempty"`
	Nodes      []Node `json:"nodes,omitempty"`
}

// Node is one node of the cluster.
type Node struct {
	Name  string `json:"name"`
	Leaf  string `json:"leaf"`
	Spine string `json:"spine"`
	// Profile names a simulated GPU profile: a built-in name or a file.
	Profile string `json:"profile"`
	// Real nodes run a kubelet on the fake CRI and the gputopo plugin in
	// the local cluster; fake nodes are Node objects whose ResourceSlices
	// the harness publishes.
	Real bool `json:"real,omitempty"`
	// Runtime is the container runtime of a real node: empty for the
	// fake one, which records what containers would get and runs
	// nothing, or RuntimeContainerd, which runs them.
	Runtime string `json:"runtime,omitempty"`
	// Labels are extra node labels.
	Labels map[string]string `json:"labels,omitempty"`
}

// RuntimeContainerd is Node.Runtime for a node that runs containerd.
const RuntimeContainerd = "containerd"

// DefaultNamePrefix starts generated node names.
const DefaultNamePrefix = "gpu"

// NodeName is the name of generated node n of leaf (numbered across the
// whole cluster) under spine: "gpu-s0-l1-n2".
func NodeName(prefix string, spine, leaf, n int) string {
	if prefix == "" {
		prefix = DefaultNamePrefix
	}
	return fmt.Sprintf("%s-s%d-l%d-n%d", prefix, spine, leaf, n)
}

// LeafName and SpineName name generated leaves and spines.
func LeafName(leaf int) string   { return fmt.Sprintf("leaf-%d", leaf) }
func SpineName(spine int) string { return fmt.Sprintf("spine-%d", spine) }

// Load reads and expands a topology file.
func Load(path string) ([]Node, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read topology file: %w", err)
	}
	nodes, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("topology file %s: %w", path, err)
	}
	return nodes, nil
}

// Parse decodes a topology document strictly and expands it.
func Parse(data []byte) ([]Node, error) {
	var t Topology
	if err := yaml.UnmarshalStrict(data, &t); err != nil {
		return nil, fmt.Errorf("decode topology: %w", err)
	}
	return t.Expand()
}

// Expand returns the nodes the topology describes, in spine→leaf→node
// order, validated: names are DNS subdomains and unique, every node has a
// profile.
func (t Topology) Expand() ([]Node, error) {
	generated := t.Spines != 0 || t.LeavesPerSpine != 0 || t.NodesPerLeaf != 0
	var nodes []Node
	switch {
	case generated && len(t.Nodes) > 0:
		return nil, fmt.Errorf("set either spines/leavesPerSpine/nodesPerLeaf or nodes, not both")
	case generated:
		if t.Spines < 1 || t.LeavesPerSpine < 1 || t.NodesPerLeaf < 1 {
			return nil, fmt.Errorf("spines, leavesPerSpine and nodesPerLeaf must all be at least 1")
		}
		if len(t.Profiles) == 0 {
			return nil, fmt.Errorf("profiles must list at least one profile")
		}
		total := t.Spines * t.LeavesPerSpine * t.NodesPerLeaf
		if t.RealNodes < 0 || t.RealNodes > total {
			return nil, fmt.Errorf("realNodes %d out of range 0..%d", t.RealNodes, total)
		}
		if t.ContainerdNodes < 0 || t.ContainerdNodes > t.RealNodes {
			return nil, fmt.Errorf("containerdNodes %d out of range 0..%d (realNodes)", t.ContainerdNodes, t.RealNodes)
		}
		for s := range t.Spines {
			for l := range t.LeavesPerSpine {
				leaf := s*t.LeavesPerSpine + l
				for n := range t.NodesPerLeaf {
					i := len(nodes)
					nodes = append(nodes, Node{
						Name:    NodeName(t.NamePrefix, s, leaf, n),
						Leaf:    LeafName(leaf),
						Spine:   SpineName(s),
						Profile: t.Profiles[i%len(t.Profiles)],
						Real:    i < t.RealNodes,
					})
					if i < t.RealNodes && i >= t.RealNodes-t.ContainerdNodes {
						nodes[i].Runtime = RuntimeContainerd
					}
				}
			}
		}
	default:
		if len(t.Nodes) == 0 {
			return nil, fmt.Errorf("topology has no nodes")
		}
		nodes = append(nodes, t.Nodes...)
	}
	seen := map[string]bool{}
	for i, n := range nodes {
		if errs := validation.IsDNS1123Subdomain(n.Name); len(errs) > 0 {
			return nil, fmt.Errorf("node %d: invalid name %q: %s", i, n.Name, strings.Join(errs, "; "))
		}
		if seen[n.Name] {
			return nil, fmt.Errorf("node %d: duplicate name %q", i, n.Name)
		}
		seen[n.Name] = true
		if n.Profile == "" {
			return nil, fmt.Errorf("node %s: profile is required", n.Name)
		}
		switch {
		case n.Runtime != "" && n.Runtime != RuntimeContainerd:
			return nil, fmt.Errorf("node %s: runtime %q: want %q or none (the fake runtime)", n.Name, n.Runtime, RuntimeContainerd)
		case n.Runtime != "" && !n.Real:
			return nil, fmt.Errorf("node %s: runtime %s needs a real node (real: true): a fake node has no kubelet", n.Name, n.Runtime)
		}
	}
	return nodes, nil
}
