package controller

import (
	"context"
	"fmt"
	"slices"
	"time"

	v1 "k8s.io/api/core/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/planner"
)

// Kubernetes 1.37 workload-aware scheduling. A pod may name a PodGroup
// (scheduling.k8s.io) in spec.schedulingGroup; the Job controller creates
// one per Job with spec.scheduling (gate WorkloadWithJob) and sets the
// field on every pod it creates. kube-scheduler's pod-group cycle then
// places the group all or nothing once gang minCount pods are queued
// (GangScheduling, PodGroupPodsCount), within one value of the PodGroup's
// first topology key (TopologyPlacementGenerator, gate
// TopologyAwareWorkloadScheduling).
//
// gputopo takes such a PodGroup as part of its group: the gang's minCount
// sizes a group that has no other size, and the topology keys bound the
// domain (planner.Job.TopologyKeys), so no plan is one the scheduler
// would refuse. spec.schedulingGroup is immutable, so gputopo cannot put
// a pod created without one into a PodGroup.
//
// Allocation modes: with the controller allocating, the plan is written
// into the claims as today; with the scheduler allocating, the plan only
// chooses the domain (and checks with the allocator that the group fits
// there), the gates open with node affinity to it, and kube-scheduler
// allocates the devices in its own pod-group cycle, all or nothing when
// the group has a gang PodGroup.

// AllocationMode says who writes the devices of a placed group into its
// ResourceClaims.
type AllocationMode string

const (
	// AllocationAuto: the scheduler for groups with a gang PodGroup where
	// the API server serves PodGroups, the controller for the others.
	AllocationAuto AllocationMode = "auto"
	// AllocationController: the controller, for every group.
	AllocationController AllocationMode = "controller"
	// AllocationScheduler: the scheduler, for every group; all or nothing
	// only for groups with a gang PodGroup.
	AllocationScheduler AllocationMode = "scheduler"
)

// AllocationModes lists the modes in documentation order.
var AllocationModes = []AllocationMode{AllocationAuto, AllocationController, AllocationScheduler}

// podGroupResource is what discovery must list for PodGroups to be read.
const podGroupResource = "podgroups"

// servesPodGroups asks the API server whether it serves PodGroups at
// scheduling.k8s.io/v1beta1, the version kube-scheduler and the Job
// controller of 1.37 use.
func servesPodGroups(d discovery.DiscoveryInterface) bool {
	if d == nil {
		return false
	}
	list, err := d.ServerResourcesForGroupVersion(schedulingv1beta1.SchemeGroupVersion.String())
	if err != nil || list == nil {
		return false
	}
	return slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == podGroupResource })
}

// schedulerAllocates decides who allocates a group's devices: the
// scheduler in mode scheduler, and in mode auto where the group has a
// gang PodGroup (its all or nothing is the scheduler's then); the
// controller otherwise.
func schedulerAllocates(mode AllocationMode, pg *schedulingv1beta1.PodGroup) bool {
	switch mode {
	case AllocationScheduler:
		return true
	case AllocationController:
		return false
	}
	return pg != nil && pg.Spec.SchedulingPolicy.Gang != nil
}

// podGroupName is the PodGroup the pod names, or "".
func podGroupName(p *v1.Pod) string {
	if sg := p.Spec.SchedulingGroup; sg != nil && sg.PodGroupName != nil {
		return *sg.PodGroupName
	}
	return ""
}

// gangSize is the PodGroup's gang minCount, 0 without a gang.
func gangSize(pg *schedulingv1beta1.PodGroup) int {
	if pg == nil || pg.Spec.SchedulingPolicy.Gang == nil {
		return 0
	}
	return int(pg.Spec.SchedulingPolicy.Gang.MinCount)
}

// topologyKeys are the node-label keys the PodGroup's pods must share a
// value of. kube-scheduler 1.37 honours only the first; gputopo keeps
// them all, which can only be stricter.
func topologyKeys(pg *schedulingv1beta1.PodGroup) []string {
	if pg == nil || pg.Spec.SchedulingConstraints == nil {
		return nil
	}
	var keys []string
	for _, t := range pg.Spec.SchedulingConstraints.Topology {
		if t.Key != "" && !slices.Contains(keys, t.Key) {
			keys = append(keys, t.Key)
		}
	}
	return keys
}

// podGroupIndex indexes opted-in pods by the PodGroup they name,
// "<namespace>/<PodGroup>", so a PodGroup event syncs their group.
const podGroupIndex = "gputopo-podgroup"

