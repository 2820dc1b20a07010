package controller

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/pkg/planner"
)

// Ordering. Groups are planned as they come: a group is planned once all
// its pods and claims exist, and groups that did not fit are retried
// whenever room frees up, in queue order (waitOrder): higher pod priority
// first, then the groups of each namespace in turn, oldest first. A
// smaller group that fits now goes ahead of one that does not (backfill).
// So that a stream of small groups cannot starve a large one, the first
// group in that order that has waited ReserveAfter reserves the nodes it
// needs in the domain closest to fitting it (planner.Target): from then
// on, groups that are not already running are planned as if those nodes'
// devices were taken, so what ends there stays free for it. The rest of
// the domain stays open. One group holds a reservation at a time; it ends
// when the group is placed or gone, or after ReservationTimeout, after
// which the group may not reserve again for as long, so the next group in
// line gets its turn.

// ReasonReserved: the group reserved nodes to wait for.
const ReasonReserved = "Reserved"

// ReasonReservationExpired: the group's reservation ended unplaced.
const ReasonReservationExpired = "ReservationExpired"

type reservation struct {
	key   string
	hold  planner.Hold
	since time.Time
	until time.Time
}

func (r *reservation) String() string {
	what := fmt.Sprintf("%s (%s of %s)", nodeList(r.hold.Nodes), plural(len(r.hold.Nodes), "node"), r.hold.Domain)
	if r.hold.Domain.Level == planner.LevelNode {
		what = r.hold.Domain.String()
	}
	return fmt.Sprintf("%s is reserved for %s since %s, until %s", what, r.key, r.since.Format(time.TimeOnly), r.until.Format(time.TimeOnly))
}

func nodeList(nodes []string) string {
	const show = 4
	if len(nodes) <= show {
		return strings.Join(nodes, ", ")
	}
	return strings.Join(nodes[:show], ", ") + fmt.Sprintf(" and %d more", len(nodes)-show)
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// waiting is what the controller knows of a group that does not fit.
type waiting struct {
	created  time.Time
	priority int32
}

// waitOrder lists the waiting groups in the order they are retried and
// may reserve: highest priority first; within a priority, namespaces take
// turns, each namespace's groups oldest first, the namespace with the
// oldest group going first.
func waitOrder(pending map[string]waiting) []string {
	keys := make([]string, 0, len(pending))
	for k := range pending {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		pa, pb := pending[a], pending[b]
		return cmp.Or(cmp.Compare(pb.priority, pa.priority), pa.created.Compare(pb.created), strings.Compare(a, b))
	})
	var out []string
	for len(keys) > 0 {
		prio := pending[keys[0]].priority
		end := slices.IndexFunc(keys, func(k string) bool { return pending[k].priority != prio })
		if end < 0 {
			end = len(keys)
		}
		out = append(out, roundRobin(keys[:end])...)
		keys = keys[end:]
	}
	return out
}

// roundRobin interleaves keys, already oldest first, by namespace.
func roundRobin(keys []string) []string {
	var order []string
	byNS := map[string][]string{}
	for _, k := range keys {
		ns, _, _ := strings.Cut(k, "/")
		if _, ok := byNS[ns]; !ok {
			order = append(order, ns)
		}
		byNS[ns] = append(byNS[ns], k)
	}
	out := make([]string, 0, len(keys))
	for len(out) < len(keys) {
		for _, ns := range order {
			if q := byNS[ns]; len(q) > 0 {
				out = append(out, q[0])
				byNS[ns] = q[1:]
			}
		}
	}
	return out
}

