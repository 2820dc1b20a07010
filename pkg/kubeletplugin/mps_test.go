package kubeletplugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/mps"
	"github.com/gputopo/gputopo/pkg/mps/mpstest"
	"github.com/gputopo/gputopo/pkg/topology"
)

// mpsEnv is a plugin whose shared GPUs get daemons of the stand-in control
// program, recording to record.
type mpsEnv struct {
	*env
	record string
	seen   int
}

func newMPSEnv(t *testing.T, dir string) *mpsEnv {
	t.Helper()
	record := filepath.Join(dir, "mps-record")
	control, err := mpstest.Write(dir, record)
	if err != nil {
		t.Fatal(err)
	}
	m, err := mps.New(mps.Config{ControlPath: control, Root: filepath.Join(dir, "plugin", "mps"), StopTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, ctx := ktesting.NewTestContext(t)
		_ = m.Sync(ctx, nil)
	})
	e := newEnvWith(t, "dgx-h100", dir, func(c *Config) { c.MPS = m })
	return &mpsEnv{env: e, record: record}
}

// events are the stand-in's records since the last call, as "kind GPU
// [command]" (the directories are checked once, in the first start).
func (e *mpsEnv) events(t *testing.T) []string {
	t.Helper()
	all, err := mpstest.Read(e.record)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, ev := range all[e.seen:] {
		out = append(out, strings.TrimSpace(ev.Kind+" "+ev.VisibleDevices+" "+ev.Command))
	}
	e.seen = len(all)
	return out
}

// waitEvents waits for n more records (a stopped daemon records its exit
// as it ends) and returns them.
func (e *mpsEnv) waitEvents(t *testing.T, n int) []string {
	t.Helper()
	var got []string
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < n && time.Now().Before(deadline) {
		got = append(got, e.events(t)...)
		time.Sleep(20 * time.Millisecond)
	}
	return append(got, e.events(t)...)
}

// mountsOf resolves CDI IDs as a runtime does and returns the container's
// mounts, container path to host path.
func (e *env) mountsOf(t *testing.T, ids []string) map[string]string {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(filepath.Join(e.dir, "cdi")), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &ociSpec{}
	if _, err := cache.InjectDevices(spec.oci(), ids...); err != nil {
		t.Fatalf("inject %v: %v", ids, err)
	}
	out := map[string]string{}
	for _, m := range spec.s.Mounts {
		out[m.Destination] = m.Source
	}
	return out
}

