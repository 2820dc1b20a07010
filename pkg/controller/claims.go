package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
)

// errClaimsPending means a pod's ResourceClaims do not all exist yet: the
// resource claim controller creates them from templates shortly after the
// pod, and the claim's creation requeues the group.
var errClaimsPending = errors.New("the pod's ResourceClaims are not created yet")

// podClaims returns the pod's ResourceClaims as the informer shows them,
// in the order of the pod spec. Claims that are already allocated, such as
// one shared with a pod the scheduler placed, are among them: they are not
// planned again but hold the pod to their nodes (units.go).
func (c *Controller) podClaims(p *v1.Pod) ([]*resourceapi.ResourceClaim, error) {
	var out []*resourceapi.ResourceClaim
	for i := range p.Spec.ResourceClaims {
		pc := &p.Spec.ResourceClaims[i]
		name, mustCheckOwner, err := resourceclaim.Name(p, pc)
		switch {
		case errors.Is(err, resourceclaim.ErrClaimNotFound):
			if err := c.templateMissing(p, i); err != nil {
				return nil, err
			}
			return nil, errClaimsPending
		case err != nil:
			return nil, fmt.Errorf("pod %s: claim %s: %w", p.Name, pc.Name, err)
		case name == nil:
			continue // the template chose to create no claim
		}
		claim, err := c.claims.ResourceClaims(p.Namespace).Get(*name)
		if apierrors.IsNotFound(err) {
			if pc.ResourceClaimName != nil {
				return nil, fmt.Errorf("pod %s uses ResourceClaim %s/%s, which does not exist: create it", p.Name, p.Namespace, *name)
			}
			if err := c.templateMissing(p, i); err != nil {
				return nil, err
			}
			return nil, errClaimsPending
		}
		if err != nil {
			return nil, err
		}
		if mustCheckOwner {
			if err := resourceclaim.IsForPod(p, claim, false); err != nil {
				return nil, errClaimsPending // an older pod's claim; the new one is coming
			}
		}
		out = append(out, claim)
	}
	return out, nil
}

// templateMissing says, for a pod's claim i made from a template, that
// the template does not exist: the resource claim controller then never
// creates the claim (its only trace is a FailedResourceClaimCreation event
// on the pod), so the group would wait for it forever.
func (c *Controller) templateMissing(p *v1.Pod, i int) error {
	pc := &p.Spec.ResourceClaims[i]
	if pc.ResourceClaimTemplateName == nil {
		return nil
	}
	_, err := c.tmpls.ResourceClaimTemplates(p.Namespace).Get(*pc.ResourceClaimTemplateName)
	if !apierrors.IsNotFound(err) {
		return nil
	}
	return fmt.Errorf("pod %s: its claim %q names ResourceClaimTemplate %s/%s, which does not exist: create it in namespace %s, or fix spec.resourceClaims[%d].resourceClaimTemplateName of the pod's template",
		p.Name, pc.Name, p.Namespace, *pc.ResourceClaimTemplateName, p.Namespace, i)
}

// settledFor reports whether the claim needs nothing more from group
// key: it is allocated, for key, or by someone the controller may not
// take it back from (the scheduler, or another group whose pod uses it).
func (c *Controller) settledFor(claim *resourceapi.ResourceClaim, key string) bool {
	return claim.Status.Allocation != nil && (ownedBy(claim, key) || !c.releasable(claim))
}

// ownedBy reports whether the controller allocated the claim for group
// key; an empty key matches any group.
func ownedBy(claim *resourceapi.ResourceClaim, key string) bool {
	g, ok := claim.Annotations[placement.AnnotationAllocatedBy]
	return ok && (key == "" || g == key)
}

// writeAllocation makes the plan a reservation: the claim gets the
// finalizer the scheduler would add and says who allocated it, then its
// status gets the allocation. From then on the scheduler places the pod on
// the allocation's node and counts the devices as taken for every other
// pod. The returned claim is the stored one.
//
// A conflict is retried from a fresh read a few times: the claim
// controller of kube-controller-manager may remove the finalizer from a
// claim that is not allocated yet between the two writes.
func (c *Controller) writeAllocation(ctx context.Context, pods []*v1.Pod, claim *resourceapi.ResourceClaim, key, domain string, alloc resourceapi.AllocationResult) (*resourceapi.ResourceClaim, error) {
	var out *resourceapi.ResourceClaim
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var err error
		out, err = c.writeAllocationOnce(ctx, pods, claim, key, domain, alloc)
		if apierrors.IsConflict(err) {
			klog.FromContext(ctx).V(2).Info("Claim changed while its allocation was written; reading it again", "claim", klog.KObj(claim), "reason", err)
			fresh, gerr := c.cfg.Client.ResourceV1().ResourceClaims(claim.Namespace).Get(ctx, claim.Name, metav1.GetOptions{})
			if gerr != nil {
				return gerr
			}
			claim = fresh
		}
		return err
	})
	return out, err
}

