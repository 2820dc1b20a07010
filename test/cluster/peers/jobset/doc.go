// Package jobset pins the JobSet controller (sigs.k8s.io/jobset) that the
// local cluster runs for the suites that ask for it. It is a module of its
// own so that JobSet's Kubernetes libraries never move those of the
// Kubernetes binaries (test/cluster's go.mod).
package jobset
