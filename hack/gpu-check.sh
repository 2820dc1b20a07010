#!/usr/bin/env bash
# Checks gputopo against this machine's NVIDIA GPU and driver: builds the
# hardware check bundle (hack/gpu-check-bundle.sh) into OUTDIR/bundle and
# runs it (its run.sh says what is checked). Needs Go here; to check a
# machine without Go, build the bundle elsewhere (make gpu-check-bundle)
# and copy it there.
#
#   hack/gpu-check.sh [OUTDIR] [--dry-run]     # default _output/gpu-check-run
#
# The environment of run.sh applies (NVIDIA_DRIVER_ROOT, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-_output/gpu-check-run}"
shift || true
mkdir -p "$(dirname "$OUT")"
hack/gpu-check-bundle.sh "$OUT/bundle" >"$OUT.bundle.log" 2>&1 || { cat "$OUT.bundle.log" >&2; exit 1; }
exec "$OUT/bundle/run.sh" "$@" "$OUT"
