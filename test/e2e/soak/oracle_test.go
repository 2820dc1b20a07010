package soak

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	placementapi "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/topology"
)

// The oracle asks gputopo's own planner (pkg/planner, with pkg/devicefit,
// the scheduler's structured allocator) whether a group of opted-in pods
// has a place, on a tree, snapshot and job it builds from the listed
// objects the way the controller builds them from its caches
// (pkg/controller: topology.go reads each node with planner.NodeInfoFor,
// claimindex.go holds what allocated claims take, units.go joins pods
// that share a claim, sync.go's planGroup pins bound pods and keeps the
// group's domain). What it does not see is the controller's own memory:
// reservations (the controller writes on a waiting pod that it fits only
// on nodes another group reserved, and the checker allows for those) and
// backoff timers.

// group is the opted-in pods that the controller places together.
type group struct {
	key     string
	ns      string
	pods    []*corev1.Pod // not being deleted and not finished
	pending []*corev1.Pod // of them, not bound
	// size is how many pods the group has when complete; 0 when unknown.
	size int
	// incomplete says why the group cannot be judged yet, if it cannot.
	incomplete string
}

// pendingGroups returns the groups with an opted-in pod not bound, keyed
// as the controller keys them.
func pendingGroups(v *view) []*group {
	byKey := map[string]*group{}
	var order []string
	jobs := map[types.UID]*batchv1.Job{}
	for i := range v.jobs {
		jobs[v.jobs[i].UID] = &v.jobs[i]
	}
	for i := range v.pods {
		p := &v.pods[i]
		if !placementapi.OptedIn(p.Annotations) || p.DeletionTimestamp != nil || finished(p) {
			continue
		}
		k, size, incomplete := groupOf(p, jobs)
		g := byKey[k]
		if g == nil {
			g = &group{key: k, ns: p.Namespace, size: size, incomplete: incomplete}
			byKey[k] = g
			order = append(order, k)
		}
		g.pods = append(g.pods, p)
		if p.Spec.NodeName == "" {
			g.pending = append(g.pending, p)
		}
	}
	var out []*group
	for _, k := range order {
		g := byKey[k]
		if len(g.pending) == 0 {
			continue
		}
		if g.incomplete == "" && len(g.pods) < g.size {
			g.incomplete = fmt.Sprintf("%d of its %d pods exist", len(g.pods), g.size)
		}
		out = append(out, g)
	}
	return out
}

// groupOf is the pod's group key, the group's size and, when the size
// cannot be known, why.
func groupOf(p *corev1.Pod, jobs map[types.UID]*batchv1.Job) (k string, size int, incomplete string) {
	ns := p.Namespace + "/"
	if g := p.Annotations[placementapi.AnnotationGroup]; g != "" {
		n, err := strconv.Atoi(p.Annotations[placementapi.AnnotationGroupSize])
		if err != nil {
			return ns + string(placementapi.GroupKindGroup) + "/" + g, 0, "no group size"
		}
		return ns + string(placementapi.GroupKindGroup) + "/" + g, n, ""
	}
	if ref := metav1.GetControllerOf(p); ref != nil && ref.Kind == "Job" {
		k = ns + string(placementapi.GroupKindJob) + "/" + ref.Name
		j := jobs[ref.UID]
		switch {
		case j == nil:
			return k, 0, "its Job is gone"
		case j.DeletionTimestamp != nil:
			return k, 0, "its Job is being deleted"
		case j.Spec.Parallelism == nil:
			return k, 0, "its Job has no parallelism"
		}
		return k, int(*j.Spec.Parallelism), ""
	}
	return ns + string(placementapi.GroupKindPod) + "/" + p.Name, 1, ""
}

// reservedElsewhere: the controller wrote on a pod of the group that it
// fits only on nodes another group reserved.
func (g *group) reservedElsewhere() bool {
	return slices.ContainsFunc(g.pods, func(p *corev1.Pod) bool {
		return strings.Contains(p.Annotations[placementapi.AnnotationStatus], "another group reserved")
	})
}

// describe lists the group's pods with their nodes and claims.
func (g *group) describe(v *view) string {
	claims := claimsByName(v)
	var lines []string
	for _, p := range g.pods {
		node := p.Spec.NodeName
		if node == "" {
			node = "unbound"
		}
		var cls []string
		for _, name := range podClaimNames(p) {
			if cl := claims[key(p.Namespace, name)]; cl != nil && cl.Status.Allocation != nil {
				cls = append(cls, fmt.Sprintf("%s allocated %s reserved for %s", name, allocationString(cl.Status.Allocation), consumers(cl)))
			} else {
				cls = append(cls, name+" not allocated")
			}
		}
		lines = append(lines, fmt.Sprintf("    %s (%s, gated %v): %s", p.Name, node, gated(p), strings.Join(cls, "; ")))
	}
	return fmt.Sprintf("%d pods\n%s", len(g.pods), strings.Join(lines, "\n"))
}

