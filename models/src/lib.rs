//! Pretrained transformers for kiln: Hugging Face checkpoint folders loaded and run.
//!
//! Point [`gpt2::Gpt2::from_pretrained`] or [`llama::Llama::from_pretrained`] at a local
//! folder (`config.json` and `model.safetensors`, or shards with
//! `model.safetensors.index.json`; nothing is downloaded): the weights are memory-mapped,
//! converted to the [`LoadOptions`]' dtype and device, and checked by name and shape against
//! the config, every problem listed in one error. Parameter names are the checkpoint's, so
//! `named_parameters()` lines up with the files.
//!
//! Architectures: GPT-2, and the Llama family in one implementation (Llama 2 and 3,
//! TinyLlama, SmolLM, Qwen2): RMS norm, rotary embeddings (default, `linear` and `llama3`
//! scaling), grouped-query attention, the SwiGLU MLP, tied or untied heads, optional
//! biases. Their logits match transformers' (tests against fixtures it wrote). And BERT
//! ([`bert::Bert`]), with [`SentenceEncoder`] for sentence-transformers folders such as
//! `all-MiniLM-L6-v2`: padded batches, mean (or `[CLS]`, max) pooling, L2 normalisation.
//!
//! GGUF files (llama.cpp's format): [`gguf::Gguf`] reads their metadata and tensors (GGML's
//! block types dequantized), [`llama::Llama::from_gguf`] builds a Llama-family model and
//! [`Tokenizer::from_gguf`] its tokenizer; with [`LoadOptions::keep_quantized`] the weights
//! stay in their blocks. [`llama::Llama::quantize_`] stores a float model's weights as
//! Q8_0, Q4_0 or Q4_K blocks or per-channel int8 rows ([`quantize::QuantConfig`],
//! [`quantize::QuantKind`]), [`Activations::Int8`] makes decode steps take integer products,
//! `save_pretrained` writes them as they are, and [`perplexity`] measures what quantizing
//! cost.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bert;
pub mod cache;
pub mod checkpoint;
mod compressed;
pub mod config;
pub mod eval;
pub mod generate;
pub mod gguf;
pub mod gpt2;
mod int8;
mod kernels;
pub mod linear;
pub mod llama;
pub mod lora;
mod prefill;
pub mod quantize;
mod quantized;
pub mod rope;
pub mod save;
pub mod sentence;
pub mod tokenizer;

pub use cache::KvCache;
pub use checkpoint::{Checkpoint, LoadOptions, Loader, Weights};
pub use config::Config;
pub use eval::{Evaluation, perplexity};
pub use generate::{CausalLm, GenerateOptions, Generation, generate};
pub use quantized::Activations;
pub use save::SaveOptions;
pub use sentence::{Pooling, SentenceEncoder};
pub use tokenizer::{PaddingSide, Tokenizer};

/// A new model's parameters made leaves of their own, computed, and requiring gradients
/// (what `Llama::new` and `Gpt2::new` hand back).
pub(crate) fn fresh_parameters(model: &mut dyn kiln::nn::Parameters) -> kiln::Result<()> {
    let mut params = Vec::new();
    model.visit_mut("", &mut |_, t| {
        *t = t.detach();
        params.push(t.clone());
    });
    kiln::Tensor::try_realize_all(&params.iter().collect::<Vec<_>>())?;
    for t in &params {
        t.try_requires_grad_(true)?;
    }
    Ok(())
}

/// The last `logits_to_keep` positions of hidden states `[batch, len, hidden]` (all of them
/// for 0, as transformers' `logits_to_keep`), taken before the final norm and the head,
/// which act on each position alone: a prefill's head then multiplies one row per sequence
/// instead of the whole prompt's.
pub(crate) fn keep_last(h: kiln::Tensor, logits_to_keep: usize) -> kiln::Result<kiln::Tensor> {
    let len = h.dims()[1];
    if logits_to_keep == 0 || logits_to_keep >= len {
        return Ok(h);
    }
    h.try_narrow(1, len - logits_to_keep, logits_to_keep)
}
