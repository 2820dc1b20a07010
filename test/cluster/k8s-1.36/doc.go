// Package k8s136 pins Kubernetes v1.36, the oldest minor release gputopo
// supports, for the local cluster (test/cluster builds it with
// `localcluster build --version v1.36.3`, or GPUTOPO_K8S_VERSION). It is a
// module of its own because one module can require only one version of
// k8s.io/kubernetes and its staging modules; the newest supported release
// is test/cluster's own go.mod. The binaries are built with the same flags
// every time, so a rebuild only relinks.
package k8s136
