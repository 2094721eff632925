//! The examples' Shakespeare: `data/shakespeare.txt.gz` split into *The Tempest* and the six
//! plays before it, encoded one character per token, with the causal LM loss and batches.
#![allow(dead_code, reason = "train_llama and finetune each use part of it")]

use std::io::Read;

use kiln::nn::functional as F;
use kiln::prelude::*;
use kiln_models::Tokenizer;
use kiln_models::llama::Llama;

/// Where *The Tempest* begins.
const TEMPEST: &str = "THE TEMPEST\n\nby William Shakespeare";

pub(crate) struct Plays {
    /// Hamlet, Macbeth, King Lear, Othello, Romeo and Juliet, Julius Caesar.
    pub(crate) six: String,
    pub(crate) tempest: String,
    /// Every character of the seven plays, sorted: token `i` is `chars[i]`.
    pub(crate) chars: Vec<char>,
}

impl Plays {
    pub(crate) fn load() -> Result<Plays, Box<dyn std::error::Error>> {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/shakespeare.txt.gz");
        let mut text = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open(&path)?).read_to_string(&mut text)?;
        let at = text.find(TEMPEST).ok_or("the corpus has no Tempest")?;
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        let (six, tempest) = text.split_at(at);
        Ok(Plays { six: six.to_string(), tempest: tempest.to_string(), chars })
    }

    pub(crate) fn tokenizer(&self) -> kiln::Result<Tokenizer> {
        Tokenizer::from_characters(&self.chars)
    }

    pub(crate) fn encode(&self, text: &str) -> Vec<i64> {
        text.chars().filter_map(|c| self.chars.binary_search(&c).ok()).map(|i| i as i64).collect()
    }

    /// The mean loss over 16 windows of 128 characters spread evenly over `ids`.
    pub(crate) fn evaluate(&self, model: &Llama, ids: &[i64]) -> kiln::Result<f32> {
        let (n, t) = (16, 128);
        let stride = (ids.len() - t - 1) / n;
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for i in 0..n {
            x.extend_from_slice(&ids[i * stride..i * stride + t]);
            y.extend_from_slice(&ids[i * stride + 1..i * stride + t + 1]);
        }
        let (x, y) = (Tensor::from_vec(x, [n, t]), Tensor::from_vec(y, [n, t]));
        let loss = kiln::no_grad(|| causal_loss(model, &x, &y));
        loss.try_item::<f32>()
    }
}

/// `batch` windows of `len` characters at random places in `ids`, and the characters after
/// each one's.
pub(crate) fn random_batch(ids: &[i64], batch: usize, len: usize) -> (Tensor, Tensor) {
    let starts = (Tensor::rand([batch]) * (ids.len() - len - 1) as f64).to_vec::<f64>();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for s in starts {
        let s = s as usize;
        x.extend_from_slice(&ids[s..s + len]);
        y.extend_from_slice(&ids[s + 1..s + len + 1]);
    }
    (Tensor::from_vec(x, [batch, len]), Tensor::from_vec(y, [batch, len]))
}

/// The mean cross-entropy of the model's predictions for `x` against `y`.
pub(crate) fn causal_loss(model: &Llama, x: &Tensor, y: &Tensor) -> Tensor {
    let logits = model.forward(x).expect("a batch the model takes");
    let v = logits.dims()[2] as i64;
    F::cross_entropy(&logits.reshape(&[-1, v]), &y.reshape(&[-1]))
}
