package framework

import (
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes"
)

// ServesDeviceTaintRules reports whether the API server serves
// DeviceTaintRules in resource.k8s.io/v1: from Kubernetes 1.37 on, by
// default. 1.36 serves them only in v1beta2 with the beta gate
// DRADeviceTaintRules, which is off by default; gputopo's controller
// watches them only at v1, as kube-scheduler 1.37 applies them.
func ServesDeviceTaintRules(client kubernetes.Interface) bool {
	list, err := client.Discovery().ServerResourcesForGroupVersion(resourcev1.SchemeGroupVersion.String())
	if err != nil {
		return false
	}
	for _, r := range list.APIResources {
		if r.Name == "devicetaintrules" {
			return true
		}
	}
	return false
}

// ServerVersion is the API server's gitVersion, e.g. "v1.36.3".
func ServerVersion(client kubernetes.Interface) string {
	info, err := client.Discovery().ServerVersion()
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return info.GitVersion
}

// RequireDeviceTaintRules skips a test about DeviceTaintRules on a cluster
// that does not serve them in resource.k8s.io/v1 (Kubernetes 1.36), saying
// so.
func RequireDeviceTaintRules(t *testing.T, client kubernetes.Interface) {
	t.Helper()
	if !ServesDeviceTaintRules(client) {
		t.Skipf("Kubernetes %s does not serve DeviceTaintRules in resource.k8s.io/v1 (GA and on by default from 1.37; on 1.36 beta, off by default, in v1beta2)", ServerVersion(client))
	}
}
