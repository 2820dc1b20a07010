package simulate

import (
	"fmt"
	"strconv"
	"strings"
)

// Tier is how far apart the pods of a job run: the highest level of the
// network they span.
type Tier int

// Tiers, nearest first.
const (
	TierNode  Tier = iota // every pod on one node
	TierLeaf              // under one leaf switch
	TierSpine             // under one spine
	TierCross             // across spines (or where the cluster says nothing)
)

var tierNames = [...]string{"node", "leaf", "spine", "cross"}

func (t Tier) String() string { return tierNames[t] }

// Locality is the locality model of timed replays: a job runs for its
// trace duration times the factor of the highest tier its pods span.
// The trace's duration is the run time with every pod on one node.
type Locality [4]float64

// DefaultLocality is the model's default (docs/benchmarks.md says where
// the numbers come from): a job within one leaf runs as on one node (a
// rail-optimised, non-blocking leaf gives every GPU its NIC's bandwidth,
// and jobs bigger than a node pay that in every placement), one spread
// over the leaves of a spine 10 % longer, one across spines 30 % longer.
func DefaultLocality() Locality { return Locality{1, 1, 1.1, 1.3} }

// NoLocality stretches nothing.
func NoLocality() Locality { return Locality{1, 1, 1, 1} }

// String is the model as ParseLocality reads it.
func (l Locality) String() string {
	parts := make([]string, len(l))
	for t, f := range l {
		parts[t] = fmt.Sprintf("%s=%s", Tier(t), strconv.FormatFloat(f, 'g', -1, 64))
	}
	return strings.Join(parts, ",")
}

// ParseLocality reads a locality model: "none" (every factor 1), or
// tier=factor pairs separated by commas (node, leaf, spine, cross), tiers
// not named keeping DefaultLocality's factors. Factors are at least 1 and
// do not fall from a tier to a wider one.
func ParseLocality(s string) (Locality, error) {
	s = strings.TrimSpace(s)
	if s == "none" {
		return NoLocality(), nil
	}
	l := DefaultLocality()
	if s == "" || s == "default" {
		return l, nil
	}
	for _, kv := range strings.Split(s, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		t := -1
		for i, n := range tierNames {
			if strings.TrimSpace(name) == n {
				t = i
			}
		}
		if !ok || t < 0 {
			return Locality{}, fmt.Errorf("locality %q: want tier=factor pairs, tiers node, leaf, spine and cross (or none)", kv)
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil || f < 1 || f > 100 {
			return Locality{}, fmt.Errorf("locality %q: the factor must be a number from 1 to 100", kv)
		}
		l[t] = f
	}
	for t := TierLeaf; t <= TierCross; t++ {
		if l[t] < l[t-1] {
			return Locality{}, fmt.Errorf("locality %s: the %s factor %v is below the %s factor %v: a wider tier is never faster", l, t, l[t], t-1, l[t-1])
		}
	}
	return l, nil
}

// tier is the highest tier the nodes span.
func (c *Cluster) tier(nodes []int) Tier {
	t := TierNode
	for _, n := range nodes[1:] {
		a, b := &c.Nodes[nodes[0]], &c.Nodes[n]
		switch {
		case a.Name == b.Name:
		case a.Leaf != "" && a.Leaf == b.Leaf:
			t = max(t, TierLeaf)
		case a.Spine != "" && a.Spine == b.Spine:
			t = max(t, TierSpine)
		default:
			return TierCross
		}
	}
	return t
}

// tierLimits is what the nearest tier of a job depends on: the most
// milli-GPUs a node has, and the most nodes a leaf and a spine have.
type tierLimits struct{ nodeMilli, leafNodes, spineNodes int }

func (c *Cluster) tierLimits() tierLimits {
	tl := tierLimits{leafNodes: c.NodesPerLeaf}
	spine := map[string]int{}
	for _, n := range c.Nodes {
		tl.nodeMilli = max(tl.nodeMilli, 1000*n.GPUs)
		if n.Spine != "" {
			spine[n.Spine]++
			tl.spineNodes = max(tl.spineNodes, spine[n.Spine])
		}
	}
	return tl
}

// nearest is the nearest tier job j can run in on an empty cluster of
// these limits: its pods packed onto as few nodes as the largest node
// holds, and those nodes in the largest leaf or spine. It asks no more of
// the cluster than any placement does (CPU, memory and GPU models
// aside), so no scheduler places j in a nearer tier.
func (tl tierLimits) nearest(j Job) Tier {
	if j.Pods <= 1 {
		return TierNode
	}
	perNode := j.Pods
	if j.MilliGPU > 0 {
		perNode = tl.nodeMilli / j.MilliGPU
	}
	if perNode == 0 {
		return TierCross // fits no node
	}
	switch nodes := (j.Pods + perNode - 1) / perNode; {
	case nodes == 1:
		return TierNode
	case nodes <= tl.leafNodes:
		return TierLeaf
	case nodes <= tl.spineNodes:
		return TierSpine
	}
	return TierCross
}

// of is the factor of tier t; a zero model stretches nothing.
func (l Locality) of(t Tier) float64 {
	if l[0] == 0 {
		return 1
	}
	return l[t]
}
