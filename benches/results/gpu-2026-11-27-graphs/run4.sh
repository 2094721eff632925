#!/usr/bin/env bash
# The fourth call: where a W7 step's time goes on the device. The profiles of an eager W4 and
# W7 step (KILN_GPU_PROFILE=1: every step waits for the device, and the profile splits the
# host's issuing from the wait), then the training-step rows of the committed build once with
# graphs off and once on.
#   run there: benches/results/gpu-2026-11-27-graphs/run4.sh "$OUT"
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-gpu-results}; mkdir -p "$out"; log="$out/graphs4.txt"
source scripts/gpu-env > /dev/null
built_in=$(cat .gpu/built-in); [ -e "$built_in" ] || { mkdir -p "$(dirname "$built_in")"; ln -s "$PWD" "$built_in"; }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  echo "== profiles"
  KILN_GPU_PROFILE=1 timeout 120 .gpu/gpu --json --only train 2>&1
  echo "== graphs off"; KILN_CUDA_GRAPHS=0 timeout 50 .gpu/gpu --json --only train 2>&1 | grep -E '^\{|compiled'
  echo "== graphs on"; timeout 50 .gpu/gpu --json --only train 2>&1 | grep -E '^\{|compiled'
} > "$log" 2>&1
tail -c 6000 "$log"
