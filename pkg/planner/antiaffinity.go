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

// Required pod anti-affinity. kube-scheduler's InterPodAffinity filter
// refuses a pod a node whose value of a term's topologyKey is shared by a
// pod the term selects, and does the same the other way round: a pod
// whose own required anti-affinity term selects the incoming pod keeps it
// out of its value too. Pods of one job often carry such a term against
// each other ("one pod per node"), and pods of other workloads against
// them ("not beside team X's jobs"); a plan that ignored either would put
// a pod where the scheduler refuses to bind it. The planner keeps every
// two pods of the job that a term sets apart in different values of the
// term's key, and keeps each pod out of the values of the pods outside
// the job that a term ties it to (Job.Neighbours) and of its pinned pods;
// a node without the label is no value and holds any of them, as the
// scheduler's filter lets it.

// Member is a pod as the anti-affinity terms of the job's pods see it.
type Member struct {
	Namespace string
	Labels    map[string]string
	// NamespaceLabels are the labels of the pod's namespace, which a
	// term's namespace selector matches.
	NamespaceLabels map[string]string
}

// apart is a pod of the job that a pod must not share a value of key
// with.
type apart struct {
	key string
	pod int // index into Job.Pods
}

// Neighbour is a pod outside the job that is on a node, or on its way to
// one (planned, nominated), and that required pod anti-affinity or
// affinity may tie to the job's pods: one of its anti-affinity terms
// selects one of them, or one of theirs selects it. NeighbourFor fills
// it.
type Neighbour struct {
	Node string
	// Bound says the pod is bound to Node, not only on its way there: the
	// minimum a topology spread constraint allows is taken over bound
	// pods only.
	Bound bool
	// Pod carries the neighbour's Members (one), AntiAffinity and
	// HostPorts.
	Pod Pod
}

// NeighbourFor is pod on node, bound there or on its way, as the job's
// terms, spread constraints and host ports see it.
func NeighbourFor(pod *v1.Pod, node string) Neighbour {
	return Neighbour{Node: node, Bound: pod.Spec.NodeName != "", Pod: Pod{Name: pod.Name, AntiAffinity: RequiredAntiAffinity(pod),
		HostPorts: RequiredHostPorts(pod), Members: []Member{{Namespace: pod.Namespace, Labels: pod.Labels}}}}
}

// Ties says which pods outside a job required pod affinity or
// anti-affinity ties to the job's pods: one of the outside pod's
// anti-affinity terms selects one of theirs, or one of their terms,
// anti-affinity or affinity, selects it (its own affinity asks nothing of
// them). NewTies readies the job's terms once.
type Ties struct {
	pods  []Pod
	terms []antiTerm // the job's pods' terms of both kinds
}

// NewTies readies the terms of pods. A term whose selector does not parse
// ties nothing (the API server admits none).
func NewTies(pods []Pod) *Ties {
	t := &Ties{pods: pods}
	for _, p := range pods {
		if anti, err := compileAnti(p); err == nil {
			t.terms = append(t.terms, anti...)
		}
		if aff, err := compileTerms(p, p.Affinity, "affinity"); err == nil {
			t.terms = append(t.terms, aff...)
		}
	}
	return t
}

// Tied reports whether q is tied to the job's pods.
func (t *Ties) Tied(q Pod) bool {
	for _, term := range t.terms {
		if term.selects(q.Members) {
			return true
		}
	}
	if len(q.AntiAffinity) == 0 {
		return false
	}
	qt, err := compileAnti(q)
	if err != nil {
		return false
	}
	for _, p := range t.pods {
		for _, term := range qt {
			if term.selects(p.Members) {
				return true
			}
		}
	}
	return false
}

// antiTerm is a required anti-affinity term, ready to match.
type antiTerm struct {
	key        string
	sel        labels.Selector
	namespaces []string
	// nsSel is the term's namespace selector; labels.Nothing() without
	// one, labels.Everything() for an empty one.
	nsSel labels.Selector
}

func compileAnti(p Pod) ([]antiTerm, error) { return compileTerms(p, p.AntiAffinity, "anti-affinity") }

