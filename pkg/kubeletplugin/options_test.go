package kubeletplugin

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2/ktesting"

	"github.com/gputopo/gputopo/pkg/cdi"
	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
)

// hookScript writes a stand-in nvidia-cdi-hook that knows commands: it
// lists them in --help as urfave/cli does and fails on any other.
func hookScript(t *testing.T, dir, version string, commands ...string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("#!/bin/sh\ncase \"$1\" in\n--version) echo \"NVIDIA CDI Hook version " + version + "\" ;;\n--help) printf 'COMMANDS:\\n")
	for _, c := range commands {
		b.WriteString("   " + c + "  does something\\n")
	}
	b.WriteString("\\n' ;;\n")
	var runnable []string
	for _, c := range commands {
		if !strings.Contains(c, ",") {
			runnable = append(runnable, c)
		}
	}
	b.WriteString(strings.Join(runnable, "|") + ") exit 0 ;;\n*) exit 3 ;;\nesac\n")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, cdi.HookName)
	if err := os.WriteFile(p, []byte(b.String()), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestHookInstallsTheShippedOne(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	shipped := hookScript(t, filepath.Join(t.TempDir(), "image"), "v1.19.1", cdi.HookCommands...)
	o := NewOptions()
	o.PluginsDir, o.HookSource = t.TempDir(), shipped
	roots, err := o.Hook(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(o.PluginDir(), cdi.HookName)
	if roots.HookPath != want || len(roots.DisabledHooks) != 0 {
		t.Errorf("hook %s with %v disabled, want the shipped one installed at %s with none disabled", roots.HookPath, roots.DisabledHooks, want)
	}
	installed, err := os.ReadFile(want)
	if err != nil {
		t.Fatal(err)
	}
	if src, _ := os.ReadFile(shipped); string(src) != string(installed) {
		t.Error("installed hook differs from the shipped one")
	}

	// A print mode changes nothing on the machine: it names the shipped
	// program where it is.
	o = NewOptions()
	o.PluginsDir, o.HookSource, o.PrintCDISpec = t.TempDir(), shipped, "gpu-0"
	roots, err = o.Hook(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if roots.HookPath != shipped {
		t.Errorf("print mode: hook %s, want the shipped %s", roots.HookPath, shipped)
	}
	if entries, _ := os.ReadDir(o.PluginsDir); len(entries) != 0 {
		t.Errorf("print mode wrote %v", entries)
	}
}

func TestHookOfTheHostIsCheckedAndOlderHooksAreLeftOut(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	host := t.TempDir()
	// The GPU Operator's hook lies outside the driver root; the chart
	// mounts its directory for the plugin.
	seen := hookScript(t, filepath.Join(host, "usr/local/nvidia/toolkit"), "1.16.2", "update-ldcache", "create-symlinks", "help, h")
	o := NewOptions()
	o.DriverRoot, o.ContainerDriverRoot = "/run/nvidia/driver", t.TempDir()
	o.CDIHookPath, o.ContainerHookPath = "/usr/local/nvidia/toolkit/nvidia-cdi-hook", seen
	roots, err := o.Hook(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if roots.HookPath != o.CDIHookPath {
		t.Errorf("specs run %s, want the host path %s", roots.HookPath, o.CDIHookPath)
	}
	if diff := cmp.Diff([]string{"enable-cuda-compat", "disable-device-node-modification"}, roots.DisabledHooks); diff != "" {
		t.Errorf("disabled hooks (-want +got):\n%s", diff)
	}
}

func TestHookThatIsNotThereIsAStartupError(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	o := NewOptions()
	o.DriverRoot = t.TempDir()
	o.CDIHookPath = filepath.Join(o.DriverRoot, "usr/bin/nvidia-cdi-hook")
	_, err := o.Hook(ctx)
	if !errors.Is(err, cdi.ErrHookUnusable) || !strings.Contains(err.Error(), o.CDIHookPath) || !strings.Contains(err.Error(), "leave --nvidia-cdi-hook-path empty") {
		t.Errorf("missing host hook: %v, want ErrHookUnusable naming the path and the way out", err)
	}

	o = NewOptions()
	o.PluginsDir, o.HookSource = t.TempDir(), filepath.Join(t.TempDir(), cdi.HookName)
	if _, err := o.Hook(ctx); !errors.Is(err, cdi.ErrHookUnusable) || !strings.Contains(err.Error(), "--cdi-hook-source") {
		t.Errorf("missing shipped hook: %v, want ErrHookUnusable naming --cdi-hook-source", err)
	}
}

func TestValidateHookFlags(t *testing.T) {
	o := NewOptions()
	o.NodeName = "n"
	o.ContainerHookPath = "/host-hook/nvidia-cdi-hook"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--container-cdi-hook-path needs --nvidia-cdi-hook-path") {
		t.Errorf("Validate = %v, want the container path refused without a host path", err)
	}
	o.CDIHookPath = "relative/nvidia-cdi-hook"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--nvidia-cdi-hook-path must be an absolute path") {
		t.Errorf("Validate = %v, want a relative hook path refused", err)
	}
}

func mustProfile(t *testing.T) *sim.Profile {
	t.Helper()
	p, err := sim.LoadBuiltin("pcie-only")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestMPSControlPath: real GPUs look for the control program in the driver
// root as the plugin sees it, unless the flag names one; simulated GPUs
// run no daemon unless it does; a relative path is refused. The manager
// sets compute modes through the backend.
func TestMPSControlPath(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	for name, tc := range map[string]struct {
		backend, flag string
		want          string // "" for no manager
	}{
		"nvml default": {"nvml", "", "/driver-root/usr/bin/nvidia-cuda-mps-control"},
		"nvml flag":    {"nvml", "/driver-root/opt/bin/nvidia-cuda-mps-control", "/driver-root/opt/bin/nvidia-cuda-mps-control"},
		"sim default":  {"sim", "", ""},
		"sim stand-in": {"sim", "/opt/stand-in", "/opt/stand-in"},
	} {
		o := NewOptions()
		o.Backend, o.MPSControlPath, o.PluginsDir = tc.backend, tc.flag, "/var/lib/kubelet/plugins"
		o.DriverRoot, o.ContainerDriverRoot, o.NVMLLibraryPath = "/run/nvidia/driver", "/driver-root", "/driver-root/usr/lib64/libnvidia-ml.so.1"
		backend := sim.New(mustProfile(t), "n")
		m, err := o.MPS(ctx, backend)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got := ""
		if m != nil {
			got = m.ControlPath()
			// The backend sets the shared GPUs' compute modes.
			if m.ComputeModes() != gpu.ComputeModes(backend) {
				t.Errorf("%s: compute modes set through %v, want the backend", name, m.ComputeModes())
			}
			if want := "/var/lib/kubelet/plugins/gpu.gputopo.dev/mps/GPU-1/pipe"; m.PipeDir("GPU-1") != want {
				t.Errorf("%s: pipe directory %s, want %s", name, m.PipeDir("GPU-1"), want)
			}
		}
		if got != tc.want {
			t.Errorf("%s: control program %q, want %q", name, got, tc.want)
		}
	}
	o := NewOptions()
	o.NodeName, o.MPSControlPath = "n", "nvidia-cuda-mps-control"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--mps-control-path must be an absolute path") {
		t.Errorf("relative --mps-control-path: %v, want refused", err)
	}
}

// TestMPSShmSize: --mps-shm-size takes a quantity (given to the tmpfs in
// bytes), a percentage of the node's memory, or nothing (a plain
// directory); anything else is refused at start, saying what it wants.
func TestMPSShmSize(t *testing.T) {
	for flag, want := range map[string]string{"": "", "1Gi": "1073741824", "512M": "512000000", "50%": "50%", "2Gi": "2147483648"} {
		o := NewOptions()
		o.NodeName, o.MPSShmSize = "n", flag
		if err := o.Validate(); err != nil {
			t.Errorf("--mps-shm-size=%q: %v", flag, err)
		}
		if got, err := o.mpsShmSize(); got != want || err != nil {
			t.Errorf("--mps-shm-size=%q: tmpfs size %q (%v), want %q", flag, got, err, want)
		}
	}
	for _, flag := range []string{"0", "-1Gi", "lots", "150%", "1.5%"} {
		o := NewOptions()
		o.NodeName, o.MPSShmSize = "n", flag
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--mps-shm-size=\""+flag+"\": want a quantity like 1Gi") {
			t.Errorf("--mps-shm-size=%q: %v, want refused saying what it wants", flag, err)
		}
	}
}

// --profile-file: a simulated profile of one's own (the format of
// pkg/gpu/sim/profiles/) gives the plugin that node's GPUs and NVLink
// graph; it excludes --profile, applies to --backend=sim only, and a file
// that is not a valid profile is refused naming it.
func TestProfileFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "my-node.yaml")
	profile := `name: my-node
productName: Example GPU
architecture: hopper
cudaComputeCapability: "9.0"
driverVersion: "550.54.15"
cudaDriverVersion: "12.4"
memory: 80Gi
linkBandwidthGBps: 25
gpus: 4
numaNodes: 1
pcieRoots: 2
nvlink:
- [0, 2, 0, 0]
- [2, 0, 0, 0]
- [0, 0, 0, 4]
- [0, 0, 4, 0]
`
	if err := os.WriteFile(file, []byte(profile), 0o600); err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	o := NewOptions()
	o.Backend, o.ProfileFile, o.NodeName = "sim", file, "n"
	if err := o.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	b, err := o.NewBackend(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := b.Discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var products []string
	for _, d := range inv.Devices {
		products = append(products, d.ProductName)
	}
	if diff := cmp.Diff([]string{"Example GPU", "Example GPU", "Example GPU", "Example GPU"}, products); diff != "" {
		t.Errorf("GPUs of the profile file (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]gpu.Link{{A: 0, B: 1, Count: 2}, {A: 2, B: 3, Count: 4}}, inv.Links); diff != "" {
		t.Errorf("NVLink graph of the profile file (-want +got):\n%s", diff)
	}

	both := NewOptions()
	both.Backend, both.Profile, both.ProfileFile, both.NodeName = "sim", "dgx-h100", file, "n"
	if err := both.Validate(); err == nil || !strings.Contains(err.Error(), "exactly one of --profile or --profile-file") {
		t.Errorf("--profile and --profile-file: Validate = %v, want refused", err)
	}
	onNVML := NewOptions()
	onNVML.ProfileFile, onNVML.NodeName = file, "n"
	if err := onNVML.Validate(); err == nil || !strings.Contains(err.Error(), "only apply to --backend=sim") {
		t.Errorf("--profile-file with --backend=nvml: Validate = %v, want refused", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte(strings.Replace(profile, "[0, 2, 0, 0]", "[0, 1, 0, 0]", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	o.ProfileFile = bad
	if _, err := o.NewBackend(ctx); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "not symmetric") {
		t.Errorf("an asymmetric NVLink matrix: NewBackend = %v, want an error naming the file and the problem", err)
	}
}
