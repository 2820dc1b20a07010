package placement

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	placementapi "github.com/gputopo/gputopo/api/placement/v1alpha1"
)

// ledger follows every ResourceClaim of the cluster through one watch and
// checks, on each event in the order the API server wrote them, that no
// device is allocated to two claims at once for longer than the
// controller takes to resolve it. Results with a shareID or admin access
// do not hold their device alone and are not counted.
//
// Two writers allocate devices, the controller and kube-scheduler, and
// nothing in the API server keeps them apart: a controller write may race
// an allocation the scheduler had in flight. Such a clash is resolved by
// the controller (its pod, which has not started, gives way) within
// clashGrace; one that lasts longer, one still there at the end, and one
// between two allocations the controller did not write (kube-scheduler
// allocating a device it lost count of) is a violation.
//
// It also refuses new allocations on nodes that were closed (deleted, or
// tainted against every pod of the test) once the controller has shown it
// saw the node go.
type ledger struct {
	mu      sync.Mutex
	claims  map[types.UID]ledgerClaim
	holders map[string][]types.UID // driver/pool/device → claims
	closed  map[string]closedNode
	// onAllocated sees every claim whose allocation is new or moved, with
	// its node; it must not block.
	onAllocated func(claim *resourcev1.ResourceClaim, node string)
	events      int
	violations  []string
	done        chan struct{}
	// clashes are the open clashes between the controller's and the
	// scheduler's allocations, by device and claims; resolved counts
	// those that ended, the longest lasting longest.
	clashes  map[clashKey]openClash
	resolved int
	longest  time.Duration
}

// clashGrace is how long a clash between the controller's and the
// scheduler's allocations may last: the controller sees it in its claim
// index and gives its claim back on the group's next sync.
const clashGrace = 30 * time.Second

type clashKey struct {
	device string
	a, b   types.UID
}

type openClash struct {
	at   time.Time
	what string
}

type ledgerClaim struct {
	key, by, node string
	devices       []string
	reserved      int
}

// closedNode: no allocation on the node may be written after version rv.
type closedNode struct {
	why string
	rv  uint64
}

func (c ledgerClaim) String() string {
	by := c.by
	if by == "" {
		by = "the scheduler"
	}
	return fmt.Sprintf("%s (allocated by %s on %s, reserved for %d pods)", c.key, by, c.node, c.reserved)
}

func newLedger(onAllocated func(*resourcev1.ResourceClaim, string)) *ledger {
	return &ledger{claims: map[types.UID]ledgerClaim{}, holders: map[string][]types.UID{}, closed: map[string]closedNode{},
		onAllocated: onAllocated, done: make(chan struct{}), clashes: map[clashKey]openClash{}}
}

// startLedger lists the claims, checks them and follows them until the
// test ends. Call stop (or let the cleanup do it) before reading results.
func startLedger(t *testing.T, onAllocated func(*resourcev1.ResourceClaim, string)) (l *ledger, stop func()) {
	t.Helper()
	l = newLedger(onAllocated)
	ctx, cancel := context.WithCancel(context.Background())
	list, err := client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		cancel()
		t.Fatalf("list ResourceClaims: %v", err)
	}
	for i := range list.Items {
		l.apply(watch.Added, &list.Items[i])
	}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return client.ResourceV1().ResourceClaims("").Watch(ctx, opts)
		},
	})
	if err != nil {
		cancel()
		t.Fatalf("watch ResourceClaims: %v", err)
	}
	go func() {
		defer close(l.done)
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Added, watch.Modified, watch.Deleted:
				if c, ok := ev.Object.(*resourcev1.ResourceClaim); ok {
					l.apply(ev.Type, c)
				}
			case watch.Error:
				l.violate("the ResourceClaim watch failed: %v", ev.Object)
			}
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			w.Stop()
			cancel()
			<-l.done
		})
	}
	t.Cleanup(stop)
	return l, stop
}

// exclusiveDevices lists the devices an allocation holds on its own.
func exclusiveDevices(a *resourcev1.AllocationResult) []string {
	if a == nil {
		return nil
	}
	var out []string
	for _, r := range a.Devices.Results {
		if r.ShareID != nil || (r.AdminAccess != nil && *r.AdminAccess) {
			continue
		}
		out = append(out, r.Driver+"/"+r.Pool+"/"+r.Device)
	}
	return out
}