// compileTerms readies the pod's terms of kind (affinity, anti-affinity)
// to match.
func compileTerms(p Pod, terms []v1.PodAffinityTerm, kind string) ([]antiTerm, error) {
	var out []antiTerm
	for _, t := range terms {
		at := antiTerm{key: t.TopologyKey, sel: labels.Nothing()}
		if t.LabelSelector != nil {
			s, err := metav1.LabelSelectorAsSelector(t.LabelSelector)
			if err != nil {
				return nil, fmt.Errorf("pod %s: pod %s term on %s: %v", p.Name, kind, t.TopologyKey, err)
			}
			at.sel = s
		}
		// The namespaces a term looks in, as kube-scheduler reads them:
		// those it names and those its namespace selector matches; the
		// pod's own where it has neither.
		at.nsSel = labels.Nothing()
		at.namespaces = t.Namespaces
		if t.NamespaceSelector != nil {
			s, err := metav1.LabelSelectorAsSelector(t.NamespaceSelector)
			if err != nil {
				return nil, fmt.Errorf("pod %s: pod %s term on %s: namespace selector: %v", p.Name, kind, t.TopologyKey, err)
			}
			at.nsSel = s
		} else if len(t.Namespaces) == 0 {
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
		if (slices.Contains(t.namespaces, m.Namespace) || t.nsSel.Matches(labels.Set(m.NamespaceLabels))) && t.sel.Matches(labels.Set(m.Labels)) {
			return true
		}
	}
	return false
}

// findApart fills st.apart and st.apartVals: for every pod, the pods of
// the job it must not share a value with, and the values it may not use,
// those of its pinned pods and neighbours it is tied to. Both stay nil
// when nothing ties any pod. It returns an error only for a term whose
// label selector does not parse.
func (st *state) findApart() error {
	job := st.job
	withTerms := len(job.Neighbours) > 0 || slices.ContainsFunc(job.Pods, func(p Pod) bool { return len(p.AntiAffinity) > 0 })
	for _, p := range job.PinnedPods {
		withTerms = withTerms || len(p.AntiAffinity) > 0
	}
	if !withTerms {
		return nil // the common case, without allocating
	}
	terms := make([][]antiTerm, len(job.Pods))
	for i, p := range job.Pods {
		t, err := compileAnti(p)
		if err != nil {
			return err
		}
		terms[i] = t
	}
	fixed, err := st.fixedPods()
	if err != nil {
		return err
	}
	apartPods := make([][]apart, len(job.Pods))
	vals := make([]map[string]map[string]bool, len(job.Pods))
	keys := map[string]bool{}
	tied := map[int]bool{} // the neighbours that keep a pod out
	addPod := func(i int, a apart) {
		if !slices.Contains(apartPods[i], a) {
			apartPods[i] = append(apartPods[i], a)
			keys[a.key] = true
		}
	}
	addVal := func(i int, key string, f int) {
		v, ok := st.c.nodes[fixed[f].node].obj.Labels[key]
		if !ok {
			return // a node without the key is in no value
		}
		if vals[i] == nil {
			vals[i] = map[string]map[string]bool{}
		}
		if vals[i][key] == nil {
			vals[i][key] = map[string]bool{}
		}
		vals[i][key][v] = true
		keys[key] = true
		if fixed[f].outside {
			tied[f] = true
		}
	}
	for i, p := range job.Pods {
		for j, q := range job.Pods {
			if i == j {
				continue
			}
			for _, t := range terms[i] {
				if t.selects(q.Members) {
					addPod(i, apart{key: t.key, pod: j})
					addPod(j, apart{key: t.key, pod: i})
				}
			}
		}
		for f := range fixed {
			for _, t := range terms[i] {
				if t.selects(fixed[f].pod.Members) {
					addVal(i, t.key, f)
				}
			}
			for _, t := range fixed[f].terms {
				if t.selects(p.Members) {
					addVal(i, t.key, f)
				}
			}
		}
	}
	if len(keys) == 0 {
		return nil
	}
	st.apart, st.apartVals = apartPods, vals
	st.apartBy = strings.Join(slices.Sorted(maps.Keys(keys)), ", ")
	why := "their required pod anti-affinity"
	if n := len(tied); n > 0 {
		why += fmt.Sprintf(", with %s outside the job", pods(n))
	}
	st.reasons = append(st.reasons, fmt.Sprintf("the job's pods keep apart by %s (%s)", st.apartBy, why))
	return nil
}

// fixedPod is a pod with a node already: a pinned pod of the job, or a
// neighbour outside it.
type fixedPod struct {
	node    int
	pod     Pod
	terms   []antiTerm // its anti-affinity
	outside bool
}

// fixedPods are the job's pinned pods and neighbours on nodes of the
// cluster, found once per plan (anti-affinity and affinity both read
// them).
func (st *state) fixedPods() ([]fixedPod, error) {
	if st.fixed != nil {
		return *st.fixed, nil
	}
	fixed, err := st.findFixed()
	if err == nil {
		st.fixed = &fixed
	}
	return fixed, err
}

func (st *state) findFixed() ([]fixedPod, error) {
	job := st.job
	var fixed []fixedPod
	for _, name := range slices.Sorted(maps.Keys(job.Pinned)) {
		node, ok := st.c.byName[job.Pinned[name]]
		p, known := job.PinnedPods[name]
		if !ok || !known {
			continue
		}
		t, err := compileAnti(p)
		if err != nil {
			return nil, err
		}
		fixed = append(fixed, fixedPod{node: node, pod: p, terms: t})
	}
	for _, nb := range job.Neighbours {
		node, ok := st.c.byName[nb.Node]
		if !ok {
			continue // a node outside the cluster is in no value of it
		}
		t, err := compileAnti(nb.Pod)
		if err != nil {
			return nil, err
		}
		fixed = append(fixed, fixedPod{node: node, pod: nb.Pod, terms: t, outside: true})
	}
	return fixed, nil
}

// keptApart says whether the pod may not go to node n: a pod it must
// keep apart from is in n's value of the key already, planned, pinned or
// outside the job.
func (a *attempt) keptApart(pod, n int) bool {
	st := a.st
	if st.apart == nil {
		return false
	}
	nl := st.c.nodes[n].obj.Labels
	for key, vs := range st.apartVals[pod] {
		if v, ok := nl[key]; ok && vs[v] {
			return true
		}
	}
	for _, ap := range st.apart[pod] {
		v, ok := nl[ap.key]
		if !ok {
			continue
		}
		other := a.assign[ap.pod]
		if other < 0 {
			continue
		}
		if w, ok := st.c.nodes[other].obj.Labels[ap.key]; ok && w == v {
			return true
		}
	}
	return false
}

// RequiredAntiAffinity are the pod's required pod anti-affinity terms.
func RequiredAntiAffinity(pod *v1.Pod) []v1.PodAffinityTerm {
	if a := pod.Spec.Affinity; a != nil && a.PodAntiAffinity != nil {
		return a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	}
	return nil
}
