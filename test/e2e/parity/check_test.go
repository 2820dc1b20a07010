package parity

import (
	"context"
	"fmt"
	"slices"
	"sort"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gputopology "github.com/gputopo/gputopo/pkg/topology"
)

// milliGPU is the consumable capacity of a shared GPU's compute.
const milliGPU resourcev1.QualifiedName = "milliGPU"

// device is one published GPU as the checks need it.
type device struct {
	node   string
	multi  bool                     // allowMultipleAllocations: a shared GPU
	milli  int64                    // its milliGPU capacity (shared GPUs)
	taints []resourcev1.DeviceTaint // taints in the slice itself
}

// inventory is every gputopo device, by "node/device".
type inventory map[string]device

func loadInventory(ctx context.Context) (inventory, error) {
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices: %w", err)
	}
	out := inventory{}
	for _, s := range list.Items {
		if s.Spec.Driver != gputopology.DriverName {
			continue
		}
		for _, d := range s.Spec.Devices {
			dev := device{node: s.Spec.Pool.Name, multi: d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations, taints: d.Taints}
			if c, ok := d.Capacity[milliGPU]; ok {
				dev.milli = c.Value.Value()
			}
			out[s.Spec.Pool.Name+"/"+d.Name] = dev
		}
	}
	if len(out) == 0 {
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
			if r.Driver != gputopology.DriverName {
				continue
			}
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
// a shared GPU's capacity), or a device that was never published.
func illegal(c *caseSpec, cs *clusterShape, inv inventory, all []resourcev1.ResourceClaim, ours map[string]bool) []string {
	var out []string
	uses := usage(all)
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
		// Holds by claims without admin access must fit the device.
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
			out = append(out, fmt.Sprintf("%s: held by %d claims %v", key, len(holders), holders))
		case d.multi && milli > d.milli:
			out = append(out, fmt.Sprintf("%s: shared GPU held beyond its %d milliGPU (%d) by %v", key, d.milli, milli, holders))
		}
	}
	return out
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
