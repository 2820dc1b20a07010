package controller

import (
	"context"
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/planner"
)

// Ordering. Groups are planned first come, first served: a group is
// planned once all its pods and claims exist, and groups that did not fit
// are retried oldest first whenever room frees up. A smaller group that
// fits now goes ahead of an older one that does not (backfill). So that a
// stream of small groups cannot starve a large one, the oldest group that
// has waited ReserveAfter reserves the domain closest to fitting it
// (planner.Target): from then on, groups that are not already running
// are planned as if every device of that domain were taken, so what ends
// there stays free for it. One group holds a reservation at a time; it
// ends when the group is placed or gone.

// ReasonReserved: the group reserved a domain to wait for.
const ReasonReserved = "Reserved"

type reservation struct {
	key    string
	domain planner.Domain
	since  time.Time
}

// maybeReserve reserves a domain for g, which did not fit, when g is the
// oldest waiting group and has waited ReserveAfter and nothing is
// reserved yet.
func (c *Controller) maybeReserve(ctx context.Context, g *group, snap *planner.Snapshot, job planner.Job) {
	created := g.created()
	if time.Since(created) < c.cfg.ReserveAfter {
		return
	}
	c.mu.Lock()
	older := c.reserved != nil || c.unreservable[g.key]
	for k, t := range c.pending {
		if k != g.key && !c.unreservable[k] && (t.Before(created) || (t.Equal(created) && k < g.key)) {
			older = true
			break
		}
	}
	c.mu.Unlock()
	if older {
		return
	}
	d, err := c.planner.Target(ctx, snap, job)
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
	c.reserved = &reservation{key: g.key, domain: d, since: time.Now()}
	msg := fmt.Sprintf("waited %s, the longest of the groups that do not fit: reserved %s, which groups created later may not use until this group is placed", time.Since(created).Round(time.Second), d)
	klog.FromContext(ctx).Info("Reserved a domain for the oldest waiting group", "domain", d.String())
	c.recorder.Event(g.subject, v1.EventTypeNormal, ReasonReserved, msg)
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
