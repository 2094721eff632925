# The record of the 2026-12-08 sitting: kiln binaries built at a7d45e7 (bg-before-pf) and at
# the code of 43a37d9 (bg-after-wo) with `cargo build --release -p kiln-models --example bench_generate`,
# copied to /tmp; llama-bench built from llama-cpp-python 0.3.36's vendor/llama.cpp. The
# repository's own script for such a sitting is benches/peers/quant_sitting.
set -u
cd /work/main
OUT=benches/results/quant-2026-12-08-llama-cpp
{ echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"; echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores"; echo "vector flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(fma|avx2|f16c|avx512f|avx512_vnni|avx_vnni)$' | tr '\n' ' ')"; echo "kiln before: 5e87fe4^^ (a7d45e7, /tmp/bg-before-pf); kiln after: 5e87fe4 + the weight-only Q8_0/Q4_0 intrinsics loops (/tmp/bg-after-wo)"; echo "llama.cpp: vendor/llama.cpp of llama-cpp-python 0.3.36, cmake -DGGML_NATIVE=ON -DLLAMA_CURL=OFF, Release; llama-bench -t 2 -p 512 -n 32 -r 3"; } > $OUT/machine.txt
for r in 1 2; do
  echo "=== round $r $(date +%T)"
  for q in q8_0 q4_0; do
    for v in before-pf after-wo; do
      echo -n "$v $q f32 activations: "; /tmp/bg-$v --model target/checkpoints/llama-125m-$q.gguf --keep-quantized --new 32 --reps 3 2>&1 | tail -1
      echo -n "$v $q int8 activations: "; /tmp/bg-$v --model target/checkpoints/llama-125m-$q.gguf --keep-quantized --int8-activations --new 32 --reps 3 2>&1 | tail -1
    done
    /tmp/llama-src/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-bench -m target/checkpoints/llama-125m-$q.gguf -t 2 -p 512 -n 32 -r 3 -o md 2>/dev/null | grep -E "\| llama"
  done
done