// TestSharedGPUsGetAnMPSDaemon: the first share of a GPU starts its MPS
// daemon (for that GPU, with its own pipe directory) before the spec that
// mounts the pipe directory is written; a second share of the GPU reuses
// the daemon and lowers its default limits to the smaller share; a whole
// GPU's container gets no pipe directory; another shared GPU gets its own
// daemon; a whole-GPU claim that landed on a shared GPU (all its milliGPU)
// gets none; a claim with shares of two GPUs is refused and starts nothing;
// the last share unprepared stops the daemon. A restarted plugin keeps the
// running daemon and starts again one that died.
func TestSharedGPUsGetAnMPSDaemon(t *testing.T) {
	dir := t.TempDir()
	e := newMPSEnv(t, dir)
	uuid := func(i int) string { return e.drv.inv.Devices[i].UUID }
	m := e.drv.cfg.MPS

	res := e.prepare(t, sharedClaim("q1", "gpu-0", 250, ""))
	all, err := mpstest.Read(e.record)
	if err != nil || len(all) == 0 {
		t.Fatalf("first share: stand-in record %v, %v; want a start", all, err)
	}
	if want := (mpstest.Event{Kind: mpstest.Start, VisibleDevices: uuid(0), PipeDir: m.PipeDir(uuid(0)), LogDir: m.LogDir(uuid(0)), PID: all[0].PID}); all[0] != want {
		t.Errorf("first share: daemon started as %+v, want %+v", all[0], want)
	}
	if diff := cmp.Diff([]string{
		"start " + uuid(0),
		"command " + uuid(0) + " set_default_active_thread_percentage 25",
		"command " + uuid(0) + " set_default_device_pinned_mem_limit 0 20480M",
	}, e.events(t)); diff != "" {
		t.Errorf("first share (-want +got):\n%s", diff)
	}
	ids := cdiIDs(t, res["q1"])
	if got := e.mountsOf(t, ids)[topology.MPSContainerPipeDir]; got != m.PipeDir(uuid(0)) {
		t.Errorf("share's container: %s is mounted from %q, want %s", topology.MPSContainerPipeDir, got, m.PipeDir(uuid(0)))
	}
	env := e.injected(t, ids)
	for k, v := range map[string]string{topology.EnvMPSPipeDirectory: topology.MPSContainerPipeDir, topology.EnvMPSActiveThreadPercentage: "25"} {
		if env[k] != v {
			t.Errorf("share's container: %s=%q, want %q", k, env[k], v)
		}
	}
	pid := m.Running(uuid(0))

	res = e.prepare(t, sharedClaim("h2", "gpu-0", 500, "10Gi"), allocatedClaim("whole", "gpu-1"), sharedClaim("s2", "gpu-2", 100, ""))
	if diff := cmp.Diff([]string{
		"command " + uuid(0) + " set_default_active_thread_percentage 25",
		"command " + uuid(0) + " set_default_device_pinned_mem_limit 0 10240M",
		"start " + uuid(2),
		"command " + uuid(2) + " set_default_active_thread_percentage 10",
		"command " + uuid(2) + " set_default_device_pinned_mem_limit 0 8192M",
	}, e.events(t)); diff != "" {
		t.Errorf("second share, a whole GPU, a share of another GPU (-want +got):\n%s", diff)
	}
	if got := m.Running(uuid(0)); got != pid {
		t.Errorf("second share: daemon of gpu-0 is pid %d, want %d still", got, pid)
	}
	if _, ok := e.mountsOf(t, cdiIDs(t, res["whole"]))[topology.MPSContainerPipeDir]; ok {
		t.Errorf("a whole GPU's container has %s mounted", topology.MPSContainerPipeDir)
	}
	if got := e.mountsOf(t, cdiIDs(t, res["s2"]))[topology.MPSContainerPipeDir]; got != m.PipeDir(uuid(2)) {
		t.Errorf("gpu-2 share's container: pipe directory from %q, want %s", got, m.PipeDir(uuid(2)))
	}

	// A whole-GPU claim that landed on a shared GPU with no share takes all
	// of its milliGPU: held whole, with another GPU, and no daemon.
	pair := sharedClaim("pair", "gpu-5", 1000, "")
	pair.Status.Allocation.Devices.Results = append(pair.Status.Allocation.Devices.Results, allocatedClaim("", "gpu-6").Status.Allocation.Devices.Results[0])
	ids = cdiIDs(t, e.prepare(t, pair)["pair"])
	if got := e.events(t); len(got) != 0 {
		t.Errorf("a whole-GPU claim on a shared GPU: stand-in record %v, want nothing", got)
	}
	if _, ok := e.mountsOf(t, ids)[topology.MPSContainerPipeDir]; ok {
		t.Errorf("a whole-GPU claim on a shared GPU has %s mounted", topology.MPSContainerPipeDir)
	}

	two := sharedClaim("two", "gpu-3", 250, "")
	second := two.Status.Allocation.Devices.Results[0]
	second.Device = "gpu-4"
	two.Status.Allocation.Devices.Results = append(two.Status.Allocation.Devices.Results, second)
	if err := e.prepare(t, two)["two"].Err; err == nil || !strings.Contains(err.Error(), "shares of several GPUs") {
		t.Errorf("shares of two GPUs in one claim: %v, want refused", err)
	}
	if got := e.events(t); len(got) != 0 {
		t.Errorf("refused claim: stand-in record %v, want nothing", got)
	}

	_, ctx := ktesting.NewTestContext(t)
	unprepare := func(uids ...string) {
		t.Helper()
		var objs []kubeletplugin.NamespacedObject
		for _, u := range uids {
			objs = append(objs, kubeletplugin.NamespacedObject{UID: types.UID(u)})
		}
		res, err := e.drv.UnprepareResourceClaims(ctx, objs)
		if err != nil {
			t.Fatal(err)
		}
		for u, err := range res {
			if err != nil {
				t.Fatalf("unprepare %s: %v", u, err)
			}
		}
	}
	unprepare("q1")
	if got := m.Running(uuid(0)); got != pid {
		t.Errorf("one of two shares unprepared: daemon of gpu-0 is pid %d, want %d still", got, pid)
	}
	// gpu-0's defaults follow its remaining share.
	if diff := cmp.Diff([]string{
		"command " + uuid(0) + " set_default_active_thread_percentage 50",
		"command " + uuid(0) + " set_default_device_pinned_mem_limit 0 10240M",
	}, e.events(t)); diff != "" {
		t.Errorf("one of two shares unprepared (-want +got):\n%s", diff)
	}
	unprepare("h2")
	if diff := cmp.Diff([]string{"command " + uuid(0) + " quit", "exit " + uuid(0)}, e.waitEvents(t, 2)); diff != "" {
		t.Errorf("last share of gpu-0 unprepared (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(filepath.Dir(m.PipeDir(uuid(0)))); !errors.Is(err, os.ErrNotExist) || !strings.HasPrefix(m.PipeDir(uuid(0)), filepath.Join(dir, "plugin", "mps")) {
		t.Errorf("gpu-0's MPS directory after its daemon stopped: %v, want it gone", err)
	}

	// A restart keeps gpu-2's running daemon.
	pid2 := m.Running(uuid(2))
	restarted := newMPSEnv(t, dir)
	restarted.seen = e.seen
	if got := restarted.events(t); len(got) != 0 {
		t.Errorf("restart with a running daemon: stand-in record %v, want nothing", got)
	}
	// The daemon dies with the plugin's container; the next start runs it
	// again.
	pgid, err := syscall.Getpgid(pid2)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); m.Running(uuid(2)) != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("gpu-2's killed daemon still runs")
		}
	}
	again := newMPSEnv(t, dir)
	again.seen = restarted.seen
	got := again.events(t)
	if !slices.Contains(got, "start "+uuid(2)) || slices.Contains(got, "start "+uuid(0)) {
		t.Errorf("restart after gpu-2's daemon died: stand-in record %v, want gpu-2's daemon started again, and only it", got)
	}
}

