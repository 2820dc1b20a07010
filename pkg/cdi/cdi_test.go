package cdi

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const (
	uidA = "0b7c6f0e-5d1a-4c3e-9f2b-111111111111"
	uidB = "9a8b7c6d-0000-4e5f-8a9b-222222222222"
)

// driverEdits stand in for DriverEdits.Common of a real node.
func driverEdits() *cdispec.ContainerEdits {
	return &cdispec.ContainerEdits{
		Env:         []string{"NVIDIA_VISIBLE_DEVICES=void"},
		DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/full"}},
		Mounts:      []*cdispec.Mount{{HostPath: "/usr/lib/libcuda.so.1", ContainerPath: "/usr/lib/libcuda.so.1", Options: []string{"ro", "bind"}}},
	}
}

func nodeEdits(path string) *cdispec.ContainerEdits {
	return &cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{{Path: path}}}
}

// claimA is a claim on real GPUs, devices out of name order to check that
// output is sorted.
func claimA() ClaimSpec {
	return ClaimSpec{
		ClaimUID: uidA,
		Devices: []DeviceEdits{
			{Name: "gpu-3", UUID: "GPU-3333", Edits: nodeEdits("/dev/zero"), Env: map[string]string{"GPUTOPO_NVLINK_DOMAIN_GPU_3": "nvl-0"}},
			{Name: "gpu-1", UUID: "GPU-1111", Edits: nodeEdits("/dev/null"), Env: map[string]string{"GPUTOPO_NVLINK_DOMAIN_GPU_1": "nvl-0"}},
		},
		Env: map[string]string{
			"GPUTOPO_SPINE":         "s1",
			"GPUTOPO_NVLINK_DOMAIN": "nvl-0",
			"GPUTOPO_LEAF":          "l2",
		},
		Driver: driverEdits(),
	}
}

// simulated has no device nodes at all, like a simulated GPU profile.
func simulated(uid string) ClaimSpec {
	return ClaimSpec{
		ClaimUID: uid,
		Devices:  []DeviceEdits{{Name: "gpu-0", UUID: "GPU-sim-0"}, {Name: "gpu-1", UUID: "GPU-sim-1"}},
	}
}

func newTestWriter(t *testing.T) (*Writer, string) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "cdi")
	w, err := NewWriter(root)
	if err != nil {
		t.Fatalf("NewWriter: %v", err)
	}
	return w, root
}

func TestNewWriterCreatesRoot(t *testing.T) {
	_, root := newTestWriter(t)
	if st, err := os.Stat(root); err != nil || !st.IsDir() {
		t.Fatalf("spec directory %s not created: %v", root, err)
	}
}

func TestWriteClaimSpecParsesAndValidates(t *testing.T) {
	w, _ := newTestWriter(t)
	ids, err := w.WriteClaimSpec(claimA())
	if err != nil {
		t.Fatalf("WriteClaimSpec: %v", err)
	}
	wantIDs := map[string][]string{
		"gpu-1": {"gputopo.dev/gpu=" + uidA + "-gpu-1"},
		"gpu-3": {"gputopo.dev/gpu=" + uidA + "-gpu-3"},
	}
	if diff := cmp.Diff(wantIDs, ids); diff != "" {
		t.Errorf("IDs (-want +got):\n%s", diff)
	}

	// ReadSpec parses and runs the library's full validation.
	spec, err := cdiapi.ReadSpec(w.SpecPath(uidA), 0)
	if err != nil {
		t.Fatalf("ReadSpec: %v", err)
	}
	if spec.GetVendor() != Vendor || spec.GetClass() != Class {
		t.Errorf("kind = %s/%s, want %s/%s", spec.GetVendor(), spec.GetClass(), Vendor, Class)
	}
	want := &cdispec.Spec{
		Version: spec.Version, // whatever the library deems minimal
		Kind:    "gputopo.dev/gpu",
		Devices: []cdispec.Device{
			{Name: uidA + "-gpu-1", ContainerEdits: cdispec.ContainerEdits{
				Env:         []string{"GPUTOPO_DEVICE_GPU_1=GPU-1111", "GPUTOPO_NVLINK_DOMAIN_GPU_1=nvl-0"},
				DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/null"}},
			}},
			{Name: uidA + "-gpu-3", ContainerEdits: cdispec.ContainerEdits{
				Env:         []string{"GPUTOPO_DEVICE_GPU_3=GPU-3333", "GPUTOPO_NVLINK_DOMAIN_GPU_3=nvl-0"},
				DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/zero"}},
			}},
		},
		ContainerEdits: cdispec.ContainerEdits{
			Env: []string{
				"NVIDIA_VISIBLE_DEVICES=void",
				"GPUTOPO_LEAF=l2",
				"GPUTOPO_NVLINK_DOMAIN=nvl-0",
				"GPUTOPO_SPINE=s1",
			},
			DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/full"}},
			Mounts:      driverEdits().Mounts,
		},
	}
	if diff := cmp.Diff(want, spec.Spec); diff != "" {
		t.Errorf("written spec (-want +got):\n%s", diff)
	}
	if err := cdispec.ValidateVersion(spec.Spec); err != nil {
		t.Errorf("declared version %q: %v", spec.Version, err)
	}
}