func indexByPodGroup(obj any) ([]string, error) {
	p, ok := obj.(*v1.Pod)
	if !ok {
		return nil, nil
	}
	if _, in := groupKey(p); !in {
		return nil, nil
	}
	if name := podGroupName(p); name != "" {
		return []string{p.Namespace + "/" + name}, nil
	}
	return nil, nil
}

// onPodGroup syncs the groups of the pods that name the PodGroup: it may
// have just appeared, or its gang size or constraint changed.
func (c *Controller) onPodGroup(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	pg, ok := obj.(*schedulingv1beta1.PodGroup)
	if !ok {
		return
	}
	objs, err := c.podIdx.ByIndex(podGroupIndex, pg.Namespace+"/"+pg.Name)
	if err != nil {
		return
	}
	for _, o := range objs {
		c.onPod(o)
	}
}

// podGroupOf returns the group's PodGroup: the one its pods name, and
// whether it exists. Pods that name different PodGroups are an error.
func (c *Controller) podGroupOf(ns string, pods []*v1.Pod) (name string, pg *schedulingv1beta1.PodGroup, err error) {
	for _, p := range pods {
		n := podGroupName(p)
		switch {
		case n == "":
		case name == "":
			name = n
		case n != name:
			return name, nil, fmt.Errorf("the group's pods name two PodGroups, %s and %s, in spec.schedulingGroup; kube-scheduler places each PodGroup on its own, so gputopo cannot place them as one group: give them one PodGroup, or put them in different gputopo groups", name, n)
		}
	}
	if name == "" || c.podGroups == nil {
		return name, nil, nil
	}
	pg, err = c.podGroups.PodGroups(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return name, nil, nil // not created yet: the group waits for it
	}
	return name, pg, err
}

// addSchedulerAllocated sorts a member of a group whose devices the
// scheduler allocates: bound; on its way (gate open: the scheduler has
// it); held (gated, planned by this process); or to place. Claims the
// controller allocated earlier (another mode, an orphaned group) are taken
// back when the group is planned as a whole.
func (g *group) addSchedulerAllocated(m *member, c *Controller) {
	p := m.pod
	switch {
	case p.Spec.NodeName != "":
		g.bound = append(g.bound, m)
	case !hasGate(p):
		g.steered = append(g.steered, m)
	default:
		pl, ok := c.plannedAt(p.UID)
		if ok && !m.holdsOwn() {
			m.node, m.domain = pl.node, pl.domain
			g.held = append(g.held, m)
			return
		}
		g.toPlace = append(g.toPlace, m)
	}
}

// steer records where a group whose devices the scheduler allocates was
// planned: only its domain is kept (the scheduler picks each pod's node
// within it), until the gates open with node affinity to that domain.
func (c *Controller) steer(ctx context.Context, g *group, plan *planner.Plan) {
	domain := plan.Domain.Format()
	for _, u := range g.units {
		for _, m := range u.members {
			c.notePlanned(m.pod.UID, plannedPod{domain: domain})
		}
	}
	// The plan's devices stay taken for other groups' plans until the
	// scheduler has bound the pods (trackInflight), beside those held for
	// the followers of an exclusive JobSet's leaders (leaders.go).
	hold := plan.Reservation()
	if prev, ok := c.inflight.Get(g.key); ok && g.heldFollowers {
		hold = hold.With(prev)
	}
	if err := c.inflight.Add(hold); err != nil {
		klog.FromContext(ctx).V(2).Info("The steered group's devices are held by another steered group", "group", g.key, "err", err)
	}
	c.mu.Lock()
	c.inflightAt[g.key] = time.Now()
	c.mu.Unlock()
}

// trackInflight ends the hold steer took for a group: once none of its
// pods waits for the scheduler (all bound, or gone), or when they have
// waited longer than the bind timeout, after which the scheduler's own
// view decides. It ends the hold holdFollowers took the same way: once
// the followers exist and are planned, or after the bind timeout. Groups
// waiting for room are planned again then: until the pods bound, the
// hold counted the planned devices beside those the scheduler allocated,
// which may differ, and a group may have been refused for room that is
// free now.
func (c *Controller) trackInflight(g *group) {
	c.mu.Lock()
	at, ok := c.inflightAt[g.key]
	c.mu.Unlock()
	if !ok {
		return
	}
	waiting := !g.gone && ((g.schedAlloc && len(g.steered)+len(g.held) > 0) ||
		(g.exclusive && len(g.due)+len(g.toPlace)+len(g.waiting) > 0))
	if waiting && time.Since(at) <= c.cfg.BindTimeout {
		return
	}
	c.inflight.Remove(g.key)
	c.mu.Lock()
	delete(c.inflightAt, g.key)
	c.mu.Unlock()
	c.requeuePending()
}
