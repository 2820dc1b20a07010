#!/usr/bin/env bash
# Runs `make demo` N times in a row (default 20) and reports how many were
# green and the Job's creation-to-Running latency (p50, p99) over the green
# runs. Usage: hack/demo-loop.sh [N]. Logs: _output/demo-loop/run-<i>.log.
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:-20}
out=_output/demo-loop
mkdir -p "$out"
make build k8s-binaries >/dev/null || exit 1
green=0
: >"$out/latency.txt"
for i in $(seq 1 "$n"); do
  start=$(date +%s)
  if make demo >"$out/run-$i.log" 2>&1; then
    green=$((green + 1))
    status=green
    grep -oE 'all pods Running in [0-9.]+s' "$out/run-$i.log" | grep -oE '[0-9.]+' >>"$out/latency.txt"
  else
    status=RED
  fi
  echo "run $i/$n: $status in $(($(date +%s) - start))s"
done
make demo-down >/dev/null 2>&1 || true
sort -n "$out/latency.txt" | awk -v green="$green" -v n="$n" '
  { v[NR] = $1 }
  END {
    printf "%d of %d green\n", green, n
    if (NR == 0) exit
    p50 = v[int((NR - 1) * 0.50) + 1]; p99 = v[int((NR - 1) * 0.99) + 1]
    printf "Job train-2x8 created -> all pods Running: p50 %.2fs, p99 %.2fs, max %.2fs over %d runs\n", p50, p99, v[NR], NR
  }'
[ "$green" -eq "$n" ]