// podClaimNames are the names of the pod's claims that exist: named ones,
// and generated ones once the pod's status names them.
func podClaimNames(p *corev1.Pod) []string {
	var out []string
	for _, pc := range p.Spec.ResourceClaims {
		if n := claimName(p, pc); n != "" {
			out = append(out, n)
		}
	}
	return out
}

func claimName(p *corev1.Pod, pc corev1.PodResourceClaim) string {
	if pc.ResourceClaimName != nil {
		return *pc.ResourceClaimName
	}
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.Name == pc.Name && s.ResourceClaimName != nil {
			return *s.ResourceClaimName
		}
	}
	return ""
}

func claimsByName(v *view) map[string]*resourcev1.ResourceClaim {
	out := make(map[string]*resourcev1.ResourceClaim, len(v.claims))
	for i := range v.claims {
		out[key(v.claims[i].Namespace, v.claims[i].Name)] = &v.claims[i]
	}
	return out
}

// answer is the oracle's answer for one group.
type answer struct {
	fits bool
	// plan is the plan it found, or why the group does not fit or could
	// not be judged.
	plan string
}

// oracle answers for the groups of one view at a time.
type oracle struct {
	planner *planner.Planner
	// per view
	view    *view
	cluster *planner.Cluster
	err     error
}

func newOracle() *oracle { return &oracle{} }

// prepare builds the tree and the planner for a view, once.
func (o *oracle) prepare(v *view) {
	if o.view == v {
		return
	}
	o.view, o.cluster, o.err = v, nil, nil
	classes := make([]*resourcev1.DeviceClass, len(v.classes))
	for i := range v.classes {
		classes[i] = &v.classes[i]
	}
	o.planner = planner.New(devicefit.NewEvaluator(devicefit.NewClasses(classes...)))
	own := map[string][]*resourcev1.ResourceSlice{}
	for i := range v.slices {
		if s := &v.slices[i]; s.Spec.NodeName != nil {
			own[*s.Spec.NodeName] = append(own[*s.Spec.NodeName], s)
		}
	}
	infos := make([]planner.NodeInfo, 0, len(v.nodes))
	for i := range v.nodes {
		n := &v.nodes[i]
		sl := own[n.Name]
		slices.SortFunc(sl, func(a, b *resourcev1.ResourceSlice) int { return cmp.Compare(a.Name, b.Name) })
		infos = append(infos, planner.NodeInfoFor(n, sl, topology.DefaultLabelMapping()))
	}
	o.cluster, o.err = planner.NewCluster(infos, nil)
}

