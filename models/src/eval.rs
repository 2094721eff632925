//! Perplexity: how well a causal language model predicts a text, `exp` of the mean
//! cross-entropy of each token given those before it, the measure quantization is judged by
//! (llama.cpp's `llama-perplexity`, transformers' guide).

use kiln::{Result, Tensor};

use crate::generate::CausalLm;

/// How [`perplexity`] runs the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evaluation {
    /// Each window in one forward pass (as a prefill computes).
    Prefill,
    /// Token by token through a key/value cache, four windows a step (as decoding computes:
    /// the products of weights kept quantized then read their blocks in place, with int8
    /// activations where the model was told to use them).
    Decode,
}

/// The perplexity of `model` over `windows` (each a sequence of token ids, all of one
/// length of at least 2): every token after each window's first predicted from those before
/// it in its window.
///
/// # Errors
/// Windows of different lengths or shorter than 2 tokens ([`kiln::Error::Shape`]); ids
/// outside the vocabulary; what the model's forward pass returns.
pub fn perplexity(model: &impl CausalLm, windows: &[Vec<i64>], how: Evaluation) -> Result<f64> {
    let len = windows.first().map_or(0, Vec::len);
    if len < 2 || windows.iter().any(|w| w.len() != len) {
        return Err(kiln::Error::Shape {
            op: "perplexity",
            detail: format!(
                "takes windows of one length of at least 2 tokens, got lengths {:?}",
                windows.iter().map(Vec::len).collect::<Vec<_>>()
            ),
        });
    }
    let mut total = 0f64;
    kiln::no_grad(|| -> Result<()> {
        for group in windows.chunks(if how == Evaluation::Decode { 4 } else { 16 }) {
            let n = group.len();
            let ids: Vec<i64> = group.iter().flat_map(|w| w[..len - 1].iter().copied()).collect();
            let targets: Vec<i64> = group.iter().flat_map(|w| w[1..].iter().copied()).collect();
            let (ids, targets) =
                (Tensor::from_vec(ids, [n, len - 1]), Tensor::from_vec(targets, [n, len - 1]));
            total += match how {
                Evaluation::Prefill => nll(&model.forward(&ids)?, &targets)?,
                Evaluation::Decode => {
                    let cache = model.new_cache(n, len - 1)?;
                    let mut sum = 0.0;
                    for t in 0..len - 1 {
                        let at = Tensor::from_vec(vec![t as i64], [1]);
                        let logits =
                            model.forward_cached(&ids.try_narrow(1, t, 1)?, &at, &cache)?;
                        sum += nll(&logits, &targets.try_narrow(1, t, 1)?)?;
                    }
                    sum
                }
            };
        }
        Ok(())
    })?;
    Ok((total / (windows.len() * (len - 1)) as f64).exp())
}

/// The summed negative log-likelihood of `targets` (`[n, t]`) under `logits` (`[n, t, v]`).
fn nll(logits: &Tensor, targets: &Tensor) -> Result<f64> {
    let logp = logits.to_dtype(kiln::DType::F32).log_softmax(-1);
    let picked = logp.try_gather(-1, &targets.try_unsqueeze(-1)?)?;
    Ok(-picked.sum().try_item::<f64>()?)
}
