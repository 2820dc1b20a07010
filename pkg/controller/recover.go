package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	v1helper "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
)

// Why a pod's claims were taken back, for events, metrics and the pod's
// gputopo.dev/released annotation.
const (
	ReleaseTimeout      = placement.ReleaseBindTimeout
	ReleaseNodeGone     = placement.ReleaseNodeDeleted
	ReleaseNodeNotReady = placement.ReleaseNodeNotReady
	ReleaseNodeTainted  = placement.ReleaseNodeTainted
	ReleaseConflict     = placement.ReleaseDeviceConflict
	// ReleaseUnschedulable: the scheduler took back the claims of a pod
	// it could not place where they were allocated.
	ReleaseUnschedulable = placement.ReleaseUnschedulable
	// ReleaseForeignGate: another controller's scheduling gate holds the
	// pod, so it may hold no devices yet.
	ReleaseForeignGate = placement.ReleaseForeignGate
	// ReleaseDomainFull: the group's domain could not hold its new pods,
	// and this pod, not started yet, is planned again with them.
	ReleaseDomainFull = placement.ReleaseDomainFull
)

// canRelease reports whether all of the pod's claims that the controller
// allocated are unreserved. Claims others allocated stay as they are.
func (c *Controller) canRelease(m *member) bool {
	for _, cl := range m.claims {
		if cl.Status.Allocation != nil && ownedBy(cl, "") && !c.releasable(cl) {
			return false
		}
	}
	return true
}

// noteMove records a pod the scheduler bound somewhere other than the
// node the controller planned: when the planned node was lost, the
// scheduler takes back the allocation of a claim reserved only for that
// pod and allocates it again by itself, within the pod's domain affinity.
// The pod's gputopo.dev/node follows, with a Moved event and metric.
func (c *Controller) noteMove(ctx context.Context, pod *v1.Pod, planned string) error {
	why := "node " + planned + " could not take it"
	if reason, detail := c.stuck(&member{pod: pod, node: planned}); reason != "" && reason != ReleaseTimeout {
		why = detail
	}
	c.recorder.Eventf(pod, v1.EventTypeNormal, ReasonMoved, "bound to node %s instead of the planned %s (%s); the scheduler allocated its claims again in domain %s",
		pod.Spec.NodeName, planned, why, pod.Annotations[placement.AnnotationDomain])
	c.cfg.Metrics.Released.WithLabelValues(ReasonMoved).Inc()
	return c.annotate(ctx, pod, map[string]any{placement.AnnotationNode: pod.Spec.NodeName})
}

// stuck says why a steered pod cannot bind where its claims are, or "".
func (c *Controller) stuck(m *member) (reason, detail string) {
	if reason, detail := c.nodeTrouble(m); reason != "" {
		return reason, detail
	}
	if m.node == "" {
		return "", ""
	}
	since := c.ungatedAt(m.pod)
	if wait := time.Since(since); wait > c.cfg.BindTimeout {
		return ReleaseTimeout, fmt.Sprintf("not bound to node %s %s after its gate opened (timeout %s)", m.node, wait.Truncate(time.Millisecond), c.cfg.BindTimeout)
	}
	return "", ""
}

// nodeTrouble says why the pod cannot bind to the node its claims are
// allocated on (deleted, NotReady, tainted against it, cordoned), or "".
func (c *Controller) nodeTrouble(m *member) (reason, detail string) {
	if m.node == "" {
		return "", ""
	}
	node, err := c.nodes.Get(m.node)
	if apierrors.IsNotFound(err) {
		return ReleaseNodeGone, fmt.Sprintf("node %s was deleted", m.node)
	}
	if err == nil {
		if !nodeReady(node) {
			return ReleaseNodeNotReady, fmt.Sprintf("node %s is not Ready", m.node)
		}
		if t, bad := v1helper.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, m.pod.Spec.Tolerations, func(t *v1.Taint) bool {
			return t.Effect == v1.TaintEffectNoExecute || t.Effect == v1.TaintEffectNoSchedule
		}, false); bad {
			return ReleaseNodeTainted, fmt.Sprintf("node %s has taint %s=%s:%s, which the pod does not tolerate", m.node, t.Key, t.Value, t.Effect)
		}
		if node.Spec.Unschedulable {
			return ReleaseNodeTainted, fmt.Sprintf("node %s is cordoned", m.node)
		}
	}
	return "", ""
}

