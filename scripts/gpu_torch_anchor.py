"""PyTorch on the same GPU workloads as `examples/gpu.rs`, for a side-by-side table.

Prints one JSON object per line as each row is measured: workload, variant (eager,
compiled, or cublas for a product through CuPy's direct cuBLAS call), median_ms, gbps or
gflops, device. The W4 and W7 training steps are those of benches/peers/bench.py w4 and
benches/peers/models.py w7, on the GPU. Run by scripts/gpu-check when PyTorch is importable;
`--only NAME[,NAME]` runs some sections (copy, w1, w3, ce, w5, w4, w7).
"""
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

DRY = "--cpu-dry-run" in sys.argv
REPS = 1 if DRY else 9
SIDES = [64, 300] if DRY else [4096, 16384]  # the softmax and cross-entropy matrices


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_ms(f):
    """Wall time from the call to the device finishing, as examples/gpu.rs measures kiln."""
    f()
    sync()
    times = []
    for _ in range(REPS):
        start = time.perf_counter()
        f()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    if "--cpu-dry-run" in sys.argv:  # checks the script itself on a machine without a GPU
        dev, name = torch.device("cpu"), "cpu (dry run)"
    elif not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return
    else:
        dev = torch.device("cuda:0")
        name = torch.cuda.get_device_name(0)
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else None

    def runs(section):
        return only is None or section in only

    def row(workload, variant, ms, gbps=None, gflops=None):
        r = {"workload": workload, "variant": variant, "median_ms": round(ms, 4), "device": name}
        if gbps is not None:
            r["gbps"] = round(gbps, 1)
        if gflops is not None:
            r["gflops"] = round(gflops)
        print(json.dumps(r, ensure_ascii=False), flush=True)

    for section, f in [("copy", copy), ("w1", w1), ("w3", w3), ("ce", ce), ("w5", w5),
                       ("w4", w4), ("w7", w7)]:
        if runs(section):
            try:
                f(dev, row)
            except Exception as e:  # one section failing must not hide the others
                print(f"{section} failed: {e!r}", file=sys.stderr, flush=True)


def copy(dev, row):
    n = 1 << (16 if DRY else 28)
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    row("copy", "ceiling", ms, gbps=2 * n / ms / 1e6)


def w1(dev, row):
    n = 1 << (16 if DRY else 26)
    x = torch.randn(n, device=dev)

    def w1(x):
        return (torch.tanh(x * 1.5 + 0.5) * torch.sigmoid(x) + torch.relu(x - 0.2)) / (x * x + 1)

    def w1b(x):
        return ((x * 1.5 + 0.5) * x + torch.relu(x - 0.2)) / (x * x + 1)

    for name_, f in [("W1", w1), ("W1b", w1b)]:
        for variant, g in [("eager", f), ("compiled", torch.compile(f))]:
            ms = median_ms(lambda: g(x))
            row(name_, variant, ms, gbps=8 * n / ms / 1e6)


def w3(dev, row):
    for side in SIDES:
        a = torch.randn(side, side, device=dev)
        soft = lambda a: torch.softmax(a, dim=1)  # noqa: E731
        for variant, g in [("eager", soft), ("compiled", torch.compile(soft))]:
            ms = median_ms(lambda: g(a))
            row(f"W3 {side}²", variant, ms, gbps=8 * side * side / ms / 1e6)
        h = a.to(torch.bfloat16)
        logsoft = lambda a: torch.log_softmax(a, dim=1)  # noqa: E731
        for variant, g in [("eager", logsoft), ("compiled", torch.compile(logsoft))]:
            ms = median_ms(lambda: g(a))
            row(f"W3 log-softmax {side}²", variant, ms, gbps=8 * side * side / ms / 1e6)
        for variant, g in [("eager", soft), ("compiled", torch.compile(soft))]:
            ms = median_ms(lambda: g(h))
            row(f"W3 softmax bf16 {side}²", variant, ms, gbps=4 * side * side / ms / 1e6)


