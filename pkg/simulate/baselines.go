package simulate

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/topology"
)

// podScheduler places a job's pods one at a time, as a scheduler without
// gputopo does, and all or nothing: a job whose pods do not all fit is
// rolled back and counted as partial. choose picks the node of one pod.
type podScheduler struct {
	label  string
	claims *Claims
	eval   *devicefit.Evaluator
	*ledger
	sharing bool
	// choose returns the nodes to try for the pod, best first.
	choose func(j Job, share int) []int
	// device, when set, names the one device of node n a share of a GPU
	// must take, after choose ("" leaves it to the allocator).
	device func(n int) string
	// scoreCPU and scoreMem sum the requests the scheduler scores with
	// (non-zero defaults for pods that ask for nothing), by node.
	scoreCPU, scoreMem []int64
}

func (s *podScheduler) name() string { return s.label }

func (s *podScheduler) place(ctx context.Context, key string, j Job, _ time.Duration) (placement, error) {
	share := shareOf(j, s.sharing)
	out := placement{nodes: make([]int, 0, j.Pods)}
	var holds []hold
	for i := range j.Pods {
		claims := podClaims(s.claims, fmt.Sprintf("%s-%d", key, i), j, s.sharing)
		placed := false
		for _, n := range s.choose(j, share) {
			results := []resourceapi.AllocationResult{}
			if len(claims) > 0 {
				out.runs++
				var err error
				dev := ""
				if s.device != nil && share > 0 {
					dev = s.device(n)
				}
				if results, err = s.allocate(ctx, s.eval, n, claims, dev); err != nil {
					return placement{}, fmt.Errorf("%s: %w", s.label, err)
				}
				if results == nil {
					continue
				}
			}
			h := hold{node: n, results: results, cpu: j.CPUMilli, mem: j.MemoryMiB}
			s.takeScored(h, j, 1)
			holds = append(holds, h)
			out.nodes = append(out.nodes, n)
			placed = true
			break
		}
		if !placed {
			for _, h := range holds {
				s.takeScored(h, j, -1)
			}
			return placement{partial: len(holds) > 0, runs: out.runs}, nil
		}
	}
	if err := s.commit(key, holds); err != nil {
		return placement{}, err
	}
	out.ok = true
	span, ok := s.c.leafSpan(out.nodes)
	out.inDomain = ok && span <= s.c.requiredLeaves(j.Pods)
	return out, nil
}

// takeScored takes (sign 1) or gives back a pod's hold, with the
// requests the scheduler scores with.
func (s *podScheduler) takeScored(h hold, j Job, sign int64) {
	if sign > 0 {
		s.take(h)
	} else {
		s.give(h)
	}
	cpu, mem := scoredRequests(j)
	s.scoreCPU[h.node] += sign * cpu
	s.scoreMem[h.node] += sign * mem
}

func (s *podScheduler) release(key string) {
	for _, h := range s.held[key] {
		cpu, mem := scoredRequests(Job{CPUMilli: h.cpu, MemoryMiB: h.mem})
		s.scoreCPU[h.node] -= cpu
		s.scoreMem[h.node] -= mem
	}
	s.ledger.release(key)
}

func scoredRequests(j Job) (cpu, mem int64) {
	cpu, mem = j.CPUMilli, j.MemoryMiB
	if cpu == 0 {
		cpu = defaultCPUMilli
	}
	if mem == 0 {
		mem = defaultMemoryMiB
	}
	return cpu, mem
}

func newPodScheduler(label string, c *Cluster, cl *Claims, l *ledger) *podScheduler {
	return &podScheduler{label: label, claims: cl, eval: cl.evaluator(), ledger: l, sharing: c.Sharing,
		scoreCPU: make([]int64, len(c.Nodes)), scoreMem: make([]int64, len(c.Nodes))}
}

// newFirstFit is the plain first fit gputopo was first compared with:
// each pod on the first node, in name order, with room for it.
func newFirstFit(c *Cluster, cl *Claims) *podScheduler {
	s := newPodScheduler("first fit", c, cl, newLedger(c))
	order := make([]int, len(c.Nodes))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(x, y int) bool { return topology.NaturalLess(c.Nodes[order[x]].Name, c.Nodes[order[y]].Name) })
	s.choose = func(j Job, share int) []int {
		var out []int
		for _, n := range order {
			if s.roomFor(n, j, share) {
				out = append(out, n)
			}
		}
		return out
	}
	return s
}

