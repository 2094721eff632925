#!/usr/bin/env bash
# Size-generic kernels on a GPU, in one call: the CUDA and size tests on the device (random
# programs replayed at other sizes, eager lengths and a ragged compiled step counting NVRTC
# compiles), the same subset with every kernel size-generic (KILN_SIZES=generic), then
# examples/bench_sizes --cuda specialised and as it is, then the training-step rows of
# examples/gpu with every kernel specialised (KILN_SIZES=specialize) and every kernel
# size-generic (KILN_SIZES=generic), interleaved twice. Everything into "$1/sizes.txt".
#   here:  scripts/gpu-build
#   there: benches/results/gpu-2026-11-28-sizes/run.sh "$OUT"
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-gpu-results}; mkdir -p "$out"; log="$out/sizes.txt"
source scripts/gpu-env > /dev/null
export KILN_REQUIRE_NVRTC=1 KILN_REQUIRE_GPU=1 INSTA_WORKSPACE_ROOT="$PWD" INSTA_UPDATE=no
built_in=$(cat .gpu/built-in); [ -e "$built_in" ] || { mkdir -p "$(dirname "$built_in")"; ln -s "$PWD" "$built_in"; }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  echo "== tests (KILN_SIZES unset)"
  KILN_GPU_PROGRAMS=20 timeout 180 .gpu/main cuda:: on_cuda sizes:: 2>&1 \
    | grep -E '^test |test result|panicked|left|right|compiled|NVRTC'
  echo "== tests (KILN_SIZES=generic)"
  KILN_SIZES=generic KILN_GPU_PROGRAMS=10 timeout 80 .gpu/main cuda::random_programs_on_the_gpu \
    sizes:: cuda::a_compiled 2>&1 | grep -E '^test |test result|panicked|left|right'
  for policy in specialize auto; do
    echo "== bench_sizes --cuda, KILN_SIZES=$policy"
    KILN_SIZES=$policy timeout 60 .gpu/bench_sizes --cuda 2>&1
  done
  for round in 1 2; do
    for policy in specialize generic; do
      echo "== training steps, KILN_SIZES=$policy, round $round"
      KILN_SIZES=$policy timeout 60 .gpu/gpu --json --only train 2>&1 | grep -E '^\{|compiled'
    done
  done
} > "$log" 2>&1
cat "$log"
