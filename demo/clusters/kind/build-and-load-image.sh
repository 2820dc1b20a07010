#!/usr/bin/env bash
# Builds the gputopo image (hack/build-image.sh) and loads it into the kind
# nodes, so the chart runs it without a registry.
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
need "$KIND"
need_engine

IMAGE="$IMAGE" TAG="$TAG" "$REPO_ROOT/hack/build-image.sh"
"$KIND" load docker-image "$IMAGE:$TAG" --name "$CLUSTER_NAME"
echo "loaded $IMAGE:$TAG into kind cluster $CLUSTER_NAME"
