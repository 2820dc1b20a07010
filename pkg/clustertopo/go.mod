module github.com/gputopo/gputopo/pkg/clustertopo

go 1.26.8

require (
	github.com/google/go-cmp v0.7.0
	k8s.io/apimachinery v0.37.2
	sigs.k8s.io/yaml v1.6.0
)

require (
	github.com/go-logr/logr v1.4.4 // indirect
	go.yaml.in/yaml/v2 v2.4.4 // indirect
	k8s.io/klog/v2 v2.140.0 // indirect
	k8s.io/utils v0.0.0-20260626114624-be93311217bd // indirect
)
