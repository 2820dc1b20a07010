package soak

import (
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	placementapi "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/demo/specs"
	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	gpuslices "github.com/gputopo/gputopo/pkg/slices"
	gputopology "github.com/gputopo/gputopo/pkg/topology"
	cluster "github.com/gputopo/gputopo/test/cluster"
)

// The checkers' own tests: each invariant is breached on purpose, on
// objects built here, and must be reported; the allowed cases next to
// each breach must not be. No cluster runs.

const driver = gputopology.DriverName

// t0 is the time of the first view in every test.
var t0 = time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)

// testNodes are two dgx-h100 nodes in one leaf; n1 publishes GPUs 0 and
// 1 for sharing.
func testNodes(t *testing.T) ([]corev1.Node, []resourcev1.ResourceSlice) {
	t.Helper()
	prof, err := sim.LoadBuiltin("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	var nodes []corev1.Node
	var out []resourcev1.ResourceSlice
	for _, name := range []string{"n0", "n1"} {
		spec := cluster.NodeSpec{Name: name, Spine: "spine-0", Leaf: "leaf-0", Profile: "dgx-h100"}
		if name == "n1" {
			spec.Labels = map[string]string{gputopology.LabelSharedGPUs: "0_1"}
		}
		labels := spec.AllLabels()
		res, err := gpuslices.Build(prof.Inventory(name), gpuslices.Node{Name: name, Labels: labels}, gpuslices.DefaultConfig(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range gpuslices.Objects(name, res) {
			out = append(out, *s)
		}
		alloc := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourcePods: resource.MustParse("110")}
		nodes = append(nodes, corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Status: corev1.NodeStatus{Allocatable: alloc, Capacity: alloc,
				Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
		})
	}
	return nodes, out
}

// allocated is a claim holding the devices of node, whole, reserved for
// the pods.
func allocated(name, node string, devices []string, pods ...*corev1.Pod) resourcev1.ResourceClaim {
	cl := resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)}}
	a := &resourcev1.AllocationResult{NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}}
	for _, d := range devices {
		a.Devices.Results = append(a.Devices.Results, resourcev1.DeviceRequestAllocationResult{Request: "gpus", Driver: driver, Pool: node, Device: d})
	}
	cl.Status.Allocation = a
	for _, p := range pods {
		cl.Status.ReservedFor = append(cl.Status.ReservedFor, resourcev1.ResourceClaimConsumerReference{Resource: "pods", Name: p.Name, UID: p.UID})
	}
	return cl
}

// share is a claim holding a share of milliGPU of a device.
func share(name, node, device string, milliGPU int64) resourcev1.ResourceClaim {
	cl := allocated(name, node, []string{device})
	r := &cl.Status.Allocation.Devices.Results[0]
	r.ShareID = ptr.To(types.UID("share-" + name))
	r.ConsumedCapacity = map[resourcev1.QualifiedName]resource.Quantity{"milliGPU": *resource.NewQuantity(milliGPU, resource.DecimalSI)}
	return cl
}

