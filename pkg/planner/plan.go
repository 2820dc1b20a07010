package planner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/topology"
)

// Planner plans jobs with the scheduler's allocator. Nothing one plan
// decides carries over to the next (plans reuse only cleared buffers,
// scratch.go), and it is safe for concurrent use.
type Planner struct {
	eval     *devicefit.Evaluator
	workload Workload // what fragmentation is measured against (fgd.go)
}

// New returns a planner that evaluates claims with eval.
func New(eval *devicefit.Evaluator, opts ...Option) *Planner {
	p := &Planner{eval: eval}
	for _, o := range opts {
		o(p)
	}
	return p
}

// state is everything one Plan call works on. Nothing in it is shared.
type state struct {
	c        *Cluster
	job      *Job
	f        *fitter
	n        int   // pods to place
	podShape []int // by pod index
	podOrder []int // pod indexes, most devices first, then most constrained
	minNeed  int
	pinned   []int // nodes of pinned pods
	pref     *preference
	fallback bool // the preference named no leaf or spine
	nodeAgg  []agg
	leafAgg  []agg
	outcomes map[string]*outcome
	caps     []capTable // by shape
	reasons  []string
	workload Workload
	filters  []nodeFilters // by shape
	usable   []bool        // by node: some pod of the job passes its filters
	// roomy is, once the counts are made, by node: some pod of the job
	// passes its filters and finds room for its requests.
	roomy    []bool
	resBase  nodeVec[[]int64] // by node: allocatable in use before the plan
	ruledOut []FilteredNodes
	// split says, per level label, a candidate of that size that
	// Job.TopologyKeys left out (topologykey.go).
	split map[string]string
	// apart is, by pod, the pods of the job it must not share a value of
	// a topology key with, and apartVals the values by key it may not use
	// (antiaffinity.go); both nil when no term ties a pod.
	apart     [][]apart
	apartVals []map[string]map[string]bool
	apartBy   string // the keys of apart, for reasons
	// together is, by pod, its required pod affinity (podaffinity.go);
	// nil when no pod of the job has any.
	together    []togetherness
	togetherBy  string      // the keys of together, for reasons
	fixed       *[]fixedPod // pinned pods and neighbours, once found (fixedPods)
	selectsNone string      // which pods' affinity selects no pod, for reasons
	// spread is the job's topology spread constraints (spread.go), nil
	// when no pod has one, kept as inOrder says.
	spread  *spreading
	inOrder bool
	// portsHeld are, by node, the host ports held there outside the plan;
	// nil when no pod of the job asks for one (hostports.go).
	portsHeld map[int][]v1.ContainerPort
	sc        *scratch // the node-length buffers, handed back when the plan returns
}

type preference struct {
	dom      Domain
	leaf     *leaf
	spine    *spine
	tooSmall bool // could not hold the job even if it were empty
}

// Plan picks the domain and the node of every pod of job. The snapshot and
// reservations are only read; the caller records the plan with
// Reservations.Add(plan.Reservation()) before planning the next job.
//
// A job whose topology spread constraints hold in no domain whatever order
// its pods bind in (spread.go) is planned so that they hold in the order
// the planner places the pods, which the scheduler may not bind them in.
func (p *Planner) Plan(ctx context.Context, snap *Snapshot, res *Reservations, job Job) (*Plan, error) {
	plan, err := p.plan(ctx, snap, res, job, false)
	var u *Unschedulable
	if err == nil || !errors.As(err, &u) || !slices.ContainsFunc(job.Pods, hasSpread) {
		return plan, err
	}
	inOrder, ierr := p.plan(ctx, snap, res, job, true)
	if ierr != nil {
		return nil, err
	}
	inOrder.Reasons = slices.Insert(inOrder.Reasons, 0,
		fmt.Sprintf("no domain keeps the pods' topology spread constraints whatever order they bind in (%s); planned so they hold in the order placed, kube-scheduler may refuse a pod that binds out of it", u.Reason))
	return inOrder, nil
}

