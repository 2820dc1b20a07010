package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
)

func TestOCIConfigGetsTheCDIDevice(t *testing.T) {
	dir := t.TempDir()
	cdiDir := filepath.Join(dir, "cdi")
	if err := os.MkdirAll(cdiDir, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := `{"cdiVersion":"0.5.0","kind":"gputopo.dev/gpu",` +
		`"devices":[{"name":"c-gpu-0","containerEdits":{"deviceNodes":[{"path":"/dev/null"}],"env":["GPUTOPO_DEVICE_GPU_0=GPU-0"]}}],` +
		`"containerEdits":{"env":["NVIDIA_VISIBLE_DEVICES=void"],"hooks":[{"hookName":"createContainer","path":"/bin/true","args":["true","update-ldcache"]}]}}`
	if err := os.WriteFile(filepath.Join(cdiDir, "spec.json"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	// What `runc spec` writes, in short.
	config := filepath.Join(dir, "config.json")
	base := oci.Spec{Version: oci.Version, Process: &oci.Process{Terminal: true, Args: []string{"sh"}, Env: []string{"PATH=/bin"}}, Root: &oci.Root{Path: "rootfs", Readonly: true}, Linux: &oci.Linux{}}
	data, _ := json.Marshal(base)
	if err := os.WriteFile(config, data, 0o600); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := run([]string{"oci", "-config", config, "-cdi-dir", cdiDir, "-device", "gputopo.dev/gpu=c-gpu-0", "--", "nvidia-smi", "-L"}, &out); err != nil {
		t.Fatalf("oci: %v\n%s", err, out.String())
	}
	data, err := os.ReadFile(config)
	if err != nil {
		t.Fatal(err)
	}
	var got oci.Spec
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Process.Args, []string{"nvidia-smi", "-L"}) || got.Process.Terminal || got.Root.Readonly {
		t.Errorf("process %+v root %+v, want nvidia-smi -L without a terminal on a writable root (the hooks write the ldcache)", got.Process, got.Root)
	}
	if len(got.Linux.Devices) != 1 || got.Linux.Devices[0].Path != "/dev/null" {
		t.Errorf("device nodes %+v, want the CDI device's", got.Linux.Devices)
	}
	if !slices.Contains(got.Process.Env, "NVIDIA_VISIBLE_DEVICES=void") || !slices.Contains(got.Process.Env, "GPUTOPO_DEVICE_GPU_0=GPU-0") {
		t.Errorf("env %v lacks the spec's variables", got.Process.Env)
	}
	if got.Hooks == nil || len(got.Hooks.CreateContainer) != 1 {
		t.Errorf("hooks %+v, want the spec's createContainer hook", got.Hooks)
	}
	if err := run([]string{"oci", "-config", config, "-cdi-dir", cdiDir, "-device", "gputopo.dev/gpu=nope", "--", "true"}, &out); err == nil {
		t.Error("an unknown CDI device was injected")
	}
}