// maybeReserve reserves nodes for g, which did not fit, when g is first
// in waitOrder among the groups that may reserve, has waited
// ReserveAfter, and nothing is reserved yet.
func (c *Controller) maybeReserve(ctx context.Context, g *group, snap *planner.Snapshot, job planner.Job) {
	if time.Since(g.created()) < c.cfg.ReserveAfter {
		return
	}
	c.mu.Lock()
	c.expireLocked(ctx, time.Now())
	first := ""
	if c.reserved == nil {
		for _, k := range waitOrder(c.pending) {
			if c.mayReserveLocked(k, time.Now()) {
				first = k
				break
			}
		}
	}
	c.mu.Unlock()
	if first != g.key {
		return
	}
	hold, err := c.planner.Target(ctx, snap, job)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.unreservable[g.key] = true
		klog.FromContext(ctx).V(2).Info("No domain could hold the group; it reserves none", "reason", err.Error())
		return
	}
	if c.reserved != nil {
		return
	}
	now := time.Now()
	c.reserved = &reservation{key: g.key, hold: hold, since: now, until: now.Add(c.cfg.ReservationTimeout)}
	msg := fmt.Sprintf("waited %s, first of the groups that do not fit: %s; groups that are not running may not use them meanwhile",
		now.Sub(g.created()).Round(time.Second), c.reserved)
	klog.FromContext(ctx).Info("Reserved nodes for the first waiting group", "domain", hold.Domain.String(), "nodes", len(hold.Nodes), "until", c.reserved.until)
	c.recorder.Event(g.subject, v1.EventTypeNormal, ReasonReserved, truncate(msg))
}

// mayReserveLocked reports whether the group may reserve now: some domain
// could hold it, and its last reservation did not expire too recently.
func (c *Controller) mayReserveLocked(key string, now time.Time) bool {
	if c.unreservable[key] {
		return false
	}
	t, ok := c.expired[key]
	return !ok || now.Sub(t) >= c.cfg.ReservationTimeout
}

// expireLocked ends a reservation past its time. Called with c.mu held.
func (c *Controller) expireLocked(ctx context.Context, now time.Time) {
	r := c.reserved
	if r == nil || now.Before(r.until) {
		return
	}
	c.reserved = nil
	c.expired[r.key] = now
	klog.FromContext(ctx).Info("A reservation expired unplaced; the next waiting group may reserve", "group", r.key, "domain", r.hold.Domain.String())
	c.cfg.Metrics.Decisions.WithLabelValues(OutcomeReservationExpired).Inc()
	c.expiredEvents = append(c.expiredEvents, r)
}

// reservation returns the reservation in force, ending it first if it is
// past its time.
func (c *Controller) reservation(ctx context.Context) *reservation {
	c.mu.Lock()
	c.expireLocked(ctx, time.Now())
	r := c.reserved
	events := c.expiredEvents
	c.expiredEvents = nil
	c.mu.Unlock()
	for _, e := range events {
		c.recordExpired(e)
	}
	return r
}

// recordExpired tells the group whose reservation ended.
func (c *Controller) recordExpired(r *reservation) {
	objs, err := c.podIdx.ByIndex(groupIndex, r.key)
	if err != nil || len(objs) == 0 {
		return
	}
	c.recorder.Eventf(objs[0].(*v1.Pod), v1.EventTypeNormal, ReasonReservationExpired,
		"the reservation of %s in %s ended after %s unplaced; the next waiting group may reserve, and this group may again after %s",
		nodeList(r.hold.Nodes), r.hold.Domain, c.cfg.ReservationTimeout, c.cfg.ReservationTimeout)
}

// heldReservation is the reservation group key holds now, as
// AnnotationReservation records it, or "".
func (c *Controller) heldReservation(key string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.reserved
	if r == nil || r.key != key || !time.Now().Before(r.until) {
		return ""
	}
	return placement.Reservation{Until: r.until, Domain: r.hold.Domain, Nodes: r.hold.Nodes}.Format()
}

// dropReservation ends the group's reservation, if it holds one.
func (c *Controller) dropReservation(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.unreserveLocked(key)
}

// unreserveLocked ends the group's reservation and forgets that it could
// not reserve. Called with c.mu held.
func (c *Controller) unreserveLocked(key string) {
	if c.reserved != nil && c.reserved.key == key {
		c.reserved = nil
	}
	delete(c.unreservable, key)
}
