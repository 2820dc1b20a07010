package cdi

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/google/go-cmp/cmp"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gputopo/gputopo/pkg/cdi/cditest"
)

const (
	fakeDriverVersion = cditest.DriverVersion
	gpuUUID0          = "GPU-5b1c7e2a-0000-4a6e-9d3f-3c2b1a000000"
	gpuUUID1          = "GPU-5b1c7e2a-1111-4a6e-9d3f-3c2b1a111111"
)

func fakeDriverRoot(t *testing.T) string { return cditest.DriverRoot(t, 2) }

func fakeNVML() *mock.Interface { return cditest.NVML(gpuUUID0, gpuUUID1) }

func newTestNVIDIA(t *testing.T, roots DriverRoots) DriverEdits {
	t.Helper()
	e, err := NewNVIDIA(context.Background(), fakeNVML(), roots)
	if err != nil {
		t.Fatalf("NewNVIDIA: %v", err)
	}
	return e
}

func mountTargets(e *cdispec.ContainerEdits) []string {
	var out []string
	for _, m := range e.Mounts {
		out = append(out, m.ContainerPath)
	}
	slices.Sort(out)
	return out
}

func nodePaths(e *cdispec.ContainerEdits) (paths, hostPaths []string) {
	for _, d := range e.DeviceNodes {
		paths = append(paths, d.Path)
		h := d.HostPath
		if h == "" {
			h = d.Path
		}
		hostPaths = append(hostPaths, h)
	}
	slices.Sort(paths)
	slices.Sort(hostPaths)
	return paths, hostPaths
}

func hookArgs(e *cdispec.ContainerEdits) map[string]string {
	out := map[string]string{}
	for _, h := range e.Hooks {
		if len(h.Args) > 1 {
			out[h.Args[1]] = h.Path
		}
	}
	return out
}

func TestDriverEditsFromADriverRoot(t *testing.T) {
	root := fakeDriverRoot(t)
	e := newTestNVIDIA(t, DriverRoots{Driver: root, HookPath: "/opt/toolkit/nvidia-cdi-hook"})

	common, err := e.Common()
	if err != nil {
		t.Fatalf("Common: %v", err)
	}
	lib := "/usr/lib/x86_64-linux-gnu/"
	wantMounts := []string{
		"/lib/firmware/nvidia/" + fakeDriverVersion + "/gsp_ga10x.bin",
		"/run/nvidia-persistenced/socket",
		"/usr/bin/nvidia-persistenced",
		"/usr/bin/nvidia-smi",
		lib + "libcuda.so." + fakeDriverVersion,
		lib + "libnvidia-ml.so." + fakeDriverVersion,
		lib + "libnvidia-ptxjitcompiler.so." + fakeDriverVersion,
	}
	if diff := cmp.Diff(wantMounts, mountTargets(common)); diff != "" {
		t.Errorf("mounts (-want +got):\n%s", diff)
	}
	for _, m := range common.Mounts {
		if _, err := os.Stat(m.HostPath); err != nil {
			t.Errorf("mount %s: host path: %v", m.ContainerPath, err)
		}
	}
	// Only the control nodes that exist: a missing nvidia-uvm-tools must
	// not make every container fail to start.
	paths, hostPaths := nodePaths(common)
	if diff := cmp.Diff([]string{"/dev/nvidia-uvm", "/dev/nvidiactl"}, paths); diff != "" {
		t.Errorf("control device nodes (-want +got):\n%s", diff)
	}
	for _, p := range hostPaths {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("device node %s: %v", p, err)
		}
	}
	hooks := hookArgs(common)
	for _, h := range []string{"create-symlinks", "update-ldcache"} {
		if hooks[h] != "/opt/toolkit/nvidia-cdi-hook" {
			t.Errorf("hook %s runs %q, want the configured nvidia-cdi-hook (hooks: %v)", h, hooks[h], hooks)
		}
	}
	if !slices.Contains(common.Env, "NVIDIA_VISIBLE_DEVICES=void") {
		t.Errorf("env %v lacks NVIDIA_VISIBLE_DEVICES=void", common.Env)
	}

	dev, err := e.Device(gpuUUID1)
	if err != nil {
		t.Fatalf("Device: %v", err)
	}
	if paths, _ := nodePaths(dev); !slices.Equal(paths, []string{"/dev/nvidia1"}) {
		t.Errorf("GPU 1 device nodes = %v, want [/dev/nvidia1]", paths)
	}
	if _, err := e.Device("GPU-99999999-9999-9999-9999-999999999999"); err == nil || !strings.Contains(err.Error(), "GPU-99999999") {
		t.Errorf("Device of an unknown GPU: error %v, want one naming it", err)
	}

	// The spec built from these edits is one the CDI library accepts.
	w, _ := newTestWriter(t)
	if _, err := w.WriteClaimSpec(ClaimSpec{ClaimUID: uidA, Devices: []DeviceEdits{{Name: "gpu-1", UUID: gpuUUID1, Edits: dev}}, Driver: common}); err != nil {
		t.Fatalf("WriteClaimSpec: %v", err)
	}
	if _, err := cdiapi.ReadSpec(w.SpecPath(uidA), 0); err != nil {
		t.Errorf("ReadSpec: %v", err)
	}
}

