package kubeletplugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2/ktesting"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gputopo/gputopo/pkg/cdi"
	"github.com/gputopo/gputopo/pkg/cdi/cditest"
	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/gpu/nvml"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/topology"
)

// flakyWatch is a health watch that fails to start fails times, then
// works once proceed is closed: it says so and waits.
type flakyWatch struct {
	*sim.Backend
	fails   int
	calls   int
	proceed chan struct{}
}

func (f *flakyWatch) WatchHealth(ctx context.Context, events chan<- gpu.HealthEvent) error {
	f.calls++
	if f.calls <= f.fails {
		return errors.New("create NVML event set: ERROR_UNKNOWN")
	}
	select {
	case <-f.proceed:
	case <-ctx.Done():
		return nil
	}
	select {
	case events <- gpu.HealthEvent{Watch: gpu.WatchActive}:
	case <-ctx.Done():
	}
	<-ctx.Done()
	return nil
}

// publishes lets a test wait for each publication in turn.
type publishes struct {
	ch chan resourceslice.DriverResources
}

func (p *publishes) PublishResources(_ context.Context, res resourceslice.DriverResources) error {
	p.ch <- res
	return nil
}

func unmonitoredTaints(res resourceslice.DriverResources) (tainted, total int) {
	for _, s := range res.Pools[node].Slices {
		for _, d := range s.Devices {
			total++
			if slices.ContainsFunc(d.Taints, func(t resourceapi.DeviceTaint) bool {
				return t.Key == topology.TaintUnmonitored && t.Effect == resourceapi.DeviceTaintEffectNoSchedule && t.Value == UnmonitoredWatchFailing
			}) {
				tainted++
			}
		}
	}
	return tainted, total
}

func TestFailedHealthWatchIsRetriedAndTaintsUntilItWorks(t *testing.T) {
	var watch *flakyWatch
	e := newEnvWith(t, "dgx-h100", "", func(c *Config) {
		watch = &flakyWatch{Backend: c.Backend.(*sim.Backend), fails: 2, proceed: make(chan struct{})}
		c.Backend = watch
		c.HealthRetry = 1 // no wait between tries
	})
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pub := &publishes{ch: make(chan resourceslice.DriverResources, 16)}
	if err := e.drv.setPublisher(ctx, pub); err != nil {
		t.Fatal(err)
	}
	if tainted, _ := unmonitoredTaints(<-pub.ch); tainted != 0 {
		t.Fatalf("%d GPUs tainted before the watch ever failed", tainted)
	}
	go e.drv.watchHealth(ctx)

	// The first failure taints every GPU; the second changes nothing
	// published; the third attempt works and the taints go.
	if tainted, total := unmonitoredTaints(<-pub.ch); tainted != total || total != 8 {
		t.Errorf("after the watch failed: %d of %d GPUs tainted unmonitored, want all 8", tainted, total)
	}
	report, _ := e.drv.healthReport()
	if h := report.Devices[0]; h.Health != kubeletplugin.HealthStatusUnknown || !strings.Contains(h.Message, "ERROR_UNKNOWN") {
		t.Errorf("kubelet health while unmonitored: %+v, want Unknown with the reason", h)
	}
	close(watch.proceed)
	if tainted, _ := unmonitoredTaints(<-pub.ch); tainted != 0 {
		t.Errorf("after the watch works again: %d GPUs still tainted", tainted)
	}
	if watch.calls != 3 {
		t.Errorf("watch started %d times, want 3", watch.calls)
	}
}

