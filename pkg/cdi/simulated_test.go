package cdi

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// simRoot lays out a simulated device root with plain files for GPUs of
// the given minors.
func simRoot(t *testing.T, minors ...int) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"dev", "driver"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	files := []string{SimControlDevice}
	for _, m := range minors {
		files = append(files, gpuDevice(m))
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestSimulatedSpec(t *testing.T) {
	root := simRoot(t, 0, 3)
	drv, err := NewSimulated(root, map[string]int{"GPU-a": 0, "GPU-b": 3})
	if err != nil {
		t.Fatal(err)
	}
	common, err := drv.Common()
	if err != nil {
		t.Fatal(err)
	}
	spec := ClaimSpec{ClaimUID: "uid-1", Driver: common}
	for name, uuid := range map[string]string{"gpu-0": "GPU-a", "gpu-3": "GPU-b"} {
		e, err := drv.Device(uuid)
		if err != nil {
			t.Fatal(err)
		}
		spec.Devices = append(spec.Devices, DeviceEdits{Name: name, UUID: uuid, Edits: e})
	}
	w, err := NewWriter(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteClaimSpec(spec); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(w.SpecPath("uid-1"))
	if err != nil {
		t.Fatal(err)
	}
	var got cdispec.Spec
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	node := func(p string) *cdispec.DeviceNode {
		return &cdispec.DeviceNode{Path: p, HostPath: filepath.Join(root, p)}
	}
	wantCommon := cdispec.ContainerEdits{
		// A real GPU's spec gives device nodes, and "void" keeps a legacy
		// runtime from injecting more; so does a simulated one's.
		Env:         []string{"NVIDIA_VISIBLE_DEVICES=void"},
		DeviceNodes: []*cdispec.DeviceNode{node("/dev/nvidiactl")},
		Mounts: []*cdispec.Mount{{HostPath: filepath.Join(root, "driver"), ContainerPath: "/usr/local/nvidia",
			Type: "bind", Options: []string{"ro", "nosuid", "nodev", "bind"}}},
	}
	if diff := cmp.Diff(wantCommon, got.ContainerEdits); diff != "" {
		t.Errorf("common edits (-want +got):\n%s", diff)
	}
	wantNodes := map[string][]*cdispec.DeviceNode{"uid-1-gpu-0": {node("/dev/nvidia0")}, "uid-1-gpu-3": {node("/dev/nvidia3")}}
	gotNodes := map[string][]*cdispec.DeviceNode{}
	for _, d := range got.Devices {
		gotNodes[d.Name] = d.ContainerEdits.DeviceNodes
	}
	if diff := cmp.Diff(wantNodes, gotNodes); diff != "" {
		t.Errorf("device nodes by CDI device (-want +got):\n%s", diff)
	}
}

func TestSimulatedMissingDevice(t *testing.T) {
	root := simRoot(t, 0)
	_, err := NewSimulated(root, map[string]int{"GPU-a": 0, "GPU-b": 1})
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("NewSimulated without dev/nvidia1: got %v, want a not-exist error", err)
	}
	if _, err := NewSimulated("relative", nil); err == nil {
		t.Error("NewSimulated with a relative root: got no error")
	}
}