func TestDoubleAllocations(t *testing.T) {
	nodes, sl := testNodes(t)
	admin := allocated("admin", "n0", []string{"gpu-0"})
	admin.Status.Allocation.Devices.Results[0].AdminAccess = ptr.To(true)
	cases := map[string]struct {
		claims []resourcev1.ResourceClaim
		want   []string // all in the report; none means no breach
	}{
		"one device held whole by two claims": {
			claims: []resourcev1.ResourceClaim{allocated("a", "n0", []string{"gpu-0", "gpu-1"}), allocated("b", "n0", []string{"gpu-1"})},
			want:   []string{"device gpu.gputopo.dev/n0/gpu-1 is held whole by 2 claims", "claim ns/a", "claim ns/b"},
		},
		"a shared device held whole and in a share": {
			claims: []resourcev1.ResourceClaim{allocated("a", "n1", []string{"gpu-0"}), share("b", "n1", "gpu-0", 250)},
			want:   []string{"device gpu.gputopo.dev/n1/gpu-0 is held whole by one claim and in 1 shares", "claim ns/a", "claim ns/b", "milliGPU=250"},
		},
		"shares beyond the device's capacity": {
			claims: []resourcev1.ResourceClaim{share("a", "n1", "gpu-1", 500), share("b", "n1", "gpu-1", 500), share("c", "n1", "gpu-1", 250)},
			want:   []string{"device gpu.gputopo.dev/n1/gpu-1 is in 3 shares that consume more than it has (milliGPU 1250 of 1k)", "claim ns/c"},
		},
		"shares of a device not published for sharing": {
			claims: []resourcev1.ResourceClaim{share("a", "n0", "gpu-3", 250), share("b", "n0", "gpu-3", 250)},
			want:   []string{"device gpu.gputopo.dev/n0/gpu-3 is in 2 shares but not published with allowMultipleAllocations"},
		},
		"shares within capacity": {
			claims: []resourcev1.ResourceClaim{share("a", "n1", "gpu-1", 500), share("b", "n1", "gpu-1", 250), share("c", "n1", "gpu-1", 250)},
		},
		"admin access beside a whole claim": {
			claims: []resourcev1.ResourceClaim{allocated("a", "n0", []string{"gpu-0"}), admin},
		},
		"different devices": {
			claims: []resourcev1.ResourceClaim{allocated("a", "n0", []string{"gpu-0"}), allocated("b", "n0", []string{"gpu-1"}), allocated("c", "n1", []string{"gpu-0"})},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := doubleAllocations(&view{at: t0, claims: tc.claims, nodes: nodes, slices: sl})
			checkReport(t, got, tc.want)
		})
	}
}

func checkReport(t *testing.T, got string, want []string) {
	t.Helper()
	if len(want) == 0 {
		if got != "" {
			t.Errorf("reported a breach where there is none:\n%s", got)
		}
		return
	}
	if got == "" {
		t.Fatalf("no breach reported; want one saying %q", want)
	}
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("report does not say %q:\n%s", w, got)
		}
	}
}

func testPod(name string, phase corev1.PodPhase) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name)}, Status: corev1.PodStatus{Phase: phase}}
}

func TestUnconsumedClaims(t *testing.T) {
	c := newChecker(limits{unconsumed: time.Minute, waiting: 90 * time.Second})
	live := testPod("live", corev1.PodRunning)
	done := testPod("done", corev1.PodSucceeded)
	gone := testPod("gone", corev1.PodRunning)
	claims := []resourcev1.ResourceClaim{
		allocated("held", "n0", []string{"gpu-0"}, live, gone),
		allocated("orphan", "n0", []string{"gpu-1"}, gone),
		allocated("finished", "n0", []string{"gpu-2"}, done),
		allocated("nobody", "n0", []string{"gpu-3"}),
		{ObjectMeta: metav1.ObjectMeta{Name: "free", Namespace: "ns", UID: "uid-free"}},
	}
	pods := []corev1.Pod{*live, *done}
	at := func(d time.Duration) string {
		return c.unconsumedClaims(&view{at: t0.Add(d), claims: claims, pods: pods})
	}
	checkReport(t, at(0), nil)
	checkReport(t, at(time.Minute), nil)
	got := at(time.Minute + time.Second)
	checkReport(t, got, []string{
		"claim ns/orphan (uid uid-orphan", "without a live consumer since 10:00:00.000 (1m1s, more than 1m0s): reserved for pods gone (uid uid-gone, gone)",
		"claim ns/finished", "pods done (uid uid-done, phase Succeeded)",
		"claim ns/nobody", "reserved for nobody", "n0/gpu-3",
	})
	if strings.Contains(got, "ns/held") || strings.Contains(got, "ns/free") {
		t.Errorf("reported a claim with a live consumer or without an allocation:\n%s", got)
	}

	// A consumer that comes back restarts the clock.
	claims = claims[:2]
	pods = append(pods, *gone)
	checkReport(t, at(2*time.Minute), nil)
	pods = pods[:2]
	checkReport(t, at(3*time.Minute), nil)
	checkReport(t, at(4*time.Minute), nil)
	checkReport(t, at(4*time.Minute+time.Second), []string{"claim ns/orphan", "since 10:03:00.000"})
}

