package scale

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"golang.org/x/exp/trace"
)

// TraceRegion is one user region of a Go execution trace (runtime/trace
// StartRegion) and where its goroutine's time went meanwhile. The
// controller names its plan's steps "snapshot" and "planner".
type TraceRegion struct {
	Type string
	// Start is from the trace's first event; Took is the region's wall
	// clock.
	Start, Took time.Duration
	// Running is the time its goroutine held a P, Runnable the time it
	// waited for one, Blocked the time it waited on anything else (a lock,
	// a channel, the network).
	Running, Runnable, Blocked time.Duration
	// Assist is the part of Running the goroutine spent helping the
	// collector mark, GCMark how long a GC mark phase overlapped the region.
	Assist, GCMark time.Duration
	// Others is how long other goroutines of the process held a P during
	// the region, GCWorkers how long the collector's own workers did.
	Others, GCWorkers time.Duration
	// Samples counts the CPU profile's samples of the goroutine in the
	// region and ProcessSamples those of the whole process: a thread is
	// sampled about once per 10 ms of CPU it uses, so a goroutine that held
	// a P much longer than its samples account for was waiting for the
	// kernel to give the process a core. Both are 0 unless the CPU profiler
	// ran with the trace.
	Samples, ProcessSamples int
	g                       trace.GoID // the region's goroutine
}

// RegionStats sums the regions of one type in a trace.
type RegionStats struct {
	// Count and Took are the regions and their wall clock, Long the
	// regions at least the length asked for.
	Count, Long int
	Took        time.Duration
	// Samples counts the CPU profile's samples of the regions' goroutines
	// inside them: about 10 ms of CPU each.
	Samples int
}

// maxDetailed bounds the long regions whose time is broken down.
const maxDetailed = 20

// ReadTraceRegions reads the execution trace that open returns twice:
// first for every region of type typ, then for where the time of the
// longest of those at least atLeast long went (up to 20). It returns the
// count and totals of all regions of the type and the long ones, slowest
// first.
func ReadTraceRegions(open func() (io.ReadCloser, error), typ string, atLeast time.Duration) (RegionStats, []TraceRegion, error) {
	var all RegionStats
	var long []TraceRegion
	spans := map[trace.GoID][][2]trace.Time{} // every region, by goroutine, in time order
	begun := map[trace.GoID]trace.Time{}
	var first trace.Time
	err := eachEvent(open, func(ev trace.Event) {
		if first == 0 {
			first = ev.Time()
		}
		switch ev.Kind() {
		case trace.EventRegionBegin:
			if ev.Region().Type == typ {
				begun[ev.Goroutine()] = ev.Time()
			}
		case trace.EventRegionEnd:
			t0, ok := begun[ev.Goroutine()]
			if ev.Region().Type != typ || !ok {
				return
			}
			delete(begun, ev.Goroutine())
			took := ev.Time().Sub(t0)
			all.Count++
			all.Took += took
			spans[ev.Goroutine()] = append(spans[ev.Goroutine()], [2]trace.Time{t0, ev.Time()})
			if took >= atLeast {
				long = append(long, TraceRegion{Type: typ, Start: t0.Sub(first), Took: took, g: ev.Goroutine()})
			}
		}
	})
	if err != nil || all.Count == 0 {
		return all, nil, err
	}
	all.Long = len(long)
	slices.SortStableFunc(long, func(a, b TraceRegion) int { return int(b.Took - a.Took) })
	w := &regionWindows{regions: long[:min(len(long), maxDetailed)], first: first, spans: spans,
		state: map[trace.GoID]goState{}, gc: map[trace.GoID]bool{}, assist: map[trace.GoID]trace.Time{}}
	if err := eachEvent(open, w.event); err != nil {
		return all, nil, err
	}
	// Each goroutine's last state lasts to the end of the trace: a region
	// that ends after its goroutine's last transition is charged too.
	for g, st := range w.state {
		w.charge(g, st.state, st.since, w.last)
	}
	all.Samples = w.samples
	return all, w.regions, nil
}

// eachEvent calls fn for every event of the trace open returns.
func eachEvent(open func() (io.ReadCloser, error), fn func(trace.Event)) error {
	f, err := open()
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	r, err := trace.NewReader(f)
	if err != nil {
		return fmt.Errorf("read execution trace: %w", err)
	}
	for {
		ev, err := r.ReadEvent()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read execution trace: %w", err)
		}
		fn(ev)
	}
}

type goState struct {
	state trace.GoState
	since trace.Time
}

