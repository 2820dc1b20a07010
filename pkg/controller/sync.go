package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime/trace"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/structured"
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
	// ext is the claim kube-scheduler will create for the pod's DRA
	// extended resources (extNames), which only the planner sees; domain
	// is where the pod was planned when no claim of its records it.
	ext      *resourceapi.ResourceClaim
	extNames []v1.ResourceName
	domain   string
	// volumes are the node selectors the pod's PersistentVolumeClaims hold
	// it to, or volumeWait why no node can take it now (volumes.go); read
	// for pods still to be placed.
	volumes    []*v1.NodeSelector
	volumeWait string
	// volumesPin: its volumes allow only the node that refused it
	// (refusedNode), as a claim bound there while kube-scheduler bound the
	// pod does: no other node can take it, so that node is not left out.
	volumesPin bool
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
	// podGroupName is the kube-scheduler PodGroup the pods name, podGroup
	// that object (nil while it does not exist), pgErr why the group's
	// PodGroups cannot be used (native.go).
	podGroupName string
	podGroup     *schedulingv1beta1.PodGroup
	pgErr        error
	// schedAlloc: kube-scheduler allocates the group's devices; the
	// controller chooses the domain and steers the pods there.
	schedAlloc bool
	// pgMissing: the pods name a PodGroup the API server serves but that
	// does not exist (yet).
	pgMissing bool
	// exclusive: a JobSet with JobSet's exclusive placement, whose Jobs'
	// pods but the first are created once that one is scheduled; due
	// are those pods not created yet (leaders.go).
	exclusive bool
	due       []followersDue
	// heldFollowers: this sync's plan holds the followers' devices.
	heldFollowers bool
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
	g.podGroupName, g.podGroup, g.pgErr = c.podGroupOf(ns, all)
	if g.pgErr == nil && g.podGroup != nil && g.podGroup.DeletionTimestamp != nil {
		g.podGroup = nil
	}
	g.schedAlloc = schedulerAllocates(c.cfg.AllocationMode, g.podGroup)
	g.pgMissing = g.podGroupName != "" && g.podGroup == nil && c.podGroups != nil
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
			ahead, writer := c.index.ahead(cl.UID, cl.ResourceVersion)
			if writer != "" && writer != key {
				c.waitFor(writer, key)
			}
			if ahead && !c.lagBehind(key, cl) {
				c.queue.Add(key) // the informer caught up since the read
			}
			g.lagging = g.lagging || ahead
		}
		m.ext, m.extNames = extendedClaim(p, c.extClasses)
		if p.Spec.NodeName == "" {
			m.volumes, m.volumeWait = c.volumes.nodes(p)
			if node := refusedNode(p); node != "" && len(m.volumes) > 0 {
				m.volumesPin = c.onlyNode(m.volumes, node)
			}
		}
		if g.schedAlloc {
			g.addSchedulerAllocated(m, c)
			continue
		}
		ours := len(claims) > 0 || m.ext != nil
		for _, cl := range claims {
			ours = ours && c.settledFor(cl, key)
			if m.node == "" {
				m.node = allocationNode(cl.Status.Allocation)
			}
		}
		if m.ext != nil {
			pl, ok := c.plannedAt(p.UID)
			ours = ours && ok && hasGate(p)
			if ok && m.node == "" {
				m.node, m.domain = pl.node, pl.domain
			}
		} else if m.node == "" && ours && p.Spec.NodeName == "" {
			// Claims whose devices are not node-local name no one node:
			// until the pod binds, it is steered to the plan's.
			if pl, ok := c.plannedAt(p.UID); ok {
				m.node = pl.node
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
		if leadersFirst(all) {
			g.exclusive, g.due = true, dueFollowers(jobs, all)
		}
	case kindLWS:
		g.size = lwsSize(all)
	case kindGroup:
		if len(all) > 0 {
			req, _ := placement.Parse(all[0].Annotations)
			g.size = req.GroupSize
		}
		if g.size == 0 && g.podGroupName != "" {
			// A PodGroup's gang size, else every pod that names it.
			g.size = max(gangSize(g.podGroup), len(all))
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
	// writing leaves the key's backoff as it is: the group's writes run
	// beside the worker, and their end forgets it or backs the group off.
	writing
)

func (c *Controller) sync(ctx context.Context, key string) (result, error) {
	if c.writingNow(key) {
		return writing, nil // synced again once its writes end
	}
	start := time.Now() // a plan's duration includes reading the group
	o, err := c.observe(ctx, key)
	if err != nil {
		return done, err
	}
	c.trackInflight(o.g)
	d := decide(o, c.cfg.BindTimeout)
	return c.act(ctx, o, d, start)
}

// observe reads the group and what the decision needs to know of each of
// its members.
func (c *Controller) observe(ctx context.Context, key string) (*observation, error) {
	g, err := c.loadGroup(key)
	if err != nil {
		return nil, err
	}
	o := &observation{g: g, facts: map[*member]facts{}}
	if g.gone || g.members() == 0 || g.lagging {
		return o, nil
	}
	o.req, o.reqErr = placement.Parse(g.anyPod().Annotations)
	for _, l := range g.lists() {
		for _, m := range l {
			o.facts[m] = c.factsOf(ctx, m)
		}
	}
	for _, m := range g.steered {
		f := o.facts[m]
		f.stuck, f.stuckDetail = c.stuck(m)
		o.facts[m] = f
	}
	for _, m := range g.held {
		f := o.facts[m]
		f.stuck, f.stuckDetail = c.nodeTrouble(m)
		o.facts[m] = f
	}
	c.mu.Lock()
	o.gatesIn = time.Until(c.settle[key])
	c.mu.Unlock()
	for _, m := range g.held {
		if o.unseen == "" && c.gateOpened(m.pod.UID) {
			// Opened by this process; the informer shows the pod gated
			// still, and its event requeues the group.
			o.unseen = "pod " + m.pod.Namespace + "/" + m.pod.Name
		}
		for _, cl := range m.claims {
			if o.unseen == "" && !c.index.seen(cl.UID, cl.ResourceVersion) {
				o.unseen = "claim " + cl.Namespace + "/" + cl.Name
			}
		}
	}
	return o, nil
}

// factsOf observes one member of a group.
func (c *Controller) factsOf(ctx context.Context, m *member) facts {
	var f facts
	if m.pod.Spec.NodeName == "" {
		// Only a pod not bound yet may give its claims back.
		f.releasable = c.canRelease(m)
	}
	for _, cl := range m.claims {
		for dev, dc := range c.index.sharers(cl.UID, c.deviceCapacity) {
			if dc.over != "" {
				f.clash = fmt.Sprintf("the shares of device %s, of claim %s and of %s, consume more than it has (%s)", dev, cl.Name, strings.Join(dc.with, ", "), dc.over)
			} else {
				f.clash = fmt.Sprintf("device %s of claim %s is also allocated to %s", dev, cl.Name, strings.Join(dc.with, ", "))
			}
			for _, h := range dc.with {
				for _, p := range c.consumers(h) {
					if !slices.Contains(f.others, p) {
						f.others = append(f.others, p)
					}
				}
			}
		}
	}
	if m.pod.Spec.NodeName != "" {
		f.nodeGone = c.nodeGone(ctx, m.node)
	}
	return f
}

// deviceCapacity is what a device of the tree, brought up to date,
// offers to shares.
func (c *Controller) deviceCapacity(id structured.DeviceID) (map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, bool) {
	cl, err := c.snapshotCluster()
	if err != nil || cl == nil {
		return nil, false
	}
	return cl.Capacity(id)
}

// consumers returns the pods the claim namespace/name is reserved for.
func (c *Controller) consumers(key string) []*v1.Pod {
	ns, name, _ := strings.Cut(key, "/")
	cl, err := c.claims.ResourceClaims(ns).Get(name)
	if err != nil {
		return nil
	}
	var out []*v1.Pod
	for _, r := range cl.Status.ReservedFor {
		if p, err := c.pods.Pods(ns).Get(r.Name); err == nil && p.UID == r.UID {
			out = append(out, p)
		}
	}
	return out
}

// nodeGone reports whether the node is deleted, as the API server says:
// the lister may not show a node created a moment ago.
func (c *Controller) nodeGone(ctx context.Context, name string) bool {
	if _, err := c.nodes.Get(name); !apierrors.IsNotFound(err) {
		return false
	}
	_, err := c.cfg.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	return apierrors.IsNotFound(err)
}

// act makes the decision's writes, then plans the group if the decision
// says so.
func (c *Controller) act(ctx context.Context, o *observation, d decision, start time.Time) (result, error) {
	g := d.g
	switch d.next {
	case nextForget:
		c.forgetGroup(g.key)
		return done, nil
	case nextNothing:
		if g.lagging {
			klog.FromContext(ctx).V(4).Info("Waiting for the informer to show the controller's own claim writes")
		}
		if o.unseen != "" {
			klog.FromContext(ctx).V(4).Info("Waiting for the informer to show a write", "object", o.unseen)
		}
	case nextRefuse:
		c.refuse(ctx, g, d.pods, d.outcome, d.reason, d.message)
		return d.res, nil
	}
	for _, a := range d.actions {
		if err := c.do(ctx, g, a); err != nil {
			return done, err
		}
	}
	if d.requeue > 0 {
		c.queue.AddAfter(g.key, d.requeue)
	}
	switch d.next {
	case nextStatus:
		if d.outcome != "" {
			c.cfg.Metrics.Decisions.WithLabelValues(d.outcome).Inc()
		}
		return c.statusBehind(ctx, g.key, d.pods, d.reason, d.message)
	case nextNothing:
		return done, nil
	case nextSettled:
		c.setPending(g.key, false, waiting{})
		return done, nil
	case nextWaitGates:
		c.releaseAfter(g.key, o.gatesIn)
		return done, nil
	case nextOpenGates:
		return c.openGates(ctx, g)
	}
	return c.place(ctx, o, d, start)
}

// do makes one action's writes.
func (c *Controller) do(ctx context.Context, g *group, a action) error {
	switch a.kind {
	case actRelease:
		return c.releaseWithReason(ctx, g, a.m, a.reason, a.detail)
	case actRestart:
		return c.releaseMember(ctx, a.m)
	case actDelete:
		c.cfg.Metrics.Conflicts.Inc()
		if err := c.fenceClaimsOf(ctx, a.pod); err != nil {
			return err
		}
		c.recorder.Event(a.pod, v1.EventTypeWarning, ReasonDeviceConflict, truncate(a.detail))
		return c.deletePod(ctx, a.pod)
	case actNodeLost:
		// The pod garbage collector removes it once the node has stayed
		// gone for its quarantine, as it does for every pod of a deleted
		// node (the node may come back, its kubelet still running the
		// pod); the pod's deletion re-plans the group.
		if c.noteOnce(a.pod.UID) {
			c.recorder.Eventf(a.pod, v1.EventTypeWarning, ReasonNodeLost, "node %s was deleted; the pod garbage collector removes the pod, and its workload's replacement is planned into domain %s", a.detail, a.pod.Annotations[placement.AnnotationDomain])
			c.cfg.Metrics.Released.WithLabelValues(ReleaseNodeGone).Inc()
		}
	case actNotBound:
		klog.FromContext(ctx).V(2).Info("Steered pod cannot bind where its claims are; the scheduler takes them back", "pod", klog.KObj(a.pod), "reason", a.reason, "detail", a.detail)
		if a.reason == ReleaseTimeout {
			c.recorder.Eventf(a.pod, v1.EventTypeWarning, ReasonNotBound, "%s; its claims stay until the scheduler takes them back", a.detail)
		}
	case actMoved:
		return c.noteMove(ctx, a.pod, a.detail)
	}
	return nil
}

// place plans the group's pods that need a place and writes the plan into
// their claims; the gates open on a later sync, once the claim index shows
// the writes.
func (c *Controller) place(ctx context.Context, o *observation, d decision, start time.Time) (result, error) {
	g, req, key := d.g, o.req, d.g.key
	entered := time.Now() // after reading the group and the decision's other actions
	plan, pt, err := c.planGroup(ctx, g, req)
	var unsched *planner.Unschedulable
	if errors.As(err, &unsched) && !d.fresh && len(g.held) > 0 {
		// The group's domain cannot hold its new pods around those that
		// keep their places: the pods that have not started move with
		// them, and the group is planned again.
		acts, moved := unpin(o, g)
		for _, a := range acts {
			if err := c.do(ctx, g, a); err != nil {
				return done, err
			}
		}
		if len(acts) > 0 {
			g = moved
			var again planTimes
			plan, again, err = c.planGroup(ctx, g, req)
			pt.add(again)
		}
	}
	took := time.Since(start) - pt.tree
	size := PodsBucket(max(g.size, g.members()))
	c.cfg.Metrics.PlanDuration.WithLabelValues(size).Observe(took.Seconds())
	if took >= slowPlan {
		klog.FromContext(ctx).V(2).Info("Slow plan", "group", key, "pods", len(g.toPlace), "took", took,
			"readAndAct", entered.Sub(start), "lockWait", pt.wait, "snapshot", pt.snapshot, "planner", pt.plan, "treeUpdate", pt.tree)
	}
	var broken *planner.BrokenClaimError
	var invalid *planner.InvalidJobError
	switch {
	case errors.As(err, &unsched):
		c.setPending(key, true, waiting{created: g.created(), priority: g.priority()})
		c.refuse(ctx, g, append(g.pods(g.toPlace), g.gatedWaiting()...), OutcomeUnschedulable, ReasonUnschedulable, unsched.Error())
		return backoff, nil
	case errors.As(err, &broken), errors.As(err, &invalid):
		c.refuse(ctx, g, append(g.pods(g.toPlace), g.gatedWaiting()...), OutcomeInvalid, ReasonInvalidClaim, err.Error())
		return backoff, nil
	case err != nil:
		return done, err
	}
	if g.schedAlloc {
		c.steer(ctx, g, plan)
		return done, c.placed(ctx, g, plan)
	}
	writes, err := c.allocationWrites(g, plan)
	if err != nil {
		return done, err
	}
	for _, w := range writes {
		c.index.assume(w.claim, &w.result, key)
	}
	return c.writeBehind(ctx, key, func() error {
		if err := c.allocate(ctx, g, plan.Domain.Format(), writes); err != nil {
			return err
		}
		return c.placed(ctx, g, plan)
	}, func() {
		for _, w := range writes {
			c.index.unassume(w.claim.UID, key)
		}
	})
}

// placed records a plan whose claims are written (or, for a group whose
// devices kube-scheduler allocates, steered): pods that were planned again
// say so, the group stops waiting, an event tells where it goes, and its
// gates open on a later sync.
func (c *Controller) placed(ctx context.Context, g *group, plan *planner.Plan) error {
	key := g.key
	for _, m := range g.toPlace {
		if !hasGate(m.pod) && m.pod.Annotations[placement.AnnotationNode] != "" {
			if err := c.noteReplanned(ctx, m, plan.Assignments[m.pod.Name], plan.Domain.Format()); err != nil {
				return err
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
	if g.schedAlloc {
		msg += "; kube-scheduler allocates their devices there"
	}
	if len(plan.Reasons) > 0 {
		msg += ": " + strings.Join(plan.Reasons, "; ")
	}
	c.recorder.Event(g.subject, v1.EventTypeNormal, ReasonPlaced, truncate(msg))
	// The gates open once the claim index shows the allocations (and
	// after SettleDelay, when one is set).
	settle := c.cfg.SettleDelay
	if g.schedAlloc {
		// No allocation of the controller's can meet one of the
		// scheduler's: there is nothing to let land first.
		settle = 0
	}
	c.mu.Lock()
	c.settle[key] = time.Now().Add(settle)
	c.mu.Unlock()
	c.releaseAfter(key, settle)
	return nil
}

// planGroup plans the group's pods that need a place on the tree and
// snapshot as they are now. It also returns where its time went; bringing
// the tree up to date is not the plan's time.
func (c *Controller) planGroup(ctx context.Context, g *group, req placement.Request) (*planner.Plan, planTimes, error) {
	var pt planTimes
	job := planner.Job{
		Key:               g.key,
		Placement:         planner.Placement(req.Placement),
		Strategy:          planner.Strategy(req.Strategy),
		PreferredDomain:   req.PreferredDomain,
		PreferredRequired: req.PreferredRequired,
		Pinned:            map[string]string{},
		TopologyKeys:      topologyKeys(g.podGroup),
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
			if job.PinnedPods == nil {
				job.PinnedPods = map[string]planner.Pod{}
			}
			job.PinnedPods[m.pod.Name] = c.inNamespace(planner.PodFor(m.pod, nil))
			if m.pod.Spec.NodeName == "" {
				if job.Unbound == nil {
					job.Unbound = map[string]bool{}
				}
				job.Unbound[m.pod.Name] = true
			}
		}
	}
	units := planUnits(g.toPlace)
	for _, u := range units {
		job.Pods = append(job.Pods, c.inNamespace(u.pod()))
	}
	followers := phantomFollowers(g.due, units, job.Pods)
	job.Pods = append(job.Pods, followers...)
	job.Neighbours = c.neighbours(g.key, job.Pods)
	job.Spread = c.spreadPods(g.key, job.Pods)
	job.HostPortPods = c.hostPortPods(g.key, job.Pods)
	t0 := time.Now()
	_, treeTime, err := c.updateTree()
	if err != nil {
		return nil, pt, err
	}
	pt.tree = treeTime
	t1 := time.Now()
	pt.wait = t1.Sub(t0) - treeTime
	c.mu.Lock()
	t2 := time.Now()
	pt.wait += t2.Sub(t1)
	// Regions name the plan's steps in a Go execution trace (--profiling,
	// /debug/pprof/trace): where a slow plan's goroutine waited.
	region := trace.StartRegion(ctx, "snapshot")
	// The newest tree: one patched since updateTree returned is as good,
	// and the snapshot tracker follows the newest.
	snap := c.planSnapshot(c.cluster)
	c.mu.Unlock()
	reserved := c.reservation(ctx)
	region.End()
	t3 := time.Now()
	pt.snapshot = t3.Sub(t2)
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
	region = trace.StartRegion(ctx, "planner")
	plan, err := c.planner.Plan(ctx, view, c.inflight, job)
	region.End()
	var unsched *planner.Unschedulable
	if errors.As(err, &unsched) && held {
		// Say so when the reservation is what keeps the group waiting.
		if _, free := c.planner.Plan(ctx, snap, c.inflight, job); free == nil {
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
	if plan != nil && len(followers) > 0 {
		plan, g.heldFollowers = c.holdFollowers(ctx, g.key, plan, followers)
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
	pt.plan = time.Since(t3)
	return plan, pt, err
}

// slowPlan is the plan time over which the controller logs (at -v=2)
// where the time went: the benchmarks' goal.
const slowPlan = PlanGoal

// planTimes splits a plan's wall-clock time for the slow-plan log.
type planTimes struct {
	tree     time.Duration // bringing the tree up to date
	wait     time.Duration // waiting for the controller's lock
	snapshot time.Duration // the snapshot and the reservation
	plan     time.Duration // the planner
}

func (p *planTimes) add(o planTimes) {
	p.tree += o.tree
	p.wait += o.wait
	p.snapshot += o.snapshot
	p.plan += o.plan
}

// writeParallelism bounds the API writes a group's claims and gates take
// at once. One write waits for the API server (and etcd) some
// milliseconds; a 16-pod Job's 32 claim writes one after the other left
// the controller's client far below its QPS limit while other groups
// waited behind them.
const writeParallelism = 16

// claimWrite is one claim's allocation in a plan, for the pods of u.
type claimWrite struct {
	u      *unit
	claim  *resourceapi.ResourceClaim
	result resourceapi.AllocationResult
}

// allocationWrites lists the claim writes of the plan. A claim shared by
// several pods of a unit is written once, reserved for all.
func (c *Controller) allocationWrites(g *group, plan *planner.Plan) ([]claimWrite, error) {
	domain := plan.Domain.Format()
	var writes []claimWrite
	for _, u := range g.units {
		results := plan.Allocations[u.name()]
		if len(results) != len(u.claims)+len(u.exts()) {
			return nil, fmt.Errorf("plan for pod %s has %d allocations for %d claims", u.name(), len(results), len(u.claims)+len(u.exts()))
		}
		for i, claim := range u.claims {
			writes = append(writes, claimWrite{u: u, claim: claim, result: results[i]})
		}
	}
	for _, u := range g.units {
		// kube-scheduler allocates the devices of DRA extended resources
		// itself (extended.go): only where the pod goes is kept. So it is
		// for a pod whose allocations name no one node (devices that are
		// not node-local only): the node is the plan's.
		if planNamesNoNode(plan.Allocations[u.name()]) || slices.ContainsFunc(u.members, func(m *member) bool { return m.ext != nil }) {
			for _, m := range u.members {
				c.notePlanned(m.pod.UID, plannedPod{node: plan.Assignments[u.name()], domain: domain})
			}
		}
	}
	return writes, nil
}

// allocate writes the plan's claim writes, all or nothing: when one
// write fails, the claims written are released again. The claims are
// written in parallel (writeParallelism): they are independent objects.
func (c *Controller) allocate(ctx context.Context, g *group, domain string, writes []claimWrite) error {
	stored := make([]*resourceapi.ResourceClaim, len(writes))
	errs := make([]error, len(writes))
	workqueue.ParallelizeUntil(ctx, writeParallelism, len(writes), func(i int) {
		w := writes[i]
		stored[i], errs[i] = c.writeAllocation(ctx, w.u.consumers(w.claim), w.claim, g.key, domain, w.result)
	})
	var failed []error
	for i := range writes {
		if stored[i] == nil && errs[i] == nil {
			errs[i] = fmt.Errorf("write allocation of claim %s/%s: %w", writes[i].claim.Namespace, writes[i].claim.Name, context.Cause(ctx))
		}
		if errs[i] != nil {
			failed = append(failed, errs[i])
		}
	}
	if len(failed) == 0 {
		return nil
	}
	for _, cl := range stored {
		if cl == nil {
			continue
		}
		if _, err := c.releaseClaim(ctx, cl); err != nil {
			klog.FromContext(ctx).Error(err, "Releasing a claim of an abandoned plan failed; the next sync retries", "claim", klog.KObj(cl))
		}
	}
	return errors.Join(failed...)
}

// openGates opens the gates of the group's held pods, whose claims the
// claim index shows as the controller wrote them, and narrows their node
// affinity to the group's domain; writeParallelism pods at once.
func (c *Controller) openGates(ctx context.Context, g *group) (result, error) {
	req := c.groupRequirement(ctx, g)
	return c.writeBehind(ctx, g.key, func() error {
		errs := make([]error, len(g.held))
		workqueue.ParallelizeUntil(ctx, writeParallelism, len(g.held), func(i int) {
			errs[i] = c.ungate(ctx, g.held[i], req)
		})
		if err := errors.Join(errs...); err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		c.mu.Lock()
		delete(c.settle, g.key)
		c.mu.Unlock()
		c.queue.AddAfter(g.key, c.cfg.BindTimeout+time.Second)
		return nil
	}, nil)
}

// refuse records why the group waits: an event, an annotation on every
// pod that still waits, a metric.
func (c *Controller) refuse(ctx context.Context, g *group, pods []*v1.Pod, outcome, reason, msg string) {
	c.cfg.Metrics.Decisions.WithLabelValues(outcome).Inc()
	c.recorder.Event(g.subject, v1.EventTypeWarning, reason, truncate(msg))
	if err := c.setStatus(ctx, g.key, pods, reason, msg); err != nil {
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
