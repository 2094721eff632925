#!/usr/bin/env bash
# The second call (prepared; no device was lent for it on 2026-11-28): the gradient of a
# gather that picks one element per line (cross-entropy's) as an elementwise select that
# fuses into the softmax gradient's row kernel, where it was a zero fill and a scatter. The
# CUDA tests on the device, cross-entropy with and without its gradient built before
# (.gpu/gpu-before, at c068fa4) and after, interleaved twice; the copy, softmax and
# cross-entropy rows with every kernel specialised and every kernel size-generic,
# interleaved twice; the training steps once; then PyTorch's rows and W7 reduce-overhead.
#   here:  scripts/gpu-build, .gpu/gpu-before built at c068fa4 and stripped, then
#          `tar -czf .gpu.tar.gz .gpu` (carry .gpu.tar.gz)
#   there: tar -xzf .gpu.tar.gz && benches/results/gpu-2026-11-28-sizes/run2.sh "$OUT"
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-gpu-results}; mkdir -p "$out"; log="$out/sizes2.txt"
source scripts/gpu-env > /dev/null
export KILN_REQUIRE_NVRTC=1 KILN_REQUIRE_GPU=1
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  echo "== tests"
  KILN_GPU_PROGRAMS=10 timeout 120 .gpu/main cuda:: on_cuda sizes:: 2>&1 \
    | grep -E 'FAILED|test result|panicked|left|right'
  for round in 1 2; do
    echo "== cross-entropy before, round $round"; timeout 40 .gpu/gpu-before --json --only ce 2>&1 | grep '^{'
    echo "== cross-entropy after, round $round"; timeout 40 .gpu/gpu --json --only ce 2>&1 | grep '^{'
  done
  for round in 1 2; do
    for policy in specialize generic; do
      echo "== rows, KILN_SIZES=$policy, round $round"
      KILN_SIZES=$policy timeout 60 .gpu/gpu --json --only w1,w3,ce 2>&1 | grep '^{'
    done
  done
  echo "== training steps"; timeout 60 .gpu/gpu --json --only train 2>&1 | grep -E '^\{|compiled'
  echo "== torch"
  KILN_ANCHORS=.gpu PYTHONUNBUFFERED=1 timeout 90 python3 scripts/gpu_torch_anchor.py --only w1,w3,ce 2>&1 | grep '^{'
  echo "== torch w7 reduce-overhead"
  (cd .gpu && PYTHONUNBUFFERED=1 timeout 60 python3 w7_modes.py reduce_overhead 2>&1 | grep '^{')
} > "$log" 2>&1
cat "$log"
