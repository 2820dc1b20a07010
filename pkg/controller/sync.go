package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/planner"
)

var everything = labels.Everything()

// Event reasons.
const (
	ReasonPlaced           = "Placed"
	ReasonUnschedulable    = "Unschedulable"
	ReasonInvalidPlacement = "InvalidPlacement"
	ReasonInvalidClaim     = "InvalidClaim"
)

// group is one sync's view of a pod group.
type group struct {
	key     string
	ns      string
	size    int
	gated   []*v1.Pod // gated and not yet pinned
	pinned  []*v1.Pod // gated and pinned by an earlier sync
	placed  []*v1.Pod // ungated: bound or on their way
	subject runtime.Object
	// gone is set when the group's Job is deleted: its remaining pods are
	// on their way out and must not be planned as a smaller group.
	gone bool
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
	slices.SortFunc(all, func(a, b *v1.Pod) int { return strings.Compare(a.Name, b.Name) })
	for _, p := range all {
		switch {
		case !hasGate(p):
			g.placed = append(g.placed, p)
		case p.Annotations[placement.AnnotationNode] != "":
			g.pinned = append(g.pinned, p)
		default:
			g.gated = append(g.gated, p)
		}
	}
	switch kind {
	case "job":
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
	case "group":
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

func (c *Controller) sync(ctx context.Context, key string) error {
	logger := klog.FromContext(ctx)
	g, err := c.loadGroup(key)
	if err != nil {
		return err
	}
	if g.gone || (len(g.gated) == 0 && len(g.pinned) == 0) {
		c.setPending(key, false)
		c.mu.Lock()
		delete(c.inflight, key)
		c.mu.Unlock()
		return nil
	}
	first := append(slices.Clone(g.gated), g.pinned...)[0]
	req, err := placement.Parse(first.Annotations)
	if err != nil {
		c.refuse(ctx, g, OutcomeInvalid, ReasonInvalidPlacement, err.Error())
		return nil
	}

	// A previous sync pinned these pods and stopped before ungating them:
	// finish its plan rather than making another.
	if len(g.gated) == 0 {
		return c.ungate(ctx, g.pinned)
	}
	if len(g.placed)+len(g.pinned)+len(g.gated) < g.size {
		msg := fmt.Sprintf("waiting for all %d pods of the group; %d exist", g.size, len(g.placed)+len(g.pinned)+len(g.gated))
		c.cfg.Metrics.Decisions.WithLabelValues(OutcomeWaiting).Inc()
		return c.setStatus(ctx, g.gated, msg)
	}

	job := planner.Job{
		Key:               key,
		Placement:         planner.Placement(req.Placement),
		Strategy:          planner.Strategy(req.Strategy),
		PreferredDomain:   req.PreferredDomain,
		PreferredRequired: req.PreferredRequired,
		Pinned:            map[string]string{},
	}
	alloc, err := c.allocated()
	if err != nil {
		return err
	}
	for _, p := range g.placed {
		if d := parseDomain(p.Annotations[placement.AnnotationDomain]); d != nil {
			job.Domain = d
		}
		if n := nodeOf(p); n != "" {
			job.Pinned[p.Name] = n
			// Devices planned for a placed pod whose claims are not yet
			// allocated still belong to the group.
			if !c.claimsAllocated(p) {
				alloc.Devices.Insert(decodeDevices(p.Annotations[placement.AnnotationReservedDevices])...)
			}
		}
	}
	for _, p := range g.pinned {
		job.Pinned[p.Name] = p.Annotations[placement.AnnotationNode]
		alloc.Devices.Insert(decodeDevices(p.Annotations[placement.AnnotationReservedDevices])...)
	}
	for _, p := range g.gated {
		claims, err := c.podClaims(p)
		if err != nil {
			c.refuse(ctx, g, OutcomeInvalid, ReasonInvalidClaim, err.Error())
			return nil
		}
		job.Pods = append(job.Pods, planner.Pod{Name: p.Name, Claims: claims})
	}

	cl, err := c.snapshotCluster()
	if err != nil {
		return err
	}
	res, err := c.reservations(ctx, key)
	if err != nil {
		return err
	}
	start := time.Now()
	plan, err := c.planner.Plan(ctx, planner.NewSnapshotFromState(cl, alloc), res, job)
	c.cfg.Metrics.PlanDuration.Observe(time.Since(start).Seconds())
	var unsched *planner.Unschedulable
	var broken *planner.BrokenClaimError
	var invalid *planner.InvalidJobError
	switch {
	case errors.As(err, &unsched):
		c.setPending(key, true)
		c.refuse(ctx, g, OutcomeUnschedulable, ReasonUnschedulable, unsched.Error())
		return nil
	case errors.As(err, &broken), errors.As(err, &invalid):
		c.refuse(ctx, g, OutcomeInvalid, ReasonInvalidClaim, err.Error())
		return nil
	case err != nil:
		return fmt.Errorf("plan group %s: %w", key, err)
	}

	// Hold the devices first, then pin every pod, then open the gates:
	// all or nothing.
	c.mu.Lock()
	c.inflight[key] = plan.Reservation()
	c.mu.Unlock()
	domain := formatDomain(plan.Domain)
	var pinned []*v1.Pod
	for _, p := range g.gated {
		node := plan.Assignments[p.Name]
		np, err := c.pin(ctx, p, node, domain, devicesOf(plan.Allocations[p.Name]))
		if err != nil {
			// Pods pinned so far keep their annotations, which hold their
			// devices; the next sync finishes or re-plans the group.
			c.mu.Lock()
			delete(c.inflight, key)
			c.mu.Unlock()
			if apierrors.IsNotFound(err) {
				logger.Info("Pod vanished while the group was being placed; planning again", "pod", p.Name)
				c.queue.Add(key)
				return nil
			}
			return fmt.Errorf("pin pod %s to %s: %w", p.Name, node, err)
		}
		pinned = append(pinned, np)
	}
	logger.Info("Placed pod group", "domain", plan.Domain.String(), "pods", len(plan.Assignments), "fallback", plan.Fallback)
	c.setPending(key, false)
	c.cfg.Metrics.Decisions.WithLabelValues(OutcomePlaced).Inc()
	msg := fmt.Sprintf("placed %d pods in %s", len(plan.Assignments), plan.Domain)
	if len(plan.Reasons) > 0 {
		msg += ": " + strings.Join(plan.Reasons, "; ")
	}
	c.recorder.Event(g.subject, v1.EventTypeNormal, ReasonPlaced, truncate(msg))
	return c.ungate(ctx, append(g.pinned, pinned...))
}

// refuse records why the group waits: an event, an annotation on every
// gated pod, a metric.
func (c *Controller) refuse(ctx context.Context, g *group, outcome, reason, msg string) {
	c.cfg.Metrics.Decisions.WithLabelValues(outcome).Inc()
	c.recorder.Event(g.subject, v1.EventTypeWarning, reason, truncate(msg))
	if err := c.setStatus(ctx, g.gated, msg); err != nil {
		klog.FromContext(ctx).Error(err, "Recording why the group waits failed")
	}
}

func (c *Controller) setPending(key string, pending bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if pending {
		c.pending[key] = true
	} else {
		delete(c.pending, key)
	}
}

// setStatus writes the waiting reason on pods whose annotation differs.
func (c *Controller) setStatus(ctx context.Context, pods []*v1.Pod, msg string) error {
	msg = truncate(msg)
	for _, p := range pods {
		if p.Annotations[placement.AnnotationStatus] == msg {
			continue
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{placement.AnnotationStatus: msg}}})
		if err != nil {
			return err
		}
		if _, err := c.cfg.Client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("record status on pod %s: %w", p.Name, err)
		}
	}
	return nil
}

