package kubeletplugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/cdi"
	"github.com/gputopo/gputopo/pkg/command"
	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/gpu/nvml"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/labelmapping"
	"github.com/gputopo/gputopo/pkg/mps"
	"github.com/gputopo/gputopo/pkg/slices"
	"github.com/gputopo/gputopo/pkg/topology"
)

// Options are the plugin's command-line flags.
type Options struct {
	Backend         string
	Profile         string
	ProfileFile     string
	SimHealthFile   string
	SimDevRoot      string
	NVMLLibraryPath string
	NodeName        string
	NodeLabels      map[string]string
	Kubeconfig      string
	RegistrarDir    string
	PluginsDir      string
	CDIRoot         string
	Profiling       command.Profiling
	MetricsAddress  string
	ProbeAddress    string
	LabelMapping    labelmapping.Options
	NUMAList        bool
	SharedGPUs      string
	PrintSlices     bool
	PrintCDISpec    string
	// Real GPUs: where the NVIDIA driver is and how GPU health is judged.
	DriverRoot          string
	ContainerDriverRoot string
	DevRoot             string
	CDIHookPath         string
	ContainerHookPath   string
	HookSource          string
	IgnoredXids         []uint
	TaintEffect         string
	// MPSControlPath is the MPS control program shared GPUs' daemons run.
	MPSControlPath string
	// MPSShmSize is the size of the tmpfs each MPS daemon and its clients
	// share as /dev/shm: a quantity or a percentage of the node's memory.
	MPSShmSize string
}

// NewOptions returns the defaults for a node of a real cluster.
func NewOptions() *Options {
	return &Options{
		Backend:        "nvml",
		NodeName:       os.Getenv("NODE_NAME"),
		RegistrarDir:   "/var/lib/kubelet/plugins_registry",
		PluginsDir:     "/var/lib/kubelet/plugins",
		CDIRoot:        "/var/run/cdi",
		MetricsAddress: ":9400",
		LabelMapping:   labelmapping.NewOptions(),
		DriverRoot:     cdi.DefaultDriverRoot,
		IgnoredXids:    toUint(nvml.DefaultIgnoredXids()),
		TaintEffect:    string(resourceapi.DeviceTaintEffectNoSchedule),
		SharedGPUs:     "none",
		MPSShmSize:     DefaultMPSShmSize,
	}
}

// DefaultMPSShmSize is --mps-shm-size's default.
const DefaultMPSShmSize = "1Gi"

