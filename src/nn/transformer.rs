//! PyTorch's transformer layers: `TransformerEncoderLayer`, `TransformerDecoderLayer`, the
//! `TransformerEncoder` and `TransformerDecoder` stacks and the whole `Transformer`, with the same parameter names (`self_attn.in_proj_weight`,
//! `linear1.weight`, `norm1.bias`, ...), post-norm or pre-norm (`norm_first`), ReLU or GELU,
//! dropout, sequence-first or batch-first, and PyTorch's masks (`true` hides a position).

use super::{Dropout, LayerNorm, Linear, Module, MultiheadAttention};
use crate::error::ok;
use crate::{Error, Result, Tensor};

/// The feed-forward activation (PyTorch's `activation="relu"` or `"gelu"`, the exact GELU).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FeedForward {
    /// `relu` (PyTorch's default).
    #[default]
    Relu,
    /// The exact GELU.
    Gelu,
}

/// How a transformer layer is built (PyTorch's constructor arguments after `d_model` and
/// `nhead`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TransformerOptions {
    /// The feed-forward layer's width (`dim_feedforward`, 2048 by default).
    pub dim_feedforward: usize,
    /// Dropout after attention, inside and after the feed-forward layer, and on the
    /// attention weights (0.1 by default; active in training mode).
    pub dropout: f64,
    /// The feed-forward activation.
    pub activation: FeedForward,
    /// The layer norms' epsilon (`1e-5`).
    pub layer_norm_eps: f64,
    /// Inputs `[batch, seq, d_model]` instead of `[seq, batch, d_model]`.
    pub batch_first: bool,
    /// Pre-norm (each block normalizes its input) instead of post-norm.
    pub norm_first: bool,
}

impl Default for TransformerOptions {
    fn default() -> TransformerOptions {
        TransformerOptions {
            dim_feedforward: 2048,
            dropout: 0.1,
            activation: FeedForward::Relu,
            layer_norm_eps: 1e-5,
            batch_first: false,
            norm_first: false,
        }
    }
}

/// The masks of one attention block: PyTorch's `attn_mask` (`[L, S]`), the key padding
/// mask (`[batch, S]`, `true` on padding) and `is_causal`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Masks<'a> {
    /// Hidden (`true`) or added (float) scores, `[L, S]` or `[batch·heads, L, S]`.
    pub attn_mask: Option<&'a Tensor>,
    /// `[batch, S]`, `true` on keys to ignore.
    pub key_padding_mask: Option<&'a Tensor>,
    /// Each position attends to itself and those before it.
    pub is_causal: bool,
}

/// `linear2(dropout(activation(linear1(x))))`: every layer's feed-forward block.
fn feed_forward(
    (linear1, dropout, linear2): (&Linear, &Dropout, &Linear),
    activation: FeedForward,
    x: &Tensor,
) -> Result<Tensor> {
    let h = linear1.try_forward(x)?;
    let h = match activation {
        FeedForward::Relu => h.relu(),
        FeedForward::Gelu => h.gelu(),
    };
    linear2.try_forward(&dropout.try_forward(&h)?)
}

/// `x` as `[batch, seq, d]` from the layout `options` says (and back: the swap is its own
/// inverse); a 2-D (unbatched) `x` as it is.
fn swap_unless_batch_first(options: &TransformerOptions, x: &Tensor) -> Result<Tensor> {
    if options.batch_first || x.ndim() != 3 { Ok(x.clone()) } else { x.try_transpose(0, 1) }
}

fn norm(d_model: usize, eps: f64) -> Result<LayerNorm> {
    LayerNorm::try_with_options(&[d_model], eps, true)
}

fn attention(d_model: usize, nhead: usize, dropout: f64) -> Result<MultiheadAttention> {
    MultiheadAttention::try_new(d_model, nhead, dropout, true)
}

/// A stack's output through its final norm, when it has one.
fn with_final_norm(norm: Option<&LayerNorm>, x: Tensor) -> Result<Tensor> {
    match norm {
        Some(n) => n.try_forward(&x),
        None => Ok(x),
    }
}

fn attend(mha: &MultiheadAttention, q: &Tensor, kv: &Tensor, masks: Masks<'_>) -> Result<Tensor> {
    mha.try_attend(q, kv, kv, masks.attn_mask, masks.key_padding_mask, masks.is_causal)
}

