#!/usr/bin/env bash
# gputopo's hardware check, run from its bundle (hack/gpu-check-bundle.sh)
# on a machine with an NVIDIA GPU and its driver; needs nothing else (no Go,
# no network, no cluster, no container runtime). It
#   1. compares what gputopo-kubelet-plugin publishes (--backend=nvml
#      --print-resource-slices) with nvidia-smi and sysfs: GPUs, bus IDs,
#      PCIe roots, NUMA nodes, memory, driver/CUDA versions, NVLink,
#   2. writes the CDI spec of a one-GPU claim (--print-cdi-spec), checks that
#      the CDI library accepts it and that every host path in it exists,
#   3. starts a container with runc and that spec (device nodes, driver
#      libraries, nvidia-cdi-hook hooks) and runs nvidia-smi -L inside: it
#      must list exactly the claim's GPU.
# Exits 1 on any mismatch, 2 when the machine cannot run the check.
# (No head in pipelines: with pipefail, a writer it cuts off fails the
# script.)
#
#   sudo ./run.sh [--dry-run] [OUTDIR]      # default OUTDIR: ./out
#
# --dry-run does steps 1 and 2 and starts no container (no root needed).
# Environment: NVIDIA_DRIVER_ROOT (default /; /run/nvidia/driver with the
# GPU Operator), NVIDIA_CDI_HOOK_PATH (a host's hook instead of the
# bundled one), GPUCHECK_NODE (default: hostname), RUNC (a runc to use).
# For testing the script: GPUCHECK_PLUGIN_ARGS replaces --backend=nvml,
# GPUCHECK_SYSFS replaces /sys, GPUCHECK_DRIVER_PROC replaces
# /proc/driver/nvidia/version.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DRY=0
if [ "${1:-}" = --dry-run ]; then DRY=1; shift; fi
OUT="${1:-$HERE/out}"
DRIVER_ROOT="${NVIDIA_DRIVER_ROOT:-/}"
NODE="${GPUCHECK_NODE:-$(hostname)}"
SYSFS="${GPUCHECK_SYSFS:-/sys}"
PROC_VERSION="${GPUCHECK_DRIVER_PROC:-/proc/driver/nvidia/version}"
read -r -a BACKEND <<<"${GPUCHECK_PLUGIN_ARGS:---backend=nvml}"
step() { printf '\n== %s\n' "$*"; }
cannot() { printf 'gpu-check: %s\n' "$*" >&2; exit 2; }

# The driver: its kernel module and nvidia-smi.
SMI=$(command -v nvidia-smi || true)
ROOT_SMI="${DRIVER_ROOT%/}/usr/bin/nvidia-smi"
if [ -z "$SMI" ] && [ -x "$ROOT_SMI" ]; then SMI="$ROOT_SMI"; fi
if [ ! -r "$PROC_VERSION" ] || [ -z "$SMI" ]; then
  why=""
  [ -r "$PROC_VERSION" ] || why="no $PROC_VERSION: the nvidia kernel module is not loaded"
  [ -n "$SMI" ] || why="${why:+$why; }no nvidia-smi on PATH nor at $ROOT_SMI"
  cannot "no NVIDIA driver found on this machine ($why). Run this on a machine with an NVIDIA GPU and its driver installed (NVIDIA_DRIVER_ROOT=/run/nvidia/driver for the GPU Operator's driver container)."
fi
mkdir -p "$OUT"
echo "driver: $(head -n1 "$PROC_VERSION")"
if ! "$HERE/bin/gputopo-kubelet-plugin" --help >/dev/null 2>"$OUT/plugin-start.log"; then
  cat "$OUT/plugin-start.log" >&2
  cannot "bin/gputopo-kubelet-plugin does not start here (see above; $(sed -n 3p "$HERE/MANIFEST" 2>/dev/null))"
fi

step "nvidia-smi"
"$SMI" >"$OUT/nvidia-smi.txt"
"$SMI" --query-gpu=index,uuid,pci.bus_id,memory.total,driver_version,name \
  --format=csv,noheader,nounits >"$OUT/nvidia-smi-query.csv"
cat "$OUT/nvidia-smi-query.csv"
topo=()
if "$SMI" topo -m >"$OUT/nvidia-smi-topo.txt" 2>&1; then
  topo=(-topo "$OUT/nvidia-smi-topo.txt")
else
  echo "nvidia-smi topo -m failed (see $OUT/nvidia-smi-topo.txt); NVLink is not compared"
fi
status=()
if "$SMI" nvlink --status >"$OUT/nvidia-smi-nvlink.txt" 2>&1 && grep -q 'Link [0-9]' "$OUT/nvidia-smi-nvlink.txt"; then
  status=(-nvlink-status "$OUT/nvidia-smi-nvlink.txt")
else
  echo "nvidia-smi nvlink --status shows no links; active link counts are not compared"
fi

PLUGIN=("$HERE/bin/gputopo-kubelet-plugin" "${BACKEND[@]}" --node-name="$NODE" --nvidia-driver-root="$DRIVER_ROOT")
if [ -n "${NVIDIA_CDI_HOOK_PATH:-}" ]; then
  PLUGIN+=(--nvidia-cdi-hook-path="$NVIDIA_CDI_HOOK_PATH")
else
  PLUGIN+=(--cdi-hook-source="$HERE/bin/nvidia-cdi-hook")
fi