func TestDriverEditsSeenFromAContainer(t *testing.T) {
	// The plugin sees the GPU Operator's /run/nvidia/driver at a mount
	// point; specs must name the host's paths.
	root := fakeDriverRoot(t)
	e := newTestNVIDIA(t, DriverRoots{Driver: "/run/nvidia/driver", ContainerDriver: root})
	common, err := e.Common()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range common.Mounts {
		if !strings.HasPrefix(m.HostPath, "/run/nvidia/driver/") || strings.Contains(m.HostPath, root) {
			t.Errorf("mount %s has host path %s, want one under /run/nvidia/driver", m.ContainerPath, m.HostPath)
		}
	}
	dev, err := e.Device(gpuUUID0)
	if err != nil {
		t.Fatal(err)
	}
	paths, hostPaths := nodePaths(dev)
	if !slices.Equal(paths, []string{"/dev/nvidia0"}) || !slices.Equal(hostPaths, []string{"/run/nvidia/driver/dev/nvidia0"}) {
		t.Errorf("device node %v on host %v, want /dev/nvidia0 from /run/nvidia/driver/dev/nvidia0", paths, hostPaths)
	}
	if hooks := hookArgs(common); hooks["update-ldcache"] != DefaultHookPath {
		t.Errorf("update-ldcache runs %q, want the default %s", hooks["update-ldcache"], DefaultHookPath)
	}
}

func TestNewNVIDIARejectsAMissingRoot(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope")
	_, err := NewNVIDIA(context.Background(), fakeNVML(), DriverRoots{Driver: missing})
	if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("NewNVIDIA error = %v, want one naming %s", err, missing)
	}
}

func TestDriverRootsLocal(t *testing.T) {
	r := DriverRoots{Driver: "/run/nvidia/driver", ContainerDriver: "/driver-root"}
	for in, want := range map[string]string{
		"/run/nvidia/driver":         "/driver-root",
		"/run/nvidia/driver/dev":     "/driver-root/dev",
		"/dev":                       "/dev",
		"/run/nvidia/driver-other/x": "/run/nvidia/driver-other/x",
	} {
		if got := r.Local(in); got != want {
			t.Errorf("Local(%q) = %q, want %q", in, got, want)
		}
	}
	if got := (DriverRoots{}).Local("/usr/bin/x"); got != "/usr/bin/x" {
		t.Errorf("default roots: Local = %q", got)
	}
}

func TestNVMLLibraryFoundUnderTheDriverRoot(t *testing.T) {
	root := fakeDriverRoot(t)
	got, err := DriverRoots{Driver: "/run/nvidia/driver", ContainerDriver: root}.NVMLLibrary(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(root, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so."+fakeDriverVersion); got != want {
		t.Errorf("NVMLLibrary = %s, want %s", got, want)
	}
	if _, err := (DriverRoots{Driver: t.TempDir()}).NVMLLibrary(context.Background()); err == nil {
		t.Error("an empty driver root has no libnvidia-ml.so.1, want an error")
	}
}
