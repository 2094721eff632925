#!/usr/bin/env python3
"""One side-by-side table from a sitting's records (benches/peers/sitting writes them).

    python3 benches/peers/table.py OUT

OUT holds machine.txt, kiln-after.jsonl (and kiln-before.jsonl for an A/B), and
peers.jsonl. Every figure is the median over the sitting's rounds of a run's median time per
call, in ms; a peer's figure is its best case for the row (e.g. numpy's or PyTorch's fastest
spelling). "× eager" is PyTorch eager's time over kiln's: above 1, kiln is faster."""
import collections, json, os, statistics, sys

# (row, kiln workload prefix, kiln variant, peer workload, peer case prefix)
ROWS = [
    ("W1 elementwise chain, 2^24 f32", "W1", "fused", "W1", "tanh/sigmoid/relu chain"),
    ("W2 broadcast, 4096² f32", "W2", "fused", "W2", "relu(A*col+row)"),
    ("W3 softmax, 4096² f32", "W3", "fused", "W3", "softmax"),
    ("W3 cross-entropy, 4096² f32", "W3 cross-entropy", "fused", "W3", "cross_entropy"),
    ("W4 MLP step (eager)", "W4 MLP step", "eager", "W4", "MLP"),
    ("W4 MLP step (compiled)", "W4 MLP step", "compiled", "W4", "MLP"),
    ("W4s scalar autograd, per iteration", "W4s x²+3x+1, grad, item", "compiled", "W4s",
     "x**2+3x+1, backward, grad.item()"),
    ("W5 matmul 1024³ f32", "W5", "fused", "W5", "matmul 1024^3"),
    ("W5 matmul 1024³ bf16 (kiln) vs f32", "W5", "bf16_dot", "W5", "matmul 1024^3"),
    ("W7 GPT step (compiled, f32)", "W7 GPT step", "compiled", "W7", ""),
    ("W7 GPT step (compiled, bf16 autocast)", "W7 GPT step", "compiled bf16 autocast", "W7", ""),
    ("W8 CNN step (compiled)", "W8 CNN step", "compiled", "W8", ""),
]
PEERS = ["torch", "torch_compile", "numpy", "jax"]


def records(path):
    if not os.path.exists(path):
        return []
    return [json.loads(l) for l in open(path) if l.strip().startswith("{")]


def kiln_ms(recs, prefix, variant):
    vs = [r["median_ms"] for r in recs
          if r["workload"].split(" (")[0] == prefix and r["variant"] == variant]
    return vs


def peer_ms(recs, workload, case, fw):
    by_case = collections.defaultdict(list)
    for r in recs:
        if r.get("workload") == workload and r.get("fw") == fw and r.get("case", "").startswith(case):
            by_case[r.get("case", "")].append(r["median_ms"])
    meds = [statistics.median(v) for v in by_case.values()]
    return min(meds) if meds else None


def cell(v):
    if v is None:
        return "–"
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 100 else f"{v:.0f}"


def main(out):
    print("\n".join(open(os.path.join(out, "machine.txt")).read().strip().splitlines()))
    print()
    kilns = [k for k in ("before", "after") if os.path.exists(os.path.join(out, f"kiln-{k}.jsonl"))]
    kiln = {k: records(os.path.join(out, f"kiln-{k}.jsonl")) for k in kilns}
    peers = records(os.path.join(out, "peers.jsonl"))
    names = [f"kiln {k}" if len(kilns) > 1 else "kiln" for k in kilns]
    head = ["row", *names, "kiln range", "PyTorch eager", "torch.compile", "numpy", "JAX", "× eager", "× best peer"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" + "---:|" * (len(head) - 1))
    for row, kw, kv, pw, pc in ROWS:
        ks = {k: kiln_ms(kiln[k], kw, kv) for k in kilns}
        last = ks[kilns[-1]] if kilns else []
        if not last:
            continue
        med = {k: statistics.median(v) if v else None for k, v in ks.items()}
        p = {fw: peer_ms(peers, pw, pc, fw) for fw in PEERS}
        now = med[kilns[-1]]
        best = min((v for v in p.values() if v), default=None)
        ratio = lambda v: f"{v / now:.2f}" if v and now else "–"
        cells = [row, *(cell(med[k]) for k in kilns), f"{cell(min(last))}–{cell(max(last))}",
                 *(cell(p[fw]) for fw in PEERS), ratio(p["torch"]), ratio(best)]
        print("| " + " | ".join(cells) + " |")
    print()
    print("Milliseconds per call (lower is faster): medians over the rounds of each run's median.")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