// deniedModes is a backend's compute modes where the plugin may not set
// them (not root) while denied.
type deniedModes struct {
	*sim.Backend
	denied bool
}

func (d *deniedModes) SetComputeMode(uuid string, mode gpu.ComputeMode) error {
	if d.denied {
		return fmt.Errorf("set compute mode of GPU %s to %s: Insufficient Permissions", uuid, mode)
	}
	return d.Backend.SetComputeMode(uuid, mode)
}

// TestSharedGPUComputeMode: a share whose GPU cannot be set to
// EXCLUSIVE_PROCESS fails to prepare, saying so and what the plugin needs,
// and starts no daemon; one that can runs its GPU in EXCLUSIVE_PROCESS
// (others keep theirs) until its last share is unprepared.
func TestSharedGPUComputeMode(t *testing.T) {
	dir := t.TempDir()
	record := filepath.Join(dir, "mps-record")
	control, err := mpstest.Write(dir, record)
	if err != nil {
		t.Fatal(err)
	}
	var modes *deniedModes
	e := newEnvWith(t, "dgx-h100", dir, func(c *Config) {
		modes = &deniedModes{Backend: c.Backend.(*sim.Backend), denied: true}
		m, err := mps.New(mps.Config{ControlPath: control, Root: filepath.Join(dir, "plugin", "mps"), ComputeModes: modes, StopTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, ctx := ktesting.NewTestContext(t)
			_ = m.Sync(ctx, nil)
		})
		c.MPS = m
	})
	uuid := func(i int) string { return e.drv.inv.Devices[i].UUID }
	mode := func(i int) gpu.ComputeMode {
		m, err := modes.ComputeMode(uuid(i))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}

	err = e.prepare(t, sharedClaim("denied", "gpu-0", 250, ""))["denied"].Err
	if err == nil {
		t.Fatal("a share whose GPU's compute mode cannot be set: prepared")
	}
	for _, w := range []string{uuid(0), "Insufficient Permissions", "EXCLUSIVE_PROCESS", "root", "privileged"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("prepare error %q does not say %q", err, w)
		}
	}
	if events, _ := mpstest.Read(record); len(events) != 0 {
		t.Errorf("a daemon was started for the refused share: %v", events)
	}

	modes.denied = false
	if err := e.prepare(t, sharedClaim("q", "gpu-0", 250, ""))["q"].Err; err != nil {
		t.Fatal(err)
	}
	if mode(0) != gpu.ComputeModeExclusiveProcess || mode(1) != gpu.ComputeModeDefault {
		t.Errorf("with a share of gpu-0: compute modes %s and %s (gpu-0, gpu-1), want %s and %s", mode(0), mode(1), gpu.ComputeModeExclusiveProcess, gpu.ComputeModeDefault)
	}
	_, ctx := ktesting.NewTestContext(t)
	res, err := e.drv.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: "q"}})
	if err != nil || res["q"] != nil {
		t.Fatalf("unprepare: %v, %v", err, res)
	}
	if mode(0) != gpu.ComputeModeDefault {
		t.Errorf("after the last share of gpu-0: compute mode %s, want %s back", mode(0), gpu.ComputeModeDefault)
	}
}

// A node without the MPS control program serves whole GPUs; a share there
// fails to prepare, naming the program's path and the setting to change.
func TestMissingControlProgramRefusesSharesOnly(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "driver", "usr", "bin", "nvidia-cuda-mps-control")
	e := newEnvWith(t, "dgx-h100", dir, func(c *Config) {
		m, err := mps.New(mps.Config{ControlPath: missing, Root: filepath.Join(dir, "plugin", "mps"), StopTimeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		c.MPS = m
	})
	res := e.prepare(t, sharedClaim("share", "gpu-0", 250, ""), allocatedClaim("whole", "gpu-1"))
	err := res["share"].Err
	if !errors.Is(err, mps.ErrNoControl) {
		t.Fatalf("a share without the control program: %v, want %v", err, mps.ErrNoControl)
	}
	for _, w := range []string{"MPS control program not found: " + missing, "--mps-control-path", "nvml.mpsControlPath"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("prepare error %q does not say %q", err, w)
		}
	}
	if err := res["whole"].Err; err != nil {
		t.Errorf("a whole GPU on a node without the control program: %v", err)
	}
}
