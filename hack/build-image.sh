#!/usr/bin/env bash
# Builds the gputopo container image (deployments/container/Dockerfile) with
# the three binaries: gputopo-kubelet-plugin, gputopo-controller, gputopo.
#
#   hack/build-image.sh                       # ghcr.io/gputopo/gputopo:dev
#   IMAGE=registry.example.com/gputopo TAG=v0.1.0 hack/build-image.sh
#   PUSH=1 PLATFORMS=linux/amd64,linux/arm64 hack/build-image.sh   # buildx, multi-arch
#
# hack/build-image-oci.sh (make image-oci) builds the same image without
# Docker or a registry, as an OCI layout tarball.
#
# Needs docker with BuildKit (Docker 23+ default) or podman/buildah-compatible
# `docker` CLI. The binaries use cgo (NVML is loaded with dlopen), so a
# multi-arch build runs the compiler under emulation (QEMU) for foreign
# platforms.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="${IMAGE:-ghcr.io/gputopo/gputopo}"
TAG="${TAG:-dev}"
DOCKER="${DOCKER:-docker}"
VERSION="${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo "$TAG")}"

if ! command -v "$DOCKER" >/dev/null 2>&1; then
  cat >&2 <<MSG
build-image: '$DOCKER' was not found, so the image cannot be built here.
Install Docker (with BuildKit) or set DOCKER to a compatible CLI (e.g.
DOCKER=podman), then run hack/build-image.sh again. The Dockerfile is
deployments/container/Dockerfile; build it from the repository root:
  docker build -f deployments/container/Dockerfile -t $IMAGE:$TAG .
Without Docker, 'make image-oci' (hack/build-image-oci.sh) builds the same
files as an OCI layout tarball, for 'ctr images import' or 'docker load'.
MSG
  exit 1
fi
if ! "$DOCKER" info >/dev/null 2>&1; then
  echo "build-image: '$DOCKER' is installed but its daemon is not reachable ('$DOCKER info' failed); start it and retry." >&2
  exit 1
fi

args=(-f deployments/container/Dockerfile --build-arg "VERSION=$VERSION" -t "$IMAGE:$TAG")
if [ -n "${PLATFORMS:-}" ]; then
  # Multi-platform images cannot be loaded into the local image store: push.
  out=(--push)
  [ -n "${PUSH:-}" ] || { echo "build-image: PLATFORMS needs PUSH=1 (a multi-arch image can only be pushed)" >&2; exit 1; }
  DOCKER_BUILDKIT=1 "$DOCKER" buildx build --platform "$PLATFORMS" "${args[@]}" "${out[@]}" .
else
  DOCKER_BUILDKIT=1 "$DOCKER" build "${args[@]}" .
  if [ -n "${PUSH:-}" ]; then
    "$DOCKER" push "$IMAGE:$TAG"
  fi
fi
echo "build-image: built $IMAGE:$TAG ($VERSION)"
