package controller

import (
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/slicepack"
)

// decodeSlices returns slices as the informer receives them from the API
// server: one list, decoded from JSON, each item an object of its own.
func decodeSlices(tb testing.TB, slices []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	tb.Helper()
	list := &resourceapi.ResourceSliceList{}
	for _, s := range slices {
		list.Items = append(list.Items, *s)
	}
	data, err := k8sruntime.Encode(scheme.Codecs.LegacyCodec(resourceapi.SchemeGroupVersion), list)
	if err != nil {
		tb.Fatal(err)
	}
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	items := obj.(*resourceapi.ResourceSliceList).Items
	out := make([]*resourceapi.ResourceSlice, len(items))
	for i := range items {
		out[i] = new(resourceapi.ResourceSlice)
		*out[i] = items[i]
	}
	return out
}

// richSlice uses every field of a slice the compaction rewrites.
func richSlice() *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "rich", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: "gpu.example.com", Pool: resourceapi.ResourcePool{Name: "pool", Generation: 2, ResourceSliceCount: 1},
			NodeName: ptr.To("node-a"),
			SharedCounters: []resourceapi.CounterSet{{Name: "mem", Counters: map[string]resourceapi.Counter{
				"memory": {Value: resource.MustParse("80Gi")}}}},
			Devices: []resourceapi.Device{{
				Name: "gpu-0",
				Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
					"index": {IntValue: ptr.To[int64](0)}, "healthy": {BoolValue: ptr.To(true)},
					"model": {StringValue: ptr.To("H100")}, "driverVersion": {VersionValue: ptr.To("550.54.15")},
					"links": {IntValues: []int64{1, 2}}, "names": {StringValues: []string{"a", "b"}},
				},
				Capacity:         map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("80Gi")}},
				ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: "mem", Counters: map[string]resourceapi.Counter{"memory": {Value: resource.MustParse("40Gi")}}}},
				Taints:           []resourceapi.DeviceTaint{{Key: "unhealthy", Effect: resourceapi.DeviceTaintEffectNoSchedule}},
			}, {
				Name: "gpu-1",
				Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
					"index": {IntValue: ptr.To[int64](1)}, "healthy": {BoolValue: ptr.To(true)},
					"model": {StringValue: ptr.To("H100")}, "driverVersion": {VersionValue: ptr.To("550.54.15")},
				},
				AllowMultipleAllocations: ptr.To(true),
			}},
		},
	}
}

