package planner

import (
	"fmt"
	"slices"
)

// candidate is one domain a plan may use, with the counts that rank and
// prune it. Counts cover only nodes that some pod of the job passes the
// node filters of.
type candidate struct {
	domain  Domain   // read through dom: a run of leaves names its leaves on first use
	name    string   // dom().String(), once key was asked for it
	run     *spine   // the spine of a run of leaves
	leaves  []*leaf  // leaves it covers
	loose   []int    // its nodes outside those leaves
	spines  []*spine // spines it covers, for preferences
	node    *node    // set for node-level candidates
	whole   bool
	free    int // healthy free GPUs: the best-fit measure
	freeDev int // free devices of any driver, for the counting pre-filter
	ub      int // at most this many pods fit now, by counting devices
	ubEmpty int // at most this many pods would fit on empty nodes
	honours bool
}

// key names the candidate, for ordering equals and memoizing outcomes;
// most candidates of a plan are only counted, so it is made on demand.
func (c *candidate) key() string {
	if c.name == "" {
		c.name = c.dom().String()
	}
	return c.name
}

// dom is the domain the candidate stands for. Of the hundreds of runs of
// leaves or thousands of nodes a plan counts, few are ever named, so those
// get their names only when asked.
func (c *candidate) dom() Domain {
	switch {
	case c.domain.Names != nil:
	case c.run != nil:
		c.domain.Names = make([]string, len(c.leaves))
		for i, l := range c.leaves {
			c.domain.Names[i] = l.name
		}
	case c.node != nil:
		c.domain.Names = []string{c.node.name}
	}
	return c.domain
}

func (c *candidate) nodes() []int {
	var out []int
	for _, l := range c.leaves {
		out = append(out, l.nodes...)
	}
	return append(out, c.loose...)
}

// agg sums the per-node counts of a set of nodes.
type agg struct{ free, freeDev, ub, ubEmpty int }

func (a *agg) add(b agg) {
	a.free += b.free
	a.freeDev += b.freeDev
	a.ub += b.ub
	a.ubEmpty += b.ubEmpty
}

// level is one size of domain, e.g. "run of 2 adjacent leaves".
type level struct {
	label string
	named bool // label names the one candidate rather than a size
	cands func() []*candidate
}

// computeCounts fills the per-node and per-leaf counts once per plan.
func (st *state) computeCounts() {
	c := st.c
	st.nodeAgg, st.roomy = st.sc.aggs, st.sc.roomy
	for i, nd := range c.nodes {
		if !st.usable[i] {
			continue
		}
		// Only the shapes whose pods pass the node's filters count, and
		// the node's free cpu, memory and pod slots bound them too.
		minNeed, minLocal, room, roomEmpty := -1, -1, 0, 0
		for s := range st.f.shapes {
			if st.filters[s].why[i] != "" {
				continue
			}
			sh := &st.f.shapes[s]
			if minNeed < 0 || sh.need < minNeed {
				minNeed = sh.need
			}
			if minLocal < 0 || sh.needLocal < minLocal {
				minLocal = sh.needLocal
			}
			room += st.room(s, i, nil, sh.pods)
			roomEmpty += st.roomEmpty(s, i, sh.pods)
		}
		st.roomy[i] = room > 0
		used := st.f.base.at(i)
		// Non-local devices count for every node that can use them: the
		// counts stay upper bounds.
		own, all := st.f.freeDevices(i, nil, nil)
		a := agg{free: nd.healthy.free(used), freeDev: all}
		switch {
		case st.f.noPrefilter(i) || minNeed == 0:
			a.ub, a.ubEmpty, a.freeDev = st.n, st.n, 1<<30
		default:
			ownAll := len(nd.devs)
			a.ub = min(st.n, a.freeDev/minNeed)
			a.ubEmpty = min(st.n, (ownAll+nd.reach.mask.and(st.f.nlUsable).count())/minNeed)
			if minLocal > 0 {
				a.ub = min(a.ub, own/minLocal)
				a.ubEmpty = min(a.ubEmpty, ownAll/minLocal)
			}
		}
		a.ub, a.ubEmpty = min(a.ub, room), min(a.ubEmpty, roomEmpty)
		if a.ub == 0 { // its free GPUs are out of the job's reach
			a.free, a.freeDev = 0, 0
		}
		st.nodeAgg[i] = a
	}
	st.leafAgg = make([]agg, len(c.leaves))
	for i, l := range c.leaves {
		for _, n := range l.nodes {
			st.leafAgg[i].add(st.nodeAgg[n])
		}
	}
}

// newCandidate sums the counts of the leaves and loose nodes.
func (st *state) newCandidate(dom Domain, leaves []*leaf, loose []int) *candidate {
	c := &candidate{}
	st.initCandidate(c, dom, leaves, loose)
	return c
}

