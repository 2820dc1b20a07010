package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/pkg/planner"
)

var everything = labels.Everything()

// Event reasons.
const (
	ReasonPlaced           = "Placed"
	ReasonUnschedulable    = "Unschedulable"
	ReasonInvalidPlacement = "InvalidPlacement"
	ReasonInvalidClaim     = "InvalidClaim"
	ReasonReleased         = "Released"
	ReasonDeviceConflict   = "DeviceConflict"
	// ReasonMoved: the scheduler bound the pod to another node of its
	// domain than the planned one.
	ReasonMoved = "Moved"
	// ReasonNotBound: a pod whose gate opened is not bound after the bind
	// timeout.
	ReasonNotBound = "NotBound"
	// ReasonNodeLost: the node of a bound pod was deleted; the pod
	// garbage collector removes the pod.
	ReasonNodeLost = "NodeLost"
	// ReasonWidened: the group's domain could no longer hold it (it grew,
	// or lost a node) and it was placed in a larger domain that holds the
	// pods that keep their places.
	ReasonWidened = "Widened"
)

// member is one pod of a group with its ResourceClaims.
type member struct {
	pod    *v1.Pod
	claims []*resourceapi.ResourceClaim
	// node is where the pod is bound or where its claims are allocated.
	node string
}

// holdsOwn reports whether some claim of the pod holds an allocation the
// controller made, for any group.
func (m *member) holdsOwn() bool {
	return slices.ContainsFunc(m.claims, func(cl *resourceapi.ResourceClaim) bool { return cl.Status.Allocation != nil && ownedBy(cl, "") })
}

// allocated reports whether every claim of the pod is allocated.
func (m *member) allocated() bool {
	for _, cl := range m.claims {
		if cl.Status.Allocation == nil {
			return false
		}
	}
	return true
}

// group is one sync's view of a pod group. Every active pod is in exactly
// one of the lists.
type group struct {
	key     string
	ns      string
	size    int
	subject runtime.Object
	// gone is set when the group's workload is deleted: its remaining pods
	// are on their way out and must not be planned as a smaller group.
	gone    bool
	bound   []*member // the scheduler bound them
	steered []*member // ungated, claims allocated by the controller, not bound yet
	held    []*member // gated, claims allocated by the controller
	toPlace []*member // need a plan: gated, or released
	waiting []*member // their claims do not exist yet
	// units are toPlace as the last plan placed them (units.go).
	units []*unit
	// foreign are gated by another controller's gate besides gputopo's:
	// they are planned only once gputopo's gate is the last one, and hold
	// no devices until then.
	foreign []*member
	broken  error // a pod's claims cannot be read
	// lagging is set when the informer has not yet shown a claim the
	// controller wrote: planning on that view would undo the write.
	lagging bool
}

func (g *group) members() int {
	return len(g.bound) + len(g.steered) + len(g.held) + len(g.toPlace) + len(g.waiting) + len(g.foreign)
}

