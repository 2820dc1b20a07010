#!/usr/bin/env bash
# Builds nvidia-cdi-hook, the NVIDIA Container Toolkit's CDI hook program,
# from the toolkit module at the version go.mod requires: a tool of the
# module, so always the version of the nvcdi library that writes the hooks
# into the specs. The plugin installs it onto each node and the specs run
# it there, on the host, whatever the host's libc: it is linked statically.
#
#   hack/build-cdi-hook.sh OUTDIR      # writes OUTDIR/nvidia-cdi-hook
#
# Used by `make build`, the container image and `make gpu-check-bundle`.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: hack/build-cdi-hook.sh OUTDIR}"
go="${GO:-go}"
module=github.com/NVIDIA/nvidia-container-toolkit
version=$("$go" list -m -f '{{.Version}}' "$module")
mkdir -p "$out"
# The toolkit links go-nvml, whose dlopen draws a linker warning in a
# static binary; no hook command loads NVML, so the warning is dropped.
"$go" build -trimpath -tags=netgo,osusergo \
  -ldflags="-s -w -linkmode=external -extldflags=-static -X $module/internal/info.version=$version" \
  -o "$out/" "$module/cmd/nvidia-cdi-hook" 2>&1 |
  { grep -vE "dlopen' in statically linked|_Cfunc_dlopen|^# $module/cmd/nvidia-cdi-hook$" || true; }
test "${PIPESTATUS[0]}" -eq 0