// initCandidate sets c to the domain and sums its counts.
func (st *state) initCandidate(c *candidate, dom Domain, leaves []*leaf, loose []int) {
	*c = candidate{domain: dom, leaves: leaves, loose: loose}
	var a agg
	for _, l := range leaves {
		a.add(st.leafAgg[l.idx])
	}
	for _, n := range loose {
		a.add(st.nodeAgg[n])
	}
	c.free, c.freeDev, c.ub, c.ubEmpty = a.free, a.freeDev, a.ub, a.ubEmpty
}

func (st *state) nodeCand(i int, dom Domain) *candidate {
	c := st.newCandidate(dom, nil, []int{i})
	c.node = st.c.nodes[i]
	return c
}

// nodeCands lists a candidate per usable node, from the plan's arena.
func (st *state) nodeCands() []*candidate {
	n := 0
	for i := range st.c.nodes {
		if st.usable[i] {
			n++
		}
	}
	slab, idx := st.sc.candidates(n), make([]int, n)
	out := make([]*candidate, 0, n)
	for i, nd := range st.c.nodes {
		if st.usable[i] {
			k := len(out)
			idx[k] = i
			c := &slab[k]
			st.initCandidate(c, Domain{Level: LevelNode}, nil, idx[k:k+1])
			c.node = nd
			out = append(out, c)
		}
	}
	return out
}

// runCand is the run of leaves lo..hi-1 of spine s; a run that is the
// whole spine is named as the spine, the narrower pin.
func (st *state) runCand(s *spine, lo, hi int) *candidate {
	c := &candidate{}
	st.initRun(c, s, lo, hi)
	return c
}

func (st *state) initRun(c *candidate, s *spine, lo, hi int) {
	dom := Domain{Level: LevelLeaves}
	switch {
	case hi-lo == 1:
		dom.Level = LevelLeaf
	case s.name != "" && lo == 0 && hi == len(s.leaves) && s.extra == 0:
		dom = Domain{Level: LevelSpine, Names: []string{s.name}}
	}
	st.initCandidate(c, dom, s.leaves[lo:hi], nil)
	c.run = s
	c.spines = st.c.spines[s.idx : s.idx+1]
}

// runs lists the runs of k adjacent leaves of the given spines, from the
// plan's arena.
func (st *state) runs(spines []*spine, k int) []*candidate {
	n := 0
	for _, s := range spines {
		n += max(0, len(s.leaves)-k+1)
	}
	slab := st.sc.candidates(n)
	out := make([]*candidate, 0, n)
	for _, s := range spines {
		for lo := 0; lo+k <= len(s.leaves); lo++ {
			c := &slab[len(out)]
			st.initRun(c, s, lo, lo+k)
			out = append(out, c)
		}
	}
	return out
}

func (st *state) leafCands() []*candidate {
	return st.runs(st.c.spines, 1)
}

func (st *state) runCands(k int) []*candidate {
	return st.runs(st.realSpines(), k)
}

func (st *state) spineCand(ss []*spine, dom Domain) *candidate {
	var leaves []*leaf
	var loose []int
	for _, s := range ss {
		leaves = append(leaves, s.leaves...)
		loose = append(loose, s.nodes[len(s.nodes)-s.extra:]...)
	}
	c := st.newCandidate(dom, leaves, loose)
	c.spines = ss
	return c
}

func (st *state) spineCands() []*candidate {
	var out []*candidate
	for _, s := range st.realSpines() {
		out = append(out, st.spineCand([]*spine{s}, Domain{Level: LevelSpine, Names: []string{s.name}}))
	}
	return out
}

func (st *state) spineRunCands(k int) []*candidate {
	ss := st.realSpines()
	var out []*candidate
	for lo := 0; lo+k <= len(ss); lo++ {
		run := ss[lo : lo+k]
		out = append(out, st.spineCand(run, Domain{Level: LevelCluster, Names: spineNames(run)}))
	}
	return out
}

func (st *state) wholeCand() *candidate {
	var loose []int
	for i, nd := range st.c.nodes {
		if nd.leaf == nil && !nd.gone {
			loose = append(loose, i)
		}
	}
	c := st.newCandidate(Domain{Level: LevelCluster}, st.c.leaves, loose)
	c.whole = true
	return c
}

func (st *state) realSpines() []*spine {
	var out []*spine
	for _, s := range st.c.spines {
		if s.name != "" {
			out = append(out, s)
		}
	}
	return out
}

func spineNames(ss []*spine) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.name
	}
	return out
}

