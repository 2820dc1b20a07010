# shellcheck shell=bash
# Settings shared by the kind scripts; source it, do not run it.
#   CLUSTER_NAME     kind cluster name (default gputopo)
#   KIND_NODE_IMAGE  node image (default: kind v0.33.0's Kubernetes v1.37.0 image)
#   IMAGE, TAG       gputopo image (default ghcr.io/gputopo/gputopo:dev)
#   KIND, KUBECTL    the kind and kubectl commands
set -euo pipefail
KIND_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$KIND_DIR/../../.." && pwd)"
CLUSTER_NAME="${CLUSTER_NAME:-gputopo}"
KIND_NODE_IMAGE="${KIND_NODE_IMAGE:-kindest/node:v1.37.0@sha256:a1ed56cfb0e7b93589bdf97c8cd566405a265939e3620fc4f5de89adff580ae5}"
IMAGE="${IMAGE:-ghcr.io/gputopo/gputopo}"
TAG="${TAG:-dev}"
KIND="${KIND:-kind}"
KUBECTL="${KUBECTL:-kubectl}"
NAMESPACE="${NAMESPACE:-gputopo}"
export CLUSTER_NAME KIND_NODE_IMAGE IMAGE TAG KIND KUBECTL NAMESPACE KIND_DIR REPO_ROOT

need() {
  local cmd
  for cmd in "$@"; do
    if ! command -v "$cmd" >/dev/null 2>&1; then
      echo "$(basename "$0"): '$cmd' is required but not installed" >&2
      exit 1
    fi
  done
}

# kind needs a running container engine: Docker, or podman/nerdctl through
# KIND_EXPERIMENTAL_PROVIDER.
need_engine() {
  if [ -z "${KIND_EXPERIMENTAL_PROVIDER:-}" ] && ! docker info >/dev/null 2>&1; then
    echo "$(basename "$0"): no running Docker ('docker info' failed); kind runs its nodes as containers." >&2
    echo "  Start Docker, or set KIND_EXPERIMENTAL_PROVIDER=podman (or nerdctl)." >&2
    exit 1
  fi
}

# kubectl against the kind cluster, whatever the current context is.
k() { "$KUBECTL" --context "kind-$CLUSTER_NAME" "$@"; }
