package kubeletplugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/gputopo/gputopo/pkg/gpu"
	"github.com/gputopo/gputopo/pkg/gpu/nvml"
	"github.com/gputopo/gputopo/pkg/gpu/sim"
	"github.com/gputopo/gputopo/pkg/labelmapping"
	"github.com/gputopo/gputopo/pkg/slices"
	"github.com/gputopo/gputopo/pkg/topology"
)

// Options are the plugin's command-line flags.
type Options struct {
	Backend         string
	Profile         string
	ProfileFile     string
	SimHealthFile   string
	NVMLLibraryPath string
	NodeName        string
	NodeLabels      map[string]string
	Kubeconfig      string
	RegistrarDir    string
	PluginsDir      string
	CDIRoot         string
	MetricsAddress  string
	LabelMapping    labelmapping.Options
	NUMAList        bool
	PrintSlices     bool
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
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.Backend, "backend", o.Backend, "GPU discovery backend: nvml (real GPUs) or sim (simulated GPUs from a profile).")
	fs.StringVar(&o.Profile, "profile", o.Profile, "Simulated GPU profile for --backend=sim, one of: "+strings.Join(sim.Builtin(), ", ")+".")
	fs.StringVar(&o.ProfileFile, "profile-file", o.ProfileFile, "YAML file with a simulated GPU profile of your own (instead of --profile).")
	fs.StringVar(&o.SimHealthFile, "sim-health-file", o.SimHealthFile, "For --backend=sim: file listing unhealthy GPUs, one index or UUID per line with an optional reason.")
	fs.StringVar(&o.NVMLLibraryPath, "nvml-library-path", o.NVMLLibraryPath, "Path of libnvidia-ml.so.1 when it is not on the loader path.")
	fs.StringVar(&o.NodeName, "node-name", o.NodeName, "Name of the node the plugin serves (default $NODE_NAME).")
	fs.StringToStringVar(&o.NodeLabels, "node-labels", o.NodeLabels, "Node labels to assume with --print-resource-slices, as k=v,k=v.")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Kubeconfig file; empty uses the in-cluster configuration.")
	fs.StringVar(&o.RegistrarDir, "kubelet-registrar-directory-path", o.RegistrarDir, "The kubelet's plugin registration directory.")
	fs.StringVar(&o.PluginsDir, "kubelet-plugins-directory-path", o.PluginsDir, "The kubelet's plugin directory; the plugin keeps its socket and checkpoint in <dir>/"+topology.DriverName+".")
	fs.StringVar(&o.CDIRoot, "cdi-root", o.CDIRoot, "Directory where CDI specs for prepared claims are written.")
	fs.StringVar(&o.MetricsAddress, "metrics-address", o.MetricsAddress, "Address serving Prometheus metrics on /metrics; empty disables it.")
	o.LabelMapping.AddFlags(fs)
	fs.BoolVar(&o.NUMAList, "numa-node-list", o.NUMAList, "Publish resource.kubernetes.io/numaNode as a list (needs the DRAListTypeAttributes feature gate in the cluster).")
	fs.BoolVar(&o.PrintSlices, "print-resource-slices", o.PrintSlices, "Print the ResourceSlices this node would publish as YAML and exit; needs no cluster.")
}

// Validate reports every bad flag at once.
func (o *Options) Validate() error {
	var errs []error
	switch o.Backend {
	case "sim":
		if (o.Profile == "") == (o.ProfileFile == "") {
			errs = append(errs, errors.New("--backend=sim needs exactly one of --profile or --profile-file"))
		}
	case "nvml":
		if o.Profile != "" || o.ProfileFile != "" || o.SimHealthFile != "" {
			errs = append(errs, errors.New("--profile, --profile-file and --sim-health-file only apply to --backend=sim"))
		}
	default:
		errs = append(errs, fmt.Errorf("--backend must be nvml or sim, got %q", o.Backend))
	}
	if o.NodeName == "" {
		errs = append(errs, errors.New("--node-name (or $NODE_NAME) is required"))
	}
	if len(o.NodeLabels) > 0 && !o.PrintSlices {
		errs = append(errs, errors.New("--node-labels only applies to --print-resource-slices; a running plugin reads the Node's labels"))
	}
	if err := o.LabelMapping.Validate(); err != nil {
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
	return cfg
}

// PluginDir is the plugin's own directory under the kubelet's.
func (o *Options) PluginDir() string { return filepath.Join(o.PluginsDir, topology.DriverName) }

// NewBackend opens the selected discovery backend. The NVML library is only
// loaded here, so a sim plugin runs on machines without it.
func (o *Options) NewBackend() (gpu.Backend, error) {
	if o.Backend == "nvml" {
		var opts []nvml.Option
		if o.NVMLLibraryPath != "" {
			opts = append(opts, nvml.WithLibraryPath(o.NVMLLibraryPath))
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
	return sim.New(p, o.NodeName, sim.WithHealthFile(o.SimHealthFile)), nil
}
