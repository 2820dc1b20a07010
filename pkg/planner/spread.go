package planner

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
)

// Topology spread constraints that must hold (whenUnsatisfiable:
// DoNotSchedule). kube-scheduler's PodTopologySpread filter lets a pod
// onto a node only if the node has every key of the pod's constraints
// and, for each constraint, the pods it selects in the pod's namespace
// in the node's value of the key, plus the pod itself if it matches,
// exceed the fewest in any value (the global minimum; 0 while fewer
// values than minDomains exist) by no more than maxSkew. It counts the
// pods on eligible nodes only: nodes with every key that match the pod's
// node affinity (nodeAffinityPolicy Honor, the default) and, with
// nodeTaintsPolicy Honor, whose taints the pod tolerates.
//
// The scheduler checks one pod at a time, in an order the planner does
// not choose, once the gates open. So the planner keeps the stronger
// condition that holds whatever the order: in each value where a pod
// carrying the constraint goes, every pod the constraint selects there
// at the end (outside the job, pinned, and the job's own) exceeds the
// global minimum before the plan by at most maxSkew. Counts only grow
// while the job's pods bind and the minimum with them, so each pod then
// passes the filter whenever it comes. Where that holds in no domain (a
// job that must fill every value of a key more than maxSkew deep), the
// job is planned as the scheduler would place its pods in the planner's
// order (Plan, inOrder): each pod within maxSkew of the fewest at its
// turn. A pod the scheduler binds out of that order may be refused, and
// is planned again as any refused pod is.

// spreadRule is one DoNotSchedule constraint of the job's pods, ready to
// count.
type spreadRule struct {
	key        string
	maxSkew    int
	sel        labels.Selector
	ns         string
	eligible   []bool         // by node: the scheduler counts the pods on it
	base       map[string]int // by value: the pods it selects outside the plan
	min        int            // the global minimum before the plan
	minDomains int
}

// spreading is the job's spread constraints (spread.go): the rules, and
// by pod the rules it carries, the keys a node needs, and how many of its
// members each rule selects.
type spreading struct {
	rules   []spreadRule
	carries [][]int
	keys    [][]string
	selects [][]int // by pod, by rule
	by      string  // the rules' keys, for reasons
}

// requiredSpread are the pod's topology spread constraints that must
// hold.
func requiredSpread(pod *v1.Pod) []v1.TopologySpreadConstraint {
	var out []v1.TopologySpreadConstraint
	for _, c := range pod.Spec.TopologySpreadConstraints {
		if c.WhenUnsatisfiable == v1.DoNotSchedule {
			out = append(out, c)
		}
	}
	return out
}

// hasSpread says whether the pod has a spread constraint that must hold.
func hasSpread(p Pod) bool {
	return slices.ContainsFunc(p.Spread, func(c v1.TopologySpreadConstraint) bool { return c.WhenUnsatisfiable == v1.DoNotSchedule })
}

// SpreadSelector is the constraint's label selector with its
// matchLabelKeys merged in from the pod's labels, as the scheduler
// merges them.
func SpreadSelector(c v1.TopologySpreadConstraint, podLabels map[string]string) (labels.Selector, error) {
	sel, err := metav1.LabelSelectorAsSelector(c.LabelSelector)
	if err != nil {
		return nil, err
	}
	for _, k := range c.MatchLabelKeys {
		if v, ok := podLabels[k]; ok {
			r, err := labels.NewRequirement(k, selection.Equals, []string{v})
			if err != nil {
				return nil, err
			}
			sel = sel.Add(*r)
		}
	}
	return sel, nil
}

// countsFor says how many pods sel selects among members in namespace ns,
// as the scheduler counts them: an empty selector selects none.
func countsFor(sel labels.Selector, ns string, members []Member) int {
	if sel.Empty() {
		return 0
	}
	n := 0
	for _, m := range members {
		if m.Namespace == ns && sel.Matches(labels.Set(m.Labels)) {
			n++
		}
	}
	return n
}