func TestVisibleDevicesListsExactlyClaimUUIDs(t *testing.T) {
	w, _ := newTestWriter(t)
	if _, err := w.WriteClaimSpec(claimA()); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteClaimSpec(simulated(uidB)); err != nil {
		t.Fatal(err)
	}
	// Simulated GPUs are named by the variable; real ones are given by
	// their device nodes and the variable is "void", as NVIDIA sets it.
	for uid, want := range map[string][]string{
		uidA: {"void"},
		uidB: {"GPU-sim-0", "GPU-sim-1"},
	} {
		spec, err := cdiapi.ReadSpec(w.SpecPath(uid), 0)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range spec.ContainerEdits.Env {
			if v, ok := strings.CutPrefix(e, VisibleDevicesEnv+"="); ok {
				got = append(got, strings.Split(v, ",")...)
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("claim %s %s (-want +got):\n%s", uid, VisibleDevicesEnv, diff)
		}
	}
}

func TestIDsUniquePerClaim(t *testing.T) {
	w, _ := newTestWriter(t)
	idsA, err := w.WriteClaimSpec(simulated(uidA))
	if err != nil {
		t.Fatal(err)
	}
	idsB, err := w.WriteClaimSpec(simulated(uidB))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]string{}
	for claim, ids := range map[string]map[string][]string{uidA: idsA, uidB: idsB} {
		for _, dev := range []string{"gpu-0", "gpu-1"} {
			if len(ids[dev]) == 0 {
				t.Fatalf("claim %s: no ID for %s", claim, dev)
			}
			for _, id := range ids[dev] {
				if other, dup := seen[id]; dup {
					t.Errorf("ID %s returned for claims %s and %s", id, other, claim)
				}
				seen[id] = claim
			}
		}
	}
	if w.SpecPath(uidA) == w.SpecPath(uidB) {
		t.Errorf("claims share spec file %s", w.SpecPath(uidA))
	}
}

func TestWriteClaimSpecIsIdempotent(t *testing.T) {
	w, root := newTestWriter(t)
	ids1, err := w.WriteClaimSpec(claimA())
	if err != nil {
		t.Fatal(err)
	}
	data1, err := os.ReadFile(w.SpecPath(uidA))
	if err != nil {
		t.Fatal(err)
	}
	// Same claim, devices and env given in another order.
	again := claimA()
	slices.Reverse(again.Devices)
	ids2, err := w.WriteClaimSpec(again)
	if err != nil {
		t.Fatalf("rewrite: %v", err)
	}
	data2, err := os.ReadFile(w.SpecPath(uidA))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ids1, ids2); diff != "" {
		t.Errorf("IDs changed on rewrite (-first +second):\n%s", diff)
	}
	if diff := cmp.Diff(string(data1), string(data2)); diff != "" {
		t.Errorf("file changed on rewrite (-first +second):\n%s", diff)
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != filepath.Base(w.SpecPath(uidA)) {
		t.Errorf("spec directory holds %v, want only %s", ents, filepath.Base(w.SpecPath(uidA)))
	}
}

