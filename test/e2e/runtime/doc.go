// Package runtime is the end-to-end suite on a node that runs real
// containers: containerd 2.x with runc, reading the CDI specs the gputopo
// kubelet plugin writes. Each test asserts from inside a container what it
// received. `make e2e` runs it; it needs root, runc and busybox-static
// (`make runtime-deps`) and the containerd `localcluster build` makes.
package runtime
