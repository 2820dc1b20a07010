package cluster

import (
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gputopo/gputopo/pkg/clustertopo"
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

// NodeSpec is one node of the cluster, in the schema gputopo's simulator
// reads too (pkg/clustertopo): the same files, the same node names.
type NodeSpec clustertopo.Node

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
	if n.Runtime != "" {
		l[LabelRuntime] = n.Runtime
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

// Topology is the topology file format (pkg/clustertopo), for callers
// that describe a cluster in code.
type Topology clustertopo.Topology

// Expand returns the nodes the topology describes, validated.
func (t Topology) Expand() ([]NodeSpec, error) {
	nodes, err := clustertopo.Topology(t).Expand()
	if err != nil {
		return nil, err
	}
	return checked(nodes)
}

// LoadTopology reads and expands a topology file.
func LoadTopology(path string) ([]NodeSpec, error) {
	nodes, err := clustertopo.Load(path)
	if err != nil {
		return nil, err
	}
	return checked(nodes)
}

// ParseTopology parses a topology document and returns its nodes in order.
func ParseTopology(data []byte) ([]NodeSpec, error) {
	nodes, err := clustertopo.Parse(data)
	if err != nil {
		return nil, err
	}
	return checked(nodes)
}

// checked converts the nodes and validates the labels the harness gives
// them.
func checked(nodes []clustertopo.Node) ([]NodeSpec, error) {
	out := make([]NodeSpec, len(nodes))
	for i, n := range nodes {
		out[i] = NodeSpec(n)
	}
	if err := validateNodes(out); err != nil {
		return nil, err
	}
	return out, nil
}

// validateNodes checks what the shared schema checks (names, profiles)
// and the labels the harness gives each node.
func validateNodes(nodes []NodeSpec) error {
	if len(nodes) == 0 {
		return nil // a control plane without nodes
	}
	t := clustertopo.Topology{Nodes: make([]clustertopo.Node, len(nodes))}
	for i, n := range nodes {
		t.Nodes[i] = clustertopo.Node(n)
	}
	if _, err := t.Expand(); err != nil {
		return err
	}
	for _, n := range nodes {
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