// groupPod is an opted-in pod of a Job (or alone, without job) whose one
// claim, generated from template gpu-1, is named claim.
func groupPod(name string, job *batchv1.Job, claim string, created time.Time) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(created),
			Annotations:       map[string]string{placementapi.AnnotationPlacement: string(placementapi.PlacementAuto)}},
		Spec: corev1.PodSpec{
			SchedulingGates: []corev1.PodSchedulingGate{{Name: placementapi.SchedulingGate}},
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: ptr.To("gpu-1")}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodPending,
			ResourceClaimStatuses: []corev1.PodResourceClaimStatus{{Name: "gpus", ResourceClaimName: ptr.To(claim)}}},
	}
	if job != nil {
		p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID, Controller: ptr.To(true)}}
	}
	return p
}

func templateClaim(t *testing.T, tmpl, name string) resourcev1.ResourceClaim {
	t.Helper()
	rct, err := specs.ClaimTemplate(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	rct.Namespace = "ns"
	return *devicefit.ClaimFromTemplate(rct, name)
}

func TestWaitingPods(t *testing.T) {
	nodes, sl := testNodes(t)
	class, err := specs.DeviceClass()
	if err != nil {
		t.Fatal(err)
	}
	all := []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"}
	job := batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ns", UID: "uid-job-train"}, Spec: batchv1.JobSpec{Parallelism: ptr.To[int32](2)}}
	lim := limits{unconsumed: time.Minute, waiting: 90 * time.Second, reserved: 5 * time.Minute}
	// A two-pod Job, both pods gated since long before the first view.
	twoPods := func() ([]corev1.Pod, []resourcev1.ResourceClaim) {
		a, b := groupPod("train-0", &job, "train-0-gpus", t0.Add(-time.Hour)), groupPod("train-1", &job, "train-1-gpus", t0.Add(-time.Hour))
		return []corev1.Pod{*a, *b}, []resourcev1.ResourceClaim{templateClaim(t, "gpu-1", "train-0-gpus"), templateClaim(t, "gpu-1", "train-1-gpus")}
	}
	base := func() *view {
		return &view{nodes: nodes, slices: sl, classes: []resourcev1.DeviceClass{*class}, jobs: []batchv1.Job{job}}
	}

	t.Run("a group that fits waits too long", func(t *testing.T) {
		c := newChecker(lim)
		v := base()
		v.pods, v.claims = twoPods()
		for _, d := range []time.Duration{0, 30 * time.Second, 90 * time.Second} {
			v.at = t0.Add(d)
			checkReport(t, c.waitingPods(context.Background(), v), nil)
		}
		v.at = t0.Add(91 * time.Second)
		checkReport(t, c.waitingPods(context.Background(), v), []string{
			"pod ns/train-0 (uid uid-train-0", "gated: true", "of group ns/job/train has waited unbound 1m31s (more than 1m30s)",
			"in every check since 10:00:00.000", "planner's answer now: fits in", "train-0 → n", "train-1 → n",
			"pod ns/train-1",
		})
	})

	t.Run("a group that fits only the last minute", func(t *testing.T) {
		c := newChecker(lim)
		v := base()
		v.pods, v.claims = twoPods()
		// Every GPU is taken until the third view, then n1 frees up.
		full := append(v.claims, allocated("n0-all", "n0", all), allocated("n1-all", "n1", all))
		for _, d := range []time.Duration{0, time.Minute} {
			w := *v
			w.at, w.claims = t0.Add(d), full
			checkReport(t, c.waitingPods(context.Background(), &w), nil)
		}
		for _, d := range []time.Duration{2 * time.Minute, 3*time.Minute + 30*time.Second} {
			v.at = t0.Add(d)
			checkReport(t, c.waitingPods(context.Background(), v), nil)
		}
		v.at = t0.Add(3*time.Minute + 31*time.Second)
		checkReport(t, c.waitingPods(context.Background(), v), []string{"pod ns/train-0", "since 10:02:00.000"})
	})

	t.Run("a group that does not fit", func(t *testing.T) {
		c := newChecker(lim)
		v := base()
		v.pods, v.claims = twoPods()
		// n0 is full and n1's shared GPUs 0 and 1 hold shares: six whole
		// GPUs are free, but only on one node, and the Job's pods may
		// share it; take five of them, so only one pod fits.
		v.claims = append(v.claims, allocated("n0-all", "n0", all), allocated("n1-most", "n1", all[2:7]), share("s", "n1", "gpu-0", 500), share("s2", "n1", "gpu-1", 10))
		for _, d := range []time.Duration{0, time.Hour} {
			v.at = t0.Add(d)
			checkReport(t, c.waitingPods(context.Background(), v), nil)
		}
		if a := c.oracle.fits(context.Background(), v, pendingGroups(v)[0]); a.fits || !strings.Contains(a.plan, "no place") {
			t.Errorf("oracle: %+v, want no place", a)
		}
	})

	t.Run("an incomplete group", func(t *testing.T) {
		c := newChecker(lim)
		v := base()
		pods, claims := twoPods()
		v.pods, v.claims = pods[:1], claims[:1]
		for _, d := range []time.Duration{0, time.Hour} {
			v.at = t0.Add(d)
			checkReport(t, c.waitingPods(context.Background(), v), nil)
		}
		if a := c.oracle.fits(context.Background(), v, pendingGroups(v)[0]); !strings.Contains(a.plan, "not judged: 1 of its 2 pods exist") {
			t.Errorf("oracle: %+v, want not judged for the missing pod", a)
		}
		// A claim not created yet.
		v.pods, v.claims = pods, claims[:1]
		v.at = t0.Add(2 * time.Hour)
		checkReport(t, c.waitingPods(context.Background(), v), nil)
	})

	t.Run("a group held by another group's reservation", func(t *testing.T) {
		c := newChecker(lim)
		v := base()
		v.pods, v.claims = twoPods()
		v.pods[1].Annotations[placementapi.AnnotationStatus] = "Unschedulable: it fits only on nodes another group reserved: ns/job/big holds n0, n1"
		v.at = t0
		checkReport(t, c.waitingPods(context.Background(), v), nil)
		v.at = t0.Add(6*time.Minute + 30*time.Second)
		checkReport(t, c.waitingPods(context.Background(), v), nil)
		v.at = t0.Add(6*time.Minute + 31*time.Second)
		checkReport(t, c.waitingPods(context.Background(), v), []string{"more than 6m30s, a reservation elsewhere included"})
	})

	t.Run("a replacement pod beside a bound one", func(t *testing.T) {
		c := newChecker(lim)
		v := base()
		v.pods, v.claims = twoPods()
		bound := &v.pods[0]
		bound.Spec.NodeName, bound.Spec.SchedulingGates = "n0", nil
		bound.Annotations[placementapi.AnnotationDomain] = "leaf:leaf-0"
		v.claims[0] = allocated("train-0-gpus", "n0", all[:1], bound)
		// The replacement was created now; the clock starts then.
		v.pods[1].CreationTimestamp = metav1.NewTime(t0.Add(time.Minute))
		v.at = t0.Add(time.Minute)
		checkReport(t, c.waitingPods(context.Background(), v), nil)
		v.at = t0.Add(2*time.Minute + 31*time.Second)
		checkReport(t, c.waitingPods(context.Background(), v), []string{"pod ns/train-1", "1m31s", "fits in leaf:leaf-0"})
	})

	t.Run("a pod alone whose claim was allocated for it", func(t *testing.T) {
		// Ungated, allocated on n0, not bound: the claim is planned again.
		c := newChecker(lim)
		v := base()
		p := groupPod("solo", nil, "solo-gpus", t0)
		p.Spec.SchedulingGates = nil
		v.pods = []corev1.Pod{*p}
		v.claims = []resourcev1.ResourceClaim{allocated("solo-gpus", "n0", all[:1], p), allocated("rest", "n0", all[1:]),
			allocated("n1-rest", "n1", all[2:]), share("s0", "n1", "gpu-0", 1000), share("s1", "n1", "gpu-1", 1000)}
		v.at = t0
		checkReport(t, c.waitingPods(context.Background(), v), nil)
		v.at = t0.Add(91 * time.Second)
		checkReport(t, c.waitingPods(context.Background(), v), []string{"pod ns/solo", "gated: false", "group ns/pod/solo", "solo → n0"})
	})
}

func TestAllocatedClaims(t *testing.T) {
	p := testPod("p", corev1.PodRunning)
	free := resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "free", Namespace: "ns"}}
	checkReport(t, allocatedClaims(&view{claims: []resourcev1.ResourceClaim{free}}), nil)
	checkReport(t, allocatedClaims(&view{claims: []resourcev1.ResourceClaim{free, allocated("left", "n0", []string{"gpu-5"}, p)}}),
		[]string{"claim ns/left (uid uid-left", "allocated by the scheduler", "reserved for pods p (uid uid-p)", "[n0/gpu-5] on metadata.name In [n0]"})
}