// allocationNode is the one node an allocation's node selector names.
func allocationNode(a *resourcev1.AllocationResult) string {
	if a == nil || a.NodeSelector == nil || len(a.NodeSelector.NodeSelectorTerms) != 1 {
		return ""
	}
	for _, r := range a.NodeSelector.NodeSelectorTerms[0].MatchFields {
		if r.Key == "metadata.name" && r.Operator == corev1.NodeSelectorOpIn && len(r.Values) == 1 {
			return r.Values[0]
		}
	}
	return ""
}

func (l *ledger) apply(typ watch.EventType, c *resourcev1.ResourceClaim) {
	l.mu.Lock()
	l.events++
	old, had := l.claims[c.UID]
	l.forget(c.UID)
	if typ == watch.Deleted {
		l.closeClashesLocked()
		l.mu.Unlock()
		return
	}
	cur := ledgerClaim{key: c.Namespace + "/" + c.Name, by: c.Annotations[placementapi.AnnotationAllocatedBy],
		node: allocationNode(c.Status.Allocation), devices: exclusiveDevices(c.Status.Allocation), reserved: len(c.Status.ReservedFor)}
	l.claims[c.UID] = cur
	for _, d := range cur.devices {
		for _, other := range l.holders[d] {
			what := fmt.Sprintf("device %s is allocated to two claims: %s and %s (event %d, resourceVersion %s)",
				d, cur, l.claims[other], l.events, c.ResourceVersion)
			if cur.by == "" && l.claims[other].by == "" {
				l.violate("%s, neither written by the controller: kube-scheduler allocated a device it lost count of", what)
				continue
			}
			k := clashKey{device: d, a: min(other, c.UID), b: max(other, c.UID)}
			if _, open := l.clashes[k]; !open {
				l.clashes[k] = openClash{at: time.Now(), what: what}
			}
		}
		l.holders[d] = append(l.holders[d], c.UID)
	}
	l.closeClashesLocked()
	moved := c.Status.Allocation != nil && (!had || old.node != cur.node || len(old.devices) == 0)
	if cn, ok := l.closed[cur.node]; ok && moved && parseVersion(c.ResourceVersion) > cn.rv {
		l.violate("claim %s was allocated on node %s after the node %s", cur, cur.node, cn.why)
	}
	l.mu.Unlock()
	if moved && l.onAllocated != nil {
		l.onAllocated(c, cur.node)
	}
}

func (l *ledger) forget(uid types.UID) {
	old, ok := l.claims[uid]
	if !ok {
		return
	}
	for _, d := range old.devices {
		l.holders[d] = slices.DeleteFunc(l.holders[d], func(u types.UID) bool { return u == uid })
		if len(l.holders[d]) == 0 {
			delete(l.holders, d)
		}
	}
	delete(l.claims, uid)
}

// closeClashesLocked ends the clashes whose device one of the two claims
// no longer holds.
func (l *ledger) closeClashesLocked() {
	for k, c := range l.clashes {
		if slices.Contains(l.holders[k.device], k.a) && slices.Contains(l.holders[k.device], k.b) {
			continue
		}
		delete(l.clashes, k)
		d := time.Since(c.at)
		l.resolved++
		l.longest = max(l.longest, d)
		if d > clashGrace {
			l.violate("%s for %s, longer than the %s the controller has to resolve it", c.what, d.Round(100*time.Millisecond), clashGrace)
		}
	}
}

