package planner

import "sync"

// scratch holds the buffers of one plan that are as long as the cluster
// has nodes. A plan hands them back when it returns and the next plan
// takes them cleared, so a plan on 5,000 nodes allocates what its job
// needs rather than five cluster-sized arrays: less work for the garbage
// collector, whose assists would otherwise land inside later plans.
type scratch struct {
	aggs   []agg
	usable []bool
	roomy  []bool
	keys   []string
	whys   [][]NodeFilter // by shape
	// cands is an arena of candidates: a plan counts hundreds of domains
	// of each size and keeps few. taken are handed out.
	cands []candidate
	taken int
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// getScratch takes cleared buffers for a cluster of n nodes.
func getScratch(n int) *scratch {
	sc := scratchPool.Get().(*scratch)
	sc.aggs = resize(sc.aggs, n)
	sc.usable = resize(sc.usable, n)
	sc.roomy = resize(sc.roomy, n)
	sc.keys = resize(sc.keys, n)
	return sc
}

// why returns the cleared filter outcomes of the s-th shape.
func (sc *scratch) why(s, n int) []NodeFilter {
	for len(sc.whys) <= s {
		sc.whys = append(sc.whys, nil)
	}
	sc.whys[s] = resize(sc.whys[s], n)
	return sc.whys[s]
}

// candidates returns n zero candidates from the arena, making a bigger
// arena when it runs out; those handed out before stay where they are.
func (sc *scratch) candidates(n int) []candidate {
	if sc.taken+n > len(sc.cands) {
		sc.cands, sc.taken = make([]candidate, max(n, 2*len(sc.cands))), 0
	}
	out := sc.cands[sc.taken : sc.taken+n : sc.taken+n]
	sc.taken += n
	return out
}

// release hands the buffers back. Nothing of the plan may read them after.
// The candidates are cleared so that the pool keeps no tree alive.
func (sc *scratch) release() {
	if sc != nil {
		clear(sc.cands[:sc.taken])
		sc.taken = 0
		scratchPool.Put(sc)
	}
}

// resize returns s with length n and every element zero, reusing its
// array when it is big enough.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}