// findSpread fills st.spread, nil when no pod of the job has a spread
// constraint that must hold.
func (st *state) findSpread(logger klog.Logger) error {
	job := st.job
	if !slices.ContainsFunc(job.Pods, hasSpread) {
		return nil
	}
	sp := &spreading{carries: make([][]int, len(job.Pods)), keys: make([][]string, len(job.Pods))}
	ids := map[string]int{}
	for i, p := range job.Pods {
		must := slices.DeleteFunc(slices.Clone(p.Spread), func(c v1.TopologySpreadConstraint) bool { return c.WhenUnsatisfiable != v1.DoNotSchedule })
		if len(must) == 0 {
			continue
		}
		var own map[string]string
		if len(p.Members) > 0 {
			own = p.Members[0].Labels
		}
		for _, c := range must {
			if !slices.Contains(sp.keys[i], c.TopologyKey) {
				sp.keys[i] = append(sp.keys[i], c.TopologyKey)
			}
		}
		slices.Sort(sp.keys[i])
		for _, c := range must {
			sel, err := SpreadSelector(c, own)
			if err != nil {
				return fmt.Errorf("pod %s: topology spread constraint on %s: %v", p.Name, c.TopologyKey, err)
			}
			affinity := v1.NodeInclusionPolicyHonor
			if c.NodeAffinityPolicy != nil {
				affinity = *c.NodeAffinityPolicy
			}
			taints := v1.NodeInclusionPolicyIgnore
			if c.NodeTaintsPolicy != nil {
				taints = *c.NodeTaintsPolicy
			}
			minDomains := 1
			if c.MinDomains != nil {
				minDomains = int(*c.MinDomains)
			}
			// Which nodes count depends on the pod's keys, and, with the
			// policies honoured, on its node constraints (its shape).
			id := fmt.Sprintf("%s\x00%d\x00%s\x00%s\x00%s\x00%s\x00%d\x00%s", c.TopologyKey, c.MaxSkew, sel, p.namespace(), affinity, taints, minDomains, strings.Join(sp.keys[i], ","))
			if affinity == v1.NodeInclusionPolicyHonor || taints == v1.NodeInclusionPolicyHonor {
				id += fmt.Sprintf("\x00%d", st.podShape[i])
			}
			r, ok := ids[id]
			if !ok {
				r = len(sp.rules)
				ids[id] = r
				sp.rules = append(sp.rules, st.newSpreadRule(logger, i, c, sel, sp.keys[i], affinity, taints, minDomains))
			}
			if !slices.Contains(sp.carries[i], r) {
				sp.carries[i] = append(sp.carries[i], r)
			}
		}
	}
	sp.selects = make([][]int, len(job.Pods))
	for i, p := range job.Pods {
		sp.selects[i] = make([]int, len(sp.rules))
		for r := range sp.rules {
			sp.selects[i][r] = countsFor(sp.rules[r].sel, sp.rules[r].ns, p.Members)
		}
	}
	keys := map[string]bool{}
	for _, r := range sp.rules {
		keys[r.key] = true
	}
	sp.by = strings.Join(slices.Sorted(maps.Keys(keys)), ", ")
	if len(sp.rules) == 0 {
		return nil
	}
	st.spread = sp
	st.reasons = append(st.reasons, fmt.Sprintf("the job's pods spread by %s (their topology spread constraints)", sp.by))
	return nil
}

// newSpreadRule readies constraint c of pod i: the nodes whose pods it
// counts, what it counts there outside the plan, and the global minimum.
func (st *state) newSpreadRule(logger klog.Logger, i int, c v1.TopologySpreadConstraint, sel labels.Selector, keys []string, affinity, taints v1.NodeInclusionPolicy, minDomains int) spreadRule {
	job := st.job
	r := spreadRule{key: c.TopologyKey, maxSkew: int(c.MaxSkew), sel: sel, ns: job.Pods[i].namespace(),
		eligible: make([]bool, len(st.c.nodes)), base: map[string]int{}, minDomains: minDomains}
	pod := job.Pods[i]
	own := pod.OwnNodeAffinity
	if own == nil {
		own = pod.NodeAffinity
	}
	ownAffinity := nodeaffinity.NewRequiredNodeAffinity(pod.NodeSelector, &v1.Affinity{NodeAffinity: own})
	for n, nd := range st.c.nodes {
		if nd.gone || !hasKeys(nd.obj.Labels, keys) {
			continue
		}
		if affinity == v1.NodeInclusionPolicyHonor {
			if ok, _ := ownAffinity.Match(nd.obj); !ok {
				continue
			}
		}
		if taints == v1.NodeInclusionPolicyHonor {
			if _, bad := corev1helpers.FindMatchingUntoleratedTaint(logger, nd.taints, pod.Tolerations, func(t *v1.Taint) bool {
				return t.Effect == v1.TaintEffectNoSchedule || t.Effect == v1.TaintEffectNoExecute
			}, true); bad {
				continue
			}
		}
		r.eligible[n] = true
		r.base[nd.obj.Labels[r.key]] += 0
	}
	bound := map[string]int{} // what the minimum is taken over: bound pods only
	count := func(node int, members []Member, isBound bool) {
		if node < 0 || !r.eligible[node] {
			return
		}
		k := countsFor(sel, r.ns, members)
		v := st.c.nodes[node].obj.Labels[r.key]
		r.base[v] += k
		if isBound {
			bound[v] += k
		}
	}
	for name, nodeName := range job.Pinned {
		if p, ok := job.PinnedPods[name]; ok {
			count(st.nodeIndex(nodeName), p.Members, !job.Unbound[name])
		}
	}
	for _, nb := range job.Spread {
		count(st.nodeIndex(nb.Node), nb.Pod.Members, nb.Bound)
	}
	r.min = math.MaxInt
	for v := range r.base {
		r.min = min(r.min, bound[v])
	}
	// The gates open with node affinity to the plan's domain, so with
	// the affinity policy honoured the scheduler counts only the
	// domain's values, perhaps fewer than minDomains.
	if len(r.base) < minDomains || minDomains > 1 {
		r.min = 0
	}
	return r
}

