package command

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/klog/v2"
)

// MinKubernetesVersion is the oldest Kubernetes minor release gputopo runs
// on, the oldest the e2e suites pass on (docs/versions.md). 1.36 is the
// first with MutatingAdmissionPolicy GA and on (the scheduling-gate policy)
// and with consumable capacity (GPU shares) on by default; the chart's
// kubeVersion says the same.
const MinKubernetesVersion = "1.36"

// CheckServerVersion asks the API server for its version and returns an
// error of one line, naming the version found and the minimum, when it is
// older than MinKubernetesVersion. Both daemons call it before they start,
// so an older cluster gets that line and a process that exits, not a
// half-working install. An API server that does not answer is asked again
// for up to a minute (it may still be starting) before it is an error too.
func CheckServerVersion(ctx context.Context, client discovery.ServerVersionInterface) error {
	var found string
	backoff := wait.Backoff{Duration: time.Second, Factor: 2, Steps: 6, Cap: 20 * time.Second}
	var lastErr error
	err := wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
		info, err := client.ServerVersion()
		if err != nil {
			lastErr = err
			klog.FromContext(ctx).V(2).Info("Asking the API server for its version", "err", err)
			return false, nil
		}
		found = info.GitVersion
		if found == "" {
			found = "v" + info.Major + "." + info.Minor
		}
		return true, nil
	})
	if err != nil {
		if lastErr == nil {
			lastErr = err
		}
		return fmt.Errorf("ask the API server for its Kubernetes version (gputopo needs %s or newer): %w", MinKubernetesVersion, lastErr)
	}
	return SupportedVersion(found)
}

// SupportedVersion returns nil for a Kubernetes version (as /version's
// gitVersion gives it: v1.36.3, v1.36.3-eks-1234, v1.37.0-rc.1) of
// MinKubernetesVersion or newer, and otherwise an error naming it and the
// minimum.
func SupportedVersion(gitVersion string) error {
	v, err := version.ParseGeneric(gitVersion)
	if err != nil {
		return fmt.Errorf("the API server reports Kubernetes version %q, which is not a version gputopo can read; gputopo needs %s or newer", gitVersion, MinKubernetesVersion)
	}
	minimum := version.MustParseGeneric(MinKubernetesVersion)
	if v.Major() < minimum.Major() || (v.Major() == minimum.Major() && v.Minor() < minimum.Minor()) {
		return fmt.Errorf("the cluster runs Kubernetes %s, which gputopo does not support: it needs %s or newer (consumable capacity on by default, MutatingAdmissionPolicy GA); upgrade the cluster", gitVersion, MinKubernetesVersion)
	}
	return nil
}
