#!/usr/bin/env bash
# The row cache on a GPU, in one call: the row-group tests on the device, then `examples/gpu`
# built before (.gpu/gpu-before: the commit before the cache) and after (.gpu/gpu), the
# softmax and cross-entropy rows interleaved twice, and PyTorch on the same rows last (it
# compiles for minutes; what finishes inside the call comes back). Everything into
# "$1/rows.txt". The first call ran this with a first cache (every shared row, 64 registers,
# no occupancy bound) and also under 256 and 1024 threads; sweep.sh and bounds.sh were the
# second and third calls; the fourth ran this again on the cache as committed.
#   run there: benches/results/gpu-2026-11-27-cache/run.sh "$OUT"
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-gpu-results}; mkdir -p "$out"; log="$out/rows.txt"
source scripts/gpu-env > /dev/null
export KILN_REQUIRE_NVRTC=1 KILN_REQUIRE_GPU=1 INSTA_WORKSPACE_ROOT="$PWD" INSTA_UPDATE=no
built_in=$(cat .gpu/built-in); [ -e "$built_in" ] || { mkdir -p "$(dirname "$built_in")"; ln -s "$PWD" "$built_in"; }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  echo "== tests"
  KILN_GPU_PROGRAMS=30 timeout 200 .gpu/main rows:: reductions:: cuda:: 2>&1 \
    | grep -E '^test |test result|panicked'
  for round in 1 2; do
    echo "== before $round"; timeout 60 .gpu/gpu-before --json --only w3,ce 2>&1 | grep '^{'
    echo "== after $round"; timeout 60 .gpu/gpu --json --only w3,ce 2>&1 | grep '^{'
  done
  echo "== torch"
  KILN_ANCHORS=.gpu PYTHONUNBUFFERED=1 timeout 150 python3 scripts/gpu_torch_anchor.py --only w3,ce 2>&1 | grep '^{'
} > "$log" 2>&1
cat "$log"
