#!/usr/bin/env bash
# The fifth call: the training-step rows of the build with the cheaper recording (scalar
# operands as fills of the result's shape, inline inputs and shapes) with graphs off and on,
# interleaved twice, then PyTorch's W7 reduce-overhead (fused AdamW) and W4 modes.
#   run there: benches/results/gpu-2026-11-27-graphs/run5.sh "$OUT"
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-gpu-results}; mkdir -p "$out"; log="$out/graphs5.txt"
source scripts/gpu-env > /dev/null
built_in=$(cat .gpu/built-in); [ -e "$built_in" ] || { mkdir -p "$(dirname "$built_in")"; ln -s "$PWD" "$built_in"; }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  for round in 1 2; do
    echo "== graphs off $round"; KILN_CUDA_GRAPHS=0 timeout 50 .gpu/gpu --json --only train 2>&1 | grep -E '^\{|compiled'
    echo "== graphs on $round"; timeout 50 .gpu/gpu --json --only train 2>&1 | grep -E '^\{|compiled'
  done
  echo "== torch w7 modes"
  (cd .gpu && PYTHONUNBUFFERED=1 timeout 60 python3 w7_modes.py reduce_overhead 2>&1 | grep '^{')
  echo "== torch w4"
  KILN_ANCHORS=.gpu PYTHONUNBUFFERED=1 timeout 80 python3 scripts/gpu_torch_anchor.py --only w4 2>&1 | grep '^{'
} > "$log" 2>&1
cat "$log"
