package controller

import (
	"context"
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
)

// The scheduler may take a steered pod's allocation back by itself: when
// the pod fits nowhere (its node was deleted, or got a taint it does not
// tolerate), the DynamicResources plugin's PostFilter clears the
// allocation of a claim reserved only for that pod and allocates it anew,
// anywhere the claim fits. So the gate opens only together with a required
// node affinity to the plan's domain (allowed while a pod is gated): a pod
// the scheduler moves stays in its leaf or spine.

// groupRequirement is the node requirement that keeps the group's pods in
// their domain, nil when there is none to keep: a one-pod group may go
// anywhere its claims fit. Pods of a node domain are held to the node's
// leaf, so a lost node does not strand them.
func (c *Controller) groupRequirement(ctx context.Context, g *group) *v1.NodeSelectorRequirement {
	if g.size <= 1 || len(g.held) == 0 {
		return nil
	}
	domain := memberDomain(g.held[0])
	req, err := c.domainRequirement(domain)
	if err != nil {
		// The claims still hold each pod to its node; only a move by the
		// scheduler could leave the domain.
		klog.FromContext(ctx).Info("Pod group not held to its domain by node affinity", "group", g.key, "domain", domain, "reason", err)
	}
	return req
}

// memberDomain is the domain the controller wrote on the pod's claims.
func memberDomain(m *member) string {
	for _, cl := range m.claims {
		if d := cl.Annotations[placement.AnnotationDomain]; d != "" {
			return d
		}
	}
	return m.domain
}

// domainRequirement is "kubernetes.io/hostname In <the domain's nodes>",
// from the nodes' own hostname labels; nil for the whole cluster. An error
// when the domain is unknown or a node has no hostname label.
func (c *Controller) domainRequirement(domain string) (*v1.NodeSelectorRequirement, error) {
	if domain == "" {
		return nil, nil
	}
	d, err := placement.ParseDomain(domain)
	if err != nil {
		return nil, err
	}
	cl, err := c.snapshotCluster()
	if err != nil {
		return nil, err
	}
	if d.Level == placement.LevelNode {
		leaf, err := cl.LeafOf(d.Names[0])
		if err != nil || leaf == "" {
			return nil, err
		}
		d = placement.Domain{Level: placement.LevelLeaf, Names: []string{leaf}}
	}
	names, err := cl.DomainNodes(d)
	if err != nil || names == nil {
		return nil, err
	}
	hosts := make([]string, 0, len(names))
	for _, name := range names {
		n, err := c.nodes.Get(name)
		if err != nil {
			return nil, fmt.Errorf("node %s of domain %s: %w", name, domain, err)
		}
		h := n.Labels[v1.LabelHostname]
		if h == "" {
			return nil, fmt.Errorf("node %s of domain %s has no %s label", name, domain, v1.LabelHostname)
		}
		hosts = append(hosts, h)
	}
	return &v1.NodeSelectorRequirement{Key: v1.LabelHostname, Operator: v1.NodeSelectorOpIn, Values: hosts}, nil
}

// narrowedAffinity is the pod's required node affinity with req added:
// one term of req when the pod has none, else req added to every term, the
// only change the API server accepts on a gated pod. Nil when every term
// already has req.
func narrowedAffinity(p *v1.Pod, req v1.NodeSelectorRequirement) *v1.NodeSelector {
	var terms []v1.NodeSelectorTerm
	if a := p.Spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		terms = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	}
	if len(terms) == 0 {
		return &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchExpressions: []v1.NodeSelectorRequirement{req}}}}
	}
	changed := false
	out := make([]v1.NodeSelectorTerm, len(terms))
	for i, t := range terms {
		t = *t.DeepCopy()
		if !slices.ContainsFunc(t.MatchExpressions, func(r v1.NodeSelectorRequirement) bool {
			return r.Key == req.Key && r.Operator == req.Operator && slices.Equal(r.Values, req.Values)
		}) {
			t.MatchExpressions = append(t.MatchExpressions, req)
			changed = true
		}
		out[i] = t
	}
	if !changed {
		return nil
	}
	return &v1.NodeSelector{NodeSelectorTerms: out}
}