/// PyTorch's `nn.TransformerEncoderLayer`: self-attention then a feed-forward block, each
/// with dropout, a residual and a layer norm (after, or before with `norm_first`).
///
/// ```
/// use kiln::nn::{Module, TransformerEncoderLayer, TransformerOptions};
/// use kiln::prelude::*;
/// let options = TransformerOptions { dim_feedforward: 64, batch_first: true, ..Default::default() };
/// let layer = TransformerEncoderLayer::with_options(32, 4, options);
/// let y = layer.forward(&Tensor::randn([2, 10, 32]));
/// assert_eq!(y.dims(), &[2, 10, 32]);
/// ```
#[derive(Clone, Debug)]
pub struct TransformerEncoderLayer {
    /// The self-attention.
    pub self_attn: MultiheadAttention,
    /// The feed-forward block's first projection.
    pub linear1: Linear,
    /// Its second projection.
    pub linear2: Linear,
    /// The norm of the attention block.
    pub norm1: LayerNorm,
    /// The norm of the feed-forward block.
    pub norm2: LayerNorm,
    dropout: Dropout,
    dropout1: Dropout,
    dropout2: Dropout,
    options: TransformerOptions,
}

crate::parameters!(TransformerEncoderLayer {
    self_attn,
    linear1,
    dropout,
    linear2,
    norm1,
    norm2,
    dropout1,
    dropout2
});

impl TransformerEncoderLayer {
    /// A layer with PyTorch's defaults (feed-forward 2048, dropout 0.1, ReLU, post-norm,
    /// sequence-first).
    #[must_use]
    #[track_caller]
    pub fn new(d_model: usize, nhead: usize) -> TransformerEncoderLayer {
        TransformerEncoderLayer::with_options(d_model, nhead, TransformerOptions::default())
    }

    /// A layer with `options`.
    ///
    /// # Panics
    /// As [`TransformerEncoderLayer::try_with_options`] fails.
    #[must_use]
    #[track_caller]
    pub fn with_options(d_model: usize, nhead: usize, options: TransformerOptions) -> Self {
        ok(TransformerEncoderLayer::try_with_options(d_model, nhead, options))
    }

    /// [`TransformerEncoderLayer::with_options`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when `d_model` is not a multiple of `nhead`; [`Error::Value`] for a
    /// dropout probability outside `[0, 1]`.
    pub fn try_with_options(
        d_model: usize,
        nhead: usize,
        options: TransformerOptions,
    ) -> Result<TransformerEncoderLayer> {
        Ok(TransformerEncoderLayer {
            self_attn: attention(d_model, nhead, options.dropout)?,
            linear1: Linear::try_new(d_model, options.dim_feedforward)?,
            linear2: Linear::try_new(options.dim_feedforward, d_model)?,
            norm1: norm(d_model, options.layer_norm_eps)?,
            norm2: norm(d_model, options.layer_norm_eps)?,
            dropout: Dropout::try_new(options.dropout)?,
            dropout1: Dropout::try_new(options.dropout)?,
            dropout2: Dropout::try_new(options.dropout)?,
            options,
        })
    }

    /// The layer over `src` with the self-attention's masks.
    ///
    /// # Errors
    /// [`Error::Shape`] when `src` does not end in `d_model` or a mask does not fit.
    #[track_caller]
    pub fn try_forward_with(&self, src: &Tensor, masks: Masks<'_>) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        let x = swap_unless_batch_first(&self.options, src)?;
        let sa = |x: &Tensor| -> Result<Tensor> {
            self.dropout1.try_forward(&attend(&self.self_attn, x, x, masks)?)
        };
        let block = (&self.linear1, &self.dropout, &self.linear2);
        let ff = |x: &Tensor| {
            self.dropout2.try_forward(&feed_forward(block, self.options.activation, x)?)
        };
        let y = if self.options.norm_first {
            let x = &x + sa(&self.norm1.try_forward(&x)?)?;
            &x + ff(&self.norm2.try_forward(&x)?)?
        } else {
            let x = self.norm1.try_forward(&(&x + sa(&x)?))?;
            self.norm2.try_forward(&(&x + ff(&x)?))?
        };
        swap_unless_batch_first(&self.options, &y)
    }
}

impl Module for TransformerEncoderLayer {
    fn try_forward(&self, src: &Tensor) -> Result<Tensor> {
        self.try_forward_with(src, Masks::default())
    }
}