func TestXidErrorsSurviveARestartButNotAReboot(t *testing.T) {
	dir := t.TempDir()
	boot := func(id string) func(*Config) { return func(c *Config) { c.BootID = id } }
	e := newEnvWith(t, "dgx-h100", dir, boot("boot-1"))
	_, ctx := ktesting.NewTestContext(t)
	uuid := e.drv.inv.Devices[2].UUID
	if err := e.drv.applyHealth(ctx, gpu.HealthEvent{UUID: uuid, Reason: "XID-79", Message: "critical Xid error 79", Persist: true}); err != nil {
		t.Fatal(err)
	}
	lost := e.drv.inv.Devices[4].UUID
	if err := e.drv.applyHealth(ctx, gpu.HealthEvent{UUID: lost, Reason: "GPU-LOST"}); err != nil {
		t.Fatal(err)
	}
	want := []resourceapi.DeviceTaint{{Key: topology.TaintUnhealthy, Value: "XID-79", Effect: resourceapi.DeviceTaintEffectNoSchedule}}

	restarted := newEnvWith(t, "dgx-h100", dir, boot("boot-1"))
	devs := restarted.pub.last(t)
	if diff := cmp.Diff(want, devs[2].Taints); diff != "" {
		t.Errorf("after a restart, GPU 2's taints (-want +got):\n%s", diff)
	}
	if len(devs[4].Taints) != 0 {
		t.Errorf("a lost GPU is probed again after a restart, not recorded: taints %v", devs[4].Taints)
	}
	// A lost-and-back report does not clear the recorded Xid.
	if err := restarted.drv.applyHealth(ctx, gpu.HealthEvent{UUID: uuid, Healthy: true, Reason: nvml.ReasonRecovered}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, restarted.pub.last(t)[2].Taints); diff != "" {
		t.Errorf("after a recovery report, GPU 2's taints (-want +got):\n%s", diff)
	}

	rebooted := newEnvWith(t, "dgx-h100", dir, boot("boot-2"))
	if taints := rebooted.pub.last(t)[2].Taints; len(taints) != 0 {
		t.Errorf("after a reboot, GPU 2 is still tainted: %v", taints)
	}
}

// migSwitch is a node whose GPU 2 is in MIG mode while mig is set.
type migSwitch struct {
	*sim.Backend
	mig bool
}

func (m *migSwitch) Discover(ctx context.Context) (*gpu.Inventory, error) {
	full, err := m.Backend.Discover(ctx)
	if err != nil || !m.mig {
		return full, err
	}
	inv := *full
	g := full.Devices[2]
	inv.Devices = slices.Delete(slices.Clone(full.Devices), 2, 3)
	inv.Links = slices.DeleteFunc(slices.Clone(full.Links), func(l gpu.Link) bool { return l.A == 2 || l.B == 2 })
	inv.Skipped = []gpu.Skipped{{Index: 2, UUID: g.UUID, Reason: nvml.SkipMIGEnabled}}
	return &inv, nil
}

func names(devs []resourceapi.Device) []string {
	var out []string
	for _, d := range devs {
		out = append(out, d.Name)
	}
	return out
}

func TestMIGModeChangeRepublishes(t *testing.T) {
	var node *migSwitch
	e := newEnvWith(t, "hgx-pcie-pairs", "", func(c *Config) {
		node = &migSwitch{Backend: c.Backend.(*sim.Backend)}
		c.Backend = node
	})
	_, ctx := ktesting.NewTestContext(t)
	all := names(e.pub.last(t))
	if err := e.drv.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(e.pub.published); n != 1 {
		t.Errorf("a discovery that finds nothing new republished (%d publications)", n)
	}

	node.mig = true
	if err := e.drv.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	want := slices.Delete(slices.Clone(all), 2, 3)
	if diff := cmp.Diff(want, names(e.pub.last(t))); diff != "" {
		t.Errorf("GPU 2 in MIG mode: published (-want +got):\n%s", diff)
	}
	// GPU 3 lost its NVLink pair (2-3): no pair attribute left for it.
	if _, ok := e.pub.last(t)[2].Attributes[topology.AttrNVLinkBlock2]; ok {
		t.Errorf("gpu-3 keeps an NVLink pair with a GPU in MIG mode")
	}

	node.mig = false
	if err := e.drv.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(all, names(e.pub.last(t))); diff != "" {
		t.Errorf("GPU 2 out of MIG mode: published (-want +got):\n%s", diff)
	}
}

