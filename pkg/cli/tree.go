// Package cli is what the gputopo command (kubectl gputopo) shows: the
// topology tree and its picture, and the explanation of a job's placement.
// Building the views works on plain API objects, so it is tested without a
// cluster; fetch.go reads those objects from one.
package cli

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/pkg/topology"
)

// GPUState is what a GPU is doing.
type GPUState string

const (
	StateFree      GPUState = "free"
	StateAllocated GPUState = "allocated"
	// StateShared: a GPU published for sharing that holds shares and
	// still has milli-GPUs free; one whose shares take it all is
	// allocated.
	StateShared GPUState = "shared"
	// StateUnhealthy wins over allocated: the GPU carries the unhealthy
	// taint, whoever holds it.
	StateUnhealthy GPUState = "unhealthy"
)

// GPU is one published GPU.
type GPU struct {
	Name         string   `json:"name"`
	Index        int64    `json:"index"`
	NVLinkDomain string   `json:"nvlinkDomain,omitempty"`
	NVLinkBlock4 string   `json:"nvlinkBlock4,omitempty"`
	State        GPUState `json:"state"`
	// Holder is the namespace/name of the Job (or gputopo.dev/group, or
	// pod) whose claim holds the GPU.
	Holder string `json:"holder,omitempty"`
	// Reason is the unhealthy taint's value, e.g. XID-79.
	Reason string `json:"reason,omitempty"`
	// MilliGPU is the compute of a GPU published for sharing, in
	// thousandths (1000); 0 for a GPU handed out whole.
	MilliGPU int64 `json:"milliGPU,omitempty"`
	// UsedMilliGPU is what the shares of a shared GPU take together.
	UsedMilliGPU int64 `json:"usedMilliGPU,omitempty"`
	// SharedBy lists the holders of the GPU's shares.
	SharedBy []string `json:"sharedBy,omitempty"`
}

// FreeMilliGPU is what a shared GPU has left, in thousandths of a GPU.
func (g GPU) FreeMilliGPU() int64 { return max(g.MilliGPU-g.UsedMilliGPU, 0) }

// NodeView is one node with its place in the network and its GPUs.
type NodeView struct {
	Name    string `json:"name"`
	Spine   string `json:"spine,omitempty"`
	Leaf    string `json:"leaf,omitempty"`
	Core    string `json:"core,omitempty"`
	Profile string `json:"profile,omitempty"`
	GPUs    []GPU  `json:"gpus"`
	// ReservedFor is the waiting group the controller keeps the node's
	// free GPUs for (namespace/name), if any.
	ReservedFor string `json:"reservedFor,omitempty"`
}

// Free counts the node's free GPUs.
func (n NodeView) Free() int {
	free := 0
	for _, g := range n.GPUs {
		if g.State == StateFree {
			free++
		}
	}
	return free
}

// Holders counts the node's GPUs per holder, in name order.
func (n NodeView) Holders() []string {
	count := map[string]int{}
	for _, g := range n.GPUs {
		if g.Holder != "" {
			count[g.Holder]++
		}
	}
	var out []string
	for _, h := range slices.Sorted(maps.Keys(count)) {
		out = append(out, fmt.Sprintf("%s×%d", h, count[h]))
	}
	return out
}

