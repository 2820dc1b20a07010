package controller

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"
)

// writeBehindHarness is a harness whose controller writes up to four
// groups beside the worker, and whose claim status writes for claim hold
// wait until release is called; held receives each of them as it starts.
func writeBehindHarness(t *testing.T, hold string, extra ...any) (h *harness, held chan *resourceapi.ResourceClaim, release func()) {
	h = newHarness(t, extra...)
	h.c.cfg.WritingGroups = 4
	h.c.writeSlots = make(chan struct{}, 4)
	held = make(chan *resourceapi.ResourceClaim, 8)
	released := make(chan struct{})
	release = sync.OnceFunc(func() { close(released) })
	t.Cleanup(release)
	h.c.cfg.Client = heldClaimWrites{Interface: h.client, hold: func(cl *resourceapi.ResourceClaim) func() {
		if cl.Name == hold && cl.Status.Allocation != nil {
			held <- cl.DeepCopy()
			<-released
		}
		return func() {}
	}}
	return h, held, release
}

// syncReturns runs one sync of key as the worker does and fails the test
// unless it returns within two seconds.
func (h *harness) syncReturns(key string) {
	h.t.Helper()
	returned := make(chan struct{})
	go func() {
		h.c.syncKey(h.ctx, key)
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(2 * time.Second):
		h.t.Fatalf("the sync of %s waited for its writes", key)
	}
}

func heldNode(t *testing.T, held chan *resourceapi.ResourceClaim) string {
	t.Helper()
	select {
	case cl := <-held:
		return allocationNode(cl.Status.Allocation)
	case <-time.After(5 * time.Second):
		t.Fatal("the held claim's allocation was never written")
		return ""
	}
}

func indexed(h *harness, uid types.UID) indexedClaim {
	h.c.index.mu.Lock()
	defer h.c.index.mu.Unlock()
	return h.c.index.claims[uid]
}

// While one group's allocation is being written, the worker plans the
// next group, which counts the devices in flight as taken; a sync of the
// writing group asked for meanwhile neither plans it again nor waits.
func TestNextGroupIsPlannedAroundWritesInFlight(t *testing.T) {
	h, held, release := writeBehindHarness(t, "a-0-gpus", job("a", 1), job("b", 1))
	h.addPod(jobPod("a", 0, "gpu-8-node", nil))
	h.addPod(jobPod("b", 0, "gpu-8-node", nil))
	h.settle()
	h.syncReturns("default/job/a")
	nodeA := heldNode(t, held)
	h.syncReturns("default/job/a") // deferred: its writes are in flight
	if n := testutil.ToFloat64(h.c.cfg.Metrics.WritingGroups); n != 1 {
		t.Errorf("writing_groups = %v while a's writes are in flight, want 1", n)
	}
	h.syncReturns("default/job/b")
	h.eventually("b's allocation", func() bool {
		cl, err := h.c.claims.ResourceClaims("default").Get("b-0-gpus")
		return err == nil && cl.Status.Allocation != nil
	})
	if nodeB := allocationNode(h.claim("b-0-gpus").Status.Allocation); nodeB == nodeA {
		t.Errorf("b was planned on node %s, whose devices a's write in flight holds", nodeB)
	}
	release()
	h.c.waitWrites()
	h.settle()
	if got := h.allocatedNode("a-0"); got != nodeA {
		t.Errorf("a's claim allocated on %q, want %s as written", got, nodeA)
	}
	writes := 0
	for _, a := range h.client.Actions() {
		if u, ok := a.(k8stesting.UpdateAction); ok && a.GetSubresource() == "status" && a.GetResource().Resource == "resourceclaims" && u.GetObject().(*resourceapi.ResourceClaim).Name == "a-0-gpus" {
			writes++
		}
	}
	if writes != 1 {
		t.Errorf("a's claim status written %d times, want once: the sync during its writes planned it again", writes)
	}
	time.Sleep(h.c.cfg.SettleDelay)
	h.sync("default/job/a")
	h.c.waitWrites()
	h.settle()
	if hasGate(h.pod("a-0")) {
		t.Error("a's gate stayed closed after its writes ended")
	}
}