func nodeReady(n *v1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.NodeReady {
			return c.Status == v1.ConditionTrue
		}
	}
	return false
}

// ungatedAt is when the pod's gate opened: as this process saw it, else
// when the scheduler last tried it, else now (a restarted controller gives
// the pod a whole timeout).
func (c *Controller) ungatedAt(p *v1.Pod) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if t, ok := c.opened[p.UID]; ok {
		return t
	}
	t := time.Now()
	for _, cond := range p.Status.Conditions {
		if cond.Type == v1.PodScheduled && cond.Status == v1.ConditionFalse && !cond.LastTransitionTime.IsZero() {
			t = cond.LastTransitionTime.Time
		}
	}
	c.opened[p.UID] = t
	return t
}

// releaseWithReason takes back the pod's claims so it is planned again,
// and says so on the pod, in an event and in a metric.
func (c *Controller) releaseWithReason(ctx context.Context, g *group, m *member, reason, detail string) error {
	if err := c.releaseMember(ctx, m); err != nil {
		return err
	}
	return c.noteRelease(ctx, m, reason, detail)
}

// noteReplanned records, for a pod whose gate was open and whose claims
// the scheduler took back, why it is planned again: the planned node was
// lost, else the scheduler found no node for it.
// The pod's gputopo.dev/node and domain follow its new allocation.
func (c *Controller) noteReplanned(ctx context.Context, m *member, node, domain string) error {
	planned := m.pod.Annotations[placement.AnnotationNode]
	reason, detail := c.stuck(&member{pod: m.pod, node: planned})
	if reason == "" || reason == ReleaseTimeout {
		reason, detail = ReleaseUnschedulable, fmt.Sprintf("the scheduler took back the claims allocated on node %s", planned)
	}
	return c.noteRelease(ctx, m, reason, detail, map[string]any{placement.AnnotationNode: node, placement.AnnotationDomain: domain, placement.AnnotationStatus: nil})
}

func (c *Controller) noteRelease(ctx context.Context, m *member, reason, detail string, extra ...map[string]any) error {
	prev, _ := placement.ParseRelease(m.pod.Annotations[placement.AnnotationReleased])
	klog.FromContext(ctx).Info("Released the claims of a pod to plan it again", "pod", klog.KObj(m.pod), "reason", reason, "detail", detail)
	c.cfg.Metrics.Released.WithLabelValues(reason).Inc()
	c.recorder.Eventf(m.pod, v1.EventTypeWarning, ReasonReleased, "%s: %s; planning the pod again", reason, truncate(detail))
	// A pod whose gate is open gets a whole bind timeout again from now; a
	// gated one starts its timeout when its gate opens.
	if !hasGate(m.pod) {
		c.mu.Lock()
		c.opened[m.pod.UID] = time.Now()
		c.mu.Unlock()
	}
	ann := map[string]any{
		placement.AnnotationReleased: prev.Next(reason).Format(),
		placement.AnnotationStatus:   placement.Status{Reason: reason, Message: detail}.Format(),
	}
	for _, e := range extra {
		maps.Copy(ann, e)
	}
	return c.annotate(ctx, m.pod, ann)
}

// releaseMember clears the allocations the controller made for the pod
// and may take back. Claims it may not (the scheduler's, or another
// group's whose pod uses them) stay allocated, and the pod stays held to
// their node.
func (c *Controller) releaseMember(ctx context.Context, m *member) error {
	m.node, m.domain = "", ""
	c.forgetPlanned(m.pod.UID)
	for i, cl := range m.claims {
		released, err := c.releaseClaim(ctx, cl)
		if err != nil {
			return err
		}
		if !released {
			if m.node == "" {
				m.node = allocationNode(cl.Status.Allocation)
			}
			continue
		}
		cp := cl.DeepCopy()
		cp.Status.Allocation = nil
		cp.Status.ReservedFor = nil
		m.claims[i] = cp
	}
	return nil
}

