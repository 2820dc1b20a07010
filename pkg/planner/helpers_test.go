package planner_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/structured"

	specs "github.com/gputopo/gputopo/demo/specs"
	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/slicepack"
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

func newPlanner(t testing.TB) *planner.Planner {
	return planner.New(newEvaluator(t))
}

func newEvaluator(t testing.TB) *devicefit.Evaluator {
	return devicefit.NewEvaluator(devicefit.NewClasses(loadSpec[resourceapi.DeviceClass](t, "deviceclass.yaml")))
}

var profiles sync.Map // name → *sim.Profile

// nodeSlices renders the ResourceSlices a simulated node publishes.
func nodeSlices(t testing.TB, name, profile, leaf, spine string) []*resourceapi.ResourceSlice {
	t.Helper()
	p, ok := profiles.Load(profile)
	if !ok {
		loaded, err := sim.LoadBuiltin(profile)
		if err != nil {
			t.Fatal(err)
		}
		p, _ = profiles.LoadOrStore(profile, loaded)
	}
	labels := map[string]string{}
	if leaf != "" {
		labels[topology.LabelTopographLeaf] = leaf
	}
	if spine != "" {
		labels[topology.LabelTopographSpine] = spine
	}
	res, err := slices.Build(p.(*sim.Profile).Inventory(name), slices.Node{Name: name, Labels: labels}, slices.DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return slices.Objects(name, res)
}

// clusterBuilder describes a test topology: spines of leaves of nodes.
// Nodes are named by their leaf: leaf-2's nodes are l2n0, l2n1, ...
type clusterBuilder struct {
	nodes []planner.NodeInfo
	order map[string][]string
	info  []nodeSpec
	edits []nodeEdit
}

// nodeEdit changes the named nodes' NodeInfo; no names means every node
// added so far.
type nodeEdit struct {
	nodes []string
	edit  func(*planner.NodeInfo)
}

type nodeSpec struct{ name, profile, leaf, spine string }

func makeCluster() *clusterBuilder { return &clusterBuilder{} }

// Leaf adds count nodes of profile to leaf "leaf-<l>" under spine.
func (b *clusterBuilder) Leaf(spine string, l int, profile string, count int) *clusterBuilder {
	return b.LeafFrom(spine, l, 0, profile, count)
}

// LeafFrom adds nodes numbered from first, to mix profiles in one leaf.
func (b *clusterBuilder) LeafFrom(spine string, l, first int, profile string, count int) *clusterBuilder {
	for i := first; i < first+count; i++ {
		b.info = append(b.info, nodeSpec{fmt.Sprintf("l%dn%d", l, i), profile, fmt.Sprintf("leaf-%d", l), spine})
	}
	return b
}

// Node adds one node with explicit labels (empty for none).
func (b *clusterBuilder) Node(name, profile, leaf, spine string) *clusterBuilder {
	b.info = append(b.info, nodeSpec{name, profile, leaf, spine})
	return b
}

// Order sets the adjacency of a spine's leaves.
func (b *clusterBuilder) Order(spine string, leaves ...string) *clusterBuilder {
	if b.order == nil {
		b.order = map[string][]string{}
	}
	b.order[spine] = leaves
	return b
}

// Spines adds spines × leaves × nodes of one profile; leaves are numbered
// across spines: spine-0 has leaf-0..leaf-(leaves-1).
func (b *clusterBuilder) Spines(spines, leaves, nodes int, profile string) *clusterBuilder {
	for s := range spines {
		for l := range leaves {
			b.Leaf(fmt.Sprintf("spine-%d", s), s*leaves+l, profile, nodes)
		}
	}
	return b
}

func (b *clusterBuilder) with(nodes []string, edit func(*planner.NodeInfo)) *clusterBuilder {
	if len(nodes) == 0 {
		for _, n := range b.info {
			nodes = append(nodes, n.name)
		}
	}
	b.edits = append(b.edits, nodeEdit{nodes: nodes, edit: edit})
	return b
}

// NotReady marks nodes whose Ready condition is not True.
func (b *clusterBuilder) NotReady(nodes ...string) *clusterBuilder {
	return b.with(nodes, func(n *planner.NodeInfo) { n.NotReady = true })
}

// Cordon marks nodes unschedulable.
func (b *clusterBuilder) Cordon(nodes ...string) *clusterBuilder {
	return b.with(nodes, func(n *planner.NodeInfo) { n.Unschedulable = true })
}

// Taint adds taint key=value:effect to nodes.
func (b *clusterBuilder) Taint(taint string, nodes ...string) *clusterBuilder {
	return b.with(nodes, func(n *planner.NodeInfo) { n.Taints = append(n.Taints, parseTaint(taint)) })
}

// Label sets a label on nodes.
func (b *clusterBuilder) Label(key, value string, nodes ...string) *clusterBuilder {
	return b.with(nodes, func(n *planner.NodeInfo) {
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[key] = value
	})
}

// Allocatable sets what pods may request on nodes, every node added so
// far when none is named.
func (b *clusterBuilder) Allocatable(list v1.ResourceList, nodes ...string) *clusterBuilder {
	return b.with(nodes, func(n *planner.NodeInfo) { n.Allocatable = list })
}

func (b *clusterBuilder) Infos(t testing.TB) []planner.NodeInfo {
	var out []planner.NodeInfo
	byName := map[string]int{}
	for _, n := range b.info {
		byName[n.name] = len(out)
		out = append(out, planner.NodeInfo{Name: n.name, Leaf: n.leaf, Spine: n.spine, Slices: nodeSlices(t, n.name, n.profile, n.leaf, n.spine)})
	}
	for _, e := range b.edits {
		for _, name := range e.nodes {
			i, ok := byName[name]
			if !ok {
				t.Fatalf("the test cluster has no node %s", name)
			}
			e.edit(&out[i])
		}
	}
	return out
}

// parseTaint reads key=value:effect or key:effect.
func parseTaint(s string) v1.Taint {
	kv, effect, _ := strings.Cut(s, ":")
	key, value, _ := strings.Cut(kv, "=")
	return v1.Taint{Key: key, Value: value, Effect: v1.TaintEffect(effect)}
}

// resources builds a ResourceList from name, quantity pairs.
func resources(pairs ...string) v1.ResourceList {
	out := v1.ResourceList{}
	for i := 0; i+1 < len(pairs); i += 2 {
		out[v1.ResourceName(pairs[i])] = resource.MustParse(pairs[i+1])
	}
	return out
}

// PackedObj is Obj with every slice packed, as the controller caches
// them (pkg/slicepack).
func (b *clusterBuilder) PackedObj(t testing.TB) *planner.Cluster {
	t.Helper()
	c, err := planner.NewCluster(packInfos(t, b.Infos(t)), b.order)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// packInfos returns infos with copies of their slices, each packed.
func packInfos(t testing.TB, infos []planner.NodeInfo) []planner.NodeInfo {
	t.Helper()
	out := make([]planner.NodeInfo, len(infos))
	for i, in := range infos {
		out[i] = in
		out[i].Slices = make([]*resourceapi.ResourceSlice, len(in.Slices))
		for j, s := range in.Slices {
			s = s.DeepCopy()
			if err := slicepack.Pack(s); err != nil {
				t.Fatal(err)
			}
			if !slicepack.Packed(s) {
				t.Fatalf("slice %s was not packed", s.Name)
			}
			out[i].Slices[j] = s
		}
	}
	return out
}

func (b *clusterBuilder) Obj(t testing.TB) *planner.Cluster {
	t.Helper()
	c, err := planner.NewCluster(b.Infos(t), b.order)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// usage marks GPUs as allocated: GPUs("l0n1", 0, 1) or Node("l0n2").
type usage struct{ set devicefit.Allocated }

func allocated() *usage { return &usage{set: devicefit.Allocated{}} }

func (u *usage) GPUs(node string, idx ...int) *usage {
	for _, i := range idx {
		u.set.Insert(devicefit.DeviceID(topology.DriverName, node, slices.DeviceName(i)))
	}
	return u
}

// Nodes marks every GPU of 8-GPU nodes as allocated.
func (u *usage) Nodes(nodes ...string) *usage {
	for _, n := range nodes {
		u.GPUs(n, 0, 1, 2, 3, 4, 5, 6, 7)
	}
	return u
}

func (u *usage) Obj() devicefit.Allocated { return u.set }

// jobBuilder makes a job of pods p0, p1, ... with claims from the demo
// templates.
type jobBuilder struct {
	t     testing.TB
	job   planner.Job
	batch int // first pod of the latest Pods call
}

func makeJob(t testing.TB, key string) *jobBuilder {
	return &jobBuilder{t: t, job: planner.Job{Key: key}}
}

// Pods adds n pods, each with one claim from template.
func (b *jobBuilder) Pods(n int, template string) *jobBuilder {
	tmpl := loadSpec[resourceapi.ResourceClaimTemplate](b.t, "claims/"+template+".yaml")
	b.batch = len(b.job.Pods)
	for range n {
		name := fmt.Sprintf("p%d", len(b.job.Pods))
		claim := devicefit.ClaimFromTemplate(tmpl, b.job.Key+"-"+name+"-"+template)
		b.job.Pods = append(b.job.Pods, planner.Pod{Name: name, Claims: []*resourceapi.ResourceClaim{claim}})
	}
	return b
}

// each changes the pods of the latest Pods call.
func (b *jobBuilder) each(edit func(*planner.Pod)) *jobBuilder {
	for i := b.batch; i < len(b.job.Pods); i++ {
		edit(&b.job.Pods[i])
	}
	return b
}

// Tolerate lets the latest pods tolerate taint key=value:effect.
func (b *jobBuilder) Tolerate(taint string) *jobBuilder {
	t := parseTaint(taint)
	return b.each(func(p *planner.Pod) {
		p.Tolerations = append(p.Tolerations, v1.Toleration{Key: t.Key, Value: t.Value, Effect: t.Effect, Operator: v1.TolerationOpEqual})
	})
}

// Selector adds key=value to the latest pods' nodeSelector.
func (b *jobBuilder) Selector(key, value string) *jobBuilder {
	return b.each(func(p *planner.Pod) {
		if p.NodeSelector == nil {
			p.NodeSelector = map[string]string{}
		}
		p.NodeSelector[key] = value
	})
}

// Volume holds the latest pods to the nodes whose label key has value,
// as a PersistentVolume's node affinity does.
func (b *jobBuilder) Volume(key, value string) *jobBuilder {
	return b.each(func(p *planner.Pod) {
		p.Volumes = append(p.Volumes, &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
			MatchExpressions: []v1.NodeSelectorRequirement{{Key: key, Operator: v1.NodeSelectorOpIn, Values: []string{value}}}}}})
	})
}

