package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/pkg/topology"
)

func TestSchedulerAllocates(t *testing.T) {
	gang := podGroup("pg", 2, "")
	basic := podGroup("pg", 0, "")
	for name, tc := range map[string]struct {
		mode AllocationMode
		pg   *schedulingv1beta1.PodGroup
		want bool
	}{
		"auto, gang PodGroup":        {AllocationAuto, gang, true},
		"auto, basic PodGroup":       {AllocationAuto, basic, false},
		"auto, no PodGroup":          {AllocationAuto, nil, false},
		"controller, gang PodGroup":  {AllocationController, gang, false},
		"scheduler, no PodGroup":     {AllocationScheduler, nil, true},
		"scheduler, gang PodGroup":   {AllocationScheduler, gang, true},
		"controller, no PodGroup":    {AllocationController, nil, false},
		"auto, basic PodGroup again": {AllocationAuto, basic, false},
	} {
		t.Run(name, func(t *testing.T) {
			if got := schedulerAllocates(tc.mode, tc.pg); got != tc.want {
				t.Errorf("schedulerAllocates(%s) = %v, want %v", tc.mode, got, tc.want)
			}
		})
	}
}

func TestTopologyKeysAndGangSize(t *testing.T) {
	pg := podGroup("pg", 3, topology.LabelTopographLeaf)
	pg.Spec.SchedulingConstraints.Topology = append(pg.Spec.SchedulingConstraints.Topology,
		schedulingv1beta1.TopologyConstraint{Key: topology.LabelTopographLeaf}, schedulingv1beta1.TopologyConstraint{Key: topology.LabelTopographSpine})
	if diff := cmp.Diff([]string{topology.LabelTopographLeaf, topology.LabelTopographSpine}, topologyKeys(pg)); diff != "" {
		t.Errorf("topology keys (-want +got):\n%s", diff)
	}
	if got := topologyKeys(podGroup("pg", 3, "")); got != nil {
		t.Errorf("no constraint gave keys %v", got)
	}
	if gangSize(pg) != 3 || gangSize(podGroup("pg", 0, "")) != 0 || gangSize(nil) != 0 {
		t.Errorf("gang sizes %d %d %d, want 3 0 0", gangSize(pg), gangSize(podGroup("pg", 0, "")), gangSize(nil))
	}
}

func TestPodGroupPodsFormAGroup(t *testing.T) {
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Annotations: map[string]string{placement.AnnotationPlacement: "auto"}}}
	p.Spec.SchedulingGroup = &v1.PodSchedulingGroup{PodGroupName: ptr.To("pg")}
	if got, ok := groupKey(p); !ok || got != "ns/group/pg" {
		t.Errorf("groupKey = %q, %v; want ns/group/pg", got, ok)
	}
	// A Job's pods stay the Job's group: its PodGroup holds exactly them.
	p.OwnerReferences = []metav1.OwnerReference{{Kind: "Job", Name: "j", Controller: ptr.To(true)}}
	if got, _ := groupKey(p); got != "ns/job/j" {
		t.Errorf("groupKey = %q; want ns/job/j", got)
	}
	// Not opted in: not gputopo's.
	delete(p.Annotations, placement.AnnotationPlacement)
	if _, ok := groupKey(p); ok {
		t.Error("a pod that did not opt in has a group")
	}
}

func TestDecidePodGroup(t *testing.T) {
	for name, tc := range map[string]struct {
		build func(g *group)
		want  got
	}{
		"a PodGroup that does not exist yet is waited for": {
			build: func(g *group) { g.podGroupName, g.pgMissing = "pg", true },
			want: got{Next: nextStatus, Fresh: true, Reason: placement.StatusWaitingForPodGroup, Outcome: OutcomeWaiting,
				Pods: []string{"a", "b"}, Res: done, Lists: [4][]string{{"a", "b"}}},
		},
		"pods naming two PodGroups are refused": {
			build: func(g *group) { g.pgErr = fmt.Errorf("two PodGroups") },
			want: got{Next: nextRefuse, Reason: ReasonInvalidPlacement, Outcome: OutcomeInvalid,
				Pods: []string{"a", "b"}, Res: done, Lists: [4][]string{{"a", "b"}}},
		},
		"an existing PodGroup lets the group be planned": {
			build: func(g *group) { g.podGroupName, g.podGroup = "pg", podGroup("pg", 2, "") },
			want:  got{Next: nextPlan, Fresh: true, Lists: [4][]string{{"a", "b"}}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			g := &group{key: "default/job/j", ns: "default", size: 2,
				toPlace: []*member{dm("a", "gated", "pending"), dm("b", "gated", "pending")}}
			tc.build(g)
			d := decide(&observation{g: g, facts: map[*member]facts{}}, 0)
			if diff := cmp.Diff(tc.want, words(d)); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
		})
	}
}

func TestServesPodGroups(t *testing.T) {
	client := fake.NewClientset()
	if servesPodGroups(client.Discovery()) {
		t.Error("an API server without scheduling.k8s.io/v1beta1 serves PodGroups")
	}
	client.Resources = podGroupsServed()
	if !servesPodGroups(client.Discovery()) {
		t.Error("PodGroups listed by discovery are not seen as served")
	}
}