// fits asks the planner whether the group's unbound pods have a place now,
// around its bound pods. Claims that only its unbound pods use are planned
// afresh, whatever they hold now: a pod that waits for a place must get
// one, wherever its claims were last allocated.
func (o *oracle) fits(ctx context.Context, v *view, g *group) answer {
	if g.incomplete != "" {
		return answer{plan: "not judged: " + g.incomplete}
	}
	o.prepare(v)
	if o.err != nil {
		return answer{plan: "not judged: build the tree: " + o.err.Error()}
	}
	claims := claimsByName(v)
	pendingUID := map[types.UID]bool{}
	for _, p := range g.pending {
		pendingUID[p.UID] = true
	}
	// The pending pods' claims: free ones (used by no other pod) are
	// planned without their allocation; fixed ones keep it.
	type podClaims struct {
		pod   *corev1.Pod
		free  []*resourcev1.ResourceClaim
		fixed []*corev1.NodeSelector
	}
	var members []podClaims
	freed := map[types.UID]bool{}
	for _, p := range g.pending {
		pc := podClaims{pod: p}
		for _, ref := range p.Spec.ResourceClaims {
			name := claimName(p, ref)
			cl := claims[key(p.Namespace, name)]
			if name == "" || cl == nil {
				return answer{plan: fmt.Sprintf("not judged: claim %s of pod %s does not exist yet", ref.Name, p.Name)}
			}
			if cl.Status.Allocation != nil && slices.ContainsFunc(cl.Status.ReservedFor, func(r resourcev1.ResourceClaimConsumerReference) bool { return !pendingUID[r.UID] }) {
				if sel := cl.Status.Allocation.NodeSelector; sel != nil {
					pc.fixed = append(pc.fixed, sel)
				}
				continue
			}
			free := cl.DeepCopy()
			free.Status = resourcev1.ResourceClaimStatus{}
			freed[cl.UID] = true
			pc.free = append(pc.free, free)
		}
		members = append(members, pc)
	}

	st := devicefit.NewState()
	for i := range v.claims {
		if cl := &v.claims[i]; cl.Status.Allocation != nil && !freed[cl.UID] {
			st.Add(*cl.Status.Allocation)
		}
	}
	used := planner.NodeUsage{}
	for i := range v.pods {
		if p := &v.pods[i]; p.Spec.NodeName != "" {
			used.Add(p.Spec.NodeName, p)
		}
	}
	snap := planner.NewSnapshotFromState(o.cluster, st, planner.WithUsed(used))

	req, err := placementapi.Parse(g.pending[0].Annotations)
	if err != nil {
		return answer{plan: "not judged: the placement request is invalid: " + err.Error()}
	}
	job := planner.Job{Key: g.key, Placement: req.Placement, Strategy: req.Strategy,
		PreferredDomain: req.PreferredDomain, PreferredRequired: req.PreferredRequired, Pinned: map[string]string{}}
	for _, p := range g.pods {
		if p.Spec.NodeName == "" || !o.cluster.Has(p.Spec.NodeName) {
			continue
		}
		job.Pinned[p.Name] = p.Spec.NodeName
		if d, err := placementapi.ParseDomain(p.Annotations[placementapi.AnnotationDomain]); err == nil && d.Level != placementapi.LevelNode {
			job.Domain = &d
		}
	}

	// Pods that share a free claim are one unit, as the controller plans
	// them: one node, the claim once, their requests added up.
	parent := make([]int, len(members))
	for i := range parent {
		parent[i] = i
	}
	find := func(i int) int {
		for parent[i] != i {
			i = parent[i]
		}
		return i
	}
	first := map[types.UID]int{}
	for i, m := range members {
		for _, cl := range m.free {
			if j, ok := first[cl.UID]; ok {
				a, b := find(i), find(j)
				parent[max(a, b)] = min(a, b)
			} else {
				first[cl.UID] = i
			}
		}
	}
	for i, m := range members {
		if find(i) != i {
			continue
		}
		var unit []podClaims
		for j := range members {
			if find(j) == i {
				unit = append(unit, members[j])
			}
		}
		var free []*resourcev1.ResourceClaim
		var fixed []*corev1.NodeSelector
		for _, u := range unit {
			for _, cl := range u.free {
				if !slices.ContainsFunc(free, func(o *resourcev1.ResourceClaim) bool { return o.UID == cl.UID }) {
					free = append(free, cl)
				}
			}
			fixed = append(fixed, u.fixed...)
		}
		pod := planner.PodFor(m.pod, free)
		if len(unit) > 1 {
			sum := corev1.ResourceList{}
			for _, u := range unit {
				for name, q := range planner.PodFor(u.pod, nil).Requests {
					s := sum[name]
					s.Add(q)
					sum[name] = s
				}
			}
			sum[corev1.ResourcePods] = *resource.NewQuantity(int64(len(unit)-1), resource.DecimalSI)
			pod.Requests = sum
		}
		for _, sel := range fixed {
			pod.NodeAffinity = andRequired(pod.NodeAffinity, sel)
		}
		job.Pods = append(job.Pods, pod)
	}

	plan, err := o.planner.Plan(ctx, snap, nil, job)
	var unsched *planner.Unschedulable
	switch {
	case errors.As(err, &unsched):
		return answer{plan: "no place: " + unsched.Error()}
	case err != nil:
		return answer{plan: "not judged: " + err.Error()}
	}
	var where []string
	for _, pod := range sortedKeys(plan.Assignments) {
		where = append(where, pod+" → "+plan.Assignments[pod])
	}
	return answer{fits: true, plan: fmt.Sprintf("fits in %s: %s", plan.Domain.Format(), strings.Join(where, ", "))}
}

// andRequired narrows aff's required node selector to the nodes sel
// selects too (as pkg/controller's units.go does).
func andRequired(aff *corev1.NodeAffinity, sel *corev1.NodeSelector) *corev1.NodeAffinity {
	out := &corev1.NodeAffinity{}
	if aff != nil {
		out = aff.DeepCopy()
	}
	req := out.RequiredDuringSchedulingIgnoredDuringExecution
	if req == nil || len(req.NodeSelectorTerms) == 0 {
		out.RequiredDuringSchedulingIgnoredDuringExecution = sel.DeepCopy()
		return out
	}
	var terms []corev1.NodeSelectorTerm
	for _, a := range req.NodeSelectorTerms {
		for _, b := range sel.NodeSelectorTerms {
			t := *a.DeepCopy()
			t.MatchExpressions = append(t.MatchExpressions, b.MatchExpressions...)
			t.MatchFields = append(t.MatchFields, b.MatchFields...)
			terms = append(terms, t)
		}
	}
	out.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: terms}
	return out
}
