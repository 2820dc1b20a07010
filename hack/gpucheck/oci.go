package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

// runOCI turns a runtime config (the one `runc spec` writes) into one that
// runs args in rootfs with a CDI device injected as a CDI-enabled
// containerd would: the spec's device nodes, mounts, environment and
// hooks. It rewrites the config in place.
func runOCI(args []string) (*report, error) {
	fs := flag.NewFlagSet("oci", flag.ContinueOnError)
	config := fs.String("config", "", "runtime config (config.json) to rewrite")
	cdiDir := fs.String("cdi-dir", "", "directory holding the CDI spec")
	device := fs.String("device", "", "qualified CDI device to inject, e.g. gputopo.dev/gpu=<claim>-gpu-0")
	rootfs := fs.String("rootfs", "rootfs", "root file system, relative to the config's directory or absolute")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if *config == "" || *cdiDir == "" || *device == "" || fs.NArg() == 0 {
		return nil, errors.New("usage: gpucheck oci -config FILE -cdi-dir DIR -device ID [-rootfs DIR] -- COMMAND [ARG...]")
	}
	data, err := os.ReadFile(*config)
	if err != nil {
		return nil, fmt.Errorf("read runtime config: %w", err)
	}
	var spec oci.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("decode runtime config %s: %w", *config, err)
	}
	if spec.Process == nil {
		spec.Process = &oci.Process{}
	}
	spec.Process.Args = fs.Args()
	spec.Process.Terminal = false
	spec.Root = &oci.Root{Path: *rootfs}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(*cdiDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("read CDI specs in %s: %w", *cdiDir, err)
	}
	if unresolved, err := cache.InjectDevices(&spec, *device); err != nil {
		return nil, fmt.Errorf("inject CDI device %s (unresolved %v): %w", *device, unresolved, err)
	}
	out, err := json.MarshalIndent(&spec, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode runtime config: %w", err)
	}
	if err := os.WriteFile(*config, out, 0o600); err != nil {
		return nil, fmt.Errorf("write runtime config: %w", err)
	}
	r := &report{}
	nodes, hooks := 0, 0
	if spec.Linux != nil {
		nodes = len(spec.Linux.Devices)
	}
	if spec.Hooks != nil {
		hooks = len(spec.Hooks.CreateContainer)
	}
	r.ok("runtime config %s runs %v with %s: %d device node(s), %d mount(s), %d createContainer hook(s)",
		filepath.Base(*config), spec.Process.Args, *device, nodes, len(spec.Mounts), hooks)
	return r, nil
}