// A Job whose PodGroup holds it to one leaf and that fits in no leaf is
// refused with the constraint named, and holds no device; without the
// constraint the same Job is placed across two leaves.
func TestPodGroupTopologyKeyRefusesWhatTheSchedulerWould(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		t.Run(fmt.Sprintf("keyed=%v", keyed), func(t *testing.T) {
			key := ""
			if keyed {
				key = topology.LabelTopographLeaf
			}
			h := newNativeHarness(t, AllocationController, job("big", 3), podGroup("big-pg", 3, key))
			for i := range 3 {
				h.addPod(withPodGroup(jobPod("big", i, "gpu-8-node", nil), "big-pg"))
			}
			h.place("default/job/big")
			p := h.pod("big-0")
			if !keyed {
				if hasGate(p) {
					t.Fatalf("without a topology key the Job was not placed: %s", p.Annotations[placement.AnnotationStatus])
				}
				return
			}
			status := p.Annotations[placement.AnnotationStatus]
			if !hasGate(p) || !strings.Contains(status, "one value of node label "+topology.LabelTopographLeaf) {
				t.Fatalf("gated %v, status %q; want refused for the topology constraint", hasGate(p), status)
			}
			if n := h.allocatedClaims(); n != 0 {
				t.Errorf("%d claims allocated for a gang the scheduler would refuse", n)
			}
		})
	}
}

// In scheduler mode the plan chooses the domain; no claim is written and
// the gates open with node affinity to the domain's nodes.
func TestSchedulerModeSteersWithoutAllocating(t *testing.T) {
	h := newNativeHarness(t, AllocationAuto, job("gang", 2), podGroup("gang-pg", 2, topology.LabelTopographLeaf))
	for i := range 2 {
		h.addPod(withPodGroup(jobPod("gang", i, "gpu-8-node", nil), "gang-pg"))
	}
	h.place("default/job/gang")
	for i := range 2 {
		p := h.pod(fmt.Sprintf("gang-%d", i))
		if hasGate(p) {
			t.Fatalf("%s still gated: %s", p.Name, p.Annotations[placement.AnnotationStatus])
		}
		d, err := placement.ParseDomain(p.Annotations[placement.AnnotationDomain])
		if err != nil || d.Level != placement.LevelLeaf {
			t.Errorf("%s domain %q, want a leaf", p.Name, p.Annotations[placement.AnnotationDomain])
		}
		if n := p.Annotations[placement.AnnotationNode]; n != "" {
			t.Errorf("%s names node %s; the scheduler picks the node", p.Name, n)
		}
		req := p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
		if req == nil || !strings.Contains(fmt.Sprint(req), "host-n0") || strings.Contains(fmt.Sprint(req), "host-n2") {
			t.Errorf("%s not held to leaf-0 by node affinity: %v", p.Name, req)
		}
	}
	if n := h.allocatedClaims(); n != 0 {
		t.Errorf("the controller allocated %d claims; in scheduler mode kube-scheduler does", n)
	}
}