func toUint(xs []uint64) []uint {
	out := make([]uint, len(xs))
	for i, x := range xs {
		out[i] = uint(x)
	}
	return out
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Backend, "backend", o.Backend, "GPU discovery backend: nvml (real GPUs) or sim (simulated GPUs from a profile).")
	fs.StringVar(&o.Profile, "profile", o.Profile, "Simulated GPU profile for --backend=sim, one of: "+strings.Join(sim.Builtin(), ", ")+".")
	fs.StringVar(&o.ProfileFile, "profile-file", o.ProfileFile, "YAML file with a simulated GPU profile of your own (instead of --profile).")
	fs.StringVar(&o.SimDevRoot, "sim-dev-root", o.SimDevRoot, "For --backend=sim: host directory with dev/nvidiactl, dev/nvidia<minor> of each simulated GPU and driver/; CDI specs then give containers these device nodes and driver/ at "+cdi.SimDriverDir+", as a real GPU's spec does; the GPUs keep their compute modes in its compute-mode/<UUID>.compute-mode. Empty: specs carry environment variables only.")
	fs.StringVar(&o.SimHealthFile, "sim-health-file", o.SimHealthFile, "For --backend=sim: file listing unhealthy GPUs, one index or UUID per line with an optional reason.")
	fs.StringVar(&o.NVMLLibraryPath, "nvml-library-path", o.NVMLLibraryPath, "Path of libnvidia-ml.so.1 as this process sees it; empty searches the driver root's library directories.")
	fs.StringVar(&o.DriverRoot, "nvidia-driver-root", o.DriverRoot, "Root of the NVIDIA driver installation on the host: / when installed on the host, /run/nvidia/driver with the GPU Operator. CDI specs name host paths under it.")
	fs.StringVar(&o.ContainerDriverRoot, "container-driver-root", o.ContainerDriverRoot, "Where this process sees --nvidia-driver-root (a container mounting it elsewhere, e.g. /driver-root); empty: the same path.")
	fs.StringVar(&o.DevRoot, "dev-root", o.DevRoot, "Host directory whose dev/ holds the GPU device nodes; empty: --nvidia-driver-root.")
	fs.StringVar(&o.CDIHookPath, "nvidia-cdi-hook-path", o.CDIHookPath, "Host path of an nvidia-cdi-hook for the CDI specs' hooks instead of the one shipped with gputopo: /usr/bin/nvidia-cdi-hook (NVIDIA Container Toolkit packages), /usr/local/nvidia/toolkit/nvidia-cdi-hook (GPU Operator). Its version is checked at start and the hooks it cannot run are left out of the specs. Empty: install the shipped hook into <kubelet-plugins-directory-path>/"+topology.DriverName+" and use that.")
	fs.StringVar(&o.ContainerHookPath, "container-cdi-hook-path", o.ContainerHookPath, "Where this process sees --nvidia-cdi-hook-path (a container mounting the host's hook elsewhere); empty: the same path, inside the driver root as --container-driver-root maps it.")
	fs.StringVar(&o.HookSource, "cdi-hook-source", o.HookSource, "The nvidia-cdi-hook shipped with gputopo, installed onto the host when --nvidia-cdi-hook-path is empty; empty: "+cdi.HookName+" next to this executable.")
	fs.StringVar(&o.MPSControlPath, "mps-control-path", o.MPSControlPath, "The CUDA MPS control program ("+mps.ControlName+") as this process sees it: each GPU that prepared claims hold shares of gets a control daemon of its own, started with the first share and stopped with the last, its pipe directory mounted into those claims' containers at "+topology.MPSContainerPipeDir+". Empty: for --backend=nvml, "+mps.ControlName+" in the driver root's usr/bin (as --container-driver-root maps it), and a share is refused while it is missing; for --backend=sim, no daemon (shares get their limits as environment variables only), so set it to a stand-in program to run simulated shares through the daemon lifecycle.")
	fs.StringVar(&o.MPSShmSize, "mps-shm-size", o.MPSShmSize, "Size of the tmpfs that each MPS control daemon and its shares' containers see as /dev/shm (mounted in <kubelet-plugins-directory-path>/"+topology.DriverName+"/mps/<first 8 hex digits of the GPU UUID>/shm while the daemon runs): a quantity (1Gi) or a percentage of the node's memory (50%). Empty: a plain directory instead of a tmpfs, for a plugin without CAP_SYS_ADMIN.")
	fs.UintSliceVar(&o.IgnoredXids, "ignored-xids", o.IgnoredXids, "Xid errors that do not make a GPU unhealthy (application errors, by NVIDIA's defaults).")
	fs.StringVar(&o.TaintEffect, "taint-effect", o.TaintEffect, "Effect of the unhealthy taint on a failed GPU: NoSchedule (keep new claims off it) or NoExecute (also evict pods using it).")
	fs.StringVar(&o.NodeName, "node-name", o.NodeName, "Name of the node the plugin serves (default $NODE_NAME).")
	fs.StringToStringVar(&o.NodeLabels, "node-labels", o.NodeLabels, "Node labels to assume with --print-resource-slices, as k=v,k=v.")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Kubeconfig file; empty uses the in-cluster configuration.")
	fs.StringVar(&o.RegistrarDir, "kubelet-registrar-directory-path", o.RegistrarDir, "The kubelet's plugin registration directory.")
	fs.StringVar(&o.PluginsDir, "kubelet-plugins-directory-path", o.PluginsDir, "The kubelet's plugin directory; the plugin keeps its socket and checkpoint in <dir>/"+topology.DriverName+".")
	fs.StringVar(&o.CDIRoot, "cdi-root", o.CDIRoot, "Directory where CDI specs for prepared claims are written.")
	fs.StringVar(&o.MetricsAddress, "metrics-address", o.MetricsAddress, "Address serving Prometheus metrics on /metrics; empty disables it.")
	fs.StringVar(&o.ProbeAddress, "health-probe-address", o.ProbeAddress, "Address serving the gRPC health service for the kubelet's probes (services \""+ProbeStartup+"\" and \""+ProbeLiveness+"\": SERVING once the kubelet registered the plugin and its DRA socket answers), e.g. :51516 as the chart sets it; empty (the default, as several plugins may share a test machine) serves none.")
	o.Profiling.AddFlags(fs)
	o.LabelMapping.AddFlags(fs)
	fs.BoolVar(&o.NUMAList, "numa-node-list", o.NUMAList, "Publish resource.kubernetes.io/numaNode as a list (needs the DRAListTypeAttributes feature gate in the cluster).")
	fs.StringVar(&o.SharedGPUs, "shared-gpus", o.SharedGPUs, "GPUs published for sharing, with memory and milliGPU as DRA consumable capacity: all, none, or indexes like 0,1 (or 0_1). A node's "+topology.LabelSharedGPUs+" label overrides it.")
	fs.BoolVar(&o.PrintSlices, "print-resource-slices", o.PrintSlices, "Print the ResourceSlices this node would publish as YAML and exit; needs no cluster.")
	fs.StringVar(&o.PrintCDISpec, "print-cdi-spec", o.PrintCDISpec, "Print the CDI spec a claim for this one device (e.g. gpu-0) would get, and exit; needs no cluster and changes nothing.")
}