// regionWindows accounts the second pass: every goroutine's states,
// charged to the long regions they overlap.
type regionWindows struct {
	regions []TraceRegion
	first   trace.Time
	state   map[trace.GoID]goState
	gc      map[trace.GoID]bool // the collector's workers
	assist  map[trace.GoID]trace.Time
	markAt  trace.Time // a GC mark phase began; 0 when none runs
	spans   map[trace.GoID][][2]trace.Time
	samples int        // the samples of every region's goroutine inside it
	last    trace.Time // the trace's last event so far
}

// inSpan reports whether goroutine g was inside one of its regions at t.
func (w *regionWindows) inSpan(g trace.GoID, t trace.Time) bool {
	sp := w.spans[g]
	i, _ := slices.BinarySearchFunc(sp, t, func(s [2]trace.Time, t trace.Time) int {
		switch {
		case s[1] <= t:
			return -1
		case s[0] > t:
			return 1
		}
		return 0
	})
	return i < len(sp) && sp[i][0] <= t && t < sp[i][1]
}

// window returns region i's start and end in trace time.
func (w *regionWindows) window(i int) (trace.Time, trace.Time) {
	t0 := w.first + trace.Time(w.regions[i].Start)
	return t0, t0 + trace.Time(w.regions[i].Took)
}

// overlap calls fn with the part of [a, b) inside each region.
func (w *regionWindows) overlap(a, b trace.Time, fn func(i int, d time.Duration)) {
	for i := range w.regions {
		t0, t1 := w.window(i)
		if lo, hi := max(a, t0), min(b, t1); hi > lo {
			fn(i, hi.Sub(lo))
		}
	}
}

func (w *regionWindows) event(ev trace.Event) {
	w.last = max(w.last, ev.Time())
	switch ev.Kind() {
	case trace.EventStateTransition:
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			return
		}
		g := st.Resource.Goroutine()
		_, to := st.Goroutine()
		if prev, ok := w.state[g]; ok {
			w.charge(g, prev.state, prev.since, ev.Time())
		}
		w.state[g] = goState{state: to, since: ev.Time()}
	case trace.EventLabel:
		l := ev.Label()
		if l.Resource.Kind == trace.ResourceGoroutine && strings.HasPrefix(l.Label, "GC (") {
			w.gc[l.Resource.Goroutine()] = true
		}
	case trace.EventRangeBegin, trace.EventRangeActive:
		switch r := ev.Range(); {
		case r.Name == "GC concurrent mark phase":
			w.markAt = ev.Time()
		case r.Name == "GC mark assist" && r.Scope.Kind == trace.ResourceGoroutine:
			w.assist[r.Scope.Goroutine()] = ev.Time()
		}
	case trace.EventRangeEnd:
		switch r := ev.Range(); {
		case r.Name == "GC concurrent mark phase" && w.markAt != 0:
			w.overlap(w.markAt, ev.Time(), func(i int, d time.Duration) { w.regions[i].GCMark += d })
			w.markAt = 0
		case r.Name == "GC mark assist" && r.Scope.Kind == trace.ResourceGoroutine:
			g := r.Scope.Goroutine()
			if t0, ok := w.assist[g]; ok {
				delete(w.assist, g)
				w.overlap(t0, ev.Time(), func(i int, d time.Duration) {
					if w.regions[i].g == g {
						w.regions[i].Assist += d
					}
				})
			}
		}
	case trace.EventStackSample:
		g := ev.Goroutine()
		t := ev.Time()
		if w.inSpan(g, t) {
			w.samples++
		}
		w.overlap(t, t+1, func(i int, _ time.Duration) {
			w.regions[i].ProcessSamples++
			if w.regions[i].g == g {
				w.regions[i].Samples++
			}
		})
	}
}

// charge adds goroutine g's time in state s from a to b to the regions it
// overlaps.
func (w *regionWindows) charge(g trace.GoID, s trace.GoState, a, b trace.Time) {
	w.overlap(a, b, func(i int, d time.Duration) {
		r := &w.regions[i]
		switch {
		case r.g == g && s == trace.GoRunning:
			r.Running += d
		case r.g == g && s == trace.GoRunnable:
			r.Runnable += d
		case r.g == g && s != trace.GoNotExist && s != trace.GoUndetermined:
			r.Blocked += d
		case r.g != g && s == trace.GoRunning && w.gc[g]:
			r.GCWorkers += d
		case r.g != g && s == trace.GoRunning:
			r.Others += d
		}
	})
}
