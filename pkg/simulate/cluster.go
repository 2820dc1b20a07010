package simulate

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/gputopo/gputopo/pkg/clustertopo"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/slices"
	"github.com/gputopo/gputopo/pkg/topology"
)

// NodeSpec is one simulated node and its place in the network.
type NodeSpec struct {
	Name, Leaf, Spine string
	Profile           *sim.Profile
	// Labels are the node's own labels besides those of its profile and
	// place (LabelGPUModel for Alibaba nodes).
	Labels map[string]string
	// CPUMilli and MemoryMiB are what pods may ask of the node; 0 when
	// the cluster file does not say, and then nothing is counted.
	CPUMilli, MemoryMiB int64
}

// ClusterOptions say how the nodes publish their GPUs.
type ClusterOptions struct {
	// Sharing publishes every GPU for sharing, as --shared-gpus=all does:
	// shared pods then take a share of a GPU instead of a whole one.
	Sharing bool
}

// Grouping says how nodes of a flat node list are cabled: consecutive
// nodes of the list share a leaf, consecutive leaves a spine.
type Grouping struct {
	NodesPerLeaf   int
	LeavesPerSpine int
	// GPUNodesOnly leaves out the nodes of a node list that have no GPUs,
	// as the FGD paper's cluster does (its gpu_node list).
	GPUNodesOnly bool
}

// DefaultGrouping is 16 nodes per leaf and 8 leaves per spine, a common
// rail-less fat-tree size.
func DefaultGrouping() Grouping { return Grouping{NodesPerLeaf: 16, LeavesPerSpine: 8} }

// Cluster is a simulated cluster: the planner's tree, and the nodes'
// objects and slices for the baseline, which allocates on its own.
type Cluster struct {
	Planner *planner.Cluster
	Nodes   []SimNode // in the order they were given
	GPUs    int
	// NodesPerLeaf is the size of the largest leaf: the size rule asks
	// for ceil(pods / NodesPerLeaf) adjacent leaves.
	NodesPerLeaf int
	Leaves       int
	Spines       int
	Sharing      bool
	byName       map[string]int
}

// SimNode is one node of a Cluster.
type SimNode struct {
	Name, Leaf, Spine   string
	LeafPos             int // position of the leaf under its spine
	GPUs                int
	Model               string // LabelGPUModel, where the node has it
	CPUMilli, MemoryMiB int64
	Obj                 *v1.Node
	Slices              []*resourceapi.ResourceSlice
}

// LoadCluster reads a cluster file: an Alibaba node list (.csv, grouped
// into leaves and spines by g) or a YAML cluster topology.
func LoadCluster(file string, g Grouping, opt ClusterOptions) (*Cluster, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read cluster file: %w", err)
	}
	var specs []NodeSpec
	if strings.EqualFold(filepath.Ext(file), ".csv") {
		specs, err = ParseAlibabaNodes(bytes.NewReader(data), file, g)
	} else {
		specs, err = ParseTopology(data, filepath.Dir(file))
		if err != nil {
			err = fmt.Errorf("cluster file %s: %w", file, err)
		}
	}
	if err != nil {
		return nil, err
	}
	c, err := NewCluster(specs, opt)
	if err != nil {
		return nil, fmt.Errorf("cluster %s: %w", file, err)
	}
	return c, nil
}

// ErrNotTopology: a cluster file that is neither a cluster topology nor
// an Alibaba node list.
var ErrNotTopology = errors.New("not a cluster topology: want the YAML of test/cluster/topologies " +
	"(spines, leavesPerSpine, nodesPerLeaf and profiles, or a list of nodes), or an Alibaba node list named *.csv")

// ParseTopology expands a cluster topology (pkg/clustertopo, the format
// of the local cluster's test/cluster/topologies) into simulated nodes. A
// profile is a built-in name or a profile file, relative to dir.
func ParseTopology(data []byte, dir string) ([]NodeSpec, error) {
	var topo clustertopo.Topology
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("%w: the file is empty", ErrNotTopology)
	}
	if err := yaml.UnmarshalStrict(data, &topo); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotTopology, err)
	}
	nodes, err := topo.Expand()
	if err != nil {
		return nil, err
	}
	profiles := map[string]*sim.Profile{}
	out := make([]NodeSpec, len(nodes))
	for i, n := range nodes {
		p := profiles[n.Profile]
		if p == nil {
			if p, err = loadProfile(n.Profile, dir); err != nil {
				return nil, fmt.Errorf("node %s: %w", n.Name, err)
			}
			profiles[n.Profile] = p
		}
		out[i] = NodeSpec{Name: n.Name, Leaf: n.Leaf, Spine: n.Spine, Profile: p}
	}
	return out, nil
}

func loadProfile(name, dir string) (*sim.Profile, error) {
	if !strings.ContainsAny(name, "/.") {
		return sim.LoadBuiltin(name)
	}
	if !filepath.IsAbs(name) {
		name = filepath.Join(dir, name)
	}
	return sim.LoadFile(name)
}