// TestCheckStopsAtFirstBreach: check reports invariant 1 before it looks
// at the others, and counts the checks it ran.
func TestCheckStopsAtFirstBreach(t *testing.T) {
	nodes, sl := testNodes(t)
	c := newChecker(limits{unconsumed: time.Minute, waiting: 90 * time.Second})
	v := &view{at: t0, nodes: nodes, slices: sl, claims: []resourcev1.ResourceClaim{allocated("a", "n0", []string{"gpu-0"}), allocated("b", "n0", []string{"gpu-0"})}}
	b := c.check(context.Background(), v)
	if b == nil || b.invariant != invDevices {
		t.Fatalf("check = %v, want a breach of invariant %d", b, invDevices)
	}
	if c.checks[invDevices] != 1 || c.checks[invConsumer] != 0 {
		t.Errorf("checks counted %v, want only invariant 1 once", c.checks)
	}
	if s := b.String(); !strings.Contains(s, "invariant 1 (no device in two allocated claims") || !strings.Contains(s, "at 10:00:00.000") {
		t.Errorf("breach reads %q", s)
	}
}

// TestClashIsGivenTimeToBeTakenBack: two claims on one device, neither
// with a bound consumer (the controller's and the scheduler's, written in
// the same instant), breach only once the clash has lasted the limit; one
// that ends first counts as taken back; two bound consumers breach at once.
func TestClashIsGivenTimeToBeTakenBack(t *testing.T) {
	nodes, sl := testNodes(t)
	clashing := []resourcev1.ResourceClaim{allocated("a", "n0", []string{"gpu-0"}), allocated("b", "n0", []string{"gpu-0"})}
	c := newChecker(limits{unconsumed: time.Minute, waiting: 90 * time.Second, clash: 30 * time.Second})
	if b := c.check(context.Background(), &view{at: t0, nodes: nodes, slices: sl, claims: clashing}); b != nil && b.invariant == invDevices {
		t.Fatalf("a new clash of unbound claims breached at once: %v", b)
	}
	if b := c.check(context.Background(), &view{at: t0.Add(30 * time.Second), nodes: nodes, slices: sl, claims: clashing}); b == nil || b.invariant != invDevices || !strings.Contains(b.what, "longer than the 30s") {
		t.Fatalf("a clash that lasted the limit: %v, want a breach of invariant 1", b)
	}

	c = newChecker(limits{unconsumed: time.Minute, waiting: 90 * time.Second, clash: 30 * time.Second})
	c.check(context.Background(), &view{at: t0, nodes: nodes, slices: sl, claims: clashing})
	c.check(context.Background(), &view{at: t0.Add(time.Second), nodes: nodes, slices: sl, claims: clashing[:1]})
	if c.clashes != 1 || c.repaired != 1 {
		t.Errorf("clashes %d, taken back %d; want 1 and 1", c.clashes, c.repaired)
	}

	pa := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pa", UID: "uid-pa"}, Spec: corev1.PodSpec{NodeName: "n0"}}
	pb := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pb", UID: "uid-pb"}, Spec: corev1.PodSpec{NodeName: "n0"}}
	both := []resourcev1.ResourceClaim{allocated("a", "n0", []string{"gpu-0"}, pa), allocated("b", "n0", []string{"gpu-0"}, pb)}
	c = newChecker(limits{unconsumed: time.Minute, waiting: 90 * time.Second, clash: 30 * time.Second})
	if b := c.check(context.Background(), &view{at: t0, nodes: nodes, slices: sl, claims: both, pods: []corev1.Pod{*pa, *pb}}); b == nil || b.invariant != invDevices {
		t.Fatalf("two bound consumers on one device: %v, want a breach at once", b)
	}
}
