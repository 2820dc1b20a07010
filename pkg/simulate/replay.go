package simulate

import (
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Metrics is how one scheduler did on one replay, or the mean over seeds.
type Metrics struct {
	Scheduler string `json:"scheduler"`
	// Jobs and everything about jobs below count jobs with GPUs; pods
	// without GPUs are counted apart.
	Jobs          int `json:"jobs"`
	Placed        int `json:"placed"`
	CPUOnlyPods   int `json:"cpuOnlyPods"`
	CPUOnlyPlaced int `json:"cpuOnlyPlaced"`
	// Refused jobs never fitted: at their arrival (static traces), or
	// ever (timed traces, where jobs wait).
	Refused int `json:"refused"`
	// PartialJobs were refused although some of their pods fit; a
	// scheduler without gangs would hold those pods' GPUs meanwhile.
	PartialJobs       int   `json:"partialJobs"`
	Pods              int   `json:"pods"`
	PodsPlaced        int   `json:"podsPlaced"`
	RequestedGPUs     int   `json:"requestedGPUs"`
	RequestedMilliGPU int64 `json:"requestedMilliGPU"`
	ClusterGPUs       int   `json:"clusterGPUs"`
	// AllocatedGPUs hold anything (a whole GPU or a share) at the end
	// (static traces), or on average while jobs arrive (timed traces).
	AllocatedGPUs   float64 `json:"allocatedGPUs"`
	AllocationRatio float64 `json:"allocationRatio"`
	// MilliAllocationRatio counts what placed pods asked for, a share of
	// a GPU as a share, over the cluster's GPUs: the FGD paper's measure.
	MilliAllocationRatio float64 `json:"milliAllocationRatio"`
	// ArtifactAllocation is the FGD artifact's own measure of a static
	// replay's milli-GPU allocation, set in its setting (--fair, a
	// demand): the ratio after each arrival, averaged over the arrivals
	// whose arrived demand rounds to the demand's percent (see
	// artifactAllocation). 0 where not measured.
	ArtifactAllocation float64 `json:"artifactAllocation,omitempty"`
	// Utilization is the milli-GPU allocation ratio averaged over time
	// while jobs arrive (timed traces); at the end for static traces.
	Utilization float64 `json:"utilization"`
	// UsefulUtilization is Utilization with each job's milli-GPUs divided
	// by its locality factor (timed traces): the work done at the speed
	// of the trace's durations, which a job stretched by its placement
	// holds its GPUs longer for.
	UsefulUtilization   float64  `json:"usefulUtilization,omitempty"`
	UtilizationOverTime []Sample `json:"utilizationOverTime,omitempty"`
	MultiNodeJobs       int      `json:"multiNodeJobs"`
	MultiNodePlaced     int      `json:"multiNodePlaced"`
	SameDomain          int      `json:"sameDomain"`
	// CrossSpine multi-node jobs were placed across spines.
	CrossSpine int `json:"crossSpine"`
	// SameDomainRatio is SameDomain / MultiNodePlaced: placed multi-pod
	// jobs inside the smallest domain the size rule asks for. 0 without
	// multi-pod jobs.
	SameDomainRatio float64 `json:"sameDomainRatio"`
	// Fragmentation and LeafFragmentation are planner.Measure's, at the
	// end (static) or averaged over arrivals (timed).
	Fragmentation     float64 `json:"fragmentation"`
	LeafFragmentation float64 `json:"leafFragmentation"`
	PlanLatencyP50Ms  float64 `json:"planLatencyP50Ms"`
	PlanLatencyP99Ms  float64 `json:"planLatencyP99Ms"`
	PlanLatencyMaxMs  float64 `json:"planLatencyMaxMs"`
	// Waited jobs of a timed trace did not fit on arrival and queued;
	// the queueing delays are over every placed job, 0 for those placed
	// on arrival.
	Waited         int     `json:"waited"`
	MeanQueueWaitS float64 `json:"meanQueueWaitS"`
	P95QueueWaitS  float64 `json:"p95QueueWaitS"`
	// Job completion times (from arrival to the end of the run, the run
	// time stretched by the locality model) over every placed job of a
	// timed trace, and the makespan, from the first arrival to the last
	// completion.
	MeanJCTS float64 `json:"meanJCTS,omitempty"`
	P95JCTS  float64 `json:"p95JCTS,omitempty"`
	// MultiNodeMeanJCTS is the mean over placed multi-node jobs alone.
	MultiNodeMeanJCTS float64 `json:"multiNodeMeanJCTS,omitempty"`
	// FloorJCTS is the mean JCT no scheduler can beat on the trace (timed
	// traces): every job starting on arrival, in the nearest tier it fits
	// in when the cluster is empty (tierLimits.nearest), over every job with
	// GPUs. The same for every scheduler of a replay.
	FloorJCTS     float64 `json:"floorJCTS,omitempty"`
	MakespanS     float64 `json:"makespanS,omitempty"`
	AllocatorRuns int     `json:"allocatorRuns"`
	ReplaySeconds float64 `json:"replaySeconds"`

	latencies []float64 // ms, one per plan
	waits     []float64 // s, one per placed job
	jcts      []float64 // s, one per placed job
	floors    []float64 // s, the floor of each job with GPUs
	multiJCTs []float64 // s, one per placed multi-node job
	// arrivals: what had arrived and what was allocated, in milli-GPUs,
	// before the first arrival and after each (static traces).
	arrivals []allocSample
}

// Sample is the mean of a measure over one stretch of a timed replay.
type Sample struct {
	AtS         float64 `json:"atS"` // start of the stretch, from the first arrival
	Utilization float64 `json:"utilization"`
	Queued      float64 `json:"queued"` // jobs waiting, on average
}

// samples is how many stretches a timed replay is reported in.
const samples = 20

// departure is a placed job of a timed trace, due to leave.
type departure struct {
	at  time.Duration
	seq int
	key string
}

type departures []departure

func (d departures) Len() int { return len(d) }
func (d departures) Less(i, j int) bool {
	return d[i].at < d[j].at || (d[i].at == d[j].at && d[i].seq < d[j].seq)
}
func (d departures) Swap(i, j int) { d[i], d[j] = d[j], d[i] }
func (d *departures) Push(x any)   { *d = append(*d, x.(departure)) }
func (d *departures) Pop() any {
	old := *d
	x := old[len(old)-1]
	*d = old[:len(old)-1]
	return x
}

// run is one replay's bookkeeping.
type run struct {
	ctx  context.Context
	c    *Cluster
	jobs []Job
	p    placer
	loc  Locality
	m    Metrics
	// held: GPUs and milli-GPUs by placed job.
	held        map[string][2]int64
	gpus, milli int64
	// useful is the milli-GPUs held that do work at the trace's speed:
	// each job's divided by its locality factor, by job and in all.
	useful    map[string]float64
	usefulSum float64
	partial   map[int]bool // jobs that ever fitted in part
}

// replay runs jobs through p. Static traces arrive one after the other,
// stay, and are measured at the end. Timed traces replay arrivals and
// departures as events: a job that does not fit on arrival waits in a
// queue in arrival order, and whenever a job leaves the queue is scanned
// in that order and every job that fits now is placed (backfill: a later
// job may start before an earlier one that still does not fit).
//
// A job of a timed trace runs for its duration stretched by the locality
// model loc, by the highest tier its pods span. Schedulers never see a
// job's duration: only its declared run-time limit, where the trace has
// one.
func replay(ctx context.Context, c *Cluster, jobs []Job, timed bool, p placer, loc Locality) (Metrics, error) {
	start := time.Now()
	r := &run{ctx: ctx, c: c, jobs: jobs, p: p, loc: loc, held: map[string][2]int64{}, useful: map[string]float64{}, partial: map[int]bool{},
		m: Metrics{Scheduler: p.name(), Jobs: len(jobs), ClusterGPUs: c.GPUs}}
	for _, j := range jobs {
		if j.GPUsPerPod == 0 {
			r.m.CPUOnlyPods += j.Pods
			r.m.Jobs--
			continue
		}
		r.m.Pods += j.Pods
		r.m.RequestedGPUs += j.GPUs()
		r.m.RequestedMilliGPU += j.milli()
		if j.Pods > 1 {
			r.m.MultiNodeJobs++
		}
	}
	var err error
	if timed {
		tl := c.tierLimits()
		for _, j := range jobs {
			if j.GPUsPerPod > 0 {
				r.m.floors = append(r.m.floors, j.Duration.Seconds()*loc.of(tl.nearest(j)))
			}
		}
		err = r.timed()
	} else {
		err = r.static()
	}
	if err != nil {
		return r.m, err
	}
	m := &r.m
	if m.MultiNodePlaced > 0 {
		m.SameDomainRatio = float64(m.SameDomain) / float64(m.MultiNodePlaced)
	}
	m.AllocationRatio = m.AllocatedGPUs / float64(c.GPUs)
	m.PlanLatencyP50Ms, m.PlanLatencyP99Ms, m.PlanLatencyMaxMs = percentile(m.latencies, 0.50), percentile(m.latencies, 0.99), percentile(m.latencies, 1)
	m.MeanQueueWaitS, m.P95QueueWaitS = average(m.waits), percentile(m.waits, 0.95)
	m.MeanJCTS, m.P95JCTS = average(m.jcts), percentile(m.jcts, 0.95)
	m.MultiNodeMeanJCTS = average(m.multiJCTs)
	m.FloorJCTS = average(m.floors)
	m.ReplaySeconds = time.Since(start).Seconds()
	return *m, nil
}

// try plans job i at time at; ok says whether it was placed, and where.
// The scheduler sees the job without its duration.
func (r *run) try(i int, at time.Duration) (bool, error) {
	pl, err := r.tryAt(i, at)
	return pl.ok, err
}

func (r *run) tryAt(i int, at time.Duration) (placement, error) {
	if err := r.ctx.Err(); err != nil {
		return placement{}, err
	}
	j := r.jobs[i]
	key := fmt.Sprintf("j%d-%s", i, j.Name)
	t0 := time.Now()
	seen := j
	seen.Duration = 0
	pl, err := r.p.place(r.ctx, key, seen, at-j.Arrival)
	if err != nil {
		return placement{}, err
	}
	r.m.latencies = append(r.m.latencies, float64(time.Since(t0))/float64(time.Millisecond))
	r.m.AllocatorRuns += pl.runs
	if j.GPUsPerPod == 0 {
		if pl.ok {
			r.m.CPUOnlyPlaced += j.Pods
		}
		return pl, nil
	}
	if !pl.ok {
		if pl.partial && !r.partial[i] {
			r.partial[i] = true
			r.m.PartialJobs++
		}
		return pl, nil
	}
	r.m.Placed++
	r.m.PodsPlaced += j.Pods
	r.held[key] = [2]int64{int64(j.GPUs()), j.milli()}
	r.gpus += int64(j.GPUs())
	r.milli += j.milli()
	r.useful[key] = float64(j.milli()) / r.factor(pl.nodes)
	r.usefulSum += r.useful[key]
	if j.Pods > 1 {
		r.m.MultiNodePlaced++
		if pl.inDomain {
			r.m.SameDomain++
		}
		if len(pl.nodes) == j.Pods && r.c.tier(pl.nodes) == TierCross {
			r.m.CrossSpine++
		}
	}
	return pl, nil
}

// factor is the locality model's factor for a job on nodes.
func (r *run) factor(nodes []int) float64 {
	if len(nodes) == 0 {
		return 1
	}
	return r.loc.of(r.c.tier(nodes))
}

// runTime is how long job j runs on nodes under the locality model.
func (r *run) runTime(j Job, nodes []int) time.Duration {
	return time.Duration(float64(j.Duration) * r.factor(nodes))
}

func (r *run) static() error {
	// The artifact logs one line before the first pod and one after
	// each, placed or not, with or without GPUs.
	var arrived int64
	r.m.arrivals = make([]allocSample, 0, len(r.jobs)+1)
	r.m.arrivals = append(r.m.arrivals, allocSample{})
	for i, j := range r.jobs {
		ok, err := r.try(i, j.Arrival)
		if err != nil {
			return err
		}
		if !ok && j.GPUsPerPod > 0 {
			r.m.Refused++
		}
		arrived += j.milli()
		r.m.arrivals = append(r.m.arrivals, allocSample{arrived: arrived, used: r.milli})
	}
	u := r.p.usage()
	r.m.AllocatedGPUs = float64(u.Used)
	r.m.Fragmentation, r.m.LeafFragmentation = u.Fragmentation, u.LeafFragmentation
	r.m.MilliAllocationRatio = float64(r.milli) / (1000 * float64(r.c.GPUs))
	r.m.Utilization = r.m.MilliAllocationRatio
	return nil
}

// shape is what decides whether a job fits: two jobs of one shape fit
// or not alike, so a queue scan tries each shape once.
type shape struct {
	pods, gpus, milli int
	shared            bool
	cpu, mem          int64
	models            string
}

func shapeOf(j Job) shape {
	return shape{j.Pods, j.GPUsPerPod, j.MilliGPU, j.Shared, j.CPUMilli, j.MemoryMiB, strings.Join(j.GPUModels, "|")}
}

func (r *run) timed() error {
	jobs := r.jobs
	first, end := jobs[0].Arrival, jobs[len(jobs)-1].Arrival
	var due departures
	var queue []int // job indexes, in arrival order
	now := first
	var gpuTime, milliTime, usefulTime, fragSum, leafFragSum float64
	stretch := (end - first) / samples
	series := make([]Sample, samples)
	// advance accrues what is held and queued up to t, within the
	// arrivals' span, stretch by stretch.
	advance := func(t time.Duration) {
		t = min(t, end)
		for stretch > 0 && now < t {
			k := min(int((now-first)/stretch), samples-1)
			next := t
			if k < samples-1 {
				next = min(t, first+time.Duration(k+1)*stretch)
			}
			dt := (next - now).Seconds()
			gpuTime += float64(r.gpus) * dt
			milliTime += float64(r.milli) * dt
			usefulTime += r.usefulSum * dt
			series[k].Utilization += float64(r.milli) * dt
			series[k].Queued += float64(len(queue)) * dt
			now = next
		}
	}
	var last time.Duration // the last completion
	// limits: jobs declare run-time limits, and the queue backfills as
	// EASY does; ends holds the declared end of each running job.
	limits := jobs[0].Limit > 0
	ends := map[int]declaredEnd{}
	start := func(i int, at time.Duration, nodes []int) {
		if limits {
			ends[i] = declaredEnd{at: at + jobs[i].Limit, gpus: jobs[i].GPUs()}
		}
		w := (at - jobs[i].Arrival).Seconds()
		r.m.waits = append(r.m.waits, w)
		if w > 0 {
			r.m.Waited++
		}
		end := at + r.runTime(jobs[i], nodes)
		r.m.jcts = append(r.m.jcts, (end - jobs[i].Arrival).Seconds())
		if jobs[i].Pods > 1 {
			r.m.multiJCTs = append(r.m.multiJCTs, (end - jobs[i].Arrival).Seconds())
		}
		last = max(last, end)
		heap.Push(&due, departure{at: end, seq: i, key: fmt.Sprintf("j%d-%s", i, jobs[i].Name)})
	}
	// scan places every queued job that fits now, in arrival order.
	// With limits, the first job that does not fit holds a reservation
	// at shadow, when the declared ends free enough GPUs for it, extra
	// GPUs being left over then.
	scan := func(at time.Duration) error {
		failed := map[shape]bool{}
		kept := queue[:0]
		reserved := false
		var shadow time.Duration
		extra := 0
		for _, i := range queue {
			sh := shapeOf(jobs[i])
			if failed[sh] {
				kept = append(kept, i)
				continue
			}
			before := true // the job ends before the reservation
			if reserved {
				before = at+jobs[i].Limit <= shadow
				if !before && jobs[i].GPUs() > extra {
					kept = append(kept, i)
					continue
				}
			}
			pl, err := r.tryAt(i, at)
			if err != nil {
				return err
			}
			if pl.ok {
				start(i, at, pl.nodes)
				if !before {
					extra -= jobs[i].GPUs()
				}
				continue
			}
			failed[sh] = true
			kept = append(kept, i)
			if limits && !reserved {
				reserved = true
				shadow, extra = reservation(at, r.c.GPUs-int(r.gpus), jobs[i].GPUs(), ends)
			}
		}
		queue = kept
		return nil
	}
	leave := func() {
		d := heap.Pop(&due).(departure)
		r.p.release(d.key)
		h := r.held[d.key]
		r.gpus -= h[0]
		r.milli -= h[1]
		r.usefulSum -= r.useful[d.key]
		delete(r.held, d.key)
		delete(r.useful, d.key)
		delete(ends, d.seq)
	}
	for i, j := range jobs {
		for due.Len() > 0 && due[0].at <= j.Arrival {
			at := due[0].at
			advance(at)
			for due.Len() > 0 && due[0].at == at {
				leave()
			}
			if err := scan(at); err != nil {
				return err
			}
		}
		advance(j.Arrival)
		u := r.p.usage()
		fragSum += u.Fragmentation
		leafFragSum += u.LeafFragmentation
		if limits && len(queue) > 0 {
			// A job arriving while others wait takes its turn behind
			// the reservation.
			queue = append(queue, i)
			if err := scan(j.Arrival); err != nil {
				return err
			}
			continue
		}
		pl, err := r.tryAt(i, j.Arrival)
		if err != nil {
			return err
		}
		if pl.ok {
			start(i, j.Arrival, pl.nodes)
		} else {
			queue = append(queue, i)
		}
	}
	// After the last arrival the queue drains as jobs leave; what never
	// fits is refused.
	for due.Len() > 0 && len(queue) > 0 {
		at := due[0].at
		for due.Len() > 0 && due[0].at == at {
			leave()
		}
		if err := scan(at); err != nil {
			return err
		}
	}
	for _, i := range queue {
		if jobs[i].GPUsPerPod > 0 {
			r.m.Refused++
		}
	}
	if last > 0 {
		r.m.MakespanS = (last - first).Seconds()
	}
	span := (end - first).Seconds()
	n := float64(len(jobs))
	r.m.Fragmentation, r.m.LeafFragmentation = fragSum/n, leafFragSum/n
	cluster := float64(r.c.GPUs)
	if span > 0 {
		r.m.AllocatedGPUs = gpuTime / span
		r.m.MilliAllocationRatio = milliTime / span / (1000 * cluster)
		r.m.UsefulUtilization = usefulTime / span / (1000 * cluster)
		for k := range series {
			d := stretch.Seconds()
			if k == samples-1 {
				d = span - stretch.Seconds()*(samples-1)
			}
			series[k].AtS = (time.Duration(k) * stretch).Seconds()
			if d > 0 {
				series[k].Utilization /= d * 1000 * cluster
				series[k].Queued /= d
			}
		}
		r.m.UtilizationOverTime = series
	}
	r.m.Utilization = r.m.MilliAllocationRatio
	return nil
}

// declaredEnd is when a running job says it ends (its start plus its
// declared limit) and the GPUs it frees then.
type declaredEnd struct {
	at   time.Duration
	gpus int
}

// reservation is when a job of need GPUs may start, going by the declared
// ends of the running jobs (by job index; a job past its declared end
// counts as ending now) with free GPUs free now; extra is how many GPUs
// are left over then. When the running jobs never free enough there is
// no reservation: shadow lies beyond any time, with no extra.
func reservation(now time.Duration, free, need int, ends map[int]declaredEnd) (shadow time.Duration, extra int) {
	if free >= need {
		return now, free - need
	}
	type end struct {
		declaredEnd
		i int
	}
	es := make([]end, 0, len(ends))
	for i, e := range ends {
		e.at = max(e.at, now)
		es = append(es, end{e, i})
	}
	slices.SortFunc(es, func(a, b end) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.i, b.i)) })
	for _, e := range es {
		free += e.gpus
		if free >= need {
			return e.at, free - need
		}
	}
	return time.Duration(math.MaxInt64), 0
}

// percentile is the nearest-rank percentile of xs.
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func average(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}
