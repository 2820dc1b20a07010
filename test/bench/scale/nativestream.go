package scale

import (
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"time"
)

// Paths of the native benchmark: one way each to place the same stream of
// Jobs. The names are the report's rows and --paths' values.
const (
	PathNativeLeaf  = "native-leaf"  // (a) spec.scheduling gang, topology key tier-0
	PathNativeSpine = "native-spine" // (b) spec.scheduling gang, topology key tier-1
	PathGputopo     = "gputopo"      // (c) gputopo allocating (--allocation-mode=controller)
	PathGputopoGang = "gputopo-gang" // (d) gputopo choosing, the scheduler allocating (gang, --allocation-mode=auto)
	PathPlain       = "plain"        // (e) plain kube-scheduler, no gang, no gputopo
)

// AllPaths are the paths in the report's order.
var AllPaths = []string{PathNativeLeaf, PathNativeSpine, PathGputopo, PathGputopoGang, PathPlain}

// StreamTemplates are the claim templates of a stream's Jobs, by kind.
var StreamTemplates = []string{"gpu-8-node", "gpu-4-nvlink", "gpu-1"}

// StreamItem is one arrival of the stream: a Job of Pods pods with one
// claim of Template each, or (Filler) one plain pod with a one-GPU claim
// that belongs to no group and contends for the same GPUs.
type StreamItem struct {
	Name     string
	Pods     int
	Template string
	Filler   bool
}

// GPUs is what the item asks for.
func (s StreamItem) GPUs() int { return s.Pods * templateGPUs(s.Template) }

func templateGPUs(t string) int {
	switch t {
	case "gpu-8-node":
		return 8
	case "gpu-4-nvlink":
		return 4
	}
	return 1
}

// jobSizes are the Job sizes drawn, with weights: many small Jobs, fewer
// large ones, up to 16 pods.
var jobSizes = []Weighted{{"1", 3}, {"2", 4}, {"4", 4}, {"8", 2}, {"12", 1}, {"16", 1}}

// Stream returns the seeded stream: jobs Jobs (1 to 16 pods; whole-node,
// NVLink-quad or one-GPU claims) with a filler pod after every
// fillerEvery-th Job (0: none). One seed gives one stream, whatever the
// path, so every path places the same arrivals in the same order.
func Stream(seed uint64, jobs, fillerEvery int) []StreamItem {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	total := 0
	for _, w := range jobSizes {
		total += w.Weight
	}
	var out []StreamItem
	fillers := 0
	for i := range jobs {
		n := r.IntN(total)
		pods := 1
		for _, w := range jobSizes {
			if n < w.Weight {
				fmt.Sscan(w.Name, &pods)
				break
			}
			n -= w.Weight
		}
		tmpl := StreamTemplates[r.IntN(len(StreamTemplates))]
		out = append(out, StreamItem{Name: fmt.Sprintf("j%03d-%dx%s", i, pods, tmpl), Pods: pods, Template: tmpl})
		if fillerEvery > 0 && (i+1)%fillerEvery == 0 {
			out = append(out, StreamItem{Name: fmt.Sprintf("filler-%03d", fillers), Pods: 1, Template: "gpu-1", Filler: true})
			fillers++
		}
	}
	return out
}

// NodesNeeded is the fewest nodes of gpusPerNode GPUs that hold the Job.
func (s StreamItem) NodesNeeded(gpusPerNode int) int {
	per := max(gpusPerNode/templateGPUs(s.Template), 1)
	return (s.Pods + per - 1) / per
}

// Domain is the level a Job's size rule puts it in: one leaf when it fits
// in one, else one spine, else the cluster.
func Domain(nodes, nodesPerLeaf, nodesPerSpine int) string {
	switch {
	case nodes <= nodesPerLeaf:
		return "leaf"
	case nodes <= nodesPerSpine:
		return "spine"
	}
	return "cluster"
}

// JobOutcome is what one path did with one Job of the stream.
type JobOutcome struct {
	Item StreamItem
	// Created is the create request; Bound the last pod bound (zero when
	// not all were); BoundPods how many were bound at the end.
	Created, Bound time.Time
	BoundPods      int
	// Leaves and Spines are those its bound pods landed in.
	Leaves, Spines map[string]bool
	// Refused: a pod of it carries a refusal (the scheduler's
	// Unschedulable or gputopo's) at the end; Why is its message.
	Refused bool
	Why     string
}

