package simulate

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/topology"
)

// fgdClass is one shape of the FGD artifact's target workload (its
// "typical pods", GetTypicalPods): the CPU a pod asks for (100 milli-CPU
// when none, as kube-scheduler counts it), its GPUs, the milli-GPU it
// asks of each (0 without GPUs) and the GPU models it may use (empty:
// any), with its share of the pods the workload covers.
type fgdClass struct {
	gpus, milli int
	cpu         int64
	models      []string
	weight      float64
}

// fgdTypical is the artifact's target workload taken from jobs
// (fgdShapes), each shape weighted by its share of the pods the workload
// covers, so that the weights sum to 1.
func fgdTypical(jobs []Job, sharing bool) []fgdClass {
	out := fgdShapes(jobs, sharing)
	covered := 0.0
	for _, c := range out {
		covered += c.weight
	}
	for i := range out {
		out[i].weight /= covered
	}
	return out
}

// fgdShapes are the most common pod shapes of jobs, one at a time, until
// they cover fgdTypicalShare of the pods, each weighted by how many pods
// have it (ties in the order they first appear; the artifact sorts a map,
// so its order among equal counts is arbitrary).
func fgdShapes(jobs []Job, sharing bool) []fgdClass {
	type key struct {
		gpus, milli int
		cpu         int64
		models      string
	}
	count := map[key]float64{}
	models := map[key][]string{}
	var order []key
	total := 0.0
	for _, j := range jobs {
		k := key{gpus: j.GPUsPerPod, cpu: j.CPUMilli, models: strings.Join(j.GPUModels, "|")}
		if k.cpu == 0 {
			k.cpu = defaultCPUMilli
		}
		if j.GPUsPerPod > 0 {
			k.milli = topology.MilliPerGPU
			if share := shareOf(j, sharing); share > 0 {
				k.milli = share
			}
		}
		if _, ok := count[k]; !ok {
			order = append(order, k)
			models[k] = j.GPUModels
		}
		count[k] += float64(j.Pods)
		total += float64(j.Pods)
	}
	slices.SortStableFunc(order, func(a, b key) int { return cmp.Compare(count[b], count[a]) })
	var out []fgdClass
	covered := 0.0
	for _, k := range order {
		if covered >= fgdTypicalShare*total {
			break
		}
		covered += count[k]
		out = append(out, fgdClass{gpus: k.gpus, milli: k.milli, cpu: k.cpu, models: models[k], weight: count[k]})
	}
	return out
}

// fgdNodeFrag is the artifact's NodeGpuShareFragAmountScore
// (pkg/utils/frag.go): for each typical pod, weighted by its share, the
// node's free milli-GPUs it cannot use. A pod without GPUs, a pod of
// another GPU model, a pod the node has too few GPUs with room for or too
// little CPU left for, finds every free milli-GPU a fragment; a pod that
// fits finds the GPUs with less free than it asks of each one. The
// amounts are summed by fragment kind, then the kinds, as the artifact
// sums them.
func fgdNodeFrag(typical []fgdClass, model string, cpuLeft int64, free []int) float64 {
	total := 0
	for _, f := range free {
		total += f
	}
	// By the artifact's kinds: q1 lack both, q2 lack GPU, q4 lack CPU,
	// xl and xr (pods without GPUs), no access; q3 (usable) not counted.
	var q1, q2, q4, xl, xr, na float64
	for _, t := range typical {
		if t.milli == 0 {
			if cpuLeft >= t.cpu {
				xl += t.weight * float64(total)
			} else {
				xr += t.weight * float64(total)
			}
			continue
		}
		if len(t.models) > 0 && !slices.Contains(t.models, model) {
			na += t.weight * float64(total)
			continue
		}
		room, stranded := 0, 0
		for _, f := range free {
			if f >= t.milli {
				room++
			} else {
				stranded += f
			}
		}
		cpuOK := cpuLeft >= t.cpu
		switch {
		case room >= t.gpus && cpuOK:
			q2 += t.weight * float64(stranded)
		case room >= t.gpus:
			q4 += t.weight * float64(total)
		case cpuOK:
			q2 += t.weight * float64(total)
		default:
			q1 += t.weight * float64(total)
		}
	}
	return q1 + q2 + q4 + xl + xr + na
}

