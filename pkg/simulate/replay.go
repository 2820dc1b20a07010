package simulate

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"slices"
	"time"
)

// Metrics is how one scheduler did on one replay, or the mean over seeds.
type Metrics struct {
	Scheduler string `json:"scheduler"`
	Jobs      int    `json:"jobs"`
	Placed    int    `json:"placed"`
	Refused   int    `json:"refused"`
	// PartialJobs were refused although some of their pods fit; the plain
	// scheduler would hold those pods' GPUs while the rest wait.
	PartialJobs   int `json:"partialJobs"`
	Pods          int `json:"pods"`
	PodsPlaced    int `json:"podsPlaced"`
	RequestedGPUs int `json:"requestedGPUs"`
	ClusterGPUs   int `json:"clusterGPUs"`
	// AllocatedGPUs are the GPUs held at the end (static traces), or the
	// mean held over the arrivals' time span (timed traces).
	AllocatedGPUs   float64 `json:"allocatedGPUs"`
	AllocationRatio float64 `json:"allocationRatio"`
	// MilliAllocationRatio counts what placed pods asked for, a share of
	// a GPU as a share: the FGD paper's measure. Lower than
	// AllocationRatio by the GPUs rounded up for shared pods.
	MilliAllocationRatio float64 `json:"milliAllocationRatio"`
	MultiNodeJobs        int     `json:"multiNodeJobs"`
	MultiNodePlaced      int     `json:"multiNodePlaced"`
	SameDomain           int     `json:"sameDomain"`
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
	AllocatorRuns     int     `json:"allocatorRuns"`
	ReplaySeconds     float64 `json:"replaySeconds"`

	latencies []float64 // ms, one per job
}

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

