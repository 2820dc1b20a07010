package scale

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// KubeadmCPURequests are the CPU requests of kubeadm's static pods for the
// control plane (etcd, kube-apiserver, kube-controller-manager,
// kube-scheduler), in millicores: --cpu-requests=kubeadm.
var KubeadmCPURequests = map[string]int64{
	"etcd":                    100,
	"kube-apiserver":          250,
	"kube-controller-manager": 200,
	"kube-scheduler":          100,
}

// cpuRequestProcs are the processes --cpu-requests may weigh.
var cpuRequestProcs = []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "controller"}

// ParseCPURequests reads "kubeadm,controller=250m" or "NAME=QUANTITY,...":
// each process's CPU request, in millicores, for cluster.Config.CPURequests.
// "kubeadm" adds KubeadmCPURequests; a later entry overrides an earlier one.
func ParseCPURequests(s string) (map[string]int64, error) {
	out := map[string]int64{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "kubeadm" {
			maps.Copy(out, KubeadmCPURequests)
			continue
		}
		name, value, ok := strings.Cut(item, "=")
		if !ok || !slices.Contains(cpuRequestProcs, name) {
			return nil, fmt.Errorf("--cpu-requests entry %q: want kubeadm or NAME=QUANTITY with NAME one of %s, e.g. kubeadm,controller=250m", item, strings.Join(cpuRequestProcs, ", "))
		}
		q, err := resource.ParseQuantity(value)
		if err != nil || q.Sign() <= 0 {
			return nil, fmt.Errorf("--cpu-requests entry %q: %q is not a positive CPU quantity (e.g. 250m or 1)", item, value)
		}
		out[name] = q.MilliValue()
	}
	return out, nil
}
