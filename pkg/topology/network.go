package topology

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gputopo/gputopo/pkg/gpu"
)

// LabelMapping says which node labels carry a node's place in the network.
// For each tier the first label present on the node wins. The kubelet
// plugin, the controller and the CLI all read it from the same ConfigMap
// (LabelMappingConfigMap), so they agree on where a node sits.
type LabelMapping struct {
	Leaf   []string `json:"leaf"`
	Spine  []string `json:"spine"`
	Core   []string `json:"core"`
	Clique []string `json:"clique"`
	// TierPrefix labels the tiers above the core: <prefix>N, N >= 3, is
	// published as tierN. Empty reads none.
	TierPrefix string `json:"tierPrefix"`
}

// firstDeepTier is the first tier number published as tierN: topograph's
// tier-0, tier-1 and tier-2 are the leaf, spine and core.
const firstDeepTier = 3

// DefaultLabelMapping reads topograph 1.0's labels first, then the labels
// topograph wrote before 1.0, then GPU feature discovery's clique label.
// A node labelled both ways takes topograph 1.0's value.
func DefaultLabelMapping() LabelMapping {
	return LabelMapping{
		Leaf:       []string{LabelTopographLeaf, LabelNVIDIALeaf},
		Spine:      []string{LabelTopographSpine, LabelNVIDIASpine},
		Core:       []string{LabelTopographCore, LabelNVIDIACore},
		Clique:     []string{LabelTopographDomain, LabelNVIDIAAccelerator, LabelNVIDIAClique},
		TierPrefix: LabelTopographTierPrefix,
	}
}

// ParseLabelMapping reads the data of the label mapping ConfigMap. A key
// left out keeps its default; a key set to "" reads no label.
func ParseLabelMapping(data map[string]string) (LabelMapping, error) {
	m := DefaultLabelMapping()
	lists := m.lists()
	var errs []string
	for _, k := range slices.Sorted(maps.Keys(data)) {
		v := data[k]
		if k == MappingKeyTierPrefix {
			m.TierPrefix = strings.TrimSpace(v)
			continue
		}
		list, ok := lists[k]
		if !ok {
			errs = append(errs, fmt.Sprintf("unknown key %q: want %s, %s, %s, %s or %s", k,
				MappingKeyLeaf, MappingKeySpine, MappingKeyCore, MappingKeyClique, MappingKeyTierPrefix))
			continue
		}
		*list = nil
		for _, label := range strings.Split(v, ",") {
			if label = strings.TrimSpace(label); label != "" {
				*list = append(*list, label)
			}
		}
	}
	if errs = append(errs, m.problems()...); len(errs) > 0 {
		return LabelMapping{}, fmt.Errorf("label mapping: %s", strings.Join(errs, "; "))
	}
	return m, nil
}

// Data is the mapping as the data of the label mapping ConfigMap.
func (m LabelMapping) Data() map[string]string {
	out := map[string]string{MappingKeyTierPrefix: m.TierPrefix}
	for k, list := range m.lists() {
		out[k] = strings.Join(*list, ",")
	}
	return out
}

func (m *LabelMapping) lists() map[string]*[]string {
	return map[string]*[]string{MappingKeyLeaf: &m.Leaf, MappingKeySpine: &m.Spine, MappingKeyCore: &m.Core, MappingKeyClique: &m.Clique}
}

// Validate reports label keys no node could carry.
func (m LabelMapping) Validate() error {
	if errs := m.problems(); len(errs) > 0 {
		return fmt.Errorf("label mapping: %s", strings.Join(errs, "; "))
	}
	return nil
}

func (m LabelMapping) problems() []string {
	var errs []string
	for _, k := range slices.Sorted(maps.Keys(m.lists())) {
		for _, label := range *m.lists()[k] {
			if bad := validation.IsQualifiedName(label); len(bad) > 0 {
				errs = append(errs, fmt.Sprintf("%s label %q is not a label key: %s", k, label, strings.Join(bad, ", ")))
			}
		}
	}
	if m.TierPrefix != "" {
		if bad := validation.IsQualifiedName(m.TierPrefix + strconv.Itoa(firstDeepTier)); len(bad) > 0 {
			errs = append(errs, fmt.Sprintf("%s %q does not make label keys: %s", MappingKeyTierPrefix, m.TierPrefix, strings.Join(bad, ", ")))
		}
	}
	return errs
}

// NetworkPlacement is where a node sits in the network tree.
type NetworkPlacement struct {
	Leaf  string
	Spine string
	Core  string
	// Tiers holds the tiers above the core, keyed by tier number (3, ...).
	Tiers map[int]string
	// Clique is a multi-node NVLink clique named by a node label; it
	// overrides what the GPUs report.
	Clique string
}

// Resolve reads a node's placement from its labels.
func (m LabelMapping) Resolve(labels map[string]string) NetworkPlacement {
	first := func(keys []string) string {
		for _, k := range keys {
			if v := labels[k]; v != "" {
				return v
			}
		}
		return ""
	}
	p := NetworkPlacement{Leaf: first(m.Leaf), Spine: first(m.Spine), Core: first(m.Core), Clique: first(m.Clique)}
	if m.TierPrefix != "" {
		for k, v := range labels {
			rest, ok := strings.CutPrefix(k, m.TierPrefix)
			if !ok || v == "" {
				continue
			}
			if tier, err := strconv.Atoi(rest); err == nil && tier >= firstDeepTier {
				if p.Tiers == nil {
					p.Tiers = map[int]string{}
				}
				p.Tiers[tier] = v
			}
		}
	}
	return p
}

// Equal reports whether two placements put a node in the same spot.
func (p NetworkPlacement) Equal(o NetworkPlacement) bool {
	return p.Leaf == o.Leaf && p.Spine == o.Spine && p.Core == o.Core && p.Clique == o.Clique && maps.Equal(p.Tiers, o.Tiers)
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

// TierAttr names the attribute of tier t (t >= 3).
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
