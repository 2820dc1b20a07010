// Package kueue pins Kueue (sigs.k8s.io/kueue) that the local cluster runs
// for the suites that ask for it. It is a module of its own so that Kueue's
// Kubernetes libraries never move those of the Kubernetes binaries
// (test/cluster's go.mod).
package kueue
