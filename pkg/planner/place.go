package planner

import (
	"fmt"
	"sort"

	resourceapi "k8s.io/api/resource/v1"
)

// attempt is one try at placing the job's pods inside one domain. Its
// state is private to the attempt, so a failed domain leaves no trace.
type attempt struct {
	st       *state
	extra    map[int]bitset // devices this attempt took, by node
	podsOn   map[int]int    // pods of the job on a node, pinned ones included
	podsLeaf map[*leaf]int
	mine     map[int]int     // pods of this attempt on a node
	req      map[int][]int64 // what the attempt's pods take from a node's allocatable
	assign   []int           // by pod index; -1 while unplaced
	placed   int
	nodes    int // nodes the attempt used
	rank     int // sum of the placed pods' ladder ranks (fitResult.rank)
}

// tryPlace places as many pods as it can inside nodes, in strategy order.
// It places every pod it can rather than stopping at the first that does
// not fit, so a failed domain says how close it came.
func (st *state) tryPlace(nodes []int) (*attempt, error) {
	a := &attempt{st: st, extra: map[int]bitset{}, podsOn: map[int]int{}, podsLeaf: map[*leaf]int{}, mine: map[int]int{}, req: map[int][]int64{}, assign: make([]int, len(st.job.Pods))}
	for i := range a.assign {
		a.assign[i] = -1
	}
	for _, n := range st.pinned {
		a.podsOn[n]++
		a.podsLeaf[st.c.nodes[n].leaf]++
	}
	var order []int
	for _, n := range nodes {
		if st.usable[n] {
			order = append(order, n)
		}
	}
	for _, p := range st.podOrder {
		sh := st.podShape[p]
		st.sortNodes(a, order)
		// The first node in strategy order that gives the pod's claims
		// their first choices; with preference ladders, the node giving
		// the best rung, strategy order breaking ties.
		best, bestRank := -1, 0
		var bestPos []int
		for _, n := range order {
			if st.filters[sh].why[n] != "" || st.room(sh, n, a.req[n], 1) == 0 || !st.f.mayFit(n, sh, a.extra[n]) {
				continue
			}
			r, err := st.f.fit(n, sh, a.extra[n])
			if err != nil {
				return nil, err
			}
			if !r.ok || (best >= 0 && r.rank >= bestRank) {
				continue
			}
			best, bestRank, bestPos = n, r.rank, r.pos
			if r.rank == 0 {
				break
			}
		}
		if best >= 0 {
			a.take(p, best, bestPos)
			a.rank += bestRank
		}
	}
	return a, nil
}

func (a *attempt) take(pod, n int, pos []int) {
	nd := a.st.c.nodes[n]
	if a.extra[n] == nil {
		a.extra[n] = newBitset(len(nd.devs))
	}
	for _, p := range pos {
		a.extra[n].set(p)
	}
	if a.mine[n] == 0 {
		a.nodes++
	}
	a.mine[n]++
	a.podsOn[n]++
	a.podsLeaf[nd.leaf]++
	if req := a.st.f.shapes[a.st.podShape[pod]].needs.req; req != nil {
		if a.req[n] == nil {
			a.req[n] = make([]int64, len(req))
		}
		for i, r := range req {
			a.req[n][i] += r
		}
	}
	a.assign[pod] = n
	a.placed++
}

// sortNodes orders the domain's nodes for the next pod.
//
//   - consolidated: fewest free GPUs first, so pods pile onto the fullest
//     nodes and empty nodes stay empty;
//   - balanced: fewest pods of this job first (an even spread), then nodes
//     already partly used before empty ones, then fewest free GPUs;
//   - distributed: fewest pods of this job on the node, then on its leaf,
//     then fewest free GPUs.
//
// Topology order breaks ties, so plans are deterministic.
func (st *state) sortNodes(a *attempt, order []int) {
	type keyed struct{ k1, k2, k3, n, rank int }
	keys := make([]keyed, len(order))
	rank := st.c.rank
	for i, n := range order {
		nd := st.c.nodes[n]
		used := st.f.used(n, a.extra[n])
		free := nd.healthy.free(used)
		switch st.job.Strategy {
		case StrategyConsolidated:
			keys[i] = keyed{free, 0, 0, n, rank(n)}
		case StrategyDistributed:
			keys[i] = keyed{a.podsOn[n], a.podsLeaf[nd.leaf], free, n, rank(n)}
		default:
			empty := 0
			if used.count() == 0 {
				empty = 1
			}
			keys[i] = keyed{a.podsOn[n], empty, free, n, rank(n)}
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		x, y := keys[i], keys[j]
		switch {
		case x.k1 != y.k1:
			return x.k1 < y.k1
		case x.k2 != y.k2:
			return x.k2 < y.k2
		case x.k3 != y.k3:
			return x.k3 < y.k3
		}
		return x.rank < y.rank
	})
	for i, k := range keys {
		order[i] = k.n
	}
}

// verify allocates every pod once more, with its own claims, on its node
// on top of the pods placed there before it. The results are what the
// plan reserves: they come straight from the allocator, not from the cache.
func (st *state) verify(a *attempt) (map[string][]resourceapi.AllocationResult, error) {
	out := make(map[string][]resourceapi.AllocationResult, len(st.podOrder))
	byNode := map[int][]resourceapi.AllocationResult{}
	for _, p := range st.podOrder {
		n := a.assign[p]
		nd := st.c.nodes[n]
		pod := st.job.Pods[p]
		results := []resourceapi.AllocationResult{}
		if len(pod.Claims) > 0 {
			var err error
			st.f.runs++
			results, err = st.f.eval.AllocateOn(st.f.ctx, nd.obj, nd.slices, st.f.state(n, st.f.base[n], byNode[n]), pod.Claims)
			if err != nil {
				if ctxErr := st.f.ctx.Err(); ctxErr != nil {
					return nil, ctxErr
				}
				return nil, &BrokenClaimError{Job: st.job.Key, Pod: pod.Name, Node: nd.name, Err: err}
			}
			if results == nil {
				return nil, fmt.Errorf("pod %s on node %s: %w", pod.Name, nd.name, errVerify)
			}
		}
		byNode[n] = append(byNode[n], results...)
		out[pod.Name] = results
	}
	return out, nil
}
