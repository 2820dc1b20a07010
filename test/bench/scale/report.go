package scale

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// ms renders seconds as milliseconds.
func ms(s float64) string {
	if math.IsNaN(s) {
		return "–"
	}
	return fmt.Sprintf("%.2f ms", s*1000)
}

// Ratio is the topology workload's mean pods/s over the count-only one's.
func Ratio(runs []WorkloadResult) (topo, count, ratio float64) {
	var nt, nc int
	for _, r := range runs {
		switch r.Workload {
		case "topology":
			topo += r.PodsPerSecond
			nt++
		case "count":
			count += r.PodsPerSecond
			nc++
		}
	}
	if nt == 0 || nc == 0 || count == 0 {
		return 0, 0, 0
	}
	topo, count = topo/float64(nt), count/float64(nc)
	return topo, count, topo / count
}

// WriteThroughput renders the throughput runs as Markdown.
func WriteThroughput(w io.Writer, title string, runs []WorkloadResult, mem []ProcStat) {
	fmt.Fprintf(w, "#### %s\n\n", title)
	fmt.Fprintln(w, "| Round | Workload | Pods bound | GPUs | Pods/s | Created in | Latency p50 / p99 | Filter + score per pod | Filter phase per pod | DRA Filter per node | Scheduler CPU per pod | API server CPU per pod |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range runs {
		perPod := func(proc string) string { return ms(r.Sched.CPU[proc] / float64(max(r.Bound, 1))) }
		fmt.Fprintf(w, "| %d | %s | %d / %d | %d | **%.1f** | %.1f s | %.1f s / %.1f s | %s | %s | %s | %s | %s |\n",
			r.Round, r.Workload, r.Bound, r.Pods, r.GPUs, r.PodsPerSecond, r.CreateSeconds, r.LatencyP50, r.LatencyP99,
			ms(r.Sched.AlgorithmMean), ms(r.Sched.ExtensionPoint["Filter"]), ms(r.Sched.DRA["Filter"]),
			perPod("kube-scheduler"), perPod("kube-apiserver"))
	}
	t, c, ratio := Ratio(runs)
	fmt.Fprintf(w, "\nMean pods/s: topology %.1f, count-only %.1f, **ratio (a)/(b) = %.2f**.\n\n", t, c, ratio)
	writeMemory(w, mem)
}

