// Package nvmltest builds an NVML stand-in for tests: a shared library with
// the NVML C API that answers for GPUs the test describes, so that the nvml
// backend, and the plugin built on it, run through go-nvml's real dlopen and
// cgo calls on a machine without a GPU. csrc/fakenvml.c says what it answers;
// every other function go-nvml calls returns NVML_ERROR_NOT_SUPPORTED.
package nvmltest

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gputopo/gputopo/pkg/cdi/cditest"
)

//go:embed csrc/fakenvml.c
var source string

// GPU is one GPU the library reports.
type GPU struct {
	UUID, Name, BusID string
	Minor             int
	MemoryBytes       uint64
	Architecture      gonvml.DeviceArchitecture
	// ComputeCapability is the CUDA compute capability, major and minor.
	ComputeCapability [2]int
	// NVLinks is the number of active NVLink lanes, each to an NVSwitch.
	NVLinks int
}

// Config is what the library reports.
type Config struct {
	DriverVersion string
	// CUDAVersion is the CUDA driver version as NVML gives it (12040 for 12.4).
	CUDAVersion int
	GPUs        []GPU
	// EventsFile, when set, injects health events: a file written there
	// holding "<index> <xid>" is delivered by the next event wait (within
	// 50 ms) as an Xid critical error of that GPU, or with Xid 0 as a
	// double-bit ECC error, and removed. Write it whole (rename it into
	// place).
	EventsFile string
}

// H100s describes n H100 SXM GPUs (80 GiB, 18 NVLink lanes to the node's
// NVSwitches), GPU i with minor i on bus 0x18+i.
func H100s(n int) []GPU {
	gpus := make([]GPU, n)
	for i := range gpus {
		gpus[i] = GPU{
			UUID:              fmt.Sprintf("GPU-fa4e0000-0000-4000-8000-%012d", i),
			Name:              "NVIDIA H100 80GB HBM3",
			BusID:             fmt.Sprintf("0000:%02x:00.0", 0x18+i),
			Minor:             i,
			MemoryBytes:       80 << 30,
			Architecture:      gonvml.DEVICE_ARCH_HOPPER,
			ComputeCapability: [2]int{9, 0},
			NVLinks:           18,
		}
	}
	return gpus
}

var (
	calledByGoNVML = regexp.MustCompile(`C\.(nvml[A-Za-z0-9_]+)\(`)
	definedHere    = regexp.MustCompile(`(?m)^(?:nvmlReturn_t |const char \*)(nvml[A-Za-z0-9_]+)\(`)
)

// Build compiles the library into path with the given soname (usually
// libnvidia-ml.so.1), as Write does; a test without gcc fails saying so.
func Build(t testing.TB, path, soname string, cfg Config) {
	t.Helper()
	if err := Write(path, soname, cfg); err != nil {
		t.Fatal(err)
	}
}

