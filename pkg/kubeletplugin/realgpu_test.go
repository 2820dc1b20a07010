package kubeletplugin

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/mps"
	"github.com/gputopo/gputopo/pkg/topology"
)

// TestMain lets this test binary start MPS control daemons as the
// plugin's binary does: re-run as their launcher (mps.Launch).
func TestMain(m *testing.M) {
	mps.Launch()
	os.Exit(m.Run())
}

// Environment of TestRealGPUShareThroughMPS, which only a machine with an
// NVIDIA GPU, its driver and root runs (docs/hardware.md says how).
const (
	envRealGPU     = "GPUTOPO_TEST_REAL_GPU"     // "1" runs it
	envRealArgs    = "GPUTOPO_TEST_PLUGIN_ARGS"  // the plugin's flags, e.g. --backend=nvml --mps-control-path=...
	envRealClient  = "GPUTOPO_TEST_CUDA_CLIENT"  // a shell command that runs CUDA work and prints what it computed
	envRealExpects = "GPUTOPO_TEST_CUDA_EXPECTS" // what the client must print
)

// realGPUOptions skips a test unless envRealGPU is set, and gives it the
// plugin's options from envRealArgs.
func realGPUOptions(t *testing.T) (context.Context, *Options) {
	t.Helper()
	if os.Getenv(envRealGPU) != "1" {
		t.Skipf("needs an NVIDIA GPU, its driver and root: set %s=1 (docs/hardware.md)", envRealGPU)
	}
	_, ctx := ktesting.NewTestContext(t)
	o := NewOptions()
	fs := pflag.NewFlagSet("plugin", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(strings.Fields(os.Getenv(envRealArgs))); err != nil {
		t.Fatal(err)
	}
	if err := o.Validate(); err != nil {
		t.Fatal(err)
	}
	return ctx, o
}

// realGPUBackend is the backend the options give, closed with the test.
func realGPUBackend(t *testing.T, ctx context.Context, o *Options) gpu.Backend {
	t.Helper()
	backend, err := o.NewBackend(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = backend.Close() })
	return backend
}

