package planner

import (
	"cmp"
	"context"
	"slices"
)

// Hold is what a job that does not fit now waits for: a domain its
// placement allows, and the fewest nodes of it that could hold every pod
// of the job once their devices were free, the emptiest first. Only those
// nodes are kept from other jobs (Snapshot.Holding): the rest of the
// domain stays open, so a reservation costs no more than the job needs.
type Hold struct {
	Domain Domain
	Nodes  []string
}

// Target is where a job that does not fit now waits for room: of the
// domains its placement allows, the smallest size that has a domain which
// could hold the job once its devices were free (counting devices, and
// the pods' node filters and allocatable), and of that size the domain
// with the most healthy GPUs free now, so it is the one closest to fitting.
// A job whose preferred domain is required waits only in that domain.
// A caller that keeps other jobs off the hold's nodes (Snapshot.Holding)
// lets the job fit there once what runs there ends, whatever else
// arrives. Unschedulable when no domain could ever hold the job.
func (p *Planner) Target(ctx context.Context, snap *Snapshot, job Job) (Hold, error) {
	st, err := p.newState(ctx, snap, nil, &job, false)
	if err != nil {
		return Hold{}, err
	}
	defer st.sc.release()
	st.computeCounts()
	// A job that insists on its preferred domain waits for room there
	// only: nodes held elsewhere would keep other jobs off them for a
	// place it refuses.
	if err := st.resolvePreference(); err != nil {
		return Hold{}, err
	}
	onlyPreferred := st.job.PreferredRequired && st.pref != nil
	for _, lv := range st.levels() {
		var best *candidate
		for _, c := range lv.cands() {
			if onlyPreferred && !st.honours(c) {
				continue
			}
			if best != nil && c.free <= best.free {
				continue
			}
			ok, err := st.couldHold(c)
			if err != nil {
				return Hold{}, err
			}
			if ok {
				best = c
			}
		}
		if best != nil {
			nodes, err := st.holdNodes(best)
			if err != nil {
				return Hold{}, err
			}
			return Hold{Domain: best.dom(), Nodes: nodes}, nil
		}
	}
	return Hold{}, &Unschedulable{Job: job.Key, Reason: "no domain could hold the job even with all of its devices free"}
}

// holdNodes picks the nodes of c to hold: by most devices free now, then
// topology order, until they could hold every pod of the job when empty.
func (st *state) holdNodes(c *candidate) ([]string, error) {
	var nodes []int
	room := map[int]int{}
	for _, n := range c.nodes() {
		r, err := st.emptyRoom(n)
		if err != nil {
			return nil, err
		}
		if r > 0 {
			nodes = append(nodes, n)
			room[n] = r
		}
	}
	freeNow := func(n int) int { return st.c.nodes[n].all.free(st.f.base.at(n)) }
	slices.SortStableFunc(nodes, func(a, b int) int {
		return cmp.Or(freeNow(b)-freeNow(a), st.c.rank(a)-st.c.rank(b))
	})
	var out []string
	for held := 0; held < st.n && len(nodes) > 0; nodes = nodes[1:] {
		held += room[nodes[0]]
		out = append(out, st.c.nodes[nodes[0]].name)
	}
	return out, nil
}

// Holding returns a copy of the snapshot in which every device of the
// named nodes is in use, for the plans of the jobs that must leave them
// to the job waiting for them. Unknown nodes are skipped.
func (s *Snapshot) Holding(nodes []string) *Snapshot {
	out := *s
	out.used = s.used.share()
	for _, name := range nodes {
		if i, ok := s.cluster.byName[name]; ok {
			if n := s.cluster.nodes[i]; !n.gone {
				out.used.set(i, n.all.clone(len(n.devs)))
			}
		}
	}
	out.used.freeze()
	return &out
}

// emptyRoom is how many pods of the job node n could hold with all its
// devices free: its counting bound (ubEmpty), or 0 when no shape of the
// job that passes the node's filters could fit there even then, which
// only the allocator can tell. Asked only of jobs that wait, so a job
// that fits pays nothing for it.
func (st *state) emptyRoom(n int) (int, error) {
	ub := st.nodeAgg[n].ubEmpty
	if ub <= 0 {
		return 0, nil
	}
	for s := range st.f.shapes {
		if st.filters[s].why[n] != "" {
			continue
		}
		ok, err := st.f.fitsEmpty(n, s)
		if err != nil || ok {
			return ub, err
		}
	}
	return 0, nil
}

// couldHold reports whether candidate c could hold every pod of the job
// once its devices were free: its counting bound, checked node by node
// with the allocator (emptyRoom) when the bound says yes.
func (st *state) couldHold(c *candidate) (bool, error) {
	if c.ubEmpty < st.n {
		return false, nil
	}
	room := 0
	for _, n := range c.nodes() {
		r, err := st.emptyRoom(n)
		if err != nil {
			return false, err
		}
		if room += r; room >= st.n {
			return true, nil
		}
	}
	return false, nil
}
