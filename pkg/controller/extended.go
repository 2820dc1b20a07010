package controller

import (
	"fmt"
	"slices"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/dynamic-resource-allocation/deviceclass/extendedresourcecache"
)

// DRA extended resources. A pod may ask for devices as an extended
// resource (`limits: gputopo.dev/gpu: 2`) that a DeviceClass names in
// spec.extendedResourceName (or implicitly, as
// deviceclass.resource.kubernetes.io/<class>). kube-scheduler allocates
// those devices itself: at binding it creates a ResourceClaim for the pod
// with one request per container and resource, from that class, and the
// node's allocatable is not checked for the resource. A claim created
// before the scheduler's cycle would be taken as stale and deleted, so
// the controller does not write one:
//   - the planner sees the pod with an in-memory claim that asks for the
//     same devices (extendedClaim), and without the resource in its
//     requests, so the group's domain is one where those devices fit;
//   - the plan's allocation of that claim is not written; the controller
//     remembers where it planned the pod (planned) until its gate opens,
//     narrowed to the group's domain as every pod of a group is;
//   - kube-scheduler then allocates the devices within that domain. They
//     are not held for the pod between the plan and the scheduler's cycle.
// The mapping from resource name to class is the scheduler's own, kept by
// the library's ExtendedResourceCache from DeviceClass events.

// extendedClaim returns the claim kube-scheduler would create for the
// pod's DRA extended resources, with the names of those resources, or
// nil when the pod asks for none (or the scheduler created its claim
// already: that claim is the pod's, and the claim index counts it).
func extendedClaim(pod *v1.Pod, classes *extendedresourcecache.ExtendedResourceCache) (*resourceapi.ResourceClaim, []v1.ResourceName) {
	if classes == nil || pod.Status.ExtendedResourceClaimStatus != nil {
		return nil, nil
	}
	reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	var names []v1.ResourceName
	for name, q := range reqs {
		if !q.IsZero() && classes.GetDeviceClass(name) != nil {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		return nil, nil
	}
	slices.Sort(names)
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:   pod.Namespace,
			Name:        pod.Name + "-extended-resources",
			UID:         types.UID(string(pod.UID) + "-extended-resources"),
			Annotations: map[string]string{resourceapi.ExtendedResourceClaimAnnotation: "true"},
		},
	}
	for _, name := range names {
		q := reqs[name]
		n, _ := q.AsInt64()
		claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, resourceapi.DeviceRequest{
			Name: fmt.Sprintf("extended-%d", len(claim.Spec.Devices.Requests)),
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: classes.GetDeviceClass(name).Name,
				AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
				Count:           n,
			},
		})
	}
	return claim, names
}

// isExtendedClaim reports whether the claim is one extendedClaim made,
// which only the planner sees.
func isExtendedClaim(cl *resourceapi.ResourceClaim) bool {
	return cl.Annotations[resourceapi.ExtendedResourceClaimAnnotation] == "true" && cl.ResourceVersion == ""
}

// plannedPod is where the controller planned a pod whose devices
// kube-scheduler allocates.
type plannedPod struct {
	node, domain string
}

// notePlanned remembers where a pod with DRA extended resources was
// planned.
func (c *Controller) notePlanned(uid types.UID, p plannedPod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.planned[uid] = p
}

func (c *Controller) forgetPlanned(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.planned, uid)
}

func (c *Controller) plannedAt(uid types.UID) (plannedPod, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	p, ok := c.planned[uid]
	return p, ok
}