// Write compiles the library into path with the given soname, with gcc and
// the nvml.h that go-nvml ships (found with `go list`, so it runs inside a
// module that requires go-nvml).
func Write(path, soname string, cfg Config) error {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml").Output()
	if err != nil {
		return fmt.Errorf("find go-nvml's nvml.h (go list -m github.com/NVIDIA/go-nvml, run inside a module that requires it): %w", err)
	}
	include := filepath.Join(strings.TrimSpace(string(out)), "pkg", "nvml")
	goSource, err := os.ReadFile(filepath.Join(include, "nvml.go"))
	if err != nil {
		return fmt.Errorf("read the functions go-nvml calls: %w", err)
	}
	dir, err := os.MkdirTemp("", "fakenvml-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	files := map[string]string{
		"fakenvml.c":       source,
		"fakenvml_gpus.h":  gpusHeader(cfg),
		"fakenvml_stubs.c": stubs(goSource),
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := sharedLibrary(path, soname, "-O1", "-Wall", "-Werror", "-DNVML_NO_UNVERSIONED_FUNC_DEFS=1",
		"-I", include, "-I", dir, filepath.Join(dir, "fakenvml.c"), filepath.Join(dir, "fakenvml_stubs.c")); err != nil {
		return fmt.Errorf("build the NVML stand-in: %w", err)
	}
	return nil
}

// sharedLibrary builds the shared library out, with its SONAME, from gcc's
// other arguments (sources and flags). It replaces out rather than write
// through it: out may be a file a process has mapped.
func sharedLibrary(out, soname string, args ...string) error {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		return fmt.Errorf("the fake driver's libraries are built with gcc: %w; install gcc", err)
	}
	os.Remove(out)
	cmd := exec.Command(gcc, append([]string{"-shared", "-fPIC", "-Wl,-soname," + soname, "-o", out}, args...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w: %s", out, err, b)
	}
	return nil
}

// FakeDriver lays out a driver installation in the existing directory root
// as cditest.Lay does (versioned libraries with their soname links,
// binaries, firmware, the persistenced socket, device nodes: it needs
// CAP_MKNOD), with real ELF libraries in it: libnvidia-ml is the stand-in,
// answering for cfg's GPUs, libcuda and libnvidia-ptxjitcompiler empty
// libraries that carry their SONAMEs, as the CDI hooks and ldconfig need.
// The driver version is cditest.DriverVersion's, whatever cfg says.
func FakeDriver(root string, cfg Config) error {
	cfg.DriverVersion = cditest.DriverVersion
	gpus := 0
	for _, g := range cfg.GPUs {
		gpus = max(gpus, g.Minor+1)
	}
	if err := cditest.Lay(root, gpus); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "fakedriver-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	empty := filepath.Join(dir, "empty.c")
	if err := os.WriteFile(empty, []byte("int gputopo_fake_driver;\n"), 0o644); err != nil {
		return err
	}
	libDir := filepath.Join(root, cditest.LibDir)
	for _, soname := range []string{"libcuda.so.1", "libnvidia-ptxjitcompiler.so.1"} {
		out := filepath.Join(libDir, strings.TrimSuffix(soname, ".1")+"."+cditest.DriverVersion)
		if err := sharedLibrary(out, soname, empty); err != nil {
			return fmt.Errorf("build %w", err)
		}
	}
	return Write(filepath.Join(libDir, "libnvidia-ml.so."+cditest.DriverVersion), "libnvidia-ml.so.1", cfg)
}

// stubs returns C functions, returning NVML_ERROR_NOT_SUPPORTED (3), for
// every NVML function go-nvml calls that fakenvml.c does not define. They
// take no arguments: under the x86-64 and arm64 calling conventions a caller
// that passes some is unharmed.
func stubs(goSource []byte) string {
	defined := map[string]bool{}
	for _, m := range definedHere.FindAllStringSubmatch(source, -1) {
		defined[m[1]] = true
	}
	var names []string
	for _, m := range calledByGoNVML.FindAllSubmatch(goSource, -1) {
		if name := string(m[1]); !defined[name] && !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	var b strings.Builder
	b.WriteString("/* Generated by nvmltest.Build: what the stand-in does not support. */\n")
	for _, name := range names {
		fmt.Fprintf(&b, "int %s(void) { return %d; }\n", name, int(gonvml.ERROR_NOT_SUPPORTED))
	}
	return b.String()
}

func gpusHeader(cfg Config) string {
	var b strings.Builder
	fmt.Fprintf(&b, "#define FAKE_DRIVER_VERSION %s\n", strconv.Quote(cfg.DriverVersion))
	fmt.Fprintf(&b, "#define FAKE_CUDA_VERSION %d\n", cfg.CUDAVersion)
	fmt.Fprintf(&b, "#define FAKE_EVENTS_FILE %s\n", strconv.Quote(cfg.EventsFile))
	fmt.Fprintf(&b, "#define FAKE_GPU_COUNT %d\n", len(cfg.GPUs))
	b.WriteString("static const struct fake_gpu fake_gpus[] = {\n")
	for _, g := range cfg.GPUs {
		fmt.Fprintf(&b, "\t{%s, %s, %s, %d, %dULL, %d, %d, %d, %d},\n",
			strconv.Quote(g.UUID), strconv.Quote(g.Name), strconv.Quote(g.BusID), g.Minor, g.MemoryBytes,
			g.Architecture, g.ComputeCapability[0], g.ComputeCapability[1], g.NVLinks)
	}
	if len(cfg.GPUs) == 0 {
		b.WriteString("\t{0},\n")
	}
	b.WriteString("};\n")
	return b.String()
}

// InjectEvent writes the event "<index> <xid>" to a library's EventsFile
// and waits until an event wait has taken it: an Xid critical error of GPU
// index, or with xid 0 a double-bit ECC error. It fails when no wait takes
// it within timeout (nothing watches the GPUs' health).
func InjectEvent(eventsFile string, index int, xid uint64, timeout time.Duration) error {
	tmp := eventsFile + ".tmp"
	if err := os.WriteFile(tmp, fmt.Appendf(nil, "%d %d\n", index, xid), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, eventsFile); err != nil {
		return err
	}
	for deadline := time.Now().Add(timeout); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(eventsFile); os.IsNotExist(err) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no NVML event wait took event %d %d from %s within %v", index, xid, eventsFile, timeout)
		}
	}
}
