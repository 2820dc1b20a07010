package simulate

import (
	"fmt"
	"math/rand/v2"
)

// inflateSeed samples the jobs added to a short trace when the arrival
// order is the trace's own: the FGD artifact's default tune seed.
const inflateSeed = 42

// Arrivals is what arrives of a static trace.
type Arrivals struct {
	Jobs []Job
	// Sampled jobs were drawn again from the trace, with replacement, to
	// reach the demand (the FGD artifact's workload tuning).
	Sampled int
	// RequestedMilliGPU is what the arrived jobs ask for in all.
	RequestedMilliGPU int64
	// Cut is how many jobs of the (inflated) trace never arrived.
	Cut int
	// nodePerm, set by FGDArrivals, draws the next permutation of n
	// from the artifact's generator where the arrivals leave it: the
	// order the artifact gives nodes of equal score.
	nodePerm func(n int) []int
}

// StaticArrivals follows the FGD paper's method for "allocation ratio at
// x% demand": jobs arrive one by one, in trace order or shuffled by seed
// (0 keeps the trace order), until the next one would take what they ask
// for past demand × clusterGPUs, counted in milli-GPUs (a pod asking for
// 460 thousandths of a GPU adds 0.46); nothing departs. A trace that
// requests less than that is first inflated with jobs sampled from it
// with replacement, as the artifact's tuneUp does, when inflate is set.
// demand ≤ 0 lets the whole trace arrive.
func StaticArrivals(tr *Trace, clusterGPUs int, demand float64, seed uint64, inflate bool) (Arrivals, error) {
	if len(tr.Jobs) == 0 {
		return Arrivals{}, fmt.Errorf("trace %s has no jobs", tr.Source)
	}
	jobs := append([]Job(nil), tr.Jobs...)
	var total int64
	for _, j := range jobs {
		total += j.milli()
	}
	var a Arrivals
	target := demand * float64(clusterGPUs) * 1000
	sample := seed
	if sample == 0 {
		sample = inflateSeed
	}
	if demand > 0 && inflate && float64(total) < target {
		rng := rand.New(rand.NewPCG(sample, 0x7a11))
		n := len(tr.Jobs)
		for {
			j := tr.Jobs[rng.IntN(n)]
			if float64(total+j.milli()) > target {
				break
			}
			j.Name = fmt.Sprintf("%s-tuned-%d", j.Name, a.Sampled)
			jobs = append(jobs, j)
			total += j.milli()
			a.Sampled++
		}
	}
	if seed != 0 {
		rng := rand.New(rand.NewPCG(seed, 0x5b0ff1e))
		rng.Shuffle(len(jobs), func(x, y int) { jobs[x], jobs[y] = jobs[y], jobs[x] })
	}
	for i, j := range jobs {
		if demand > 0 && float64(a.RequestedMilliGPU+j.milli()) > target {
			a.Cut = len(jobs) - i
			break
		}
		a.Jobs = append(a.Jobs, j)
		a.RequestedMilliGPU += j.milli()
	}
	return a, nil
}
