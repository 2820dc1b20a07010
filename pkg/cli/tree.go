// Package cli renders what the gputopo command shows. It works on plain
// API objects so it can be tested without a cluster.
package cli

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gputopo/gputopo/pkg/topology"
)

// GPU is one published GPU as the tree shows it.
type GPU struct {
	Name      string
	Index     int64
	Domain    string
	Block4    string
	Allocated bool
	Unhealthy bool
}

// NodeView is one node with its GPUs.
type NodeView struct {
	Name    string
	Leaf    string
	Spine   string
	Profile string
	GPUs    []GPU
}

// Free counts unallocated healthy GPUs.
func (n NodeView) Free() int {
	free := 0
	for _, g := range n.GPUs {
		if !g.Allocated && !g.Unhealthy {
			free++
		}
	}
	return free
}

// BuildViews joins nodes, their gputopo slices and the allocated devices
// of every claim.
func BuildViews(nodes []v1.Node, resourceSlices []resourceapi.ResourceSlice, claims []resourceapi.ResourceClaim, nl topology.LabelMapping) []NodeView {
	allocated := map[string]bool{} // pool/device
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == topology.DriverName {
				allocated[r.Pool+"/"+r.Device] = true
			}
		}
	}
	byNode := map[string][]GPU{}
	for _, s := range resourceSlices {
		if s.Spec.Driver != topology.DriverName || s.Spec.NodeName == nil {
			continue
		}
		for _, d := range s.Spec.Devices {
			g := GPU{Name: d.Name, Allocated: allocated[s.Spec.Pool.Name+"/"+d.Name]}
			if a, ok := d.Attributes[topology.AttrIndex]; ok && a.IntValue != nil {
				g.Index = *a.IntValue
			}
			if a, ok := d.Attributes[topology.AttrNVLinkDomain]; ok && a.StringValue != nil {
				g.Domain = *a.StringValue
			}
			if a, ok := d.Attributes[topology.AttrNVLinkBlock4]; ok && a.StringValue != nil {
				g.Block4 = *a.StringValue
			}
			for _, t := range d.Taints {
				if t.Key == topology.TaintUnhealthy {
					g.Unhealthy = true
				}
			}
			byNode[*s.Spec.NodeName] = append(byNode[*s.Spec.NodeName], g)
		}
	}
	views := make([]NodeView, 0, len(nodes))
	for _, n := range nodes {
		p := nl.Resolve(n.Labels)
		gpus := byNode[n.Name]
		slices.SortFunc(gpus, func(a, b GPU) int { return cmp.Compare(a.Index, b.Index) })
		views = append(views, NodeView{Name: n.Name, Leaf: p.Leaf, Spine: p.Spine, Profile: n.Labels[topology.LabelProfile], GPUs: gpus})
	}
	return views
}

// RenderTree draws spine → leaf → node → NVLink domains. Each GPU is a
// cell: ■ allocated, □ free, ✗ unhealthy; GPUs of one NVLink domain share
// brackets and aligned quads are separated by a space.
func RenderTree(w io.Writer, views []NodeView) error {
	total, free := 0, 0
	for _, v := range views {
		total += len(v.GPUs)
		free += v.Free()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "cluster: %d nodes, %d/%d GPUs free   (■ allocated  □ free  ✗ unhealthy  [..] NVLink domain)\n", len(views), free, total)

	spines := map[string]map[string][]NodeView{}
	for _, v := range views {
		s, l := orNone(v.Spine), orNone(v.Leaf)
		if spines[s] == nil {
			spines[s] = map[string][]NodeView{}
		}
		spines[s][l] = append(spines[s][l], v)
	}
	spineNames := sortedKeys(spines)
	for si, s := range spineNames {
		lastSpine := si == len(spineNames)-1
		fmt.Fprintf(&b, "%s %s\n", branch(lastSpine), s)
		leaves := sortedKeys(spines[s])
		for li, l := range leaves {
			lastLeaf := li == len(leaves)-1
			nodes := spines[s][l]
			lf, lt := 0, 0
			for _, n := range nodes {
				lf += n.Free()
				lt += len(n.GPUs)
			}
			fmt.Fprintf(&b, "%s%s %s  (%d/%d free)\n", indent(lastSpine), branch(lastLeaf), l, lf, lt)
			slices.SortFunc(nodes, func(a, c NodeView) int { return cmp.Compare(a.Name, c.Name) })
			for ni, n := range nodes {
				prefix := indent(lastSpine) + indent(lastLeaf) + branch(ni == len(nodes)-1)
				fmt.Fprintf(&b, "%s %-*s %-18s %d/%d free  %s\n", prefix, nameWidth(nodes), n.Name, n.Profile, n.Free(), len(n.GPUs), cells(n.GPUs))
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func cells(gpus []GPU) string {
	var b strings.Builder
	for i, g := range gpus {
		if i > 0 {
			prev := gpus[i-1]
			switch {
			case prev.Domain != g.Domain || g.Domain == "":
				if prev.Domain != "" {
					b.WriteString("]")
				}
				b.WriteString(" ")
			case prev.Block4 != g.Block4:
				b.WriteString(" ")
			}
		}
		if g.Domain != "" && (i == 0 || gpus[i-1].Domain != g.Domain) {
			b.WriteString("[")
		}
		switch {
		case g.Unhealthy:
			b.WriteString("✗")
		case g.Allocated:
			b.WriteString("■")
		default:
			b.WriteString("□")
		}
	}
	if len(gpus) > 0 && gpus[len(gpus)-1].Domain != "" {
		b.WriteString("]")
	}
	return b.String()
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

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