func (c *Controller) loadGroup(key string) (*group, error) {
	ns, kind, name, err := splitKey(key)
	if err != nil {
		return nil, err
	}
	objs, err := c.podIdx.ByIndex(groupIndex, key)
	if err != nil {
		return nil, err
	}
	g := &group{key: key, ns: ns}
	var all []*v1.Pod
	for _, o := range objs {
		if p := o.(*v1.Pod); active(p) {
			all = append(all, p)
		}
	}
	rankPods(all)
	for _, p := range all {
		m := &member{pod: p, node: p.Spec.NodeName}
		claims, err := c.podClaims(p)
		if p.Spec.NodeName == "" && len(foreignGates(p)) > 0 {
			m.claims = claims // only those it holds are released
			g.foreign = append(g.foreign, m)
			continue
		}
		switch {
		case errors.Is(err, errClaimsPending):
			g.waiting = append(g.waiting, m)
			continue
		case err != nil:
			g.broken = err
			g.waiting = append(g.waiting, m)
			continue
		}
		m.claims = claims
		for _, cl := range claims {
			g.lagging = g.lagging || c.index.ahead(cl.UID, cl.ResourceVersion)
		}
		ours := len(claims) > 0
		for _, cl := range claims {
			ours = ours && c.settledFor(cl, key)
			if m.node == "" {
				m.node = allocationNode(cl.Status.Allocation)
			}
		}
		switch {
		case p.Spec.NodeName != "":
			g.bound = append(g.bound, m)
		case hasGate(p) && ours:
			g.held = append(g.held, m)
		case !hasGate(p) && (ours || len(claims) == 0):
			g.steered = append(g.steered, m)
		case !hasGate(p) && m.allocated():
			// The scheduler allocated the claims itself (a pod released
			// while the scheduler raced it): it is on its way.
			g.steered = append(g.steered, m)
		default:
			g.toPlace = append(g.toPlace, m)
		}
	}
	switch kind {
	case kindJob:
		job, err := c.jobs.Jobs(ns).Get(name)
		switch {
		case apierrors.IsNotFound(err):
			g.gone = true
		case err != nil:
			return nil, err
		case job.DeletionTimestamp != nil:
			g.gone = true
		default:
			g.size, g.subject = jobSize(job), job
		}
	case kindJobSet:
		jobs, err := c.jobs.Jobs(ns).List(jobSetSelector(name))
		if err != nil {
			return nil, err
		}
		g.size = jobSetSize(jobs)
	case kindLWS:
		g.size = lwsSize(all)
	case kindGroup:
		if len(all) > 0 {
			req, _ := placement.Parse(all[0].Annotations)
			g.size = req.GroupSize
		}
	default:
		g.size = 1
	}
	if g.subject == nil && len(all) > 0 {
		g.subject = all[0]
	}
	return g, nil
}

// result says what the worker does with the key after a sync.
type result int

const (
	done    result = iota // forget the key's backoff
	backoff               // try again later, backing off per group
)

