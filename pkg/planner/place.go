package planner

import (
	"fmt"
	"slices"
	"sort"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gputopo/gputopo/pkg/devicefit"
)

// attempt is one try at placing the job's pods inside one domain. Its
// state is private to the attempt, so a failed domain leaves no trace.
type attempt struct {
	st       *state
	extra    map[int]bitset // devices this attempt took, by node
	nl       taken          // what this attempt took of the non-local devices
	podsOn   map[int]int    // pods of the job on a node, pinned ones included
	podsLeaf map[*leaf]int
	mine     map[int]int     // pods of this attempt on a node
	req      map[int][]int64 // what the attempt's pods take from a node's allocatable
	assign   []int           // by pod index; -1 while unplaced
	placed   int
	nodes    int // nodes the attempt used
	rank     int // sum of the placed pods' ladder ranks (fitResult.rank)
	spread   spreadCounts
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
		a.spreadTurn()
		// The first node in strategy order that gives the pod's claims
		// their first choices; with preference ladders, the node giving
		// the best rung, strategy order breaking ties.
		best, bestRank := -1, 0
		var bestR fitResult
		for _, n := range order {
			if st.filters[sh].why[n] != "" || st.room(sh, n, a.req[n], 1) == 0 || a.keptApart(p, n) || a.keptAway(p, n) || a.keptBySpread(p, n) || a.keptByPorts(p, n) || !st.f.mayFit(n, sh, a.extra[n], a.nl) {
				continue
			}
			r, err := st.f.fit(n, sh, a.extra[n], a.nl)
			if err != nil {
				return nil, err
			}
			if !r.ok || (best >= 0 && r.rank >= bestRank) {
				continue
			}
			best, bestRank, bestR = n, r.rank, r
			if r.rank == 0 {
				break
			}
		}
		if best >= 0 {
			a.take(p, best, bestR)
			a.rank += bestRank
		}
	}
	return a, nil
}

