package simulate

import (
	"encoding/json"
	"fmt"
	"io"
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

// WriteTable prints gputopo and the baseline side by side, and the FGD
// paper's ratios for the same workload when known.
func WriteTable(w io.Writer, r *Result) error {
	var b strings.Builder
	c := r.Cluster
	fmt.Fprintf(&b, "cluster: %d nodes, %d GPUs, %d leaves under %d spines, up to %d nodes per leaf\n", c.Nodes, c.GPUs, c.Leaves, c.Spines, c.NodesPerLeaf)
	t := r.Trace
	fmt.Fprintf(&b, "trace:   %s %s: %d jobs", t.Format, t.Source, t.TraceJobs)
	if t.SkippedNoGPU > 0 {
		fmt.Fprintf(&b, " (%d pods without GPUs skipped)", t.SkippedNoGPU)
	}
	if t.Timed {
		fmt.Fprintf(&b, ", timed: arrivals and departures\n")
	} else {
		if r.Demand > 0 {
			fmt.Fprintf(&b, "; %d arrived at demand %.2f", t.Arrived, r.Demand)
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
	fmt.Fprintf(&b, "         pods by GPUs per pod %s; %s; %d shared-GPU pods rounded up to a whole GPU\n\n", t.PodsByGPUs, order, r.SharedPodsRoundedUp)
	fmt.Fprint(w, b.String())

	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	m, o := r.Metrics, r.Baseline
	row := func(name, a, b string) { fmt.Fprintf(tw, "%s\t%s\t%s\t\n", name, a, b) }
	pct := func(x float64) string { return fmt.Sprintf("%.2f %%", 100*x) }
	num := func(x int) string { return fmt.Sprintf("%d", x) }
	ms := func(x Metrics) string {
		return fmt.Sprintf("%.2f / %.2f / %.2f", x.PlanLatencyP50Ms, x.PlanLatencyP99Ms, x.PlanLatencyMaxMs)
	}
	row("", "gputopo", "baseline (first fit)")
	row("jobs placed / arrived", fmt.Sprintf("%d / %d", m.Placed, m.Jobs), fmt.Sprintf("%d / %d", o.Placed, o.Jobs))
	row("refused (partially fitting)", fmt.Sprintf("%d (%d)", m.Refused, m.PartialJobs), fmt.Sprintf("%d (%d)", o.Refused, o.PartialJobs))
	row("requested GPUs", num(m.RequestedGPUs), num(o.RequestedGPUs))
	held := "allocated GPUs at the end"
	if t.Timed {
		held = "allocated GPUs, time mean"
	}
	row(held, fmt.Sprintf("%.0f", m.AllocatedGPUs), fmt.Sprintf("%.0f", o.AllocatedGPUs))
	row("allocation ratio (whole GPUs)", pct(m.AllocationRatio), pct(o.AllocationRatio))
	if !t.Timed {
		row("allocation ratio (milli-GPU, FGD's)", pct(m.MilliAllocationRatio), pct(o.MilliAllocationRatio))
	}
	if m.MultiNodeJobs > 0 {
		row("multi-node jobs placed", fmt.Sprintf("%d / %d", m.MultiNodePlaced, m.MultiNodeJobs), fmt.Sprintf("%d / %d", o.MultiNodePlaced, o.MultiNodeJobs))
		row("same-domain ratio", pct(m.SameDomainRatio), pct(o.SameDomainRatio))
	} else {
		row("same-domain ratio", "- (no multi-node jobs)", "-")
	}
	when := "at the end"
	if t.Timed {
		when = "mean over arrivals"
	}
	row("node fragmentation, "+when, pct(m.Fragmentation), pct(o.Fragmentation))
	row("leaf fragmentation, "+when, pct(m.LeafFragmentation), pct(o.LeafFragmentation))
	row("plan latency p50 / p99 / max ms", ms(m), ms(o))
	row("allocator runs", num(m.AllocatorRuns), num(o.AllocatorRuns))
	row("replay wall time", fmt.Sprintf("%.1f s", m.ReplaySeconds), fmt.Sprintf("%.1f s", o.ReplaySeconds))
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}

	if len(r.Published) > 0 {
		fmt.Fprintf(w, "\nFGD paper (Weng et al., USENIX ATC'23, artifact results), %s at %.0f %% demand, mean of %d seeds.\n", Workload(t.Source), 100*r.Demand, r.Published[0].Seeds)
		fmt.Fprintf(w, "Its ratio counts milli-GPUs with GPU sharing and CPU/memory limits; compare it with our milli-GPU row:\n")
		tw = tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
		for _, p := range r.Published {
			fmt.Fprintf(tw, "  %s\t%s\t\n", p.Policy, pct(p.AllocationRatio))
		}
		fmt.Fprintf(tw, "  gputopo (whole GPUs, no sharing)\t%s\t\n", pct(m.MilliAllocationRatio))
		fmt.Fprintf(tw, "  baseline first fit (whole GPUs)\t%s\t\n", pct(o.MilliAllocationRatio))
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write table: %w", err)
		}
	}
	fmt.Fprintf(w, "\ntotal wall time %.1f s\n", r.WallSeconds)
	return nil
}
