"""PyTorch's side of examples/bench_lstm.rs: one training step of nn.LSTM(256, 256) over a
256-step sequence of batch 64 (mean-squared loss, backward, SGD), eager, on the CPU with
PyTorch's default threads. Prints the median step time as JSON."""
import json
import sys
import time

import torch

quick = "--quick" in sys.argv
seq, runs = (16, 3) if quick else (256, 7)
torch.manual_seed(0)
lstm = torch.nn.LSTM(256, 256)
opt = torch.optim.SGD(lstm.parameters(), lr=1e-3)
x, target = torch.randn(seq, 64, 256), torch.randn(seq, 64, 256)


def step():
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(lstm(x)[0], target)
    loss.backward()
    opt.step()
    return loss.item()


times = []
for i in range(runs + 2):
    t = time.perf_counter()
    step()
    if i >= 2:
        times.append(time.perf_counter() - t)
times.sort()
print(json.dumps({"seq": seq, "threads": torch.get_num_threads(), "mkldnn": torch.backends.mkldnn.is_available(),
                  "torch": torch.__version__, "eager_ms": round(times[len(times) // 2] * 1e3, 1)}))
