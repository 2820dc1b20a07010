package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	specs "github.com/gputopo/gputopo/demo/specs"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/slices"
	"github.com/gputopo/gputopo/pkg/topology"
)

// Test cluster: one spine, two leaves of two dgx-h100 nodes each.
//
//	spine-0
//	├── leaf-0: n0 n1
//	└── leaf-1: n2 n3
func testObjects(t *testing.T) []any {
	t.Helper()
	var objs []any
	p, err := sim.LoadBuiltin("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		name := fmt.Sprintf("n%d", i)
		labels := map[string]string{topology.LabelTopographLeaf: fmt.Sprintf("leaf-%d", i/2), topology.LabelTopographSpine: "spine-0"}
		objs = append(objs, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}})
		res, err := slices.Build(p.Inventory(name), slices.Node{Name: name, Labels: labels}, slices.DefaultConfig(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range slices.Objects(name, res) {
			objs = append(objs, s)
		}
	}
	dc, err := specs.DeviceClass()
	if err != nil {
		t.Fatal(err)
	}
	objs = append(objs, dc)
	for _, name := range []string{"gpu-8-node", "gpu-4-nvlink"} {
		tmpl, err := specs.ClaimTemplate(name)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.Namespace = "default"
		objs = append(objs, tmpl)
	}
	return objs
}

type harness struct {
	t      *testing.T
	ctx    context.Context
	client *fake.Clientset
	c      *Controller
}

func newHarness(t *testing.T, extra ...any) *harness {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	client := fake.NewClientset()
	h := &harness{t: t, ctx: ctx, client: client}
	for _, o := range append(testObjects(t), extra...) {
		h.create(o)
	}
	c, err := New(Config{Client: client, Network: topology.DefaultLabelMapping()})
	if err != nil {
		t.Fatal(err)
	}
	c.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		t.Fatal("caches did not sync")
	}
	h.c = c
	return h
}

func (h *harness) create(o any) {
	h.t.Helper()
	var err error
	switch o := o.(type) {
	case *v1.Node:
		_, err = h.client.CoreV1().Nodes().Create(h.ctx, o, metav1.CreateOptions{})
	case *resourceapi.ResourceSlice:
		_, err = h.client.ResourceV1().ResourceSlices().Create(h.ctx, o, metav1.CreateOptions{})
	case *resourceapi.DeviceClass:
		_, err = h.client.ResourceV1().DeviceClasses().Create(h.ctx, o, metav1.CreateOptions{})
	case *resourceapi.ResourceClaimTemplate:
		_, err = h.client.ResourceV1().ResourceClaimTemplates(o.Namespace).Create(h.ctx, o, metav1.CreateOptions{})
	case *resourceapi.ResourceClaim:
		_, err = h.client.ResourceV1().ResourceClaims(o.Namespace).Create(h.ctx, o, metav1.CreateOptions{})
	case *batchv1.Job:
		_, err = h.client.BatchV1().Jobs(o.Namespace).Create(h.ctx, o, metav1.CreateOptions{})
	case *v1.Pod:
		_, err = h.client.CoreV1().Pods(o.Namespace).Create(h.ctx, o, metav1.CreateOptions{})
	default:
		h.t.Fatalf("unknown object %T", o)
	}
	if err != nil {
		h.t.Fatal(err)
	}
}

func job(name string, pods int32) *batchv1.Job {
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec: batchv1.JobSpec{Parallelism: ptr.To(pods), Completions: ptr.To(pods)}}
}

// jobPod is a gated pod of job with one claim from template.
func jobPod(jobName string, i int, template string, ann map[string]string) *v1.Pod {
	a := map[string]string{placement.AnnotationPlacement: "auto"}
	for k, v := range ann {
		a[k] = v
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("%s-%d", jobName, i), Namespace: "default", UID: types.UID(fmt.Sprintf("%s-%d", jobName, i)),
			Annotations:     a,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: jobName, UID: types.UID("uid-" + jobName), Controller: ptr.To(true)}},
		},
		Spec: v1.PodSpec{
			SchedulingGates: []v1.PodSchedulingGate{{Name: placement.SchedulingGate}},
			Containers:      []v1.Container{{Name: "c", Image: "img"}},
			ResourceClaims:  []v1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: ptr.To(template)}},
		},
	}
}