// BuildViews joins nodes, their gputopo slices, the devices of every
// allocated claim and the pods holding them. Nodes without gputopo GPUs
// are left out.
func BuildViews(nodes []v1.Node, resourceSlices []resourceapi.ResourceSlice, claims []resourceapi.ResourceClaim, pods []v1.Pod, mapping topology.LabelMapping) []NodeView {
	podByName := map[string]*v1.Pod{}
	for i := range pods {
		podByName[pods[i].Namespace+"/"+pods[i].Name] = &pods[i]
	}
	holder := map[string]string{} // pool/device → holder
	type share struct {
		used    int64 // -1: a share that did not say, which takes it all
		holders map[string]bool
	}
	shares := map[string]*share{} // pool/device → its shares
	for i := range claims {
		c := &claims[i]
		if c.Status.Allocation == nil {
			continue
		}
		h := claimHolder(c, podByName)
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != topology.DriverName {
				continue
			}
			key := r.Pool + "/" + r.Device
			if r.ShareID == nil {
				holder[key] = h
				continue
			}
			sh := shares[key]
			if sh == nil {
				sh = &share{holders: map[string]bool{}}
				shares[key] = sh
			}
			sh.holders[h] = true
			if q, ok := r.ConsumedCapacity[topology.CapacityMilliGPU]; ok && sh.used >= 0 {
				sh.used += q.Value()
			} else {
				sh.used = -1
			}
		}
	}
	byNode := map[string][]GPU{}
	for _, s := range resourceSlices {
		if s.Spec.Driver != topology.DriverName || s.Spec.NodeName == nil {
			continue
		}
		for _, d := range s.Spec.Devices {
			g := GPU{Name: d.Name, State: StateFree, Holder: holder[s.Spec.Pool.Name+"/"+d.Name]}
			if a, ok := d.Attributes[topology.AttrIndex]; ok && a.IntValue != nil {
				g.Index = *a.IntValue
			}
			if a, ok := d.Attributes[topology.AttrNVLinkDomain]; ok && a.StringValue != nil {
				g.NVLinkDomain = *a.StringValue
			}
			if a, ok := d.Attributes[topology.AttrNVLinkBlock4]; ok && a.StringValue != nil {
				g.NVLinkBlock4 = *a.StringValue
			}
			if q, ok := d.Capacity[topology.CapacityMilliGPU]; ok {
				g.MilliGPU = q.Value.Value()
			}
			if sh := shares[s.Spec.Pool.Name+"/"+d.Name]; sh != nil && g.Holder == "" {
				g.SharedBy = slices.SortedFunc(maps.Keys(sh.holders), natCmp)
				g.Holder = g.SharedBy[0]
				g.UsedMilliGPU = sh.used
				if sh.used < 0 || g.MilliGPU == 0 {
					g.UsedMilliGPU = g.MilliGPU
				}
			}
			switch {
			case g.Holder != "" && g.MilliGPU > 0 && g.FreeMilliGPU() > 0:
				g.State = StateShared
			case g.Holder != "":
				g.State = StateAllocated
			}
			for _, t := range d.Taints {
				if t.Key == topology.TaintUnhealthy {
					g.State, g.Reason = StateUnhealthy, t.Value
				}
			}
			byNode[*s.Spec.NodeName] = append(byNode[*s.Spec.NodeName], g)
		}
	}
	views := make([]NodeView, 0, len(nodes))
	for _, n := range nodes {
		gpus := byNode[n.Name]
		if len(gpus) == 0 {
			continue
		}
		p := mapping.Resolve(n.Labels)
		slices.SortFunc(gpus, func(a, b GPU) int { return cmp.Compare(a.Index, b.Index) })
		views = append(views, NodeView{Name: n.Name, Spine: p.Spine, Leaf: p.Leaf, Core: p.Core, Profile: n.Labels[topology.LabelProfile], GPUs: gpus})
	}
	slices.SortFunc(views, func(a, b NodeView) int {
		return cmp.Or(natCmp(a.Spine, b.Spine), natCmp(a.Leaf, b.Leaf), natCmp(a.Name, b.Name))
	})
	return views
}

// claimHolder names what holds a claim's devices: the Job or group of the
// pod it is reserved for (or that owns it), else that pod, else the claim.
func claimHolder(c *resourceapi.ResourceClaim, pods map[string]*v1.Pod) string {
	var podNames []string
	for _, r := range c.Status.ReservedFor {
		if r.Resource == "pods" {
			podNames = append(podNames, r.Name)
		}
	}
	for _, o := range c.OwnerReferences {
		if o.Kind == "Pod" {
			podNames = append(podNames, o.Name)
		}
	}
	for _, name := range podNames {
		p, ok := pods[c.Namespace+"/"+name]
		if !ok {
			return c.Namespace + "/" + name
		}
		return podHolder(p)
	}
	return c.Namespace + "/" + c.Name
}

// podHolder names the pod's Job or gputopo.dev/group, else the pod:
// namespace/name.
func podHolder(p *v1.Pod) string {
	if j := p.Labels["batch.kubernetes.io/job-name"]; j != "" {
		return p.Namespace + "/" + j
	}
	if g := p.Annotations[placement.AnnotationGroup]; g != "" {
		return p.Namespace + "/" + g
	}
	return p.Namespace + "/" + p.Name
}

// TreeOptions say how RenderTree draws.
type TreeOptions struct {
	// Wide adds each node's holders and the core switch of each spine.
	Wide bool
	// Color uses ANSI colours: for a terminal only.
	Color bool
	// Waiting are listed below the tree.
	Waiting []WaitingGroup
}