func TestRemoveClaimSpecIsIdempotent(t *testing.T) {
	w, _ := newTestWriter(t)
	if _, err := w.WriteClaimSpec(claimA()); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteClaimSpec(simulated(uidB)); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := w.RemoveClaimSpec(uidA); err != nil {
			t.Fatalf("RemoveClaimSpec #%d: %v", i+1, err)
		}
	}
	if _, err := os.Stat(w.SpecPath(uidA)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("spec of removed claim still there: stat error %v", err)
	}
	if _, err := os.Stat(w.SpecPath(uidB)); err != nil {
		t.Errorf("removing claim A touched claim B: %v", err)
	}
}

func TestCacheResolvesIDs(t *testing.T) {
	w, root := newTestWriter(t)
	idsA, err := w.WriteClaimSpec(claimA())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteClaimSpec(simulated(uidB)); err != nil {
		t.Fatal(err)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(root), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) != 0 {
		t.Fatalf("cache errors: %v", errs)
	}

	var devices []string
	for _, dev := range []string{"gpu-1", "gpu-3"} {
		devices = append(devices, idsA[dev]...)
	}
	spec := &oci.Spec{}
	if unresolved, err := cache.InjectDevices(spec, devices...); err != nil {
		t.Fatalf("InjectDevices(%v): unresolved %v: %v", devices, unresolved, err)
	}

	wantEnv := []string{
		"NVIDIA_VISIBLE_DEVICES=void",
		"GPUTOPO_LEAF=l2",
		"GPUTOPO_NVLINK_DOMAIN=nvl-0",
		"GPUTOPO_SPINE=s1",
		"GPUTOPO_DEVICE_GPU_1=GPU-1111",
		"GPUTOPO_NVLINK_DOMAIN_GPU_1=nvl-0",
		"GPUTOPO_DEVICE_GPU_3=GPU-3333",
		"GPUTOPO_NVLINK_DOMAIN_GPU_3=nvl-0",
	}
	if spec.Process == nil {
		t.Fatal("no process in injected OCI spec")
	}
	if diff := cmp.Diff(wantEnv, spec.Process.Env); diff != "" {
		t.Errorf("injected env (-want +got):\n%s", diff)
	}
	var gotNodes []string
	if spec.Linux != nil {
		for _, d := range spec.Linux.Devices {
			gotNodes = append(gotNodes, d.Path)
		}
	}
	slices.Sort(gotNodes)
	if diff := cmp.Diff([]string{"/dev/full", "/dev/null", "/dev/zero"}, gotNodes); diff != "" {
		t.Errorf("injected device nodes (-want +got):\n%s", diff)
	}

	// Simulated GPUs resolve too, despite having no device nodes.
	sim := &oci.Spec{}
	if _, err := cache.InjectDevices(sim, DeviceID(uidB, "gpu-0")); err != nil {
		t.Fatalf("InjectDevices(simulated): %v", err)
	}
	if sim.Linux != nil && len(sim.Linux.Devices) != 0 {
		t.Errorf("simulated GPU injected device nodes %v", sim.Linux.Devices)
	}

	// After removal the IDs must no longer resolve.
	if err := w.RemoveClaimSpec(uidA); err != nil {
		t.Fatal(err)
	}
	if err := cache.Refresh(); err != nil {
		t.Fatal(err)
	}
	if _, err := cache.InjectDevices(&oci.Spec{}, devices...); err == nil {
		t.Errorf("IDs of removed claim still resolve")
	}
}