// pin narrows the pod's required node affinity to node, which the API
// allows while the pod is gated, and records the plan on the pod.
func (c *Controller) pin(ctx context.Context, p *v1.Pod, node, domain string, devices []structured.DeviceID) (*v1.Pod, error) {
	var out *v1.Pod
	np := p.DeepCopy()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		// The informer's copy is usually current: one request per pod.
		// After a conflict, read the pod again.
		if np == nil {
			fresh, err := c.cfg.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			np = fresh
		}
		defer func() { np = nil }()
		if np.UID != p.UID || !hasGate(np) {
			return fmt.Errorf("pod %s changed while being placed", p.Name)
		}
		narrowToNode(np, node)
		np.Annotations[placement.AnnotationNode] = node
		np.Annotations[placement.AnnotationDomain] = domain
		np.Annotations[placement.AnnotationReservedDevices] = encodeDevices(devices)
		delete(np.Annotations, placement.AnnotationStatus)
		updated, err := c.cfg.Client.CoreV1().Pods(np.Namespace).Update(ctx, np, metav1.UpdateOptions{})
		out = updated
		return err
	})
	return out, err
}

// narrowToNode adds "metadata.name in (node)" to every required node
// selector term, or makes it the only term.
func narrowToNode(p *v1.Pod, node string) {
	req := v1.NodeSelectorRequirement{Key: "metadata.name", Operator: v1.NodeSelectorOpIn, Values: []string{node}}
	if p.Spec.Affinity == nil {
		p.Spec.Affinity = &v1.Affinity{}
	}
	if p.Spec.Affinity.NodeAffinity == nil {
		p.Spec.Affinity.NodeAffinity = &v1.NodeAffinity{}
	}
	na := p.Spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil || len(na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) == 0 {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &v1.NodeSelector{NodeSelectorTerms: []v1.NodeSelectorTerm{{MatchFields: []v1.NodeSelectorRequirement{req}}}}
		return
	}
	for i := range na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		t := &na.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[i]
		t.MatchFields = append(t.MatchFields, req)
	}
}

