package simulate

import (
	"math"
	"strconv"
)

// allocSample is what had arrived and what was allocated, in
// milli-GPUs, at one point of a static replay.
type allocSample struct {
	arrived, used int64
}

// artifactAllocation is the FGD artifact's published allocation ratio
// (hkust-adsl/kubernetes-scheduler-simulator at 8f3d641) of one run, as
// a fraction, from what had arrived and what was allocated before the
// first arrival and after each; ok is false when no sample is near the
// demand.
//
// The artifact logs a line before the first pod (core.go:99, nothing
// arrived) and one after every pod, placed or not, with GPUs or not
// (simulator.go:312-342 SchedulePods; analysis.go:74): the milli-GPUs
// the nodes hold ("Used GPU Milli"), the cluster's GPUs ("Total GPUs")
// and "Arrived GPU Milli", the total milli-GPUs (per GPU × GPUs) of every
// pod that has arrived, counted before it is scheduled, so failed pods
// count. experiments/analysis/merge_alloc_discrete.py:96-120 then takes,
// per line,
//
//	arrive_ratio = round(arrived / total_gpus / 10, 0)  (percent, half to even)
//	alloc_ratio  = round(used / total_gpus / 10, 2)      (percent)
//
// and the figure at a demand of P percent is round(mean(alloc_ratio), 2)
// over the lines whose arrive_ratio is P; when there is none, over those
// whose arrive_ratio is P-1, P or P+1. The published figure is the mean
// of that over seeds.
func artifactAllocation(samples []allocSample, clusterGPUs int, demand float64) (ratio float64, ok bool) {
	if clusterGPUs <= 0 || demand <= 0 {
		return 0, false
	}
	target := math.Round(100 * demand) // the artifact's column, as ParsePublished picks it
	total := float64(clusterGPUs)
	var at, near []float64
	for _, s := range samples {
		arr := math.RoundToEven(float64(s.arrived) / total / 10)
		if arr < target-1 || arr > target+1 {
			continue
		}
		alloc := round2(float64(s.used) / total / 10)
		near = append(near, alloc)
		if arr == target {
			at = append(at, alloc)
		}
	}
	if len(at) == 0 {
		at = near
	}
	if len(at) == 0 {
		return 0, false
	}
	return round2(pairwiseSum(at)/float64(len(at))) / 100, true
}

// round2 is Python's round(x, 2) on a float: x correctly rounded to two
// decimals, an exact tie to even, as strconv formats it.
func round2(x float64) float64 {
	v, err := strconv.ParseFloat(strconv.FormatFloat(x, 'f', 2, 64), 64)
	if err != nil {
		return x
	}
	return v
}

// pairwiseSum is numpy's sum of a contiguous float64 array (pandas'
// Series.mean sums with it): pairwise, in blocks of up to 128 summed
// eight ways, so that the mean rounds as the artifact's does.
func pairwiseSum(a []float64) float64 {
	n := len(a)
	switch {
	case n < 8:
		s := 0.0
		for _, x := range a {
			s += x
		}
		return s
	case n <= 128:
		var r [8]float64
		copy(r[:], a[:8])
		i := 8
		for ; i < n-n%8; i += 8 {
			for k := range r {
				r[k] += a[i+k]
			}
		}
		s := ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
		for ; i < n; i++ {
			s += a[i]
		}
		return s
	default:
		n2 := n / 2
		n2 -= n2 % 8
		return pairwiseSum(a[:n2]) + pairwiseSum(a[n2:])
	}
}