func TestWriteClaimSpecRejectsInvalid(t *testing.T) {
	tests := map[string]func(*ClaimSpec){
		"empty UID":          func(s *ClaimSpec) { s.ClaimUID = "" },
		"bad UID characters": func(s *ClaimSpec) { s.ClaimUID = "a/b" },
		"no devices":         func(s *ClaimSpec) { s.Devices = nil },
		"duplicate device":   func(s *ClaimSpec) { s.Devices = append(s.Devices, s.Devices[0]) },
		"empty device name":  func(s *ClaimSpec) { s.Devices[0].Name = "" },
		"empty UUID":         func(s *ClaimSpec) { s.Devices[0].UUID = "" },
		"comma in UUID":      func(s *ClaimSpec) { s.Devices[0].UUID = "GPU-1,GPU-2" },
		"reserved env":       func(s *ClaimSpec) { s.Env[VisibleDevicesEnv] = "all" },
		"env with =":         func(s *ClaimSpec) { s.Env["A=B"] = "c" },
		"empty node path":    func(s *ClaimSpec) { s.Driver.DeviceNodes = []*cdispec.DeviceNode{{Path: ""}} },
		"device env not the device's": func(s *ClaimSpec) {
			s.Devices[0].Env = map[string]string{"GPUTOPO_NVLINK_DOMAIN": "x"}
		},
		"device env in the UUID namespace": func(s *ClaimSpec) {
			s.Devices[0].Env = map[string]string{"GPUTOPO_DEVICE_X_GPU_3": "x"}
		},
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			w, root := newTestWriter(t)
			spec := claimA()
			mutate(&spec)
			if ids, err := w.WriteClaimSpec(spec); err == nil {
				t.Fatalf("WriteClaimSpec succeeded with IDs %v", ids)
			}
			ents, err := os.ReadDir(root)
			if err != nil {
				t.Fatal(err)
			}
			if len(ents) != 0 {
				t.Errorf("rejected spec left files: %v", ents)
			}
		})
	}
}

// TestTwoClaimsInOneContainerKeepAllGPUs injects two claims' devices into
// one container the way a runtime does: CDI replaces variables by name, so
// nothing that names GPUs may be a claim-wide variable with the same name
// in both claims.
func TestTwoClaimsInOneContainerKeepAllGPUs(t *testing.T) {
	w, root := newTestWriter(t)
	idsA, err := w.WriteClaimSpec(claimA())
	if err != nil {
		t.Fatal(err)
	}
	claimB := ClaimSpec{
		ClaimUID: uidB,
		Devices: []DeviceEdits{{Name: "gpu-5", UUID: "GPU-5555", Edits: nodeEdits("/dev/random"),
			Env: map[string]string{"GPUTOPO_NVLINK_DOMAIN_GPU_5": "nvl-1"}}},
		Env:    map[string]string{"GPUTOPO_NVLINK_DOMAIN": "nvl-1", "GPUTOPO_LEAF": "l2", "GPUTOPO_SPINE": "s1"},
		Driver: driverEdits(),
	}
	idsB, err := w.WriteClaimSpec(claimB)
	if err != nil {
		t.Fatal(err)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(root), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &oci.Spec{}
	ids := slices.Concat(idsA["gpu-1"], idsA["gpu-3"], idsB["gpu-5"])
	if _, err := cache.InjectDevices(spec, ids...); err != nil {
		t.Fatalf("InjectDevices(%v): %v", ids, err)
	}
	env := map[string]string{}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	for k, want := range map[string]string{
		"GPUTOPO_DEVICE_GPU_1": "GPU-1111", "GPUTOPO_DEVICE_GPU_3": "GPU-3333", "GPUTOPO_DEVICE_GPU_5": "GPU-5555",
		"GPUTOPO_NVLINK_DOMAIN_GPU_1": "nvl-0", "GPUTOPO_NVLINK_DOMAIN_GPU_5": "nvl-1",
		VisibleDevicesEnv: "void",
	} {
		if env[k] != want {
			t.Errorf("%s = %q, want %q (env %v)", k, env[k], want, spec.Process.Env)
		}
	}
	var nodes []string
	for _, d := range spec.Linux.Devices {
		nodes = append(nodes, d.Path)
	}
	slices.Sort(nodes)
	if diff := cmp.Diff([]string{"/dev/full", "/dev/null", "/dev/random", "/dev/zero"}, slices.Compact(nodes)); diff != "" {
		t.Errorf("device nodes of both claims (-want +got):\n%s", diff)
	}
}

func TestDeviceEnvName(t *testing.T) {
	for in, want := range map[string]string{
		"gpu-3":      "GPUTOPO_DEVICE_GPU_3",
		"gpu-12":     "GPUTOPO_DEVICE_GPU_12",
		"node.gpu_0": "GPUTOPO_DEVICE_NODE_GPU_0",
	} {
		if got := DeviceEnvName(in); got != want {
			t.Errorf("DeviceEnvName(%q) = %q, want %q", in, got, want)
		}
	}
}