// NativeRow is one path's figures.
type NativeRow struct {
	Path string
	// Multi is the multi-pod Jobs all bound; InDomain those inside their
	// size rule's domain (one leaf, else one spine).
	Multi, InDomain int
	// Quads is the NVLink-quad claims allocated; Contiguous those whose
	// four GPUs share one NVLink block.
	Quads, Contiguous int
	// Bound p50/p95: create to all pods bound, over the Jobs all bound.
	BoundP50, BoundP95 float64
	// FreedP50: a waiting Job's pods all bound after capacity for it was
	// freed, p50 over the probes; FreedN probes.
	FreedP50 float64
	FreedN   int
	// LeavesFree: leaves with no pod bound at the end.
	LeavesFree, Leaves int
	// HeldGPUSeconds: GPUs in allocated claims of Jobs not all bound,
	// integrated over the run.
	HeldGPUSeconds float64
	// Jobs, JobsBound; Refused Jobs not all bound that carry a refusal;
	// Partial Jobs with some but not all pods bound at the end.
	Jobs, JobsBound, Refused, Partial int
	// GPUsBound: the GPUs of the Jobs all bound; GPUsAsked: of every Job.
	// A path that refuses large Jobs binds more Jobs; GPUs bound says
	// how much of the stream's work it placed.
	GPUsBound, GPUsAsked int
	Seconds              float64
}

// Summarize computes a path's placement columns from the Jobs' outcomes
// (fillers excluded). nodesPerLeaf and nodesPerSpine give each Job's
// size-rule domain; gpusPerNode the nodes a Job needs.
func Summarize(row *NativeRow, jobs []JobOutcome, gpusPerNode, nodesPerLeaf, nodesPerSpine int) {
	var waits []float64
	for _, j := range jobs {
		if j.Item.Filler {
			continue
		}
		row.Jobs++
		row.GPUsAsked += j.Item.GPUs()
		all := !j.Bound.IsZero()
		if !all && j.BoundPods > 0 {
			row.Partial++
		}
		if !all && j.Refused {
			row.Refused++
		}
		if !all {
			continue
		}
		row.JobsBound++
		row.GPUsBound += j.Item.GPUs()
		waits = append(waits, j.Bound.Sub(j.Created).Seconds())
		if j.Item.Pods < 2 {
			continue
		}
		row.Multi++
		switch Domain(j.Item.NodesNeeded(gpusPerNode), nodesPerLeaf, nodesPerSpine) {
		case "leaf":
			if len(j.Leaves) == 1 {
				row.InDomain++
			}
		case "spine":
			if len(j.Spines) == 1 {
				row.InDomain++
			}
		default:
			row.InDomain++
		}
	}
	row.BoundP50, row.BoundP95 = percentile(waits, 0.5), percentile(waits, 0.95)
}

// HeldIntegral integrates samples of GPUs held (at times ts, the value
// holding until the next sample) up to end, in GPU-seconds.
func HeldIntegral(ts []time.Time, held []int, end time.Time) float64 {
	idx := make([]int, len(ts))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return ts[idx[a]].Before(ts[idx[b]]) })
	sum := 0.0
	for k, i := range idx {
		next := end
		if k+1 < len(idx) {
			next = ts[idx[k+1]]
		}
		if d := next.Sub(ts[i]).Seconds(); d > 0 {
			sum += d * float64(held[i])
		}
	}
	return sum
}

// Share renders n of d as a percentage with the counts.
func Share(n, d int) string {
	if d == 0 {
		return "–"
	}
	return fmt.Sprintf("%.0f%% (%d/%d)", 100*float64(n)/float64(d), n, d)
}

// pathLabels name the paths in the report.
var pathLabels = map[string]string{
	PathNativeLeaf:  "(a) native gang, tier-0 (leaf) key",
	PathNativeSpine: "(b) native gang, tier-1 (spine) key",
	PathGputopo:     "(c) gputopo allocating (`--allocation-mode=controller`)",
	PathGputopoGang: "(d) gputopo choosing, scheduler allocating (gang, `--allocation-mode=auto`)",
	PathPlain:       "(e) plain kube-scheduler",
}

// WriteNative renders the rows as one Markdown table.
func WriteNative(w io.Writer, title string, rows []NativeRow) {
	fmt.Fprintf(w, "#### %s\n\n", title)
	fmt.Fprintln(w, "| Path | Multi-pod Jobs in their size-rule domain | NVLink-contiguous quads | Create → all bound p50 / p95 | Capacity freed → waiting Job bound p50 (probes) | Whole leaves free at end | GPU-s held by groups not all bound | Jobs all bound | GPUs in Jobs all bound | Refused (unbound, with a refusal) | Stuck part-bound |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		label := pathLabels[r.Path]
		if label == "" {
			label = r.Path
		}
		freed := "–"
		if r.FreedN > 0 {
			freed = fmt.Sprintf("%.2f s (%d)", r.FreedP50, r.FreedN)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %.2f s / %.2f s | %s | %d / %d | %.0f | %d / %d | %d / %d | %d | %d |\n",
			label, Share(r.InDomain, r.Multi), Share(r.Contiguous, r.Quads), r.BoundP50, r.BoundP95, freed,
			r.LeavesFree, r.Leaves, r.HeldGPUSeconds, r.JobsBound, r.Jobs, r.GPUsBound, r.GPUsAsked, r.Refused, r.Partial)
	}
	fmt.Fprintln(w)
}