step "published ResourceSlices vs nvidia-smi and sysfs"
"${PLUGIN[@]}" --print-resource-slices >"$OUT/resourceslices.yaml" 2>"$OUT/plugin.log" || {
  cat "$OUT/plugin.log" >&2
  exit 1
}
fail=0
"$HERE/bin/gpucheck" facts -slices "$OUT/resourceslices.yaml" -smi-query "$OUT/nvidia-smi-query.csv" \
  -smi "$OUT/nvidia-smi.txt" -sysfs "$SYSFS" "${topo[@]}" "${status[@]}" || fail=1

step "CDI spec of a one-GPU claim"
device=$(grep -m1 -oE 'name: gpu-[0-9]+' "$OUT/resourceslices.yaml" | cut -d' ' -f2 || true)
uuid=""
if [ -z "$device" ]; then
  echo "MISMATCH: no GPU published; see $OUT/plugin.log"
  fail=1
elif "${PLUGIN[@]}" --print-cdi-spec="$device" >"$OUT/cdi-spec.json" 2>>"$OUT/plugin.log"; then
  "$HERE/bin/gpucheck" cdi "$OUT/cdi-spec.json" || fail=1
  uuid=$(grep -m1 -oE 'GPU-[0-9a-fA-F-]{36}' "$OUT/cdi-spec.json" | sed -n 1p || true)
else
  echo "MISMATCH: --print-cdi-spec=$device failed:"
  tail -n 5 "$OUT/plugin.log"
  fail=1
fi

step "a container with that spec runs nvidia-smi -L"
if [ "$DRY" = 1 ]; then
  echo "not checked: dry run, no container started"
elif [ -z "$uuid" ]; then
  echo "not checked: no CDI spec of a GPU to start a container with"
elif [ "$(id -u)" != 0 ]; then
  cannot "starting a container needs root: sudo $0 $*"
else
  runc=""
  for r in "${RUNC:-}" "$HERE/bin/runc" "$(command -v runc || true)"; do
    if [ -n "$r" ] && [ -x "$r" ] && "$r" --version >/dev/null 2>&1; then runc=$r; break; fi
  done
  if [ -z "$runc" ]; then
    [ ! -x "$HERE/bin/runc" ] || "$HERE/bin/runc" --version || true
    cannot "no runc starts here: the bundled one needs libseccomp.so.2 (apt-get install libseccomp2, dnf install libseccomp) and glibc 2.34+; or set RUNC to a runc"
  fi
  c="$OUT/container"
  rm -rf "$c" && mkdir -p "$c/cdi"
  cp -a "$HERE/rootfs" "$c/rootfs"
  cp "$OUT/cdi-spec.json" "$c/cdi/"
  id=$(grep -oE '"name": *"[^"]+"' "$OUT/cdi-spec.json" | sed -nE '1s/.*"([^"]+)"$/\1/p')
  (cd "$c" && "$runc" spec)
  # nvidia-smi by the path the spec mounts it at: a driver under
  # /usr/local/nvidia is mounted there, off the container's default PATH
  # (CUDA images add /usr/local/nvidia/bin to theirs).
  smi_in=$(grep -oE '"containerPath": *"[^"]*/nvidia-smi"' "$OUT/cdi-spec.json" | sed -nE '1s/.*"([^"]+)"$/\1/p' || true)
  "$HERE/bin/gpucheck" oci -config "$c/config.json" -cdi-dir "$c/cdi" -device "gputopo.dev/gpu=$id" -- "${smi_in:-nvidia-smi}" -L
  name="gputopo-gpu-check-$$"
  if "$runc" --root "$OUT/runc-state" run --bundle "$c" "$name" >"$OUT/container-nvidia-smi-L.txt" 2>"$OUT/container.log"; then
    cat "$OUT/container-nvidia-smi-L.txt"
    if [ "$(grep -c '^GPU [0-9]' "$OUT/container-nvidia-smi-L.txt")" = 1 ] && grep -q "UUID: $uuid" "$OUT/container-nvidia-smi-L.txt"; then
      echo "ok: the container sees exactly the claim's GPU ($device, $uuid)"
    else
      echo "MISMATCH: the container of a claim for $device ($uuid) lists the GPUs above"
      fail=1
    fi
  else
    echo "MISMATCH: the container did not run (runc: $runc):"
    cat "$OUT/container.log" "$OUT/container-nvidia-smi-L.txt"
    fail=1
  fi
  "$runc" --root "$OUT/runc-state" delete -f "$name" >/dev/null 2>&1 || true
fi

step "machine"
echo "GPUs: $(cut -d, -f6 "$OUT/nvidia-smi-query.csv" | sort | uniq -c | sed 's/^ *//' | paste -sd';' -)"
echo "driver: $(cut -d, -f5 "$OUT/nvidia-smi-query.csv" | sed -n 1p | tr -d ' ')"
echo "kernel: $(uname -r)"
echo "bundle: $(head -n1 "$HERE/MANIFEST" 2>/dev/null || echo unknown)"
echo "outputs: $OUT (record them in docs/hardware.md)"
if [ "$fail" -ne 0 ]; then
  printf '\ngpu-check: MISMATCHES (see above)\n'
  exit 1
fi
if [ "$DRY" = 1 ]; then
  printf '\ngpu-check: OK (dry run: no container started)\n'
else
  printf '\ngpu-check: OK\n'
fi
