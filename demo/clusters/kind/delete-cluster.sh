#!/usr/bin/env bash
# Deletes the kind cluster (and with it everything installed into it).
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "$0")/common.sh"
need "$KIND"
"$KIND" delete cluster --name "$CLUSTER_NAME"
