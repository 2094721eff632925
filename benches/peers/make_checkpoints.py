"""Random-weight checkpoint folders of the generation benchmark's shapes, saved by transformers
(`save_pretrained`, f32): GPT-2 small (124M) and a 125M Llama with grouped-query attention
(hidden 768, 12 layers, 12 heads, 4 key/value heads, intermediate 2048, vocabulary 32000,
untied head) — the shapes decode_anchor.py builds; and a MiniLM-L6-shaped BERT (hidden 384,
6 layers, 12 heads, intermediate 1536, vocabulary 30522) — the shape encoder_anchor.py builds.
  python make_checkpoints.py OUT_DIR
"""
import os
import sys

import torch
from transformers import BertConfig, BertModel, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

out = sys.argv[1]
torch.manual_seed(0)
if not os.path.exists(os.path.join(out, "gpt2-small", "config.json")):
    GPT2LMHeadModel(GPT2Config()).save_pretrained(os.path.join(out, "gpt2-small"))
if not os.path.exists(os.path.join(out, "llama-125m", "config.json")):
    LlamaForCausalLM(LlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                                 num_attention_heads=12, num_key_value_heads=4, vocab_size=32000,
                                 tie_word_embeddings=False)).save_pretrained(os.path.join(out, "llama-125m"))
if not os.path.exists(os.path.join(out, "minilm-l6", "config.json")):
    BertModel(BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                         intermediate_size=1536)).save_pretrained(os.path.join(out, "minilm-l6"))
