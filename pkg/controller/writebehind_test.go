package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
)

// writeBehindHarness is a harness whose controller writes up to four
// groups beside the worker, and whose claim status writes for claim hold
// wait until release is called; held receives each of them as it starts.
func writeBehindHarness(t *testing.T, hold string, extra ...any) (h *harness, held chan *resourceapi.ResourceClaim, release func()) {
	h = newHarness(t, extra...)
	h.writeBeside(4)
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

// writeBeside has the harness's controller write the groups' claims and
// gates, and what waiting groups wait for, beside the worker, n groups of
// each at once, as New does with Config.WritingGroups n.
func (h *harness) writeBeside(n int) {
	h.c.cfg.WritingGroups = n
	h.c.writeSlots, h.c.statusSlots = make(chan struct{}, n), make(chan struct{}, n)
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
	addClaimSharers(h)
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

// A group whose writes keep failing backs off further on each failure,
// whether its writes run beside the worker or not: the sync that starts
// writes beside the worker does not forget the group's failures, their
// end does.
func TestFailedWritesBackOffFurtherEachTime(t *testing.T) {
	for _, slots := range []int{0, 4} {
		t.Run(fmt.Sprint("WritingGroups=", slots), func(t *testing.T) {
			h := newHarness(t, job("a", 1))
			if slots > 0 {
				h.writeBeside(slots)
			}
			h.client.PrependReactor("update", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if u, ok := a.(k8stesting.UpdateAction); ok && a.GetSubresource() == "status" && u.GetObject().(*resourceapi.ResourceClaim).Name == "a-0-gpus" {
					return true, nil, apierrors.NewForbidden(resourceapi.Resource("resourceclaims"), "a-0-gpus", errors.New("denied by policy"))
				}
				return false, nil, nil
			})
			h.addPod(jobPod("a", 0, "gpu-8-node", nil))
			h.settle()
			var got []int
			for range 4 {
				h.c.syncKey(h.ctx, "default/job/a") // as the worker does
				h.c.waitWrites()
				got = append(got, h.c.queue.NumRequeues("default/job/a"))
			}
			if want := []int{1, 2, 3, 4}; !slices.Equal(got, want) {
				t.Errorf("failures counted after each failed write: %v, want %v (the backoff does not grow towards RetryInterval)", got, want)
			}
		})
	}
}

// A group that reads a claim another group is writing waits for those
// writes; when they end before the informer shows them, the group is
// synced again once the informer does, though the claim's event syncs
// only the claim's allocating group and its owner's.
func TestGroupWaitingOnAnotherGroupsWriteIsSyncedWhenTheInformerShowsIt(t *testing.T) {
	var pmu sync.Mutex
	paused := false
	resume := sync.NewCond(&pmu)
	h := newHarnessWith(t, func(h *harness) {
		versionClaims(h)
		// A claim watch that holds its events while paused.
		h.client.PrependWatchReactor("resourceclaims", func(a k8stesting.Action) (bool, watch.Interface, error) {
			var opts metav1.ListOptions
			if wa, ok := a.(k8stesting.WatchActionImpl); ok {
				opts = wa.ListOptions
			}
			in, err := h.client.Tracker().Watch(a.GetResource(), a.GetNamespace(), opts)
			if err != nil {
				return false, nil, err
			}
			ch := make(chan watch.Event)
			out := watch.NewProxyWatcher(ch)
			go func() {
				defer out.Stop()
				for ev := range in.ResultChan() {
					pmu.Lock()
					for paused {
						resume.Wait()
					}
					pmu.Unlock()
					select {
					case ch <- ev:
					case <-out.StopChan():
						in.Stop()
						return
					}
				}
			}()
			return true, out, nil
		})
	}, job("a", 1), job("c", 1))
	h.writeBeside(4)
	held := make(chan struct{}, 4)
	released := make(chan struct{})
	release := sync.OnceFunc(func() { close(released) })
	t.Cleanup(release)
	h.c.cfg.Client = heldClaimWrites{Interface: h.client, hold: func(cl *resourceapi.ResourceClaim) func() {
		if cl.Name == "a-0-gpus" && cl.Status.Allocation != nil {
			held <- struct{}{}
			<-released
		}
		return func() {}
	}}
	addClaimSharers(h)
	<-held
	h.drain()
	h.syncReturns("default/job/c") // waits for a's writes
	pmu.Lock()
	paused = true // the informer lags behind a's write
	pmu.Unlock()
	release()
	h.c.waitWrites()
	h.drain()
	h.c.syncKey(h.ctx, "default/job/c") // woken by a's writes; the claim lags
	pmu.Lock()
	paused = false
	resume.Broadcast()
	pmu.Unlock()
	h.eventually("a's allocation in the informer", func() bool {
		cl, err := h.c.claims.ResourceClaims("default").Get("a-0-gpus")
		return err == nil && cl.Status.Allocation != nil
	})
	h.eventually("group c queued again", func() bool {
		return slices.Contains(h.drain(), "default/job/c")
	})
}

// versionClaims makes the fake API server give claims resourceVersions
// and refuse updates from a stale one, as the real one does.
func versionClaims(h *harness) {
	var mu sync.Mutex
	rv := int64(1000)
	h.client.PrependReactor("*", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetVerb() != "create" && a.GetVerb() != "update" {
			return false, nil, nil
		}
		obj, ok := a.(interface{ GetObject() runtime.Object }).GetObject().(*resourceapi.ResourceClaim)
		if !ok {
			return false, nil, nil
		}
		mu.Lock()
		defer mu.Unlock()
		if a.GetVerb() == "update" && obj.ResourceVersion != "" {
			cur, err := h.client.Tracker().Get(a.GetResource(), obj.Namespace, obj.Name)
			if err == nil && cur.(*resourceapi.ResourceClaim).ResourceVersion != obj.ResourceVersion {
				return true, nil, apierrors.NewConflict(resourceapi.Resource("resourceclaims"), obj.Name, errors.New("the object has been modified"))
			}
		}
		rv++
		obj.ResourceVersion = fmt.Sprint(rv)
		return false, nil, nil
	})
}