// TestRealGPUShareThroughMPS prepares two shares of a real GPU the way the
// plugin does on a node (its own flags, NVML, the NVIDIA driver's CDI
// edits, MPS through the plugin's launcher): the first share starts the
// GPU's MPS control daemon and puts the GPU in EXCLUSIVE_PROCESS; a CUDA
// client given the share's environment, in a mount namespace whose
// /dev/shm is the daemon's (as the share's container gets it), computes
// its result through an MPS server of that daemon, under the default
// limits of the smaller share; unpreparing both stops the daemon and
// gives the GPU its compute mode back.
func TestRealGPUShareThroughMPS(t *testing.T) {
	ctx, o := realGPUOptions(t)
	dir := t.TempDir()
	client, expects := os.Getenv(envRealClient), os.Getenv(envRealExpects)
	if client == "" || expects == "" {
		t.Fatalf("set %s to a CUDA program and %s to what it prints", envRealClient, envRealExpects)
	}
	// The test's plugin directory is its own: it removes it at the end, so
	// it must not be a running plugin's.
	if _, err := os.Stat(o.PluginDir()); err == nil {
		t.Fatalf("%s exists: a plugin runs or ran on this machine; give the test another --kubelet-plugins-directory-path", o.PluginDir())
	}
	if err := os.MkdirAll(o.PluginDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(o.PluginDir()) })
	backend := realGPUBackend(t, ctx, o)
	edits, err := o.NewDriverEdits(ctx, backend)
	if err != nil {
		t.Fatal(err)
	}
	daemons, err := o.MPS(ctx, backend)
	if err != nil || daemons == nil {
		t.Fatalf("MPS manager: %v, %v", daemons, err)
	}
	// Before the directory goes (cleanups run last first): whatever
	// failed, no daemon outlives the test and the GPU gets its mode back.
	t.Cleanup(func() { _ = daemons.Sync(ctx, nil) })
	mapping, err := o.LabelMapping.Mapping(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{NodeName: node, Backend: backend, Slices: o.SliceConfig(mapping), DriverEdits: edits, MPS: daemons,
		CDIRoot: filepath.Join(dir, "cdi"), PluginDir: o.PluginDir()}
	d, err := New(ctx, cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.setPublisher(ctx, &recorder{}); err != nil {
		t.Fatal(err)
	}
	e := &env{dir: dir, drv: d}
	if len(d.inv.Devices) == 0 {
		t.Fatal("no GPU discovered")
	}
	uuid := d.inv.Devices[0].UUID
	modes := backend.(gpu.ComputeModes)
	before, err := modes.ComputeMode(uuid)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gpu-0 %s (%s), compute mode %s", uuid, d.inv.Devices[0].ProductName, before)

	res := e.prepare(t, sharedClaim("real-q", "gpu-0", 250, ""), sharedClaim("real-h", "gpu-0", 500, "10Gi"))
	for uid, r := range res {
		if r.Err != nil {
			t.Fatalf("prepare %s: %v", uid, r.Err)
		}
	}
	pid := daemons.Running(uuid)
	if pid == 0 {
		t.Fatal("two shares prepared: no MPS control daemon runs for gpu-0")
	}
	if m, err := modes.ComputeMode(uuid); err != nil || m != gpu.ComputeModeExclusiveProcess {
		t.Errorf("with shares: compute mode %s (%v), want %s", m, err, gpu.ComputeModeExclusiveProcess)
	}
	control := func(cmd string) string {
		t.Helper()
		c := exec.Command(daemons.ControlPath())
		c.Env = append(os.Environ(), "CUDA_MPS_PIPE_DIRECTORY="+daemons.PipeDir(uuid))
		c.Stdin = strings.NewReader(cmd + "\n")
		out, err := c.CombinedOutput()
		if err != nil {
			t.Errorf("%s: %v: %s", cmd, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if got := control("get_default_active_thread_percentage"); !strings.HasPrefix(got, "25") {
		t.Errorf("daemon's default active thread percentage %q, want 25 (the smaller share)", got)
	}

	// The share's container environment, with the daemon's directories as
	// the host has them.
	shareEnv := e.injected(t, cdiIDs(t, res["real-q"]))
	var clientEnv, mpsEnv []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CUDA_MPS_") {
			clientEnv = append(clientEnv, kv)
		}
	}
	for k, v := range shareEnv {
		if strings.HasPrefix(k, "CUDA_MPS_") {
			if k == topology.EnvMPSPipeDirectory {
				v = daemons.PipeDir(uuid)
			}
			mpsEnv = append(mpsEnv, k+"="+v)
		}
	}
	clientEnv = append(clientEnv, mpsEnv...)
	shm := daemons.ShmDir(uuid)
	run := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c", `mount --bind "$0" /dev/shm && exec sh -c "$1"`, shm, client)
	run.Env = clientEnv
	var out bytes.Buffer
	run.Stdout, run.Stderr = &out, &out
	start := time.Now()
	err = run.Run()
	t.Logf("CUDA client in %s (env %v):\n%s", time.Since(start).Round(time.Millisecond), mpsEnv, out.String())
	if err != nil || !strings.Contains(out.String(), expects) {
		t.Errorf("CUDA client through the share: %v; want %q in its output", err, expects)
		for _, log := range []string{"control.log", "server.log"} {
			data, _ := os.ReadFile(filepath.Join(daemons.LogDir(uuid), log))
			t.Logf("MPS %s:\n%s", log, data)
		}
	}
	if got := control("get_server_list"); got == "" {
		t.Error("after the client ran, the daemon lists no MPS server: the client did not go through MPS")
	} else {
		t.Logf("MPS servers of gpu-0's daemon: %s", got)
	}

	unprep, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: types.UID("real-q")}, {UID: types.UID("real-h")}})
	if err != nil {
		t.Fatal(err)
	}
	for uid, err := range unprep {
		if err != nil {
			t.Fatalf("unprepare %s: %v", uid, err)
		}
	}
	for deadline := time.Now().Add(30 * time.Second); daemons.Running(uuid) != 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("both shares unprepared: daemon %d still runs", pid)
		}
	}
	if m, err := modes.ComputeMode(uuid); err != nil || m != before {
		t.Errorf("after the last share: compute mode %s (%v), want %s back", m, err, before)
	}
}

// TestRealGPUHealthWatch runs the plugin's health watch on a real GPU's
// NVML for a few seconds: it registers for the GPUs' events and reports
// itself active with GPUs registered (not "not supported"), reports no GPU
// unhealthy and no failing watch while nothing happens, and ends when told.
func TestRealGPUHealthWatch(t *testing.T) {
	ctx, o := realGPUOptions(t)
	backend := realGPUBackend(t, ctx, o)
	if _, err := backend.Discover(ctx); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	events := make(chan gpu.HealthEvent, 16)
	done := make(chan error, 1)
	go func() { done <- backend.WatchHealth(ctx, events) }()
	deadline := time.After(5 * time.Second)
	active := false
	for !active {
		select {
		case ev := <-events:
			t.Logf("health event %+v", ev)
			if ev.Watch != gpu.WatchActive || ev.Message != "" {
				t.Fatalf("first health event %+v, want the watch active with GPUs registered", ev)
			}
			active = true
		case err := <-done:
			t.Fatalf("the watch ended before it was active: %v", err)
		case <-deadline:
			t.Fatal("no health event in 5 s")
		}
	}
	quiet := time.After(3 * time.Second)
	for waiting := true; waiting; {
		select {
		case ev := <-events:
			t.Errorf("with nothing happening the watch reported %+v", ev)
		case <-quiet:
			waiting = false
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the watch ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("the watch did not end 10 s after it was told")
	}
}
