#!/usr/bin/env bash
# The third call: the build before the cache, the cache under KILN_CUDA_ROW_CACHE 0 and 32,
# and .gpu/gpu-lb (the cache's kernels declared with at least 1024 threads resident per
# multiprocessor, which caps them at 64 registers), interleaved twice, into "$1/bounds.txt".
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-gpu-results}; mkdir -p "$out"; log="$out/bounds.txt"
source scripts/gpu-env > /dev/null
export KILN_REQUIRE_NVRTC=1
{
  for round in 1 2; do
    echo "== before, round $round"; timeout 60 .gpu/gpu-before --json --only w3,ce 2>&1 | grep '^{'
    for c in 0 32; do
      echo "== cache $c, round $round"
      KILN_CUDA_ROW_CACHE=$c timeout 60 .gpu/gpu --json --only w3,ce 2>&1 | grep '^{'
    done
    echo "== cache 32 bounded, round $round"
    KILN_CUDA_ROW_CACHE=32 timeout 60 .gpu/gpu-lb --json --only w3,ce 2>&1 | grep '^{'
  done
} > "$log" 2>&1
python3 - "$log" <<'PY'
import json, sys, collections
rows = collections.defaultdict(dict); label = None
for line in open(sys.argv[1]):
    if line.startswith("=="): label = line[3:].strip().split(", round")[0]; continue
    if line.startswith("{"):
        r = json.loads(line)
        if r["variant"] == "fused": rows[r["workload"]].setdefault(label, []).append(r["median_ms"])
for w, by in rows.items():
    print(w, "  ".join(f"{k}: {min(v):.4f}" for k, v in by.items()))
PY
