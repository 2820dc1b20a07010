package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"

	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/topology"
)

// The work one node or slice event, and one plan, costs the topology path
// is counted, not timed: it must be the same on 100 nodes as on 2,000.
// A node that comes, goes or moves is patched in or out like any other
// change: only the first tree is built from every node.
func TestTopologyWorkPerEventDoesNotGrowWithNodes(t *testing.T) {
	for _, extra := range []int{100, 2000} {
		nodes := extra + 4 // and the test cluster's
		want := map[string]TopologyWork{
			"node status heartbeat":  {NodesRead: 1},
			"node tainted":           {NodesRead: 1, NodesBuilt: 1},
			"GPU tainted in a slice": {NodesRead: 1, NodesBuilt: 1},
			// The first plan takes the snapshot from every claim and pod.
			"plan of a 2-pod Job": {Snapshot: planner.TrackerWork{Builds: 1}},
			// The next one applies what changed: the 16 GPUs of the first,
			// and the requests of its 2 pods on their nodes, their gates open.
			"plan of a second 2-pod Job": {Snapshot: planner.TrackerWork{Devices: 16, Nodes: 2}},
			"node added":                 {NodesRead: 1, NodesBuilt: 1},
			"node moved to another leaf": {NodesRead: 1, NodesBuilt: 1},
			"node removed":               {NodesRemoved: 1},
			// Every node may use its devices, yet it is one read and one
			// change of the tree.
			"slice for all nodes added": {SharedRead: 1, SharedApplied: 1},
		}
		if diff := cmp.Diff(want, topologyWorkPerEvent(t, extra)); diff != "" {
			t.Errorf("work per event on %d nodes (-want +got):\n%s", nodes, diff)
		}
	}
}