// A GPU in MIG mode is counted in gputopo_plugin_skipped_devices under
// MIG-ENABLED while it is left out, and no more once it is back.
func TestMIGGPUIsCountedAsSkipped(t *testing.T) {
	var node *migSwitch
	e := newEnvWith(t, "hgx-pcie-pairs", "", func(c *Config) {
		node = &migSwitch{Backend: c.Backend.(*sim.Backend)}
		c.Backend = node
		c.Metrics = NewMetrics(prometheus.NewRegistry())
	})
	_, ctx := ktesting.NewTestContext(t)
	skipped := func() float64 {
		return testutil.ToFloat64(e.drv.cfg.Metrics.SkippedDevices.WithLabelValues(nvml.SkipMIGEnabled))
	}
	published := func() float64 { return testutil.ToFloat64(e.drv.cfg.Metrics.PublishedDevices) }
	if got := skipped(); got != 0 {
		t.Errorf("no GPU in MIG mode: skipped MIG-ENABLED = %v, want 0", got)
	}
	all := published()
	node.mig = true
	if err := e.drv.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := skipped(); got != 1 {
		t.Errorf("GPU 2 in MIG mode: skipped MIG-ENABLED = %v, want 1", got)
	}
	if got := published(); got != all-1 {
		t.Errorf("GPU 2 in MIG mode: published %v, want %v", got, all-1)
	}
	node.mig = false
	if err := e.drv.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if got := skipped(); got != 0 {
		t.Errorf("GPU 2 out of MIG mode: skipped MIG-ENABLED = %v, want 0", got)
	}
}

// lostGPU is a node whose GPU 5 stops answering discovery.
type lostGPU struct{ *sim.Backend }

func (l lostGPU) Discover(ctx context.Context) (*gpu.Inventory, error) {
	full, err := l.Backend.Discover(ctx)
	if err != nil {
		return nil, err
	}
	inv := *full
	inv.Devices = slices.Delete(slices.Clone(full.Devices), 5, 6)
	inv.Skipped = []gpu.Skipped{{Index: 5, UUID: full.Devices[5].UUID, Reason: nvml.SkipGPULost}}
	return &inv, nil
}

func TestALostGPUStaysPublished(t *testing.T) {
	e := newEnv(t, "dgx-h100", "")
	before := names(e.pub.last(t))
	e.drv.cfg.Backend = lostGPU{e.backend}
	_, ctx := ktesting.NewTestContext(t)
	if err := e.drv.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, names(e.pub.last(t))); diff != "" {
		t.Errorf("a GPU discovery misses was withdrawn (-want +got):\n%s", diff)
	}
}

type reloadedDriver struct{ *sim.Backend }

func (reloadedDriver) Discover(context.Context) (*gpu.Inventory, error) {
	return nil, errors.Join(gpu.ErrDriverReloaded, errors.New("ERROR_LIB_RM_VERSION_MISMATCH"))
}

func TestAReplacedDriverRestartsThePlugin(t *testing.T) {
	e := newEnv(t, "dgx-h100", "")
	_, ctx := ktesting.NewTestContext(t)
	e.drv.cfg.Backend = reloadedDriver{e.backend}
	err := e.drv.refresh(ctx)
	if !errors.Is(err, gpu.ErrDriverReloaded) || errors.Is(err, kubeletplugin.ErrRecoverable) {
		t.Errorf("refresh = %v, want a fatal ErrDriverReloaded (the plugin restarts)", err)
	}
	e.drv.cfg.Backend = failingDiscovery{e.backend}
	if err := e.drv.refresh(ctx); !errors.Is(err, kubeletplugin.ErrRecoverable) {
		t.Errorf("a failed discovery: %v, want a recoverable error", err)
	}
}

type failingDiscovery struct{ *sim.Backend }

func (failingDiscovery) Discover(context.Context) (*gpu.Inventory, error) {
	return nil, errors.New("get name of GPU 3: ERROR_UNKNOWN")
}