// newFGDArtifact is the FGD artifact's scheduler as its published runs
// configure it (hkust-adsl/kubernetes-scheduler-simulator at 8f3d641,
// experiments/run_scripts: FGDScore alone of weight 1000, GPU selection
// FGD, every node scored): of the nodes with room (CPU and memory,
// GPUs, GPU model), the highest FGD score wins; among equal scores the
// least node name, which in the artifact is the node's place in a random
// permutation drawn after the tuning (prio, by node: lower first). A
// share goes to the GPU of the highest score on its node, the first by
// index among equal scores (calculateGpuShareFragExtendScore); whole GPUs
// to the first free ones by index (AllocateExclusiveGpuId), as the
// allocator takes them. A pod that asks neither CPU nor memory scores
// the maximum everywhere, as the plugin returns for a pod without
// requests.
func newFGDArtifact(c *Cluster, cl *Claims, typical []fgdClass, prio []int, l *ledger) *podScheduler {
	s := newPodScheduler("FGD (artifact)", c, cl, l)
	gpuOf := make([]int, len(c.Nodes))
	var free []int
	s.device = func(n int) string {
		if gpuOf[n] < 0 {
			return ""
		}
		return gpuDevice(gpuOf[n])
	}
	s.choose = func(j Job, share int) []int {
		type cand struct {
			n     int
			score int64
		}
		var cands []cand
		podCPU := j.CPUMilli
		if podCPU == 0 {
			podCPU = defaultCPUMilli
		}
		noRequests := j.CPUMilli == 0 && j.MemoryMiB == 0
		for n := range c.Nodes {
			gpuOf[n] = -1
			if !s.roomFor(n, j, share) {
				continue
			}
			nd := &c.Nodes[n]
			cpuLeft := nd.CPUMilli - s.cpu[n]
			free = append(free[:0], s.free[n]...)
			before := fgdNodeFrag(typical, nd.Model, cpuLeft, free)
			var score int64
			switch {
			case share > 0:
				found := false
				for i, f := range s.free[n] {
					if !s.shared[n][i] || f < share {
						continue
					}
					free[i] = f - share
					sc := planner.FGDScore(fgdNodeFrag(typical, nd.Model, cpuLeft-podCPU, free) - before)
					free[i] = f
					if !found || sc > score {
						score, gpuOf[n], found = sc, i, true
					}
				}
			default:
				taken := 0
				for i, f := range free {
					if taken < j.GPUsPerPod && f == topology.MilliPerGPU {
						free[i] = 0
						taken++
					}
				}
				score = planner.FGDScore(fgdNodeFrag(typical, nd.Model, cpuLeft-podCPU, free) - before)
			}
			if noRequests {
				score = 100
			}
			cands = append(cands, cand{n, score})
		}
		slices.SortFunc(cands, func(a, b cand) int {
			if a.score != b.score {
				return cmp.Compare(b.score, a.score)
			}
			return cmp.Compare(prio[a.n], prio[b.n])
		})
		out := make([]int, len(cands))
		for i, x := range cands {
			out[i] = x.n
		}
		return out
	}
	return s
}

func gpuDevice(i int) string { return "gpu-" + strconv.Itoa(i) }

// fgdNodePriority is the FGD artifact's order among nodes of equal score:
// it sorts the nodes by name and prefixes the i-th with the i-th number
// of a random permutation (simulator.go syncClusterResourceList), and its
// scheduler takes the least name among the best. perm is that
// permutation; the result is each node's prefix.
func fgdNodePriority(c *Cluster, perm []int) []int {
	byName := make([]int, len(c.Nodes))
	for i := range byName {
		byName[i] = i
	}
	slices.SortStableFunc(byName, func(a, b int) int { return cmp.Compare(c.Nodes[a].Name, c.Nodes[b].Name) })
	prio := make([]int, len(c.Nodes))
	for i, n := range byName {
		prio[n] = perm[i]
	}
	return prio
}
