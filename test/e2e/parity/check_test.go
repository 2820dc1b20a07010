package parity

import (
	"context"
	"fmt"
	"slices"
	"sort"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gputopology "github.com/gputopo/gputopo/pkg/topology"
)

// milliGPU is the consumable capacity of a shared GPU's compute.
const milliGPU resourcev1.QualifiedName = "milliGPU"

// device is one published GPU as the checks need it.
type device struct {
	driver string
	node   string                   // the node of a node-local device, else ""
	leaf   string                   // the leaf a device is limited to by its slice's nodeSelector, else ""
	multi  bool                     // allowMultipleAllocations: a shared GPU
	milli  int64                    // its milliGPU capacity (shared GPUs)
	taints []resourcev1.DeviceTaint // taints in the slice itself
}

// inventory is every published device, by "pool/device" (the suite's
// pools have distinct names across drivers).
type inventory map[string]device

func loadInventory(ctx context.Context) (inventory, error) {
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices: %w", err)
	}
	out := inventory{}
	gpus := 0
	for _, s := range list.Items {
		node, leaf := ptr.Deref(s.Spec.NodeName, ""), ""
		if node == "" && s.Spec.Driver == gputopology.DriverName {
			node = s.Spec.Pool.Name // gputopo's pool is its node
		}
		if s.Spec.NodeSelector != nil {
			leaf = shape.otherLeaf // the only slices with a nodeSelector are the other driver's leaf pool
		}
		for _, d := range s.Spec.Devices {
			if s.Spec.Driver == gputopology.DriverName {
				gpus++
			}
			dev := device{driver: s.Spec.Driver, node: node, leaf: leaf, multi: ptr.Deref(d.AllowMultipleAllocations, false), taints: d.Taints}
			if c, ok := d.Capacity[milliGPU]; ok {
				dev.milli = c.Value.Value()
			}
			out[s.Spec.Pool.Name+"/"+d.Name] = dev
		}
	}
	if gpus == 0 {
		return nil, fmt.Errorf("no ResourceSlice of %s", gputopology.DriverName)
	}
	return out, nil
}

// use is one claim's hold on one device.
type use struct {
	claim string // namespace/name
	milli int64  // milliGPU it consumes of a shared GPU
	admin bool
}

// usage is every allocated claim's devices, by "node/device".
func usage(claims []resourcev1.ResourceClaim) map[string][]use {
	out := map[string][]use{}
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			u := use{claim: c.Namespace + "/" + c.Name, milli: -1, admin: r.AdminAccess != nil && *r.AdminAccess}
			if q, ok := r.ConsumedCapacity[milliGPU]; ok {
				u.milli = q.Value()
			}
			key := r.Pool + "/" + r.Device
			out[key] = append(out[key], u)
		}
	}
	return out
}

// illegal lists what is wrong with the devices a run's claims (ours, by
// namespace/name) hold, given the case's state and every claim in the
// cluster: a device with a NoSchedule taint the claim does not tolerate, a
// device on a node the pods may not use (outside the nodeSelector's leaf,
// or tainted against them), a device another claim holds as well (beyond
// a shared GPU's capacity), a device of another driver that the claim's
// node cannot reach, or a device that was never published.
func illegal(c *caseSpec, cs *clusterShape, inv inventory, all []resourcev1.ResourceClaim, ours map[string]bool) []string {
	var out []string
	uses := usage(all)
	// The node of each of our claims: where its GPUs are.
	claimNode := map[string]string{}
	for _, cl := range all {
		if !ours[cl.Namespace+"/"+cl.Name] || cl.Status.Allocation == nil {
			continue
		}
		for _, r := range cl.Status.Allocation.Devices.Results {
			if d, ok := inv[r.Pool+"/"+r.Device]; ok && d.driver == gputopology.DriverName {
				claimNode[cl.Namespace+"/"+cl.Name] = d.node
			}
		}
	}
	keys := make([]string, 0, len(uses))
	for k := range uses {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		us := uses[key]
		mine := slices.ContainsFunc(us, func(u use) bool { return ours[u.claim] })
		if !mine {
			continue
		}
		d, ok := inv[key]
		if !ok {
			out = append(out, fmt.Sprintf("%s: not a published device", key))
			continue
		}
		for _, u := range us {
			if n := claimNode[u.claim]; ours[u.claim] && n != "" && (d.node != "" && d.node != n || d.leaf != "" && cs.leafOf[n] != d.leaf) {
				out = append(out, fmt.Sprintf("%s: in claim %s with GPUs on %s, which the device's slice does not serve", key, u.claim, n))
			}
		}
		if d.driver != gputopology.DriverName {
			out = append(out, held(key, d, us)...)
			continue
		}
		if !c.TolerateDeviceTaints {
			for _, r := range c.TaintRules {
				if r.Node == d.node && (r.Device == "" || key == r.Node+"/"+r.Device) {
					out = append(out, fmt.Sprintf("%s: tainted NoSchedule by a DeviceTaintRule the claim does not tolerate", key))
				}
			}
		}
		for _, t := range d.taints {
			if t.Effect == resourcev1.DeviceTaintEffectNoSchedule || t.Effect == resourcev1.DeviceTaintEffectNoExecute {
				out = append(out, fmt.Sprintf("%s: published with taint %s=%s:%s", key, t.Key, t.Value, t.Effect))
			}
		}
		if c.Leaf != "" && cs.leafOf[d.node] != c.Leaf {
			out = append(out, fmt.Sprintf("%s: on %s, outside the pods' nodeSelector leaf %s", key, cs.leafOf[d.node], c.Leaf))
		}
		if c.TaintedNode == d.node && !c.TolerateNodeTaint {
			out = append(out, fmt.Sprintf("%s: on node %s, tainted NoSchedule against the pods", key, d.node))
		}
		out = append(out, held(key, d, us)...)
	}
	return out
}

// held checks that the claims without admin access that hold a device fit
// it: one claim, or shares within a shared GPU's capacity.
func held(key string, d device, us []use) []string {
	var holders []string
	var milli int64
	for _, u := range us {
		if u.admin {
			continue
		}
		holders = append(holders, u.claim)
		if u.milli < 0 {
			milli += d.milli // a claim that asks no share takes the whole GPU
		} else {
			milli += u.milli
		}
	}
	switch {
	case !d.multi && len(holders) > 1:
		return []string{fmt.Sprintf("%s: held by %d claims %v", key, len(holders), holders)}
	case d.multi && milli > d.milli:
		return []string{fmt.Sprintf("%s: shared GPU held beyond its %d milliGPU (%d) by %v", key, d.milli, milli, holders)}
	}
	return nil
}

// outcome is what one side did with a case.
type outcome struct {
	Placed bool
	// Detail: how many pods bound, or why they did not.
	Detail string
	// Devices are the run's claims' devices, "claim → node/device".
	Devices []string
	// Illegal lists devices the side used that it must not have.
	Illegal []string
}

func (o outcome) String() string {
	s := "refused"
	if o.Placed {
		s = "placed"
	}
	s += ": " + o.Detail
	if len(o.Devices) > 0 {
		s += fmt.Sprintf("; devices %v", o.Devices)
	}
	if len(o.Illegal) > 0 {
		s += fmt.Sprintf("; ILLEGAL %v", o.Illegal)
	}
	return s
}

// agree reports whether two sides agree: both placed or both refused, and
// neither used a device the other could not have used.
func agree(a, b outcome) bool {
	return a.Placed == b.Placed && len(a.Illegal) == 0 && len(b.Illegal) == 0
}