// What the allocator, the tracker and the taint logic read of a slice
// is all still there after the cache transform, equal to what the API
// server sent; only the managed fields are gone. A node-local slice holds
// its devices' attributes packed, and unpacks to what was sent; one
// local to no node keeps them in place, and the names and values the
// devices of different slices have in common are one copy.
func TestCacheTransformKeepsEverySliceField(t *testing.T) {
	var in []*resourceapi.ResourceSlice
	for _, o := range append(testObjects(t), richSlice()) {
		if s, ok := o.(*resourceapi.ResourceSlice); ok {
			in = append(in, s)
		}
	}
	// Two slices local to no node, and a third that arrives with the
	// annotation packed attributes are kept in, which must not be read.
	for i, name := range []string{"shared-a", "shared-b"} {
		s := in[i].DeepCopy()
		s.Name, s.Spec.NodeName, s.Spec.AllNodes, s.Spec.Pool.Name = name, nil, ptr.To(true), name
		in = append(in, s)
	}
	forged := in[0].DeepCopy()
	forged.Name, forged.Annotations = "forged", map[string]string{slicepack.Annotation: "not protobuf", "keep": "me"}
	forged.Spec.NodeName, forged.Spec.AllNodes, forged.Spec.Pool.Name = nil, ptr.To(true), "forged"
	in = append(in, forged)
	want, got := decodeSlices(t, in), decodeSlices(t, in)
	transform := cacheTransform(newInterner(internerLimit))
	var packed int
	for i := range got {
		// Twice, as client-go's streaming list does to every object it
		// lists: the transform must be idempotent.
		for range 2 {
			if _, err := transform(got[i]); err != nil {
				t.Fatal(err)
			}
		}
		want[i].ManagedFields = nil
		if want[i].Name == "forged" {
			want[i].Annotations = map[string]string{"keep": "me"}
		}
		_, local := planner.NodeLocal(got[i])
		if slicepack.Packed(got[i]) != local {
			t.Errorf("slice %s: packed %t, node-local %t: want node-local slices packed, no other", got[i].Name, slicepack.Packed(got[i]), local)
		}
		if local {
			packed++
			for _, d := range got[i].Spec.Devices {
				if d.Attributes != nil {
					t.Errorf("slice %s device %s: the cache holds its attribute map beside the packed one", got[i].Name, d.Name)
				}
			}
		}
		u, err := slicepack.Unpack(got[i])
		if err != nil {
			t.Fatal(err)
		}
		got[i] = u
	}
	if packed < 3 {
		t.Fatalf("%d slices packed, want the node-local ones (at least 3)", packed)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the cached slices differ from the API server's (-want +got):\n%s", diff)
	}
	// The two slices local to no node: their first GPUs' every
	// attribute name, and the values they share, at one address.
	a, b := got[len(got)-3].Spec.Devices[0], got[len(got)-2].Spec.Devices[0]
	if len(a.Attributes) == 0 {
		t.Fatal("the slices local to no node have no attributes to compare")
	}
	for k, va := range a.Attributes {
		vb, ok := b.Attributes[k]
		if !ok {
			continue
		}
		for kb := range b.Attributes {
			if kb == k && unsafe.StringData(string(kb)) != unsafe.StringData(string(k)) {
				t.Errorf("attribute name %s is stored twice", k)
			}
		}
		switch {
		case va.StringValue != nil && *va.StringValue == *vb.StringValue && va.StringValue != vb.StringValue:
			t.Errorf("attribute %s: value %q is stored twice", k, *va.StringValue)
		case va.IntValue != nil && *va.IntValue == *vb.IntValue && va.IntValue != vb.IntValue:
			t.Errorf("attribute %s: value %d is stored twice", k, *va.IntValue)
		}
	}
}

// The interner forgets in generations: it holds at most two
// generations' values however many distinct ones it saw, and a value it
// still holds keeps its one copy.
func TestInternerStaysBounded(t *testing.T) {
	in := newInterner(4)
	hopper := in.str("hopper")
	if again := in.str(string([]byte("hopper"))); again != hopper {
		t.Fatal("a value seen in this generation got a second copy")
	}
	for i := range 100 {
		in.str(fmt.Sprint(i))
		in.int(int64(i))
		if n := len(in.strs) + len(in.prevStrs); n > 2*4 {
			t.Fatalf("after %d values the interner holds %d strings; want at most %d", i+1, n, 2*4)
		}
		if n := len(in.ints) + len(in.prevInts); n > 2*4+1 {
			t.Fatalf("after %d values the interner holds %d integers; want at most %d", i+1, n, 2*4+1)
		}
	}
	if in.rotations == 0 {
		t.Fatal("the interner never forgot a generation")
	}
}

