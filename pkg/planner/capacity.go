package planner

// Capacities make whole levels cheap. Nodes are independent (their slices
// are their own), so how many pods of one shape a domain holds is the sum
// over its nodes of how many fit on each, one after the other. Non-local
// devices make that sum an upper bound: a placement attempt decides. Those
// counts are computed once per node and summed once per leaf; a run of
// leaves is then a handful of additions, whatever its size.

// capTable holds one shape's capacities; -1 is not yet computed.
type capTable struct {
	node     []int
	leaf     []int
	leafRoom []int // nodes of the leaf with room for one pod
}

// outcome is how well a candidate did: the pods it holds and how many of
// its nodes have room for a pod. For a job of mixed shapes without an
// attempt, pods is only an upper bound.
type outcome struct {
	a     *attempt
	pods  int
	room  int
	exact bool
}

func (st *state) initCaps() {
	st.caps = make([]capTable, len(st.f.shapes))
	for s := range st.caps {
		t := &st.caps[s]
		t.node = filled(len(st.c.nodes))
		t.leaf = filled(len(st.c.leaves))
		t.leafRoom = make([]int, len(st.c.leaves))
	}
}

func filled(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = -1
	}
	return out
}

// nodeCap is how many pods of shape s fit on node n, by devices and by
// the node's allocatable, up to the job's number of pods of that shape.
func (st *state) nodeCap(s, n int) (int, error) {
	t := &st.caps[s]
	if t.node[n] < 0 {
		limit := 0
		// Too few free devices even for the smallest pod, a filter that
		// keeps this shape off the node, or no cpu, memory or pod slot left.
		if st.nodeAgg[n].ub > 0 && st.filters[s].why[n] == "" {
			limit = st.room(s, n, nil, st.f.shapes[s].pods)
		}
		t.node[n] = 0
		if limit > 0 {
			k, err := st.f.capacity(n, s, limit)
			if err != nil {
				return 0, err
			}
			t.node[n] = k
		}
	}
	return t.node[n], nil
}

// capOf sums shape s's capacity over c's nodes.
func (st *state) capOf(c *candidate, s int) (pods, room int, err error) {
	t := &st.caps[s]
	add := func(n int) error {
		k, err := st.nodeCap(s, n)
		if k > 0 {
			pods += k
			room++
		}
		return err
	}
	for _, l := range c.leaves {
		if t.leaf[l.idx] < 0 {
			sum, r := 0, 0
			for _, n := range l.nodes {
				k, err := st.nodeCap(s, n)
				if err != nil {
					return 0, 0, err
				}
				sum += k
				if k > 0 {
					r++
				}
			}
			t.leaf[l.idx], t.leafRoom[l.idx] = sum, r
		}
		pods += t.leaf[l.idx]
		room += t.leafRoom[l.idx]
	}
	for _, n := range c.loose {
		if err := add(n); err != nil {
			return 0, 0, err
		}
	}
	return pods, room, nil
}

// evaluate says how many of the job's pods c can hold. For one shape the
// capacities answer exactly; for mixed shapes they bound the answer, and
// a placement attempt is made only when the bound allows the whole job.
func (st *state) evaluate(c *candidate) (*outcome, error) {
	if o, ok := st.outcomes[c.key()]; ok {
		return o, nil
	}
	o := &outcome{}
	for s, sh := range st.f.shapes {
		pods, room, err := st.capOf(c, s)
		if err != nil {
			return nil, err
		}
		o.pods += min(pods, sh.pods)
		o.room = max(o.room, room)
	}
	// Nodes that share non-local devices may each count the same ones.
	// Pods kept apart by their anti-affinity, or together by their
	// affinity, may find less room than the capacities count.
	o.exact = len(st.f.shapes) == 1 && st.f.nlUsable.count() == 0 && st.apart == nil && st.together == nil
	st.outcomes[c.key()] = o
	return o, nil
}

// attemptOn makes the placement attempt for c, once.
func (st *state) attemptOn(c *candidate) (*outcome, error) {
	o, err := st.evaluate(c)
	if err != nil || o.a != nil || (o.exact && o.pods < st.n) {
		return o, err
	}
	if o.a, err = st.tryPlace(c.nodes()); err != nil {
		return nil, err
	}
	o.pods, o.room, o.exact = o.a.placed, o.a.nodes, true
	return o, nil
}