func (a *attempt) take(pod, n int, r fitResult) {
	nd := a.st.c.nodes[n]
	if a.extra[n] == nil {
		a.extra[n] = newBitset(len(nd.devs))
	}
	for _, p := range r.pos {
		a.extra[n].set(p)
	}
	a.nl = a.nl.with(r, a.st.c.sharedLen())
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
	a.tookSpread(pod, n)
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
// plan reserves. They come from the allocator, not from the fit cache:
// a pod alone on its node takes the allocator's answer for an earlier pod
// of equal claims on a node that is alike for them (the same signature
// for what the claims read, the same devices in use, no shared devices,
// no non-local device the claims could select), moved to its own node's
// devices by position; every other pod gets a run of its own. A pod on a
// node that can use non-local devices is allocated on top of the
// non-local devices the pods before it took, wherever they are.
func (st *state) verify(a *attempt) (map[string][]resourceapi.AllocationResult, error) {
	out := make(map[string][]resourceapi.AllocationResult, len(st.podOrder))
	byNode := map[int][]resourceapi.AllocationResult{}
	// nonLocal holds, by node, the non-local devices of its pods' results.
	nonLocal := map[int][]resourceapi.AllocationResult{}
	type answer struct {
		node    int
		results []resourceapi.AllocationResult
	}
	answers := map[fitKey]answer{}
	for _, p := range st.podOrder {
		n := a.assign[p]
		nd := st.c.nodes[n]
		pod := st.job.Pods[p]
		results := []resourceapi.AllocationResult{}
		if len(pod.Claims) > 0 {
			var key fitKey
			alike := moveAnswers && len(byNode[n]) == 0 && !nd.noPrefilter && nd.sig.core >= 0 && !st.f.dependent(n)
			if alike {
				key = fitKey{node: st.f.key(n), set: st.f.shapes[st.podShape[p]].set, used: st.f.base.at(n).key()}
			}
			moved := false
			if ans, ok := answers[key]; alike && ok {
				results, moved = st.c.moveResults(ans.results, ans.node, n)
			}
			if !moved {
				var err error
				st.f.runs++
				more := byNode[n]
				if nd.reach.uses() {
					more = slices.Clone(more)
					for other, res := range nonLocal {
						if other != n {
							more = append(more, res...)
						}
					}
				}
				sls, err := st.c.slicesFor(nd)
				if err != nil {
					return nil, err
				}
				results, err = st.f.eval.AllocateOn(st.f.ctx, nd.obj, sls, st.f.state(n, st.f.base.at(n), taken{}, more), pod.Claims)
				if err != nil {
					if ctxErr := st.f.ctx.Err(); ctxErr != nil {
						return nil, ctxErr
					}
					return nil, &BrokenClaimError{Job: st.job.Key, Pod: pod.Name, Node: nd.name, Err: err}
				}
				if results == nil {
					return nil, fmt.Errorf("pod %s on node %s: %w", pod.Name, nd.name, errVerify)
				}
				if alike && movable(results) {
					answers[key] = answer{node: n, results: results}
				}
			}
		}
		byNode[n] = append(byNode[n], results...)
		if r := st.c.nonLocalOnly(results); r != nil {
			nonLocal[n] = append(nonLocal[n], *r)
		}
		out[pod.Name] = results
	}
	return out, nil
}

// moveAnswers lets verify move answers between alike nodes; tests turn it
// off to compare.
var moveAnswers = true

// movable says whether results name nothing but whole devices: a share's
// ID is its own and cannot be given to another pod.
func movable(results []resourceapi.AllocationResult) bool {
	for _, r := range results {
		for _, d := range r.Devices.Results {
			if d.ShareID != nil || d.ConsumedCapacity != nil {
				return false
			}
		}
	}
	return true
}

// moveResults copies the allocator's results for node from to node to,
// which is alike: each device becomes the device at the same position of
// to, and the node selector names to. It reports false, for the caller to
// ask the allocator, when a result names a device that is not from's.
func (c *Cluster) moveResults(results []resourceapi.AllocationResult, from, to int) ([]resourceapi.AllocationResult, bool) {
	fromName, toName := c.nodes[from].name, c.nodes[to].name
	out := make([]resourceapi.AllocationResult, len(results))
	for i := range results {
		r := results[i].DeepCopy()
		for j := range r.Devices.Results {
			d := &r.Devices.Results[j]
			ref, ok := c.dev(devicefit.DeviceID(d.Driver, d.Pool, d.Device))
			if !ok || int(ref.node) != from {
				return nil, false
			}
			id := c.nodes[to].devs[ref.pos]
			d.Driver, d.Pool, d.Device = id.Driver.String(), id.Pool.String(), id.Device.String()
		}
		if ns := r.NodeSelector; ns != nil {
			for t := range ns.NodeSelectorTerms {
				term := &ns.NodeSelectorTerms[t]
				for _, reqs := range [][]v1.NodeSelectorRequirement{term.MatchFields, term.MatchExpressions} {
					for k := range reqs {
						for v, val := range reqs[k].Values {
							if val == fromName {
								reqs[k].Values[v] = toName
							}
						}
					}
				}
			}
		}
		out[i] = *r
	}
	return out, true
}

// nonLocalOnly returns the results' non-local devices as one result; nil
// when there is none.
func (c *Cluster) nonLocalOnly(results []resourceapi.AllocationResult) *resourceapi.AllocationResult {
	if c.sharedLen() == 0 {
		return nil
	}
	var out *resourceapi.AllocationResult
	for _, r := range results {
		for _, d := range r.Devices.Results {
			if _, ok := c.sharedPos(devicefit.DeviceID(d.Driver, d.Pool, d.Device)); ok {
				if out == nil {
					out = &resourceapi.AllocationResult{}
				}
				out.Devices.Results = append(out.Devices.Results, d)
			}
		}
	}
	return out
}