// WriteController renders a controller run as Markdown.
func WriteController(w io.Writer, title string, r ControllerResult) {
	fmt.Fprintf(w, "#### %s\n\n", title)
	fmt.Fprintln(w, "| Jobs bound | Pods bound | GPUs asked | Jobs created in | Every Job bound after | Job wait p50 / p99 / max | Most later Jobs bound first | Controller CPU |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	cpu := "none runs"
	if r.Path == PathGputopo {
		cpu = fmt.Sprintf("%.1f s", r.ControllerCPU)
	}
	fmt.Fprintf(w, "| %d / %d | %d / %d | %d | %.1f s | %.1f s | %.1f / %.1f / %.1f s (%s) | %d (%s) | %s |\n\n",
		r.JobsBound, r.Jobs, r.PodsBound, r.Pods, r.GPUs, r.CreateSeconds, r.AllBoundSeconds,
		r.WaitP50, r.WaitP99, r.WaitMax, r.WaitMaxJob, r.MaxOvertaken, r.MaxOvertakenJob, cpu)
	fmt.Fprintf(w, "GPUs asked: %.0f %% of the cluster's. Longest wait by shape (s): %s. Longest wait behind later arrivals (from the first bind of a Job created after it to its own): %.1f s (%s); counting only later Jobs bound on the nodes it got in the end: %.1f s (%s).\n\n",
		100*r.Demand, joinFloats(r.WaitMaxByShape), r.MaxBehind, r.MaxBehindJob, r.MaxBehindOnItsNodes, r.MaxBehindOnItsNodesJob)
	if r.HoldSeconds > 0 {
		fmt.Fprintf(w, "Each Job ran %.0f s once bound and was then deleted: %d Jobs completed.\n\n", r.HoldSeconds, r.Completed)
	}
	if len(r.Unbound) > 0 {
		fmt.Fprintf(w, "Not bound at the end, by shape: %s.\n\n", joinCounts(r.Unbound))
	}
	if len(r.Decisions) > 0 {
		fmt.Fprintf(w, "Controller decisions: %s.\n\n", joinFloats(r.Decisions))
	}
	if len(r.Histograms) > 0 {
		fmt.Fprintf(w, "| Controller histogram | Series | Count | p50 | p90 | p99 | Mean | Over %s |\n", PlanGoal)
		fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
		for _, h := range r.Histograms {
			over := "–"
			if h.OverGoal >= 0 {
				over = fmt.Sprintf("%.0f", h.OverGoal)
			}
			fmt.Fprintf(w, "| %s | %s | %.0f | %s | %s | %s | %s | %s |\n", h.Name, h.Labels, h.Count, ms(h.P50), ms(h.P90), ms(h.P99), ms(h.Mean), over)
		}
		fmt.Fprintln(w)
	}
	if r.Planner.Count > 0 {
		writeSlowPlanner(w, r.Planner, r.SlowPlanner)
	}
	if len(r.WritesByClient) > 0 {
		fmt.Fprintln(w, "| Client (audit log) | Writes | Per Job | Largest |")
		fmt.Fprintln(w, "|---|---|---|---|")
		for _, who := range slices.Sorted(maps.Keys(r.WritesByClient)) {
			total := 0
			for _, n := range r.WritesByClient[who] {
				total += n
			}
			fmt.Fprintf(w, "| %s | %d | %.1f | %s |\n", who, total, float64(total)/float64(max(r.Jobs, 1)), topCounts(r.WritesByClient[who], 3))
		}
		fmt.Fprintln(w)
	}
	if len(r.Stages) > 0 {
		fmt.Fprintln(w, "| Stage of a pod's wait (audit log) | Pods | p50 | p90 | p99 | Max |")
		fmt.Fprintln(w, "|---|---|---|---|---|---|")
		for _, st := range r.Stages {
			fmt.Fprintf(w, "| %s | %d | %.1f s | %.1f s | %.1f s | %.1f s |\n", st.Stage, st.Pods, st.P50, st.P90, st.P99, st.Max)
		}
		fmt.Fprintln(w)
	}
	total := 0.0
	for _, v := range r.Writes {
		total += v
	}
	fmt.Fprintf(w, "API writes (apiserver_request_total, every client): %.0f, %.1f per Job; %s.\n\n", total, total/float64(max(r.Jobs, 1)), topFloats(r.Writes, 6))
	writeMemory(w, r.Memory)
}

// WritePlugin renders the plugin's memory as Markdown.
func WritePlugin(w io.Writer, r PluginResult) {
	fmt.Fprintf(w, "#### Kubelet plugin on one real node (%s, %d GPUs)\n\n", r.Profile, r.GPUs)
	fmt.Fprintln(w, "| Process | State | RSS | of it heap and stacks / mapped files | Peak RSS | CPU |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	row := func(name, state string, p ProcStat) {
		fmt.Fprintf(w, "| %s | %s | %s MiB | %s / %s MiB | %s MiB | %.2f s |\n", name, state, MiB(p.RSS), MiB(p.RSSAnon), MiB(p.RSSFile), MiB(p.PeakRSS), p.CPUSeconds)
	}
	row("gputopo-kubelet-plugin", "slices published", r.Idle)
	row("gputopo-kubelet-plugin", fmt.Sprintf("%d pods prepared", r.Pods), r.Loaded)
	row("kubelet", fmt.Sprintf("%d pods running", r.Pods), r.Kubelet)
	fmt.Fprintln(w)
}

func writeMemory(w io.Writer, mem []ProcStat) {
	if len(mem) == 0 {
		return
	}
	fmt.Fprintln(w, "| Process | RSS at the end | Peak RSS | CPU since start |")
	fmt.Fprintln(w, "|---|---|---|---|")
	for _, p := range mem {
		fmt.Fprintf(w, "| %s | %s MiB | %s MiB | %.0f s |\n", p.Name, MiB(p.RSS), MiB(p.PeakRSS), p.CPUSeconds)
	}
	fmt.Fprintln(w)
}

func joinCounts(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s: %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

func joinFloats(m map[string]float64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// topCounts lists the n largest entries, largest first.
func topCounts(m map[string]int, n int) string {
	f := make(map[string]float64, len(m))
	for k, v := range m {
		f[k] = float64(v)
	}
	return topFloats(f, n)
}

func topFloats(m map[string]float64, n int) string {
	keys := slices.Collect(maps.Keys(m))
	sort.Slice(keys, func(i, j int) bool {
		if m[keys[i]] != m[keys[j]] {
			return m[keys[i]] > m[keys[j]]
		}
		return keys[i] < keys[j]
	})
	var parts []string
	for _, k := range keys[:min(n, len(keys))] {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// writeSlowPlanner reports where the slowest plans' time went, from the
// controller's execution trace.
func writeSlowPlanner(w io.Writer, all RegionStats, slow []TraceRegion) {
	fmt.Fprintf(w, "Execution trace: %d planner regions, %s in all, %d CPU samples of the planning goroutine inside them (about %d ms of CPU); %d of %s or more.\n\n",
		all.Count, all.Took.Round(time.Millisecond), all.Samples, all.Samples*10, all.Long, PlanGoal/2)
	if len(slow) == 0 {
		return
	}
	fmt.Fprintln(w, "| Planner region (slowest) | At | On a P | Waiting for a P | Blocked | GC assist / mark overlap / workers | Other goroutines on a P | CPU samples: planner / process |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|")
	d := func(x time.Duration) string { return fmt.Sprintf("%.1f", float64(x)/float64(time.Millisecond)) }
	for _, r := range slow {
		fmt.Fprintf(w, "| %s ms | %.1f s | %s | %s | %s | %s / %s / %s | %s | %d / %d |\n", d(r.Took), r.Start.Seconds(),
			d(r.Running), d(r.Runnable), d(r.Blocked), d(r.Assist), d(r.GCMark), d(r.GCWorkers), d(r.Others), r.Samples, r.ProcessSamples)
	}
	fmt.Fprintln(w, "\nTimes in ms. A thread is sampled about once per 10 ms of CPU it uses, so a goroutine that held a P much longer than its samples account for spent that time waiting for the kernel to give the process a core.")
	fmt.Fprintln(w)
}
