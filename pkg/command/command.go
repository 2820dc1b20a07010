// Package command holds what gputopo's daemons share around their logic:
// flag parsing with component-base logging, a signal-aware context, a
// Kubernetes client from a kubeconfig, and the Prometheus endpoint.
package command

import (
	"context"
	"errors"
	"fmt"
	"net/http"
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
)

// ErrHelp is returned by Parse when the user asked for --help.
var ErrHelp = pflag.ErrHelp

// Parse adds the logging flags to fs, parses args, runs validate and
// applies the logging configuration. The returned function flushes logs.
func Parse(fs *pflag.FlagSet, args []string, validate func() error) (flush func(), err error) {
	logConfig := logsapi.NewLoggingConfiguration()
	logsapi.AddFlags(logConfig, fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if validate != nil {
		if err := validate(); err != nil {
			return nil, err
		}
	}
	if err := logsapi.ValidateAndApply(logConfig, nil); err != nil {
		return nil, err
	}
	return logs.FlushLogs, nil
}

// Context is cancelled on SIGINT or SIGTERM and carries the klog logger.
func Context() (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	return klog.NewContext(ctx, klog.Background()), stop
}

// Client builds a clientset from a kubeconfig file, or from the in-cluster
// configuration when the path is empty. qps and burst limit requests to the
// API server; zero keeps client-go's defaults (5 and 10).
func Client(kubeconfig string, qps float32, burst int) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %q: %w", kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = qps, burst
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("create Kubernetes client: %w", err)
	}
	return client, nil
}

// Registry returns a registry with the Go and process collectors.
func Registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// ServeMetrics serves reg on addr/metrics until the returned function is
// called; an empty addr serves nothing.
func ServeMetrics(ctx context.Context, addr string, reg *prometheus.Registry) (stop func()) {
	if addr == "" {
		return func() {}
	}
	srv := &http.Server{Addr: addr, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Metrics server stopped", "address", addr)
		}
	}()
	return func() { _ = srv.Close() }
}
