package kubeletplugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2/ktesting"

	"github.com/gputopo/gputopo/pkg/checkpoint"
	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/slices"
	"github.com/gputopo/gputopo/pkg/topology"
)

const node = "node-a"

type recorder struct {
	mu        sync.Mutex
	published []resourceslice.DriverResources
}

func (r *recorder) PublishResources(_ context.Context, res resourceslice.DriverResources) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.published = append(r.published, res)
	return nil
}

func (r *recorder) last(t *testing.T) []resourceapi.Device {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.published) == 0 {
		t.Fatal("nothing published")
	}
	return r.published[len(r.published)-1].Pools[node].Slices[0].Devices
}

type env struct {
	dir     string
	backend *sim.Backend
	drv     *Driver
	pub     *recorder
}

func newEnv(t *testing.T, profile string, dir string) *env {
	t.Helper()
	return newEnvWith(t, profile, dir, nil)
}

// newEnvWith lets configure change the plugin's configuration before it
// starts.
func newEnvWith(t *testing.T, profile string, dir string, configure func(*Config)) *env {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	p, err := sim.LoadBuiltin(profile)
	if err != nil {
		t.Fatal(err)
	}
	if dir == "" {
		dir = t.TempDir()
	}
	b := sim.New(p, node)
	cfg := Config{NodeName: node, Backend: b, Slices: slices.DefaultConfig(),
		CDIRoot: filepath.Join(dir, "cdi"), PluginDir: filepath.Join(dir, "plugin")}
	if err := os.MkdirAll(cfg.PluginDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if configure != nil {
		configure(&cfg)
	}
	labels := map[string]string{topology.LabelTopographLeaf: "leaf-0", topology.LabelTopographSpine: "spine-0"}
	d, err := New(ctx, cfg, labels, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub := &recorder{}
	if err := d.setPublisher(ctx, pub); err != nil {
		t.Fatal(err)
	}
	return &env{dir: dir, backend: b, drv: d, pub: pub}
}

func allocatedClaim(uid string, devices ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "claim-" + uid, Namespace: "default", UID: types.UID(uid)}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Request: "gpus", Driver: topology.DriverName, Pool: node, Device: d})
	}
	return c
}

func (e *env) prepare(t *testing.T, claims ...*resourceapi.ResourceClaim) map[types.UID]kubeletplugin.PrepareResult {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	res, err := e.drv.PrepareResourceClaims(ctx, claims)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// injected resolves CDI IDs the way a container runtime would and returns
// the container's environment.
func (e *env) injected(t *testing.T, ids []string) map[string]string {
	t.Helper()
	env, _ := e.containerOf(t, ids...)
	return env
}

func TestPrepareWritesCDIAndCheckpoint(t *testing.T) {
	e := newEnv(t, "dgx1-v100", "")
	res := e.prepare(t, allocatedClaim("uid-1", "gpu-0", "gpu-1", "gpu-2", "gpu-3"))
	r := res["uid-1"]
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	var ids []string
	var names []string
	for _, d := range r.Devices {
		ids = append(ids, d.CDIDeviceIDs...)
		names = append(names, d.DeviceName)
	}
	if diff := cmp.Diff([]string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}, names); diff != "" {
		t.Errorf("devices (-want +got):\n%s", diff)
	}
	env := e.injected(t, ids)
	var want []string
	for i := range 4 {
		want = append(want, e.drv.inv.Devices[i].UUID)
	}
	got := strings.Split(env[topology.EnvVisibleDevices], ",")
	sort.Strings(got)
	sort.Strings(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("NVIDIA_VISIBLE_DEVICES (-want +got):\n%s", diff)
	}
	for k, v := range map[string]string{topology.EnvLeaf: "leaf-0", topology.EnvSpine: "spine-0", topology.EnvNVLinkDomain: node + "-nvl0", topology.EnvNode: node} {
		if env[k] != v {
			t.Errorf("%s=%q, want %q", k, env[k], v)
		}
	}
	cp, err := checkpoint.NewStore(filepath.Join(e.dir, "plugin", "checkpoint.json")).Load()
	if err != nil {
		t.Fatal(err)
	}
	if c := cp.Claims["uid-1"]; c.State != checkpoint.PrepareCompleted || len(c.Devices) != 4 {
		t.Errorf("checkpoint entry = %+v", c)
	}
}