// A cached pod keeps everything a plan reads: the requests as
// kube-scheduler counts them (a resized container's status included),
// its group, gates, claims and scheduling constraints.
func TestCacheTransformKeepsWhatPlansReadOfPods(t *testing.T) {
	req := v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("4"), v1.ResourceMemory: resource.MustParse("8Gi")}}
	pod := jobPod("j", 0, "gpu-1", nil)
	pod.Spec.NodeSelector = map[string]string{"zone": "a"}
	pod.Spec.Tolerations = []v1.Toleration{{Key: "gpu", Operator: v1.TolerationOpExists}}
	pod.Spec.Overhead = v1.ResourceList{v1.ResourceCPU: resource.MustParse("100m")}
	pod.Spec.Containers = []v1.Container{{Name: "c", Image: "img", Resources: req,
		Command: []string{"train"}, Env: []v1.EnvVar{{Name: "A", Value: "b"}}, VolumeMounts: []v1.VolumeMount{{Name: "v", MountPath: "/v"}},
		LivenessProbe: &v1.Probe{}}}
	pod.Spec.InitContainers = []v1.Container{{Name: "sidecar", RestartPolicy: ptr.To(v1.ContainerRestartPolicyAlways), Resources: req, Args: []string{"x"}}}
	pod.Spec.Volumes = []v1.Volume{{Name: "v", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}}, pvcVolume("data"),
		{Name: "scratch", VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{VolumeClaimTemplate: &v1.PersistentVolumeClaimTemplate{}}}}}
	pod.Status.ContainerStatuses = []v1.ContainerStatus{{Name: "c", Image: "img", ImageID: "sha", RestartCount: 3,
		State:     v1.ContainerState{Running: &v1.ContainerStateRunning{}},
		Resources: &v1.ResourceRequirements{Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("6")}}}}
	pod.Status.Conditions = []v1.PodCondition{{Type: v1.PodScheduled, Status: v1.ConditionTrue}}
	cached := pod.DeepCopy()
	if _, err := cacheTransform(newInterner(internerLimit))(cached); err != nil {
		t.Fatal(err)
	}
	usage := func(p *v1.Pod) planner.NodeUsage {
		u := planner.NodeUsage{}
		u.Add("n", p)
		return u
	}
	if diff := cmp.Diff(usage(pod), usage(cached)); diff != "" {
		t.Errorf("the cached pod requests differ (-want +got):\n%s", diff)
	}
	kept := func(p *v1.Pod) any {
		key, _ := groupKey(p)
		return []any{key, p.Annotations, p.OwnerReferences, p.Spec.SchedulingGates, p.Spec.ResourceClaims, p.Spec.NodeSelector,
			p.Spec.Affinity, p.Spec.Tolerations, p.Spec.NodeName, p.Status.Conditions, p.Status.Phase, p.Status.ResourceClaimStatuses}
	}
	if diff := cmp.Diff(kept(pod), kept(cached)); diff != "" {
		t.Errorf("the cached pod lost what plans read (-want +got):\n%s", diff)
	}
	// The claims its volumes name, which hold it to nodes.
	if got, _ := indexByPVC(cached); !slices.Equal(got, []string{"default/data", "default/" + pod.Name + "-scratch"}) {
		t.Errorf("the cached pod's volumes name claims %v, want data and its ephemeral volume's", got)
	}
	if c := cached.Spec.Containers[0]; c.Command != nil || c.Env != nil || c.VolumeMounts != nil || c.LivenessProbe != nil || len(cached.Spec.Volumes) != 2 || cached.Spec.Volumes[1].Ephemeral.VolumeClaimTemplate != nil ||
		cached.Status.ContainerStatuses[0].State.Running != nil {
		t.Errorf("the cached pod still holds what nothing reads: %+v", cached)
	}
}

// A cached node keeps what the planner and the recovery read; a cached
// Job keeps its size.
func TestCacheTransformKeepsWhatPlansReadOfNodesAndJobs(t *testing.T) {
	node := fakeNode("n", "leaf-0", "spine-0")
	node.Spec.Taints = []v1.Taint{{Key: "k", Effect: v1.TaintEffectNoSchedule}}
	node.Status.Allocatable = v1.ResourceList{v1.ResourceCPU: resource.MustParse("64")}
	node.Status.Images = []v1.ContainerImage{{Names: []string{"registry/image:tag"}, SizeBytes: 1 << 30}}
	cached := node.DeepCopy()
	transform := cacheTransform(newInterner(internerLimit))
	if _, err := transform(cached); err != nil {
		t.Fatal(err)
	}
	node.Status.Images = nil
	if diff := cmp.Diff(node, cached); diff != "" {
		t.Errorf("the cached node differs beyond its images (-want +got):\n%s", diff)
	}
	j := job("j", 4)
	j.Spec.Template.Spec.Containers = []v1.Container{{Name: "c", Image: "img"}}
	cachedJob := j.DeepCopy()
	if _, err := transform(cachedJob); err != nil {
		t.Fatal(err)
	}
	if got, want := jobSize(cachedJob), jobSize(j); got != want || cachedJob.Name != j.Name || cachedJob.UID != j.UID {
		t.Errorf("cached Job: size %d, %s/%s; want %d, %s/%s", got, cachedJob.Name, cachedJob.UID, want, j.Name, j.UID)
	}
}

