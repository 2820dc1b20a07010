package slicepack

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/slices"
	"github.com/gputopo/gputopo/pkg/topology"
)

// dgxSlice is the ResourceSlice a simulated dgx-h100 node publishes.
func dgxSlice(b *testing.B) *resourceapi.ResourceSlice {
	p, err := sim.LoadBuiltin("dgx-h100")
	if err != nil {
		b.Fatal(err)
	}
	labels := map[string]string{topology.LabelTopographLeaf: "leaf-0", topology.LabelTopographSpine: "spine-0"}
	res, err := slices.Build(p.Inventory("n0"), slices.Node{Name: "n0", Labels: labels}, slices.DefaultConfig(), nil)
	if err != nil {
		b.Fatal(err)
	}
	return slices.Objects("n0", res)[0]
}

// BenchmarkUnpackDGXH100 is what a plan pays for a node whose unpacked
// slice is not cached: one eight-GPU slice unpacked.
func BenchmarkUnpackDGXH100(b *testing.B) {
	s := dgxSlice(b)
	if err := Pack(s); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Unpack(s); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPackDGXH100 is what the cache transform pays per slice.
func BenchmarkPackDGXH100(b *testing.B) {
	orig := dgxSlice(b)
	b.ReportAllocs()
	for b.Loop() {
		s := *orig
		s.Spec.Devices = append([]resourceapi.Device(nil), orig.Spec.Devices...)
		if err := Pack(&s); err != nil {
			b.Fatal(err)
		}
	}
}
