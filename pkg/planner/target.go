package planner

import "context"

// Target is where a job that does not fit now waits for room: of the
// domains its placement allows, the smallest size that has a domain which
// could hold the job once its devices were free (counting devices, and
// the pods' node filters and allocatable), and of that size the domain
// with the most healthy GPUs free now, so it is the one closest to fitting.
// A caller that keeps other jobs out of the target (Snapshot.Holding)
// lets the job fit there once what runs there ends, whatever else
// arrives. Unschedulable when no domain could ever hold the job.
func (p *Planner) Target(ctx context.Context, snap *Snapshot, job Job) (Domain, error) {
	st, err := p.newState(ctx, snap, nil, &job)
	if err != nil {
		return Domain{}, err
	}
	st.computeCounts()
	for _, lv := range st.levels() {
		var best *candidate
		for _, c := range lv.cands() {
			if c.ubEmpty >= st.n && (best == nil || c.free > best.free) {
				best = c
			}
		}
		if best != nil {
			return best.dom, nil
		}
	}
	return Domain{}, &Unschedulable{Job: job.Key, Reason: "no domain could hold the job even with all of its devices free"}
}

// Holding returns a copy of the snapshot in which every device of the
// domain's nodes is in use, for the plans of the jobs that must leave the
// domain to the job waiting for it. The whole cluster (a cluster domain
// that names no spine) holds every node.
func (s *Snapshot) Holding(d Domain) (*Snapshot, error) {
	idx, whole, err := s.cluster.domainIdx(d)
	if err != nil {
		return nil, err
	}
	out := *s
	out.used = make([]bitset, len(s.used))
	copy(out.used, s.used)
	hold := func(i int) {
		if n := s.cluster.nodes[i]; !n.gone {
			out.used[i] = n.all.clone(len(n.devs))
		}
	}
	if whole {
		for i := range s.cluster.nodes {
			hold(i)
		}
	}
	for _, i := range idx {
		hold(i)
	}
	return &out, nil
}
