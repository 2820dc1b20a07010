package topology

// blockSearchBudget bounds the steps of one block search. Real nodes (up to
// 16 GPUs, and NVSwitch graphs where the first candidate already covers
// every GPU) finish in far fewer; an adversarial simulated graph keeps the
// best partition found within the budget, which is still deterministic.
const blockSearchBudget = 200_000

// partitionBlocks splits the GPUs into as many disjoint fully connected
// groups of size as the graph allows. GPUs are referred to by rank: rank r
// is the r-th GPU in index order, so the result depends on the wiring and
// the indexes only, never on the order discovery listed the GPUs in.
//
// region[r] restricts groups to GPUs of one region (the block of the next
// larger size, so that a pair lies inside a quad when it can); -1 marks GPUs
// outside every region, which may group among themselves. The restricted
// partition is kept only when it has as many groups as an unrestricted one:
// nesting is a preference, never a reason to publish fewer blocks.
//
// Among partitions with the most groups the search returns the first in
// lexicographic order of ranks, so the same graph always yields the same
// blocks.
func partitionBlocks(adj [][]bool, size int, region []int) [][]int {
	if size < 2 || len(adj) < size {
		return nil
	}
	free := make([]int, len(adj))
	for i := range free {
		free[i] = -1
	}
	best := newBlockSearch(adj, size, free).run()
	if region == nil {
		return best
	}
	nested := newBlockSearch(adj, size, region).run()
	if len(nested) >= len(best) {
		return nested
	}
	return best
}

type blockSearch struct {
	adj    [][]bool
	size   int
	region []int
	// state: 0 available, 1 in a chosen group, 2 left out on this path.
	state  []uint8
	chosen [][]int
	best   [][]int
	steps  int
	// bound is the most groups any partition can have; reaching it ends
	// the search.
	bound int
}

func newBlockSearch(adj [][]bool, size int, region []int) *blockSearch {
	s := &blockSearch{adj: adj, size: size, region: region, state: make([]uint8, len(adj))}
	eligible := 0
	for r := range adj {
		deg := 0
		for q := range adj {
			if q != r && adj[r][q] {
				deg++
			}
		}
		// A GPU with fewer than size-1 neighbours is in no group.
		if deg < size-1 {
			s.state[r] = 2
			continue
		}
		eligible++
	}
	s.bound = eligible / size
	return s
}

func (s *blockSearch) run() [][]int {
	s.search()
	return s.best
}

// search returns true once the bound is reached or the budget spent.
func (s *blockSearch) search() bool {
	s.steps++
	if len(s.chosen) > len(s.best) {
		s.best = cloneGroups(s.chosen)
		if len(s.best) == s.bound {
			return true
		}
	}
	if s.steps > blockSearchBudget {
		return true
	}
	avail := 0
	first := -1
	for r, st := range s.state {
		if st == 0 {
			avail++
			if first < 0 {
				first = r
			}
		}
	}
	if first < 0 || len(s.chosen)+avail/s.size <= len(s.best) {
		return false
	}
	// The lowest available GPU either joins a group with higher-ranked
	// available neighbours of its region, or is left out.
	var cands []int
	for r := first + 1; r < len(s.state); r++ {
		if s.state[r] == 0 && s.adj[first][r] && s.region[r] == s.region[first] {
			cands = append(cands, r)
		}
	}
	group := make([]int, 1, s.size)
	group[0] = first
	if s.extend(group, cands) {
		return true
	}
	s.state[first] = 2
	done := s.search()
	s.state[first] = 0
	return done
}

// extend grows group from cands (all adjacent to group[0]) in
// lexicographic order and searches on with every complete group.
func (s *blockSearch) extend(group, cands []int) bool {
	if len(group) == s.size {
		for _, r := range group {
			s.state[r] = 1
		}
		s.chosen = append(s.chosen, group)
		done := s.search()
		s.chosen = s.chosen[:len(s.chosen)-1]
		for _, r := range group {
			s.state[r] = 0
		}
		return done
	}
	for i, c := range cands {
		if len(group)+len(cands)-i < s.size {
			return false
		}
		if !s.linkedToAll(c, group[1:]) {
			continue
		}
		next := append(group[:len(group):len(group)], c)
		if s.extend(next, cands[i+1:]) {
			return true
		}
	}
	return false
}

func (s *blockSearch) linkedToAll(r int, group []int) bool {
	for _, g := range group {
		if !s.adj[r][g] {
			return false
		}
	}
	return true
}

func cloneGroups(groups [][]int) [][]int {
	out := make([][]int, len(groups))
	for i, g := range groups {
		out[i] = append([]int(nil), g...)
	}
	return out
}
