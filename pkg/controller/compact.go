package controller

import (
	"encoding/json"
	"sync"

	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/gputopo/gputopo/pkg/planner"
	"github.com/gputopo/gputopo/pkg/slicepack"
)

// The informers' caches are most of the controller's memory, and on a GPU
// cluster most of that is the ResourceSlices: every device carries a
// score of attributes whose names, and most of whose values (the
// architecture, the driver version, the leaf, the device's name), are the
// same on every node. Decoded from the API server, each is a string and a
// pointer of its own, per device. The cache transform (transform) keeps
// one copy of each: the slice the controller caches has every field it
// had, equal to the one the API server sent, so the allocator, the
// resourceslice tracker and the taint logic see what kube-scheduler sees.
// Only the memory behind it is shared.
//
// Cached objects are read-only (client-go's contract, which the tracker
// follows: it applies DeviceTaintRules to a deep copy), so values shared
// between them are never written through. The transform rewrites the
// object it is given in place, which client-go allows: the factory's
// informers hand it only objects fresh from the API server, never one
// already in the cache.

// interner hands out one canonical copy of each string and integer it is
// given. It forgets in generations so that it stays bounded on a cluster
// whose devices come and go: once the current generation holds limit
// values, it becomes the previous one, and what neither holds is
// forgotten. A forgotten value still shared by cached slices stays
// shared; a new slice with it gets a fresh canonical copy.
type interner struct {
	mu        sync.Mutex
	limit     int
	strs      map[string]*string
	prevStrs  map[string]*string
	ints      map[int64]*int64
	prevInts  map[int64]*int64
	yes, no   *bool
	rotations int
	// caps and prevCaps hold one copy of each distinct capacity map, by
	// its JSON form: every GPU of a model publishes the same capacity
	// (its memory, and milliGPU when shared), so their devices share one
	// map. They forget in generations like strs.
	caps, prevCaps map[string]map[resourceapi.QualifiedName]resourceapi.DeviceCapacity
}

// internerLimit is how many distinct strings one generation holds: about
// what a cluster of 5,000 eight-GPU nodes publishes (each GPU's UUID and
// NVLink block names are its own).
const internerLimit = 1 << 17

func newInterner(limit int) *interner {
	t, f := true, false
	return &interner{limit: limit, strs: map[string]*string{}, ints: map[int64]*int64{}, yes: &t, no: &f,
		caps: map[string]map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}}
}

// str returns the canonical pointer to s's value. Called with mu held.
func (in *interner) str(s string) *string {
	if p, ok := in.strs[s]; ok {
		return p
	}
	p, ok := in.prevStrs[s]
	if !ok {
		p = &s
	}
	if len(in.strs) >= in.limit {
		in.prevStrs, in.strs = in.strs, make(map[string]*string, len(in.strs))
		in.prevInts, in.ints = in.ints, map[int64]*int64{}
		in.rotations++
	}
	in.strs[s] = p
	return p
}

func (in *interner) int(v int64) *int64 {
	if p, ok := in.ints[v]; ok {
		return p
	}
	p, ok := in.prevInts[v]
	if !ok {
		p = &v
	}
	in.ints[v] = p
	return p
}

func (in *interner) bool(v bool) *bool {
	if v {
		return in.yes
	}
	return in.no
}

func (in *interner) strPtr(p *string) *string {
	if p == nil {
		return nil
	}
	return in.str(*p)
}

// slice packs the attributes of a node-local slice's devices
// (slicepack: the planner unpacks the nodes it reads) and makes s share
// its names and values with the slices compacted before it. Every field
// keeps its value, unpacked.
func (in *interner) slice(s *resourceapi.ResourceSlice) {
	if _, local := planner.NodeLocal(s); local {
		// A slice that cannot be packed stays as it came.
		_ = slicepack.Pack(s)
	} else {
		slicepack.Strip(s)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	spec := &s.Spec
	spec.Driver = *in.str(spec.Driver)
	spec.Pool.Name = *in.str(spec.Pool.Name)
	spec.NodeName = in.strPtr(spec.NodeName)
	for i := range spec.SharedCounters {
		cs := &spec.SharedCounters[i]
		cs.Name = *in.str(cs.Name)
		cs.Counters = in.counters(cs.Counters)
	}
	for i := range spec.Devices {
		in.device(&spec.Devices[i])
	}
}

func (in *interner) device(d *resourceapi.Device) {
	d.Name = *in.str(d.Name)
	d.NodeName = in.strPtr(d.NodeName)
	if d.Attributes != nil {
		attrs := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(d.Attributes))
		for k, a := range d.Attributes {
			if a.IntValue != nil {
				a.IntValue = in.int(*a.IntValue)
			}
			if a.BoolValue != nil {
				a.BoolValue = in.bool(*a.BoolValue)
			}
			a.StringValue = in.strPtr(a.StringValue)
			a.VersionValue = in.strPtr(a.VersionValue)
			attrs[resourceapi.QualifiedName(*in.str(string(k)))] = a
		}
		d.Attributes = attrs
	}
	if d.Capacity != nil {
		d.Capacity = in.capacity(d.Capacity)
	}
	for i := range d.ConsumesCounters {
		cc := &d.ConsumesCounters[i]
		cc.CounterSet = *in.str(cc.CounterSet)
		cc.Counters = in.counters(cc.Counters)
	}
}

