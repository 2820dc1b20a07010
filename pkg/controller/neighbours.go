package controller

import (
	"cmp"
	"slices"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gputopo/gputopo/pkg/planner"
)

// Required pod anti-affinity ties a group to pods outside it both ways,
// as kube-scheduler's InterPodAffinity filter weighs it: a pod on a node
// whose own term selects a pod of the group keeps that pod out of the
// node's value of the term's key, and a term of the group's pod keeps it
// out of the value of every pod the term selects. Required pod affinity
// ties one way: a term of the group's pod keeps it in a value of a pod
// the term selects. The planner weighs them (planner.Job.Neighbours), so
// a plan never puts a pod where the scheduler refuses it for them.

// antiAffinityIndex indexes the pods with required pod anti-affinity
// terms, under one key: the pods whose terms may select a group's.
const (
	antiAffinityIndex = "gputopo-anti-affinity"
	antiAffinityKey   = "terms"
)

func indexByAntiAffinity(obj any) ([]string, error) {
	p, ok := obj.(*v1.Pod)
	if !ok || len(planner.RequiredAntiAffinity(p)) == 0 {
		return nil, nil
	}
	return []string{antiAffinityKey}, nil
}

// neighbours are the pods outside group key, each on the node it is on
// or on its way to, that required pod affinity or anti-affinity ties to
// the pods the group plans: one of their anti-affinity terms selects one
// of those pods, or one of those pods' terms selects them. Sorted by
// node and name.
func (c *Controller) neighbours(key string, pods []planner.Pod) []planner.Neighbour {
	seen := map[types.UID]bool{}
	var out []planner.Neighbour
	var ties *planner.Ties
	consider := func(p *v1.Pod) {
		if seen[p.UID] {
			return
		}
		seen[p.UID] = true
		if k, ok := groupKey(p); (ok && k == key) || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			return
		}
		node := c.neighbourNode(p)
		if node == "" {
			return
		}
		if ties == nil {
			ties = planner.NewTies(pods)
		}
		if nb := planner.NeighbourFor(p, node); ties.Tied(nb.Pod) {
			out = append(out, nb)
		}
	}
	// Pods whose own terms may select the group's.
	objs, _ := c.podIdx.ByIndex(antiAffinityIndex, antiAffinityKey)
	for _, o := range objs {
		if p, ok := o.(*v1.Pod); ok {
			consider(p)
		}
	}
	// Pods the group's terms may select.
	for _, p := range pods {
		if len(p.Members) == 0 {
			continue
		}
		for _, t := range append(slices.Clip(p.AntiAffinity), p.Affinity...) {
			if t.LabelSelector == nil {
				continue // selects no pod
			}
			sel, err := metav1.LabelSelectorAsSelector(t.LabelSelector)
			if err != nil {
				continue
			}
			for _, q := range c.podsSelected(sel, termNamespaces(t, p.Members[0].Namespace)) {
				consider(q)
			}
		}
	}
	slices.SortFunc(out, func(a, b planner.Neighbour) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Pod.Name, b.Pod.Name))
	})
	return out
}

// termNamespaces are the namespaces a term looks in, nil for all: the
// pod's own by default. The controller does not watch namespaces, so a
// namespace selector is taken as all of them (the planner does the same),
// which at worst keeps a pod further apart than needed.
func termNamespaces(t v1.PodAffinityTerm, own string) []string {
	switch {
	case t.NamespaceSelector != nil:
		return nil
	case len(t.Namespaces) > 0:
		return t.Namespaces
	default:
		return []string{own}
	}
}

// podsSelected lists the cached pods sel matches in namespaces, nil
// meaning all.
func (c *Controller) podsSelected(sel labels.Selector, namespaces []string) []*v1.Pod {
	if namespaces == nil {
		out, _ := c.pods.List(sel)
		return out
	}
	var out []*v1.Pod
	for _, ns := range namespaces {
		l, _ := c.pods.Pods(ns).List(sel)
		out = append(out, l...)
	}
	return out
}

// neighbourNode is the node a pod outside the group is on, or on its way
// to, as kube-scheduler will count it: bound, or steered by the
// controller to the node its gate opened for (usageNode); nominated (the
// scheduler weighs nominated pods in its filters); or still gated with
// its claims allocated on one node by the controller's plan. "" when
// none.
func (c *Controller) neighbourNode(p *v1.Pod) string {
	if n := usageNode(p); n != "" {
		return n
	}
	if n := p.Status.NominatedNodeName; n != "" || !hasGate(p) {
		return n
	}
	if pl, ok := c.plannedAt(p.UID); ok {
		return pl.node
	}
	claims, err := c.podClaims(p)
	if err != nil {
		return ""
	}
	for _, cl := range claims {
		if n := allocationNode(cl.Status.Allocation); n != "" {
			return n
		}
	}
	return ""
}
