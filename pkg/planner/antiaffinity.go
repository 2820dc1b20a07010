package planner

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Required pod anti-affinity among the job's own pods. kube-scheduler's
// InterPodAffinity filter refuses a pod a node whose value of a term's
// topologyKey is shared by a pod the term selects, and does the same the
// other way round: a pod whose own required anti-affinity term selects
// the incoming pod keeps it out of its value too. Pods of one job often
// carry such a term against each other ("one pod per node"), and a plan
// that ignored it would put two of them where the scheduler binds only
// one. The planner keeps every two pods of the job that a term sets apart
// (the pods it places and the pinned ones) in different values of the
// term's key; a node without the label is no value and holds any of them,
// as the scheduler's filter lets it. Terms against pods outside the job
// are the scheduler's to weigh: a pod refused for them is planned again
// away from the node (refusedNode in the controller).

// Member is a pod as the anti-affinity terms of the job's pods see it.
type Member struct {
	Namespace string
	Labels    map[string]string
}

// apart is one pod, or pinned pod, that a pod must not share a value of
// key with.
type apart struct {
	key  string
	pod  int // index into Job.Pods, or -1
	node int // the pinned pod's node when pod is -1
}

// antiTerm is a required anti-affinity term, ready to match.
type antiTerm struct {
	key        string
	sel        labels.Selector
	namespaces []string // nil with anyNS
	anyNS      bool
}

func compileAnti(p Pod) ([]antiTerm, error) {
	var out []antiTerm
	for _, t := range p.AntiAffinity {
		at := antiTerm{key: t.TopologyKey, sel: labels.Nothing()}
		if t.LabelSelector != nil {
			s, err := metav1.LabelSelectorAsSelector(t.LabelSelector)
			if err != nil {
				return nil, fmt.Errorf("pod %s: pod anti-affinity term on %s: %v", p.Name, t.TopologyKey, err)
			}
			at.sel = s
		}
		switch {
		case t.NamespaceSelector != nil:
			// The planner does not see namespaces' labels. The job's
			// pods share one namespace; a selector that leaves that
			// namespace out is rare, and keeping such pods apart costs
			// only room, never a refused bind.
			at.anyNS = true
		case len(t.Namespaces) > 0:
			at.namespaces = t.Namespaces
		default:
			at.namespaces = []string{p.namespace()}
		}
		out = append(out, at)
	}
	return out, nil
}

func (p Pod) namespace() string {
	if len(p.Members) > 0 {
		return p.Members[0].Namespace
	}
	return ""
}

// selects says whether the term selects any of the members.
func (t antiTerm) selects(members []Member) bool {
	for _, m := range members {
		if (t.anyNS || slices.Contains(t.namespaces, m.Namespace)) && t.sel.Matches(labels.Set(m.Labels)) {
			return true
		}
	}
	return false
}

// findApart fills st.apart: for every pod, the pods and pinned pods it
// must not share a value with. It returns an error only for a term whose
// label selector does not parse.
func (st *state) findApart() error {
	job := st.job
	withTerms := slices.ContainsFunc(job.Pods, func(p Pod) bool { return len(p.AntiAffinity) > 0 })
	for _, p := range job.PinnedPods {
		withTerms = withTerms || len(p.AntiAffinity) > 0
	}
	if !withTerms {
		return nil // the common case, without allocating
	}
	pinned := slices.Sorted(maps.Keys(job.Pinned))
	terms := make([][]antiTerm, len(job.Pods))
	for i, p := range job.Pods {
		t, err := compileAnti(p)
		if err != nil {
			return err
		}
		terms[i] = t
	}
	pinnedTerms := make([][]antiTerm, len(pinned))
	for i, name := range pinned {
		p, ok := job.PinnedPods[name]
		if !ok {
			continue
		}
		t, err := compileAnti(p)
		if err != nil {
			return err
		}
		pinnedTerms[i] = t
	}
	st.apart = make([][]apart, len(job.Pods))
	keys := map[string]bool{}
	add := func(i int, a apart) {
		if !slices.Contains(st.apart[i], a) {
			st.apart[i] = append(st.apart[i], a)
			keys[a.key] = true
		}
	}
	for i, p := range job.Pods {
		for j, q := range job.Pods {
			if i == j {
				continue
			}
			for _, t := range terms[i] {
				if t.selects(q.Members) {
					add(i, apart{key: t.key, pod: j})
					add(j, apart{key: t.key, pod: i})
				}
			}
		}
		for k, name := range pinned {
			node, ok := st.c.byName[job.Pinned[name]]
			if !ok {
				continue
			}
			q := job.PinnedPods[name]
			for _, t := range terms[i] {
				if t.selects(q.Members) {
					add(i, apart{key: t.key, pod: -1, node: node})
				}
			}
			for _, t := range pinnedTerms[k] {
				if t.selects(p.Members) {
					add(i, apart{key: t.key, pod: -1, node: node})
				}
			}
		}
	}
	if len(keys) > 0 {
		st.apartBy = strings.Join(slices.Sorted(maps.Keys(keys)), ", ")
		st.reasons = append(st.reasons, fmt.Sprintf("the job's pods keep apart by %s (their required pod anti-affinity)", st.apartBy))
	}
	return nil
}

// keptApart says whether the pod may not go to node n because a pod of
// the job it must keep apart from is in the same value already.
func (a *attempt) keptApart(pod, n int) bool {
	st := a.st
	if st.apart == nil {
		return false
	}
	nl := st.c.nodes[n].obj.Labels
	for _, ap := range st.apart[pod] {
		v, ok := nl[ap.key]
		if !ok {
			continue
		}
		other := ap.node
		if ap.pod >= 0 {
			if other = a.assign[ap.pod]; other < 0 {
				continue
			}
		}
		if w, ok := st.c.nodes[other].obj.Labels[ap.key]; ok && w == v {
			return true
		}
	}
	return false
}

// requiredAntiAffinity are the pod's required pod anti-affinity terms.
func requiredAntiAffinity(pod *v1.Pod) []v1.PodAffinityTerm {
	if a := pod.Spec.Affinity; a != nil && a.PodAntiAffinity != nil {
		return a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	}
	return nil
}
