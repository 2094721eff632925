"""LoRA training-step anchor: PEFT + PyTorch on a local Llama-family folder (make_checkpoints.py's
llama-125m), rank 8, alpha 16 on q_proj and v_proj, AdamW (lr 1e-4) on the adapters, the causal
LM loss of a batch of token ids as their own labels (transformers' `labels=`), eager and
torch.compile, f32 and under bf16 autocast. Prints one JSON line per mode.

    python lora_anchor.py MODEL_DIR [--batch 4] [--len 128] [--modes eager,compile,eager_bf16,compile_bf16]
"""
import argparse, contextlib, json, os, statistics, time

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaForCausalLM

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--batch", type=int, default=4)
p.add_argument("--len", type=int, default=128)
p.add_argument("--reps", type=int, default=5)
p.add_argument("--modes", default="eager,compile,eager_bf16,compile_bf16")
args = p.parse_args()

for mode in args.modes.split(","):
    torch.manual_seed(0)
    base = LlamaForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa")
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]))
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    vocab = base.config.vocab_size
    ids = (torch.arange(args.batch * args.len) * 7919 + 13).remainder(vocab).reshape(args.batch, args.len)
    bf16 = mode.endswith("_bf16")
    forward = torch.compile(model) if mode.startswith("compile") else model

    def step():
        opt.zero_grad(set_to_none=True)
        cast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with cast:
            loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss.item()

    t = time.perf_counter(); step(); first = time.perf_counter() - t
    step()
    ts = []
    for _ in range(args.reps):
        t = time.perf_counter(); step(); ts.append(time.perf_counter() - t)
    name = os.path.basename(os.path.normpath(args.model))
    print(json.dumps({"workload": f"LoRA step {name} b{args.batch}x{args.len}", "peer": "pytorch", "mode": mode,
                      "median_ms": round(statistics.median(ts) * 1e3, 1), "first_s": round(first, 2),
                      "threads": torch.get_num_threads()}), flush=True)