// RenderTree draws spine → leaf → node → NVLink domains. Each GPU is a
// cell: ■ allocated, □ free, ✗ unhealthy; GPUs of one NVLink domain share
// brackets and aligned quads are separated by a space.
func RenderTree(w io.Writer, views []NodeView, o TreeOptions) error {
	pal := palette(o.Color)
	total, free := 0, 0
	for _, v := range views {
		total += len(v.GPUs)
		free += v.Free()
	}
	var b strings.Builder
	shared := ""
	if slices.ContainsFunc(views, func(v NodeView) bool {
		return slices.ContainsFunc(v.GPUs, func(g GPU) bool { return g.State == StateShared })
	}) {
		shared = "  " + pal.allocated("◐") + " shared, partly used"
	}
	fmt.Fprintf(&b, "cluster: %d nodes, %d/%d GPUs free   (%s allocated%s  %s free  %s unhealthy  [..] NVLink domain)\n",
		len(views), free, total, pal.allocated("■"), shared, pal.free("□"), pal.unhealthy("✗"))

	spines := groupTree(views)
	for si, s := range spines {
		lastSpine := si == len(spines)-1
		head := orNone(s.name)
		if o.Wide && s.core != "" {
			head += "  (core " + s.core + ")"
		}
		fmt.Fprintf(&b, "%s %s\n", branch(lastSpine), pal.bold(head))
		for li, l := range s.leaves {
			lastLeaf := li == len(s.leaves)-1
			lf, lt := 0, 0
			for _, n := range l.nodes {
				lf += n.Free()
				lt += len(n.GPUs)
			}
			fmt.Fprintf(&b, "%s%s %s  (%d/%d free)\n", indent(lastSpine), branch(lastLeaf), pal.bold(orNone(l.name)), lf, lt)
			for ni, n := range l.nodes {
				prefix := indent(lastSpine) + indent(lastLeaf) + branch(ni == len(l.nodes)-1)
				line := fmt.Sprintf("%s %-*s %-18s %d/%d free  %s", prefix, nameWidth(l.nodes), n.Name, n.Profile, n.Free(), len(n.GPUs), cells(n.GPUs, pal))
				if part := sharedFree(n.GPUs); part != "" {
					line += "  " + part
				}
				if n.ReservedFor != "" {
					line += "  " + pal.bold("reserved for "+n.ReservedFor)
				}
				if hs := n.Holders(); o.Wide && len(hs) > 0 {
					line += "  " + pal.dim(strings.Join(hs, " "))
				}
				b.WriteString(strings.TrimRight(line, " ") + "\n")
			}
		}
	}
	b.WriteString(waitingLines(o.Waiting, o.Wide, pal))
	_, err := io.WriteString(w, b.String())
	return err
}

type spineGroup struct {
	name, core string
	leaves     []leafGroup
}

type leafGroup struct {
	name  string
	nodes []NodeView
}

// groupTree groups views (sorted by BuildViews) into spines and leaves.
func groupTree(views []NodeView) []spineGroup {
	var out []spineGroup
	for _, v := range views {
		if len(out) == 0 || out[len(out)-1].name != v.Spine {
			out = append(out, spineGroup{name: v.Spine})
		}
		s := &out[len(out)-1]
		if s.core == "" {
			s.core = v.Core
		}
		if len(s.leaves) == 0 || s.leaves[len(s.leaves)-1].name != v.Leaf {
			s.leaves = append(s.leaves, leafGroup{name: v.Leaf})
		}
		l := &s.leaves[len(s.leaves)-1]
		l.nodes = append(l.nodes, v)
	}
	return out
}

func cells(gpus []GPU, pal palette) string {
	var b strings.Builder
	for i, g := range gpus {
		if i > 0 {
			prev := gpus[i-1]
			switch {
			case prev.NVLinkDomain != g.NVLinkDomain || g.NVLinkDomain == "":
				if prev.NVLinkDomain != "" {
					b.WriteString("]")
				}
				b.WriteString(" ")
			case prev.NVLinkBlock4 != g.NVLinkBlock4:
				b.WriteString(" ")
			}
		}
		if g.NVLinkDomain != "" && (i == 0 || gpus[i-1].NVLinkDomain != g.NVLinkDomain) {
			b.WriteString("[")
		}
		switch g.State {
		case StateUnhealthy:
			b.WriteString(pal.unhealthy("✗"))
		case StateAllocated:
			b.WriteString(pal.allocated("■"))
		case StateShared:
			b.WriteString(pal.allocated("◐"))
		default:
			b.WriteString(pal.free("□"))
		}
	}
	if len(gpus) > 0 && gpus[len(gpus)-1].NVLinkDomain != "" {
		b.WriteString("]")
	}
	return b.String()
}

// sharedFree says what each partly used shared GPU has left:
// "gpu-2 500m free".
func sharedFree(gpus []GPU) string {
	var parts []string
	for _, g := range gpus {
		if g.State == StateShared {
			parts = append(parts, fmt.Sprintf("%s %dm free", g.Name, g.FreeMilliGPU()))
		}
	}
	return strings.Join(parts, ", ")
}

func nameWidth(nodes []NodeView) int {
	w := 0
	for _, n := range nodes {
		w = max(w, len(n.Name))
	}
	return w
}

func branch(last bool) string {
	if last {
		return "└──"
	}
	return "├──"
}

func indent(last bool) string {
	if last {
		return "    "
	}
	return "│   "
}

func orNone(s string) string {
	if s == "" {
		return "(unlabelled)"
	}
	return s
}

// natCmp orders names naturally ("leaf-2" before "leaf-10"), the empty
// name last.
func natCmp(a, b string) int {
	switch {
	case a == b:
		return 0
	case a == "":
		return 1
	case b == "":
		return -1
	case topology.NaturalLess(a, b):
		return -1
	}
	return 1
}

// palette colours text with ANSI escapes when on.
type palette bool

func (p palette) paint(code, s string) string {
	if !p {
		return s
	}
	return "\x1b[" + code + "m" + s + "\x1b[0m"
}

func (p palette) bold(s string) string      { return p.paint("1", s) }
func (p palette) dim(s string) string       { return p.paint("2", s) }
func (p palette) free(s string) string      { return p.paint("32", s) }
func (p palette) allocated(s string) string { return p.paint("33", s) }
func (p palette) unhealthy(s string) string { return p.paint("31", s) }