// topologyWorkPerEvent starts the controller on a cluster of the test
// nodes plus extra fake nodes (10 per leaf, 10 leaves per spine), builds
// the tree once, then records what each event costs, tree included.
func topologyWorkPerEvent(t *testing.T, extra int) map[string]TopologyWork {
	base := testObjects(t)
	objs := extraNodes(base, extra, 10, 10, nil)
	h := bulkHarness(t, append(base, objs...))
	if _, err := h.c.snapshotCluster(); err != nil {
		t.Fatal(err)
	}
	if got, want := h.c.topologyWork().NodesBuilt, extra+4; got != want {
		t.Fatalf("%d nodes in the first tree; want %d", got, want)
	}
	out := map[string]TopologyWork{}
	var updateNamed func(string, func(*v1.Node)) func()
	// measure runs one event and waits for its handler (every handler
	// reads one node), then takes the tree a plan would take.
	measure := func(name string, event func()) {
		t.Helper()
		before := h.c.topologyWork()
		event()
		h.eventually(name, func() bool {
			w := h.c.topologyWork()
			return w.NodesRead > before.NodesRead || w.NodesRemoved > before.NodesRemoved || w.SharedRead > before.SharedRead
		})
		if _, err := h.c.snapshotCluster(); err != nil {
			t.Fatal(err)
		}
		after := h.c.topologyWork()
		out[name] = after.minus(before)
	}
	updateNode := func(edit func(*v1.Node)) func() {
		return updateNamed("x0", edit)
	}
	updateNamed = func(name string, edit func(*v1.Node)) func() {
		return func() {
			n, err := h.client.CoreV1().Nodes().Get(h.ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			edit(n)
			if _, err := h.client.CoreV1().Nodes().Update(h.ctx, n, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	measure("node status heartbeat", updateNode(func(n *v1.Node) {
		n.Status.Conditions[0].LastHeartbeatTime = metav1.Now()
	}))
	measure("node tainted", updateNode(func(n *v1.Node) {
		n.Spec.Taints = append(n.Spec.Taints, v1.Taint{Key: "maintenance", Effect: v1.TaintEffectNoSchedule})
	}))
	measure("GPU tainted in a slice", func() {
		s, err := h.client.ResourceV1().ResourceSlices().Get(h.ctx, objs[1].(*resourceapi.ResourceSlice).Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Spec.Devices[0].Taints = []resourceapi.DeviceTaint{{Key: "gpu.gputopo.dev/xid", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
		s.ResourceVersion = "2" // the fake client keeps what it is given; an apiserver would bump it
		if _, err := h.client.ResourceV1().ResourceSlices().Update(h.ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	before := h.c.topologyWork()
	h.create(job("j", 2))
	for i := range 2 {
		h.addPod(jobPod("j", i, "gpu-8-node", nil))
	}
	h.settle()
	h.sync("default/job/j")
	if h.allocatedNode("j-0") == "" || h.allocatedNode("j-1") == "" {
		t.Fatal("the Job was not planned")
	}
	after := h.c.topologyWork()
	out["plan of a 2-pod Job"] = after.minus(before)

	before = after
	h.create(job("k", 2))
	for i := range 2 {
		h.addPod(jobPod("k", i, "gpu-8-node", nil))
	}
	h.settle()
	h.sync("default/job/k")
	if h.allocatedNode("k-0") == "" {
		t.Fatal("the second Job was not planned")
	}
	out["plan of a second 2-pod Job"] = h.c.topologyWork().minus(before)

	measure("node added", func() { h.create(fakeNode("new", "xleaf-0", "xspine-0")) })
	measure("node moved to another leaf", updateNamed("x1", func(n *v1.Node) {
		n.Labels[topology.LabelTopographLeaf] = "xleaf-1"
	}))
	measure("node removed", func() {
		if err := h.client.CoreV1().Nodes().Delete(h.ctx, "x2", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	measure("slice for all nodes added", func() {
		h.create(&resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "nics"}, Spec: resourceapi.ResourceSliceSpec{
			Driver: "nic.example.com", Pool: resourceapi.ResourcePool{Name: "nics", ResourceSliceCount: 1}, AllNodes: ptr.To(true),
			Devices: []resourceapi.Device{{Name: "nic-0"}}}})
	})
	cl, err := h.c.snapshotCluster()
	if err != nil {
		t.Fatal(err)
	}
	if leaf, _ := cl.LeafOf("x1"); leaf != "xleaf-1" || cl.Has("x2") || !cl.Has("new") || cl.Len() != extra+4 {
		t.Errorf("patched tree: x1 in %q, has x2 %v, has new %v, %d nodes; want xleaf-1, false, true, %d", leaf, cl.Has("x2"), cl.Has("new"), cl.Len(), extra+4)
	}
	return out
}

// extraNodes are count fake nodes x0, x1, ... with copies of the slices
// of base's n0, perLeaf to a leaf and leavesPerSpine leaves to a spine,
// offering alloc (nil: nothing).
func extraNodes(base []any, count, perLeaf, leavesPerSpine int, alloc v1.ResourceList) []any {
	var objs []any
	var proto []*resourceapi.ResourceSlice
	for _, o := range base {
		if s, ok := o.(*resourceapi.ResourceSlice); ok && *s.Spec.NodeName == "n0" {
			proto = append(proto, s)
		}
	}
	for i := range count {
		name := fmt.Sprintf("x%d", i)
		n := fakeNode(name, fmt.Sprintf("xleaf-%d", i/perLeaf), fmt.Sprintf("xspine-%d", i/(perLeaf*leavesPerSpine)))
		n.Status.Allocatable = alloc
		objs = append(objs, n)
		for _, p := range proto {
			s := p.DeepCopy()
			s.Name = name + "-" + p.Name
			s.Spec.NodeName, s.Spec.Pool.Name = &name, name
			objs = append(objs, s)
		}
	}
	return objs
}

func fakeNode(name, leaf, spine string) *v1.Node {
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{topology.LabelTopographLeaf: leaf, topology.LabelTopographSpine: spine}},
		Status:     v1.NodeStatus{Conditions: []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}},
	}
}

// bulkHarness is newHarness for thousands of objects: the fake client
// takes them at construction, which is much faster than one create each.
func bulkHarness(t testing.TB, objs []any) *harness {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	rt := make([]runtime.Object, 0, len(objs))
	for _, o := range objs {
		rt = append(rt, o.(runtime.Object))
	}
	h := &harness{t: t, ctx: ctx, client: fake.NewClientset(rt...)}
	h.start()
	return h
}

func (w TopologyWork) minus(o TopologyWork) TopologyWork {
	return TopologyWork{NodesRead: w.NodesRead - o.NodesRead, NodesBuilt: w.NodesBuilt - o.NodesBuilt, NodesRemoved: w.NodesRemoved - o.NodesRemoved,
		SharedRead: w.SharedRead - o.SharedRead, SharedApplied: w.SharedApplied - o.SharedApplied,
		Snapshot: planner.TrackerWork{Devices: w.Snapshot.Devices - o.Snapshot.Devices, Nodes: w.Snapshot.Nodes - o.Snapshot.Nodes, Builds: w.Snapshot.Builds - o.Snapshot.Builds}}
}

// A NIC of another driver in a pool every node can use (allNodes): a
// one-pod Job takes the pool's one NIC; a Job whose two pods each ask for
// a GPU and a NIC waits while the pool has no NIC left for them, is tried
// again when the pool grows, and then each pod gets its own new NIC
// beside its GPU.
func TestNonLocalSliceIsPlannedAndRequeuesWaitingGroups(t *testing.T) {
	const nic = "nic.example.com"
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: nic}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + nic + `"`}}}}}
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "gpu-nic", Namespace: "default"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: topology.DriverName, Count: 1}},
			{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: nic, Count: 1}},
		}}}}}
	pool := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "nics", ResourceVersion: "1"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: nic, Pool: resourceapi.ResourcePool{Name: "nics", ResourceSliceCount: 1}, AllNodes: ptr.To(true),
		Devices: []resourceapi.Device{{Name: "nic-0"}}}}
	h := newHarness(t, class, tmpl, pool, job("solo", 1), job("j", 2))
	h.addPod(jobPod("solo", 0, "gpu-nic", nil))
	h.sync("default/job/solo")
	if got := h.devicesOf("solo-0"); !slices.Contains(got, nic+"/nics/nic-0") {
		t.Fatalf("solo-0 holds %v, want the pool's NIC among them", got)
	}
	for i := range 2 {
		h.addPod(jobPod("j", i, "gpu-nic", nil))
	}
	h.settle()
	h.sync("default/job/j")
	for _, pod := range []string{"j-0", "j-1"} {
		if n := h.allocatedNode(pod); n != "" {
			t.Fatalf("%s allocated on %s, though solo-0 holds the only NIC", pod, n)
		}
	}
	if status := h.pod("j-0").Annotations[placement.AnnotationStatus]; !strings.Contains(status, "1 GPU and 1 "+nic+" device each") {
		t.Errorf("status %q does not say what each pod asks for", status)
	}
	h.queued()

	read := h.c.topologyWork().SharedRead
	pool.Spec.Devices = append(pool.Spec.Devices, resourceapi.Device{Name: "nic-1"}, resourceapi.Device{Name: "nic-2"})
	pool.ResourceVersion = "2"
	if _, err := h.client.ResourceV1().ResourceSlices().Update(h.ctx, pool, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the grown NIC pool", func() bool { return h.c.topologyWork().SharedRead > read })
	h.eventually("the waiting Job queued", func() bool { return h.c.queue.Len() > 0 })
	if q := h.queued(); !q["default/job/j"] {
		t.Fatalf("queued %v, want the waiting Job", q)
	}
	h.sync("default/job/j")
	var nics []string
	for _, pod := range []string{"j-0", "j-1"} {
		if h.allocatedNode(pod) == "" {
			t.Fatalf("%s not allocated once the pool has a NIC for each pod", pod)
		}
		for _, d := range h.devicesOf(pod) {
			if strings.HasPrefix(d, nic+"/") {
				nics = append(nics, d)
			}
		}
	}
	slices.Sort(nics)
	if diff := cmp.Diff([]string{nic + "/nics/nic-1", nic + "/nics/nic-2"}, nics); diff != "" {
		t.Errorf("NICs of the pods (-want +got):\n%s", diff)
	}
	if w := h.c.topologyWork(); w.SharedApplied != 2 {
		t.Errorf("the tree took the NIC slices %d times, want 2: built with one NIC, patched with three", w.SharedApplied)
	}
}

