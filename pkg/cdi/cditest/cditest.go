// Package cditest builds what an NVIDIA driver installation looks like to
// the CDI generator, for tests: a driver root of files, symlinks and
// device nodes, and the NVML answers that go with it.
package cditest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"golang.org/x/sys/unix"
)

// DriverVersion is the version of the fake driver.
const DriverVersion = "550.54.15"

// LibDir is where the fake driver's libraries are, inside the root.
const LibDir = "/usr/lib/x86_64-linux-gnu"

// DriverRoot lays out what the NVIDIA driver installs, in a temporary
// root: versioned libraries with their soname links, binaries, the
// persistenced socket, GSP firmware, and the device nodes of gpus GPUs
// (minors 0..gpus-1), but not /dev/nvidia-uvm-tools (created only when a
// profiler first runs) nor /dev/nvidia-modeset (no display driver).
// Device nodes need CAP_MKNOD; without it the test is skipped.
func DriverRoot(t testing.TB, gpus int) string {
	t.Helper()
	root := t.TempDir()
	LayDriverRoot(t, root, gpus)
	return root
}

// LayDriverRoot lays out what DriverRoot describes in the existing
// directory root. Without CAP_MKNOD the test is skipped.
func LayDriverRoot(t testing.TB, root string, gpus int) {
	t.Helper()
	err := Lay(root, gpus)
	if errors.Is(err, unix.EPERM) {
		t.Skip("creating character devices needs CAP_MKNOD; run as root to test driver edits")
	}
	if err != nil {
		t.Fatal(err)
	}
}

// Lay lays out what DriverRoot describes in the existing directory root,
// for callers that are not tests.
func Lay(root string, gpus int) error {
	lib := LibDir[1:]
	files := []string{
		lib + "/libcuda.so." + DriverVersion,
		lib + "/libnvidia-ml.so." + DriverVersion,
		lib + "/libnvidia-ptxjitcompiler.so." + DriverVersion,
		"usr/bin/nvidia-smi",
		"usr/bin/nvidia-persistenced",
		"usr/bin/nvidia-cdi-hook",
		"run/nvidia-persistenced/socket",
		"lib/firmware/nvidia/" + DriverVersion + "/gsp_ga10x.bin",
	}
	for _, f := range files {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte("fake"), 0o755); err != nil {
			return err
		}
	}
	for link, target := range map[string]string{
		lib + "/libcuda.so.1":                  "libcuda.so." + DriverVersion,
		lib + "/libcuda.so":                    "libcuda.so.1",
		lib + "/libnvidia-ml.so.1":             "libnvidia-ml.so." + DriverVersion,
		lib + "/libnvidia-ptxjitcompiler.so.1": "libnvidia-ptxjitcompiler.so." + DriverVersion,
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		return err
	}
	nodes := map[string][2]uint32{"nvidiactl": {195, 255}, "nvidia-uvm": {511, 0}}
	for i := range gpus {
		nodes[fmt.Sprintf("nvidia%d", i)] = [2]uint32{195, uint32(i)}
	}
	for name, mm := range nodes {
		if err := mknod(root, name, mm[0], mm[1]); err != nil {
			return err
		}
	}
	return nil
}

// MakeDeviceNode creates the character device root/dev/name, as the
// driver's modules do when they load. Without CAP_MKNOD the test is
// skipped.
func MakeDeviceNode(t testing.TB, root, name string, major, minor uint32) {
	t.Helper()
	err := mknod(root, name, major, minor)
	if errors.Is(err, unix.EPERM) {
		t.Skip("creating character devices needs CAP_MKNOD; run as root to test driver edits")
	}
	if err != nil {
		t.Fatal(err)
	}
}

func mknod(root, name string, major, minor uint32) error {
	p := filepath.Join(root, "dev", name)
	if err := unix.Mknod(p, syscall.S_IFCHR|0o666, int(unix.Mkdev(major, minor))); err != nil {
		return fmt.Errorf("create device node %s (c %d %d): %w", p, major, minor, err)
	}
	return nil
}

// NVML answers for the GPUs with the given UUIDs (GPU i has minor i) what
// the CDI generator asks.
func NVML(uuids ...string) *mock.Interface {
	devs := map[string]*mock.Device{}
	for i, uuid := range uuids {
		bus := fmt.Sprintf("0000:%02x:00.0", 0x18+i)
		devs[uuid] = &mock.Device{
			GetUUIDFunc:           func() (string, gonvml.Return) { return uuid, gonvml.SUCCESS },
			GetIndexFunc:          func() (int, gonvml.Return) { return i, gonvml.SUCCESS },
			GetMinorNumberFunc:    func() (int, gonvml.Return) { return i, gonvml.SUCCESS },
			IsMigDeviceHandleFunc: func() (bool, gonvml.Return) { return false, gonvml.SUCCESS },
			GetPciInfoFunc: func() (gonvml.PciInfo, gonvml.Return) {
				var p gonvml.PciInfo
				copy(p.BusId[:], bus)
				return p, gonvml.SUCCESS
			},
		}
	}
	return &mock.Interface{
		InitFunc:                   func() gonvml.Return { return gonvml.SUCCESS },
		ShutdownFunc:               func() gonvml.Return { return gonvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, gonvml.Return) { return DriverVersion, gonvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, gonvml.Return) { return len(devs), gonvml.SUCCESS },
		DeviceGetHandleByUUIDFunc: func(uuid string) (gonvml.Device, gonvml.Return) {
			d, ok := devs[uuid]
			if !ok {
				return nil, gonvml.ERROR_NOT_FOUND
			}
			return d, gonvml.SUCCESS
		},
	}
}
