#!/usr/bin/env bash
# The integer prefill products (quant::gemm), interleaved A/B on this machine: kiln before
# (BEFORE: a bench_generate built at the commit before them) and after (this tree's), round
# by round with PyTorch's eager f32 and dynamic int8 (decode_anchor.py) and llama.cpp's
# llama-bench on the same GGUF files (Q8_0, Q4_0; 2 threads, 512-token prompt, 32 new tokens).
# Batch 1; kiln: decode tokens/s over 31 greedy steps after a 32-token prompt, prefill
# tokens/s of a 512-token prompt, medians of three runs.
#
#   BEFORE=... PY=... LLAMA_CPP=... CKPT=target/checkpoints ROUNDS=2 \
#     benches/results/quant-2026-12-02-prefill/run.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=benches/results/quant-2026-12-02-prefill
ROUNDS=${ROUNDS:-2}
CKPT=${CKPT:-target/checkpoints}
AFTER=target/release/examples/bench_generate
{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"
  echo "vector flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(fma|avx2|f16c|avx512f|avx512bw|avx512_vnni|avx512_bf16)$' | tr '\n' ' ')"
  echo "kiln after: $(git rev-parse --short HEAD); before: $BEFORE"
  echo "peers: $("$PY" -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")'), llama.cpp from llama-cpp-python 0.3.36"
  echo "rounds: $ROUNDS"
} | tee "$OUT/machine.txt"
kiln() { # NAME BINARY ARGS...
  local name=$1 bin=$2; shift 2
  echo "--- $name $*"
  timeout 900 "$bin" --new 32 --reps 3 --json "$OUT/kiln-$name.jsonl" "$@" || echo "failed: $name $*"
}
for r in $(seq 1 "$ROUNDS"); do
  echo "=== round $r $(date +%T)"
  for side in before after; do
    bin=$AFTER; [ "$side" = before ] && bin=$BEFORE
    kiln "$side" "$bin" --model "$CKPT/llama-125m"
    kiln "$side" "$bin" --model "$CKPT/llama-125m" --quantize int8 --int8-activations
    kiln "$side" "$bin" --model "$CKPT/llama-125m-q8_0.gguf" --keep-quantized --int8-activations
    kiln "$side" "$bin" --model "$CKPT/llama-125m-q4_0.gguf" --keep-quantized --int8-activations
  done
  for q in q8_0 q4_0; do
    timeout 900 "$LLAMA_CPP/build/bin/llama-bench" -m "$CKPT/llama-125m-$q.gguf" -t 2 -p 512 -n 32 \
      -r 3 -o jsonl >> "$OUT/llama_cpp.jsonl" 2>> "$OUT/llama_cpp.log" || echo "failed: llama.cpp $q"
  done
  (cd benches/peers && timeout 1800 "$PY" decode_anchor.py --device cpu --new 32 --prompt 32 \
     --prefill 512 --dtypes float32 --modes eager,dynamic_int8 --only llama) \
     >> "$OUT/peers.jsonl" || echo "failed: decode_anchor"
done
echo "records: $OUT"