// Two gangs the scheduler allocates, planned one after the other before it
// binds either: the first one's plan holds its leaf's devices for the
// second one's plan (nothing else shows them yet), so the second is sent
// to the other leaf, not to the room the first will take. Once the first
// one's pods are bound the hold ends.
func TestSteeredGangsDoNotShareRoom(t *testing.T) {
	h := newNativeHarness(t, AllocationAuto, job("a", 2), podGroup("a-pg", 2, topology.LabelTopographLeaf),
		job("b", 2), podGroup("b-pg", 2, topology.LabelTopographLeaf))
	for _, j := range []string{"a", "b"} {
		for i := range 2 {
			h.addPod(withPodGroup(jobPod(j, i, "gpu-8-node", nil), j+"-pg"))
		}
	}
	h.place("default/job/a")
	h.place("default/job/b")
	domain := func(j string) string { return h.pod(j + "-0").Annotations[placement.AnnotationDomain] }
	if domain("a") == "" || domain("a") == domain("b") {
		t.Fatalf("gang a in %q, gang b in %q: both sent to one leaf of two whole nodes", domain("a"), domain("b"))
	}
	if _, held := h.c.inflight.Get("default/job/a"); !held {
		t.Fatal("gang a's devices are not held while its pods wait for the scheduler")
	}
	for i := range 2 {
		p := h.pod(fmt.Sprintf("a-%d", i))
		p.Spec.NodeName = fmt.Sprintf("n%d", i)
		if strings.Contains(domain("a"), "leaf-1") {
			p.Spec.NodeName = fmt.Sprintf("n%d", i+2)
		}
		if _, err := h.client.CoreV1().Pods("default").Update(h.ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h.settle()
	h.sync("default/job/a")
	if _, held := h.c.inflight.Get("default/job/a"); held {
		t.Error("gang a's hold outlives the binding of all its pods")
	}
}

// When a steered gang's hold ends, the groups waiting for room are
// planned again at once, not at the next retry: the hold counted the
// planned devices beside those the scheduler allocated.
func TestPendingGroupsPlannedAgainWhenAHoldEnds(t *testing.T) {
	var objs []any
	for _, j := range []string{"a", "b", "c"} {
		objs = append(objs, job(j, 2), podGroup(j+"-pg", 2, topology.LabelTopographLeaf))
	}
	h := newNativeHarness(t, AllocationAuto, objs...)
	for _, j := range []string{"a", "b", "c"} {
		for i := range 2 {
			h.addPod(withPodGroup(jobPod(j, i, "gpu-8-node", nil), j+"-pg"))
		}
	}
	h.place("default/job/a")
	h.place("default/job/b")
	h.sync("default/job/c") // both leaves held: c waits for room
	if !hasGate(h.pod("c-0")) {
		t.Fatal("gang c placed beside two gangs that hold both leaves")
	}
	queued := func() map[string]bool {
		out := map[string]bool{}
		for h.c.queue.Len() > 0 {
			k, _ := h.c.queue.Get()
			out[k] = true
			h.c.queue.Done(k)
		}
		return out
	}
	queued()
	for i := range 2 {
		p := h.pod(fmt.Sprintf("a-%d", i))
		p.Spec.NodeName = fmt.Sprintf("n%d", i)
		if strings.Contains(p.Annotations[placement.AnnotationDomain], "leaf-1") {
			p.Spec.NodeName = fmt.Sprintf("n%d", i+2)
		}
		if _, err := h.client.CoreV1().Pods("default").Update(h.ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h.settle()
	if q := queued(); q["default/job/c"] {
		t.Fatalf("gang c queued by the binding alone (%v): the test would not tell", q)
	}
	h.sync("default/job/a")
	if _, held := h.c.inflight.Get("default/job/a"); held {
		t.Fatal("gang a's hold outlives the binding of all its pods")
	}
	if q := queued(); !q["default/job/c"] {
		t.Errorf("gang a's hold ended and waiting gang c was not queued: %v", q)
	}
}

// The same gang without a PodGroup stays controller-allocated in auto
// mode: nothing else would make it all or nothing.
func TestAutoModeAllocatesGroupsWithoutAPodGroup(t *testing.T) {
	h := newNativeHarness(t, AllocationAuto, job("plain", 2))
	for i := range 2 {
		h.addPod(jobPod("plain", i, "gpu-8-node", nil))
	}
	h.place("default/job/plain")
	if n := h.allocatedClaims(); n != 2 {
		t.Errorf("%d claims allocated, want 2", n)
	}
}

func newNativeHarness(t *testing.T, mode AllocationMode, extra ...any) *harness {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	client := fake.NewClientset()
	client.Resources = append(podGroupsServed(), &metav1.APIResourceList{GroupVersion: resourceapi.SchemeGroupVersion.String(),
		APIResources: []metav1.APIResource{{Name: "devicetaintrules", Kind: "DeviceTaintRule"}}})
	h := &harness{t: t, ctx: ctx, client: client, edit: func(c *Config) { c.AllocationMode = mode }}
	for _, o := range append(testObjects(t), extra...) {
		h.create(o)
	}
	h.start()
	if h.c.podGroups == nil {
		t.Fatal("the controller does not read PodGroups though discovery lists them")
	}
	return h
}

func (h *harness) allocatedClaims() int {
	h.t.Helper()
	claims, err := h.client.ResourceV1().ResourceClaims("").List(h.ctx, metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	n := 0
	for _, cl := range claims.Items {
		if cl.Status.Allocation != nil {
			n++
		}
	}
	return n
}

func podGroupsServed() []*metav1.APIResourceList {
	return []*metav1.APIResourceList{{GroupVersion: schedulingv1beta1.SchemeGroupVersion.String(),
		APIResources: []metav1.APIResource{{Name: "podgroups", Kind: "PodGroup", Namespaced: true}}}}
}

// podGroup is a PodGroup with a gang of minCount (none when 0) and a
// topology key (none when empty).
func podGroup(name string, minCount int32, key string) *schedulingv1beta1.PodGroup {
	pg := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}}
	if minCount > 0 {
		pg.Spec.SchedulingPolicy.Gang = &schedulingv1beta1.GangSchedulingPolicy{MinCount: minCount}
	} else {
		pg.Spec.SchedulingPolicy.Basic = &schedulingv1beta1.BasicSchedulingPolicy{}
	}
	pg.Spec.SchedulingConstraints = &schedulingv1beta1.PodGroupSchedulingConstraints{}
	if key != "" {
		pg.Spec.SchedulingConstraints.Topology = []schedulingv1beta1.TopologyConstraint{{Key: key}}
	}
	return pg
}

func withPodGroup(p *v1.Pod, name string) *v1.Pod {
	p.Spec.SchedulingGroup = &v1.PodSchedulingGroup{PodGroupName: ptr.To(name)}
	return p
}
