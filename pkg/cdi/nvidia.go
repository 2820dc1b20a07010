package cdi

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/lookup"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform"
	transformroot "github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform/root"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// NVIDIA's defaults for a driver installed on the host.
const (
	DefaultDriverRoot = "/"
	DefaultHookPath   = "/usr/bin/nvidia-cdi-hook"
)

// DriverEdits supplies the container edits that make real GPUs usable in a
// container. A nil DriverEdits means simulated GPUs: no driver to inject.
type DriverEdits interface {
	// Common returns what every container with a GPU needs, whichever GPU:
	// driver libraries, binaries, IPC sockets, firmware, hooks (ldcache,
	// symlinks) and the control device nodes that exist.
	Common() (*cdispec.ContainerEdits, error)
	// Device returns the edits that give a container the GPU with uuid:
	// its device nodes.
	Device(uuid string) (*cdispec.ContainerEdits, error)
}

// DriverRoots says where the NVIDIA driver installation is, as the host
// (and so the container runtime reading the specs) sees it and as this
// process sees it.
type DriverRoots struct {
	// Driver is the host's driver root: "/" for a driver installed on the
	// host, "/run/nvidia/driver" for the GPU Operator's driver container.
	Driver string
	// ContainerDriver is where this process sees Driver (a container
	// mounting it elsewhere); empty means the same path.
	ContainerDriver string
	// Dev is the host directory whose dev/ holds the GPU device nodes;
	// empty means Driver.
	Dev string
	// HookPath is the host path of nvidia-cdi-hook (NVIDIA Container
	// Toolkit), which the hooks in the specs run.
	HookPath string
	// DisabledHooks are hook commands (HookCommands) the specs must not
	// call, because the program at HookPath does not know them.
	DisabledHooks []string
}

// withDefaults fills the empty fields.
func (r DriverRoots) withDefaults() DriverRoots {
	if r.Driver == "" {
		r.Driver = DefaultDriverRoot
	}
	if r.ContainerDriver == "" {
		r.ContainerDriver = r.Driver
	}
	if r.Dev == "" {
		r.Dev = r.Driver
	}
	if r.HookPath == "" {
		r.HookPath = DefaultHookPath
	}
	return r
}

// Local maps a host path inside the driver root to where this process sees
// it; paths outside it are the same on both sides.
func (r DriverRoots) Local(hostPath string) string {
	r = r.withDefaults()
	rel, err := filepath.Rel(r.Driver, hostPath)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return hostPath
	}
	return filepath.Join(r.ContainerDriver, rel)
}

// NVMLLibrary finds libnvidia-ml.so.1 in the driver root as this process
// sees it, where NVIDIA's tools look: the usual library directories of
// every distribution and architecture, then the root's ldcache.
func (r DriverRoots) NVMLLibrary(ctx context.Context) (string, error) {
	r = r.withDefaults()
	paths, err := lookup.NewLibraryLocator(
		lookup.WithRoot(r.ContainerDriver),
		lookup.WithLogger(nvcdiLogger{klog.FromContext(ctx).WithName("nvcdi")}),
	).Locate("libnvidia-ml.so.1")
	if err != nil {
		return "", fmt.Errorf("find libnvidia-ml.so.1 in driver root %s: %w", r.ContainerDriver, err)
	}
	return paths[0], nil
}

// nvidiaEdits generates edits with the NVIDIA Container Toolkit's nvcdi
// library, the code nvidia-ctk and NVIDIA's DRA driver use, and rewrites
// the paths this process sees into host paths. The library caches the
// driver version and library directory it finds, so each call builds it
// anew: after a driver upgrade the next call names the new libraries, and a
// control device node created since (/dev/nvidia-uvm, made when the module
// loads) is included.
type nvidiaEdits struct {
	opts      []nvcdi.Option
	transform transform.Transformer
}

var _ DriverEdits = (*nvidiaEdits)(nil)

