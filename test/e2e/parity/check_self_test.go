package parity

import (
	"reflect"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gputopology "github.com/gputopo/gputopo/pkg/topology"
)

// TestGenerator checks that a seed and index always give the same case and
// that 300 cases cover every shape and every kind of state.
func TestGenerator(t *testing.T) {
	seen := map[string]int{}
	for i := range 300 {
		a, b := generate(shape, defaultSeed, i), generate(shape, defaultSeed, i)
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("case %d differs between two generations:\n%s\n%s", i, a, b)
		}
		seen[a.Shape]++
		if len(a.Holders) > 0 {
			seen["holders"]++
		}
		if len(a.TaintRules) > 0 {
			seen["taint rules, tolerated: "+boolString(a.TolerateDeviceTaints)]++
		}
		if a.TaintedNode != "" {
			seen["node taint, tolerated: "+boolString(a.TolerateNodeTaint)]++
		}
		if a.Leaf != "" {
			seen["leaf selector"]++
		}
		if a.ForeignGate {
			seen["foreign gate"]++
		}
		if a.Namespace != namespace {
			seen["other namespace"]++
		}
		if a.Spread {
			seen["spread"]++
		}
		if len(a.VolumeNodes) > 0 {
			seen["volume"]++
		}
	}
	want := append(shape.shapes(), "holders",
		"node taint, tolerated: true", "node taint, tolerated: false", "leaf selector", "foreign gate", "other namespace", "spread", "volume")
	if shape.taintRules {
		want = append(want, "taint rules, tolerated: true", "taint rules, tolerated: false")
	} else if seen["taint rules, tolerated: true"]+seen["taint rules, tolerated: false"] > 0 {
		t.Errorf("cases have DeviceTaintRules on a cluster that does not serve them: %v", seen)
	}
	for _, w := range want {
		if seen[w] == 0 {
			t.Errorf("300 cases of seed %d have no %q: %v", defaultSeed, w, seen)
		}
	}
}

func boolString(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// TestIllegalCatches feeds the device checks allocations that break each
// rule of a case's state, so a side that broke one could not pass.
func TestIllegalCatches(t *testing.T) {
	n0, n1 := shape.nodes[0], shape.nodes[len(shape.nodes)-1]
	c := &caseSpec{
		TaintRules:  []taintRule{{Node: n0, Device: "gpu-0"}},
		TaintedNode: n1,
		Leaf:        shape.leafOf[n0],
	}
	claim := func(name string, devices ...string) resourcev1.ResourceClaim {
		cl := resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
		cl.Status.Allocation = &resourcev1.AllocationResult{}
		for _, d := range devices {
			pool, dev, _ := strings.Cut(d, "/")
			driver := inv[d].driver
			if driver == "" {
				driver = gputopology.DriverName // a device that was never published
			}
			cl.Status.Allocation.Devices.Results = append(cl.Status.Allocation.Devices.Results,
				resourcev1.DeviceRequestAllocationResult{Request: "gpus", Driver: driver, Pool: pool, Device: dev})
		}
		return cl
	}
	ours := map[string]bool{namespace + "/ours": true}
	for _, tc := range []struct {
		name   string
		claims []resourcev1.ResourceClaim
		want   string // in the one finding; "" for none
	}{
		{"legal", []resourcev1.ResourceClaim{claim("ours", n0+"/gpu-1")}, ""},
		{"untolerated device taint", []resourcev1.ResourceClaim{claim("ours", n0+"/gpu-0")}, "DeviceTaintRule"},
		{"held by another claim", []resourcev1.ResourceClaim{claim("ours", n0+"/gpu-2"), claim("other", n0+"/gpu-2")}, "held by 2 claims"},
		{"outside the leaf and on a tainted node", []resourcev1.ResourceClaim{claim("ours", n1+"/gpu-1")}, "nodeSelector"},
		{"not published", []resourcev1.ResourceClaim{claim("ours", n0+"/gpu-99")}, "not a published device"},
		{"another driver's device of another leaf", []resourcev1.ResourceClaim{claim("ours", n0+"/gpu-1", "nic-"+shape.otherLeaf+"/nic-0")}, "does not serve"},
		{"another driver's device of another node", []resourcev1.ResourceClaim{claim("ours", n0+"/gpu-1", "nic-"+n1+"/nic-0")}, "does not serve"},
		{"another driver's device held twice", []resourcev1.ResourceClaim{claim("ours", n0+"/gpu-1", "nic-all/nic-0"), claim("other", n0+"/gpu-2", "nic-all/nic-0")}, "held by 2 claims"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := illegal(c, shape, inv, tc.claims, ours)
			if tc.want == "" {
				if len(got) > 0 {
					t.Errorf("legal allocation found illegal: %v", got)
				}
				return
			}
			if len(got) == 0 || !strings.Contains(strings.Join(got, "; "), tc.want) {
				t.Errorf("got %v, want a finding with %q", got, tc.want)
			}
		})
	}

	// A shared GPU: two quarters fit, a quarter beside a whole-GPU claim
	// does not.
	var sharedDev string
	for key, d := range inv {
		if d.multi {
			sharedDev = key
			break
		}
	}
	if sharedDev == "" {
		t.Skip("no shared GPU published")
	}
	quarter := func(name string) resourcev1.ResourceClaim {
		cl := claim(name, sharedDev)
		cl.Status.Allocation.Devices.Results[0].ConsumedCapacity = map[resourcev1.QualifiedName]resource.Quantity{milliGPU: resource.MustParse("250")}
		return cl
	}
	free := &caseSpec{}
	if got := illegal(free, shape, inv, []resourcev1.ResourceClaim{quarter("ours"), quarter("other")}, ours); len(got) > 0 {
		t.Errorf("two quarters of %s found illegal: %v", sharedDev, got)
	}
	if got := illegal(free, shape, inv, []resourcev1.ResourceClaim{quarter("ours"), claim("other", sharedDev)}, ours); len(got) == 0 {
		t.Errorf("a quarter of %s beside a whole-GPU claim found legal", sharedDev)
	}
}