// ungatePatch removes only gputopo's gate and leaves other gates alone.
var ungatePatch = []byte(`{"spec":{"schedulingGates":[{"$patch":"delete","name":"` + placement.SchedulingGate + `"}]}}`)

// ungate removes the gputopo gate from pods that are already pinned.
func (c *Controller) ungate(ctx context.Context, pods []*v1.Pod) error {
	for _, p := range pods {
		if _, err := c.cfg.Client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, ungatePatch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("remove scheduling gate of pod %s: %w", p.Name, err)
		}
	}
	return nil
}

// podClaims instantiates the pod's claims for planning: templates as the
// resource claim controller will, existing claims as they are.
func (c *Controller) podClaims(p *v1.Pod) ([]*resourceapi.ResourceClaim, error) {
	var out []*resourceapi.ResourceClaim
	for _, rc := range p.Spec.ResourceClaims {
		switch {
		case rc.ResourceClaimTemplateName != nil:
			t, err := c.tmpls.ResourceClaimTemplates(p.Namespace).Get(*rc.ResourceClaimTemplateName)
			if err != nil {
				return nil, fmt.Errorf("pod %s: ResourceClaimTemplate %s/%s: %w", p.Name, p.Namespace, *rc.ResourceClaimTemplateName, err)
			}
			claim := devicefit.ClaimFromTemplate(t, p.Name+"-"+rc.Name)
			claim.UID = p.UID + "-" + claim.UID
			out = append(out, claim)
		case rc.ResourceClaimName != nil:
			cl, err := c.claims.ResourceClaims(p.Namespace).Get(*rc.ResourceClaimName)
			if err != nil {
				return nil, fmt.Errorf("pod %s: ResourceClaim %s/%s: %w", p.Name, p.Namespace, *rc.ResourceClaimName, err)
			}
			if cl.Status.Allocation == nil {
				out = append(out, cl.DeepCopy())
			}
		}
	}
	return out, nil
}

