package controller

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2/ktesting"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/topology"
)

// The index keeps kube-scheduler's set of allocated devices from the same
// claim events: a device two claims held goes blind when one gives it
// back (deallocated or deleted); it stops being blind once no claim holds
// it, or when a claim is allocated it anew. A claim that changes but
// keeps its allocation changes nothing, and a device one claim held is
// never blind when it goes.
func TestClaimIndexBlindAfterClash(t *testing.T) {
	ix := newClaimIndex()
	var told []string
	ix.gaveBack = func(d structured.DeviceID) { told = append(told, d.Device.String()) }
	gpu0 := devicefit.DeviceID(topology.DriverName, "n0", "gpu-0")
	check := func(when string, wantBlind bool, wantHolders int) {
		t.Helper()
		if blind, holders := ix.isBlind(gpu0); blind != wantBlind || holders != wantHolders {
			t.Errorf("%s: gpu-0 blind %v, %d holders; want %v, %d", when, blind, holders, wantBlind, wantHolders)
		}
	}

	a := foreignClaim("a", "n0", "gpu-0", "gpu-1")
	ix.observe(nil, a)
	bFree := foreignClaim("b", "n0")
	bFree.Status.Allocation = nil
	ix.observe(nil, bFree)
	b := foreignClaim("b", "n0", "gpu-0")
	ix.observe(bFree, b)
	check("after claim b got gpu-0 too", false, 2)
	bReserved := b.DeepCopy()
	bReserved.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: "p"}}
	ix.observe(b, bReserved)
	check("after claim b changed but kept its allocation", false, 2)
	if len(told) != 0 {
		t.Errorf("devices told: %v, want none", told)
	}

	// b is given back: gpu-0 is blind, a still holds it.
	ix.observe(bReserved, bFree)
	check("after claim b gave gpu-0 back", true, 1)
	if diff := cmp.Diff([]string{"gpu-0"}, told); diff != "" {
		t.Errorf("devices told (-want +got):\n%s", diff)
	}

	// c is allocated gpu-0 (a clash again): kube-scheduler counts it again.
	c := foreignClaim("c", "n0", "gpu-0")
	ix.observe(nil, c)
	check("after claim c was allocated gpu-0", false, 2)
	ix.observe(c, nil)
	check("after claim c was deleted", true, 1)

	// a is deleted: nothing holds gpu-0 or gpu-1, nothing is blind.
	ix.observe(a, nil)
	check("after claim a went", false, 0)
	if diff := cmp.Diff([]string{"gpu-0", "gpu-0", "gpu-0", "gpu-1"}, told); diff != "" {
		t.Errorf("devices told (-want +got):\n%s", diff)
	}
	// A device held by one claim only is never blind when it goes.
	d := foreignClaim("d", "n0", "gpu-2")
	ix.observe(nil, d)
	ix.observe(d, nil)
	if blind, _ := ix.isBlind(devicefit.DeviceID(topology.DriverName, "n0", "gpu-2")); blind {
		t.Error("gpu-2, held by one claim, is blind after it went")
	}
}

// The controller's own write reaches the index before its event: a claim
// it gives back before the event of the scheduler's clashing allocation
// arrives still leaves the device blind, as kube-scheduler sees the events
// in their order (allocated, the clash, given back).
func TestClaimIndexBlindFollowsTheEventOrder(t *testing.T) {
	ix := newClaimIndex()
	gpu0 := devicefit.DeviceID(topology.DriverName, "n0", "gpu-0")
	q := foreignClaim("q", "n0", "gpu-0")
	q.ResourceVersion = "1"
	ix.update(q) // the controller's write
	given := q.DeepCopy()
	given.ResourceVersion = "3"
	given.Status.Allocation = nil
	ix.update(given) // and its release, before any event
	a := foreignClaim("a", "n0", "gpu-0")
	a.ResourceVersion = "2"
	ix.update(a)
	ix.observe(nil, q)   // event: q allocated (rv 1)
	ix.observe(nil, a)   // event: a allocated (rv 2), the clash
	ix.observe(q, given) // event: q given back (rv 3)
	if blind, holders := ix.isBlind(gpu0); !blind || holders != 1 {
		t.Errorf("gpu-0 blind %v, %d holders; want true, 1", blind, holders)
	}
}

func TestDecideFence(t *testing.T) {
	for _, tc := range []struct {
		name    string
		blind   bool
		holders int
		ruled   bool
		want    fenceAction
	}{
		{"blind and held: fence", true, 1, false, fenceCreate},
		{"blind, held and fenced: keep", true, 1, true, fenceKeep},
		{"fenced, held, not known blind (after a restart): keep", false, 1, true, fenceKeep},
		{"fenced, no longer held: remove", false, 0, true, fenceDelete},
		{"held by one claim that never clashed: nothing", false, 1, false, fenceKeep},
		{"held by two claims at once: nothing yet", false, 2, false, fenceKeep},
		{"free and not fenced: nothing", false, 0, false, fenceKeep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := decideFence(tc.blind, tc.holders, tc.ruled); got != tc.want {
				t.Errorf("decideFence(blind %v, %d holders, fenced %v) = %v, want %v", tc.blind, tc.holders, tc.ruled, got, tc.want)
			}
		})
	}
}