// cachedSliceHeap returns the live heap per device that nodes' slices
// take in the controller's cache, decoded as the API server sends them
// and passed through transform.
func cachedSliceHeap(tb testing.TB, nodes int, transform func(any) (any, error)) float64 {
	tb.Helper()
	var in []*resourceapi.ResourceSlice
	devices := 0
	for _, o := range extraNodes(testObjects(tb), nodes, 10, 10, nil) {
		if s, ok := o.(*resourceapi.ResourceSlice); ok {
			in = append(in, s)
			devices += len(s.Spec.Devices)
		}
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	cached := decodeSlices(tb, in)
	for _, s := range cached {
		if _, err := transform(s); err != nil {
			tb.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(cached)
	runtime.KeepAlive(in)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(devices)
}

// The cache holds a device in a fraction of the memory of the API
// server's objects decoded as they come: a node-local slice's attributes
// are packed (a map of 20 attributes is about 5 KB decoded, a few hundred
// bytes packed), and the names and values devices share are shared.
func TestCachedSliceHeapPerDevice(t *testing.T) {
	// What other goroutines allocate meanwhile only adds to a
	// measurement: the smaller of two is the closer.
	least := func(transform func(any) (any, error)) float64 {
		return min(cachedSliceHeap(t, 500, transform), cachedSliceHeap(t, 500, transform))
	}
	plain := least(dropManagedFields)
	compact := least(cacheTransform(newInterner(internerLimit)))
	t.Logf("live heap per cached device: %.0f B as decoded, %.0f B in the cache", plain, compact)
	// About 13 % with the attributes packed (docs/benchmarks.md); 61–92 %
	// with only names, values and capacities shared, 1.0 when nothing is.
	if compact > 0.30*plain {
		t.Errorf("a cached device takes %.0f B, as decoded %.0f B: want at most 30 %%", compact, plain)
	}
}

// Devices that publish equal capacities share one map; a device whose
// capacity differs keeps its own, equal to what it published.
func TestInternerSharesCapacityMaps(t *testing.T) {
	capacity := func(mem string, milli bool) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
		m := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse(mem)}}
		if milli {
			m["milliGPU"] = resourceapi.DeviceCapacity{Value: resource.MustParse("1000"), RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: ptr.To(resource.MustParse("1000"))}}
		}
		return m
	}
	in := newInterner(internerLimit)
	devs := []resourceapi.Device{
		{Name: "a", Capacity: capacity("80Gi", false)},
		{Name: "b", Capacity: capacity("80Gi", false)},
		{Name: "c", Capacity: capacity("80Gi", true)},
		{Name: "d", Capacity: capacity("80Gi", true)},
		{Name: "e", Capacity: capacity("40Gi", false)},
	}
	want := make([]map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, len(devs))
	for i := range devs {
		want[i] = capacity(map[bool]string{true: "40Gi", false: "80Gi"}[i == 4], i == 2 || i == 3)
		in.device(&devs[i])
	}
	same := func(i, j int) bool {
		return reflect.ValueOf(devs[i].Capacity).UnsafePointer() == reflect.ValueOf(devs[j].Capacity).UnsafePointer()
	}
	if !same(0, 1) || !same(2, 3) {
		t.Error("devices with equal capacities keep maps of their own")
	}
	if same(0, 2) || same(0, 4) {
		t.Error("devices with different capacities share a map")
	}
	for i := range devs {
		if diff := cmp.Diff(want[i], devs[i].Capacity); diff != "" {
			t.Errorf("device %s: capacity changed (-want +got):\n%s", devs[i].Name, diff)
		}
	}
}

// BenchmarkCachedSliceHeap reports the live heap per device of the
// slices in the controller's cache (heap-B/device).
func BenchmarkCachedSliceHeap(b *testing.B) {
	transform := cacheTransform(newInterner(internerLimit))
	for b.Loop() {
		b.ReportMetric(cachedSliceHeap(b, 1000, transform), "heap-B/device")
	}
}
