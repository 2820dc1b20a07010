package planner

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gputopo/gputopo/pkg/topology"
)

// levelFailure is why no domain of one size could hold the job, and which
// came closest.
type levelFailure struct {
	label     string
	line      string // "no leaf can hold 4 pods (8 GPUs each)"
	best      string // "leaf leaf-2 holds 3 (3 nodes with room for a pod)"
	bestDom   Domain
	bestPods  int
	bigEnough bool // some candidate could hold the job were it empty
	// deferred: the search for the closest candidate was left out
	// (failLevel without full); lv and cands are kept for it.
	deferred bool
	lv       level
	cands    []*candidate
}

func (fl levelFailure) sentence() string {
	if fl.best == "" {
		return fl.line
	}
	return fl.line + "; best: " + fl.best
}

// failLevel finds the candidate that holds the most pods. Candidates are
// visited by their upper bound, so it stops as soon as no other can beat
// the best one found.
//
// Without full it only says that the size failed and whether it could
// hold the job were it empty, and keeps the candidates in fl for refuse:
// the reasons of a plan placed at a larger size leave out the closest
// domain of each smaller one.
func (st *state) failLevel(lv level, cands []*candidate, full bool) (levelFailure, error) {
	fl := levelFailure{label: lv.label}
	switch {
	case len(cands) == 0 && st.split[lv.label] != "":
		fl.line = fmt.Sprintf("no %s lies within one value of %s, the pod group's topology constraint (%s)", lv.label, st.keysPhrase(), st.split[lv.label])
	case len(cands) == 0:
		fl.line = fmt.Sprintf("no %s is available", lv.label)
	case lv.named:
		fl.line = fmt.Sprintf("%s cannot hold %s (%s)", lv.label, pods(st.n), st.podDesc())
	default:
		fl.line = fmt.Sprintf("no %s can hold %s (%s)", lv.label, pods(st.n), st.podDesc())
	}
	for _, c := range cands {
		ok, err := st.couldHold(c)
		if err != nil {
			return fl, err
		}
		if ok {
			fl.bigEnough = true
			break
		}
	}
	if !fl.bigEnough && len(cands) > 0 {
		fl.line += ", not even when empty"
	}
	if !full {
		// Which domain comes closest costs allocator runs on every
		// candidate (500 leaves for a 16-node Job at 5,000 nodes) and
		// matters only if the job is refused: refuse asks again then.
		fl.deferred, fl.lv, fl.cands = true, lv, cands
		return fl, nil
	}
	// Capacities bound every candidate cheaply; attempts (mixed shapes
	// only) go from the highest bound down until none can beat the best.
	type scored struct {
		c     *candidate
		bound int
	}
	order := make([]scored, 0, len(cands))
	for _, c := range cands {
		if c.ub == 0 {
			continue
		}
		o, err := st.evaluate(c)
		if err != nil {
			return fl, err
		}
		order = append(order, scored{c, min(c.ub, o.pods)})
	}
	sort.SliceStable(order, func(a, b int) bool {
		x, y := order[a], order[b]
		if x.bound != y.bound {
			return x.bound > y.bound
		}
		if x.c.free != y.c.free {
			return x.c.free < y.c.free
		}
		return topology.NaturalLess(x.c.key(), y.c.key())
	})
	room := 0
	for _, sc := range order {
		if sc.bound <= fl.bestPods {
			break
		}
		o, err := st.attemptOn(sc.c)
		if err != nil {
			return fl, err
		}
		if o.pods > fl.bestPods {
			fl.bestDom, fl.bestPods, room = sc.c.dom(), o.pods, o.room
		}
	}
	if fl.bestPods > 0 {
		fl.best = fmt.Sprintf("%s holds %d (%s with room for a pod)", fl.bestDom, fl.bestPods, plural(room, "node"))
	}
	return fl, nil
}

// prefMiss says why the preferred domain could not take the job.
func (st *state) prefMiss(fl levelFailure, mine []*candidate) string {
	p := st.pref.dom
	if len(mine) == 1 && mine[0].dom().String() == p.String() {
		if fl.bestPods == 0 {
			return fmt.Sprintf("preferred %s cannot hold %s: no node there has room for a pod (%s)", p, pods(st.n), st.podDesc())
		}
		o := st.outcomes[mine[0].key()]
		return fmt.Sprintf("preferred %s cannot hold %s: only %d fit, on %s with room for a pod (%s)", p, pods(st.n), fl.bestPods, plural(o.room, "node"), st.podDesc())
	}
	return fmt.Sprintf("no %s in or around preferred %s can hold %s (%s)", fl.label, p, pods(st.n), st.podDesc())
}