func (l *ledger) violate(format string, args ...any) {
	l.violations = append(l.violations, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
}

// close forbids new allocations on node from the API server's current
// version on: call it once the controller has shown that it saw the node
// go (waitLossHandled).
func (l *ledger) close(ctx context.Context, node, why string) error {
	list, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return fmt.Errorf("read the API server's resourceVersion: %w", err)
	}
	rv := parseVersion(list.ResourceVersion)
	if rv == 0 {
		return fmt.Errorf("resourceVersion %q is not a number", list.ResourceVersion)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed[node] = closedNode{why: why, rv: rv}
	return nil
}

func parseVersion(rv string) uint64 {
	v, _ := strconv.ParseUint(rv, 10, 64)
	return v
}

// allocatedIn lists the claims of a namespace that hold devices.
func (l *ledger) allocatedIn(ns string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, c := range l.claims {
		if strings.HasPrefix(c.key, ns+"/") && len(c.devices) > 0 {
			out = append(out, c.String())
		}
	}
	slices.Sort(out)
	return out
}

// report returns how many events were checked, a line on the clashes
// resolved, and what went wrong, a clash still open included.
func (l *ledger) report() (events int, clashes string, violations []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	violations = slices.Clone(l.violations)
	for _, c := range l.clashes {
		violations = append(violations, fmt.Sprintf("%s, since %s and still", c.what, c.at.Format("15:04:05.000")))
	}
	clashes = fmt.Sprintf("%d clashes between the controller's and the scheduler's allocations resolved", l.resolved)
	if l.resolved > 0 {
		clashes += fmt.Sprintf(", the longest in %s", l.longest.Round(10*time.Millisecond))
	}
	return l.events, clashes, violations
}

// The ledger's own test, on claims it is shown (no cluster needed): a
// clash the controller resolves in time is counted, not a violation; one
// between two allocations of the scheduler, one that lasts too long and
// one still open at the end are violations.
func TestLedgerClashes(t *testing.T) {
	claim := func(name, by string, devices ...string) *resourcev1.ResourceClaim {
		c := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: types.UID(name), ResourceVersion: "1"}}
		if by != "" {
			c.Annotations = map[string]string{placementapi.AnnotationAllocatedBy: by}
		}
		if len(devices) > 0 {
			c.Status.Allocation = &resourcev1.AllocationResult{}
			for _, d := range devices {
				c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
					resourcev1.DeviceRequestAllocationResult{Request: "gpus", Driver: "d", Pool: "n0", Device: d})
			}
		}
		return c
	}
	t.Run("resolved in time", func(t *testing.T) {
		l := newLedger(nil)
		l.apply(watch.Added, claim("mine", "ns/job/j", "gpu-0", "gpu-1"))
		l.apply(watch.Added, claim("sched", "", "gpu-1"))
		l.apply(watch.Modified, claim("sched", "", "gpu-1")) // reserved, say: still the same clash
		l.apply(watch.Modified, claim("mine", "ns/job/j"))
		_, clashes, v := l.report()
		if len(v) > 0 || !strings.HasPrefix(clashes, "1 clashes") {
			t.Errorf("violations %v, %q; want none, 1 clash resolved", v, clashes)
		}
	})
	t.Run("two of the scheduler's", func(t *testing.T) {
		l := newLedger(nil)
		l.apply(watch.Added, claim("a", "", "gpu-0"))
		l.apply(watch.Added, claim("b", "", "gpu-0"))
		if _, _, v := l.report(); len(v) != 1 || !strings.Contains(v[0], "lost count") {
			t.Errorf("violations %v, want one naming a device kube-scheduler lost count of", v)
		}
	})
	// clashed is a ledger that saw the controller's claim and the
	// scheduler's take gpu-0.
	clashed := func() *ledger {
		l := newLedger(nil)
		l.apply(watch.Added, claim("mine", "ns/job/j", "gpu-0"))
		l.apply(watch.Added, claim("sched", "", "gpu-0"))
		return l
	}
	t.Run("too long", func(t *testing.T) {
		l := clashed()
		for k, c := range l.clashes {
			c.at = c.at.Add(-clashGrace - time.Second)
			l.clashes[k] = c
		}
		l.apply(watch.Deleted, claim("sched", "", "gpu-0"))
		if _, _, v := l.report(); len(v) != 1 || !strings.Contains(v[0], "longer than") {
			t.Errorf("violations %v, want one for a clash that lasted too long", v)
		}
	})
	t.Run("still open", func(t *testing.T) {
		if _, _, v := clashed().report(); len(v) != 1 || !strings.Contains(v[0], "and still") {
			t.Errorf("violations %v, want one for the clash still open", v)
		}
	})
}
