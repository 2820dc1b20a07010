SHELL := /bin/bash
# gputopo — see README.md. Every target works on a fresh machine with Go;
# the Kubernetes binaries for the local cluster are built from source on
# first use (about 12 minutes on 2 cores) and cached.

GO          ?= go
BIN         := $(CURDIR)/bin
CLUSTER_DIR ?= /tmp/gputopo-demo
TOPOLOGY    ?= $(CURDIR)/test/cluster/topologies/demo-topology.yaml
LOCALCLUSTER := $(BIN)/localcluster
E2E_TIMEOUT ?= 60m

.PHONY: all build test unit e2e chart lint demo demo-loop demo-down bench k8s-binaries image verify-chart verify-chart-cluster lint-dockerfile clean

all: build

build:
	$(GO) build -o $(BIN)/ ./cmd/...
	ln -sf gputopo $(BIN)/kubectl-gputopo

$(LOCALCLUSTER): FORCE
	cd test/cluster && $(GO) build -o $(LOCALCLUSTER) ./cmd/localcluster

FORCE:

# The Kubernetes binaries, etcd included, built from the Go module proxy.
k8s-binaries: $(LOCALCLUSTER)
	$(LOCALCLUSTER) build

# Everything CI runs: formatting and vet, unit tests, the end-to-end suite
# on a real local cluster, and the Helm chart rendered and installed there.
test: lint unit e2e chart

# pkg/clustertopo is a module of its own, so test/cluster can use it
# without taking the root module's dependencies.
unit:
	$(GO) test ./...
	cd pkg/clustertopo && $(GO) test ./...
	cd test/cluster && $(GO) test ./...

e2e: build k8s-binaries
	mkdir -p _output
	cd test/e2e && GPUTOPO_BIN=$(BIN) $(GO) test -p 1 -count=1 -timeout $(E2E_TIMEOUT) -v ./... 2>&1 | tee $(CURDIR)/_output/e2e.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|_test.go'; exit $${PIPESTATUS[0]}

# The Helm chart: lint and template checks, then an install into the local
# cluster with the plugin and controller running on the chart's RBAC.
chart: verify-chart verify-chart-cluster

verify-chart:
	hack/verify-chart.sh

verify-chart-cluster: build k8s-binaries
	hack/verify-chart-cluster.sh

image:
	hack/build-image.sh

lint-dockerfile:
	hack/lint-dockerfile.sh

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	cd pkg/clustertopo && $(GO) vet ./...
	cd test/cluster && $(GO) vet ./...
	cd test/e2e && $(GO) vet ./...

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

clean:
	rm -rf $(BIN) _output