// A write that fails gives the devices its plan assumed back, and the
// group backs off as a failed sync does.
func TestFailedWriteInFlightGivesItsDevicesBack(t *testing.T) {
	h, held, release := writeBehindHarness(t, "a-0-gpus", job("a", 1))
	h.client.PrependReactor("update", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if u, ok := a.(k8stesting.UpdateAction); ok && a.GetSubresource() == "status" && u.GetObject().(*resourceapi.ResourceClaim).Name == "a-0-gpus" {
			return true, nil, apierrors.NewInternalError(errors.New("etcd is down"))
		}
		return false, nil, nil
	})
	h.addPod(jobPod("a", 0, "gpu-8-node", nil))
	h.settle()
	claim := h.claim("a-0-gpus")
	h.syncReturns("default/job/a")
	heldNode(t, held)
	if devs := indexed(h, claim.UID).devices; len(devs) == 0 {
		t.Fatal("the devices of the write in flight are not counted as taken")
	}
	release()
	h.c.waitWrites()
	if ic := indexed(h, claim.UID); len(ic.devices) > 0 || ic.writer != "" {
		t.Errorf("the failed write's devices are still held: %+v", ic)
	}
	h.c.index.mu.Lock()
	if h.c.index.held.Len() != 0 {
		t.Errorf("devices held after the failed write: %v", h.c.index.held.UnsortedList())
	}
	h.c.index.mu.Unlock()
	if n := h.c.queue.NumRequeues("default/job/a"); n != 1 {
		t.Errorf("the group was requeued with backoff %d times, want once", n)
	}
	if h.claim("a-0-gpus").Status.Allocation != nil || !hasGate(h.pod("a-0")) {
		t.Error("the failed group's claim is allocated or its gate open")
	}
}

// A group that reads a claim another group is writing waits, and is
// synced again once those writes end.
func TestGroupReadingAClaimInFlightWaitsForItsWrites(t *testing.T) {
	h, held, release := writeBehindHarness(t, "a-0-gpus", job("a", 1), job("c", 1))
	h.addPod(jobPod("a", 0, "gpu-8-node", nil))
	c := jobPod("c", 0, "gpu-8-node", nil)
	c.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To("a-0-gpus")}}
	h.create(c)
	h.settle()
	h.syncReturns("default/job/a")
	heldNode(t, held)
	h.drain()
	before := len(h.client.Actions())
	h.syncReturns("default/job/c")
	if n := len(h.client.Actions()) - before; n != 0 {
		t.Errorf("the sync of c made %d writes while the claim it reads was being written", n)
	}
	h.c.mu.Lock()
	waiting := h.c.writing["default/job/a"] != nil && slices.Contains(h.c.writing["default/job/a"].waiters, "default/job/c")
	h.c.mu.Unlock()
	if !waiting {
		t.Fatal("c does not wait for a's writes")
	}
	release()
	h.c.waitWrites()
	if queued := h.drain(); !slices.Contains(queued, "default/job/c") {
		t.Errorf("queued %v after a's writes ended, want c", queued)
	}
}

// Once a group's gates are opened beside the worker, the informer may
// still show its pods gated when the group is synced next: the gates are
// not opened again (the pods may be bound by then, and nominating a bound
// pod is refused), the group waits for the pods' events.
func TestGatesOpenedButNotSeenYetAreNotOpenedAgain(t *testing.T) {
	h := placeOnePodJob(t, "j", "gpu-8-node")
	time.Sleep(h.c.cfg.SettleDelay)
	h.c.mu.Lock()
	h.c.opened[h.pod("j-0").UID] = time.Now()
	h.c.mu.Unlock()
	before := len(h.client.Actions())
	if _, err := h.c.sync(h.ctx, "default/job/j"); err != nil {
		t.Fatal(err)
	}
	for _, a := range h.client.Actions()[before:] {
		if a.GetVerb() == "patch" && a.GetResource().Resource == "pods" {
			t.Errorf("the sync wrote the pod again (%s %s) although its gate was opened", a.GetVerb(), a.GetSubresource())
		}
	}
}
