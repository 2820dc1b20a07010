#!/usr/bin/env bash
# Builds the helm CLI from the Go module proxy (no release download needed)
# into a cache directory and prints its path. Idempotent: a helm of the
# wanted version that is already there is reused.
#
#   hack/install-helm.sh            # -> ~/.cache/gputopo/bin/helm
#   HELM_VERSION=v3.22.0 GPUTOPO_BIN_CACHE=/some/dir hack/install-helm.sh
#
# A cold build (downloads + compile) took about 6 minutes on 2 cores; later
# builds with a warm Go cache only relink (seconds).
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.22.0}"
# The Kubernetes version helm assumes without a cluster (helm template, lint);
# the release Makefile stamps it from client-go, go install does not.
HELM_KUBE_MAJOR="${HELM_KUBE_MAJOR:-1}"
HELM_KUBE_MINOR="${HELM_KUBE_MINOR:-37}"
BIN_DIR="${GPUTOPO_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gputopo/bin}"
HELM="$BIN_DIR/helm"

if ! command -v go >/dev/null 2>&1; then
  echo "install-helm: go is required (Go ${HELM_VERSION} is built from the module proxy)" >&2
  exit 1
fi

if [ -x "$HELM" ] && "$HELM" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION"; then
  echo "$HELM"
  exit 0
fi

major="${HELM_VERSION%%.*}" # v3 or v4
pkg="helm.sh/helm/${major}"
ldflags="-s -w"
ldflags+=" -X ${pkg}/internal/version.version=${HELM_VERSION}"
for p in pkg/chartutil pkg/lint/rules; do
  ldflags+=" -X ${pkg}/${p}.k8sVersionMajor=${HELM_KUBE_MAJOR} -X ${pkg}/${p}.k8sVersionMinor=${HELM_KUBE_MINOR}"
done

mkdir -p "$BIN_DIR"
echo "install-helm: building ${pkg}/cmd/helm@${HELM_VERSION} into $BIN_DIR (cold: several minutes)" >&2
start=$(date +%s)
GOBIN="$BIN_DIR" go install -ldflags="$ldflags" "${pkg}/cmd/helm@${HELM_VERSION}"
echo "install-helm: built in $(( $(date +%s) - start ))s: $("$HELM" version --short)" >&2
echo "$HELM"
