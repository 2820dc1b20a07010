package simulate

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// WriteJSON writes the result as indented JSON.
func WriteJSON(w io.Writer, r *Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write JSON result: %w", err)
	}
	return nil
}

// WriteTable prints gputopo, the default scheduler's model and first fit
// side by side, and the FGD paper's ratios when the run is its setting.
func WriteTable(w io.Writer, r *Result) error {
	var b strings.Builder
	c := r.Cluster
	fmt.Fprintf(&b, "cluster: %d nodes, %d GPUs, %d leaves under %d spines, up to %d nodes per leaf", c.Nodes, c.GPUs, c.Leaves, c.Spines, c.NodesPerLeaf)
	if c.CPUAndMemory {
		fmt.Fprintf(&b, "; CPU and memory counted")
	}
	if r.Sharing {
		fmt.Fprintf(&b, "; GPUs shared")
	}
	t := r.Trace
	fmt.Fprintf(&b, "\ntrace:   %s %s: %d jobs", t.Format, t.Source, t.TraceJobs)
	if t.CPUOnlyPods > 0 {
		fmt.Fprintf(&b, " (%d of them pods without GPUs, placed for their CPU and memory by the default scheduler's model, or first fit)", t.CPUOnlyPods)
	}
	if t.Timed {
		fmt.Fprintf(&b, ", timed: arrivals and departures; a job that does not fit waits, in arrival order, with backfill;\n")
		fmt.Fprintf(&b, "         run time = duration × the locality factor of the highest tier a job's pods span (%s)\n", r.Locality)
	} else {
		if r.Demand > 0 {
			fmt.Fprintf(&b, "; %d arrived at %.0f %% demand in milli-GPUs", t.Arrived, 100*r.Demand)
		} else {
			fmt.Fprintf(&b, "; all %d arrived", t.Arrived)
		}
		if t.Sampled > 0 {
			fmt.Fprintf(&b, " (%d of them sampled again from the trace)", t.Sampled)
		}
		fmt.Fprintf(&b, ", no departures\n")
	}
	order := "trace order"
	if len(r.Seeds) > 1 || r.Seeds[0] != 0 || t.Timed {
		order = fmt.Sprintf("seeds %v", r.Seeds)
		if len(r.Seeds) > 1 {
			order += " (means)"
		}
	}
	shares := ""
	if t.SharedPods > 0 {
		shares = fmt.Sprintf("; %d pods ask for a share of a GPU", t.SharedPods)
		if !r.Sharing {
			shares += " and get a whole one (no --sharing)"
		}
	}
	fmt.Fprintf(&b, "         pods by GPUs per pod %s; %s%s\n\n", t.PodsByGPUs, order, shares)
	fmt.Fprint(w, b.String())

	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	var all []Metrics
	for _, m := range []Metrics{r.Metrics, r.Baseline, r.FirstFit} {
		if m.Scheduler != "" { // replayed (Options.Schedulers)
			all = append(all, m)
		}
	}
	if r.FGD != nil {
		all = append(all, *r.FGD)
	}
	row := func(name string, f func(Metrics) string) {
		fmt.Fprintf(tw, "%s\t", name)
		for _, m := range all {
			fmt.Fprintf(tw, "%s\t", f(m))
		}
		fmt.Fprintln(tw)
	}
	pct := func(x float64) string { return fmt.Sprintf("%.2f %%", 100*x) }
	row("", func(m Metrics) string { return m.Scheduler })
	row("GPU jobs placed / arrived", func(m Metrics) string { return fmt.Sprintf("%d / %d", m.Placed, m.Jobs) })
	if r.Metrics.CPUOnlyPods > 0 {
		row("pods without GPUs placed / arrived", func(m Metrics) string { return fmt.Sprintf("%d / %d", m.CPUOnlyPlaced, m.CPUOnlyPods) })
	}
	row("never placed (partly fitting)", func(m Metrics) string { return fmt.Sprintf("%d (%d)", m.Refused, m.PartialJobs) })
	artifact := slices.ContainsFunc(all, func(m Metrics) bool { return m.ArtifactAllocation > 0 })
	if artifact {
		row("GPU allocation, milli-GPUs, FGD's measure*", func(m Metrics) string { return pct(m.ArtifactAllocation) })
		if len(r.PerSeed) > 1 {
			row("  min – max over seeds", func(m Metrics) string {
				lo, hi := r.artifactSpread(m.Scheduler)
				return fmt.Sprintf("%s – %s", pct(lo), pct(hi))
			})
		}
	}
	when := "at the end"
	if t.Timed {
		when = "time mean"
	}
	row("GPU allocation, milli-GPUs, "+when, func(m Metrics) string { return pct(m.MilliAllocationRatio) })
	if len(r.PerSeed) > 1 {
		row("  min – max over seeds", func(m Metrics) string {
			lo, hi := r.spread(m.Scheduler)
			return fmt.Sprintf("%s – %s", pct(lo), pct(hi))
		})
	}
	row("GPUs holding anything, "+when, func(m Metrics) string { return pct(m.AllocationRatio) })
	if t.Timed {
		row("  of it doing work at full speed", func(m Metrics) string { return pct(m.UsefulUtilization) })
		row("jobs that waited", func(m Metrics) string { return fmt.Sprintf("%d", m.Waited) })
		row("queueing delay mean / p95", func(m Metrics) string {
			return fmt.Sprintf("%s / %s", seconds2(m.MeanQueueWaitS), seconds2(m.P95QueueWaitS))
		})
		row("job completion time mean / p95", func(m Metrics) string {
			return fmt.Sprintf("%s / %s", seconds2(m.MeanJCTS), seconds2(m.P95JCTS))
		})
		if len(r.PerSeed) > 1 {
			row("  mean, min – max over seeds", func(m Metrics) string {
				lo, hi := r.jctSpread(m.Scheduler)
				return fmt.Sprintf("%s – %s", seconds2(lo), seconds2(hi))
			})
		}
		if r.Metrics.MultiNodeJobs > 0 {
			row("  mean, multi-node jobs", func(m Metrics) string { return seconds2(m.MultiNodeMeanJCTS) })
		}
		row("  floor: each job at once, nearest tier", func(m Metrics) string { return seconds2(m.FloorJCTS) })
		row("makespan", func(m Metrics) string { return seconds2(m.MakespanS) })
	}
	if r.Metrics.MultiNodeJobs > 0 {
		row("multi-node jobs placed", func(m Metrics) string { return fmt.Sprintf("%d / %d", m.MultiNodePlaced, m.MultiNodeJobs) })
		row("of them in their size-rule domain", func(m Metrics) string { return pct(m.SameDomainRatio) })
		row("of them across spines", func(m Metrics) string { return fmt.Sprintf("%d", m.CrossSpine) })
	}
	when = "at the end"
	if t.Timed {
		when = "mean over arrivals"
	}
	row("node fragmentation, "+when, func(m Metrics) string { return pct(m.Fragmentation) })
	row("leaf fragmentation, "+when, func(m Metrics) string { return pct(m.LeafFragmentation) })
	row("plan latency p50 / p99 / max ms", func(m Metrics) string {
		return fmt.Sprintf("%.2f / %.2f / %.2f", m.PlanLatencyP50Ms, m.PlanLatencyP99Ms, m.PlanLatencyMaxMs)
	})
	row("allocator runs", func(m Metrics) string { return fmt.Sprintf("%d", m.AllocatorRuns) })
	row("replay wall time", func(m Metrics) string { return fmt.Sprintf("%.1f s", m.ReplaySeconds) })
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	if artifact {
		fmt.Fprintf(w, "* as the FGD artifact measures it: the milli-GPU allocation after each arrival, mean over the arrivals\n"+
			"  whose arrived demand (milli-GPUs of every pod arrived, placed or not) rounds to %.0f %% of the cluster (%.0f ± 1 %% if none)\n", math.Round(100*r.Demand), math.Round(100*r.Demand))
	}
	if t.Timed && len(r.Metrics.UtilizationOverTime) > 0 {
		fmt.Fprintf(w, "\nutilization (milli-GPU) and jobs waiting over the arrivals' span, %d stretches:\n", len(r.Metrics.UtilizationOverTime))
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "from\t")
		for _, m := range all {
			fmt.Fprintf(tw, "%s\twaiting\t", m.Scheduler)
		}
		fmt.Fprintln(tw)
		for k, s := range r.Metrics.UtilizationOverTime {
			fmt.Fprintf(tw, "%s\t", seconds2(s.AtS))
			for _, m := range all {
				if k < len(m.UtilizationOverTime) {
					fmt.Fprintf(tw, "%.1f %%\t%.1f\t", 100*m.UtilizationOverTime[k].Utilization, m.UtilizationOverTime[k].Queued)
				}
			}
			fmt.Fprintln(tw)
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write table: %w", err)
		}
	}

	if len(r.Published) > 0 {
		fmt.Fprintf(w, "\nFGD paper (Weng et al., USENIX ATC'23, artifact results), %s at %.0f %% demand in milli-GPUs, with GPU sharing, mean of %d seeds,\n", Workload(t.Source), 100*r.Demand, r.Published[0].Seeds)
		measure := "milli-GPU allocation"
		if artifact {
			measure = "milli-GPU allocation in the artifact's measure*"
		}
		fmt.Fprintf(w, "next to this run's %s:\n", measure)
		tw = tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
		for _, p := range r.Published {
			fmt.Fprintf(tw, "  paper %s\t%s\t\n", p.Policy, pct(p.AllocationRatio))
		}
		for _, m := range all {
			v := m.MilliAllocationRatio
			if artifact {
				v = m.ArtifactAllocation
			}
			fmt.Fprintf(tw, "  %s\t%s\t\n", m.Scheduler, pct(v))
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write table: %w", err)
		}
		if artifact {
			var end []string
			for _, m := range all {
				end = append(end, m.Scheduler+" "+pct(m.MilliAllocationRatio))
			}
			fmt.Fprintf(w, "  (at the end of the replay: %s)\n", strings.Join(end, ", "))
		}
	}
	fmt.Fprintf(w, "\ntotal wall time %.1f s\n", r.WallSeconds)
	return nil
}