def ce(dev, row):
    """Cross-entropy over rows of logits with integer labels, then with its gradient."""
    for side in SIDES:
        a = torch.randn(side, side, device=dev)
        labels = torch.randint(0, side, (side,), device=dev)
        logits = a.detach().requires_grad_(True)

        def fwd_bwd(f):
            def run():
                f(logits, labels).backward()
                logits.grad = None
            return run
        for variant, f in [("eager", F.cross_entropy), ("compiled", torch.compile(F.cross_entropy))]:
            ms = median_ms(lambda: f(a, labels))
            row(f"W3 cross-entropy {side}²", variant, ms, gbps=4 * side * side / ms / 1e6)
            ms = median_ms(fwd_bwd(f))
            row(f"W3 cross-entropy + gradient {side}²", variant, ms, gbps=8 * side * side / ms / 1e6)


def w5(dev, row):
    torch.backends.cuda.matmul.allow_tf32 = False
    for dtype, label in [(torch.float32, "f32"), (torch.float16, "f16"), (torch.bfloat16, "bf16")]:
        side = 96 if DRY else 4096
        a = torch.randn(side, side, device=dev, dtype=dtype)
        b = torch.randn(side, side, device=dev, dtype=dtype)
        ms = median_ms(lambda: a @ b)
        row(f"W5 {side}³ {label}", "eager", ms, gflops=2 * side**3 / ms / 1e6)
        try:
            import cupy
            # cuBLAS called directly (CuPy's matmul is one cublasGemmEx call), no tf32.
            ca, cb = cupy.asarray(a), cupy.asarray(b)
            ms = median_ms(lambda: cupy.matmul(ca, cb))
            row(f"W5 {side}³ {label}", "cublas", ms, gflops=2 * side**3 / ms / 1e6)
        except (ImportError, TypeError) as e:  # no CuPy, or a dtype it lacks (bf16)
            print(f"W5 {label} through CuPy: {e!r}", file=sys.stderr, flush=True)


def train_rows(row, workload, make, batches, per_step, unit, variants=("eager", "compiled"),
               steps=20):
    """Eager and torch.compile'd steps ("reduce-overhead": with CUDA graphs; "... bf16": under
    torch.autocast to bf16), timed in blocks of `steps` that end by reading the loss, as
    examples/gpu.rs times kiln's."""
    for variant in variants:
        torch.manual_seed(0)
        model, opt, loss_of = make()
        if variant.startswith("reduce-overhead"):  # torch.compile with CUDA graphs
            fwd = torch.compile(model, mode="reduce-overhead")
        elif variant.startswith("compiled"):
            fwd = torch.compile(model)
        else:
            fwd = model
        bf16 = variant.endswith("bf16")

        def step(x, y):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = loss_of(fwd(x), y)
            loss.backward()
            opt.step()
            return loss
        first = time.perf_counter()
        float(step(*batches[0]).detach())
        first = (time.perf_counter() - first) * 1e3
        if variant != "eager" and not variant.startswith("eager "):
            row(f"{workload} step, first compiled call", variant, first)
        state = {"i": 0}

        def block():
            for _ in range(steps):
                state["i"] += 1
                loss = step(*batches[state["i"] % len(batches)])
            float(loss.detach())
        ms = median_ms(block) / steps
        row(f"{workload} step ({per_step / ms * 1e3:.0f} {unit})", variant, ms)


def w4(dev, row):
    def make():
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)).to(dev)
        return model, torch.optim.SGD(model.parameters(), lr=0.1), F.cross_entropy
    batches = [(torch.randn(128, 784, device=dev), torch.randint(0, 10, (128,), device=dev))
               for _ in range(8)]
    train_rows(row, "W4 MLP", make, batches, 1, "steps/s",
               variants=("eager", "compiled", "reduce-overhead"))


def w7(dev, row):
    # The W7 model of benches/peers/models.py (beside this script in .gpu/, or in the checkout).
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:0] = [here, os.path.join(here, "..", "benches", "peers")]
    import models

    def forward(self, idx):  # as models.Gpt.forward, with the positions on idx's device
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.ln(self.blocks(x)))
    models.Gpt.forward = forward

    def make():
        model = models.Gpt().to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
        return model, opt, lambda out, y: F.cross_entropy(out.reshape(-1, models.V), y.reshape(-1))
    t = models.T
    batches = [(torch.randint(0, models.V, (models.B, t), device=dev),
                torch.randint(0, models.V, (models.B, t), device=dev)) for _ in range(4)]
    train_rows(row, "W7 GPT", make, batches, models.B * t, "tokens/s",
               variants=("eager", "compiled", "eager bf16", "compiled bf16"))


if __name__ == "__main__":
    main()