/// PyTorch's `nn.TransformerDecoderLayer`: self-attention over the target, attention over
/// the encoder's output (`memory`), and a feed-forward block, each with dropout, a residual
/// and a layer norm.
///
/// ```
/// use kiln::nn::{Masks, TransformerDecoderLayer, TransformerOptions};
/// use kiln::prelude::*;
/// let options = TransformerOptions { dim_feedforward: 64, ..Default::default() };
/// let layer = TransformerDecoderLayer::with_options(32, 4, options);
/// let (tgt, memory) = (Tensor::randn([7, 2, 32]), Tensor::randn([9, 2, 32]));
/// let causal = Masks { is_causal: true, ..Default::default() };
/// let y = layer.forward_with(&tgt, &memory, causal, Masks::default());
/// assert_eq!(y.dims(), &[7, 2, 32]);
/// ```
#[derive(Clone, Debug)]
pub struct TransformerDecoderLayer {
    /// The self-attention over the target.
    pub self_attn: MultiheadAttention,
    /// The attention over the memory.
    pub multihead_attn: MultiheadAttention,
    /// The feed-forward block's first projection.
    pub linear1: Linear,
    /// Its second projection.
    pub linear2: Linear,
    /// The self-attention block's norm.
    pub norm1: LayerNorm,
    /// The memory attention block's norm.
    pub norm2: LayerNorm,
    /// The feed-forward block's norm.
    pub norm3: LayerNorm,
    dropout: Dropout,
    dropout1: Dropout,
    dropout2: Dropout,
    dropout3: Dropout,
    options: TransformerOptions,
}

crate::parameters!(TransformerDecoderLayer {
    self_attn,
    multihead_attn,
    linear1,
    dropout,
    linear2,
    norm1,
    norm2,
    norm3,
    dropout1,
    dropout2,
    dropout3
});

impl TransformerDecoderLayer {
    /// A layer with PyTorch's defaults.
    #[must_use]
    #[track_caller]
    pub fn new(d_model: usize, nhead: usize) -> TransformerDecoderLayer {
        TransformerDecoderLayer::with_options(d_model, nhead, TransformerOptions::default())
    }

    /// A layer with `options`.
    ///
    /// # Panics
    /// As [`TransformerDecoderLayer::try_with_options`] fails.
    #[must_use]
    #[track_caller]
    pub fn with_options(d_model: usize, nhead: usize, options: TransformerOptions) -> Self {
        ok(TransformerDecoderLayer::try_with_options(d_model, nhead, options))
    }

    /// [`TransformerDecoderLayer::with_options`], returning an error instead of panicking.
    ///
    /// # Errors
    /// As [`TransformerEncoderLayer::try_with_options`].
    pub fn try_with_options(
        d_model: usize,
        nhead: usize,
        options: TransformerOptions,
    ) -> Result<TransformerDecoderLayer> {
        Ok(TransformerDecoderLayer {
            self_attn: attention(d_model, nhead, options.dropout)?,
            multihead_attn: attention(d_model, nhead, options.dropout)?,
            linear1: Linear::try_new(d_model, options.dim_feedforward)?,
            linear2: Linear::try_new(options.dim_feedforward, d_model)?,
            norm1: norm(d_model, options.layer_norm_eps)?,
            norm2: norm(d_model, options.layer_norm_eps)?,
            norm3: norm(d_model, options.layer_norm_eps)?,
            dropout: Dropout::try_new(options.dropout)?,
            dropout1: Dropout::try_new(options.dropout)?,
            dropout2: Dropout::try_new(options.dropout)?,
            dropout3: Dropout::try_new(options.dropout)?,
            options,
        })
    }

    /// The layer over `tgt` attending to `memory`, with the target's self-attention masks
    /// and the memory attention's masks (PyTorch's `tgt_mask`, `tgt_key_padding_mask`,
    /// `tgt_is_causal`; `memory_mask`, `memory_key_padding_mask`).
    ///
    /// # Panics
    /// As [`TransformerDecoderLayer::try_forward_with`] fails.
    #[must_use]
    #[track_caller]
    pub fn forward_with(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        tgt_masks: Masks<'_>,
        memory_masks: Masks<'_>,
    ) -> Tensor {
        ok(self.try_forward_with(tgt, memory, tgt_masks, memory_masks))
    }

