package controller

import (
	"slices"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/pkg/planner"
)

// Claim shapes, as kube-scheduler treats them:
//   - A claim several pods share (resourceClaimName in each) is allocated
//     once, on one node when its devices are node-local, and every pod that
//     uses it must run where it is allocated. The pods of a group that
//     share a claim that is not allocated yet are therefore planned as one
//     unit: one node, their requests added up, the claim allocated once
//     and reserved for all of them.
//   - A claim that is already allocated (by the scheduler for another pod,
//     or for another group) is not allocated again: it holds the pod to
//     the nodes its allocation selects, as the scheduler's DRA filter does.

// unit is what the planner places as one pod.
type unit struct {
	members []*member // in rank order; members[0] names the unit
	// claims are the unit's claims that are not allocated yet, each once.
	claims []*resourceapi.ResourceClaim
	// fixed are the node selectors of the members' allocated claims.
	fixed []*v1.NodeSelector
}

func (u *unit) name() string { return u.members[0].pod.Name }

// consumers lists the unit's pods that use the claim.
func (u *unit) consumers(claim *resourceapi.ResourceClaim) []*v1.Pod {
	var out []*v1.Pod
	for _, m := range u.members {
		if slices.ContainsFunc(m.claims, func(cl *resourceapi.ResourceClaim) bool { return cl.UID == claim.UID }) {
			out = append(out, m.pod)
		}
	}
	return out
}

// planUnits joins the members that share a claim that is not allocated
// yet; ms is in rank order and so are the units.
func planUnits(ms []*member) []*unit {
	parent := make([]int, len(ms))
	for i := range parent {
		parent[i] = i
	}
	find := func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	first := map[types.UID]int{}
	for i, m := range ms {
		for _, cl := range m.claims {
			if cl.Status.Allocation != nil {
				continue
			}
			if j, ok := first[cl.UID]; ok {
				a, b := find(i), find(j)
				parent[max(a, b)] = min(a, b)
			} else {
				first[cl.UID] = i
			}
		}
	}
	byRoot := map[int]*unit{}
	var out []*unit
	for i, m := range ms {
		r := find(i)
		u := byRoot[r]
		if u == nil {
			u = &unit{}
			byRoot[r] = u
			out = append(out, u)
		}
		u.members = append(u.members, m)
		for _, cl := range m.claims {
			switch {
			case cl.Status.Allocation != nil:
				if sel := cl.Status.Allocation.NodeSelector; sel != nil {
					u.fixed = append(u.fixed, sel)
				}
			case !slices.ContainsFunc(u.claims, func(o *resourceapi.ResourceClaim) bool { return o.UID == cl.UID }):
				u.claims = append(u.claims, cl)
			}
		}
	}
	return out
}

// refusedNode is the node a pod was planned on and sent to, when it is
// being planned again without having bound there: its gate is open, it
// has no node, and gputopo.dev/node names the planned one. Whatever kept
// it off that node (kube-scheduler took its claims back because it could
// not bind there, the node failed, or the bind timed out) may be
// something the planner does not weigh, such as inter-pod affinity or a
// topology spread constraint, so the new plan leaves that node out rather
// than send the pod back to it.
func refusedNode(p *v1.Pod) string {
	if hasGate(p) || p.Spec.NodeName != "" {
		return ""
	}
	return p.Annotations[placement.AnnotationNode]
}

// pod is the planner's view of the unit: the first member's node
// constraints, held to the nodes of the allocated claims, every member's
// volumes, and every
// member's requests, pod slot, labels and required pod affinity and
// anti-affinity.
func (u *unit) pod() planner.Pod {
	p := planner.PodFor(u.members[0].pod, u.claims)
	if len(u.members) > 1 {
		sum := p.Requests.DeepCopy()
		if sum == nil {
			sum = v1.ResourceList{}
		}
		for _, m := range u.members[1:] {
			o := planner.PodFor(m.pod, nil)
			p.AntiAffinity = append(slices.Clip(p.AntiAffinity), o.AntiAffinity...)
			p.Affinity = append(slices.Clip(p.Affinity), o.Affinity...)
			p.Spread = append(slices.Clip(p.Spread), o.Spread...)
			p.PortsClash = p.PortsClash || planner.PortsConflict(o.HostPorts, p.HostPorts)
			p.HostPorts = append(slices.Clip(p.HostPorts), o.HostPorts...)
			p.Members = append(p.Members, o.Members...)
			for name, q := range o.Requests {
				v := sum[name]
				v.Add(q)
				sum[name] = v
			}
		}
		// The planner counts one pod slot for the unit; the others here.
		sum[v1.ResourcePods] = *resource.NewQuantity(int64(len(u.members)-1), resource.DecimalSI)
		p.Requests = sum
	}
	for _, sel := range u.fixed {
		p.NodeAffinity = andRequired(p.NodeAffinity, sel)
	}
	for _, m := range u.members {
		for _, sel := range m.volumes {
			if !slices.Contains(p.Volumes, sel) { // members may share a volume
				p.Volumes = append(slices.Clip(p.Volumes), sel)
			}
		}
		if node := refusedNode(m.pod); node != "" && !m.volumesPin {
			p.NodeAffinity = andRequired(p.NodeAffinity, &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{
				MatchFields: []v1.NodeSelectorRequirement{{Key: metav1.ObjectNameField, Operator: v1.NodeSelectorOpNotIn, Values: []string{node}}},
			}}})
		}
	}
	// Devices asked for as DRA extended resources are planned as the
	// claim kube-scheduler will create, and not counted against the
	// node's allocatable, which does not offer them (extended.go).
	p.Claims = append(slices.Clone(p.Claims), u.exts()...)
	for _, m := range u.members {
		if len(m.extNames) > 0 {
			p.Requests = p.Requests.DeepCopy()
			for _, name := range m.extNames {
				delete(p.Requests, name)
			}
		}
	}
	return p
}

// exts are the in-memory claims of the unit's DRA extended resources, in
// member order; the plan's allocations of a unit list them after claims.
func (u *unit) exts() []*resourceapi.ResourceClaim {
	var out []*resourceapi.ResourceClaim
	for _, m := range u.members {
		if m.ext != nil {
			out = append(out, m.ext)
		}
	}
	return out
}

// andRequired is aff with its required node selector narrowed to the
// nodes sel selects too: every pair of terms joined, since the terms of a
// selector are alternatives and the requirements of a term all apply.
func andRequired(aff *v1.NodeAffinity, sel *v1.NodeSelector) *v1.NodeAffinity {
	out := &v1.NodeAffinity{}
	if aff != nil {
		out = aff.DeepCopy()
	}
	if out.RequiredDuringSchedulingIgnoredDuringExecution == nil || len(out.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) == 0 {
		out.RequiredDuringSchedulingIgnoredDuringExecution = sel.DeepCopy()
		return out
	}
	var terms []v1.NodeSelectorTerm
	for _, a := range out.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, b := range sel.NodeSelectorTerms {
			t := *a.DeepCopy()
			t.MatchExpressions = append(t.MatchExpressions, b.MatchExpressions...)
			t.MatchFields = append(t.MatchFields, b.MatchFields...)
			terms = append(terms, t)
		}
	}
	out.RequiredDuringSchedulingIgnoredDuringExecution = &v1.NodeSelector{NodeSelectorTerms: terms}
	return out
}
