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
	"sync/atomic"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	"github.com/gputopo/gputopo/pkg/command"
	"github.com/gputopo/gputopo/pkg/controller"
)

func main() {
	if err := run(); err != nil && !errors.Is(err, command.ErrHelp) {
		fmt.Fprintf(os.Stderr, "gputopo-controller: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	opts := controller.NewOptions()
	fs := pflag.NewFlagSet("gputopo-controller", pflag.ContinueOnError)
	opts.AddFlags(fs)
	flush, err := command.Parse(fs, os.Args[1:], opts.Validate)
	if err != nil {
		return err
	}
	defer flush()
	ctx, stop := command.Context()
	defer stop()
	command.SetMemoryLimit(ctx, memlimit.FromCgroup)
	client, err := command.Client(opts.Kubeconfig, command.ClientOptions{QPS: opts.KubeAPIQPS, Burst: opts.KubeAPIBurst, NoCompression: !opts.KubeAPICompression, ContentType: opts.KubeAPIContentType})
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
	reg := command.Registry()
	cfg := opts.Config()
	cfg.Client, cfg.Network, cfg.Metrics = client, mapping.Mapping(), controller.NewMetrics(reg)
	ctrl, err := controller.New(cfg)
	if err != nil {
		return err
	}
	var leading atomic.Bool
	defer command.ServeMetrics(ctx, opts.MetricsAddress, reg, opts.Profiling, readiness(ctrl, opts.LeaderElect, &leading))()
	mapping.OnChange(ctrl.SetLabelMapping)
	if !opts.LeaderElect {
		return ctrl.Run(ctx)
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: opts.LeaderElectionNamespace, Name: "gputopo-controller"},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: opts.LeaderElectionIdentity},
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
			OnStartedLeading: func(ctx context.Context) {
				leading.Store(true)
				runErr = ctrl.Run(ctx)
			},
			OnStoppedLeading: func() { klog.FromContext(ctx).Info("Lost the leader Lease; stopping") },
		},
	})
	return runErr
}

// readiness is what /readyz answers. The leader is ready once it has
// synced every pod group of its caches once. A replica waiting for the
// leader Lease is ready too: it is healthy, and a rollout must be able to
// count it; its body says "standby" so that whoever needs the leader's
// state (a test after a restart) can tell the two apart.
func readiness(ctrl *controller.Controller, leaderElect bool, leading *atomic.Bool) command.Readiness {
	return func() (bool, string) {
		switch {
		case ctrl.Ready():
			return true, "ok"
		case leaderElect && !leading.Load():
			return true, "standby: waiting for the leader Lease"
		default:
			return false, "syncing: the caches, or the first pass over the pod groups they hold, are not done"
		}
	}
}