    /// [`TransformerDecoderLayer::forward_with`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when the inputs do not end in `d_model`, their batches differ, or a
    /// mask does not fit.
    #[track_caller]
    pub fn try_forward_with(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        tgt_masks: Masks<'_>,
        memory_masks: Masks<'_>,
    ) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        let x = swap_unless_batch_first(&self.options, tgt)?;
        let m = swap_unless_batch_first(&self.options, memory)?;
        let sa = |x: &Tensor| self.dropout1.try_forward(&attend(&self.self_attn, x, x, tgt_masks)?);
        let ca = |x: &Tensor| {
            self.dropout2.try_forward(&attend(&self.multihead_attn, x, &m, memory_masks)?)
        };
        let block = (&self.linear1, &self.dropout, &self.linear2);
        let ff = |x: &Tensor| {
            self.dropout3.try_forward(&feed_forward(block, self.options.activation, x)?)
        };
        let y = if self.options.norm_first {
            let x = &x + sa(&self.norm1.try_forward(&x)?)?;
            let x = &x + ca(&self.norm2.try_forward(&x)?)?;
            &x + ff(&self.norm3.try_forward(&x)?)?
        } else {
            let x = self.norm1.try_forward(&(&x + sa(&x)?))?;
            let x = self.norm2.try_forward(&(&x + ca(&x)?))?;
            self.norm3.try_forward(&(&x + ff(&x)?))?
        };
        swap_unless_batch_first(&self.options, &y)
    }
}

/// PyTorch's `nn.TransformerEncoder`: `num_layers` copies of an encoder layer (their
/// parameters `layers.0.…`, each initialized afresh) and an optional final norm.
///
/// ```
/// use kiln::nn::{Module, TransformerEncoder, TransformerOptions};
/// use kiln::prelude::*;
/// let options = TransformerOptions { dim_feedforward: 32, dropout: 0.0, ..Default::default() };
/// let encoder = TransformerEncoder::new(16, 2, 3, options, true);
/// assert_eq!(encoder.forward(&Tensor::randn([5, 2, 16])).dims(), &[5, 2, 16]);
/// ```
#[derive(Clone, Debug)]
pub struct TransformerEncoder {
    /// The layers.
    pub layers: Vec<TransformerEncoderLayer>,
    /// The final norm, when there is one.
    pub norm: Option<LayerNorm>,
}

crate::parameters!(TransformerEncoder { layers, norm });

impl TransformerEncoder {
    /// `num_layers` layers of `d_model` with `nhead` heads, and a final norm if `norm`.
    ///
    /// # Panics
    /// As [`TransformerEncoderLayer::try_with_options`] fails.
    #[must_use]
    #[track_caller]
    pub fn new(
        d_model: usize,
        nhead: usize,
        num_layers: usize,
        options: TransformerOptions,
        norm: bool,
    ) -> TransformerEncoder {
        let layers = (0..num_layers)
            .map(|_| TransformerEncoderLayer::with_options(d_model, nhead, options))
            .collect();
        let norm = norm.then(|| ok(self::norm(d_model, options.layer_norm_eps)));
        TransformerEncoder { layers, norm }
    }

    /// The stack over `src`, every layer with `masks`.
    ///
    /// # Errors
    /// As [`TransformerEncoderLayer::try_forward_with`].
    #[track_caller]
    pub fn try_forward_with(&self, src: &Tensor, masks: Masks<'_>) -> Result<Tensor> {
        let mut x = src.clone();
        for layer in &self.layers {
            x = layer.try_forward_with(&x, masks)?;
        }
        with_final_norm(self.norm.as_ref(), x)
    }
}

impl Module for TransformerEncoder {
    fn try_forward(&self, src: &Tensor) -> Result<Tensor> {
        if self.layers.is_empty() && self.norm.is_none() {
            return Err(Error::value("TransformerEncoder", "has no layers and no norm"));
        }
        self.try_forward_with(src, Masks::default())
    }
}

/// PyTorch's `nn.TransformerDecoder`: `num_layers` decoder layers (`layers.0.…`) and an
/// optional final norm.
#[derive(Clone, Debug)]
pub struct TransformerDecoder {
    /// The layers.
    pub layers: Vec<TransformerDecoderLayer>,
    /// The final norm, when there is one.
    pub norm: Option<LayerNorm>,
}

crate::parameters!(TransformerDecoder { layers, norm });