// A pod whose only claim asks for a device local to no one node (a NIC
// from a pool every node can use) gets no node from its allocation: its
// gputopo.dev/node is the node its plan chose, so that it is steered,
// explained and watched (bind timeout, node trouble) like any other.
func TestPodWithOnlyNonLocalDevicesIsNotedOnItsPlannedNode(t *testing.T) {
	const nic = "nic.example.com"
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: nic}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + nic + `"`}}}}}
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "nic-only", Namespace: "default"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: nic, Count: 1}},
		}}}}}
	pool := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "nics", ResourceVersion: "1"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: nic, Pool: resourceapi.ResourcePool{Name: "nics", ResourceSliceCount: 1}, AllNodes: ptr.To(true),
		Devices: []resourceapi.Device{{Name: "nic-0"}}}}
	h := newHarness(t, class, tmpl, pool, job("solo", 1))
	h.addPod(jobPod("solo", 0, "nic-only", nil))
	h.sync("default/job/solo")
	if got := h.devicesOf("solo-0"); !slices.Equal(got, []string{nic + "/nics/nic-0"}) {
		t.Fatalf("solo-0 holds %v, want the pool's NIC", got)
	}
	if n := h.allocatedNode("solo-0"); n != "" {
		t.Fatalf("the NIC's allocation names node %q; the test needs one that names none", n)
	}
	p := h.pod("solo-0")
	if hasGate(p) {
		t.Fatalf("solo-0 is still gated: %s", p.Annotations[placement.AnnotationStatus])
	}
	node := p.Annotations[placement.AnnotationNode]
	if node == "" {
		t.Fatalf("solo-0 has no %s; annotations %v", placement.AnnotationNode, p.Annotations)
	}
	if _, err := h.client.CoreV1().Nodes().Get(h.ctx, node, metav1.GetOptions{}); err != nil {
		t.Errorf("%s=%q is not a node of the cluster: %v", placement.AnnotationNode, node, err)
	}
}
