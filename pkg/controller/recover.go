package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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

// resolveConflicts takes back the group's claims that share a device with
// another claim. The scheduler may have been allocating a device in memory
// when the controller wrote the same device into a claim; the pod that is
// not admitted yet yields. A pod already admitted whose device another
// admitted claim holds cannot start (the kubelet plugin refuses the
// device), so it is deleted and its workload replaces it.
func (c *Controller) resolveConflicts(ctx context.Context, g *group) error {
	check := func(ms []*member, bound bool) ([]*member, error) {
		var keep []*member
		for _, m := range ms {
			clash := ""
			for _, cl := range m.claims {
				for dev, holders := range c.index.sharers(cl.UID) {
					clash = fmt.Sprintf("device %s of claim %s is also allocated to %s", dev, cl.Name, strings.Join(holders, ", "))
				}
			}
			if clash == "" {
				keep = append(keep, m)
				continue
			}
			c.cfg.Metrics.Conflicts.Inc()
			if !bound && c.canRelease(m) {
				if err := c.releaseWithReason(ctx, g, m, ReleaseConflict, clash); err != nil {
					return nil, err
				}
				g.toPlace = append(g.toPlace, m)
				continue
			}
			if bound && m.pod.Status.Phase != v1.PodRunning {
				c.recorder.Eventf(m.pod, v1.EventTypeWarning, ReasonDeviceConflict, "%s; deleting the pod so its workload replaces it", clash)
				if err := c.deletePod(ctx, m.pod); err != nil {
					return nil, err
				}
				continue
			}
			keep = append(keep, m)
		}
		return keep, nil
	}
	var err error
	if g.held, err = check(g.held, false); err != nil {
		return err
	}
	if g.steered, err = check(g.steered, false); err != nil {
		return err
	}
	g.bound, err = check(g.bound, true)
	return err
}

// releaseForeign takes back any allocation the controller made for pods
// that another controller's gate holds: it allocates a pod's claims only
// once its own gate is the last one, and holds nothing for pods it cannot
// release to the scheduler.
func (c *Controller) releaseForeign(ctx context.Context, g *group) error {
	for _, m := range g.foreign {
		if m.holdsOwn() {
			if err := c.releaseWithReason(ctx, g, m, ReleaseForeignGate, g.foreignMessage()); err != nil {
				return err
			}
		}
	}
	return nil
}

// foreignMessage says which other gates hold the group's pods.
func (g *group) foreignMessage() string {
	seen := map[string]bool{}
	var gates []string
	for _, m := range g.foreign {
		for _, name := range foreignGates(m.pod) {
			if !seen[name] {
				seen[name] = true
				gates = append(gates, name)
			}
		}
	}
	return fmt.Sprintf("%d of the group's pods are held by scheduling gate %s of another controller; gputopo plans the group once its own gate %s is the last one",
		len(g.foreign), strings.Join(gates, ", "), placement.SchedulingGate)
}

// unpinHeld takes back the claims of the group's gated pods so they are
// planned again with the pods that need a place; it reports whether it
// moved any.
func (c *Controller) unpinHeld(ctx context.Context, g *group) (bool, error) {
	var keep, moved []*member
	for _, m := range g.held {
		if c.canRelease(m) {
			moved = append(moved, m)
		} else {
			keep = append(keep, m)
		}
	}
	for _, m := range moved {
		if err := c.releaseWithReason(ctx, g, m, ReleaseDomainFull, "the group's domain cannot hold its pods that need a place; planning the pods that have not started again with them"); err != nil {
			return false, err
		}
	}
	g.held = keep
	g.toPlace = append(g.toPlace, moved...)
	rankMembers(g.toPlace)
	return len(moved) > 0, nil
}

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

