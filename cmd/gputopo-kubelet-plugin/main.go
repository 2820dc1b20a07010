// Command gputopo-kubelet-plugin publishes a node's GPUs with their
// NVLink and network topology as ResourceSlices and prepares allocated
// GPUs for containers through CDI.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/command"
	"github.com/gputopo/gputopo/pkg/kubeletplugin"
	"github.com/gputopo/gputopo/pkg/mps"
	"github.com/gputopo/gputopo/pkg/slices"
)

func main() {
	// Started as an MPS control daemon's launcher, this never returns.
	mps.Launch()
	if err := run(); err != nil && !errors.Is(err, command.ErrHelp) {
		fmt.Fprintf(os.Stderr, "gputopo-kubelet-plugin: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	opts := kubeletplugin.NewOptions()
	fs := pflag.NewFlagSet("gputopo-kubelet-plugin", pflag.ContinueOnError)
	opts.AddFlags(fs)
	flush, err := command.Parse(fs, os.Args[1:], opts.Validate)
	if err != nil {
		return err
	}
	defer flush()
	ctx, stop := command.Context()
	defer stop()

	backend, err := opts.NewBackend(ctx)
	if err != nil {
		return err
	}
	if opts.PrintSlices {
		defer func() { _ = backend.Close() }()
		inv, err := backend.Discover(ctx)
		if err != nil {
			return fmt.Errorf("discover GPUs: %w", err)
		}
		mapping, err := opts.LabelMapping.Mapping(ctx, nil)
		if err != nil {
			return err
		}
		return kubeletplugin.PrintResourceSlices(os.Stdout, inv, slices.Node{Name: opts.NodeName, Labels: opts.NodeLabels}, opts.SliceConfig(mapping))
	}

	edits, err := opts.NewDriverEdits(ctx, backend)
	if err != nil {
		return err
	}
	if opts.PrintCDISpec != "" {
		defer func() { _ = backend.Close() }()
		mapping, err := opts.LabelMapping.Mapping(ctx, nil)
		if err != nil {
			return err
		}
		cfg := kubeletplugin.Config{NodeName: opts.NodeName, Backend: backend, Slices: opts.SliceConfig(mapping), DriverEdits: edits}
		return kubeletplugin.PrintCDISpec(ctx, os.Stdout, cfg, opts.NodeLabels, opts.PrintCDISpec)
	}
	client, err := command.Client(opts.Kubeconfig, command.ClientOptions{})
	if err != nil {
		return err
	}
	if err := command.CheckServerVersion(ctx, client.Discovery()); err != nil {
		return err
	}
	mapping, err := opts.LabelMapping.Start(ctx, client)
	if err != nil {
		return err
	}
	bootID, err := kubeletplugin.ReadBootID()
	if err != nil {
		klog.FromContext(ctx).Info("Boot ID unknown: a checkpoint from before a reboot will be kept", "reason", err)
	}
	mpsDaemons, err := opts.MPS(ctx, backend)
	if err != nil {
		return err
	}
	reg := command.Registry()
	defer command.ServeMetrics(ctx, opts.MetricsAddress, reg, opts.Profiling, nil)()
	return kubeletplugin.Run(ctx, kubeletplugin.Config{
		NodeName:     opts.NodeName,
		KubeClient:   client,
		Backend:      backend,
		Slices:       opts.SliceConfig(mapping.Mapping()),
		LabelMapping: mapping,
		CDIRoot:      opts.CDIRoot,
		RegistrarDir: opts.RegistrarDir,
		PluginDir:    opts.PluginDir(),
		DriverEdits:  edits,
		MPS:          mpsDaemons,
		BootID:       bootID,
		Metrics:      kubeletplugin.NewMetrics(reg),

		HealthProbeAddress: opts.ProbeAddress,
	})
}
