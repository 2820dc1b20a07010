package slicepack

import (
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func gpuSlice(name string) *resourceapi.ResourceSlice {
	dev := func(i int64) resourceapi.Device {
		return resourceapi.Device{
			Name: "gpu-" + string(rune('0'+i)),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"index": {IntValue: ptr.To(i)}, "healthy": {BoolValue: ptr.To(true)},
				"model": {StringValue: ptr.To("H100")}, "driverVersion": {VersionValue: ptr.To("550.54.15")},
				"peers": {IntValues: []int64{1, 2}}, "blocks": {StringValues: []string{"a", "b"}},
				"flags": {BoolValues: []bool{true, false}}, "versions": {VersionValues: []string{"1.0.0"}},
				"min": {IntValue: ptr.To(int64(math.MinInt64))}, "max": {IntValue: ptr.To(int64(math.MaxInt64))},
				"negative": {IntValues: []int64{-1, -300, math.MinInt64}}, "off": {BoolValue: ptr.To(false)},
				"noInts": {IntValues: []int64{}}, "noStrings": {StringValues: []string{}},
				"nothing": {}, "": {StringValue: ptr.To("")},
				"everything": {IntValue: ptr.To(-i), BoolValue: ptr.To(true), StringValue: ptr.To("s"), VersionValue: ptr.To("1.2.3"),
					IntValues: []int64{i}, BoolValues: []bool{}, StringValues: []string{"x", ""}, VersionValues: []string{"2.0.0"}},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("80Gi")}},
			Taints:   []resourceapi.DeviceTaint{{Key: "k", Effect: resourceapi.DeviceTaintEffectNoSchedule}},
		}
	}
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{"other": "kept"}},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: "gpu.example.com", Pool: resourceapi.ResourcePool{Name: name, Generation: 1, ResourceSliceCount: 1},
			NodeName: ptr.To(name),
			// A device without attributes sits between two with.
			Devices: []resourceapi.Device{dev(0), {Name: "bare"}, dev(1)},
		},
	}
}

