#!/usr/bin/env bash
# CUDA graph replay on a GPU, in one call: the CUDA tests on the device (the graph tests among
# them), then the training-step rows of `examples/gpu` (W4 and W7, eager and compiled) with
# graphs off (KILN_CUDA_GRAPHS=0) and on, interleaved twice, then PyTorch's W7 modes
# (benches/peers/w7_modes.py: eager, torch.compile default and reduce-overhead, fused AdamW)
# and W4 (scripts/gpu_torch_anchor.py) last. Everything into "$1/graphs.txt".
#   run there: benches/results/gpu-2026-11-27-graphs/run.sh "$OUT"
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-gpu-results}; mkdir -p "$out"; log="$out/graphs.txt"
source scripts/gpu-env > /dev/null
export KILN_REQUIRE_NVRTC=1 KILN_REQUIRE_GPU=1 INSTA_WORKSPACE_ROOT="$PWD" INSTA_UPDATE=no
built_in=$(cat .gpu/built-in); [ -e "$built_in" ] || { mkdir -p "$(dirname "$built_in")"; ln -s "$PWD" "$built_in"; }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  echo "== tests"
  KILN_GPU_PROGRAMS=20 timeout 150 .gpu/main cuda:: 2>&1 | grep -E '^test |test result|panicked|left|right|stats|calls'
  for round in 1 2; do
    echo "== graphs off $round"; KILN_CUDA_GRAPHS=0 timeout 50 .gpu/gpu --json --only train 2>&1 | grep -E '^\{|compiled'
    echo "== graphs on $round"; timeout 50 .gpu/gpu --json --only train 2>&1 | grep -E '^\{|compiled'
  done
  echo "== torch w7 modes"
  (cd .gpu && PYTHONUNBUFFERED=1 timeout 150 python3 w7_modes.py reduce_overhead eager_fused_adamw eager compile 2>&1 | grep '^{')
  echo "== torch w4"
  KILN_ANCHORS=.gpu PYTHONUNBUFFERED=1 timeout 40 python3 scripts/gpu_torch_anchor.py --only w4 2>&1 | grep '^{'
} > "$log" 2>&1
cat "$log"
