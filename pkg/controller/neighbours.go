package controller

import (
	"cmp"
	"maps"
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
	// hostPortIndex indexes the pods that hold host ports, under one key.
	hostPortIndex = "gputopo-host-ports"
	hostPortKey   = "ports"
)

func indexByHostPorts(obj any) ([]string, error) {
	p, ok := obj.(*v1.Pod)
	if !ok || len(planner.RequiredHostPorts(p)) == 0 {
		return nil, nil
	}
	return []string{hostPortKey}, nil
}

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
		if k, ok := groupKey(p); (ok && k == key) || finished(p) {
			return
		}
		node := c.neighbourNode(p)
		if node == "" {
			return
		}
		if ties == nil {
			ties = planner.NewTies(pods)
		}
		nb := planner.NeighbourFor(p, node)
		if nb.Pod = c.inNamespace(nb.Pod); ties.Tied(nb.Pod) {
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
			namespaces, all := c.termNamespaces(t, p.Members[0].Namespace)
			for _, q := range c.podsSelected(sel, namespaces, all) {
				consider(q)
			}
		}
	}
	sortNeighbours(out)
	return out
}

// sortNeighbours sorts pods outside a group by node and name, so that
// plans do not depend on the cache's order.
func sortNeighbours(out []planner.Neighbour) {
	slices.SortFunc(out, func(a, b planner.Neighbour) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Pod.Name, b.Pod.Name))
	})
}

// termNamespaces are the namespaces a term looks in, as kube-scheduler
// reads them: those it names and those whose labels its namespace
// selector matches, all of them for an empty selector; the pod's own
// where it has neither.
func (c *Controller) termNamespaces(t v1.PodAffinityTerm, own string) (namespaces []string, all bool) {
	if t.NamespaceSelector == nil {
		if len(t.Namespaces) == 0 {
			return []string{own}, false
		}
		return t.Namespaces, false
	}
	sel, err := metav1.LabelSelectorAsSelector(t.NamespaceSelector)
	if err != nil {
		return t.Namespaces, false // the API server admits no such term
	}
	if sel.Empty() {
		return nil, true
	}
	namespaces = slices.Clone(t.Namespaces)
	matched, _ := c.namespaces.List(sel)
	for _, ns := range matched {
		if !slices.Contains(namespaces, ns.Name) {
			namespaces = append(namespaces, ns.Name)
		}
	}
	return namespaces, false
}

// podsSelected lists the cached pods sel matches in namespaces, or in
// all of them.
func (c *Controller) podsSelected(sel labels.Selector, namespaces []string, all bool) []*v1.Pod {
	if all {
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

// inNamespace gives p's members the labels of their namespaces, which a
// term's namespace selector matches. It changes p's Members in place.
func (c *Controller) inNamespace(p planner.Pod) planner.Pod {
	for i := range p.Members {
		if ns, err := c.namespaces.Get(p.Members[i].Namespace); err == nil {
			p.Members[i].NamespaceLabels = ns.Labels
		}
	}
	return p
}

// onNamespaceUpdate requeues the waiting groups when a namespace's labels
// change: a namespace selector may now select pods in it, or no longer.
func (c *Controller) onNamespaceUpdate(old, cur any) {
	o, ok1 := old.(*v1.Namespace)
	n, ok2 := cur.(*v1.Namespace)
	if ok1 && ok2 && !maps.Equal(o.Labels, n.Labels) {
		c.requeuePending()
	}
}

// spreadPods are the pods outside group key that the topology spread
// constraints of the group's pods count, as kube-scheduler's
// PodTopologySpread filter counts them: in the pod's namespace, selected
// by the constraint's selector with its matchLabelKeys merged, neither
// terminating nor finished; each on the node it is on or on its way to.
// Sorted by node and name.
func (c *Controller) spreadPods(key string, pods []planner.Pod) []planner.Neighbour {
	seen := map[types.UID]bool{}
	var out []planner.Neighbour
	for _, p := range pods {
		if len(p.Members) == 0 {
			continue
		}
		for _, t := range p.Spread {
			sel, err := planner.SpreadSelector(t, p.Members[0].Labels)
			if err != nil || sel.Empty() || t.WhenUnsatisfiable != v1.DoNotSchedule {
				continue
			}
			l, _ := c.pods.Pods(p.Members[0].Namespace).List(sel)
			for _, q := range l {
				if seen[q.UID] {
					continue
				}
				seen[q.UID] = true
				if k, ok := groupKey(q); (ok && k == key) || !active(q) {
					continue
				}
				if node := c.neighbourNode(q); node != "" {
					out = append(out, planner.NeighbourFor(q, node))
				}
			}
		}
	}
	sortNeighbours(out)
	return out
}

// hostPortPods are the pods outside group key that hold a host port a pod
// of the group asks for, each on the node it is on or on its way to, as
// kube-scheduler's NodePorts filter counts them: every pod on the node
// that has not finished, a terminating one too. Sorted by node and name.
func (c *Controller) hostPortPods(key string, pods []planner.Pod) []planner.Neighbour {
	var want []v1.ContainerPort
	for _, p := range pods {
		want = append(want, p.HostPorts...)
	}
	if len(want) == 0 {
		return nil
	}
	objs, _ := c.podIdx.ByIndex(hostPortIndex, hostPortKey)
	var out []planner.Neighbour
	for _, o := range objs {
		q, ok := o.(*v1.Pod)
		if !ok || finished(q) {
			continue
		}
		// A terminating pod of the group still holds its ports; the
		// group's plan does not count it as one of its own.
		if k, ok := groupKey(q); ok && k == key && q.DeletionTimestamp == nil {
			continue
		}
		node := c.neighbourNode(q)
		if node == "" {
			continue
		}
		if nb := planner.NeighbourFor(q, node); planner.PortsConflict(want, nb.Pod.HostPorts) {
			out = append(out, nb)
		}
	}
	sortNeighbours(out)
	return out
}

// neighbourNode is the node a pod outside the group is on, or on its way
// to, as kube-scheduler will count it: bound, or steered by the
// controller to the node its gate opened for (usageNode); nominated (the
// scheduler weighs nominated pods in its filters); or still gated with
// its claims allocated on one node by the controller's plan, written or
// its write in flight. "" when none.
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
		// A plan's write still in flight.
		if n := c.index.assumedNode(cl.UID); n != "" {
			return n
		}
	}
	return ""
}