// A packed slice holds no attribute map, keeps every other field, and
// unpacks to the slice it was; unpacking leaves the packed one as it is.
func TestPackUnpackRoundTrip(t *testing.T) {
	orig := gpuSlice("node-a")
	s := orig.DeepCopy()
	if err := Pack(s); err != nil {
		t.Fatal(err)
	}
	if !Packed(s) {
		t.Fatal("a slice with attributes is not packed")
	}
	for _, d := range s.Spec.Devices {
		if d.Attributes != nil {
			t.Errorf("device %s keeps its attribute map after Pack", d.Name)
		}
	}
	if s.Annotations["other"] != "kept" {
		t.Errorf("Pack lost the slice's own annotation: %v", s.Annotations)
	}
	packedCopy := s.DeepCopy()
	// Informer transforms run twice on listed objects: packing again
	// changes nothing.
	if err := Pack(s); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(packedCopy, s); diff != "" {
		t.Errorf("packing a packed slice changed it (-once +twice):\n%s", diff)
	}
	u, err := Unpack(s)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(orig, u); diff != "" {
		t.Errorf("unpacked slice differs from the original (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(packedCopy, s); diff != "" {
		t.Errorf("Unpack changed the packed slice (-before +after):\n%s", diff)
	}
}

// Only what Pack wrote is unpacked: an annotation a slice arrives with
// is dropped, a slice without attributes is left as it is, and a packed
// form that does not match the slice is an error, not a guess.
func TestPackRejectsWhatItDidNotWrite(t *testing.T) {
	s := gpuSlice("node-a")
	for i := range s.Spec.Devices {
		s.Spec.Devices[i].Attributes = nil
	}
	s.Annotations[Annotation] = "forged"
	if err := Pack(s); err != nil {
		t.Fatal(err)
	}
	if Packed(s) {
		t.Error("a slice without attributes kept the annotation it arrived with")
	}
	if u, err := Unpack(s); err != nil || u != s {
		t.Errorf("Unpack of a slice that is not packed: %p, %v; want the slice itself", u, err)
	}

	foreign := gpuSlice("node-f")
	foreign.Annotations[Annotation] = "gputopo-packed:guess:\x0a\x00"
	if Packed(foreign) {
		t.Error("a value Pack did not write counts as packed")
	}
	if u, err := Unpack(foreign); err != nil || u != foreign {
		t.Errorf("Unpack of a slice with a foreign value: %p, %v; want the slice itself", u, err)
	}

	bad := gpuSlice("node-b")
	bad.Annotations[Annotation] = mark + "\xff\xff not a packed form"
	if _, err := Unpack(bad); err == nil || !strings.Contains(err.Error(), "node-b") {
		t.Errorf("Unpack of a corrupt form: %v; want an error naming the slice", err)
	}
	short := gpuSlice("node-c")
	if err := Pack(short); err != nil {
		t.Fatal(err)
	}
	short.Spec.Devices = short.Spec.Devices[:2]
	if _, err := Unpack(short); err == nil || !strings.Contains(err.Error(), "3 devices packed") {
		t.Errorf("Unpack with a device missing: %v; want an error counting the devices", err)
	}
	renamed := gpuSlice("node-d")
	if err := Pack(renamed); err != nil {
		t.Fatal(err)
	}
	renamed.Spec.Devices[0].Name = "other"
	if _, err := Unpack(renamed); err == nil || !strings.Contains(err.Error(), "packed as gpu-0") {
		t.Errorf("Unpack with a device renamed: %v; want an error naming both", err)
	}
}

// The cache unpacks a slice once while it is kept, tells slices apart
// by address, and forgets the oldest past its size.
func TestCacheUnpacksOnce(t *testing.T) {
	c := NewCache(2)
	packed := func(name string) *resourceapi.ResourceSlice {
		s := gpuSlice(name)
		if err := Pack(s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b, plain := packed("a"), packed("b"), gpuSlice("plain")
	all, err := c.UnpackAll([]*resourceapi.ResourceSlice{plain, a, b})
	if err != nil {
		t.Fatal(err)
	}
	if all[0] != plain || all[1] == a || all[2] == b || all[1].Spec.Devices[0].Attributes == nil {
		t.Fatalf("UnpackAll: want the plain slice itself and the packed ones unpacked, got %v", all)
	}
	again, _ := c.Unpack(a)
	if again != all[1] {
		t.Error("a slice the cache holds was unpacked again")
	}
	if _, err := c.Unpack(packed("c")); err != nil { // evicts b, the least recent
		t.Fatal(err)
	}
	if bb, _ := c.Unpack(b); bb == all[2] {
		t.Error("the cache kept more slices than its size")
	}
	none := []*resourceapi.ResourceSlice{plain}
	if out, _ := c.UnpackAll(none); &out[0] != &none[0] {
		t.Error("UnpackAll copied a list with nothing packed")
	}
}

// A nil cache unpacks every time and keeps nothing.
func TestNilCacheKeepsNothing(t *testing.T) {
	var c *Cache
	s := gpuSlice("a")
	if err := Pack(s); err != nil {
		t.Fatal(err)
	}
	one, err := c.Unpack(s)
	if err != nil {
		t.Fatal(err)
	}
	two, _ := c.Unpack(s)
	if one == two || one.Spec.Devices[0].Attributes == nil {
		t.Error("a nil cache kept an unpacked slice, or did not unpack")
	}
}

// The packed form writes each of DeviceAttribute's value fields; a field
// added to the API must be added to it too.
func TestEveryAttributeFieldIsPacked(t *testing.T) {
	known := []string{"IntValue", "BoolValue", "StringValue", "VersionValue", "IntValues", "BoolValues", "StringValues", "VersionValues"}
	typ := reflect.TypeOf(resourceapi.DeviceAttribute{})
	var fields []string
	for i := range typ.NumField() {
		fields = append(fields, typ.Field(i).Name)
	}
	if diff := cmp.Diff(known, fields); diff != "" {
		t.Errorf("resourceapi.DeviceAttribute's fields changed; teach codec.go the new ones (-packed +API):\n%s", diff)
	}
}

// A packed form cut short anywhere, or with a byte changed, is an error
// or some attributes, never a panic or a huge allocation.
func TestDamagedFormNeverPanics(t *testing.T) {
	s := gpuSlice("node-a")
	if err := Pack(s); err != nil {
		t.Fatal(err)
	}
	form := s.Annotations[Annotation]
	for cut := len(mark); cut < len(form); cut++ {
		d := s.DeepCopy()
		d.Annotations[Annotation] = form[:cut]
		if _, err := Unpack(d); err == nil {
			t.Errorf("a form cut at byte %d of %d unpacked without error", cut, len(form))
		}
		flipped := []byte(form)
		flipped[cut] ^= 0xff
		d.Annotations[Annotation] = string(flipped)
		_, _ = Unpack(d)
	}
}