impl TransformerDecoder {
    /// `num_layers` layers of `d_model` with `nhead` heads, and a final norm if `norm`.
    ///
    /// # Panics
    /// As [`TransformerDecoderLayer::try_with_options`] fails.
    #[must_use]
    #[track_caller]
    pub fn new(
        d_model: usize,
        nhead: usize,
        num_layers: usize,
        options: TransformerOptions,
        norm: bool,
    ) -> TransformerDecoder {
        let layers = (0..num_layers)
            .map(|_| TransformerDecoderLayer::with_options(d_model, nhead, options))
            .collect();
        let norm = norm.then(|| ok(self::norm(d_model, options.layer_norm_eps)));
        TransformerDecoder { layers, norm }
    }

    /// The stack over `tgt` attending to `memory`, every layer with the masks.
    ///
    /// # Errors
    /// As [`TransformerDecoderLayer::try_forward_with`].
    #[track_caller]
    pub fn try_forward_with(
        &self,
        tgt: &Tensor,
        memory: &Tensor,
        tgt_masks: Masks<'_>,
        memory_masks: Masks<'_>,
    ) -> Result<Tensor> {
        let mut x = tgt.clone();
        for layer in &self.layers {
            x = layer.try_forward_with(&x, memory, tgt_masks, memory_masks)?;
        }
        with_final_norm(self.norm.as_ref(), x)
    }
}

/// PyTorch's `nn.Transformer`: an encoder stack and a decoder stack, each with a final norm
/// (`encoder.layers.0.…`, `encoder.norm`, `decoder.layers.0.…`, `decoder.norm`).
///
/// ```
/// use kiln::nn::{Masks, Transformer, TransformerOptions};
/// use kiln::prelude::*;
/// let options = TransformerOptions { dim_feedforward: 32, dropout: 0.0, ..Default::default() };
/// let model = Transformer::new(16, 2, 2, 2, options);
/// let (src, tgt) = (Tensor::randn([9, 3, 16]), Tensor::randn([7, 3, 16]));
/// let causal = Masks { is_causal: true, ..Default::default() };
/// let y = model.forward_with(&src, &tgt, Masks::default(), causal, Masks::default());
/// assert_eq!(y.dims(), &[7, 3, 16]);
/// ```
#[derive(Clone, Debug)]
pub struct Transformer {
    /// The encoder stack.
    pub encoder: TransformerEncoder,
    /// The decoder stack.
    pub decoder: TransformerDecoder,
}

crate::parameters!(Transformer { encoder, decoder });

impl Transformer {
    /// `d_model`, `nhead`, `num_encoder_layers`, `num_decoder_layers` and the layers'
    /// options, both stacks with final norms (PyTorch's defaults are 512, 8, 6, 6).
    ///
    /// # Panics
    /// As [`TransformerEncoderLayer::try_with_options`] fails.
    #[must_use]
    #[track_caller]
    pub fn new(
        d_model: usize,
        nhead: usize,
        num_encoder_layers: usize,
        num_decoder_layers: usize,
        options: TransformerOptions,
    ) -> Transformer {
        Transformer {
            encoder: TransformerEncoder::new(d_model, nhead, num_encoder_layers, options, true),
            decoder: TransformerDecoder::new(d_model, nhead, num_decoder_layers, options, true),
        }
    }

    /// The decoder's output for `tgt` attending to the encoded `src` (PyTorch's `forward`:
    /// `src_mask`/`src_key_padding_mask`, `tgt_mask`/`tgt_key_padding_mask`, and the
    /// memory's masks).
    ///
    /// # Panics
    /// As [`Transformer::try_forward_with`] fails.
    #[must_use]
    #[track_caller]
    pub fn forward_with(
        &self,
        src: &Tensor,
        tgt: &Tensor,
        src_masks: Masks<'_>,
        tgt_masks: Masks<'_>,
        memory_masks: Masks<'_>,
    ) -> Tensor {
        ok(self.try_forward_with(src, tgt, src_masks, tgt_masks, memory_masks))
    }

    /// [`Transformer::forward_with`], returning an error instead of panicking.
    ///
    /// # Errors
    /// As the layers'.
    #[track_caller]
    pub fn try_forward_with(
        &self,
        src: &Tensor,
        tgt: &Tensor,
        src_masks: Masks<'_>,
        tgt_masks: Masks<'_>,
        memory_masks: Masks<'_>,
    ) -> Result<Tensor> {
        let memory = self.encoder.try_forward_with(src, src_masks)?;
        self.decoder.try_forward_with(tgt, &memory, tgt_masks, memory_masks)
    }
}