func TestPrepareIsIdempotentAndRefusesSharedDevice(t *testing.T) {
	e := newEnv(t, "dgx-h100", "")
	first := e.prepare(t, allocatedClaim("uid-1", "gpu-0", "gpu-1"))
	again := e.prepare(t, allocatedClaim("uid-1", "gpu-0", "gpu-1"))
	if diff := cmp.Diff(first["uid-1"].Devices, again["uid-1"].Devices); diff != "" {
		t.Errorf("second prepare differs (-first +second):\n%s", diff)
	}
	// One bad claim does not fail the batch.
	res := e.prepare(t, allocatedClaim("uid-2", "gpu-1", "gpu-2"), allocatedClaim("uid-3", "gpu-5"))
	if !errors.Is(res["uid-2"].Err, ErrDeviceInUse) || !strings.Contains(res["uid-2"].Err.Error(), "default/claim-uid-1") {
		t.Errorf("uid-2: want ErrDeviceInUse naming the holder, got %v", res["uid-2"].Err)
	}
	if res["uid-3"].Err != nil {
		t.Errorf("uid-3 must prepare: %v", res["uid-3"].Err)
	}
	if _, ok := e.drv.state.prepared()["uid-2"]; ok {
		t.Error("refused claim must not be checkpointed")
	}
	if res := e.prepare(t, allocatedClaim("uid-4", "gpu-99")); !errors.Is(res["uid-4"].Err, ErrUnknownDevice) {
		t.Errorf("unknown device: got %v", res["uid-4"].Err)
	}
}

func TestUnprepare(t *testing.T) {
	e := newEnv(t, "dgx-h100", "")
	_, ctx := ktesting.NewTestContext(t)
	e.prepare(t, allocatedClaim("uid-1", "gpu-0"))
	spec := filepath.Join(e.dir, "cdi")
	res, err := e.drv.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "uid-1"}, {UID: "never-seen"}})
	if err != nil || res["uid-1"] != nil || res["never-seen"] != nil {
		t.Fatalf("unprepare: %v %v", res, err)
	}
	if entries, _ := os.ReadDir(spec); len(entries) != 0 {
		t.Errorf("CDI specs left behind: %v", entries)
	}
	if len(e.drv.state.prepared()) != 0 {
		t.Error("checkpoint still lists the claim")
	}
	// The freed GPU can be prepared for another claim.
	if r := e.prepare(t, allocatedClaim("uid-2", "gpu-0"))["uid-2"]; r.Err != nil {
		t.Error(r.Err)
	}
}

func TestRestartKeepsCompletedAndRollsBackStarted(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, "dgx-h100", dir)
	e.prepare(t, allocatedClaim("done", "gpu-0"))
	// Simulate a crash between the two phases of another claim: the
	// checkpoint says started and its CDI spec exists.
	store := checkpoint.NewStore(filepath.Join(dir, "plugin", "checkpoint.json"))
	cp, err := store.Load()
	if err != nil {
		t.Fatal(err)
	}
	cp.Claims["torn"] = checkpoint.ClaimState{UID: "torn", Namespace: "default", Name: "torn", State: checkpoint.PrepareStarted,
		Devices: []checkpoint.PreparedDevice{{Request: "gpus", Pool: node, Device: "gpu-1"}}}
	if err := store.Save(cp); err != nil {
		t.Fatal(err)
	}
	if _, err := e.drv.state.cdi.WriteClaimSpec(cdiSpec("torn", "gpu-1", e.drv.inv.Devices[1].UUID)); err != nil {
		t.Fatal(err)
	}

	restarted := newEnv(t, "dgx-h100", dir)
	got := restarted.drv.state.prepared()
	if _, ok := got["torn"]; ok {
		t.Error("interrupted claim survived the restart")
	}
	if c, ok := got["done"]; !ok || c.State != checkpoint.PrepareCompleted {
		t.Errorf("completed claim lost: %+v", got)
	}
	if _, err := os.Stat(restarted.drv.state.cdi.SpecPath("torn")); !os.IsNotExist(err) {
		t.Errorf("CDI spec of the interrupted claim not removed: %v", err)
	}
	// GPU 1 is free again, GPU 0 still held.
	res := restarted.prepare(t, allocatedClaim("next", "gpu-1"), allocatedClaim("clash", "gpu-0"))
	if res["next"].Err != nil || !errors.Is(res["clash"].Err, ErrDeviceInUse) {
		t.Errorf("after restart: next=%v clash=%v", res["next"].Err, res["clash"].Err)
	}
	// Identical slices after a restart.
	if diff := cmp.Diff(e.pub.last(t), restarted.pub.last(t)); diff != "" {
		t.Errorf("slices changed across restart (-before +after):\n%s", diff)
	}
}

