#!/usr/bin/env bash
# Prepared for a session with a device (not run yet; no device was lent on 2026-11-29): the
# pretrained-models and quantization issues' GPU rows. The quantized models' tests on the
# device (the CUDA products against the CPU's), then decode and prefill tokens/s, batch 1,
# of the 125M Llama and GPT-2 small with random weights (`bench_generate --random`, the
# configs of benches/configs) in f32 and bf16, the Llama with Q8_0, Q4_0, Q4_K and int8
# projections (`quantize_` on the device), and PyTorch's rows on the same shapes
# (transformers' `generate`, eager and static cache with torch.compile).
#   here:  scripts/gpu-build   (carry .gpu.tar.gz)
#   there: tar -xzf .gpu.tar.gz && benches/results/gpu-2026-11-29-generate/run.sh "$OUT"
#          (about 5 minutes)
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-gpu-results}; mkdir -p "$out"; log="$out/generate.txt"; rows="$out/generate.jsonl"
source scripts/gpu-env > /dev/null
export KILN_REQUIRE_NVRTC=1 KILN_REQUIRE_GPU=1
bench() { timeout 120 .gpu/bench_generate --random --cuda --reps 3 --json "$rows" "$@" 2>&1 | tail -2; }
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv
  echo "== quantized models on the device"
  timeout 180 .gpu/models-quantize on_cuda 2>&1 | grep -E 'test result|FAILED|panicked|left|right'
  timeout 120 .gpu/models-lib on_cuda 2>&1 | grep -E 'test result|FAILED|panicked|left|right'
  echo "== kiln"
  for model in llama-125m gpt2-124m; do
    for dtype in f32 bf16; do bench --model ".gpu/configs/$model" --dtype "$dtype"; done
  done
  for kind in q8_0 q4_0 q4_k int8; do bench --model .gpu/configs/llama-125m --quantize "$kind"; done
  echo "== PyTorch"
  (cd .gpu && PYTHONUNBUFFERED=1 timeout 300 python3 decode_anchor.py --device cuda \
    --modes eager,static_compile 2>&1 | grep '^{')
} > "$log" 2>&1
cat "$log"
