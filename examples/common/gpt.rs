//! A small GPT: token and position embeddings, pre-norm blocks of causal self-attention and
//! a GELU (tanh) MLP, a final layer norm and a linear head. The shapes of
//! `benches/peers/models.py w7` with [`GptConfig::w7`].

use kiln::Result;
use kiln::nn::functional as F;
use kiln::nn::{Embedding, LayerNorm, Linear, Module, Parameters};
use kiln::optim::{Optimizer, ParamGroup};
use kiln::prelude::*;

/// The model's sizes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GptConfig {
    pub(crate) vocab: usize,
    pub(crate) layers: usize,
    pub(crate) d_model: usize,
    pub(crate) heads: usize,
    pub(crate) context: usize,
}

impl GptConfig {
    /// W7: 4 layers, d_model 128, 4 heads, context 64.
    pub(crate) const fn w7(vocab: usize) -> GptConfig {
        GptConfig { vocab, layers: 4, d_model: 128, heads: 4, context: 64 }
    }
}

/// One pre-norm block: `x + attn(ln1(x))`, then `x + mlp(ln2(x))`.
pub(crate) struct Block {
    ln1: LayerNorm,
    qkv: Linear,
    proj: Linear,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    heads: usize,
}

kiln::parameters!(Block { ln1, qkv, proj, ln2, fc1, fc2 });

impl Block {
    fn new(d: usize, heads: usize) -> Block {
        Block {
            ln1: LayerNorm::new(&[d]),
            qkv: Linear::new(d, 3 * d),
            proj: Linear::new(d, d),
            ln2: LayerNorm::new(&[d]),
            fc1: Linear::new(d, 4 * d),
            fc2: Linear::new(4 * d, d),
            heads,
        }
    }
}

impl Module for Block {
    fn try_forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, d) = (x.dims()[0] as i64, x.dims()[1] as i64, x.dims()[2] as i64);
        let h = self.heads as i64;
        let qkv = self.qkv.try_forward(&self.ln1.try_forward(x)?)?;
        let head = |i: i64| -> Result<Tensor> {
            qkv.try_narrow(2, (i * d) as usize, d as usize)?
                .try_reshape(&[b, t, h, d / h])?
                .try_transpose(1, 2)
        };
        let (q, k, v) = (head(0)?, head(1)?, head(2)?);
        let y = F::scaled_dot_product_attention(&q, &k, &v, None, true);
        let x = x + self.proj.try_forward(&y.try_transpose(1, 2)?.try_reshape(&[b, t, d])?)?;
        let mlp =
            self.fc2.try_forward(&self.fc1.try_forward(&self.ln2.try_forward(&x)?)?.gelu_tanh())?;
        Ok(x + mlp)
    }
}

/// The whole model: `[batch, time]` token ids to `[batch, time, vocab]` logits.
pub(crate) struct Gpt {
    tok: Embedding,
    pos: Embedding,
    blocks: Vec<Block>,
    ln: LayerNorm,
    head: Linear,
    pub(crate) config: GptConfig,
}

kiln::parameters!(Gpt { tok, pos, blocks, ln, head });

impl Gpt {
    pub(crate) fn new(config: GptConfig) -> Gpt {
        let d = config.d_model;
        Gpt {
            tok: Embedding::new(config.vocab, d),
            pos: Embedding::new(config.context, d),
            blocks: (0..config.layers).map(|_| Block::new(d, config.heads)).collect(),
            ln: LayerNorm::new(&[d]),
            head: Linear::new(d, config.vocab),
            config,
        }
    }

    /// AdamW's usual groups: weight decay on the matrices, none on biases and norms.
    #[allow(dead_code, reason = "bench_models decays every parameter, as its anchor does")]
    pub(crate) fn param_groups(&self, weight_decay: f64) -> Vec<ParamGroup> {
        let (matrices, vectors): (Vec<_>, Vec<_>) =
            self.parameters().into_iter().partition(|p| p.ndim() >= 2);
        vec![
            ParamGroup::new(matrices).weight_decay(weight_decay),
            ParamGroup::new(vectors).weight_decay(0.0),
        ]
    }

    /// One training step: clears the gradients, computes the loss, backpropagates and lets
    /// `opt` update the parameters. Returns the loss (lazy).
    #[allow(dead_code, reason = "train_gpt interleaves autocast and logging in its own loop")]
    pub(crate) fn train_step(&self, opt: &mut impl Optimizer, x: &Tensor, y: &Tensor) -> Tensor {
        opt.zero_grad();
        let loss = self.loss(x, y);
        loss.backward();
        opt.step();
        loss
    }

    /// The mean cross-entropy of the next-token predictions.
    pub(crate) fn loss(&self, x: &Tensor, y: &Tensor) -> Tensor {
        let logits = self.forward(x);
        let v = self.config.vocab as i64;
        F::cross_entropy(&logits.reshape(&[-1, v]), &y.reshape(&[-1]))
    }
}

impl Module for Gpt {
    fn try_forward(&self, idx: &Tensor) -> Result<Tensor> {
        let t = idx.dims()[1];
        let mut x = self.tok.try_forward(idx)? + self.pos.weight.try_narrow(0, 0, t)?;
        for block in &self.blocks {
            x = block.try_forward(&x)?;
        }
        self.head.try_forward(&self.ln.try_forward(&x)?)
    }
}