// newSchedulerModel models kube-scheduler's default profile for a pod
// with DRA claims: from a rotating start, it looks for feasible nodes
// until it has found numFeasibleNodesToFind of them; it scores those with
// NodeResourcesFit's LeastAllocated and NodeResourcesBalancedAllocation
// over CPU and memory as kube-scheduler 1.37 computes them (DRA devices
// are not scored) and picks the best,
// breaking ties at random; the allocator, first fit over the node's
// devices, picks the GPUs.
func newSchedulerModel(c *Cluster, cl *Claims, seed uint64, l *ledger) *podScheduler {
	s := newPodScheduler("default scheduler", c, cl, l)
	rng := rand.New(rand.NewPCG(seed, 0xd5c4ed))
	next := 0
	s.choose = func(j Job, share int) []int {
		want := numFeasibleNodesToFind(len(c.Nodes))
		var feasible []int
		scanned := 0
		for ; scanned < len(c.Nodes) && len(feasible) < want; scanned++ {
			n := (next + scanned) % len(c.Nodes)
			if s.roomFor(n, j, share) {
				feasible = append(feasible, n)
			}
		}
		next = (next + scanned) % len(c.Nodes)
		scores := make([]int64, len(feasible))
		for i, n := range feasible {
			scores[i] = s.nodeScore(n, j)
		}
		// Best first; equal scores in random order, as selectHost draws
		// among the best.
		rng.Shuffle(len(feasible), func(a, b int) {
			feasible[a], feasible[b] = feasible[b], feasible[a]
			scores[a], scores[b] = scores[b], scores[a]
		})
		idx := make([]int, len(feasible))
		for i := range idx {
			idx[i] = i
		}
		sort.SliceStable(idx, func(a, b int) bool { return scores[idx[a]] > scores[idx[b]] })
		out := make([]int, len(idx))
		for i, k := range idx {
			out[i] = feasible[k]
		}
		return out
	}
	return s
}

// numFeasibleNodesToFind is kube-scheduler's adaptive
// percentageOfNodesToScore: all nodes below 100, else 50 % less 1 % per
// 125 nodes, at least 5 % and at least 100 nodes.
func numFeasibleNodesToFind(nodes int) int {
	if nodes < 100 {
		return nodes
	}
	pct := max(50-nodes/125, 5)
	return max(nodes*pct/100, 100)
}

// nodeScore is kube-scheduler 1.37's NodeResourcesFit score
// (LeastAllocated) plus NodeResourcesBalancedAllocation, each 0-100 and
// of weight 1, over CPU and memory.
func (s *podScheduler) nodeScore(n int, j Job) int64 {
	nd := &s.c.Nodes[n]
	allocCPU, allocMem := nd.CPUMilli, nd.MemoryMiB
	if allocCPU == 0 {
		allocCPU = unknownCPUMilli
	}
	if allocMem == 0 {
		allocMem = unknownMemoryMiB
	}
	cpu, mem := scoredRequests(j)
	return leastAllocated(s.scoreCPU[n]+cpu, s.scoreMem[n]+mem, allocCPU, allocMem) +
		balancedAllocation(j.CPUMilli, j.MemoryMiB, s.cpu[n], s.mem[n], allocCPU, allocMem)
}

// leastAllocated is LeastAllocated over CPU and memory of weight 1 each:
// the node's requests with the pod's, non-zero defaults counted.
func leastAllocated(reqCPU, reqMem, allocCPU, allocMem int64) int64 {
	least := func(req, alloc int64) int64 {
		if req > alloc {
			return 0
		}
		return (alloc - req) * 100 / alloc
	}
	return (least(reqCPU, allocCPU) + least(reqMem, allocMem)) / 2
}

// balancedAllocation is NodeResourcesBalancedAllocation as kube-scheduler
// 1.37 scores it (balanced_allocation.go): requests as asked, without
// non-zero defaults; a pod that asks for neither CPU nor memory is not
// scored (0 on every node); otherwise the score rewards the change in
// balance the pod brings, 50 + (50 + with − without) / 2, where with and
// without are (1 − std) × 100 of the node's requested fractions (capped
// at 1) with and without the pod, std being |fCPU − fMemory| / 2 for two
// resources.
func balancedAllocation(podCPU, podMem, nodeCPU, nodeMem, allocCPU, allocMem int64) int64 {
	if podCPU == 0 && podMem == 0 {
		return 0
	}
	with := balancedResourceScore(nodeCPU+podCPU, nodeMem+podMem, allocCPU, allocMem)
	without := balancedResourceScore(nodeCPU, nodeMem, allocCPU, allocMem)
	return 50 + (50+with-without)/2
}

func balancedResourceScore(cpu, mem, allocCPU, allocMem int64) int64 {
	fc, fm := min(float64(cpu)/float64(allocCPU), 1), min(float64(mem)/float64(allocMem), 1)
	return int64((1 - math.Abs(fc-fm)/2) * 100)
}

func (s *podScheduler) usage() planner.Usage { return s.ledger.usage() }