func (p *Planner) plan(ctx context.Context, snap *Snapshot, res *Reservations, job Job, inOrder bool) (*Plan, error) {
	st, err := p.newState(ctx, snap, res, &job, inOrder)
	if err != nil {
		return nil, err
	}
	defer st.sc.release()
	if plan, ok, err := st.planOnePod(); ok || err != nil {
		return plan, err
	}
	st.computeCounts()
	st.initCaps()
	st.reasons = append(st.reasons, fmt.Sprintf("job %s: %d pods (%s), placement %s, strategy %s",
		job.Key, st.n, st.podDesc(), job.Placement, job.Strategy))

	// A group that already runs somewhere keeps its domain; a preference
	// means nothing then.
	fixed := job.Domain != nil || (len(st.pinned) > 0 && job.Placement != PlacementNone)
	if !fixed {
		if err := st.resolvePreference(); err != nil {
			return nil, err
		}
	}
	levels := st.levels()
	if fixed {
		d, label := st.groupDomain(), "the domain of the job's running pods, "
		if job.Domain != nil {
			d, label = *job.Domain, "the required domain, "
		}
		cand, err := st.fixedCand(d)
		if err != nil {
			return nil, &InvalidJobError{Job: job.Key, Reason: err.Error()}
		}
		cand.honours = true
		levels = append([]level{{label: label + d.String(), named: true, cands: func() []*candidate { return []*candidate{cand} }}},
			st.widerLevels(levels, cand)...)
		st.ruledOut = st.filtered(cand.nodes())
	} else {
		st.ruledOut = st.filtered(nil)
	}
	levels = st.keepWithinKeys(levels)
	if len(st.ruledOut) > 0 {
		st.reasons = append(st.reasons, filteredSentence(st.ruledOut))
	}

	var failures []levelFailure
	var miss string // why the preference could not be met, at the latest size
	for _, lv := range levels {
		cands := lv.cands()
		if st.pref == nil {
			if plan, err := st.pick(cands, lv); plan != nil || err != nil {
				if plan != nil && fixed && len(failures) > 0 {
					plan.Widened = true
					plan.Reasons = slices.Insert(plan.Reasons, len(plan.Reasons)-2,
						fmt.Sprintf("%s could no longer hold the job; widened to %s, which holds the pods that keep their places", levels[0].label, plan.Domain))
				}
				return plan, err
			}
			fl, err := st.failLevel(lv, cands, false)
			if err != nil {
				return nil, err
			}
			failures = append(failures, fl)
			st.reasons = append(st.reasons, fl.sentence())
			continue
		}
		// Preferred candidates first at every size; locality wins over
		// preference, so the others of the same size come next.
		var mine, others []*candidate
		for _, c := range cands {
			if c.honours || st.honours(c) {
				mine = append(mine, c)
			} else {
				others = append(others, c)
			}
		}
		if plan, err := st.pick(mine, lv); plan != nil || err != nil {
			return plan, err
		}
		fl, err := st.failLevel(lv, mine, true)
		if err != nil {
			return nil, err
		}
		if len(mine) > 0 {
			miss = st.prefMiss(fl, mine)
			if st.job.PreferredRequired {
				fl.line = miss
				failures = append(failures, fl)
				st.reasons = append(st.reasons, fl.sentence())
			}
		}
		if st.job.PreferredRequired {
			continue
		}
		switch {
		case miss == "":
			miss = fmt.Sprintf("no %s lies in preferred %s", lv.label, st.pref.dom)
		case len(mine) > 1 && fl.best != "":
			miss += "; best there: " + fl.best
		}
		plan, err := st.pick(others, lv)
		if err != nil {
			return nil, err
		}
		if plan != nil {
			plan.Fallback = true
			plan.Reasons = slices.Insert(plan.Reasons, len(plan.Reasons)-2, miss+"; falling back")
			return plan, nil
		}
		if fl, err = st.failLevel(lv, cands, true); err != nil {
			return nil, err
		}
		failures = append(failures, fl)
		st.reasons = append(st.reasons, fl.sentence())
	}
	return nil, st.refuse(failures)
}