// Requires sets the latest pods' required node affinity; a node must
// match one of the terms.
func (b *jobBuilder) Requires(terms ...v1.NodeSelectorTerm) *jobBuilder {
	return b.each(func(p *planner.Pod) {
		p.NodeAffinity = &v1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &v1.NodeSelector{NodeSelectorTerms: terms}}
	})
}

// Request sets the latest pods' requests.
func (b *jobBuilder) Request(list v1.ResourceList) *jobBuilder {
	return b.each(func(p *planner.Pod) { p.Requests = list })
}

func (b *jobBuilder) Placement(p planner.Placement) *jobBuilder { b.job.Placement = p; return b }
func (b *jobBuilder) Strategy(s planner.Strategy) *jobBuilder   { b.job.Strategy = s; return b }

func (b *jobBuilder) Prefer(domain string, required bool) *jobBuilder {
	b.job.PreferredDomain, b.job.PreferredRequired = domain, required
	return b
}

// Pinned records a pod of the job that already runs on node; it is not
// one of the pods to place.
func (b *jobBuilder) Pinned(pod, node string) *jobBuilder {
	if b.job.Pinned == nil {
		b.job.Pinned = map[string]string{}
	}
	b.job.Pinned[pod] = node
	return b
}

func (b *jobBuilder) Domain(level planner.Level, names ...string) *jobBuilder {
	b.job.Domain = &planner.Domain{Level: level, Names: names}
	return b
}

func (b *jobBuilder) Obj() planner.Job { return b.job }

// placed is the part of a plan the tables compare.
type placed struct {
	Domain      planner.Domain
	Assignments map[string]string
	Fallback    bool
	Widened     bool
}

func project(p *planner.Plan) *placed {
	if p == nil {
		return nil
	}
	return &placed{Domain: p.Domain, Assignments: p.Assignments, Fallback: p.Fallback, Widened: p.Widened}
}

func leaf(name string) planner.Domain {
	return planner.Domain{Level: planner.LevelLeaf, Names: []string{name}}
}

func leaves(names ...string) planner.Domain {
	return planner.Domain{Level: planner.LevelLeaves, Names: names}
}

// assign builds pod → node maps: assign("l0n0", "l0n1") puts p0 on l0n0
// and p1 on l0n1.
func assign(nodes ...string) map[string]string {
	out := map[string]string{}
	for i, n := range nodes {
		out[fmt.Sprintf("p%d", i)] = n
	}
	return out
}

type structuredID = structured.DeviceID

func gpuID(node string, i int) structured.DeviceID {
	return devicefit.DeviceID(topology.DriverName, node, slices.DeviceName(i))
}
