// Command gputopo-controller places multi-pod GPU jobs: it picks the leaf
// or adjacent leaves where a whole job fits, as the scheduler's own DRA
// allocator judges it, pins the pods there and releases them to the
// built-in kube-scheduler all at once.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/command"
	"github.com/gputopo/gputopo/pkg/controller"
	"github.com/gputopo/gputopo/pkg/topology"
)

func main() {
	if err := run(); err != nil && !errors.Is(err, command.ErrHelp) {
		fmt.Fprintf(os.Stderr, "gputopo-controller: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	nl := topology.DefaultLabelMapping()
	var (
		kubeconfig, metricsAddr, leaseNS, identity string
		leaderElect                                bool
		retry                                      time.Duration
		qps                                        float32
		burst                                      int
	)
	host, _ := os.Hostname()
	fs := pflag.NewFlagSet("gputopo-controller", pflag.ContinueOnError)
	fs.StringVar(&kubeconfig, "kubeconfig", "", "Kubeconfig file; empty uses the in-cluster configuration.")
	fs.StringVar(&metricsAddr, "metrics-address", ":9401", "Address serving Prometheus metrics on /metrics; empty disables it.")
	fs.BoolVar(&leaderElect, "leader-elect", true, "Run only while holding the leader Lease, so replicas never plan at the same time.")
	fs.StringVar(&leaseNS, "leader-election-namespace", envOr("POD_NAMESPACE", "kube-system"), "Namespace of the leader Lease.")
	fs.StringVar(&identity, "leader-election-identity", envOr("POD_NAME", host), "This replica's name in the Lease.")
	fs.DurationVar(&retry, "retry-interval", 30*time.Second, "How often groups that did not fit are planned again.")
	fs.Float32Var(&qps, "kube-api-qps", 50, "Requests per second to the API server; placing a pod costs about two.")
	fs.IntVar(&burst, "kube-api-burst", 100, "Burst of requests to the API server, so a large group is pinned and released at once.")
	fs.StringSliceVar(&nl.Leaf, "leaf-labels", nl.Leaf, "Node labels naming the leaf switch, first present wins.")
	fs.StringSliceVar(&nl.Spine, "spine-labels", nl.Spine, "Node labels naming the spine switch, first present wins.")
	flush, err := command.Parse(fs, os.Args[1:], func() error { return nl.Validate() })
	if err != nil {
		return err
	}
	defer flush()
	ctx, stop := command.Context()
	defer stop()
	client, err := command.Client(kubeconfig, qps, burst)
	if err != nil {
		return err
	}
	reg := command.Registry()
	defer command.ServeMetrics(ctx, metricsAddr, reg)()
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