// NewCluster renders every node's ResourceSlices with the kubelet
// plugin's slice generator and builds the planner's tree.
func NewCluster(specs []NodeSpec, opt ClusterOptions) (*Cluster, error) {
	c := &Cluster{byName: map[string]int{}, Sharing: opt.Sharing}
	cfg := slices.DefaultConfig()
	cfg.Sharing.All = opt.Sharing
	infos := make([]planner.NodeInfo, 0, len(specs))
	leafSize := map[string]int{}
	leafPos := map[string]int{}
	spineLeaves := map[string]int{}
	spines := map[string]bool{}
	for _, s := range specs {
		if s.Profile == nil && s.CPUMilli == 0 {
			return nil, fmt.Errorf("node %s has neither a GPU profile nor CPU", s.Name)
		}
		if _, dup := c.byName[s.Name]; dup {
			return nil, fmt.Errorf("node %s is listed twice", s.Name)
		}
		labels := maps.Clone(s.Labels)
		if labels == nil {
			labels = map[string]string{}
		}
		var objs []*resourceapi.ResourceSlice
		gpus := 0
		if s.Profile != nil {
			labels[topology.LabelProfile] = s.Profile.Name
			gpus = s.Profile.GPUs
		}
		if s.Leaf != "" {
			labels[topology.LabelTopographLeaf] = s.Leaf
		}
		if s.Spine != "" {
			labels[topology.LabelTopographSpine] = s.Spine
		}
		if s.Profile != nil {
			res, err := slices.Build(s.Profile.Inventory(s.Name), slices.Node{Name: s.Name, Labels: labels}, cfg, nil)
			if err != nil {
				return nil, fmt.Errorf("build ResourceSlices of node %s: %w", s.Name, err)
			}
			objs = slices.Objects(s.Name, res)
		}
		if s.Leaf != "" {
			if _, seen := leafPos[s.Leaf]; !seen {
				leafPos[s.Leaf] = spineLeaves[s.Spine]
				spineLeaves[s.Spine]++
			}
			leafSize[s.Leaf]++
			c.NodesPerLeaf = max(c.NodesPerLeaf, leafSize[s.Leaf])
		}
		if s.Spine != "" {
			spines[s.Spine] = true
		}
		c.byName[s.Name] = len(c.Nodes)
		c.Nodes = append(c.Nodes, SimNode{
			Name: s.Name, Leaf: s.Leaf, Spine: s.Spine, LeafPos: leafPos[s.Leaf], GPUs: gpus, Model: labels[LabelGPUModel],
			CPUMilli: s.CPUMilli, MemoryMiB: s.MemoryMiB,
			Obj:    &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: s.Name, Labels: labels}},
			Slices: objs,
		})
		c.GPUs += gpus
		infos = append(infos, planner.NodeInfo{Name: s.Name, Leaf: s.Leaf, Spine: s.Spine, Labels: labels, Slices: objs, Allocatable: s.allocatable()})
	}
	// Leaves are adjacent in the order the nodes list them, which is how
	// both the generator and the node-list grouping number them.
	order := map[string][]string{}
	for _, n := range c.Nodes {
		if n.Leaf != "" && n.Spine != "" && (len(order[n.Spine]) == 0 || order[n.Spine][len(order[n.Spine])-1] != n.Leaf) {
			order[n.Spine] = append(order[n.Spine], n.Leaf)
		}
	}
	for s, leaves := range order {
		if len(leaves) != spineLeaves[s] {
			return nil, fmt.Errorf("the nodes of a leaf of spine %s are not listed together", s)
		}
	}
	pc, err := planner.NewCluster(infos, order)
	if err != nil {
		return nil, fmt.Errorf("build planner cluster: %w", err)
	}
	c.Planner, c.Leaves, c.Spines = pc, len(leafSize), len(spines)
	return c, nil
}

// allocatable is what the planner counts of the node: nil where the
// cluster file does not say (nothing is counted), memory as
// unknownMemoryMiB where only CPU is known, and pods without a limit, as
// the baselines count them.
func (s NodeSpec) allocatable() v1.ResourceList {
	if s.CPUMilli == 0 {
		return nil
	}
	mem := s.MemoryMiB
	if mem == 0 {
		mem = unknownMemoryMiB
	}
	l := requests(s.CPUMilli, mem)
	l[v1.ResourcePods] = *resource.NewQuantity(math.MaxInt32, resource.DecimalSI)
	return l
}

// Node returns the index of the named node.
func (c *Cluster) Node(name string) (int, bool) {
	i, ok := c.byName[name]
	return i, ok
}

// leafSpan is how many adjacent leaves the nodes cover, from the first to
// the last under one spine; ok is false when they are under different
// spines or some node has no leaf.
func (c *Cluster) leafSpan(nodes []int) (span int, ok bool) {
	lo, hi := -1, -1
	spine := ""
	for i, n := range nodes {
		nd := c.Nodes[n]
		if nd.Leaf == "" || (i > 0 && nd.Spine != spine) || (nd.Spine == "" && c.Nodes[nodes[0]].Leaf != nd.Leaf) {
			return 0, false
		}
		spine = nd.Spine
		if lo < 0 || nd.LeafPos < lo {
			lo = nd.LeafPos
		}
		hi = max(hi, nd.LeafPos)
	}
	if lo < 0 {
		return 0, false
	}
	return hi - lo + 1, true
}
