package simulate

import (
	"cmp"
	"fmt"
	"math/rand" // v1 on purpose: the FGD artifact's generator, call for call
	"slices"
)

// FGDArrivals is the arrival sequence of the FGD artifact's runs
// (hkust-adsl/kubernetes-scheduler-simulator at 8f3d641, run with
// shufflePod true and workloadTuningConfig {ratio: demand, seed: seed}),
// drawn from the artifact's generator in the artifact's order, so a
// replay of an Alibaba pod list sees the artifact's pods in its order:
//
//  1. the generator is math/rand's, seeded with seed as rand.Seed seeds
//     the global one, and one rand.Int is drawn first: core.go Simulate
//     logs one at debug level, and Go evaluates the argument whatever
//     the level;
//  2. the trace's pods, sorted by name, are shuffled with rand.Shuffle
//     (SortClusterPods); seed 0 keeps them in name order, as the
//     artifact does without shufflePod (the lists carry no creation
//     times), and tunes with inflateSeed;
//  3. the shuffled trace is then tuned to demand × the cluster's
//     milli-GPUs (TunePodsByNodeTotalResource). Below the target,
//     pods drawn with replacement (rand.Intn) from the trace sorted by
//     name are appended, unshuffled, after the trace's own, as long as
//     the drawn pod's milli-GPUs *per GPU* fit under the target; each
//     adds its total, so a multi-GPU pod may take the total past the
//     target by up to its other GPUs, and the first that does not fit
//     ends the tuning (tuneUpPods). Above the target, pods drawn at
//     random among those left (rand.Intn) are removed until the total
//     fits (tuneDownPods); Arrivals.Cut counts them.
//
// Every pod left arrives: nothing is cut at the target. demand ≤ 0
// leaves the trace untuned, as the artifact's ratio 0 does.
//
// The artifact measures the allocation ratio after each pod and reports
// the mean over the pods whose arrived demand rounds to the target's
// percent; replays of these arrivals measure it so too
// (Metrics.ArtifactAllocation), besides the ratio after the last pod.
func FGDArrivals(tr *Trace, clusterGPUs int, demand float64, seed uint64) (Arrivals, error) {
	if len(tr.Jobs) == 0 {
		return Arrivals{}, fmt.Errorf("trace %s has no jobs", tr.Source)
	}
	byName := slices.SortedStableFunc(slices.Values(tr.Jobs), func(a, b Job) int { return cmp.Compare(a.Name, b.Name) })
	tuneSeed := seed
	if tuneSeed == 0 {
		tuneSeed = inflateSeed
	}
	rng := rand.New(rand.NewSource(int64(tuneSeed)))
	rng.Int()
	jobs := slices.Clone(byName)
	if seed != 0 {
		rng.Shuffle(len(jobs), func(x, y int) { jobs[x], jobs[y] = jobs[y], jobs[x] })
	}
	var a Arrivals
	for _, j := range jobs {
		a.RequestedMilliGPU += j.milli()
	}
	if demand > 0 && a.RequestedMilliGPU == 0 {
		// Tuning up would never end; the artifact panics.
		return Arrivals{}, fmt.Errorf("trace %s asks for no GPU to tune to demand %v", tr.Source, demand)
	}
	// The artifact's product, not demand × GPUs × 1000: the two can
	// round apart.
	target := demand * float64(clusterGPUs*1000)
	switch {
	case demand <= 0:
	case float64(a.RequestedMilliGPU) > target:
		for float64(a.RequestedMilliGPU) > target {
			i := rng.Intn(len(jobs))
			a.RequestedMilliGPU -= jobs[i].milli()
			jobs = slices.Delete(jobs, i, i+1)
			a.Cut++
		}
	case float64(a.RequestedMilliGPU) < target:
		for {
			j := byName[rng.Intn(len(byName))]
			if float64(a.RequestedMilliGPU+j.milliPerGPU()) > target {
				break
			}
			j.Name = fmt.Sprintf("%s-tuned-%d", j.Name, a.Sampled)
			jobs = append(jobs, j)
			a.RequestedMilliGPU += j.milli()
			a.Sampled++
		}
	}
	a.Jobs = jobs
	a.nodePerm = rng.Perm
	return a, nil
}

// milliPerGPU is what each of a pod's GPUs asks for, in milli-GPUs: the
// artifact's gpu-milli annotation; 0 for a pod without GPUs.
func (j Job) milliPerGPU() int64 {
	if j.GPUsPerPod == 0 {
		return 0
	}
	return int64(j.MilliGPU / j.GPUsPerPod)
}
