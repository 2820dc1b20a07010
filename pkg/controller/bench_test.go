package controller

import (
	"context"
	"fmt"
	goruntime "runtime"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
)

// BenchmarkPlan16PodJob5000Nodes is what plan_duration_seconds{pods="9-16"}
// records for a 16-pod Job of whole nodes on the scale benchmark's
// cluster: 5,000 nodes (10 spines × 50 leaves × 10 nodes, 40,000 GPUs)
// after the tree was built, with 55 % of the GPUs held by 3,000 claims
// whose pods take cpu on their nodes. One plan is the sync's share of it:
// reading the group and its claims, the snapshot of what the claims and
// pods hold, and the plan.
func BenchmarkPlan16PodJob5000Nodes(b *testing.B) {
	benchmarkPlan(b, 16, "gpu-8-node")
}

// BenchmarkPlan2PodJob5000Nodes is the same for plan_duration_seconds{pods="2-4"}:
// a Job of two whole nodes, the burst's most common multi-node shape.
func BenchmarkPlan2PodJob5000Nodes(b *testing.B) {
	benchmarkPlan(b, 2, "gpu-8-node")
}

// BenchmarkPlan1PodJob5000Nodes is the same for plan_duration_seconds{pods="1"}:
// a one-pod Job of one GPU, which the planner places on the node that
// fragments the cluster least.
func BenchmarkPlan1PodJob5000Nodes(b *testing.B) {
	benchmarkPlan(b, 1, "gpu-1")
}

func benchmarkPlan(b *testing.B, pods int, template string) {
	h := busyHarness(b, 10, 50, 10)
	h.create(job("j", int32(pods)))
	for i := range pods {
		h.addPod(jobPod("j", i, template, nil))
	}
	h.settle()
	if _, err := h.c.snapshotCluster(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		g, err := h.c.loadGroup("default/job/j")
		if err != nil {
			b.Fatal(err)
		}
		if len(g.toPlace) != pods {
			b.Fatalf("%d pods to place; want %d", len(g.toPlace), pods)
		}
		req, err := placement.Parse(g.anyPod().Annotations)
		if err != nil {
			b.Fatal(err)
		}
		if _, _, err := h.c.planGroup(h.ctx, g, req); err != nil {
			b.Fatal(err)
		}
	}
}

// busyHarness runs the controller's informers on spines × leaves × nodes
// fake nodes of 8 GPUs that offer 64 cpus each, with half of the nodes'
// GPUs held whole and a tenth of the nodes half used, as the claim and
// pod events of a busy cluster would have recorded them.
func busyHarness(tb testing.TB, spines, leaves, nodes int) *harness {
	base := testObjects(tb)
	alloc := v1.ResourceList{v1.ResourcePods: resource.MustParse("110"), v1.ResourceCPU: resource.MustParse("64"), v1.ResourceMemory: resource.MustParse("512Gi")}
	objs := extraNodes(base, spines*leaves*nodes, nodes, leaves, alloc)
	h := bulkHarness(tb, append(base, objs...))
	h.c.mu.Lock()
	defer h.c.mu.Unlock()
	for i := range spines * leaves * nodes {
		name := fmt.Sprintf("x%d", i)
		var held int
		switch i % 10 {
		case 0, 1, 2, 3, 4:
			held = 8
		case 5:
			held = 4
		default:
			continue
		}
		claim := foreignClaim("busy-"+name, name, gpus(held)...)
		claim.ResourceVersion = "1"
		h.c.index.update(claim)
		pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "busy-" + name, Namespace: "default", UID: types.UID("busy-" + name)},
			Spec: v1.PodSpec{NodeName: name, Containers: []v1.Container{{Name: "c", Resources: v1.ResourceRequirements{
				Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse(fmt.Sprint(held * 4))}}}}}}
		h.c.usage.Add(name, pod)
	}
	return h
}