// claimsAllocated reports whether every claim of the pod is allocated.
func (c *Controller) claimsAllocated(p *v1.Pod) bool {
	names := map[string]string{}
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			names[s.Name] = *s.ResourceClaimName
		}
	}
	for _, rc := range p.Spec.ResourceClaims {
		name := names[rc.Name]
		if rc.ResourceClaimName != nil {
			name = *rc.ResourceClaimName
		}
		if name == "" {
			return false
		}
		cl, err := c.claims.ResourceClaims(p.Namespace).Get(name)
		if err != nil || cl.Status.Allocation == nil {
			return false
		}
	}
	return true
}

// reservations are the devices held by other groups' plans: annotations on
// pods whose claims are not allocated yet, plus this process's plans the
// informer has not shown.
func (c *Controller) reservations(ctx context.Context, except string) (*planner.Reservations, error) {
	pods, err := c.pods.List(everything)
	if err != nil {
		return nil, err
	}
	byJob := map[string]*planner.Reservation{}
	// settled: the informer shows the pod's reserved devices, or shows the
	// pod finished; a pod it does not show at all is gone.
	settled, present := map[string]bool{}, map[string]bool{}
	for _, p := range pods {
		devs := p.Annotations[placement.AnnotationReservedDevices]
		key, ok := groupKey(p)
		if !ok {
			continue
		}
		present[key+"|"+p.Name] = true
		if devs == "" && active(p) {
			continue
		}
		settled[key+"|"+p.Name] = true
		if devs == "" {
			continue
		}
		if !active(p) || key == except || c.claimsAllocated(p) {
			continue
		}
		r := byJob[key]
		if r == nil {
			r = &planner.Reservation{Job: key, Pods: map[string]string{}, Devices: map[string][]structured.DeviceID{}}
			byJob[key] = r
		}
		node := p.Annotations[placement.AnnotationNode]
		r.Pods[p.Name] = node
		r.Devices[node] = append(r.Devices[node], decodeDevices(devs)...)
	}
	c.mu.Lock()
	for job, r := range c.inflight {
		done := true
		for pod := range r.Pods {
			id := job + "|" + pod
			done = done && (settled[id] || !present[id])
		}
		if done {
			delete(c.inflight, job)
			continue
		}
		if job != except {
			cp := r
			byJob[job] = &cp
		}
	}
	c.mu.Unlock()
	out := planner.NewReservations()
	for _, job := range slices.Sorted(maps.Keys(byJob)) {
		if err := out.Add(*byJob[job]); err != nil {
			klog.FromContext(ctx).Error(err, "Overlapping reservations; ignoring one", "job", job)
		}
	}
	return out, nil
}

func nodeOf(p *v1.Pod) string {
	if p.Spec.NodeName != "" {
		return p.Spec.NodeName
	}
	return p.Annotations[placement.AnnotationNode]
}

func devicesOf(results []resourceapi.AllocationResult) []structured.DeviceID {
	var ids []structured.DeviceID
	for _, r := range results {
		for _, d := range r.Devices.Results {
			ids = append(ids, structured.MakeDeviceID(d.Driver, d.Pool, d.Device))
		}
	}
	return ids
}

// formatDomain writes a domain as "<level>:<name>,<name>", which
// parseDomain reads back.
func formatDomain(d planner.Domain) string {
	return string(d.Level) + ":" + strings.Join(d.Names, ",")
}

func parseDomain(s string) *planner.Domain {
	level, names, ok := strings.Cut(s, ":")
	if !ok || level == "" {
		return nil
	}
	d := &planner.Domain{Level: planner.Level(level)}
	if names != "" {
		d.Names = strings.Split(names, ",")
	}
	return d
}

// truncate keeps messages within what an annotation or event should carry.
func truncate(s string) string {
	const limit = 1000
	if len(s) > limit {
		return s[:limit-3] + "..."
	}
	return s
}