func (c *Controller) sync(ctx context.Context, key string) (result, error) {
	start := time.Now() // a plan's duration includes reading the group
	g, err := c.loadGroup(key)
	if err != nil {
		return done, err
	}
	if g.gone || g.members() == 0 {
		c.forgetGroup(key)
		return done, nil
	}
	if g.lagging {
		// The claim's event requeues the group.
		klog.FromContext(ctx).V(4).Info("Waiting for the informer to show the controller's own claim writes")
		return done, nil
	}
	first := g.anyPod()
	req, err := placement.Parse(first.Annotations)
	if err != nil {
		c.refuse(ctx, g, OutcomeInvalid, ReasonInvalidPlacement, err.Error())
		return done, nil
	}
	if g.broken != nil {
		c.refuse(ctx, g, OutcomeInvalid, ReasonInvalidClaim, g.broken.Error())
		return backoff, nil
	}

	// Claims that share a device with another claim, or pods that can no
	// longer bind where their claims are, are taken back first.
	if err := c.resolveConflicts(ctx, g); err != nil {
		return done, err
	}
	if err := c.recover(ctx, g); err != nil {
		return done, err
	}
	if err := c.releaseForeign(ctx, g); err != nil {
		return done, err
	}

	if len(g.toPlace) == 0 {
		if len(g.foreign) > 0 {
			return done, c.setStatus(ctx, g.pods(g.foreign), placement.StatusWaitingForGates, g.foreignMessage())
		}
		if len(g.waiting) > 0 {
			return done, c.setStatus(ctx, g.gatedWaiting(), placement.StatusWaitingForPods, "waiting for the pods' ResourceClaims to be created")
		}
		return done, c.release(ctx, g)
	}

	// A group none of whose pods runs yet is planned as a whole. Claims an
	// interrupted earlier attempt allocated are taken back first, so the
	// plan is all or nothing.
	fresh := len(g.bound) == 0 && len(g.steered) == 0
	if fresh {
		if len(g.foreign) > 0 {
			c.cfg.Metrics.Decisions.WithLabelValues(OutcomeWaiting).Inc()
			return done, c.setStatus(ctx, append(g.pods(g.foreign), append(g.pods(g.toPlace), g.pods(g.held)...)...), placement.StatusWaitingForGates, g.foreignMessage())
		}
		if g.members() < g.size || len(g.waiting) > 0 {
			c.cfg.Metrics.Decisions.WithLabelValues(OutcomeWaiting).Inc()
			msg := fmt.Sprintf("waiting for all %d pods of the group and their ResourceClaims to exist", g.size)
			return done, c.setStatus(ctx, append(g.pods(g.toPlace), g.pods(g.held)...), placement.StatusWaitingForPods, msg)
		}
		for _, m := range g.held {
			if err := c.releaseMember(ctx, m); err != nil {
				return done, err
			}
		}
		// Claims the controller allocated for these pods under another
		// group (the pods were orphaned by their Job, or their group
		// annotation changed) are taken back too.
		for _, m := range g.toPlace {
			if m.holdsOwn() {
				if err := c.releaseMember(ctx, m); err != nil {
					return done, err
				}
			}
		}
		g.toPlace = append(g.held, g.toPlace...)
		g.held = nil
		rankMembers(g.toPlace)
	}

	plan, treeTime, err := c.planGroup(ctx, g, req)
	var unsched *planner.Unschedulable
	if errors.As(err, &unsched) && !fresh && len(g.held) > 0 {
		// The group's domain cannot hold its new pods around those that
		// keep their places: the pods that have not started move with
		// them, and the group is planned again.
		moved, err := c.unpinHeld(ctx, g)
		if err != nil {
			return done, err
		}
		if moved {
			var again time.Duration
			plan, again, err = c.planGroup(ctx, g, req)
			treeTime += again
		}
	}
	c.cfg.Metrics.PlanDuration.WithLabelValues(PodsBucket(max(g.size, g.members()))).Observe((time.Since(start) - treeTime).Seconds())
	var broken *planner.BrokenClaimError
	var invalid *planner.InvalidJobError
	switch {
	case errors.As(err, &unsched):
		c.setPending(key, true, waiting{created: g.created(), priority: g.priority()})
		c.refuse(ctx, g, OutcomeUnschedulable, ReasonUnschedulable, unsched.Error())
		return backoff, nil
	case errors.As(err, &broken), errors.As(err, &invalid):
		c.refuse(ctx, g, OutcomeInvalid, ReasonInvalidClaim, err.Error())
		return backoff, nil
	case err != nil:
		return done, err
	}
	if err := c.allocate(ctx, g, plan); err != nil {
		return done, err
	}
	for _, m := range g.toPlace {
		if !hasGate(m.pod) && m.pod.Annotations[placement.AnnotationNode] != "" {
			if err := c.noteReplanned(ctx, m, plan.Assignments[m.pod.Name], plan.Domain.Format()); err != nil {
				return done, err
			}
		}
	}
	if plan.Widened {
		c.recorder.Eventf(g.subject, v1.EventTypeNormal, ReasonWidened, "the group's domain could no longer hold it: %d pods placed in %s, which holds the pods that keep their places", len(plan.Assignments), plan.Domain)
	}
	klog.FromContext(ctx).Info("Allocated the claims of the pod group", "domain", plan.Domain.String(), "pods", len(plan.Assignments), "fallback", plan.Fallback, "widened", plan.Widened)
	c.setPending(key, false, waiting{})
	c.cfg.Metrics.Decisions.WithLabelValues(OutcomePlaced).Inc()
	msg := fmt.Sprintf("placed %d pods in %s", len(plan.Assignments), plan.Domain)
	if len(plan.Reasons) > 0 {
		msg += ": " + strings.Join(plan.Reasons, "; ")
	}
	c.recorder.Event(g.subject, v1.EventTypeNormal, ReasonPlaced, truncate(msg))
	// The gates open once the informer shows the allocations and a short
	// settle time has let allocations the scheduler had in flight arrive.
	c.mu.Lock()
	c.settle[key] = time.Now().Add(c.cfg.SettleDelay)
	c.mu.Unlock()
	c.releaseAfter(key, c.cfg.SettleDelay)
	return done, nil
}