// BenchmarkControllerHeap5000Nodes reports the live heap the controller
// holds once its caches synced and its tree was built on the scale
// benchmark's 5,000 nodes (40,000 GPUs): heap-B/device is that heap over
// the devices, MiB the whole. The fake API server hands its ResourceSlices
// out as the real one does, decoded from JSON, so every cached string is
// the cache's own unless the controller shares it. What the fake API
// server itself holds is measured before the controller starts and left
// out.
func BenchmarkControllerHeap5000Nodes(b *testing.B) {
	for b.Loop() {
		heap, devices := controllerHeap(b, 10, 50, 10)
		b.ReportMetric(float64(heap)/float64(devices), "heap-B/device")
		b.ReportMetric(float64(heap)/(1<<20), "MiB")
	}
}

// controllerHeap starts the controller on spines × leaves × nodes fake
// nodes and returns the live heap it added and the devices it caches.
func controllerHeap(tb testing.TB, spines, leaves, nodes int) (uint64, int) {
	base := testObjects(tb)
	alloc := v1.ResourceList{v1.ResourcePods: resource.MustParse("110"), v1.ResourceCPU: resource.MustParse("64"), v1.ResourceMemory: resource.MustParse("512Gi")}
	objs := append(base, extraNodes(base, spines*leaves*nodes, nodes, leaves, alloc)...)
	devices := 0
	rt := make([]runtime.Object, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*resourceapi.ResourceSlice); ok {
			devices += len(s.Spec.Devices)
		}
		rt = append(rt, o.(runtime.Object))
	}
	_, ctx := ktesting.NewTestContext(tb)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := fake.NewClientset(rt...)
	client.PrependReactor("list", "resourceslices", func(action k8stesting.Action) (bool, runtime.Object, error) {
		obj, err := client.Tracker().List(resourceapi.SchemeGroupVersion.WithResource("resourceslices"), resourceapi.SchemeGroupVersion.WithKind("ResourceSlice"), "")
		if err != nil {
			return true, nil, err
		}
		data, err := runtime.Encode(scheme.Codecs.LegacyCodec(resourceapi.SchemeGroupVersion), obj)
		if err != nil {
			return true, nil, err
		}
		decoded, _, err := scheme.Codecs.UniversalDeserializer().Decode(data, nil, nil)
		return true, decoded, err
	})
	objs, rt = nil, nil
	var before, after goruntime.MemStats
	goruntime.GC()
	goruntime.ReadMemStats(&before)
	h := &harness{t: tb, ctx: ctx, client: client}
	h.start()
	if _, err := h.c.snapshotCluster(); err != nil {
		tb.Fatal(err)
	}
	goruntime.GC()
	goruntime.ReadMemStats(&after)
	goruntime.KeepAlive(h)
	return after.HeapAlloc - before.HeapAlloc, devices
}

// TestPlanTimesSplitTheWallClock: the slow-plan log's phases lie within
// the plan's wall clock, the planner's phase is never empty, and the tree
// is timed only when it is brought up to date (the first plan builds it,
// a second plan with nothing changed finds it current).
func TestPlanTimesSplitTheWallClock(t *testing.T) {
	h := busyHarness(t, 1, 2, 4)
	h.create(job("j", 2))
	for i := range 2 {
		h.addPod(jobPod("j", i, "gpu-8-node", nil))
	}
	h.settle()
	for round := range 2 {
		g, err := h.c.loadGroup("default/job/j")
		if err != nil {
			t.Fatal(err)
		}
		req, err := placement.Parse(g.anyPod().Annotations)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, pt, err := h.c.planGroup(h.ctx, g, req)
		wall := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		if sum := pt.tree + pt.wait + pt.snapshot + pt.plan; sum > wall {
			t.Errorf("round %d: phases %+v add up to %v, more than the %v the plan took", round, pt, sum, wall)
		}
		if pt.plan <= 0 || pt.wait < 0 || pt.snapshot < 0 {
			t.Errorf("round %d: phases %+v: want a planner phase and no negative one", round, pt)
		}
		if built := pt.tree > 0; built != (round == 0) {
			t.Errorf("round %d: tree update took %v; want time only when the first plan builds the tree", round, pt.tree)
		}
	}
}
