package cluster

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// Labels every node of a local cluster carries. The tier labels are those
// topograph 1.0 writes (tier-0 is the switch the node hangs off), which the
// gputopo plugin, controller and CLI read by default.
const (
	LabelLeaf    = "fabric.topograph.run/tier-0"
	LabelSpine   = "fabric.topograph.run/tier-1"
	LabelProfile = "gputopo.dev/profile"
	// LabelFake marks nodes without a kubelet; harness-only, not a product label.
	LabelFake = "localcluster.gputopo.dev/fake"
)

// Topology is the file format of --topology. Either the generator fields
// (Spines, LeavesPerSpine, NodesPerLeaf, Profiles, RealNodes) or Nodes is set.
type Topology struct {
	Spines         int      `json:"spines,omitempty"`
	LeavesPerSpine int      `json:"leavesPerSpine,omitempty"`
	NodesPerLeaf   int      `json:"nodesPerLeaf,omitempty"`
	Profiles       []string `json:"profiles,omitempty"`
	// RealNodes is how many of the generated nodes, in spine→leaf→node order,
	// get a real kubelet; the rest are fake.
	RealNodes int `json:"realNodes,omitempty"`
	// NamePrefix of generated node names; "gpu" when empty.
	NamePrefix string     `json:"namePrefix,omitempty"`
	Nodes      []NodeSpec `json:"nodes,omitempty"`
}

// NodeSpec is one node of the cluster.
type NodeSpec struct {
	Name    string `json:"name"`
	Leaf    string `json:"leaf"`
	Spine   string `json:"spine"`
	Profile string `json:"profile"`
	// Real nodes run a kubelet on the fake CRI and the gputopo plugin; fake
	// nodes are Node objects whose ResourceSlices the harness publishes.
	Real bool `json:"real,omitempty"`
	// Labels are extra labels, added to the standard ones.
	Labels map[string]string `json:"labels,omitempty"`
}

// AllLabels returns the node's labels: the standard ones plus Labels.
func (n NodeSpec) AllLabels() map[string]string {
	l := map[string]string{
		"kubernetes.io/hostname": n.Name,
		LabelLeaf:                n.Leaf,
		LabelSpine:               n.Spine,
		LabelProfile:             n.Profile,
	}
	if !n.Real {
		l[LabelFake] = "true"
	}
	for k, v := range n.Labels {
		l[k] = v
	}
	return l
}

// LabelString renders labels as sorted k=v pairs joined by commas, the form of
// --node-labels.
func LabelString(labels map[string]string) string {
	kv := make([]string, 0, len(labels))
	for k, v := range labels {
		kv = append(kv, k+"="+v)
	}
	sort.Strings(kv)
	return strings.Join(kv, ",")
}

// LoadTopology reads and expands a topology file.
func LoadTopology(path string) ([]NodeSpec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read topology file: %w", err)
	}
	nodes, err := ParseTopology(data)
	if err != nil {
		return nil, fmt.Errorf("parse topology file %s: %w", path, err)
	}
	return nodes, nil
}

// ParseTopology parses a topology document and returns its nodes in order.
func ParseTopology(data []byte) ([]NodeSpec, error) {
	var t Topology
	if err := yaml.UnmarshalStrict(data, &t); err != nil {
		return nil, fmt.Errorf("decode topology: %w", err)
	}
	return t.Expand()
}

// Expand returns the nodes the topology describes, validated.
func (t Topology) Expand() ([]NodeSpec, error) {
	generated := t.Spines != 0 || t.LeavesPerSpine != 0 || t.NodesPerLeaf != 0
	var nodes []NodeSpec
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
		prefix := t.NamePrefix
		if prefix == "" {
			prefix = "gpu"
		}
		for s := 0; s < t.Spines; s++ {
			for l := 0; l < t.LeavesPerSpine; l++ {
				leaf := s*t.LeavesPerSpine + l
				for n := 0; n < t.NodesPerLeaf; n++ {
					i := len(nodes)
					nodes = append(nodes, NodeSpec{
						Name:    fmt.Sprintf("%s-s%d-l%d-n%d", prefix, s, leaf, n),
						Leaf:    fmt.Sprintf("leaf-%d", leaf),
						Spine:   fmt.Sprintf("spine-%d", s),
						Profile: t.Profiles[i%len(t.Profiles)],
						Real:    i < t.RealNodes,
					})
				}
			}
		}
	default:
		if len(t.Nodes) == 0 {
			return nil, fmt.Errorf("topology has no nodes")
		}
		nodes = append(nodes, t.Nodes...)
	}
	if err := validateNodes(nodes); err != nil {
		return nil, err
	}
	return nodes, nil
}

func validateNodes(nodes []NodeSpec) error {
	seen := map[string]bool{}
	for i, n := range nodes {
		if errs := validation.IsDNS1123Subdomain(n.Name); len(errs) > 0 {
			return fmt.Errorf("node %d: invalid name %q: %s", i, n.Name, strings.Join(errs, "; "))
		}
		if seen[n.Name] {
			return fmt.Errorf("node %d: duplicate name %q", i, n.Name)
		}
		seen[n.Name] = true
		if n.Profile == "" {
			return fmt.Errorf("node %s: profile is required", n.Name)
		}
		for k, v := range n.AllLabels() {
			if errs := validation.IsQualifiedName(k); len(errs) > 0 {
				return fmt.Errorf("node %s: label key %q: %s", n.Name, k, strings.Join(errs, "; "))
			}
			if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
				return fmt.Errorf("node %s: label %s value %q: %s", n.Name, k, v, strings.Join(errs, "; "))
			}
		}
	}
	return nil
}
