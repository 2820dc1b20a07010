package topology

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/gputopo/gputopo/pkg/gpu"
)

// NetworkLabels says which node labels carry the network placement. For
// each tier the first label present on the node wins.
type NetworkLabels struct {
	Leaf   []string `json:"leaf"`
	Spine  []string `json:"spine"`
	Clique []string `json:"clique"`
	// TierPrefix labels tiers above the spine: <prefix>3, <prefix>4, ...
	TierPrefix string `json:"tierPrefix"`
}

// DefaultNetworkLabels reads topograph's labels first, then NVIDIA's.
func DefaultNetworkLabels() NetworkLabels {
	return NetworkLabels{
		Leaf:       []string{LabelTopographLeaf, LabelNVIDIALeaf},
		Spine:      []string{LabelTopographSpine, LabelNVIDIASpine},
		Clique:     []string{LabelNVIDIAClique},
		TierPrefix: LabelTopographTierPrefix,
	}
}

// Validate reports a mapping that could never match a label.
func (n NetworkLabels) Validate() error {
	for name, keys := range map[string][]string{"leaf": n.Leaf, "spine": n.Spine, "clique": n.Clique} {
		for _, k := range keys {
			if strings.TrimSpace(k) == "" {
				return fmt.Errorf("network label mapping for %s has an empty label key", name)
			}
		}
	}
	return nil
}

// NetworkPlacement is where a node sits in the network tree.
type NetworkPlacement struct {
	Leaf  string
	Spine string
	// Tiers holds tiers above the spine, keyed by tier number (3, 4, ...).
	Tiers map[int]string
	// Clique is a multi-node NVLink clique named by a node label; it
	// overrides what the GPUs report.
	Clique string
}

// Resolve reads a node's placement from its labels.
func (n NetworkLabels) Resolve(labels map[string]string) NetworkPlacement {
	first := func(keys []string) string {
		for _, k := range keys {
			if v := labels[k]; v != "" {
				return v
			}
		}
		return ""
	}
	p := NetworkPlacement{Leaf: first(n.Leaf), Spine: first(n.Spine), Clique: first(n.Clique)}
	if n.TierPrefix != "" {
		for k, v := range labels {
			rest, ok := strings.CutPrefix(k, n.TierPrefix)
			if !ok || v == "" {
				continue
			}
			if tier, err := strconv.Atoi(rest); err == nil && tier > 2 {
				if p.Tiers == nil {
					p.Tiers = map[int]string{}
				}
				p.Tiers[tier] = v
			}
		}
	}
	return p
}

// TierNumbers returns the placement's upper tiers in ascending order.
func (p NetworkPlacement) TierNumbers() []int {
	out := make([]int, 0, len(p.Tiers))
	for t := range p.Tiers {
		out = append(out, t)
	}
	sort.Ints(out)
	return out
}

// TierAttr names the attribute of tier t (t > 2).
func TierAttr(t int) string { return AttrTierPrefix + strconv.Itoa(t) }

// Clique is the multi-node NVLink clique of a GPU: the node label when set,
// else the GPU's fabric cluster and clique ID.
func Clique(net NetworkPlacement, f *gpu.Fabric) string {
	if net.Clique != "" {
		return net.Clique
	}
	if f == nil {
		return ""
	}
	return f.ClusterUUID + "." + strconv.FormatUint(uint64(f.CliqueID), 10)
}