func (c *Controller) writeAllocationOnce(ctx context.Context, pods []*v1.Pod, claim *resourceapi.ResourceClaim, key, domain string, alloc resourceapi.AllocationResult) (*resourceapi.ResourceClaim, error) {
	cl := claim.DeepCopy()
	if cl.Status.Allocation != nil {
		return nil, fmt.Errorf("claim %s/%s is already allocated", cl.Namespace, cl.Name)
	}
	if !slices.Contains(cl.Finalizers, resourceapi.Finalizer) || cl.Annotations[placement.AnnotationAllocatedBy] != key || cl.Annotations[placement.AnnotationDomain] != domain {
		if cl.Annotations == nil {
			cl.Annotations = map[string]string{}
		}
		if !slices.Contains(cl.Finalizers, resourceapi.Finalizer) {
			cl.Finalizers = append(cl.Finalizers, resourceapi.Finalizer)
		}
		cl.Annotations[placement.AnnotationAllocatedBy] = key
		cl.Annotations[placement.AnnotationDomain] = domain
		updated, err := c.cfg.Client.ResourceV1().ResourceClaims(cl.Namespace).Update(ctx, cl, metav1.UpdateOptions{})
		if err != nil {
			return nil, fmt.Errorf("mark claim %s/%s as allocated by %s: %w", cl.Namespace, cl.Name, key, err)
		}
		cl = updated
	}
	cl.Status.Allocation = alloc.DeepCopy()
	// Reserved for its pods in the same write, as the scheduler does: the
	// scheduler then only binds the pod and does not write the claim.
	cl.Status.ReservedFor = nil
	for _, pod := range pods {
		cl.Status.ReservedFor = append(cl.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: pod.Name, UID: pod.UID})
	}
	updated, err := c.cfg.Client.ResourceV1().ResourceClaims(cl.Namespace).UpdateStatus(ctx, cl, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("write allocation of claim %s/%s: %w", cl.Namespace, cl.Name, err)
	}
	c.index.update(updated)
	return updated, nil
}

// releasable reports whether the controller may take back the claim's
// allocation: it made it, and every pod it is reserved for is still behind
// the gate. Once a pod's gate is open only the scheduler changes its
// claims: it may have written an allocation of its own (its PostFilter
// takes back the allocation of a pod that fits nowhere and allocates
// again) and be about to bind the pod, which it does without reading the
// claim again; clearing that allocation would leave the pod bound where
// its claim is not.
func (c *Controller) releasable(claim *resourceapi.ResourceClaim) bool {
	if claim.Status.Allocation == nil || !ownedBy(claim, "") || claim.DeletionTimestamp != nil {
		return false
	}
	for _, r := range claim.Status.ReservedFor {
		p, err := c.pods.Pods(claim.Namespace).Get(r.Name)
		if err != nil || p.UID != r.UID || p.Spec.NodeName != "" || !hasGate(p) || c.gateOpened(p.UID) {
			return false
		}
	}
	return true
}

// gateOpened reports whether this process opened the pod's gate (or saw it
// open), which the informer may not show yet.
func (c *Controller) gateOpened(uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.opened[uid]
	return ok
}

// releaseClaim clears an allocation the controller made and no pod uses
// yet, and reports whether the claim is unallocated now. A claim that
// changed meanwhile (the scheduler reserved it) is left alone.
func (c *Controller) releaseClaim(ctx context.Context, claim *resourceapi.ResourceClaim) (bool, error) {
	if claim.Status.Allocation == nil {
		return true, nil
	}
	if !c.releasable(claim) {
		return false, nil
	}
	if c.fences != nil {
		if err := c.fences.beforeGivingBack(ctx, claim); err != nil {
			return false, fmt.Errorf("release claim %s/%s: %w", claim.Namespace, claim.Name, err)
		}
	}
	cl := claim.DeepCopy()
	cl.Status.Allocation = nil
	cl.Status.ReservedFor = nil
	updated, err := c.cfg.Client.ResourceV1().ResourceClaims(cl.Namespace).UpdateStatus(ctx, cl, metav1.UpdateOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case apierrors.IsConflict(err):
		fresh, gerr := c.cfg.Client.ResourceV1().ResourceClaims(cl.Namespace).Get(ctx, cl.Name, metav1.GetOptions{})
		if gerr != nil {
			return false, fmt.Errorf("release claim %s/%s: %w", cl.Namespace, cl.Name, gerr)
		}
		if fresh.Status.Allocation != nil && !c.releasable(fresh) {
			c.index.update(fresh)
			return false, nil
		}
		return c.releaseClaim(ctx, fresh)
	case err != nil:
		return false, fmt.Errorf("release claim %s/%s: %w", cl.Namespace, cl.Name, err)
	}
	c.index.update(updated)
	return true, nil
}

// allocationNode is the node an allocation binds its pod to, "" when it
// does not name exactly one.
func allocationNode(a *resourceapi.AllocationResult) string {
	if a == nil || a.NodeSelector == nil || len(a.NodeSelector.NodeSelectorTerms) != 1 {
		return ""
	}
	t := a.NodeSelector.NodeSelectorTerms[0]
	for _, r := range t.MatchFields {
		if r.Key == "metadata.name" && r.Operator == v1.NodeSelectorOpIn && len(r.Values) == 1 {
			return r.Values[0]
		}
	}
	return ""
}

// planNamesNoNode reports whether a pod's planned allocations name no one
// node: none of them is on a single node (devices that are not node-local
// only).
func planNamesNoNode(results []resourceapi.AllocationResult) bool {
	return len(results) > 0 && !slices.ContainsFunc(results, func(a resourceapi.AllocationResult) bool { return allocationNode(&a) != "" })
}
