#!/usr/bin/env bash
# Creates the kind cluster of kind-cluster.yaml (Kubernetes 1.37, four
# workers on two leaves, CDI on). Needs kind and a running Docker (or
# KIND_EXPERIMENTAL_PROVIDER=podman).
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
need "$KIND" "$KUBECTL"
need_engine

# Kubernetes 1.37 node images need a kind release that knows them (v0.33.0+).
kind_version=$("$KIND" version | grep -Eo 'v[0-9]+\.[0-9]+\.[0-9]+' | head -n1 || true)
if [ -n "$kind_version" ] && [ "$(printf '%s\nv0.33.0\n' "$kind_version" | sort -V | head -n1)" != "v0.33.0" ]; then
  echo "create-cluster: kind $kind_version is older than v0.33.0; 1.37 node images may not start" >&2
fi

if "$KIND" get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
  echo "kind cluster $CLUSTER_NAME already exists (delete-cluster.sh removes it)"
else
  "$KIND" create cluster --name "$CLUSTER_NAME" --image "$KIND_NODE_IMAGE" \
    --config "$KIND_DIR/kind-cluster.yaml" --wait 5m
fi
k get nodes -L fabric.topograph.run/tier-1,fabric.topograph.run/tier-0,gputopo.dev/profile
