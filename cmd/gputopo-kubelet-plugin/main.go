// Command gputopo-kubelet-plugin publishes a node's GPUs with their
// NVLink and network topology as ResourceSlices and prepares allocated
// GPUs for containers through CDI.
package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/gputopo/gputopo/pkg/command"
	"github.com/gputopo/gputopo/pkg/kubeletplugin"
	"github.com/gputopo/gputopo/pkg/slices"
)

func main() {
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

	backend, err := opts.NewBackend()
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

	client, err := command.Client(opts.Kubeconfig, 0, 0)
	if err != nil {
		return err
	}
	mapping, err := opts.LabelMapping.Start(ctx, client)
	if err != nil {
		return err
	}
	reg := command.Registry()
	defer command.ServeMetrics(ctx, opts.MetricsAddress, reg)()
	return kubeletplugin.Run(ctx, kubeletplugin.Config{
		NodeName:     opts.NodeName,
		KubeClient:   client,
		Backend:      backend,
		Slices:       opts.SliceConfig(mapping.Mapping()),
		LabelMapping: mapping,
		CDIRoot:      opts.CDIRoot,
		RegistrarDir: opts.RegistrarDir,
		PluginDir:    opts.PluginDir(),
		Metrics:      kubeletplugin.NewMetrics(reg),
	})
}