// replay runs jobs through p. Static traces are measured at the end;
// timed ones replay arrivals and departures as events, are measured at
// every arrival and average GPU use over time from the first arrival to
// the last.
func replay(ctx context.Context, c *Cluster, jobs []Job, timed bool, name string, p placer) (Metrics, error) {
	start := time.Now()
	m := Metrics{Scheduler: name, Jobs: len(jobs), ClusterGPUs: c.GPUs}
	var due departures
	used, milli := 0, 0
	held := map[string][2]int{} // key → GPUs, milli-GPUs
	var gpuTime, fragSum, leafFragSum float64
	last := time.Duration(0)
	advance := func(to time.Duration) {
		gpuTime += float64(used) * (to - last).Seconds()
		last = to
	}
	for i, j := range jobs {
		if err := ctx.Err(); err != nil {
			return m, err
		}
		if timed {
			for due.Len() > 0 && due[0].at <= j.Arrival {
				d := heap.Pop(&due).(departure)
				advance(d.at)
				p.release(d.key)
				used -= held[d.key][0]
				delete(held, d.key)
			}
			advance(j.Arrival)
			u := p.usage()
			fragSum += u.Fragmentation
			leafFragSum += u.LeafFragmentation
		}
		key := fmt.Sprintf("j%d-%s", i, j.Name)
		t0 := time.Now()
		pl, err := p.place(ctx, key, j)
		if err != nil {
			return m, err
		}
		m.latencies = append(m.latencies, float64(time.Since(t0))/float64(time.Millisecond))
		m.AllocatorRuns += pl.runs
		m.Pods += j.Pods
		m.RequestedGPUs += j.GPUs()
		if j.Pods > 1 {
			m.MultiNodeJobs++
		}
		if !pl.ok {
			m.Refused++
			if pl.partial {
				m.PartialJobs++
			}
			continue
		}
		m.Placed++
		m.PodsPlaced += j.Pods
		used += j.GPUs()
		milli += j.Pods * j.MilliGPU
		held[key] = [2]int{j.GPUs(), j.Pods * j.MilliGPU}
		if j.Pods > 1 {
			m.MultiNodePlaced++
			if pl.inDomain {
				m.SameDomain++
			}
		}
		if timed {
			heap.Push(&due, departure{at: j.Arrival + j.Duration, seq: i, key: key})
		}
	}
	gpus := float64(c.GPUs)
	if timed {
		span := last - jobs[0].Arrival
		m.AllocatedGPUs = float64(used)
		if span > 0 {
			m.AllocatedGPUs = gpuTime / span.Seconds()
		}
		m.Fragmentation = fragSum / float64(len(jobs))
		m.LeafFragmentation = leafFragSum / float64(len(jobs))
		m.MilliAllocationRatio = m.AllocatedGPUs / gpus
	} else {
		u := p.usage()
		m.AllocatedGPUs = float64(u.Used)
		m.Fragmentation, m.LeafFragmentation = u.Fragmentation, u.LeafFragmentation
		m.MilliAllocationRatio = float64(milli) / (1000 * gpus)
	}
	m.AllocationRatio = m.AllocatedGPUs / gpus
	if m.MultiNodePlaced > 0 {
		m.SameDomainRatio = float64(m.SameDomain) / float64(m.MultiNodePlaced)
	}
	m.PlanLatencyP50Ms, m.PlanLatencyP99Ms, m.PlanLatencyMaxMs = percentile(m.latencies, 0.50), percentile(m.latencies, 0.99), percentile(m.latencies, 1)
	m.ReplaySeconds = time.Since(start).Seconds()
	return m, nil
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

// mean averages per-seed metrics: ratios exactly, counts rounded;
// latency percentiles are taken over every seed's plans together.
func mean(runs []Metrics) Metrics {
	if len(runs) == 1 {
		return runs[0]
	}
	out := Metrics{Scheduler: runs[0].Scheduler, ClusterGPUs: runs[0].ClusterGPUs}
	n := float64(len(runs))
	avg := func(get func(Metrics) float64) float64 {
		s := 0.0
		for _, r := range runs {
			s += get(r)
		}
		return s / n
	}
	count := func(get func(Metrics) int) int {
		return int(math.Round(avg(func(m Metrics) float64 { return float64(get(m)) })))
	}
	out.Jobs = count(func(m Metrics) int { return m.Jobs })
	out.Placed = count(func(m Metrics) int { return m.Placed })
	out.Refused = count(func(m Metrics) int { return m.Refused })
	out.PartialJobs = count(func(m Metrics) int { return m.PartialJobs })
	out.Pods = count(func(m Metrics) int { return m.Pods })
	out.PodsPlaced = count(func(m Metrics) int { return m.PodsPlaced })
	out.RequestedGPUs = count(func(m Metrics) int { return m.RequestedGPUs })
	out.MultiNodeJobs = count(func(m Metrics) int { return m.MultiNodeJobs })
	out.MultiNodePlaced = count(func(m Metrics) int { return m.MultiNodePlaced })
	out.SameDomain = count(func(m Metrics) int { return m.SameDomain })
	out.AllocatorRuns = count(func(m Metrics) int { return m.AllocatorRuns })
	out.AllocatedGPUs = avg(func(m Metrics) float64 { return m.AllocatedGPUs })
	out.AllocationRatio = avg(func(m Metrics) float64 { return m.AllocationRatio })
	out.MilliAllocationRatio = avg(func(m Metrics) float64 { return m.MilliAllocationRatio })
	out.SameDomainRatio = avg(func(m Metrics) float64 { return m.SameDomainRatio })
	out.Fragmentation = avg(func(m Metrics) float64 { return m.Fragmentation })
	out.LeafFragmentation = avg(func(m Metrics) float64 { return m.LeafFragmentation })
	out.ReplaySeconds = avg(func(m Metrics) float64 { return m.ReplaySeconds })
	for _, r := range runs {
		out.latencies = append(out.latencies, r.latencies...)
	}
	out.PlanLatencyP50Ms, out.PlanLatencyP99Ms, out.PlanLatencyMaxMs = percentile(out.latencies, 0.50), percentile(out.latencies, 0.99), percentile(out.latencies, 1)
	return out
}
