package controller

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	placement "github.com/gputopo/gputopo/api/placement/v1alpha1"
	specs "github.com/gputopo/gputopo/demo/specs"
	"github.com/gputopo/gputopo/pkg/devicefit"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/slices"
	"github.com/gputopo/gputopo/pkg/topology"
)

// sharingNode is node name of leaf-1 whose GPUs 0 and 1 are published
// for sharing, with its slices, and the gpu-share-quarter template.
func sharingNode(t *testing.T, name string) []any {
	t.Helper()
	p, err := sim.LoadBuiltin("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{topology.LabelTopographLeaf: "leaf-1", topology.LabelTopographSpine: "spine-0", v1.LabelHostname: "host-" + name}
	objs := []any{&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status: v1.NodeStatus{
			Conditions:  []v1.NodeCondition{{Type: v1.NodeReady, Status: v1.ConditionTrue}},
			Allocatable: v1.ResourceList{v1.ResourcePods: resource.MustParse("110"), v1.ResourceCPU: resource.MustParse("64"), v1.ResourceMemory: resource.MustParse("512Gi")},
		}}}
	cfg := slices.DefaultConfig()
	cfg.Sharing = slices.Sharing{Indexes: []int{0, 1}}
	res, err := slices.Build(p.Inventory(name), slices.Node{Name: name, Labels: labels}, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slices.Objects(name, res) {
		objs = append(objs, s)
	}
	tmpl, err := specs.ClaimTemplate("gpu-share-quarter")
	if err != nil {
		t.Fatal(err)
	}
	tmpl.Namespace = "default"
	return append(objs, tmpl)
}

// sharedDevice is the one share a pod's claim holds.
func (h *harness) sharedDevice(pod string) structured.DeviceID {
	h.t.Helper()
	a := h.claim(pod + "-gpus").Status.Allocation
	if a == nil {
		h.t.Fatalf("claim of %s is not allocated", pod)
	}
	sh := devicefit.Shares(*a)
	if len(sh) != 1 {
		h.t.Fatalf("claim of %s holds %d shares, want 1", pod, len(sh))
	}
	return sh[0].Device
}

// A share the scheduler allocated while the controller wrote a share of
// the same device: together they consume more than the device has (the
// breach of a soak run, a whole GPU taken as one share beside a Job's
// quarters). The group's own claims are taken back and planned again
// before any gate opens; a share that fits beside them changes nothing.
func TestShareClashBeforeGatesOpenIsReplanned(t *testing.T) {
	for name, tc := range map[string]struct {
		milli    int64
		replaned bool
	}{
		"the other share fills the device": {milli: 1000, replaned: true},
		"the other share fits beside":      {milli: 750, replaned: false},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, append(sharingNode(t, "s0"), job("q", 1))...)
			h.addPod(jobPod("q", 0, "gpu-share-quarter", nil))
			h.settle()
			h.allocate("default/job/q")
			dev := h.sharedDevice("q-0")
			other := foreignClaim("racer", "s0", dev.Device.String())
			r := &other.Status.Allocation.Devices.Results[0]
			r.ShareID = ptr.To(types.UID("racer-share"))
			r.ConsumedCapacity = milliGPU(tc.milli)
			h.create(other)
			h.settle()
			time.Sleep(h.c.cfg.SettleDelay)
			h.place("default/job/q")
			if moved := h.sharedDevice("q-0") != dev; moved != tc.replaned {
				t.Errorf("share moved off %s: %v, want %v", dev, moved, tc.replaned)
			}
			if hasGate(h.pod("q-0")) {
				t.Error("pod still gated")
			}
			want := ""
			if tc.replaned {
				want = "1;" + ReleaseConflict
			}
			if r := h.pod("q-0").Annotations[placement.AnnotationReleased]; r != want {
				t.Errorf("released annotation %q, want %q", r, want)
			}
		})
	}
}

func milliGPU(m int64) map[resourceapi.QualifiedName]resource.Quantity {
	return map[resourceapi.QualifiedName]resource.Quantity{topology.CapacityMilliGPU: *resource.NewQuantity(m, resource.DecimalSI)}
}
