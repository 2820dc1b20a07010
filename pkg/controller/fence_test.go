package controller

import (
	"context"
	"slices"
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

// A device two claims held goes blind when one gives it back, as it
// drops out of kube-scheduler's set of allocated devices; it stops being
// blind once no claim holds it. A claim that changes but keeps its
// devices gives nothing back.
func TestClaimIndexBlindAfterClash(t *testing.T) {
	ix := newClaimIndex()
	var told []string
	ix.gaveBack = func(d structured.DeviceID) { told = append(told, d.Device.String()) }
	gpu0 := devicefit.DeviceID(topology.DriverName, "n0", "gpu-0")
	look := func() (bool, int) { return ix.isBlind(gpu0) }

	a := foreignClaim("a", "n0", "gpu-0", "gpu-1")
	a.ResourceVersion = "1"
	ix.update(a)
	b := foreignClaim("b", "n0", "gpu-0")
	b.ResourceVersion = "2"
	if clash := ix.update(b); len(clash) != 1 {
		t.Fatalf("claim b clashes with %v, want claim a", clash)
	}
	b = b.DeepCopy()
	b.ResourceVersion = "3"
	b.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: "p"}}
	ix.update(b)
	if blind, holders := look(); blind || holders != 2 {
		t.Errorf("after claim b changed but kept its device: blind %v, %d holders; want false, 2", blind, holders)
	}
	if len(told) != 0 {
		t.Errorf("devices given back: %v, want none", told)
	}

	// b is given back: gpu-0 is blind, a still holds it.
	b = b.DeepCopy()
	b.ResourceVersion = "4"
	b.Status.Allocation, b.Status.ReservedFor = nil, nil
	ix.update(b)
	if blind, holders := look(); !blind || holders != 1 {
		t.Errorf("after claim b gave gpu-0 back: blind %v, %d holders; want true, 1", blind, holders)
	}
	if diff := cmp.Diff([]string{"gpu-0"}, told); diff != "" {
		t.Errorf("devices given back (-want +got):\n%s", diff)
	}
	if got := ix.holderKeys(gpu0); !slices.Equal(got, []string{"default/a"}) {
		t.Errorf("holders of gpu-0: %v, want default/a", got)
	}

	// a is deleted: nothing holds gpu-0 or gpu-1, nothing is blind.
	ix.remove(a.UID)
	if blind, holders := look(); blind || holders != 0 {
		t.Errorf("after claim a went: blind %v, %d holders; want false, 0", blind, holders)
	}
	if diff := cmp.Diff([]string{"gpu-0", "gpu-0", "gpu-1"}, told); diff != "" {
		t.Errorf("devices given back (-want +got):\n%s", diff)
	}
	// A device held by one claim only is never blind when it goes.
	ix.update(foreignClaim("c", "n0", "gpu-2"))
	ix.remove("claim-c")
	if blind, _ := ix.isBlind(devicefit.DeviceID(topology.DriverName, "n0", "gpu-2")); blind {
		t.Error("gpu-2, held by one claim, is blind after it went")
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
	ix.update(a)
	ix.update(b)
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
	b = b.DeepCopy()
	b.ResourceVersion = "9"
	b.Status.Allocation = nil
	ix.update(b)
	drain()
	if got := list(); len(got) != 1 || fenced != 1 {
		t.Errorf("after claim b was given back: %d rules, %d written; want 1, 1", len(got), fenced)
	}

	// A controller that restarts knows nothing blind, but keeps the rule
	// while a holds gpu-0, and removes it once a goes.
	ix2 := newClaimIndex()
	ix2.update(a)
	fn.index = ix2
	ix2.gaveBack = fn.gaveBack
	if err := fn.resync(); err != nil {
		t.Fatal(err)
	}
	drain()
	if got := list(); len(got) != 1 {
		t.Errorf("after a restart, while claim a holds gpu-0: %d rules, want 1", len(got))
	}
	ix2.remove(a.UID)
	drain()
	if got := list(); len(got) != 0 {
		t.Errorf("after claim a went: %d rules, want none", len(got))
	}
	waitRules(0)

	// A clash resolved by someone else (a's pod deleted, its claim with
	// it) is fenced once the index sees the claim go.
	ix2.update(a)
	ix2.update(foreignClaim("c", "n0", "gpu-0"))
	ix2.remove(a.UID)
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
