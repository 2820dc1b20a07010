// Package devicefit answers "do these ResourceClaims fit on this node?"
// with k8s.io/dynamic-resource-allocation/structured, the allocator inside
// kube-scheduler, so a fit here is exactly a fit there. The kubelet plugin's
// tests, the planner and the trace simulator all go through it.
package devicefit

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

// Features are the DRA features kube-scheduler 1.37 enables by default and
// that gputopo's claims may use.
func Features() structured.Features {
	return structured.Features{
		AdminAccess:          true,
		PrioritizedList:      true,
		PartitionableDevices: true,
		DeviceTaints:         true,
		ConsumableCapacity:   true,
	}
}

// Classes is a fixed set of DeviceClasses.
type Classes map[string]*resourceapi.DeviceClass

// NewClasses indexes classes by name.
func NewClasses(classes ...*resourceapi.DeviceClass) Classes {
	c := Classes{}
	for _, cl := range classes {
		c[cl.Name] = cl
	}
	return c
}

// List implements structured.DeviceClassLister.
func (c Classes) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(c))
	for _, cl := range c {
		out = append(out, cl)
	}
	return out, nil
}

// Get implements structured.DeviceClassLister.
func (c Classes) Get(name string) (*resourceapi.DeviceClass, error) {
	if cl, ok := c[name]; ok {
		return cl, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

// ClaimFromTemplate instantiates a template the way the resource claim
// controller does for a pod.
func ClaimFromTemplate(tmpl *resourceapi.ResourceClaimTemplate, name string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: tmpl.Namespace,
			UID:       types.UID(tmpl.Namespace + "/" + name),
			Labels:    tmpl.Spec.Labels,
		},
		Spec: *Defaulted(&tmpl.Spec.Spec),
	}
}

// Defaulted returns a copy of spec with the defaults the API server applies
// (allocation mode ExactCount, count 1), for claims read from files rather
// than from the API.
func Defaulted(spec *resourceapi.ResourceClaimSpec) *resourceapi.ResourceClaimSpec {
	out := spec.DeepCopy()
	def := func(r *resourceapi.ExactDeviceRequest) {
		if r.AllocationMode == "" {
			r.AllocationMode = resourceapi.DeviceAllocationModeExactCount
		}
		if r.AllocationMode == resourceapi.DeviceAllocationModeExactCount && r.Count == 0 {
			r.Count = 1
		}
	}
	for i := range out.Devices.Requests {
		req := &out.Devices.Requests[i]
		if req.Exactly != nil {
			def(req.Exactly)
		}
		for j := range req.FirstAvailable {
			sub := &req.FirstAvailable[j]
			if sub.AllocationMode == "" {
				sub.AllocationMode = resourceapi.DeviceAllocationModeExactCount
			}
			if sub.AllocationMode == resourceapi.DeviceAllocationModeExactCount && sub.Count == 0 {
				sub.Count = 1
			}
		}
	}
	return out
}

// Allocated is the set of devices already handed out.
type Allocated = sets.Set[structured.DeviceID]

// DeviceID names a device of a pool.
func DeviceID(driver, pool, device string) structured.DeviceID {
	return structured.MakeDeviceID(driver, pool, device)
}

// AddResults marks every device of the allocation results as allocated.
// A share of a shared device marks the whole device: callers that only
// track whole devices never over-book one. State keeps shares apart.
func AddResults(allocated Allocated, results ...resourceapi.AllocationResult) {
	for _, r := range results {
		for _, d := range r.Devices.Results {
			if Holds(&d) {
				allocated.Insert(structured.MakeDeviceID(d.Driver, d.Pool, d.Device))
			}
		}
	}
}

// Evaluator evaluates claims against a fixed cluster state. It is safe for
// concurrent use and reuses compiled CEL expressions across calls.
type Evaluator struct {
	Classes structured.DeviceClassLister
	Cache   *cel.Cache
}

// NewEvaluator returns an evaluator over classes with a CEL cache sized for
// a handful of distinct selectors per job.
func NewEvaluator(classes structured.DeviceClassLister) *Evaluator {
	return &Evaluator{Classes: classes, Cache: cel.NewCache(256, cel.Features{EnableConsumableCapacity: Features().ConsumableCapacity})}
}

// Allocate returns one allocation result per claim when all claims fit on
// node together, or nil when they do not. An error means the claims or
// classes are broken (a bad CEL expression, an unknown class), not that
// they do not fit.
func (e *Evaluator) Allocate(ctx context.Context, node *v1.Node, slices []*resourceapi.ResourceSlice, allocated Allocated, claims []*resourceapi.ResourceClaim) ([]resourceapi.AllocationResult, error) {
	return e.AllocateOn(ctx, node, slices, structured.AllocatedState{AllocatedDevices: allocated}, claims)
}

// AllocateOn is Allocate on top of devices held whole and shares of
// shared devices (see State).
func (e *Evaluator) AllocateOn(ctx context.Context, node *v1.Node, slices []*resourceapi.ResourceSlice, state structured.AllocatedState, claims []*resourceapi.ResourceClaim) ([]resourceapi.AllocationResult, error) {
	if state.AllocatedDevices == nil {
		state.AllocatedDevices = Allocated{}
	}
	a, err := structured.NewAllocator(ctx, Features(), state, e.Classes, slices, e.Cache)
	if err != nil {
		return nil, fmt.Errorf("create allocator: %w", err)
	}
	res, err := a.Allocate(ctx, node, claims)
	if err != nil {
		return nil, fmt.Errorf("allocate %d claims on node %s: %w", len(claims), node.Name, err)
	}
	return res, nil
}