// refuse builds the error for a job no allowed domain can hold. The main
// reason is the smallest size that could hold the job were it empty: that
// is the size the job is meant for, and its best candidate is the one a
// person can make room in.
func (st *state) refuse(failures []levelFailure) error {
	for i, fl := range failures {
		if fl.deferred {
			full, err := st.failLevel(fl.lv, fl.cands, true)
			if err != nil {
				return err
			}
			failures[i] = full
		}
	}
	u := &Unschedulable{Job: st.job.Key, Filtered: st.ruledOut}
	if len(failures) == 0 {
		u.Reason = "no schedulable node is allowed for the job"
		if st.pref != nil {
			u.Reason = fmt.Sprintf("no domain allowed by placement %s lies in the required preferred %s", st.job.Placement, st.pref.dom)
		}
		return u
	}
	main := failures[len(failures)-1]
	for _, fl := range failures {
		if fl.bigEnough {
			main = fl
			break
		}
	}
	u.Reason, u.Best, u.BestDomain, u.BestPods = main.line, main.best, main.bestDom, main.bestPods
	if len(st.job.TopologyKeys) > 0 && !strings.Contains(u.Reason, "within one value") {
		u.Reason += fmt.Sprintf(", and its pod group's topology constraint allows no larger domain than one value of %s", st.keysPhrase())
	}
	if st.apartBy != "" {
		u.Reason += fmt.Sprintf(", its pods kept apart by %s (their required pod anti-affinity)", st.apartBy)
	}
	if st.togetherBy != "" {
		u.Reason += fmt.Sprintf(", its pods kept together by %s (their required pod affinity)", st.togetherBy)
	}
	if st.spread != nil {
		u.Reason += fmt.Sprintf(", its pods spread by %s (their topology spread constraints)", st.spread.by)
	}
	if st.portsHeld != nil {
		u.Reason += ", its pods' host ports (two pods cannot share one on a node)"
	}
	if st.selectsNone != "" {
		u.Reason += "; " + st.selectsNone
	}
	for _, fl := range failures {
		u.Details = append(u.Details, fl.sentence())
	}
	return u
}

// makePlan records the chosen candidate.
func (st *state) makePlan(c *candidate, a *attempt, allocs map[string][]resourceapi.AllocationResult, label string, feasible int) *Plan {
	p := &Plan{Job: st.job.Key, Domain: c.dom(), Assignments: map[string]string{}, Allocations: allocs, Requests: NodeUsage{}, Fallback: st.fallback}
	for i, n := range a.assign {
		pod := &st.job.Pods[i]
		p.Assignments[pod.Name] = st.c.nodes[n].name
		p.Requests.addRequests(st.c.nodes[n].name, pod.Requests)
	}
	left := 0
	for _, n := range c.nodes() {
		if st.usable[n] {
			left += st.c.nodes[n].healthy.free(st.f.used(n, a.extra[n]))
		}
	}
	p.Reasons = slices.Clone(st.reasons)
	switch {
	case c.honours:
		p.Reasons = append(p.Reasons, fmt.Sprintf("placing into %s; %d free GPUs left there", label, left))
	case c.dom().Level == LevelCluster && st.job.Placement != PlacementNone:
		p.Reasons = append(p.Reasons, fmt.Sprintf("last resort: %s, as no smaller domain can hold the job; %d free GPUs left there", c.dom(), left))
	default:
		p.Reasons = append(p.Reasons, fmt.Sprintf("chose %s: best fit among %s (%s) that can hold the job, %d free GPUs left there", c.dom(), plural(feasible, "candidate"), label, left))
	}
	leaves := map[*leaf]bool{}
	for n := range a.mine {
		leaves[st.c.nodes[n].leaf] = true
	}
	p.Reasons = append(p.Reasons, fmt.Sprintf("strategy %s: %s on %s in %s", st.job.Strategy, pods(a.placed), plural(a.nodes, "node"), plural(len(leaves), "leaf")))
	p.AllocatorRuns = st.f.runs
	return p
}

// podDesc describes what a pod asks for.
func (st *state) podDesc() string {
	if len(st.f.shapes) == 1 {
		return fmt.Sprintf("%s each", st.f.shapes[0].asks)
	}
	all := deviceCounts{}
	for _, s := range st.f.shapes {
		for kind, n := range s.asks {
			all.add(kind, n*s.pods)
		}
	}
	return fmt.Sprintf("%s in all", all)
}

func pods(n int) string { return plural(n, "pod") }

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	if strings.HasSuffix(what, "f") {
		return fmt.Sprintf("%d %sves", n, strings.TrimSuffix(what, "f"))
	}
	return fmt.Sprintf("%d %ss", n, what)
}