// sync runs one sync of the group once the informer shows want pods.
func (h *harness) sync(key string, want int) {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		objs, _ := h.c.podIdx.ByIndex(groupIndex, key)
		if len(objs) >= want {
			break
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("informer shows %d pods of %s, want %d", len(objs), key, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := h.c.sync(h.ctx, key); err != nil {
		h.t.Fatalf("sync %s: %v", key, err)
	}
}

func (h *harness) pod(name string) *v1.Pod {
	h.t.Helper()
	p, err := h.client.CoreV1().Pods("default").Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return p
}

// waitSeen blocks until the informer shows the pod's annotation.
func (h *harness) waitSeen(name, annotation string) {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if p, err := h.c.pods.Pods("default").Get(name); err == nil && p.Annotations[annotation] != "" {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.t.Fatalf("informer never showed %s on %s", annotation, name)
}

func pinnedNode(p *v1.Pod) string {
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	for _, t := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, f := range t.MatchFields {
			if f.Key == "metadata.name" && len(f.Values) == 1 {
				return f.Values[0]
			}
		}
	}
	return ""
}

func TestTwoPodJobPinnedToOneLeafAndUngated(t *testing.T) {
	h := newHarness(t, job("j", 2), jobPod("j", 0, "gpu-8-node", nil), jobPod("j", 1, "gpu-8-node", nil))
	h.sync("default/job/j", 2)
	leafOf := map[string]string{"n0": "leaf-0", "n1": "leaf-0", "n2": "leaf-1", "n3": "leaf-1"}
	var nodes []string
	for _, name := range []string{"j-0", "j-1"} {
		p := h.pod(name)
		if hasGate(p) {
			t.Errorf("%s still gated", name)
		}
		n := pinnedNode(p)
		if n == "" || p.Annotations[placement.AnnotationNode] != n {
			t.Fatalf("%s not pinned: affinity %q annotation %q", name, n, p.Annotations[placement.AnnotationNode])
		}
		nodes = append(nodes, n)
	}
	if nodes[0] == nodes[1] || leafOf[nodes[0]] != leafOf[nodes[1]] {
		t.Errorf("pods on %v: want two nodes of one leaf", nodes)
	}
	if d := h.pod("j-0").Annotations[placement.AnnotationDomain]; d != "leaf:"+leafOf[nodes[0]] {
		t.Errorf("domain annotation %q", d)
	}
}

func TestIncompleteGroupWaits(t *testing.T) {
	h := newHarness(t, job("j", 3), jobPod("j", 0, "gpu-8-node", nil), jobPod("j", 1, "gpu-8-node", nil))
	h.sync("default/job/j", 2)
	p := h.pod("j-0")
	if !hasGate(p) || pinnedNode(p) != "" {
		t.Error("a group missing a pod must stay gated and unpinned")
	}
	if got := p.Annotations[placement.AnnotationStatus]; got != "waiting for all 3 pods of the group; 2 exist" {
		t.Errorf("status %q", got)
	}
}

func TestJobThatCannotFitStaysGatedWithReason(t *testing.T) {
	var objs []any
	objs = append(objs, job("big", 3))
	for i := range 3 {
		objs = append(objs, jobPod("big", i, "gpu-8-node", map[string]string{placement.AnnotationPlacement: placement.PlacementSameLeaf}))
	}
	h := newHarness(t, objs...)
	h.sync("default/job/big", 3)
	for i := range 3 {
		p := h.pod(fmt.Sprintf("big-%d", i))
		if !hasGate(p) || pinnedNode(p) != "" {
			t.Errorf("pod %d placed partly", i)
		}
		if s := p.Annotations[placement.AnnotationStatus]; s == "" {
			t.Errorf("pod %d has no reason", i)
		}
	}
	if !h.c.pending["default/job/big"] {
		t.Error("group not marked pending for retry")
	}
}

func TestConcurrentJobsNeverShareDevices(t *testing.T) {
	var objs []any
	for _, j := range []string{"a", "b"} {
		objs = append(objs, job(j, 2))
		for i := range 2 {
			objs = append(objs, jobPod(j, i, "gpu-8-node", nil))
		}
	}
	h := newHarness(t, objs...)
	h.sync("default/job/a", 2)
	// b is planned before the informer shows a's pins: the in-flight
	// reservation alone must keep them apart.
	h.sync("default/job/b", 2)
	used := map[string]string{}
	for _, name := range []string{"a-0", "a-1", "b-0", "b-1"} {
		n := pinnedNode(h.pod(name))
		if other, dup := used[n]; dup {
			t.Errorf("%s and %s both pinned to %s", other, name, n)
		}
		used[n] = name
	}
}

func TestRestartFinishesPinnedGroupWithoutReplanning(t *testing.T) {
	// A controller pinned both pods and died before ungating them.
	p0 := jobPod("j", 0, "gpu-8-node", map[string]string{placement.AnnotationNode: "n3", placement.AnnotationDomain: "leaf:leaf-1",
		placement.AnnotationReservedDevices: "gpu.gputopo.dev/n3/gpu-0"})
	p1 := jobPod("j", 1, "gpu-8-node", map[string]string{placement.AnnotationNode: "n2", placement.AnnotationDomain: "leaf:leaf-1",
		placement.AnnotationReservedDevices: "gpu.gputopo.dev/n2/gpu-0"})
	narrowToNode(p0, "n3")
	narrowToNode(p1, "n2")
	h := newHarness(t, job("j", 2), p0, p1)
	h.sync("default/job/j", 2)
	got := map[string]string{"j-0": pinnedNode(h.pod("j-0")), "j-1": pinnedNode(h.pod("j-1"))}
	if diff := cmp.Diff(map[string]string{"j-0": "n3", "j-1": "n2"}, got); diff != "" {
		t.Errorf("pins changed (-want +got):\n%s", diff)
	}
	if hasGate(h.pod("j-0")) || hasGate(h.pod("j-1")) {
		t.Error("restarted controller did not finish ungating")
	}
}

func TestReservationsSurviveRestart(t *testing.T) {
	// Group a was pinned by an earlier controller; its claims are not
	// allocated yet. A new controller must not hand a's devices to b.
	var objs []any
	for i, n := range []string{"n0", "n1", "n2"} {
		p := jobPod("a", i, "gpu-8-node", nil)
		p.Spec.SchedulingGates = nil
		p.Spec.NodeName = n
		p.Annotations[placement.AnnotationNode] = n
		p.Annotations[placement.AnnotationReservedDevices] = ""
		for d := range 8 {
			sep := ","
			if d == 0 {
				sep = ""
			}
			p.Annotations[placement.AnnotationReservedDevices] += fmt.Sprintf("%sgpu.gputopo.dev/%s/gpu-%d", sep, n, d)
		}
		objs = append(objs, p)
	}
	objs = append(objs, job("a", 3), job("b", 2), jobPod("b", 0, "gpu-8-node", nil), jobPod("b", 1, "gpu-8-node", nil))
	h := newHarness(t, objs...)
	h.waitSeen("a-2", placement.AnnotationReservedDevices)
	h.sync("default/job/b", 2)
	if n := pinnedNode(h.pod("b-0")); n != "" {
		t.Errorf("b pinned to %s although only n3 is free", n)
	}
}

func TestReplacementReturnsToDomain(t *testing.T) {
	// j-0 runs on n2 in leaf-1; j-1 was evicted and its replacement is
	// gated. leaf-0 is emptier, but the group lives in leaf-1.
	placed := jobPod("j", 0, "gpu-4-nvlink", map[string]string{placement.AnnotationDomain: "leaf:leaf-1", placement.AnnotationNode: "n2"})
	placed.Spec.SchedulingGates = nil
	placed.Spec.NodeName = "n2"
	h := newHarness(t, job("j", 2), placed, jobPod("j", 1, "gpu-4-nvlink", nil))
	h.sync("default/job/j", 2)
	n := pinnedNode(h.pod("j-1"))
	if n != "n2" && n != "n3" {
		t.Errorf("replacement pinned to %q, want a node of leaf-1", n)
	}
}

func TestBadAnnotationIsReported(t *testing.T) {
	h := newHarness(t, job("j", 1), jobPod("j", 0, "gpu-8-node", map[string]string{placement.AnnotationStrategy: "packed"}))
	h.sync("default/job/j", 1)
	p := h.pod("j-0")
	if !hasGate(p) || p.Annotations[placement.AnnotationStatus] == "" {
		t.Errorf("bad annotation: gated=%v status=%q", hasGate(p), p.Annotations[placement.AnnotationStatus])
	}
}

func TestInflightReservationOfDeletedPodsIsDropped(t *testing.T) {
	h := newHarness(t)
	h.c.inflight["default/job/gone"] = planner.Reservation{
		Job: "default/job/gone", Pods: map[string]string{"gone-0": "n0"},
		Devices: map[string][]structured.DeviceID{"n0": {structured.MakeDeviceID(topology.DriverName, "n0", "gpu-0")}},
	}
	res, err := h.c.reservations(h.ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if jobs := res.Jobs(); len(jobs) != 0 {
		t.Errorf("reservations of vanished pods still held: %v", jobs)
	}
	if _, ok := h.c.inflight["default/job/gone"]; ok {
		t.Error("in-flight entry not dropped")
	}
}

func TestPodsOfDeletedJobAreNotPlanned(t *testing.T) {
	// The Job is gone; its pods are being deleted one by one and must not
	// be planned as a smaller group.
	h := newHarness(t, jobPod("j", 0, "gpu-8-node", nil), jobPod("j", 1, "gpu-8-node", nil))
	h.sync("default/job/j", 2)
	for _, name := range []string{"j-0", "j-1"} {
		if p := h.pod(name); !hasGate(p) || pinnedNode(p) != "" {
			t.Errorf("%s of a deleted Job was placed", name)
		}
	}
}

func TestNodeMovedIgnoresStatusUpdates(t *testing.T) {
	base := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{topology.LabelTopographLeaf: "leaf-0"}}}
	status := base.DeepCopy()
	status.Status.Conditions = []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}}
	relabelled := base.DeepCopy()
	relabelled.Labels[topology.LabelTopographLeaf] = "leaf-1"
	cordoned := base.DeepCopy()
	cordoned.Spec.Unschedulable = true
	for name, tc := range map[string]struct {
		cur  *v1.Node
		want bool
	}{"status": {status, false}, "relabelled": {relabelled, true}, "cordoned": {cordoned, true}} {
		if got := nodeMoved(base, tc.cur); got != tc.want {
			t.Errorf("%s: nodeMoved = %v, want %v", name, got, tc.want)
		}
	}
}
