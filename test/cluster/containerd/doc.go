// Package containerd pins the containerd release that the local cluster
// runs on its real-runtime nodes. It is a module of its own so that
// containerd's dependencies never move those of the Kubernetes binaries
// (test/cluster's go.mod); test/cluster builds the tools listed in its
// go.mod with the same flags every time, so a rebuild only relinks.
package containerd
