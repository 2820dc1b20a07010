package cdi

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// Where a container sees what simulated GPUs hand it, the paths of a real
// NVIDIA driver installation.
const (
	SimControlDevice = "/dev/nvidiactl"
	// SimDriverDir is where the simulated driver's directory is mounted,
	// read-only, as device plugins mount a driver's files.
	SimDriverDir = "/usr/local/nvidia"
)

// simulatedEdits gives simulated GPUs device nodes and a driver mount that
// someone made for them on the host, so that a real container runtime
// exercises the same CDI edits a real GPU's spec has: device nodes,
// mounts, and the NVIDIA_VISIBLE_DEVICES=void and MPS limits of real GPUs.
type simulatedEdits struct {
	root   string
	minors map[string]int
}

var _ DriverEdits = (*simulatedEdits)(nil)

// NewSimulated returns DriverEdits for simulated GPUs (minors by UUID)
// whose host files are under root: dev/nvidiactl, dev/nvidia<minor> of
// every GPU (character devices, or plain files where the runtime is told
// their type) and the directory driver/. Each must exist.
func NewSimulated(root string, minors map[string]int) (DriverEdits, error) {
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("simulated device root %q is not an absolute path", root)
	}
	s := &simulatedEdits{root: filepath.Clean(root), minors: minors}
	need := []string{s.hostPath(SimControlDevice), filepath.Join(s.root, "driver")}
	for _, m := range slices.Sorted(maps.Values(minors)) {
		need = append(need, s.hostPath(gpuDevice(m)))
	}
	var errs []error
	for _, p := range need {
		if _, err := os.Stat(p); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("simulated device root %s lacks the files of its GPUs (create dev/nvidiactl, dev/nvidia<minor> of each GPU and driver/): %w", s.root, err)
	}
	return s, nil
}

func gpuDevice(minor int) string { return "/dev/nvidia" + strconv.Itoa(minor) }

func (s *simulatedEdits) hostPath(containerPath string) string {
	return filepath.Join(s.root, containerPath)
}

// Common implements DriverEdits.
func (s *simulatedEdits) Common() (*cdispec.ContainerEdits, error) {
	return &cdispec.ContainerEdits{
		Env:         []string{VisibleDevicesEnv + "=void"},
		DeviceNodes: []*cdispec.DeviceNode{{Path: SimControlDevice, HostPath: s.hostPath(SimControlDevice)}},
		Mounts: []*cdispec.Mount{{
			HostPath: filepath.Join(s.root, "driver"), ContainerPath: SimDriverDir,
			Type: "bind", Options: []string{"ro", "nosuid", "nodev", "bind"},
		}},
	}, nil
}

// Device implements DriverEdits.
func (s *simulatedEdits) Device(uuid string) (*cdispec.ContainerEdits, error) {
	m, ok := s.minors[uuid]
	if !ok {
		return nil, fmt.Errorf("simulated GPU %s: unknown UUID", uuid)
	}
	return &cdispec.ContainerEdits{
		DeviceNodes: []*cdispec.DeviceNode{{Path: gpuDevice(m), HostPath: s.hostPath(gpuDevice(m))}},
	}, nil
}
