// Command gputopo-controller places multi-pod GPU jobs: it picks the leaf
// or adjacent leaves where a whole job fits, as the scheduler's own DRA
// allocator judges it, pins the pods there and releases them to the
// built-in kube-scheduler all at once.
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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/component-base/logs"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/controller"
	"github.com/gputopo/gputopo/pkg/topology"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "gputopo-controller: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	nl := topology.DefaultNetworkLabels()
	var (
		kubeconfig, metricsAddr, leaseNS, identity string
		leaderElect                                bool
		retry                                      time.Duration
	)
	host, _ := os.Hostname()
	fs := pflag.NewFlagSet("gputopo-controller", pflag.ContinueOnError)
	fs.StringVar(&kubeconfig, "kubeconfig", "", "Kubeconfig file; empty uses the in-cluster configuration.")
	fs.StringVar(&metricsAddr, "metrics-address", ":9401", "Address serving Prometheus metrics on /metrics; empty disables it.")
	fs.BoolVar(&leaderElect, "leader-elect", true, "Run only while holding the leader Lease, so replicas never plan at the same time.")
	fs.StringVar(&leaseNS, "leader-election-namespace", envOr("POD_NAMESPACE", "kube-system"), "Namespace of the leader Lease.")
	fs.StringVar(&identity, "leader-election-identity", envOr("POD_NAME", host), "This replica's name in the Lease.")
	fs.DurationVar(&retry, "retry-interval", 30*time.Second, "How often groups that did not fit are planned again.")
	fs.StringSliceVar(&nl.Leaf, "leaf-labels", nl.Leaf, "Node labels naming the leaf switch, first present wins.")
	fs.StringSliceVar(&nl.Spine, "spine-labels", nl.Spine, "Node labels naming the spine switch, first present wins.")
	logConfig := logsapi.NewLoggingConfiguration()
	logsapi.AddFlags(logConfig, fs)
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if err := nl.Validate(); err != nil {
		return err
	}
	if err := logsapi.ValidateAndApply(logConfig, nil); err != nil {
		return err
	}
	defer logs.FlushLogs()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, klog.Background())

	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig %q: %w", kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("create Kubernetes client: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if metricsAddr != "" {
		srv := &http.Server{Addr: metricsAddr, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				klog.FromContext(ctx).Error(err, "Metrics server stopped", "address", metricsAddr)
			}
		}()
		defer func() { _ = srv.Close() }()
	}
	ctrl, err := controller.New(controller.Config{Client: client, Network: nl, Metrics: controller.NewMetrics(reg), RetryInterval: retry})
	if err != nil {
		return err
	}
	if !leaderElect {
		return ctrl.Run(ctx)
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: leaseNS, Name: "gputopo-controller"},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: identity},
	}
	var runErr error
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   15 * time.Second,
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     2 * time.Second,
		ReleaseOnCancel: true,
		Name:            "gputopo-controller",
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) { runErr = ctrl.Run(ctx) },
			OnStoppedLeading: func() { klog.FromContext(ctx).Info("Lost the leader Lease; stopping") },
		},
	})
	return runErr
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