// upgradeDriver replaces the fake driver's versioned libraries and
// firmware with those of version, as a driver upgrade does.
func upgradeDriver(t *testing.T, root, version string) {
	t.Helper()
	lib := filepath.Join(root, cditest.LibDir)
	for _, name := range []string{"libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so"} {
		if err := os.Remove(filepath.Join(lib, name+"."+cditest.DriverVersion)); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(lib, name+"."+version), []byte("fake"), 0o755); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(lib, name+".1")
		if err := os.Remove(link); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(name+"."+version, link); err != nil {
			t.Fatal(err)
		}
	}
	fw := filepath.Join(root, "lib/firmware/nvidia")
	if err := os.Rename(filepath.Join(fw, cditest.DriverVersion), filepath.Join(fw, version)); err != nil {
		t.Fatal(err)
	}
}

func specMounts(t *testing.T, e *env, uid string) []string {
	t.Helper()
	spec, err := cdiapi.ReadSpec(e.drv.state.cdi.SpecPath(uid), 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range spec.ContainerEdits.Mounts {
		out = append(out, m.ContainerPath)
	}
	return out
}

func TestDriverUpgradeRewritesPreparedSpecs(t *testing.T) {
	var root string
	var lib *mock.Interface
	e := newEnvWith(t, "dgx-h100", "", func(c *Config) {
		root, lib = withDriverRoot(t, "dgx-h100", c)
	})
	cdiIDs(t, e.prepare(t, allocatedClaim("uid-a", "gpu-1"))["uid-a"])
	old := cditest.LibDir + "/libcuda.so." + cditest.DriverVersion
	if !slices.Contains(specMounts(t, e, "uid-a"), old) {
		t.Fatalf("spec lacks %s before the upgrade", old)
	}

	// The driver root of a driver container that was upgraded in place,
	// with the kernel module NVML answers for.
	const version = "570.86.10"
	upgradeDriver(t, root, version)
	lib.SystemGetDriverVersionFunc = func() (string, gonvml.Return) { return version, gonvml.SUCCESS }
	_, ctx := ktesting.NewTestContext(t)
	if err := e.drv.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	// A container of the prepared claim that restarts now gets the new
	// driver, and so does a claim prepared now.
	cdiIDs(t, e.prepare(t, allocatedClaim("uid-b", "gpu-2"))["uid-b"])
	for _, uid := range []string{"uid-a", "uid-b"} {
		mounts := specMounts(t, e, uid)
		if !slices.Contains(mounts, cditest.LibDir+"/libcuda.so."+version) || slices.Contains(mounts, old) {
			t.Errorf("claim %s after the upgrade mounts %v, want libcuda.so.%s and not the old one", uid, mounts, version)
		}
		if !slices.Contains(mounts, "/lib/firmware/nvidia/"+version+"/gsp_ga10x.bin") {
			t.Errorf("claim %s after the upgrade lacks the new GSP firmware: %v", uid, mounts)
		}
	}
}

func TestDeviceNodesThatAppearLaterAreGiven(t *testing.T) {
	var root string
	e := newEnvWith(t, "dgx-h100", "", func(c *Config) {
		root, _ = withDriverRoot(t, "dgx-h100", c)
	})
	// /dev/nvidia-uvm exists once the nvidia-uvm module is loaded, which
	// may be after the plugin started.
	uvm := filepath.Join(root, "dev/nvidia-uvm")
	if err := os.Remove(uvm); err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	if err := e.drv.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	ids := cdiIDs(t, e.prepare(t, allocatedClaim("uid-a", "gpu-0"))["uid-a"])
	if _, nodes := e.containerOf(t, ids...); slices.Contains(nodes, "nvidia-uvm") {
		t.Fatalf("nvidia-uvm given before it exists: %v", nodes)
	}
	cditest.MakeDeviceNode(t, root, "nvidia-uvm", 511, 0)
	if err := e.drv.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if _, nodes := e.containerOf(t, ids...); !slices.Contains(nodes, "nvidia-uvm") {
		t.Errorf("prepared claim's container devices %v after nvidia-uvm appeared, want it", nodes)
	}
}

// withDriverRoot is withDriver returning the fake driver root and its NVML.
func withDriverRoot(t *testing.T, profile string, c *Config) (string, *mock.Interface) {
	p, err := sim.LoadBuiltin(profile)
	if err != nil {
		t.Fatal(err)
	}
	var uuids []string
	for _, d := range p.Inventory(node).Devices {
		uuids = append(uuids, d.UUID)
	}
	root := cditest.DriverRoot(t, len(uuids))
	_, ctx := ktesting.NewTestContext(t)
	lib := cditest.NVML(uuids...)
	edits, err := cdi.NewNVIDIA(ctx, lib, cdi.DriverRoots{Driver: root})
	if err != nil {
		t.Fatal(err)
	}
	c.DriverEdits = edits
	return root, lib
}

// watchedMIG is a migSwitch whose health watch says when it starts.
type watchedMIG struct {
	*migSwitch
	started chan struct{}
}

func (w *watchedMIG) WatchHealth(ctx context.Context, events chan<- gpu.HealthEvent) error {
	w.started <- struct{}{}
	<-ctx.Done()
	return nil
}

func TestMIGModeChangeRestartsTheHealthWatch(t *testing.T) {
	var w *watchedMIG
	e := newEnvWith(t, "hgx-pcie-pairs", "", func(c *Config) {
		w = &watchedMIG{migSwitch: &migSwitch{Backend: c.Backend.(*sim.Backend)}, started: make(chan struct{})}
		c.Backend = w
	})
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go e.drv.watchHealth(ctx)
	<-w.started
	// GPU 2 was reset into MIG mode: the watch follows the new set of
	// GPUs, and its ending is no failure.
	w.mig = true
	if err := e.drv.refresh(ctx); err != nil {
		t.Fatal(err)
	}
	<-w.started
	if tainted, _ := unmonitoredTaints(e.pub.published[len(e.pub.published)-1]); tainted != 0 {
		t.Errorf("a restarted watch tainted %d GPUs unmonitored", tainted)
	}
	e.drv.mu.Lock()
	unmonitored := e.drv.unmonitored
	e.drv.mu.Unlock()
	if unmonitored != "" {
		t.Errorf("restarting the watch marked the node unmonitored: %s", unmonitored)
	}
}

// gputopo_plugin_unhealthy_devices counts the published GPUs that are
// unhealthy, and gputopo_plugin_published_devices the GPUs published.
func TestUnhealthyDevicesGauge(t *testing.T) {
	e := newEnvWith(t, "dgx-h100", "", func(c *Config) { c.Metrics = NewMetrics(prometheus.NewRegistry()) })
	_, ctx := ktesting.NewTestContext(t)
	unhealthy := func() float64 { return testutil.ToFloat64(e.drv.cfg.Metrics.UnhealthyDevices) }
	if got, want := testutil.ToFloat64(e.drv.cfg.Metrics.PublishedDevices), float64(len(e.drv.inv.Devices)); got != want || want != 8 {
		t.Errorf("published_devices = %v, want %v of 8", got, want)
	}
	if got := unhealthy(); got != 0 {
		t.Errorf("all GPUs healthy: unhealthy_devices = %v, want 0", got)
	}
	for _, i := range []int{3, 5} {
		if err := e.drv.applyHealth(ctx, gpu.HealthEvent{UUID: e.drv.inv.Devices[i].UUID, Reason: "XID-79"}); err != nil {
			t.Fatal(err)
		}
	}
	if got := unhealthy(); got != 2 {
		t.Errorf("two GPUs with Xid 79: unhealthy_devices = %v, want 2", got)
	}
	if err := e.drv.applyHealth(ctx, gpu.HealthEvent{UUID: e.drv.inv.Devices[3].UUID, Healthy: true}); err != nil {
		t.Fatal(err)
	}
	if got := unhealthy(); got != 1 {
		t.Errorf("one GPU healed: unhealthy_devices = %v, want 1", got)
	}
}