// The fencer writes a NoSchedule DeviceTaintRule on exactly the blind
// device, fences before the controller gives back a claim that shares a
// device, and removes the rule once nothing holds the device; a rule that
// a restarted controller finds stays while its device is held.
func TestFencer(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := fake.NewClientset()
	f := informers.NewSharedInformerFactory(client, 0)
	rules := f.Resource().V1().DeviceTaintRules()
	ix := newClaimIndex()
	fenced := 0
	fn := newFencer(client, rules.Lister(), ix, func() { fenced++ })
	if _, err := rules.Informer().AddEventHandler(fn.handler()); err != nil {
		t.Fatal(err)
	}
	ix.gaveBack = fn.gaveBack
	f.Start(ctx.Done())
	f.WaitForCacheSync(ctx.Done())
	gpu0 := devicefit.DeviceID(topology.DriverName, "n0", "gpu-0")
	drain := func() {
		t.Helper()
		for fn.queue.Len() > 0 {
			fn.next(ctx)
		}
	}
	list := func() []resourceapi.DeviceTaintRule {
		t.Helper()
		l, err := client.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	waitRules := func(n int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			l, _ := rules.Lister().List(everything)
			if len(l) == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the informer holds %d rules, want %d", len(l), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// The controller gives back its claim b, which shares gpu-0 with a:
	// the fence comes first.
	a := foreignClaim("a", "n0", "gpu-0")
	b := foreignClaim("b", "n0", "gpu-0", "gpu-1")
	for _, cl := range []*resourceapi.ResourceClaim{a, b} {
		ix.update(cl)
		ix.observe(nil, cl)
	}
	if err := fn.beforeGivingBack(ctx, b); err != nil {
		t.Fatal(err)
	}
	got := list()
	if len(got) != 1 {
		t.Fatalf("%d rules before claim b is given back, want 1 (gpu-0's)", len(got))
	}
	r := got[0]
	if s := r.Spec.DeviceSelector; s == nil || *s.Driver != topology.DriverName || *s.Pool != "n0" || *s.Device != "gpu-0" {
		t.Errorf("rule %s selects %+v, want gpu-0 of n0", r.Name, s)
	}
	if r.Spec.Taint.Key != topology.TaintFenced || r.Spec.Taint.Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Errorf("rule %s taints %s:%s, want %s:NoSchedule", r.Name, r.Spec.Taint.Key, r.Spec.Taint.Effect, topology.TaintFenced)
	}
	if r.Name != fenceName(gpu0) || r.Labels[topology.LabelFence] != "true" || r.Annotations[topology.AnnotationFenceReason] == "" {
		t.Errorf("rule %s, labels %v, annotations %v: want %s, the fence label and a reason", r.Name, r.Labels, r.Annotations, fenceName(gpu0))
	}
	waitRules(1)

	// b is given back; gpu-1 was b's alone and is not fenced.
	given := b.DeepCopy()
	given.ResourceVersion = "9"
	given.Status.Allocation = nil
	ix.update(given)
	ix.observe(b, given)
	drain()
	if got := list(); len(got) != 1 || fenced != 1 {
		t.Errorf("after claim b was given back: %d rules, %d written; want 1, 1", len(got), fenced)
	}

	// A controller that restarts knows nothing blind, but keeps the rule
	// while a holds gpu-0, and removes it once a goes.
	ix2 := newClaimIndex()
	ix2.observe(nil, a)
	fn.index = ix2
	ix2.gaveBack = fn.gaveBack
	if err := fn.resync(); err != nil {
		t.Fatal(err)
	}
	drain()
	if got := list(); len(got) != 1 {
		t.Errorf("after a restart, while claim a holds gpu-0: %d rules, want 1", len(got))
	}
	ix2.observe(a, nil)
	drain()
	if got := list(); len(got) != 0 {
		t.Errorf("after claim a went: %d rules, want none", len(got))
	}
	waitRules(0)

	// A clash resolved by someone else (a's pod deleted, its claim with
	// it) is fenced once the index sees the claim go.
	ix2.observe(nil, a)
	ix2.observe(nil, foreignClaim("c", "n0", "gpu-0"))
	ix2.observe(a, nil)
	drain()
	if got := list(); len(got) != 1 || got[0].Name != fenceName(gpu0) {
		t.Errorf("after claim a went while c holds gpu-0: rules %v, want %s", got, fenceName(gpu0))
	}
	// A fence deleted by hand while the device is blind comes back.
	waitRules(1)
	if err := client.ResourceV1().DeviceTaintRules().Delete(ctx, fenceName(gpu0), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRules(0)
	drain()
	if got := list(); len(got) != 1 {
		t.Errorf("after the rule was deleted by hand while gpu-0 is blind: %d rules, want 1", len(got))
	}
}

// Rule names are valid object names, distinct per device, whatever the
// pool and device names hold.
func TestFenceName(t *testing.T) {
	seen := map[string]bool{}
	for _, d := range []structured.DeviceID{
		devicefit.DeviceID(topology.DriverName, "n0", "gpu-0"),
		devicefit.DeviceID(topology.DriverName, "n0", "gpu-1"),
		devicefit.DeviceID("other.example.com", "n0", "gpu-0"),
		devicefit.DeviceID(topology.DriverName, "Pool/With.Odd_Chars", "GPU_0"),
		devicefit.DeviceID(topology.DriverName, string(make([]byte, 300)), "gpu-0"),
	} {
		n := fenceName(d)
		if seen[n] {
			t.Errorf("%s: name %s taken by another device", d, n)
		}
		seen[n] = true
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			t.Errorf("%s: name %q: %v", d, n, errs)
		}
	}
}