// noteOnce reports whether the pod was not noted before, and notes it.
func (c *Controller) noteOnce(uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.noted[uid] {
		return false
	}
	c.noted[uid] = true
	return true
}

// deletePod removes a pod its workload will replace, with its grace
// period.
func (c *Controller) deletePod(ctx context.Context, p *v1.Pod) error {
	opts := metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: ptr.To(p.UID)}}
	err := c.cfg.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, opts)
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("delete pod %s: %w", p.Name, err)
	}
	return nil
}

// annotate sets (or, with a nil value, removes) annotations on a pod.
func (c *Controller) annotate(ctx context.Context, p *v1.Pod, ann map[string]any) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
	if err != nil {
		return err
	}
	_, err = c.cfg.Client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("annotate pod %s: %w", p.Name, err)
	}
	return nil
}

// setStatus writes why the pods of group key wait on those whose
// annotation differs, and, unless they only wait for their group's pods
// and claims to exist, the same in their gputopo.dev/Placed condition. In
// the same write it records the reservation the group holds, or removes
// one that ended. A gated pod still nominated to a node (nominate) is
// nominated nowhere again, in the condition's write. The pods are written
// writeParallelism at once.
func (c *Controller) setStatus(ctx context.Context, key string, pods []*v1.Pod, reason, message string) error {
	return c.writeStatus(ctx, c.statusPatches(key, pods, reason, message))
}

// writeStatus makes setStatus's writes.
func (c *Controller) writeStatus(ctx context.Context, changes []statusPatch) error {
	errs := make([]error, len(changes))
	workqueue.ParallelizeUntil(ctx, writeParallelism, len(changes), func(i int) {
		ch := changes[i]
		if len(ch.ann) > 0 {
			if errs[i] = c.annotate(ctx, ch.pod, ch.ann); errs[i] != nil {
				return
			}
		}
		if len(ch.status) > 0 {
			errs[i] = c.patchStatus(ctx, ch.pod, ch.status)
		}
	})
	return errors.Join(errs...)
}

// statusPatch is what setStatus writes to one pod: its annotations and its
// status, either empty when unchanged.
type statusPatch struct {
	pod    *v1.Pod
	ann    map[string]any
	status map[string]any
}

// statusPatches are setStatus's writes, only for the pods they change.
func (c *Controller) statusPatches(key string, pods []*v1.Pod, reason, message string) []statusPatch {
	msg := placement.Status{Reason: reason, Message: message}.Format()
	held := c.heldReservation(key)
	var out []statusPatch
	for _, p := range pods {
		ann := map[string]any{}
		changed := p.Annotations[placement.AnnotationStatus] != msg
		if changed {
			ann[placement.AnnotationStatus] = msg
		}
		switch cur, ok := p.Annotations[placement.AnnotationReservation]; {
		case held != "" && cur != held:
			ann[placement.AnnotationReservation] = held
		case held == "" && ok:
			ann[placement.AnnotationReservation] = nil
		}
		status := map[string]any{}
		// Claims are created a moment after their pods: too short a wait
		// for a status write of its own.
		if changed && reason != placement.StatusWaitingForPods {
			status["conditions"] = []any{placedPatch(p, v1.ConditionFalse, reason, message)}
		}
		if p.Status.NominatedNodeName != "" && hasGate(p) {
			// A pod that waits again (its claims were taken back before its
			// gate opened) has no planned node; kube-scheduler would
			// otherwise count its requests on the node it was nominated to
			// for other pods.
			status["nominatedNodeName"] = nil
		}
		if len(ann) > 0 || len(status) > 0 {
			out = append(out, statusPatch{pod: p, ann: ann, status: status})
		}
	}
	return out
}

