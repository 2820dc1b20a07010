// Command gputopo-kubelet-plugin publishes a node's GPUs with their
// NVLink and network topology as ResourceSlices and prepares allocated
// GPUs for containers through CDI.
package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/kubeletplugin"
	"github.com/gputopo/gputopo/pkg/slices"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "gputopo-kubelet-plugin: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	opts := kubeletplugin.NewOptions()
	logConfig := logsapi.NewLoggingConfiguration()
	fs := pflag.NewFlagSet("gputopo-kubelet-plugin", pflag.ContinueOnError)
	opts.AddFlags(fs)
	logsapi.AddFlags(logConfig, fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if err := opts.Validate(); err != nil {
		return err
	}
	if err := logsapi.ValidateAndApply(logConfig, nil); err != nil {
		return err
	}
	defer logs.FlushLogs()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())

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
		return kubeletplugin.PrintResourceSlices(os.Stdout, inv, slices.Node{Name: opts.NodeName, Labels: opts.NodeLabels}, opts.SliceConfig())
	}

	restConfig, err := clientcmd.BuildConfigFromFlags("", opts.Kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig %q: %w", opts.Kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return fmt.Errorf("create Kubernetes client: %w", err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := kubeletplugin.NewMetrics(reg)
	if opts.MetricsAddress != "" {
		srv := &http.Server{Addr: opts.MetricsAddress, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				klog.FromContext(ctx).Error(err, "Metrics server stopped", "address", opts.MetricsAddress)
			}
		}()
		defer func() { _ = srv.Close() }()
	}

	return kubeletplugin.Run(ctx, kubeletplugin.Config{
		NodeName:     opts.NodeName,
		KubeClient:   client,
		Backend:      backend,
		Slices:       opts.SliceConfig(),
		CDIRoot:      opts.CDIRoot,
		RegistrarDir: opts.RegistrarDir,
		PluginDir:    opts.PluginDir(),
		Metrics:      metrics,
	})
}