// planGroup plans the group's pods that need a place on the tree and
// snapshot as they are now. It also returns how long bringing the tree up
// to date took, which is not the plan's time.
func (c *Controller) planGroup(ctx context.Context, g *group, req placement.Request) (*planner.Plan, time.Duration, error) {
	job := planner.Job{
		Key:               g.key,
		Placement:         planner.Placement(req.Placement),
		Strategy:          planner.Strategy(req.Strategy),
		PreferredDomain:   req.PreferredDomain,
		PreferredRequired: req.PreferredRequired,
		Pinned:            map[string]string{},
	}
	for _, m := range append(append(g.bound, g.steered...), g.held...) {
		// A node domain is where a one-pod plan put its pod, not a domain
		// the group must keep: a group that grows is held to the domain of
		// its pinned pods, widened as its placement allows.
		if d, err := placement.ParseDomain(m.pod.Annotations[placement.AnnotationDomain]); err == nil && d.Level != placement.LevelNode {
			job.Domain = &d
		}
		if m.node != "" {
			job.Pinned[m.pod.Name] = m.node
		}
	}
	units := planUnits(g.toPlace)
	for _, u := range units {
		job.Pods = append(job.Pods, u.pod())
	}
	_, treeTime, err := c.updateTree()
	if err != nil {
		return nil, 0, err
	}
	c.mu.Lock()
	// The newest tree: one patched since updateTree returned is as good,
	// and the snapshot tracker follows the newest.
	snap := c.planSnapshot(c.cluster)
	c.mu.Unlock()
	reserved := c.reservation(ctx)
	for pod, node := range job.Pinned {
		if !snap.Cluster().Has(node) {
			delete(job.Pinned, pod) // its node is gone; recover() deals with the pod
		}
	}
	fresh := len(g.bound) == 0 && len(g.steered) == 0
	view := snap
	held := reserved != nil && reserved.key != g.key && fresh
	if held {
		// The reserved nodes wait for the group that reserved them.
		view = snap.Holding(reserved.hold.Nodes)
	}
	plan, err := c.planner.Plan(ctx, view, nil, job)
	var unsched *planner.Unschedulable
	if errors.As(err, &unsched) && held {
		// Say so when the reservation is what keeps the group waiting.
		if _, free := c.planner.Plan(ctx, snap, nil, job); free == nil {
			unsched.Reason = fmt.Sprintf("it fits only on nodes another group reserved: %s", reserved)
			unsched.Best, unsched.Details = "", nil
		}
	}
	if errors.As(err, &unsched) && fresh {
		c.maybeReserve(ctx, g, snap, job)
		if r := c.reservation(ctx); r != nil && r.key == g.key {
			unsched.Reason += "; " + r.String()
		}
	}
	var broken *planner.BrokenClaimError
	var invalid *planner.InvalidJobError
	if err != nil && !errors.As(err, &unsched) && !errors.As(err, &broken) && !errors.As(err, &invalid) {
		err = fmt.Errorf("plan group %s: %w", g.key, err)
	}
	if plan != nil {
		// Every member of a unit goes where the unit goes.
		plan.Assignments = maps.Clone(plan.Assignments)
		for _, u := range units {
			for _, m := range u.members[1:] {
				plan.Assignments[m.pod.Name] = plan.Assignments[u.name()]
			}
		}
		g.units = units
	}
	return plan, treeTime, err
}

// allocate writes the plan into the claims, all or nothing: when one
// write fails, the claims written so far are released again. A claim
// shared by several pods of a unit is written once, reserved for all.
func (c *Controller) allocate(ctx context.Context, g *group, plan *planner.Plan) error {
	domain := plan.Domain.Format()
	var written []*resourceapi.ResourceClaim
	undo := func(cause error) error {
		for _, cl := range written {
			if _, err := c.releaseClaim(ctx, cl); err != nil {
				klog.FromContext(ctx).Error(err, "Releasing a claim of an abandoned plan failed; the next sync retries", "claim", klog.KObj(cl))
			}
		}
		return cause
	}
	for _, u := range g.units {
		results := plan.Allocations[u.name()]
		if len(results) != len(u.claims) {
			return undo(fmt.Errorf("plan for pod %s has %d allocations for %d claims", u.name(), len(results), len(u.claims)))
		}
		for i, claim := range u.claims {
			stored, err := c.writeAllocation(ctx, u.consumers(claim), claim, g.key, domain, results[i])
			if err != nil {
				return undo(err)
			}
			written = append(written, stored)
		}
	}
	return nil
}

