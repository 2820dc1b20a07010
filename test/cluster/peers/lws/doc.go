// Package lws pins the LeaderWorkerSet controller (sigs.k8s.io/lws) that
// the local cluster runs for the suites that ask for it. It is a module of
// its own so that its Kubernetes libraries never move those of the
// Kubernetes binaries (test/cluster's go.mod).
package lws