// placedCondition returns the pod's gputopo.dev/Placed condition, or nil.
func placedCondition(p *v1.Pod) *v1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == placement.ConditionPlaced {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// placedPatch is the pod's gputopo.dev/Placed condition for a merge
// patch; its transition time moves only when its status does.
func placedPatch(p *v1.Pod, status v1.ConditionStatus, reason, message string) map[string]any {
	cond := map[string]any{"type": placement.ConditionPlaced, "status": status, "reason": reason, "message": truncate(message), "lastProbeTime": nil}
	if old := placedCondition(p); old == nil || old.Status != status {
		cond["lastTransitionTime"] = metav1.Now()
	}
	return cond
}

// patchStatus writes fields of the pod's status.
func (c *Controller) patchStatus(ctx context.Context, p *v1.Pod, status map[string]any) error {
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	_, err = c.cfg.Client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("write the status of pod %s: %w", p.Name, err)
	}
	return nil
}

// nominate writes, before the pod's gate opens, the node the plan chose
// into the pod's status.nominatedNodeName and, for a pod that waited, its
// gputopo.dev/Placed condition, in one write. kube-scheduler tries a pod's
// nominated node first and, when the pod fits there, binds it there
// without filtering and scoring the rest of the domain; should the node
// no longer take it, the scheduler searches the domain as before. The
// scheduler writes the same field itself before it binds a pod with
// claims and skips that write when the field names the node already, so
// the write moves from the scheduler to the controller. A pod whose node
// the scheduler picks (no node in the plan) gets only the condition.
func (c *Controller) nominate(ctx context.Context, m *member, domain string) error {
	status := map[string]any{}
	if m.node != "" && m.pod.Status.NominatedNodeName != m.node {
		status["nominatedNodeName"] = m.node
	}
	if cond := placedCondition(m.pod); cond != nil && cond.Status != v1.ConditionTrue {
		// A pod that waited says it no longer does.
		status["conditions"] = []any{placedPatch(m.pod, v1.ConditionTrue, ReasonPlaced, fmt.Sprintf("placed in %s on node %s", domain, m.node))}
	}
	if len(status) == 0 {
		return nil
	}
	return c.patchStatus(ctx, m.pod, status)
}

// ungate opens the pod's gate, records where its claims are and, with req,
// narrows its required node affinity to the group's domain, in one write.
// Other gates stay.
func (c *Controller) ungate(ctx context.Context, m *member, req *v1.NodeSelectorRequirement) error {
	domain := memberDomain(m)
	if err := c.nominate(ctx, m, domain); err != nil {
		return err
	}
	spec := map[string]any{"schedulingGates": []map[string]string{{"$patch": "delete", "name": placement.SchedulingGate}}}
	if req != nil {
		if sel := narrowedAffinity(m.pod, *req); sel != nil {
			spec["affinity"] = map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": sel}}
		}
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{
			placement.AnnotationDomain:      domain,
			placement.AnnotationNode:        nodeOrNil(m.node),
			placement.AnnotationStatus:      nil,
			placement.AnnotationReservation: nil,
		}},
		"spec": spec,
	})
	if err != nil {
		return err
	}
	// Counted as open from before the write: the scheduler may see the pod
	// ungated before the response comes, and from then on no other group's
	// sync may take the pod's claims back (releasable).
	c.mu.Lock()
	c.opened[m.pod.UID] = time.Now()
	c.mu.Unlock()
	if _, err := c.cfg.Client.CoreV1().Pods(m.pod.Namespace).Patch(ctx, m.pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		c.mu.Lock()
		delete(c.opened, m.pod.UID)
		c.mu.Unlock()
		return fmt.Errorf("remove scheduling gate of pod %s: %w", m.pod.Name, err)
	}
	return nil
}

func (c *Controller) setPending(key string, pending bool, w waiting) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if pending {
		c.pending[key] = w
	} else {
		delete(c.pending, key)
		c.unreserveLocked(key)
	}
}

// forgetGroup drops what the controller remembers of a finished group.
func (c *Controller) forgetGroup(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.pending, key)
	delete(c.settle, key)
	delete(c.expired, key)
	c.unreserveLocked(key)
}

// nodeOrNil is the node for a merge patch: nil removes the annotation
// when the scheduler, not the plan, picks the node.
func nodeOrNil(node string) any {
	if node == "" {
		return nil
	}
	return node
}