// recover re-plans pods that can no longer bind where their claims are:
// their node is gone, NotReady or tainted against them, or they were not
// bound within the bind timeout. Bound pods whose node is deleted are left
// to the pod garbage collector; they pin nothing meanwhile.
func (c *Controller) recover(ctx context.Context, g *group) error {
	var keep []*member
	for _, m := range g.steered {
		reason, detail := c.stuck(m)
		if reason == "" || !c.canRelease(m) {
			if reason != "" {
				// The scheduler takes the allocation back (its PostFilter)
				// and the pod is planned again, or it moves the pod itself
				// within the domain affinity; see again after a while.
				klog.FromContext(ctx).V(2).Info("Steered pod cannot bind where its claims are; the scheduler takes them back", "pod", klog.KObj(m.pod), "reason", reason, "detail", detail)
				if reason == ReleaseTimeout {
					c.recorder.Eventf(m.pod, v1.EventTypeWarning, ReasonNotBound, "%s; its claims stay until the scheduler takes them back", detail)
				}
				c.queue.AddAfter(g.key, c.cfg.BindTimeout)
			}
			keep = append(keep, m)
			continue
		}
		if err := c.releaseWithReason(ctx, g, m, reason, detail); err != nil {
			return err
		}
		g.toPlace = append(g.toPlace, m)
	}
	g.steered = keep
	keep = nil
	for _, m := range g.bound {
		if _, err := c.nodes.Get(m.node); !apierrors.IsNotFound(err) {
			keep = append(keep, m)
			continue
		}
		if _, err := c.cfg.Client.CoreV1().Nodes().Get(ctx, m.node, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			keep = append(keep, m)
			continue
		}
		// The pod garbage collector removes it once the node has stayed
		// gone for its quarantine, as it does for every pod of a deleted
		// node (the node may come back, its kubelet still running the
		// pod); the pod's deletion re-plans the group.
		if c.noteOnce(m.pod.UID) {
			c.recorder.Eventf(m.pod, v1.EventTypeWarning, ReasonNodeLost, "node %s was deleted; the pod garbage collector removes the pod, and its workload's replacement is planned into domain %s", m.node, m.pod.Annotations[placement.AnnotationDomain])
			c.cfg.Metrics.Released.WithLabelValues(ReleaseNodeGone).Inc()
		}
	}
	g.bound = keep
	for _, m := range g.bound {
		if err := c.noteMove(ctx, m); err != nil {
			return err
		}
	}
	return nil
}

// noteMove records a pod the scheduler bound somewhere other than the
// node the controller planned: when the planned node was lost, the
// scheduler takes back the allocation of a claim reserved only for that
// pod and allocates it again by itself, within the pod's domain affinity.
// The pod's gputopo.dev/node follows, with a Moved event and metric.
func (c *Controller) noteMove(ctx context.Context, m *member) error {
	planned := m.pod.Annotations[placement.AnnotationNode]
	if planned == "" || planned == m.pod.Spec.NodeName {
		return nil
	}
	why := "node " + planned + " could not take it"
	if reason, detail := c.stuck(&member{pod: m.pod, node: planned}); reason != "" && reason != ReleaseTimeout {
		why = detail
	}
	c.recorder.Eventf(m.pod, v1.EventTypeNormal, ReasonMoved, "bound to node %s instead of the planned %s (%s); the scheduler allocated its claims again in domain %s",
		m.pod.Spec.NodeName, planned, why, m.pod.Annotations[placement.AnnotationDomain])
	c.cfg.Metrics.Released.WithLabelValues(ReasonMoved).Inc()
	return c.annotate(ctx, m.pod, map[string]any{placement.AnnotationNode: m.pod.Spec.NodeName})
}

// stuck says why a steered pod cannot bind where its claims are, or "".
func (c *Controller) stuck(m *member) (reason, detail string) {
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
	since := c.ungatedAt(m.pod)
	if wait := time.Since(since); wait > c.cfg.BindTimeout {
		return ReleaseTimeout, fmt.Sprintf("not bound to node %s %s after its gate opened (timeout %s)", m.node, wait.Truncate(time.Millisecond), c.cfg.BindTimeout)
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
	m.node = ""
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

// setStatus writes why the pods wait on those whose annotation differs.
func (c *Controller) setStatus(ctx context.Context, pods []*v1.Pod, reason, message string) error {
	msg := placement.Status{Reason: reason, Message: message}.Format()
	for _, p := range pods {
		if p.Annotations[placement.AnnotationStatus] == msg {
			continue
		}
		if err := c.annotate(ctx, p, map[string]any{placement.AnnotationStatus: msg}); err != nil {
			return err
		}
	}
	return nil
}

// ungate opens the pod's gate, records where its claims are and, with req,
// narrows its required node affinity to the group's domain, in one write.
// Other gates stay.
func (c *Controller) ungate(ctx context.Context, m *member, req *v1.NodeSelectorRequirement) error {
	domain := memberDomain(m)
	spec := map[string]any{"schedulingGates": []map[string]string{{"$patch": "delete", "name": placement.SchedulingGate}}}
	if req != nil {
		if sel := narrowedAffinity(m.pod, *req); sel != nil {
			spec["affinity"] = map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": sel}}
		}
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{
			placement.AnnotationDomain: domain,
			placement.AnnotationNode:   m.node,
			placement.AnnotationStatus: nil,
		}},
		"spec": spec,
	})
	if err != nil {
		return err
	}
	if _, err := c.cfg.Client.CoreV1().Pods(m.pod.Namespace).Patch(ctx, m.pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove scheduling gate of pod %s: %w", m.pod.Name, err)
	}
	c.mu.Lock()
	c.opened[m.pod.UID] = time.Now()
	c.mu.Unlock()
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
