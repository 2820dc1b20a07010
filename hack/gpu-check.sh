#!/usr/bin/env bash
# Checks gputopo against a real machine with an NVIDIA GPU and driver:
#   1. builds gputopo-kubelet-plugin and hack/gpucheck,
#   2. prints the node's ResourceSlices (--backend=nvml --print-resource-slices)
#      and compares bus IDs, PCIe roots and NUMA nodes with sysfs, memory and
#      driver/CUDA versions with nvidia-smi, NVLink peers, domains and blocks
#      with `nvidia-smi topo -m`, active links with `nvidia-smi nvlink --status`,
#   3. prints the CDI spec of a one-GPU claim (--print-cdi-spec) and checks
#      that the CDI library accepts it and that every host path in it exists.
# Exits non-zero on any mismatch. Needs Go and nvidia-smi; no cluster, no
# root (NVML and the device nodes are readable by users on most hosts).
#
#   hack/gpu-check.sh [OUTDIR]        # default _output/gpu-check
#
# Environment: NVIDIA_DRIVER_ROOT (default /), NVIDIA_CDI_HOOK_PATH (default
# /usr/bin/nvidia-cdi-hook), GPUCHECK_NODE (default: hostname). For testing
# the script itself: GPUCHECK_PLUGIN_ARGS replaces --backend=nvml,
# GPUCHECK_SYSFS replaces /sys.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${1:-_output/gpu-check}"
mkdir -p "$OUT"
DRIVER_ROOT="${NVIDIA_DRIVER_ROOT:-/}"
HOOK="${NVIDIA_CDI_HOOK_PATH:-/usr/bin/nvidia-cdi-hook}"
NODE="${GPUCHECK_NODE:-$(hostname)}"
SYSFS="${GPUCHECK_SYSFS:-/sys}"
read -r -a BACKEND <<<"${GPUCHECK_PLUGIN_ARGS:---backend=nvml}"
step() { printf '\n== %s\n' "$*"; }

if ! command -v nvidia-smi >/dev/null; then
  echo "gpu-check: nvidia-smi not found: run this on a machine with an NVIDIA GPU and driver" >&2
  exit 2
fi

step "build"
go build -tags=grpcnotrace -ldflags="-s -w" -o "$OUT/gputopo-kubelet-plugin" ./cmd/gputopo-kubelet-plugin
go build -o "$OUT/gpucheck" ./hack/gpucheck
echo "built into $OUT"

step "nvidia-smi"
nvidia-smi >"$OUT/nvidia-smi.txt"
nvidia-smi --query-gpu=index,uuid,pci.bus_id,memory.total,driver_version,name \
  --format=csv,noheader,nounits >"$OUT/nvidia-smi-query.csv"
cat "$OUT/nvidia-smi-query.csv"
topo=()
if nvidia-smi topo -m >"$OUT/nvidia-smi-topo.txt" 2>&1; then
  topo=(-topo "$OUT/nvidia-smi-topo.txt")
else
  echo "nvidia-smi topo -m failed (see $OUT/nvidia-smi-topo.txt); NVLink is not compared"
fi
status=()
if nvidia-smi nvlink --status >"$OUT/nvidia-smi-nvlink.txt" 2>&1 && grep -q 'Link [0-9]' "$OUT/nvidia-smi-nvlink.txt"; then
  status=(-nvlink-status "$OUT/nvidia-smi-nvlink.txt")
else
  echo "nvidia-smi nvlink --status shows no links; active link counts are not compared"
fi

PLUGIN=("$OUT/gputopo-kubelet-plugin" "${BACKEND[@]}" --node-name="$NODE"
  --nvidia-driver-root="$DRIVER_ROOT" --nvidia-cdi-hook-path="$HOOK")

step "published ResourceSlices vs nvidia-smi and sysfs"
"${PLUGIN[@]}" --print-resource-slices >"$OUT/resourceslices.yaml" 2>"$OUT/plugin.log" || {
  cat "$OUT/plugin.log" >&2
  exit 1
}
fail=0
"$OUT/gpucheck" facts -slices "$OUT/resourceslices.yaml" -smi-query "$OUT/nvidia-smi-query.csv" \
  -smi "$OUT/nvidia-smi.txt" -sysfs "$SYSFS" "${topo[@]}" "${status[@]}" || fail=1

step "CDI spec of a one-GPU claim"
device=$(grep -m1 -oE 'name: gpu-[0-9]+' "$OUT/resourceslices.yaml" | cut -d' ' -f2 || true)
if [ -z "$device" ]; then
  echo "MISMATCH: no GPU published; see $OUT/plugin.log"
  fail=1
else
  if "${PLUGIN[@]}" --print-cdi-spec="$device" >"$OUT/cdi-spec.json" 2>>"$OUT/plugin.log"; then
    "$OUT/gpucheck" cdi "$OUT/cdi-spec.json" || fail=1
  else
    echo "MISMATCH: --print-cdi-spec=$device failed:"
    tail -n 5 "$OUT/plugin.log"
    fail=1
  fi
fi

step "machine"
echo "GPUs: $(cut -d, -f6 "$OUT/nvidia-smi-query.csv" | sort | uniq -c | sed 's/^ *//' | paste -sd';' -)"
echo "driver: $(cut -d, -f5 "$OUT/nvidia-smi-query.csv" | head -n1 | tr -d ' ')"
echo "kernel: $(uname -r)"
echo "outputs: $OUT (record them in docs/hardware.md)"
if [ "$fail" -ne 0 ]; then
  printf '\ngpu-check: MISMATCHES (see above)\n'
  exit 1
fi
printf '\ngpu-check: OK\n'