// Validate reports every bad flag at once.
func (o *Options) Validate() error {
	var errs []error
	if err := o.Profiling.Validate(); err != nil {
		errs = append(errs, err)
	}
	switch o.Backend {
	case "sim":
		if (o.Profile == "") == (o.ProfileFile == "") {
			errs = append(errs, errors.New("--backend=sim needs exactly one of --profile or --profile-file"))
		}
	case "nvml":
		if o.Profile != "" || o.ProfileFile != "" || o.SimHealthFile != "" || o.SimDevRoot != "" {
			errs = append(errs, errors.New("--profile, --profile-file, --sim-health-file and --sim-dev-root only apply to --backend=sim"))
		}
	default:
		errs = append(errs, fmt.Errorf("--backend must be nvml or sim, got %q", o.Backend))
	}
	if o.NodeName == "" {
		errs = append(errs, errors.New("--node-name (or $NODE_NAME) is required"))
	}
	if len(o.NodeLabels) > 0 && !o.PrintSlices && o.PrintCDISpec == "" {
		errs = append(errs, errors.New("--node-labels only applies to --print-resource-slices and --print-cdi-spec; a running plugin reads the Node's labels"))
	}
	if o.PrintSlices && o.PrintCDISpec != "" {
		errs = append(errs, errors.New("--print-resource-slices and --print-cdi-spec are exclusive; run one, then the other"))
	}
	if err := o.LabelMapping.Validate(); err != nil {
		errs = append(errs, err)
	}
	if _, err := slices.ParseSharing(o.SharedGPUs); err != nil {
		errs = append(errs, fmt.Errorf("--shared-gpus: %w", err))
	}
	switch resourceapi.DeviceTaintEffect(o.TaintEffect) {
	case resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute:
	default:
		errs = append(errs, fmt.Errorf("--taint-effect must be NoSchedule or NoExecute, got %q", o.TaintEffect))
	}
	for flag, p := range map[string]string{"--nvidia-driver-root": o.DriverRoot, "--container-driver-root": o.ContainerDriverRoot, "--dev-root": o.DevRoot, "--nvidia-cdi-hook-path": o.CDIHookPath, "--container-cdi-hook-path": o.ContainerHookPath, "--cdi-hook-source": o.HookSource, "--mps-control-path": o.MPSControlPath} {
		if p != "" && !filepath.IsAbs(p) {
			errs = append(errs, fmt.Errorf("%s must be an absolute path, got %q", flag, p))
		}
	}
	if o.ContainerHookPath != "" && o.CDIHookPath == "" {
		errs = append(errs, errors.New("--container-cdi-hook-path needs --nvidia-cdi-hook-path: it says where the plugin sees that host path"))
	}
	if o.DriverRoot == "" {
		errs = append(errs, errors.New("--nvidia-driver-root must not be empty (/ for a driver installed on the host)"))
	}
	if _, err := o.mpsShmSize(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// SliceConfig is the attribute configuration the flags describe, with
// the label mapping the cluster (or --label-mapping-file) gives.
func (o *Options) SliceConfig(mapping topology.LabelMapping) slices.Config {
	cfg := slices.DefaultConfig()
	cfg.Network = mapping
	if o.NUMAList {
		cfg.NUMAForm = deviceattribute.ListAttribute
	}
	cfg.Sharing, _ = slices.ParseSharing(o.SharedGPUs) // Validate reports a bad value
	cfg.TaintEffect = resourceapi.DeviceTaintEffect(o.TaintEffect)
	return cfg
}

// DriverRoots is where the flags say the NVIDIA driver is.
func (o *Options) DriverRoots() cdi.DriverRoots {
	return cdi.DriverRoots{Driver: o.DriverRoot, ContainerDriver: o.ContainerDriverRoot, Dev: o.DevRoot, HookPath: o.CDIHookPath}
}

// PluginDir is the plugin's own directory under the kubelet's.
func (o *Options) PluginDir() string { return filepath.Join(o.PluginsDir, topology.DriverName) }

// NewBackend opens the selected discovery backend. The NVML library is only
// loaded here, so a sim plugin runs on machines without it.
func (o *Options) NewBackend(ctx context.Context) (gpu.Backend, error) {
	if o.Backend == "nvml" {
		xids := make([]uint64, len(o.IgnoredXids))
		for i, x := range o.IgnoredXids {
			xids[i] = uint64(x)
		}
		opts := []nvml.Option{nvml.WithHealth(nvml.HealthConfig{IgnoredXids: xids})}
		lib := o.NVMLLibraryPath
		if lib == "" {
			found, err := o.DriverRoots().NVMLLibrary(ctx)
			if err != nil {
				klog.FromContext(ctx).Info("Loading NVML from the loader path", "reason", err)
			}
			lib = found
		}
		if lib != "" {
			opts = append(opts, nvml.WithLibraryPath(lib))
		}
		return nvml.New(opts...)
	}
	var p *sim.Profile
	var err error
	if o.ProfileFile != "" {
		p, err = sim.LoadFile(o.ProfileFile)
	} else {
		p, err = sim.LoadBuiltin(o.Profile)
	}
	if err != nil {
		return nil, err
	}
	opts := []sim.Option{sim.WithHealthFile(o.SimHealthFile)}
	if o.SimDevRoot != "" {
		// Compute modes outlive the plugin, as a real GPU's do (without
		// --sim-dev-root, they live in its memory).
		opts = append(opts, sim.WithComputeModeDir(sim.ComputeModeDir(o.SimDevRoot)))
	}
	return sim.New(p, o.NodeName, opts...), nil
}

// NewDriverEdits returns the CDI edits that inject the NVIDIA driver for
// the nvml backend, where it settles which nvidia-cdi-hook the specs run
// (see Hook); for simulated GPUs, the device nodes under --sim-dev-root,
// or nil without it.
func (o *Options) NewDriverEdits(ctx context.Context, backend gpu.Backend) (cdi.DriverEdits, error) {
	b, ok := backend.(*nvml.Backend)
	if !ok {
		if o.SimDevRoot == "" {
			return nil, nil
		}
		inv, err := backend.Discover(ctx)
		if err != nil {
			return nil, fmt.Errorf("discover simulated GPUs: %w", err)
		}
		minors := make(map[string]int, len(inv.Devices))
		for _, d := range inv.Devices {
			minors[d.UUID] = d.Minor
		}
		return cdi.NewSimulated(o.SimDevRoot, minors)
	}
	roots, err := o.Hook(ctx)
	if err != nil {
		return nil, err
	}
	return cdi.NewNVIDIA(ctx, b.Library(), roots)
}

// MPS returns the manager of shared GPUs' MPS control daemons, whose
// directories live in <plugin directory>/mps; nil for simulated GPUs
// without --mps-control-path. The backend, where it can, sets each shared
// GPU's compute mode to EXCLUSIVE_PROCESS while its daemon runs. For real GPUs the control program is only
// looked for when a share is prepared, so a node without it serves whole
// GPUs, and a share on it fails with what to set.
func (o *Options) MPS(ctx context.Context, backend gpu.Backend) (*mps.Manager, error) {
	shm, err := o.mpsShmSize()
	if err != nil {
		return nil, err
	}
	cfg := mps.Config{ControlPath: o.MPSControlPath, Root: filepath.Join(o.PluginDir(), "mps"), ShmSize: shm}
	if modes, ok := backend.(gpu.ComputeModes); ok {
		cfg.ComputeModes = modes
	}
	// The daemon starts through this program (see mps.Launch), for a
	// /dev/shm of its GPU's own.
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find this executable, through which MPS control daemons start: %w", err)
	}
	cfg.Launcher = exe
	if o.Backend != "nvml" {
		if cfg.ControlPath == "" {
			return nil, nil
		}
		return mps.New(cfg)
	}
	if cfg.ControlPath == "" {
		roots := o.DriverRoots()
		cfg.ControlPath = roots.Local(filepath.Join(o.DriverRoot, "usr", "bin", mps.ControlName))
	}
	// The daemon loads the driver's CUDA library, which lies beside NVML.
	lib := o.NVMLLibraryPath
	if lib == "" {
		lib, _ = o.DriverRoots().NVMLLibrary(ctx)
	}
	if lib != "" {
		cfg.LibraryPath = filepath.Dir(lib)
	}
	return mps.New(cfg)
}

// mpsShmSize is --mps-shm-size as the tmpfs size option (bytes, or a
// percentage).
func (o *Options) mpsShmSize() (string, error) {
	size := o.MPSShmSize
	bad := fmt.Errorf("--mps-shm-size=%q: want a quantity like 1Gi or 512Mi, a percentage of the node's memory like 50%%, or empty for a plain directory", size)
	if size == "" || strings.HasSuffix(size, "%") {
		if mps.ValidShmSize(size) != nil {
			return "", bad
		}
		return size, nil
	}
	q, err := resource.ParseQuantity(size)
	if err != nil || q.Sign() <= 0 {
		return "", bad
	}
	return strconv.FormatInt(q.Value(), 10), nil
}

// Hook settles which nvidia-cdi-hook the specs run and returns the driver
// roots with it. By default the hook shipped with gputopo is installed into
// the plugin directory, which the host sees at the same path; in print
// modes, which change nothing, the shipped program is named where it is.
// A host's hook (--nvidia-cdi-hook-path) is run here to check that it works
// and to learn which hooks it knows: the others are left out of the specs,
// as an older hook fails a container on a command it does not know.
func (o *Options) Hook(ctx context.Context) (cdi.DriverRoots, error) {
	logger := klog.FromContext(ctx)
	roots := o.DriverRoots()
	if o.CDIHookPath == "" {
		src, err := o.hookSource()
		if err != nil {
			return roots, err
		}
		if _, err := cdi.ProbeHook(ctx, src); err != nil {
			return roots, fmt.Errorf("the nvidia-cdi-hook shipped with gputopo: %w; the image or bundle is incomplete: set --cdi-hook-source to it, or --nvidia-cdi-hook-path to the host's", err)
		}
		roots.HookPath = src
		if o.PrintSlices || o.PrintCDISpec != "" {
			return roots, nil
		}
		if err := os.MkdirAll(o.PluginDir(), 0o750); err != nil {
			return roots, fmt.Errorf("create plugin directory: %w", err)
		}
		installed, err := cdi.InstallHook(src, o.PluginDir())
		if err != nil {
			return roots, fmt.Errorf("install nvidia-cdi-hook onto the host: %w", err)
		}
		logger.Info("Installed nvidia-cdi-hook for the CDI specs", "path", installed)
		roots.HookPath = installed
		return roots, nil
	}
	local := o.ContainerHookPath
	if local == "" {
		local = roots.Local(o.CDIHookPath)
	}
	support, err := cdi.ProbeHook(ctx, local)
	if err != nil {
		return roots, fmt.Errorf("--nvidia-cdi-hook-path=%s (seen here as %s): %w; install the NVIDIA Container Toolkit on the node, correct the path (and --container-cdi-hook-path where the plugin sees it), or leave --nvidia-cdi-hook-path empty to use the hook shipped with gputopo", o.CDIHookPath, local, err)
	}
	roots.DisabledHooks = support.Unsupported
	if len(support.Unsupported) > 0 {
		logger.Info("The host's nvidia-cdi-hook is older than this plugin's CDI generator: the hooks it does not know are left out of the specs; upgrade the NVIDIA Container Toolkit, or leave --nvidia-cdi-hook-path empty, to get them", "path", o.CDIHookPath, "version", support.Version, "disabled", support.Unsupported)
	} else {
		logger.Info("Using the host's nvidia-cdi-hook", "path", o.CDIHookPath, "version", support.Version)
	}
	return roots, nil
}

// hookSource is the shipped hook program: --cdi-hook-source, else the one
// next to this executable.
func (o *Options) hookSource() (string, error) {
	if o.HookSource != "" {
		return o.HookSource, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the nvidia-cdi-hook shipped next to this executable: %w; set --cdi-hook-source", err)
	}
	return filepath.Join(filepath.Dir(exe), cdi.HookName), nil
}

// ReadBootID returns the host's boot ID, or "" (with the reason) when it
// cannot be read.
func ReadBootID() (string, error) {
	data, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return "", fmt.Errorf("read boot ID: %w", err)
	}
	return strings.TrimSpace(string(data)), nil
}