// levels lists the sizes the job's placement mode allows, smallest first.
func (st *state) levels() []level {
	one := func(label string, f func() []*candidate) level { return level{label: label, cands: f} }
	maxLeaves := 0
	for _, s := range st.realSpines() {
		maxLeaves = max(maxLeaves, len(s.leaves))
	}
	runs := func() []level {
		var out []level
		for k := 2; k <= maxLeaves; k++ {
			out = append(out, one(fmt.Sprintf("run of %d adjacent leaves", k), func() []*candidate { return st.runCands(k) }))
		}
		return out
	}
	leaf := one("leaf", st.leafCands)
	whole := one("the whole cluster", func() []*candidate { return []*candidate{st.wholeCand()} })
	whole.named = true
	switch st.job.Placement {
	case PlacementSameLeaf:
		return []level{leaf}
	case PlacementAdjacentLeaves:
		return append([]level{leaf}, runs()...)
	case PlacementSameSpine:
		return []level{one("spine", st.spineCands)}
	case PlacementNone:
		if st.pref != nil {
			pref := one("preferred "+st.pref.dom.String(), func() []*candidate { return []*candidate{st.prefCand()} })
			pref.named = true
			return []level{pref, whole}
		}
		return []level{whole}
	}
	if st.n == 1 && len(st.pinned) == 0 {
		return []level{one("node", st.nodeCands)}
	}
	out := append([]level{leaf}, runs()...)
	for k := 2; k < len(st.realSpines()); k++ {
		out = append(out, one(fmt.Sprintf("run of %d adjacent spines", k), func() []*candidate { return st.spineRunCands(k) }))
	}
	return append(out, whole)
}

// fixedCand turns a required Domain into its candidate.
// widerLevels are the levels a group whose domain can no longer hold it
// widens to: the levels its placement allows, larger than fixed, and of
// those only the candidates that hold every node of a pinned pod, which
// keep their places.
func (st *state) widerLevels(levels []level, fixed *candidate) []level {
	var out []level
	size := len(fixed.nodes())
	for _, lv := range levels {
		out = append(out, level{label: lv.label, named: lv.named, cands: func() []*candidate {
			var keep []*candidate
			for _, c := range lv.cands() {
				if c.key() != fixed.key() && len(c.nodes()) > size && st.holdsPinned(c) {
					keep = append(keep, c)
				}
			}
			return keep
		}})
	}
	return out
}

// holdsPinned reports whether every pinned pod's node is in c.
func (st *state) holdsPinned(c *candidate) bool {
	in := map[int]bool{}
	for _, n := range c.nodes() {
		in[n] = true
	}
	for _, n := range st.pinned {
		if !in[n] {
			return false
		}
	}
	return true
}

func (st *state) fixedCand(d Domain) (*candidate, error) {
	c := st.c
	switch d.Level {
	case LevelNode:
		if len(d.Names) != 1 {
			return nil, fmt.Errorf("a node domain names exactly one node, got %d", len(d.Names))
		}
		i, ok := c.byName[d.Names[0]]
		if !ok {
			return nil, fmt.Errorf("node %s is not in the cluster", d.Names[0])
		}
		return st.nodeCand(i, d), nil
	case LevelLeaf, LevelLeaves:
		if len(d.Names) == 0 {
			return nil, fmt.Errorf("a %s domain names at least one leaf", d.Level)
		}
		var leaves []*leaf
		for _, name := range d.Names {
			l := c.leafByN[name]
			if l == nil {
				return nil, fmt.Errorf("leaf %s is not in the cluster", name)
			}
			leaves = append(leaves, l)
		}
		return st.newCandidate(d, leaves, nil), nil
	case LevelSpine, LevelCluster:
		if len(d.Names) == 0 {
			if d.Level == LevelSpine {
				return nil, fmt.Errorf("a spine domain names a spine")
			}
			return st.wholeCand(), nil
		}
		var ss []*spine
		for _, name := range d.Names {
			s := c.spineByN[name]
			if s == nil {
				return nil, fmt.Errorf("spine %s is not in the cluster", name)
			}
			ss = append(ss, s)
		}
		return st.spineCand(ss, d), nil
	}
	return nil, fmt.Errorf("unknown domain level %q", d.Level)
}

// groupDomain is the smallest domain holding the pinned pods' nodes, so
// replacement pods go back next to the rest of their group.
func (st *state) groupDomain() Domain {
	var leaves []*leaf
	var spines []*spine
	allLeaves, allSpines := true, true
	for _, n := range st.pinned {
		nd := st.c.nodes[n]
		if nd.leaf == nil {
			allLeaves = false
		} else if !slices.Contains(leaves, nd.leaf) {
			leaves = append(leaves, nd.leaf)
		}
		if nd.spine == nil || nd.spine.name == "" {
			allSpines = false
		} else if !slices.Contains(spines, nd.spine) {
			spines = append(spines, nd.spine)
		}
	}
	switch {
	case allLeaves && len(leaves) == 1:
		return Domain{Level: LevelLeaf, Names: []string{leaves[0].name}}
	case allSpines && len(spines) == 1 && allLeaves:
		lo, hi := len(spines[0].leaves), 0
		for _, l := range leaves {
			lo, hi = min(lo, l.pos), max(hi, l.pos+1)
		}
		return st.runCand(spines[0], lo, hi).dom()
	case allSpines && len(spines) == 1:
		return Domain{Level: LevelSpine, Names: []string{spines[0].name}}
	case allSpines:
		slices.SortFunc(spines, func(a, b *spine) int { return a.idx - b.idx })
		return Domain{Level: LevelCluster, Names: spineNames(spines)}
	}
	return Domain{Level: LevelCluster}
}
