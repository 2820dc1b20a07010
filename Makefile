SHELL := /bin/bash
# gputopo — see README.md. Every target works on a fresh machine with Go;
# the Kubernetes binaries for the local cluster are built from source on
# first use (about 12 minutes on 2 cores) and cached.
#
# K8S_VERSION picks the Kubernetes release of the local cluster (e.g. 1.36;
# `bin/localcluster versions` lists them); empty is the newest supported.
# It reaches localcluster and the tests as GPUTOPO_K8S_VERSION.

GO          ?= go
BIN         := $(CURDIR)/bin
CLUSTER_DIR ?= /tmp/gputopo-demo
TOPOLOGY    ?= $(CURDIR)/test/cluster/topologies/demo-topology.yaml
LOCALCLUSTER := $(BIN)/localcluster
K8S_VERSION ?= $(GPUTOPO_K8S_VERSION)
export GPUTOPO_K8S_VERSION := $(K8S_VERSION)
E2E_TIMEOUT ?= 60m
# Build flags of the project's binaries (the container image, hack/gpu-check.sh
# and hack/verify-chart-cluster.sh use the same).
# grpcnotrace leaves out gRPC's golang.org/x/net/trace, whose html/template
# calls methods by name through reflection: with it linked, the linker keeps
# every exported method of every type it keeps (the whole clientset,
# informers and apply configurations), which nearly doubles the kubelet
# plugin's code. -s -w leave out the symbol table and DWARF, which are never
# loaded into memory.
BUILD_FLAGS ?= -tags=grpcnotrace -ldflags='-s -w'

.PHONY: all build test test-matrix unit e2e test-peers peer-binaries peer-jobset parity soak chart lint demo demo-loop demo-down bench bench-scale bench-native k8s-binaries gpu-check-bundle runtime-deps image image-oci verify-chart verify-chart-cluster lint-dockerfile clean

all: build

# bin/nvidia-cdi-hook is the NVIDIA Container Toolkit's hook at the version
# go.mod requires, which the plugin installs onto each GPU node for its
# CDI specs (hack/build-cdi-hook.sh).
build:
	$(GO) build $(BUILD_FLAGS) -o $(BIN)/ ./cmd/...
	GO=$(GO) hack/build-cdi-hook.sh $(BIN)
	ln -sf gputopo $(BIN)/kubectl-gputopo
	ln -sf gputopo $(BIN)/kubectl_complete-gputopo

$(LOCALCLUSTER): FORCE
	cd test/cluster && $(GO) build -o $(LOCALCLUSTER) ./cmd/localcluster

FORCE:

# The Kubernetes binaries of K8S_VERSION, etcd included, and containerd for
# the nodes that run real containers, built from the Go module proxy; and
# what those nodes take from the host (runc, busybox-static), from Debian.
k8s-binaries: $(LOCALCLUSTER) runtime-deps
	$(LOCALCLUSTER) build

runtime-deps:
	hack/install-runtime-deps.sh

# The workload controllers the peers suite (test/e2e/peers) runs beside
# gputopo: JobSet, LeaderWorkerSet and Kueue, each built from the Go module
# proxy in a module of its own (test/cluster/peers/*), with its CRDs and
# webhook configurations, into ~/.cache/gputopo/peers/bin (GPUTOPO_PEERS_BIN).
peer-binaries: $(LOCALCLUSTER)
	$(LOCALCLUSTER) build-peers

# JobSet alone, which the native suite (test/e2e/native, part of `make e2e`)
# runs. Its module requires the same versions of every library it shares
# with the Kubernetes binaries, so after `k8s-binaries` only
# controller-runtime and JobSet itself are left to compile
# (docs/benchmarks.md, "Build times").
peer-jobset: $(LOCALCLUSTER)
	$(LOCALCLUSTER) build-peers --peers jobset

# Everything CI runs: formatting and vet, unit tests, the end-to-end suite
# on a real local cluster of the newest supported Kubernetes release, and
# the Helm chart rendered and installed there.
test: lint unit e2e chart

# The end-to-end suites (`make e2e`) on every supported Kubernetes release,
# newest first (docs/versions.md): each release's binaries are built once
# (cold: 12 minutes or more on 2 cores each) and cached beside the others.
# Every release runs even when one fails; the logs of each are in
# _output/matrix/VERSION/, and the summary says which failed.
test-matrix: $(LOCALCLUSTER)
	@failed=; for v in $$($(LOCALCLUSTER) versions); do \
	  echo "== Kubernetes $$v"; \
	  if $(MAKE) --no-print-directory e2e K8S_VERSION=$$v; then r=PASS; else r=FAIL; failed="$$failed $$v"; fi; \
	  mkdir -p _output/matrix/$$v && cp _output/cluster.log _output/e2e.log _output/matrix/$$v/ 2>/dev/null; \
	  echo "== Kubernetes $$v: $$r"; \
	done; \
	if [ -n "$$failed" ]; then echo "test-matrix: FAILED on$$failed"; exit 1; fi; echo "test-matrix: every supported release passed"

