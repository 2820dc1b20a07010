package controller

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/structured"

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
	cfg := slices.DefaultConfig()
	cfg.Sharing = slices.Sharing{Indexes: []int{0, 1}}
	objs := gpuNode(t, p, name, "leaf-1", cfg)
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
			h.create(shareClaimOn("racer", "s0", dev.Device.String(), tc.milli))
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

// versioned sets the claim's resourceVersion.
func versioned(c *resourceapi.ResourceClaim, rv string) *resourceapi.ResourceClaim {
	c.ResourceVersion = rv
	return c
}

// Shares that together consume more than their device has clash. In the
// order the API server took them, the shares that fit clash with those
// over, and those over with those that fit; a share that fits is never
// set against another that fits. The claims' groups are synced when
// another claim takes a new share of a device they share, not on every
// event of it. Capacity the index cannot look up is not judged.
func TestClaimIndexShareClashes(t *testing.T) {
	gpu0 := devicefit.DeviceID(topology.DriverName, "n0", "gpu-0")
	with := func(ix *claimIndex, uid types.UID) []string { return ix.sharers(uid, oneGPU)[gpu0].with }

	ix := newClaimIndex()
	ix.update(versioned(shareClaim("a", "gpu-0", 250), "1"))
	ix.update(versioned(shareClaim("b", "gpu-0", 500), "2"))
	if got := ix.update(versioned(shareClaim("c", "gpu-0", 500), "3")); !cmp.Equal(got, []types.UID{"claim-a", "claim-b"}) {
		t.Errorf("a new share of gpu-0 syncs %v, want claim-a and claim-b", got)
	}
	if got := ix.update(versioned(shareClaim("c", "gpu-0", 500), "4")); len(got) > 0 {
		t.Errorf("another event of the same share syncs %v, want none", got)
	}
	for uid, want := range map[types.UID][]string{"claim-a": {"default/c"}, "claim-b": {"default/c"}, "claim-c": {"default/a", "default/b"}} {
		if got := with(ix, uid); !cmp.Equal(got, want) {
			t.Errorf("%s clashes on gpu-0 with %v, want %v", uid, got, want)
		}
	}
	if got := ix.sharers("claim-c", oneGPU)[gpu0].over; got != "milliGPU 1250 of 1k" {
		t.Errorf("the clash says %q, want what the shares consume of the capacity", got)
	}
	if got := ix.sharers("claim-a", nil); len(got) > 0 {
		t.Errorf("without capacities, shares clash: %v", got)
	}
	ix.remove("claim-c")
	if got := ix.sharers("claim-a", oneGPU); len(got) > 0 {
		t.Errorf("after the third share went, the two left (750 of 1000) clash: %v", got)
	}

	// The order is the API server's, not the names': a share taken last
	// is the one over, whatever its name.
	ix = newClaimIndex()
	ix.update(versioned(shareClaim("z-running", "gpu-0", 500), "5"))
	ix.update(versioned(shareClaim("y-innocent", "gpu-0", 250), "6"))
	ix.update(versioned(shareClaim("a-racer", "gpu-0", 500), "7"))
	if got := with(ix, "claim-z-running"); !cmp.Equal(got, []string{"default/a-racer"}) {
		t.Errorf("the first share clashes with %v, want only the share over, default/a-racer", got)
	}
	if got := with(ix, "claim-a-racer"); !cmp.Equal(got, []string{"default/z-running", "default/y-innocent"}) {
		t.Errorf("the share over clashes with %v, want the two that fit", got)
	}

	// A share beside the device held whole clashes whatever the capacity;
	// the fence, which keeps count of devices held whole only, sees none.
	if got := ix.update(versioned(foreignClaim("whole", "n0", "gpu-0"), "8")); len(got) != 3 {
		t.Errorf("gpu-0 held whole beside three shares syncs %v, want the three sharers", got)
	}
	if got := ix.sharers("claim-y-innocent", nil)[gpu0].with; !cmp.Equal(got, []string{"default/whole"}) {
		t.Errorf("a share beside the device held whole clashes with %v, want default/whole", got)
	}
	if got := ix.sharers("claim-whole", nil)[gpu0].with; len(got) != 3 {
		t.Errorf("the device held whole clashes with %v, want the three sharers", got)
	}
	if got := ix.wholeSharers("claim-whole"); len(got) > 0 {
		t.Errorf("the fence sees %v held whole by two claims; only one holds it whole", got)
	}
}

// A Job's pod that runs on a share keeps it; of the shares the scheduler
// added after it, the one that took the device past its capacity gives
// way (its pod, not started, is deleted for its ReplicaSet to replace),
// and the one that fitted stays.
func TestShareClashWithARunningPodOnlyTheShareOverGivesWay(t *testing.T) {
	h := newHarness(t, append(sharingNode(t, "s0"), job("q", 1))...)
	h.addPod(jobPod("q", 0, "gpu-share-quarter", nil))
	h.settle()
	h.allocate("default/job/q")
	h.place("default/job/q")
	h.bind("q-0")
	p := h.pod("q-0")
	p.Status.Phase = v1.PodRunning
	if _, err := h.client.CoreV1().Pods("default").UpdateStatus(h.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	dev := h.sharedDevice("q-0")
	h.foreignPod("fits", "s0", shareClaimOn("fits", "s0", dev.Device.String(), 250))
	h.foreignPod("over", "s0", shareClaimOn("over", "s0", dev.Device.String(), 1000))
	h.sync("default/job/q")
	if h.gone("q-0") {
		t.Error("the running pod was deleted")
	}
	if !h.gone("over") {
		t.Error("the pod whose share took the device past its capacity was not deleted")
	}
	if h.gone("fits") {
		t.Error("the pod whose share fitted beside the running one was deleted")
	}
}
