"""GGUF files of the generation benchmark's 125M Llama (the folder make_checkpoints.py writes
under OUT_DIR/llama-125m), in llama.cpp's tensor names and row order, written by the `gguf`
package (models/tests/fixtures/requirements-gguf.txt): `llama-125m-f32.gguf`, and
`llama-125m-q8_0.gguf` / `llama-125m-q4_0.gguf` with every projection and the head quantized
by the package (the embeddings and norms stay f32, as llama.cpp's converter keeps norms), and a
SentencePiece vocabulary of filler pieces (llama.cpp loads no file without one).

    python make_gguf_bench.py OUT_DIR
"""
import json
import os
import sys

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from safetensors.numpy import load_file

out = sys.argv[1]
folder = os.path.join(out, "llama-125m")
config = json.load(open(os.path.join(folder, "config.json")))
weights = load_file(os.path.join(folder, "model.safetensors"))
heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
PARTS = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def permute(w, n):
    """llama.cpp's converter's order of a query or key projection's rows."""
    return w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


for kind in (T.F32, T.Q8_0, T.Q4_0):
    path = os.path.join(out, f"llama-125m-{kind.name.lower()}.gguf")
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_freq_base(config.get("rope_theta", config.get("rope_parameters", {}).get("rope_theta", 10000.0)))
    # A SentencePiece vocabulary of the model's size (the benchmark feeds random ids; llama.cpp
    # needs one to load the file): <unk>, <s>, </s>, the 256 byte tokens, then filler pieces.
    vocab = config["vocab_size"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(vocab - len(tokens))]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(vocab - 259)])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (vocab - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for name, t in sorted(weights.items()):
        t = t.astype(np.float32)
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        elif name == "lm_head.weight":
            gname = "output.weight"
        else:
            layer, part = name[len("model.layers."):].split(".", 1)
            part, suffix = part.rsplit(".", 1)
            gname = f"blk.{layer}.{PARTS[part]}.{suffix}"
            if part == "self_attn.q_proj":
                t = permute(t, heads)
            if part == "self_attn.k_proj":
                t = permute(t, kv_heads)
        matrix = t.ndim == 2 and gname != "token_embd.weight"
        if kind != T.F32 and matrix:
            w.add_tensor(gname, gguf.quants.quantize(t, kind), raw_dtype=kind)
        else:
            w.add_tensor(gname, np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(path, os.path.getsize(path) // 1_000_000, "MB")