# pkg/clustertopo is a module of its own, so test/cluster can use it
# without taking the root module's dependencies. No cluster starts here:
# test/cluster's cluster tests run only with GPUTOPO_K8S_BIN set (e2e), the
# soak (test/e2e/soak) only with GPUTOPO_SOAK_DURATION set: here only its
# invariant checkers' own tests run.
unit:
	$(GO) test ./...
	cd pkg/clustertopo && $(GO) test ./...
	cd test/cluster && GPUTOPO_K8S_BIN= $(GO) test ./...
	cd test/bench && $(GO) test ./...
	cd hack/ociimage && $(GO) test ./...
	cd test/e2e && GPUTOPO_SOAK_DURATION= $(GO) test ./soak

# First the local cluster itself (test/cluster's TestCluster*: a cluster
# from Start, and `localcluster up` then `down` leaving nothing behind),
# then the end-to-end suite on it, the native suite (workload gates on,
# the JobSet controller beside gputopo) included. Every test that starts a
# cluster holds the local-cluster lock ($${TMPDIR:-/tmp}/gputopo-e2e.lock)
# while it runs.
e2e: build k8s-binaries peer-jobset
	mkdir -p _output
	k8s_bin=$$($(LOCALCLUSTER) bin-dir) && cd test/cluster && GPUTOPO_K8S_BIN=$$k8s_bin GPUTOPO_BIN=$(BIN) $(GO) test -count=1 -timeout 30m -run '^TestCluster' -v . 2>&1 | tee $(CURDIR)/_output/cluster.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|_test.go'; exit $${PIPESTATUS[0]}
	cd test/e2e && GPUTOPO_BIN=$(BIN) $(GO) test -p 1 -count=1 -timeout $(E2E_TIMEOUT) -v $$($(GO) list ./... | grep -v /test/e2e/peers) 2>&1 | tee $(CURDIR)/_output/e2e.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|_test.go'; exit $${PIPESTATUS[0]}

# The peers suite (test/e2e/peers): the real JobSet, LeaderWorkerSet and
# Kueue controllers beside gputopo. Not part of `make test`: LeaderWorkerSet
# and Kueue are still built against Kubernetes libraries of their own
# (v0.36, v0.35), and Kueue's cold build alone took half an hour on 2 cores
# (test/cluster/README.md, "Peers"); once built they relink in under a
# minute. `make e2e` runs JobSet in the native suite.
test-peers: build k8s-binaries peer-binaries
	mkdir -p _output
	cd test/e2e && GPUTOPO_BIN=$(BIN) $(GO) test -count=1 -timeout $(E2E_TIMEOUT) -v ./peers 2>&1 | tee $(CURDIR)/_output/peers.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|_test.go'; exit $${PIPESTATUS[0]}

# The differential test against kube-scheduler (test/e2e/parity): PARITY_CASES
# generated cases (seed PARITY_SEED), each run through kube-scheduler alone
# and opted in to gputopo on one local cluster; prints how many agree, by
# shape. PARITY_SHAPES (comma-separated) runs only the cases of those shapes.
# `make e2e` runs 30 of them. Not part of `make test`.
PARITY_CASES  ?= 300
PARITY_SEED   ?= 1
PARITY_SHAPES ?=
parity: build k8s-binaries
	mkdir -p _output
	cd test/e2e && GPUTOPO_BIN=$(BIN) GPUTOPO_PARITY_CASES=$(PARITY_CASES) GPUTOPO_PARITY_SEED=$(PARITY_SEED) GPUTOPO_PARITY_SHAPES=$(PARITY_SHAPES) \
	  $(GO) test -count=1 -timeout $(E2E_TIMEOUT) -v -run 'TestParityShort' ./parity 2>&1 | tee $(CURDIR)/_output/parity.log | grep -E '^(--- |PASS|FAIL|ok|panic|parity:)|DISAGREE|^(shape|gpu-|shared-|admin-|missing-|other-|extended-)'; exit $${PIPESTATUS[0]}