// addClaimSharers adds pod a-0 with a claim of its own and pod c-0, of
// group c, naming that claim, and syncs group a, which writes the claim.
func addClaimSharers(h *harness) {
	h.addPod(jobPod("a", 0, "gpu-8-node", nil))
	c := jobPod("c", 0, "gpu-8-node", nil)
	c.Spec.ResourceClaims = []v1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To("a-0-gpus")}}
	h.create(c)
	h.settle()
	h.syncReturns("default/job/a")
}

// heldPodPatches wraps a client so that patches of pod hold, other than
// of its status, wait until release is called; held receives each as it
// starts.
type heldPodPatches struct {
	kubernetes.Interface
	hold    string
	held    chan string
	release chan struct{}
}

func (c heldPodPatches) CoreV1() corev1client.CoreV1Interface {
	return heldCoreV1{c.Interface.CoreV1(), c}
}

type heldCoreV1 struct {
	corev1client.CoreV1Interface
	c heldPodPatches
}

func (c heldCoreV1) Pods(ns string) corev1client.PodInterface {
	return heldPods{c.CoreV1Interface.Pods(ns), c.c}
}

type heldPods struct {
	corev1client.PodInterface
	c heldPodPatches
}

func (p heldPods) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) (*v1.Pod, error) {
	if name == p.c.hold && len(sub) == 0 {
		p.c.held <- string(data)
		<-p.c.release
	}
	return p.PodInterface.Patch(ctx, name, pt, data, opts, sub...)
}

// What a waiting group's pods wait for is written beside the worker: a
// slow status write neither holds the worker nor keeps another group,
// ready meanwhile, from being planned and written; the waiting group
// itself, synced meanwhile, is synced again once its status is written.
func TestWaitingStatusIsWrittenBesideTheWorker(t *testing.T) {
	h := newHarness(t, job("a", 2), job("b", 1))
	h.writeBeside(4)
	held, release := make(chan string, 4), make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce)
	h.c.cfg.Client = heldPodPatches{Interface: h.client, hold: "a-0", held: held, release: release}
	h.addPod(jobPod("a", 0, "gpu-8-node", nil)) // a-1 does not exist yet
	h.settle()
	h.syncReturns("default/job/a")
	select {
	case patch := <-held:
		if !strings.Contains(patch, placement.StatusWaitingForPods) {
			t.Errorf("a-0's held patch %s does not say it waits for its group's pods", patch)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a-0's status was never written")
	}
	h.syncReturns("default/job/a") // deferred: its status write is in flight
	h.addPod(jobPod("b", 0, "gpu-8-node", nil))
	h.settle()
	h.syncReturns("default/job/b")
	h.eventually("b's allocation", func() bool {
		cl, err := h.c.claims.ResourceClaims("default").Get("b-0-gpus")
		return err == nil && cl.Status.Allocation != nil
	})
	h.c.mu.Lock()
	w := h.c.writing["default/job/a"]
	h.c.mu.Unlock()
	if w == nil || !w.missed {
		t.Errorf("a's status write in flight: %+v, want one that a's deferred sync marked missed", w)
	}
	releaseOnce()
	h.c.waitWrites()
	if got := h.pod("a-0").Annotations[placement.AnnotationStatus]; !strings.HasPrefix(got, placement.StatusWaitingForPods) {
		t.Errorf("a-0's status %q, want %s", got, placement.StatusWaitingForPods)
	}
}
