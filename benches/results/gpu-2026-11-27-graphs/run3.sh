#!/usr/bin/env bash
# The third call: graph updates walk only the steps whose values changed, and the host share
# leaves the compiling block out. The graph and index tests on the device, the training-step
# rows with graphs off and on interleaved twice, then PyTorch's W7 in reduce-overhead mode
# with fused AdamW and W4 eager / compiled / reduce-overhead.
#   run there: benches/results/gpu-2026-11-27-graphs/run3.sh "$OUT"
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-gpu-results}; mkdir -p "$out"; log="$out/graphs3.txt"
source scripts/gpu-env > /dev/null
export KILN_REQUIRE_NVRTC=1 KILN_REQUIRE_GPU=1 INSTA_WORKSPACE_ROOT="$PWD" INSTA_UPDATE=no
built_in=$(cat .gpu/built-in); [ -e "$built_in" ] || { mkdir -p "$(dirname "$built_in")"; ln -s "$PWD" "$built_in"; }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  echo "== tests"
  timeout 100 .gpu/main cuda::graphs cuda::index cuda::a_compiled cuda::modules 2>&1 | grep -E '^test |test result|panicked'
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
