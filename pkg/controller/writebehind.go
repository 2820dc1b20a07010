package controller

import (
	"context"
	"slices"

	v1 "k8s.io/api/core/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
)

// A group's writes (its claims' allocations, then its gates) take an API
// round trip or two each, however many of them go in parallel, while its
// plan takes a few milliseconds. With one worker making both, a burst of
// groups was placed at the pace of the API server's latency, not of its
// capacity: the worker waited on writes most of the time. So the writes
// of up to Config.WritingGroups groups run beside the worker, which plans
// the next groups meanwhile:
//
//   - a plan's allocations enter the claim index before their writes start
//     (claimIndex.assume), so every later plan counts those devices as
//     taken, as kube-scheduler counts its in-flight allocations;
//   - a group is not synced while its writes are in flight; a sync asked
//     for meanwhile runs once they end;
//   - a group that reads a claim another group is writing waits (its claims
//     are lagging) and is synced again when that group's writes end;
//   - a failed write withdraws what it assumed and backs the group off,
//     as a failed sync does, and only the end of the writes forgets a
//     group's backoff;
//   - what a waiting group's pods wait for (setStatus) is written beside
//     the worker too, with slots of its own, so that a note on pods
//     waiting for their claims never waits behind, or holds up, the
//     allocations and gates of groups that are ready.

// groupWrites is what the controller knows of one group's writes in flight.
type groupWrites struct {
	// missed is set when the group was to be synced meanwhile.
	missed bool
	// waiters are the groups waiting for these writes to end.
	waiters []string
}

// writeBehind runs write, a group's writes and what follows them, beside
// the worker when Config.WritingGroups allows (waiting for a free slot),
// else at once; undo, when set, runs after write either way, to withdraw
// what the worker assumed for it. When write ran at once its error is the
// sync's; beside the worker the sync's result is writing, and the end of
// the writes forgets the group's backoff or, on a failure, backs it off
// further, as the worker does after a sync.
func (c *Controller) writeBehind(ctx context.Context, key string, write func() error, undo func()) (result, error) {
	return c.behind(ctx, c.writeSlots, key, write, undo)
}

// statusBehind writes what the group's pods wait for (setStatus) beside
// the worker, in slots of its own.
func (c *Controller) statusBehind(ctx context.Context, key string, pods []*v1.Pod, reason, message string) (result, error) {
	changes := c.statusPatches(key, pods, reason, message)
	if len(changes) == 0 {
		return done, nil
	}
	return c.behind(ctx, c.statusSlots, key, func() error { return c.writeStatus(ctx, changes) }, nil)
}

// behind runs write beside the worker once one of slots is free (nil:
// at once, in the worker); see writeBehind.
func (c *Controller) behind(ctx context.Context, slots chan struct{}, key string, write func() error, undo func()) (result, error) {
	if undo == nil {
		undo = func() {}
	}
	if slots == nil {
		defer undo()
		return done, write()
	}
	took := false
	select {
	case slots <- struct{}{}:
		took = true
	case <-ctx.Done():
	}
	if ctx.Err() != nil {
		// Stopping: select picks at random when a slot is free too.
		if took {
			<-slots
		}
		undo()
		return done, context.Cause(ctx)
	}
	w := &groupWrites{}
	c.mu.Lock()
	c.writing[key] = w
	c.mu.Unlock()
	c.cfg.Metrics.WritingGroups.Inc()
	c.writers.Add(1)
	go func() {
		defer c.writers.Done()
		err := write()
		undo()
		c.mu.Lock()
		delete(c.writing, key)
		c.mu.Unlock()
		<-slots
		c.cfg.Metrics.WritingGroups.Dec()
		// w is no longer in c.writing: nobody else changes it now.
		for _, k := range w.waiters {
			c.queue.Add(k)
		}
		switch {
		case err != nil:
			utilruntime.HandleErrorWithContext(ctx, err, "Writing pod group failed", "group", key)
			c.queue.AddRateLimited(key)
		case w.missed:
			c.queue.Forget(key)
			c.queue.Add(key)
		default:
			c.queue.Forget(key)
		}
	}()
	return writing, nil
}

// writingNow reports whether the group's writes are in flight, and notes
// that it is to be synced once they end.
func (c *Controller) writingNow(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	w, ok := c.writing[key]
	if ok {
		w.missed = true
	}
	return ok
}

// waitFor has group key synced once group writer's writes end, or at once
// when they ended already.
func (c *Controller) waitFor(writer, key string) {
	c.mu.Lock()
	w, ok := c.writing[writer]
	if ok && !slices.Contains(w.waiters, key) {
		w.waiters = append(w.waiters, key)
	}
	c.mu.Unlock()
	if !ok {
		c.queue.Add(key)
	}
}

// waitWrites waits until no group's writes are in flight.
func (c *Controller) waitWrites() { c.writers.Wait() }