# The fault soak (test/e2e/soak): SOAK_DURATION of seeded random workload
# (seed SOAK_SEED) on the local cluster while nodes are deleted or go
# NotReady and the plugins, the controller, kube-scheduler and
# kube-apiserver restart; the invariants are checked every second and the
# first breach fails it. Prints a summary (docs/benchmarks.md, "Soak").
# Not part of `make test`.
SOAK_DURATION ?= 20m
SOAK_SEED     ?= 1
SOAK_TIMEOUT  ?= 90m
soak: build k8s-binaries
	mkdir -p _output
	cd test/e2e && GPUTOPO_BIN=$(BIN) GPUTOPO_SOAK_DURATION=$(SOAK_DURATION) GPUTOPO_SOAK_SEED=$(SOAK_SEED) \
	  $(GO) test -count=1 -timeout $(SOAK_TIMEOUT) -v -run 'TestSoak$$' ./soak 2>&1 | tee $(CURDIR)/_output/soak.log | grep -E '^(--- |PASS|FAIL|ok|panic|soak:)'; exit $${PIPESTATUS[0]}

# The Helm chart: lint and template checks, then an install into the local
# cluster whose DaemonSet and Deployment run from the project's image
# (built without Docker) on a containerd node.
chart: verify-chart verify-chart-cluster

verify-chart:
	hack/verify-chart.sh

verify-chart-cluster: build k8s-binaries
	hack/verify-chart-cluster.sh

# The hardware check bundle: everything a machine with only an NVIDIA driver
# needs to check gputopo (no Go, no network), in _output/gpu-check/; copy it
# there and run its run.sh (docs/hardware.md).
gpu-check-bundle:
	GO=$(GO) hack/gpu-check-bundle.sh _output/gpu-check

# The container image with Docker (deployments/container/Dockerfile).
image:
	hack/build-image.sh

# The same image without Docker or a registry: an OCI layout tarball,
# _output/image/gputopo-image.oci.tar, named ghcr.io/gputopo/gputopo:<the
# chart's appVersion> (IMAGE and TAG override): the binaries of `make build`
# on Debian's libc6 (hack/build-image-oci.sh). Load it with
# `ctr -n k8s.io images import` or `docker load`.
image-oci: build
	hack/build-image-oci.sh

lint-dockerfile:
	hack/lint-dockerfile.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd pkg/clustertopo && $(GO) vet ./...
	cd test/cluster && $(GO) vet ./...
	cd test/e2e && $(GO) vet ./...
	cd test/bench && $(GO) vet ./...
	cd hack/ociimage && $(GO) vet ./...

# Start the local cluster with simulated GPUs, run the demo workloads and
# print where everything landed. The cluster keeps running: `make demo-down`.
demo: build k8s-binaries $(LOCALCLUSTER)
	GPUTOPO_BIN=$(BIN) CLUSTER_DIR=$(CLUSTER_DIR) TOPOLOGY=$(TOPOLOGY) ./demo/local.sh

# `make demo` N times in a row (default 20): how many were green and the
# Job's creation-to-Running latency. Not part of `make test`.
demo-loop:
	hack/demo-loop.sh $(or $(N),20)

demo-down: $(LOCALCLUSTER)
	$(LOCALCLUSTER) down --dir $(CLUSTER_DIR)

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./pkg/...

# Scale on the local cluster with kubelet-less fake nodes (docs/benchmarks.md,
# "Scale"); not part of `make test`. It holds the local-cluster lock, so it
# waits for a running e2e suite. Pick the run with BENCH_SCALE_ARGS, e.g.
#   make bench-scale BENCH_SCALE_ARGS='--spines=10'                    # 1,000 nodes
#   make bench-scale BENCH_SCALE_ARGS='--mode=controller --spines=10 --leaves-per-spine=50'
#   make bench-scale BENCH_SCALE_ARGS='--mode=plugin'
BENCH_SCALE_ARGS ?= --mode=throughput
# Head-to-head against kube-scheduler's own workload-aware scheduling
# (docs/benchmarks.md, "Against kube-scheduler's workload-aware scheduling"):
# one seeded stream of Jobs through native gang + leaf key, native gang +
# spine key, gputopo allocating, gputopo with the scheduler allocating and
# plain kube-scheduler, on one cluster with the workload gates on.
#   make bench-native                                                  # 100 nodes
#   make bench-native BENCH_NATIVE_ARGS='--spines=10 --leaves-per-spine=10'   # 1,000 nodes
bench-native: build k8s-binaries
	@mkdir -p _output
	cd test/bench && $(GO) build -o $(BIN)/benchscale ./cmd/benchscale
	flock $${TMPDIR:-/tmp}/gputopo-e2e.lock $(BIN)/benchscale --mode=native --bin-dir=$(BIN) --report=_output/bench-native.md --json=_output/bench-native.json $(BENCH_NATIVE_ARGS)

bench-scale: build k8s-binaries
	mkdir -p _output
	cd test/bench && $(GO) build -o $(BIN)/benchscale ./cmd/benchscale
	flock $${TMPDIR:-/tmp}/gputopo-e2e.lock $(BIN)/benchscale --bin-dir=$(BIN) --report=_output/bench-scale.md --json=_output/bench-scale.json $(BENCH_SCALE_ARGS)

clean:
	rm -rf $(BIN) _output