// spread is the least and the greatest milli-GPU allocation of a
// scheduler over the seeds.
func (r *Result) spread(scheduler string) (lo, hi float64) {
	return r.minMax(scheduler, func(m SeedMeasure) float64 { return m.Allocation })
}

// artifactSpread is the least and the greatest allocation of a scheduler
// over the seeds in the FGD artifact's measure.
func (r *Result) artifactSpread(scheduler string) (lo, hi float64) {
	return r.minMax(scheduler, func(m SeedMeasure) float64 { return m.ArtifactAllocation })
}

// jctSpread is the least and the greatest mean job completion time of a
// scheduler over the seeds.
func (r *Result) jctSpread(scheduler string) (lo, hi float64) {
	return r.minMax(scheduler, func(m SeedMeasure) float64 { return m.MeanJCTS })
}

func (r *Result) minMax(scheduler string, get func(SeedMeasure) float64) (lo, hi float64) {
	for i, s := range r.PerSeed {
		m := s.Gputopo
		switch {
		case r.FGD != nil && scheduler == r.FGD.Scheduler:
			m = s.FGD
		case scheduler == r.Metrics.Scheduler:
		case scheduler == r.Baseline.Scheduler:
			m = s.Baseline
		case scheduler == r.FirstFit.Scheduler:
			m = s.FirstFit
		}
		v := get(m)
		if i == 0 || v < lo {
			lo = v
		}
		if i == 0 || v > hi {
			hi = v
		}
	}
	return lo, hi
}

// seconds2 prints a duration in seconds the short way: 42 s, 3.5 min, 2.1 h.
func seconds2(s float64) string {
	switch {
	case s < 120:
		return fmt.Sprintf("%.0f s", s)
	case s < 7200:
		return fmt.Sprintf("%.1f min", s/60)
	}
	return fmt.Sprintf("%.1f h", s/3600)
}
