//go:build tools

package hack

import (
	_ "k8s.io/dynamic-resource-allocation/kubeletplugin"
	_ "k8s.io/dynamic-resource-allocation/structured"
	_ "k8s.io/dynamic-resource-allocation/deviceattribute"
	_ "k8s.io/dynamic-resource-allocation/resourceslice"
	_ "github.com/NVIDIA/go-nvml/pkg/nvml"
	_ "github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	_ "tags.cncf.io/container-device-interface/pkg/cdi"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "k8s.io/component-base/logs"
	_ "sigs.k8s.io/yaml"
	_ "github.com/google/go-cmp/cmp"
)