func TestUnhealthyGPUIsTaintedAndRefused(t *testing.T) {
	e := newEnv(t, "dgx-h100", "")
	_, ctx := ktesting.NewTestContext(t)
	uuid := e.drv.inv.Devices[3].UUID
	if err := e.drv.applyHealth(ctx, gpu.HealthEvent{UUID: uuid, Reason: "XID-79"}); err != nil {
		t.Fatal(err)
	}
	devs := e.pub.last(t)
	want := []resourceapi.DeviceTaint{{Key: topology.TaintUnhealthy, Value: "XID-79", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	if diff := cmp.Diff(want, devs[3].Taints); diff != "" {
		t.Errorf("taint (-want +got):\n%s", diff)
	}
	if len(devs[2].Taints) != 0 {
		t.Error("healthy GPU tainted")
	}
	report, _ := e.drv.healthReport()
	if report.Devices[3].Health != kubeletplugin.HealthStatusUnhealthy || report.Devices[2].Health != kubeletplugin.HealthStatusHealthy {
		t.Errorf("health report: %+v", report.Devices[2:4])
	}
	if r := e.prepare(t, allocatedClaim("u", "gpu-3"))["u"]; !errors.Is(r.Err, ErrUnhealthyDevice) {
		t.Errorf("prepare of unhealthy GPU: %v", r.Err)
	}
	if err := e.drv.applyHealth(ctx, gpu.HealthEvent{UUID: uuid, Healthy: true}); err != nil {
		t.Fatal(err)
	}
	if len(e.pub.last(t)[3].Taints) != 0 {
		t.Error("taint not removed after recovery")
	}
}

func TestSimFaultReachesHealthStream(t *testing.T) {
	e := newEnv(t, "dgx-h100", "")
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go e.drv.watchHealth(ctx)
	reports := make(chan kubeletplugin.DeviceHealthReport)
	go func() { _ = e.drv.WatchHealthStatus(ctx, reports) }()
	if r := <-reports; r.Devices[5].Health != kubeletplugin.HealthStatusHealthy {
		t.Fatalf("initial report: %+v", r.Devices[5])
	}
	if err := e.backend.SetHealth(5, false, "XID-48"); err != nil {
		t.Fatal(err)
	}
	r := <-reports
	if r.Devices[5].Health != kubeletplugin.HealthStatusUnhealthy || !strings.HasPrefix(r.Devices[5].Message, "XID-48") {
		t.Errorf("after fault: %+v", r.Devices[5])
	}
}

func TestLabelChangeRepublishes(t *testing.T) {
	e := newEnv(t, "pcie-only", "")
	_, ctx := ktesting.NewTestContext(t)
	n := len(e.pub.published)
	same := map[string]string{topology.LabelTopographLeaf: "leaf-0", topology.LabelTopographSpine: "spine-0", "unrelated": "x"}
	if err := e.drv.SetLabels(ctx, same); err != nil {
		t.Fatal(err)
	}
	if len(e.pub.published) != n {
		t.Error("an unrelated label change republished")
	}
	moved := map[string]string{topology.LabelTopographLeaf: "leaf-7", topology.LabelTopographSpine: "spine-0"}
	if err := e.drv.SetLabels(ctx, moved); err != nil {
		t.Fatal(err)
	}
	if got := *e.pub.last(t)[0].Attributes[topology.AttrLeaf].StringValue; got != "leaf-7" {
		t.Errorf("leaf after relabel = %q", got)
	}
}

func TestLabelMappingChangeRepublishes(t *testing.T) {
	e := newEnv(t, "pcie-only", "")
	_, ctx := ktesting.NewTestContext(t)
	labels := map[string]string{topology.LabelTopographLeaf: "leaf-0", "example.com/rack": "rack-9"}
	if err := e.drv.SetLabels(ctx, labels); err != nil {
		t.Fatal(err)
	}
	n := len(e.pub.published)
	if err := e.drv.SetLabelMapping(ctx, topology.DefaultLabelMapping()); err != nil {
		t.Fatal(err)
	}
	if len(e.pub.published) != n {
		t.Error("the same mapping again republished")
	}
	rack, err := topology.ParseLabelMapping(map[string]string{"leaf": "example.com/rack"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.drv.SetLabelMapping(ctx, rack); err != nil {
		t.Fatal(err)
	}
	if got := *e.pub.last(t)[0].Attributes[topology.AttrLeaf].StringValue; got != "rack-9" {
		t.Errorf("leaf after the mapping changed = %q, want rack-9", got)
	}
	// Later label changes are read with the new mapping.
	if err := e.drv.SetLabels(ctx, map[string]string{"example.com/rack": "rack-3"}); err != nil {
		t.Fatal(err)
	}
	if got := *e.pub.last(t)[0].Attributes[topology.AttrLeaf].StringValue; got != "rack-3" {
		t.Errorf("leaf after relabel = %q, want rack-3", got)
	}
}

func BenchmarkPrepareResourceClaims(b *testing.B) {
	dir := b.TempDir()
	p, _ := sim.LoadBuiltin("dgx-h100")
	_, ctx := ktesting.NewTestContext(b)
	cfg := Config{NodeName: node, Backend: sim.New(p, node), Slices: slices.DefaultConfig(),
		CDIRoot: filepath.Join(dir, "cdi"), PluginDir: dir}
	d, err := New(ctx, cfg, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	claim := allocatedClaim("bench", "gpu-0", "gpu-1", "gpu-2", "gpu-3")
	for b.Loop() {
		res, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim})
		if res["bench"].Err != nil {
			b.Fatal(res["bench"].Err)
		}
		if _, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "bench"}}); err != nil {
			b.Fatal(err)
		}
	}
}