func (st *state) nodeIndex(name string) int {
	if n, ok := st.c.byName[name]; ok {
		return n
	}
	return -1
}

func hasKeys(l map[string]string, keys []string) bool {
	for _, k := range keys {
		if _, ok := l[k]; !ok {
			return false
		}
	}
	return true
}

// spreadCounts are an attempt's own pods by rule and value: those a rule
// selects, and those that carry it.
type spreadCounts struct {
	selected []map[string]int
	carriers []map[string]int
	min      []int // by rule, the global minimum at the pod's turn (inOrder)
}

// keptBySpread says whether the pod may not go to node n for a spread
// constraint: n lacks a key of the pod's constraints, or going there
// would leave a value where a pod carrying a rule goes with more pods
// than the rule allows.
func (a *attempt) keptBySpread(pod, n int) bool {
	sp := a.st.spread
	if sp == nil {
		return false
	}
	nl := a.st.c.nodes[n].obj.Labels
	if !hasKeys(nl, sp.keys[pod]) {
		return true
	}
	a.startSpread()
	for r := range sp.rules {
		rule := &sp.rules[r]
		carries := slices.Contains(sp.carries[pod], r)
		if !carries && (a.st.inOrder || sp.selects[pod][r] == 0 || !rule.eligible[n]) {
			continue
		}
		v := nl[rule.key]
		if !carries && a.spread.carriers[r][v] == 0 {
			continue
		}
		least := rule.min
		if a.st.inOrder {
			least = a.spread.min[r]
		}
		if rule.base[v]+a.spread.selected[r][v]+sp.selects[pod][r]-least > rule.maxSkew {
			return true
		}
	}
	return false
}

func (a *attempt) startSpread() {
	if a.spread.selected != nil {
		return
	}
	sp := a.st.spread
	a.spread.selected = make([]map[string]int, len(sp.rules))
	a.spread.carriers = make([]map[string]int, len(sp.rules))
	for r := range sp.rules {
		a.spread.selected[r], a.spread.carriers[r] = map[string]int{}, map[string]int{}
	}
}

// spreadTurn readies the global minimum of every rule for the next pod,
// when the job is planned in order.
func (a *attempt) spreadTurn() {
	sp := a.st.spread
	if sp == nil || !a.st.inOrder {
		return
	}
	a.startSpread()
	if a.spread.min == nil {
		a.spread.min = make([]int, len(sp.rules))
	}
	for r := range sp.rules {
		rule := &sp.rules[r]
		least := math.MaxInt
		for v, k := range rule.base {
			least = min(least, k+a.spread.selected[r][v])
		}
		if len(rule.base) < rule.minDomains || rule.minDomains > 1 {
			least = 0
		}
		a.spread.min[r] = least
	}
}

// tookSpread counts the pod onto node n for the attempt's spread rules.
func (a *attempt) tookSpread(pod, n int) {
	sp := a.st.spread
	if sp == nil || a.spread.selected == nil {
		return
	}
	nl := a.st.c.nodes[n].obj.Labels
	for r := range sp.rules {
		rule := &sp.rules[r]
		v, ok := nl[rule.key]
		if !ok {
			continue
		}
		if rule.eligible[n] {
			a.spread.selected[r][v] += sp.selects[pod][r]
		}
		if slices.Contains(sp.carries[pod], r) {
			a.spread.carriers[r][v]++
		}
	}
}
