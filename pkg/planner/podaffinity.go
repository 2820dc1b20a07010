package planner

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
)

// Required pod affinity. kube-scheduler's InterPodAffinity filter lets a
// pod onto a node only if the node has every term's topologyKey and, for
// each term, a pod the term selects is in the node's value of the key; a
// pod whose terms select no pod anywhere may still go to any node with
// the keys when it matches its own terms (the first of a series). The
// planner keeps each pod in the values of the pinned pods and neighbours
// its term selects; where the term selects none of those, in one value
// together with the job's pods it selects (JobSet's exclusive placement
// asks this of a child Job's pods: one leaf each). A pod whose term
// selects no pod at all, not even itself, fits nowhere, as in the
// scheduler.

// togetherness is one pod's required pod affinity, ready to check.
type togetherness struct {
	keys   []string                   // the terms' keys: a node needs every one
	within map[string]map[string]bool // by key, the values of the pods outside the job or pinned its terms select
	// with is, by key, the job's pods the pod shares the key's value
	// with (its term selects them, or theirs it; transitively), itself
	// included.
	with  map[string][]int
	never bool // a term selects no pod, not even the pod itself
}

// requiredAffinity are the pod's required pod affinity terms.
func requiredAffinity(pod *v1.Pod) []v1.PodAffinityTerm {
	if a := pod.Spec.Affinity; a != nil && a.PodAffinity != nil {
		return a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	}
	return nil
}

// findTogether fills st.together, nil when no pod of the job has
// required pod affinity.
func (st *state) findTogether() error {
	job := st.job
	if !slices.ContainsFunc(job.Pods, func(p Pod) bool { return len(p.Affinity) > 0 }) {
		return nil
	}
	fixed, err := st.fixedPods()
	if err != nil {
		return err
	}
	tog := make([]togetherness, len(job.Pods))
	// parent is, by key, a union-find over the job's pods.
	parent := map[string][]int{}
	find := func(key string, i int) int {
		p := parent[key]
		for p[i] != i {
			p[i] = p[p[i]]
			i = p[i]
		}
		return i
	}
	union := func(key string, i, j int) {
		if parent[key] == nil {
			parent[key] = make([]int, len(job.Pods))
			for k := range parent[key] {
				parent[key][k] = k
			}
		}
		parent[key][find(key, i)] = find(key, j)
	}
	keys := map[string]bool{}
	var never []string
	for i, p := range job.Pods {
		terms, err := compileTerms(p, p.Affinity, "affinity")
		if err != nil {
			return err
		}
		for _, t := range terms {
			keys[t.key] = true
			if !slices.Contains(tog[i].keys, t.key) {
				tog[i].keys = append(tog[i].keys, t.key)
			}
			vals := map[string]bool{}
			for _, f := range fixed {
				if v, ok := st.c.nodes[f.node].obj.Labels[t.key]; ok && t.selects(f.pod.Members) {
					vals[v] = true
				}
			}
			if len(vals) > 0 {
				if tog[i].within == nil {
					tog[i].within = map[string]map[string]bool{}
				}
				if prev, ok := tog[i].within[t.key]; ok {
					maps.DeleteFunc(vals, func(v string, _ bool) bool { return !prev[v] })
				}
				tog[i].within[t.key] = vals
				continue
			}
			tied := false
			for j, q := range job.Pods {
				if j != i && t.selects(q.Members) {
					union(t.key, i, j)
					tied = true
				}
			}
			if !tied && !t.selects(p.Members) {
				tog[i].never = true
				never = append(never, p.Name)
			}
		}
	}
	for key, p := range parent {
		groups := map[int][]int{}
		for i := range p {
			r := find(key, i)
			groups[r] = append(groups[r], i)
		}
		for _, g := range groups {
			if len(g) < 2 {
				continue
			}
			for _, i := range g {
				if tog[i].with == nil {
					tog[i].with = map[string][]int{}
				}
				tog[i].with[key] = g
				if !slices.Contains(tog[i].keys, key) {
					tog[i].keys = append(tog[i].keys, key) // to share a value, the node needs the key
				}
			}
		}
	}
	st.together = tog
	st.togetherBy = strings.Join(slices.Sorted(maps.Keys(keys)), ", ")
	if len(never) > 0 {
		st.selectsNone = fmt.Sprintf("the required pod affinity of %s selects no pod, so it fits nowhere", strings.Join(never, ", "))
	}
	reason := fmt.Sprintf("the job's pods keep together by %s (their required pod affinity)", st.togetherBy)
	if st.selectsNone != "" {
		reason += "; " + st.selectsNone
	}
	st.reasons = append(st.reasons, reason)
	return nil
}

// keptAway says whether the pod may not go to node n for its required
// pod affinity: n lacks one of its terms' keys, or its value of a key is
// not one the pod's terms allow, or not the value its tied pods already
// took in the attempt.
func (a *attempt) keptAway(pod, n int) bool {
	st := a.st
	if st.together == nil {
		return false
	}
	t := &st.together[pod]
	if t.never {
		return true
	}
	nl := st.c.nodes[n].obj.Labels
	for _, key := range t.keys {
		v, ok := nl[key]
		if !ok {
			return true
		}
		if vs, ok := t.within[key]; ok && !vs[v] {
			return true
		}
		for _, j := range t.with[key] {
			if other := a.assign[j]; j != pod && other >= 0 {
				if w, ok := st.c.nodes[other].obj.Labels[key]; !ok || w != v {
					return true
				}
			}
		}
	}
	return false
}