// capacity returns the canonical map equal to m. Called with mu held.
func (in *interner) capacity(m map[resourceapi.QualifiedName]resourceapi.DeviceCapacity) map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	// encoding/json writes a map's keys sorted, and a Quantity in its
	// canonical form, so equal maps have one key.
	b, err := json.Marshal(m)
	if err != nil {
		return m
	}
	key := string(b)
	if c, ok := in.caps[key]; ok {
		return c
	}
	c, ok := in.prevCaps[key]
	if !ok {
		c = make(map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, len(m))
		for k, v := range m {
			c[resourceapi.QualifiedName(*in.str(string(k)))] = v
		}
	}
	if len(in.caps) >= in.limit {
		in.prevCaps, in.caps = in.caps, make(map[string]map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, len(in.caps))
	}
	in.caps[key] = c
	return c
}

func (in *interner) counters(m map[string]resourceapi.Counter) map[string]resourceapi.Counter {
	if m == nil {
		return nil
	}
	out := make(map[string]resourceapi.Counter, len(m))
	for k, c := range m {
		out[*in.str(k)] = c
	}
	return out
}

// cacheTransform is the informers' transform: managed fields dropped from
// every object, ResourceSlices compacted by in, and pods, nodes, Jobs and
// namespaces trimmed of what the controller never reads.
func cacheTransform(in *interner) func(any) (any, error) {
	return func(obj any) (any, error) {
		obj, _ = dropManagedFields(obj)
		switch o := obj.(type) {
		case *resourceapi.ResourceSlice:
			in.slice(o)
		case *v1.Pod:
			trimPod(o)
		case *v1.Node:
			trimNode(o)
		case *batchv1.Job:
			// The controller reads a Job's size and status, never the
			// pod template, which its pods carry.
			o.Spec.Template = v1.PodTemplateSpec{}
		case *v1.Namespace:
			// Only its name and labels.
			o.Annotations, o.Spec, o.Status = nil, v1.NamespaceSpec{}, v1.NamespaceStatus{}
		}
		return obj, nil
	}
}

// trimPod drops from a cached pod what neither the controller nor the
// planner reads: how its containers run (command, environment, mounts,
// probes, hooks), its volumes but the PersistentVolumeClaims they name,
// its ephemeral containers, and the state of
// its containers. It keeps everything a plan reads: scheduling (gates,
// node, selectors, affinity, tolerations, priority), claims, requests as
// kube-scheduler counts them (containers' and the pod's resources,
// overhead, init containers' restart policy, and each container status's
// resources, which count once a pod was resized), conditions and phase.
// The controller writes pods only by patches built from scratch, never
// from a cached pod, so nothing dropped here is ever written back.
func trimPod(p *v1.Pod) {
	trim := func(cs []v1.Container) {
		for i := range cs {
			c := &cs[i]
			c.Command, c.Args, c.Env, c.EnvFrom, c.WorkingDir = nil, nil, nil, nil, ""
			c.VolumeMounts, c.VolumeDevices = nil, nil
			c.LivenessProbe, c.ReadinessProbe, c.StartupProbe, c.Lifecycle = nil, nil, nil, nil
			c.SecurityContext = nil
		}
	}
	trim(p.Spec.Containers)
	trim(p.Spec.InitContainers)
	p.Spec.EphemeralContainers = nil
	// Only the volumes that name a PersistentVolumeClaim, by name: they
	// hold the pod to nodes (volumes.go).
	var vols []v1.Volume
	for _, v := range p.Spec.Volumes {
		switch {
		case v.PersistentVolumeClaim != nil:
			vols = append(vols, v1.Volume{Name: v.Name, VolumeSource: v1.VolumeSource{PersistentVolumeClaim: v.PersistentVolumeClaim}})
		case v.Ephemeral != nil:
			vols = append(vols, v1.Volume{Name: v.Name, VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{}}})
		}
	}
	p.Spec.Volumes = vols
	keep := func(ss []v1.ContainerStatus) []v1.ContainerStatus {
		if ss == nil {
			return nil
		}
		out := make([]v1.ContainerStatus, len(ss))
		for i, s := range ss {
			out[i] = v1.ContainerStatus{Name: s.Name, Resources: s.Resources, AllocatedResources: s.AllocatedResources}
		}
		return out
	}
	p.Status.ContainerStatuses = keep(p.Status.ContainerStatuses)
	p.Status.InitContainerStatuses = keep(p.Status.InitContainerStatuses)
	p.Status.EphemeralContainerStatuses = nil
}

// trimNode drops from a cached node the lists its kubelet reports that
// nothing here reads: the images it holds and the volumes in use or
// attached. Labels, taints, conditions, allocatable and the rest stay.
func trimNode(n *v1.Node) {
	n.Status.Images, n.Status.VolumesInUse, n.Status.VolumesAttached = nil, nil, nil
}

// dropManagedFields keeps the field managers' records out of the caches:
// the controller never reads them, and on a large cluster they are a good
// part of every cached pod, claim and slice, which the garbage collector
// scans on every cycle while plans run. Updates built from a cached
// object leave them as they are (nil keeps them).
func dropManagedFields(obj any) (any, error) {
	if a, err := meta.Accessor(obj); err == nil {
		a.SetManagedFields(nil)
	}
	return obj, nil
}
