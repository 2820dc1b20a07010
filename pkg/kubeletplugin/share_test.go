package kubeletplugin

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gputopo/gputopo/pkg/checkpoint"
	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/topology"
)

// sharedClaim holds a share of device: milli thousandths of its compute
// and, when memory is not empty, that much memory.
func sharedClaim(uid, device string, milli int64, memory string) *resourceapi.ResourceClaim {
	c := allocatedClaim(uid, device)
	r := &c.Status.Allocation.Devices.Results[0]
	r.ShareID = ptr.To(types.UID("share-" + uid))
	r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
		topology.CapacityMilliGPU: *resource.NewQuantity(milli, resource.DecimalSI),
		topology.CapacityMemory:   resource.MustParse("0"),
	}
	if memory != "" {
		r.ConsumedCapacity[topology.CapacityMemory] = resource.MustParse(memory)
	}
	return c
}

// Four quarters of GPU 0 are four claims, each with its own CDI device
// and its share in the environment; a whole-GPU claim and a fifth share
// are refused; unpreparing one share and restarting keep the others.
func TestSharesOfOneGPU(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, "dgx-h100", dir)
	gpu0 := e.drv.inv.Devices[0]
	quarters := []*resourceapi.ResourceClaim{sharedClaim("q1", "gpu-0", 250, ""), sharedClaim("q2", "gpu-0", 250, ""), sharedClaim("q3", "gpu-0", 250, ""), sharedClaim("q4", "gpu-0", 250, "10Gi")}
	res := e.prepare(t, quarters...)
	seen := map[string]bool{}
	for _, q := range quarters {
		r := res[q.UID]
		env := e.injected(t, cdiIDs(t, r))
		wantMem := "21474836480" // a quarter of 80Gi: what a quarter of the compute brings
		if q.UID == "q4" {
			wantMem = "10737418240" // what it asked for
		}
		want := map[string]string{topology.EnvVisibleDevices: gpu0.UUID, topology.EnvShareMilliGPU: "250", topology.EnvShareMemory: wantMem}
		for k, v := range want {
			if env[k] != v {
				t.Errorf("claim %s: %s=%q, want %q", q.UID, k, env[k], v)
			}
		}
		if _, ok := env[topology.EnvMPSActiveThreadPercentage]; ok {
			t.Errorf("claim %s: a simulated GPU gets no MPS limits", q.UID)
		}
		id := r.Devices[0].CDIDeviceIDs[0]
		if seen[id] {
			t.Errorf("claims share CDI device %s", id)
		}
		seen[id] = true
	}

	again := e.prepare(t, allocatedClaim("whole", "gpu-0"), sharedClaim("q5", "gpu-0", 100, ""), sharedClaim("other", "gpu-1", 500, ""))
	if err := again["whole"].Err; !errors.Is(err, ErrDeviceInUse) || !strings.Contains(err.Error(), "shared") {
		t.Errorf("whole GPU over shares: want ErrDeviceInUse saying it is shared, got %v", err)
	}
	if err := again["q5"].Err; !errors.Is(err, ErrDeviceInUse) || !strings.Contains(err.Error(), "1100 milliGPU") {
		t.Errorf("fifth share: want ErrDeviceInUse over 1000 milliGPU, got %v", err)
	}
	if again["other"].Err != nil {
		t.Errorf("a share of another GPU: %v", again["other"].Err)
	}

	_, ctx := ktesting.NewTestContext(t)
	if _, err := e.drv.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "q2"}}); err != nil {
		t.Fatal(err)
	}
	restarted := newEnv(t, "dgx-h100", dir)
	var kept []string
	for uid := range restarted.drv.state.prepared() {
		kept = append(kept, uid)
	}
	slices.Sort(kept)
	if diff := cmp.Diff([]string{"other", "q1", "q3", "q4"}, kept); diff != "" {
		t.Errorf("prepared after unprepare and restart (-want +got):\n%s", diff)
	}
	// The freed quarter takes a share again; a whole GPU still may not.
	res = restarted.prepare(t, sharedClaim("q6", "gpu-0", 250, ""), allocatedClaim("whole", "gpu-0"))
	if res["q6"].Err != nil || !errors.Is(res["whole"].Err, ErrDeviceInUse) {
		t.Errorf("after restart: q6=%v whole=%v", res["q6"].Err, res["whole"].Err)
	}
	// A share of a GPU held whole is refused too.
	if r := restarted.prepare(t, allocatedClaim("w", "gpu-2"), sharedClaim("q7", "gpu-2", 250, ""))["q7"]; !errors.Is(r.Err, ErrDeviceInUse) {
		t.Errorf("share of a GPU held whole: %v", r.Err)
	}
}

func TestShareEnvOnRealGPUsSetsMPSLimits(t *testing.T) {
	gpus := map[string]gpu.Device{"gpu-0": {MemoryBytes: 80 << 30}, "gpu-1": {MemoryBytes: 80 << 30}}
	tests := map[string]struct {
		claim *resourceapi.ResourceClaim
		want  map[string]string
	}{
		"half of one GPU": {sharedClaim("h", "gpu-0", 500, ""), map[string]string{
			topology.EnvShareMilliGPU: "500", topology.EnvShareMemory: "42949672960",
			topology.EnvMPSActiveThreadPercentage: "50", topology.EnvMPSPinnedMemoryLimit: "0=40960M"}},
		"memory as asked": {sharedClaim("m", "gpu-1", 250, "20Gi"), map[string]string{
			topology.EnvShareMilliGPU: "250", topology.EnvShareMemory: "21474836480",
			topology.EnvMPSActiveThreadPercentage: "25", topology.EnvMPSPinnedMemoryLimit: "0=20480M"}},
		"whole GPUs get no limits": {allocatedClaim("w", "gpu-0", "gpu-1"), nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var devs []checkpoint.PreparedDevice
			for _, r := range tc.claim.Status.Allocation.Devices.Results {
				devs = append(devs, preparedDevice(r, gpus[r.Device], false))
			}
			got, err := shareEnv(devs, gpus, true)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("environment (-want +got):\n%s", diff)
			}
		})
	}
}