// release opens the gates of held pods once their allocations are
// settled: the informer shows them and no other claim holds their devices.
func (c *Controller) release(ctx context.Context, g *group) error {
	if len(g.held) == 0 {
		c.setPending(g.key, false, waiting{})
		return nil
	}
	c.mu.Lock()
	wait := time.Until(c.settle[g.key])
	c.mu.Unlock()
	if wait > 0 {
		c.releaseAfter(g.key, wait)
		return nil
	}
	for _, m := range g.held {
		for _, cl := range m.claims {
			if !c.index.seen(cl.UID, cl.ResourceVersion) {
				// The claim's event requeues the group.
				klog.FromContext(ctx).V(4).Info("Gates stay closed until the index shows the claim", "claim", klog.KObj(cl))
				return nil
			}
		}
	}
	req := c.groupRequirement(ctx, g)
	for _, m := range g.held {
		if err := c.ungate(ctx, m, req); err != nil {
			return err
		}
	}
	c.mu.Lock()
	delete(c.settle, g.key)
	c.mu.Unlock()
	c.queue.AddAfter(g.key, c.cfg.BindTimeout+time.Second)
	return nil
}

// refuse records why the group waits: an event, an annotation on every
// pod that still waits, a metric.
func (c *Controller) refuse(ctx context.Context, g *group, outcome, reason, msg string) {
	c.cfg.Metrics.Decisions.WithLabelValues(outcome).Inc()
	c.recorder.Event(g.subject, v1.EventTypeWarning, reason, truncate(msg))
	if err := c.setStatus(ctx, append(g.pods(g.toPlace), g.gatedWaiting()...), reason, msg); err != nil {
		klog.FromContext(ctx).Error(err, "Recording why the group waits failed")
	}
}

// created is when the group's Job (or first pod) was created.
func (g *group) created() time.Time {
	if m, err := meta.Accessor(g.subject); err == nil {
		return m.GetCreationTimestamp().Time
	}
	return time.Time{}
}

// lists are the group's member lists, those that still wait first.
func (g *group) lists() [][]*member {
	return [][]*member{g.toPlace, g.held, g.waiting, g.foreign, g.steered, g.bound}
}

// priority is the highest pod priority of the group, as the priority
// admission plugin resolved it from the pods' PriorityClass.
func (g *group) priority() int32 {
	var p int32
	first := true
	for _, l := range g.lists() {
		for _, m := range l {
			if v := ptr.Deref(m.pod.Spec.Priority, 0); first || v > p {
				p, first = v, false
			}
		}
	}
	return p
}

func (g *group) anyPod() *v1.Pod {
	for _, l := range g.lists() {
		if len(l) > 0 {
			return l[0].pod
		}
	}
	return nil
}

func (g *group) pods(ms []*member) []*v1.Pod {
	out := make([]*v1.Pod, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.pod)
	}
	return out
}

func (g *group) gatedWaiting() []*v1.Pod {
	var out []*v1.Pod
	for _, m := range g.waiting {
		if hasGate(m.pod) {
			out = append(out, m.pod)
		}
	}
	return out
}

func rankMembers(ms []*member) {
	pods := make([]*v1.Pod, len(ms))
	byPod := make(map[*v1.Pod]*member, len(ms))
	for i, m := range ms {
		pods[i], byPod[m.pod] = m.pod, m
	}
	rankPods(pods)
	for i, p := range pods {
		ms[i] = byPod[p]
	}
}

// truncate keeps messages within what an annotation or event should carry.
func truncate(s string) string {
	const limit = 1000
	if len(s) > limit {
		return s[:limit-3] + "..."
	}
	return s
}
