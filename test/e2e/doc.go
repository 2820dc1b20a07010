// Package e2e is gputopo's end-to-end suite of the kubelet plugin. It
// starts one local Kubernetes cluster (test/cluster; 1.37, or 1.36) with real kubelets
// on a fake container runtime, the real gputopo kubelet plugin on each of
// them, and kubelet-less fake nodes, then drives the driver through the API
// as a user would: the claim templates of demo/specs, pods, node labels and
// the simulated GPUs' health file.
//
// Run it with `make e2e`, or:
//
//	make build && cd test/e2e && GPUTOPO_BIN=$PWD/../../bin go test -count=1 -v -timeout 30m -p 1 ./...
//
// GPUTOPO_BIN is the directory holding gputopo-kubelet-plugin and
// gputopo-controller (the repository's bin/ by default); the Kubernetes
// binaries come from $GPUTOPO_K8S_BIN or ~/.cache/gputopo/k8s-VERSION/bin
// (`make k8s-binaries`), VERSION the release $GPUTOPO_K8S_VERSION names
// (e.g. 1.36), the newest supported if unset. Tests of what only 1.37
// serves skip on 1.36, saying why (`make test-matrix` runs both).
//
// The suite starts one cluster in a fresh directory under $TMPDIR
// (gte2e*) and removes it when every test passed. On a failure it keeps
// it, prints its path and the tails of the scheduler's, kubelets' and
// plugins' logs; GPUTOPO_E2E_KEEP=1 keeps it after a pass too.
//
// The controller's suite is test/e2e/placement, with its own cluster of 32
// nodes; test/e2e/parity compares the controller with kube-scheduler on
// generated cases, on a cluster of 4 fake nodes (`make parity` runs more
// of them). What the suites share (starting the cluster, polling, the
// plugin's state on a node) is in test/e2e/framework. `go test ./...` runs
// them all; a lock file ($TMPDIR/gputopo-e2e.lock) makes each wait for the
// cluster before it to stop, and `make e2e` runs the packages one at a
// time (-p 1).
package e2e