// NewNVIDIA returns DriverEdits for the driver installation at roots, using
// lib (an NVML library, initialised by its owner) to enumerate GPUs.
func NewNVIDIA(ctx context.Context, lib gonvml.Interface, roots DriverRoots) (DriverEdits, error) {
	roots = roots.withDefaults()
	devLocal := roots.Local(roots.Dev)
	for name, dir := range map[string]string{"driver root": roots.ContainerDriver, "dev root": devLocal} {
		st, err := os.Stat(dir)
		if err == nil && !st.IsDir() {
			err = errors.New("not a directory")
		}
		if err != nil {
			return nil, fmt.Errorf("NVIDIA %s %s: %w; mount the host's driver installation there or set the driver root flags", name, dir, err)
		}
	}
	for _, h := range roots.DisabledHooks {
		if !slices.Contains(HookCommands, h) {
			return nil, fmt.Errorf("disable hook %q: not one of %s", h, strings.Join(HookCommands, ", "))
		}
	}
	n := &nvidiaEdits{
		opts: []nvcdi.Option{
			nvcdi.WithNvmlLib(lib),
			nvcdi.WithMode(nvcdi.ModeNvml),
			nvcdi.WithDriverRoot(roots.ContainerDriver),
			nvcdi.WithDevRoot(devLocal),
			nvcdi.WithNVIDIACDIHookPath(roots.HookPath),
			nvcdi.WithDisabledHooks(roots.DisabledHooks...),
			nvcdi.WithVendor(Vendor),
			nvcdi.WithClass(Class),
			nvcdi.WithLogger(nvcdiLogger{klog.FromContext(ctx).WithName("nvcdi")}),
			// nvsandboxutils would be loaded from the driver root into
			// this process for nothing NVML cannot tell.
			nvcdi.WithFeatureFlags(nvcdi.FeatureDisableNvsandboxUtils),
		},
		transform: transformroot.NewDriverTransformer(
			transformroot.WithDriverRoot(roots.ContainerDriver),
			transformroot.WithTargetDriverRoot(roots.Driver),
			transformroot.WithDevRoot(devLocal),
			transformroot.WithTargetDevRoot(roots.Dev),
		),
	}
	if _, err := n.lib(); err != nil {
		return nil, err
	}
	return n, nil
}

func (n *nvidiaEdits) lib() (nvcdi.Interface, error) {
	l, err := nvcdi.New(n.opts...)
	if err != nil {
		return nil, fmt.Errorf("create NVIDIA CDI generator: %w", err)
	}
	return l, nil
}

// Common implements DriverEdits.
func (n *nvidiaEdits) Common() (*cdispec.ContainerEdits, error) {
	l, err := n.lib()
	if err != nil {
		return nil, err
	}
	e, err := l.GetCommonEdits()
	if err != nil {
		return nil, fmt.Errorf("generate driver edits: %w", err)
	}
	return n.toHost(e.ContainerEdits)
}

// Device implements DriverEdits.
func (n *nvidiaEdits) Device(uuid string) (*cdispec.ContainerEdits, error) {
	l, err := n.lib()
	if err != nil {
		return nil, err
	}
	devs, err := l.GetDeviceSpecsByID(uuid)
	if err != nil {
		return nil, fmt.Errorf("generate edits of GPU %s: %w", uuid, err)
	}
	if len(devs) != 1 {
		return nil, fmt.Errorf("generate edits of GPU %s: got %d device specs, want 1", uuid, len(devs))
	}
	return n.toHost(&devs[0].ContainerEdits)
}

// toHost rewrites paths from this process's view to the host's.
func (n *nvidiaEdits) toHost(e *cdispec.ContainerEdits) (*cdispec.ContainerEdits, error) {
	if e == nil {
		e = &cdispec.ContainerEdits{}
	}
	s := &cdispec.Spec{ContainerEdits: *e}
	if err := n.transform.Transform(s); err != nil {
		return nil, fmt.Errorf("rewrite driver paths for the host: %w", err)
	}
	return &s.ContainerEdits, nil
}

// nvcdiLogger routes nvcdi's printf-style logging into klog.
type nvcdiLogger struct{ l klog.Logger }

func (n nvcdiLogger) Debugf(f string, a ...any) { n.l.V(4).Info(fmt.Sprintf(f, a...)) }
func (n nvcdiLogger) Tracef(f string, a ...any) { n.l.V(6).Info(fmt.Sprintf(f, a...)) }
func (n nvcdiLogger) Infof(f string, a ...any)  { n.l.V(2).Info(fmt.Sprintf(f, a...)) }
func (n nvcdiLogger) Warningf(f string, a ...any) {
	n.l.Info("Warning: " + fmt.Sprintf(f, a...))
}
func (n nvcdiLogger) Errorf(f string, a ...any) { n.l.Error(nil, fmt.Sprintf(f, a...)) }
