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
// device is allocated to two claims at once. Results with a shareID or
// admin access do not hold their device alone and are not counted.
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

// startLedger lists the claims, checks them and follows them until the
// test ends. Call stop (or let the cleanup do it) before reading results.
func startLedger(t *testing.T, onAllocated func(*resourcev1.ResourceClaim, string)) (l *ledger, stop func()) {
	t.Helper()
	l = &ledger{claims: map[types.UID]ledgerClaim{}, holders: map[string][]types.UID{}, closed: map[string]closedNode{},
		onAllocated: onAllocated, done: make(chan struct{})}
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
		l.mu.Unlock()
		return
	}
	cur := ledgerClaim{key: c.Namespace + "/" + c.Name, by: c.Annotations[placementapi.AnnotationAllocatedBy],
		node: allocationNode(c.Status.Allocation), devices: exclusiveDevices(c.Status.Allocation), reserved: len(c.Status.ReservedFor)}
	l.claims[c.UID] = cur
	for _, d := range cur.devices {
		for _, other := range l.holders[d] {
			l.violate("device %s is allocated to two claims: %s and %s (event %d, resourceVersion %s)",
				d, cur, l.claims[other], l.events, c.ResourceVersion)
		}
		l.holders[d] = append(l.holders[d], c.UID)
	}
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

// report returns how many events were checked and what went wrong.
func (l *ledger) report() (events int, violations []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.events, slices.Clone(l.violations)
}
