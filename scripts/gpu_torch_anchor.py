"""PyTorch on the same GPU workloads as `examples/gpu.rs`, for a side-by-side table.

Prints one JSON object per line: workload, variant (eager, compiled), median_ms, gbps or
gflops, device. Run by scripts/gpu-check when PyTorch is importable.
"""
import json
import statistics
import sys
import time

import torch

REPS = 9


def median_ms(f):
    """Wall time from the call to the device finishing, as examples/gpu.rs measures kiln."""
    f()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPS):
        start = time.perf_counter()
        f()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return
    dev = torch.device("cuda:0")
    name = torch.cuda.get_device_name(0)
    rows = []

    def row(workload, variant, ms, gbps=None, gflops=None):
        r = {"workload": workload, "variant": variant, "median_ms": round(ms, 4), "device": name}
        if gbps is not None:
            r["gbps"] = round(gbps, 1)
        if gflops is not None:
            r["gflops"] = round(gflops)
        rows.append(r)

    n = 1 << 28
    src = torch.empty(n, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src))
    row("copy", "ceiling", ms, gbps=2 * n / ms / 1e6)
    del src, dst

    n = 1 << 26
    x = torch.randn(n, device=dev)

    def w1(x):
        return (torch.tanh(x * 1.5 + 0.5) * torch.sigmoid(x) + torch.relu(x - 0.2)) / (x * x + 1)

    def w1b(x):
        return ((x * 1.5 + 0.5) * x + torch.relu(x - 0.2)) / (x * x + 1)

    for name_, f in [("W1", w1), ("W1b", w1b)]:
        for variant, g in [("eager", f), ("compiled", torch.compile(f))]:
            ms = median_ms(lambda: g(x))
            row(name_, variant, ms, gbps=8 * n / ms / 1e6)
    del x

    for side in [4096, 16384]:
        a = torch.randn(side, side, device=dev)
        soft = lambda a: torch.softmax(a, dim=1)  # noqa: E731
        for variant, g in [("eager", soft), ("compiled", torch.compile(soft))]:
            ms = median_ms(lambda: g(a))
            row(f"W3 {side}²", variant, ms, gbps=8 * side * side / ms / 1e6)
        del a

    torch.backends.cuda.matmul.allow_tf32 = False
    for dtype, label in [(torch.float32, "f32"), (torch.float16, "f16"), (torch.bfloat16, "bf16")]:
        side = 4096
        a = torch.randn(side, side, device=dev, dtype=dtype)
        b = torch.randn(side, side, device=dev, dtype=dtype)
        ms = median_ms(lambda: a @ b)
        row(f"W5 {side}³ {label}", "eager", ms, gflops=2 * side**3 / ms / 1e6)

    for r in rows:
        print(json.dumps(r, ensure_ascii=False))


if __name__ == "__main__":
    main()