func (p *Planner) newState(ctx context.Context, snap *Snapshot, res *Reservations, job *Job, inOrder bool) (*state, error) {
	if job.Placement == "" {
		job.Placement = PlacementAuto
	}
	if job.Strategy == "" {
		job.Strategy = StrategyBalanced
	}
	bad := func(format string, args ...any) error {
		return &InvalidJobError{Job: job.Key, Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case job.Key == "":
		return nil, bad("the job has no key")
	case len(job.Pods) == 0:
		return nil, bad("the job has no pods to place")
	case !slices.Contains([]Placement{PlacementAuto, PlacementSameLeaf, PlacementAdjacentLeaves, PlacementSameSpine, PlacementNone}, job.Placement):
		return nil, bad("unknown placement %q: use auto, same-leaf, adjacent-leaves, same-spine or none", job.Placement)
	case !slices.Contains([]Strategy{StrategyConsolidated, StrategyBalanced, StrategyDistributed}, job.Strategy):
		return nil, bad("unknown strategy %q: use consolidated, balanced or distributed", job.Strategy)
	}
	c := snap.cluster
	st := &state{c: c, job: job, n: len(job.Pods), outcomes: map[string]*outcome{}, workload: p.workload, sc: getScratch(len(c.nodes)), inOrder: inOrder}
	base, sbase := snap.withReservations(res, job.Key)
	st.f = newFitter(ctx, p.eval, c, job.Key, base, st.sc.keys)
	st.f.sbase = sbase
	st.f.shares, st.f.sshares = snap.sharesWithReservations(res, job.Key)
	st.resBase = snap.resourcesInUse(res, job.Key)
	shapeIDs := map[string]int{}
	seen := map[string]bool{}
	for _, pod := range job.Pods {
		if pod.Name == "" || seen[pod.Name] {
			return nil, bad("pod names must be unique and not empty, got %q", pod.Name)
		}
		if _, ok := job.Pinned[pod.Name]; ok {
			return nil, bad("pod %s is both pinned and to be placed", pod.Name)
		}
		seen[pod.Name] = true
		sh, err := st.f.addShape(pod, shapeIDs)
		if err != nil {
			return nil, bad("%v", err)
		}
		st.podShape = append(st.podShape, sh)
	}
	st.f.findRelevant()
	st.f.findNonLocal()
	st.filterNodes(klog.FromContext(ctx))
	st.minNeed = st.f.shapes[0].need
	for _, s := range st.f.shapes {
		st.minNeed = min(st.minNeed, s.need)
	}
	st.podOrder = make([]int, st.n)
	for i := range st.podOrder {
		st.podOrder[i] = i
	}
	// Among pods of equal size, those that fewer nodes accept go first, so
	// a pod that could go anywhere does not take the only node another can.
	sort.SliceStable(st.podOrder, func(a, b int) bool {
		x, y := st.podShape[st.podOrder[a]], st.podShape[st.podOrder[b]]
		if st.f.shapes[x].need != st.f.shapes[y].need {
			return st.f.shapes[x].need > st.f.shapes[y].need
		}
		return st.filters[x].passed < st.filters[y].passed
	})
	for _, pod := range slices.Sorted(maps.Keys(job.Pinned)) {
		i, ok := c.byName[job.Pinned[pod]]
		if !ok {
			return nil, bad("pinned pod %s is on node %s, which is not in the cluster", pod, job.Pinned[pod])
		}
		st.pinned = append(st.pinned, i)
	}
	if err := st.findApart(); err != nil {
		return nil, bad("%v", err)
	}
	if err := st.findTogether(); err != nil {
		return nil, bad("%v", err)
	}
	if err := st.findSpread(klog.FromContext(ctx)); err != nil {
		return nil, bad("%v", err)
	}
	st.findHostPorts()
	return st, nil
}

// resolvePreference finds the preferred leaf or spine. An unknown name is
// a refusal when required and a recorded fallback otherwise.
func (st *state) resolvePreference() error {
	name := st.job.PreferredDomain
	if name == "" {
		return nil
	}
	if l := st.c.leafByN[name]; l != nil {
		st.pref = &preference{dom: Domain{Level: LevelLeaf, Names: []string{name}}, leaf: l, tooSmall: st.leafAgg[l.idx].ubEmpty < st.n}
		return nil
	}
	if s := st.c.spineByN[name]; s != nil {
		st.pref = &preference{dom: Domain{Level: LevelSpine, Names: []string{name}}, spine: s}
		st.pref.tooSmall = st.spineCand([]*spine{s}, st.pref.dom).ubEmpty < st.n
		return nil
	}
	msg := fmt.Sprintf("preferred domain %s is neither a leaf nor a spine of the cluster", name)
	if st.job.PreferredRequired {
		return &Unschedulable{Job: st.job.Key, Reason: msg}
	}
	st.reasons = append(st.reasons, msg+"; ignoring it")
	st.fallback = true
	return nil
}

// honours says whether candidate c lies in the preferred domain or, for a
// job the preferred domain could not hold even when empty, contains it.
// Otherwise a bigger domain around a full preferred leaf would "honour" it
// while no pod lands there. The whole cluster honours no preference.
func (st *state) honours(c *candidate) bool {
	p := st.pref
	switch {
	case c.whole:
		return false
	case c.node != nil:
		return (p.leaf != nil && c.node.leaf == p.leaf) || (p.spine != nil && c.node.spine == p.spine)
	case p.leaf != nil:
		inside := len(c.leaves) == 1 && c.leaves[0] == p.leaf
		return inside || p.tooSmall && slices.Contains(c.leaves, p.leaf)
	}
	inside := len(c.spines) == 1 && c.spines[0] == p.spine
	return inside || p.tooSmall && slices.Contains(c.spines, p.spine)
}

// prefCand is the preferred domain itself, for placement none.
func (st *state) prefCand() *candidate {
	var c *candidate
	if st.pref.leaf != nil {
		c = st.runCand(st.pref.leaf.spine, st.pref.leaf.pos, st.pref.leaf.pos+1)
	} else {
		c = st.spineCand([]*spine{st.pref.spine}, st.pref.dom)
	}
	c.honours = true
	return c
}

// pick tries the candidates that may hold the job, best fit first, and
// returns the plan of the first that does.
func (st *state) pick(cands []*candidate, lv level) (*Plan, error) {
	var feasible []*candidate
	for _, c := range cands {
		if c.ub >= st.n && c.freeDev >= st.totalNeed() {
			feasible = append(feasible, c)
		}
	}
	sort.SliceStable(feasible, func(a, b int) bool {
		if feasible[a].free != feasible[b].free {
			return feasible[a].free < feasible[b].free
		}
		return topology.NaturalLess(feasible[a].key(), feasible[b].key())
	})
	// The first domain in best-fit order where every pod gets its claims'
	// first choices; with preference ladders, the domain with the best
	// rungs, best fit breaking ties.
	var best *candidate
	var bestA *attempt
	var bestAllocs map[string][]resourceapi.AllocationResult
	for _, c := range feasible {
		out, err := st.evaluate(c)
		if err != nil {
			return nil, err
		}
		if out.pods < st.n {
			continue
		}
		if out, err = st.attemptOn(c); err != nil {
			return nil, err
		}
		if out.a == nil || out.a.placed < st.n || (best != nil && out.a.rank >= bestA.rank) {
			continue
		}
		allocs, err := st.verify(out.a)
		if errors.Is(err, errVerify) {
			st.reasons = append(st.reasons, fmt.Sprintf("%s: %v", c.dom(), err))
			continue
		}
		if err != nil {
			return nil, err
		}
		best, bestA, bestAllocs = c, out.a, allocs
		if out.a.rank == 0 {
			break
		}
	}
	if best == nil {
		return nil, nil
	}
	return st.makePlan(best, bestA, bestAllocs, lv.label, len(feasible)), nil
}

func (st *state) totalNeed() int {
	t := 0
	for _, s := range st.f.shapes {
		t += s.need * s.pods
	}
	return t
}
