package slices

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/topology"
)

// Sharing says which GPUs of a node are published for sharing. A shared
// GPU serves only shares (claims drawing capacity from it); the others
// are handed out whole. The zero value shares none.
type Sharing struct {
	All     bool
	Indexes []int // sorted, without duplicates; unused when All
}

// ParseSharing reads "none" (or ""), "all" or GPU indexes separated by
// commas or underscores ("0,1,4" or "0_1_4"; a label value cannot hold a
// comma, so the node label takes the second form).
func ParseSharing(v string) (Sharing, error) {
	switch v = strings.TrimSpace(v); v {
	case "", "none":
		return Sharing{}, nil
	case "all":
		return Sharing{All: true}, nil
	}
	var s Sharing
	for _, f := range strings.Split(strings.ReplaceAll(v, "_", ","), ",") {
		i, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || i < 0 {
			return Sharing{}, fmt.Errorf("shared GPUs %q: %q is not a GPU index; use all, none or indexes like 0,1,4 (0_1_4 in a node label)", v, f)
		}
		if !slices.Contains(s.Indexes, i) {
			s.Indexes = append(s.Indexes, i)
		}
	}
	slices.Sort(s.Indexes)
	return s, nil
}

// String is the form ParseSharing reads.
func (s Sharing) String() string {
	if s.All {
		return "all"
	}
	if len(s.Indexes) == 0 {
		return "none"
	}
	parts := make([]string, len(s.Indexes))
	for i, x := range s.Indexes {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, ",")
}

// Shares says whether GPU index is shared.
func (s Sharing) Shares(index int) bool {
	return s.All || slices.Contains(s.Indexes, index)
}

// ForNode is the sharing of a node: its LabelSharedGPUs label when it has
// one, else s. A malformed label is an error, so a typo never silently
// turns sharing off.
func (s Sharing) ForNode(labels map[string]string) (Sharing, error) {
	v, ok := labels[topology.LabelSharedGPUs]
	if !ok {
		return s, nil
	}
	out, err := ParseSharing(v)
	if err != nil {
		return Sharing{}, fmt.Errorf("node label %s: %w", topology.LabelSharedGPUs, err)
	}
	return out, nil
}

// share turns a GPU's device into a shared one: allowMultipleAllocations,
// with its memory and its compute (milliGPU) as consumable capacity.
// Request policies keep shares sensible: compute in whole percents from
// 1 %, all of it for a claim that does not ask; memory in 256 MiB steps,
// none for a claim that does not ask.
func share(dev *resourceapi.Device, memoryBytes int64) {
	dev.AllowMultipleAllocations = ptr.To(true)
	dev.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		topology.CapacityMemory: {
			Value: *resource.NewQuantity(memoryBytes, resource.BinarySI),
			RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default:    resource.NewQuantity(0, resource.BinarySI),
				ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: resource.NewQuantity(0, resource.BinarySI), Step: resource.NewQuantity(topology.ShareMemoryStep, resource.BinarySI)},
			},
		},
		topology.CapacityMilliGPU: {
			Value: *resource.NewQuantity(topology.MilliPerGPU, resource.DecimalSI),
			RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default: resource.NewQuantity(topology.MilliPerGPU, resource.DecimalSI),
				ValidRange: &resourceapi.CapacityRequestPolicyRange{
					Min:  resource.NewQuantity(topology.ShareMinMilliGPU, resource.DecimalSI),
					Max:  resource.NewQuantity(topology.MilliPerGPU, resource.DecimalSI),
					Step: resource.NewQuantity(topology.ShareStepMilliGPU, resource.DecimalSI),
				},
			},
		},
	}
}
