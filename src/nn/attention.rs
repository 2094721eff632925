//! Scaled dot-product attention and multi-head attention.
//!
//! [`scaled_dot_product_attention`] runs **fused** when there is no mask other than
//! `is_causal` and no dropout: one attention op over tiles of queries and keys with an
//! online softmax (flash attention), whose backward recomputes the scores tile by tile, so
//! the `[.., L, S]` score matrix is never stored and memory grows linearly with the
//! sequence. On the CPU it is a parallel tiled kernel; on a GPU, CUDA kernels of one thread
//! per query (or key) row with an online softmax in f32 and f64 (16-bit operands run over
//! host copies there, which the profile shows as host work). With an `attn_mask` or dropout it is
//! composed of kiln's primitives instead (a batched product, one fused scale–mask–softmax
//! kernel, a batched product), which stores the score matrix; the profile names the path
//! (`attention` or `matmul`).

use super::dropout::Dropout;
use super::functional::try_dropout;
use super::linear::Linear;
use super::{Module, init};
use crate::error::ok;
use crate::{DType, Error, Result, Tensor};

/// The optional parts of [`scaled_dot_product_attention_with`], PyTorch's keyword
/// arguments.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttentionOptions<'a> {
    /// A bool mask (`true`: the query may attend to the key) or an additive float mask,
    /// broadcast to `[.., L, S]`.
    pub attn_mask: Option<&'a Tensor>,
    /// Keep each query from attending to later keys (`j > i`); not together with
    /// `attn_mask`.
    pub is_causal: bool,
    /// The score scale (default `1/√E`, E the query's last dimension).
    pub scale: Option<f64>,
    /// The probability of dropping an attention weight (rescaling the rest). As in
    /// PyTorch, pass 0 outside training.
    pub dropout_p: f64,
}

/// `softmax(q·kᵀ·scale + mask)·v`, as PyTorch's `functional.scaled_dot_product_attention`:
/// `q` is `[.., L, E]`, `k` is `[.., S, E]`, `v` is `[.., S, Ev]`; the leading (batch and
/// head) dimensions broadcast, and the result is `[.., L, Ev]`. A row whose keys are all
/// masked gives NaN, as PyTorch's reference path does.
///
/// ```
/// use kiln::nn::functional as F;
/// use kiln::prelude::*;
/// kiln::manual_seed(0);
/// let (q, k, v) = (Tensor::randn([2, 4, 5, 8]), Tensor::randn([2, 4, 5, 8]), Tensor::randn([2, 4, 5, 8]));
/// let y = F::scaled_dot_product_attention(&q, &k, &v, None, true);
/// assert_eq!(y.dims(), [2, 4, 5, 8]);
/// // The first query sees only the first key.
/// let first = y.narrow(2, 0, 1).to_vec::<f32>();
/// assert_eq!(first, v.narrow(2, 0, 1).to_vec::<f32>());
/// ```
///
/// # Panics
/// As [`try_scaled_dot_product_attention_with`] fails.
#[must_use]
#[track_caller]
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    attn_mask: Option<&Tensor>,
    is_causal: bool,
) -> Tensor {
    let options = AttentionOptions { attn_mask, is_causal, ..Default::default() };
    ok(try_scaled_dot_product_attention_with(q, k, v, options))
}

/// [`scaled_dot_product_attention`] with a scale and dropout.
///
/// # Panics
/// As [`try_scaled_dot_product_attention_with`] fails.
#[must_use]
#[track_caller]
pub fn scaled_dot_product_attention_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    options: AttentionOptions<'_>,
) -> Tensor {
    ok(try_scaled_dot_product_attention_with(q, k, v, options))
}

/// [`scaled_dot_product_attention_with`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the operands are not at least 2-D, their feature or sequence
/// dimensions disagree, the leading dimensions or the mask do not broadcast, or both a
/// mask and `is_causal` are given; [`Error::DType`] for non-float operands or an integer
/// mask; [`Error::Value`] for a dropout probability outside `[0, 1]`.
#[track_caller]
pub fn try_scaled_dot_product_attention_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    options: AttentionOptions<'_>,
) -> Result<Tensor> {
    const OP: &str = "scaled_dot_product_attention";
    let _at = crate::engine::origin::enter();
    // Under autocast, in its 16-bit type (`crate::autocast`).
    let (q, k, v) = (&q.autocast_lowered(), &k.autocast_lowered(), &v.autocast_lowered());
    let shapes = || format!("q {}, k {}, v {}", q.shape(), k.shape(), v.shape());
    if q.ndim() < 2 || k.ndim() < 2 || v.ndim() < 2 {
        return Err(Error::shape(OP, format!("needs [.., L, E] operands, got {}", shapes())));
    }
    let last = |t: &Tensor, i: usize| t.dims()[t.ndim() - i];
    if last(q, 1) != last(k, 1) || last(k, 2) != last(v, 2) {
        return Err(Error::shape(
            OP,
            format!(
                "q and k need one feature size and k and v one sequence length; got {}",
                shapes()
            ),
        ));
    }
    if !(q.dtype().is_float() && k.dtype().is_float() && v.dtype().is_float()) {
        return Err(Error::dtype(
            OP,
            format!("takes float operands, got {}, {}, {}", q.dtype(), k.dtype(), v.dtype()),
        ));
    }
    if options.is_causal && options.attn_mask.is_some() {
        return Err(Error::shape(
            OP,
            "takes attn_mask or is_causal, not both; fold the causal part into the mask",
        ));
    }
    let (l, s) = (last(q, 2), last(k, 2));
    let scale = options.scale.unwrap_or(1.0 / (last(q, 1) as f64).sqrt());
    let same_dtype = q.dtype() == k.dtype() && k.dtype() == v.dtype();
    if options.attn_mask.is_none() && options.dropout_p == 0.0 && same_dtype {
        return fused(q, k, v, options.is_causal, scale);
    }
    let scores = q.try_matmul(&k.try_transpose(-2, -1)?)? * scale;
    let scores = if options.is_causal {
        let rows = Tensor::try_arange(0i64, l as i64, 1)?.try_reshape(&[l as i64, 1])?;
        let cols = Tensor::try_arange(0i64, s as i64, 1)?.try_reshape(&[1, s as i64])?;
        let keep = cols.le(&rows).try_to(scores.device())?;
        Tensor::try_where_(&keep, &scores, f64::NEG_INFINITY)?
    } else if let Some(mask) = options.attn_mask {
        match mask.dtype() {
            DType::Bool => Tensor::try_where_(mask, &scores, f64::NEG_INFINITY)?,
            d if d.is_float() => scores.try_add(mask.to_dtype(scores.dtype()))?,
            d => {
                return Err(Error::dtype(
                    OP,
                    format!("attn_mask must be bool (true = attend) or float (added), got {d}"),
                ));
            }
        }
    } else {
        scores
    };
    let weights = scores.softmax(-1);
    let weights = if options.dropout_p > 0.0 {
        try_dropout(&weights, options.dropout_p, true)?
    } else {
        weights
    };
    weights.try_matmul(v)
}

/// The fused attention op over the operands broadcast to one batch shape (a view: a
/// transposed or sliced operand is read in place on the CPU).
fn fused(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, scale: f64) -> Result<Tensor> {
    let lead = |t: &Tensor| crate::Shape::new(t.dims()[..t.ndim() - 2].to_vec());
    let batch = lead(q)
        .broadcast(&lead(k), "scaled_dot_product_attention")?
        .broadcast(&lead(v), "scaled_dot_product_attention")?;
    // The op wants at least one batch dimension.
    let batch: Vec<i64> = match batch.dims() {
        [] => vec![1],
        dims => dims.iter().map(|&d| d as i64).collect(),
    };
    let operand = |t: &Tensor| -> Result<Tensor> {
        let mut dims = batch.clone();
        dims.extend([t.dims()[t.ndim() - 2] as i64, t.dims()[t.ndim() - 1] as i64]);
        t.try_expand(&dims)
    };
    let op = kiln_ir::Op::Attention { causal, scale: scale.to_bits() };
    let out = Tensor::from_op(op, &[&operand(q)?, &operand(k)?, &operand(v)?])?;
    if q.ndim() == 2 && k.ndim() == 2 && v.ndim() == 2 {
        return out.try_squeeze(0);
    }
    Ok(out)
}

/// Multi-head attention, as PyTorch's `nn.MultiheadAttention` with `batch_first=True`:
/// inputs are `[batch, seq, embed_dim]` (or unbatched `[seq, embed_dim]`). The parameters
/// have PyTorch's names and layouts (`in_proj_weight` `[3E, E]`, `in_proj_bias`,
/// `out_proj.weight`, `out_proj.bias`), so PyTorch state dicts load into it.
///
/// As a [`Module`] it is self-attention without a mask; [`MultiheadAttention::try_attend`]
/// takes separate query, key and value and the masks.
///
/// ```
/// use kiln::nn::{Module, MultiheadAttention};
/// use kiln::prelude::*;
/// let mha = MultiheadAttention::new(16, 4);
/// let x = Tensor::randn([2, 5, 16]);
/// let causal = mha.attend(&x, &x, &x, None, None, true);
/// assert_eq!(causal.dims(), [2, 5, 16]);
/// assert_eq!(mha.forward(&x).dims(), [2, 5, 16]);
/// ```
#[derive(Clone, Debug)]
pub struct MultiheadAttention {
    /// The stacked query, key and value projections, `[3·embed_dim, embed_dim]`.
    pub in_proj_weight: Tensor,
    /// Their biases, `[3·embed_dim]`, when the layer has them.
    pub in_proj_bias: Option<Tensor>,
    /// The output projection.
    pub out_proj: Linear,
    /// Dropout on the attention weights (active in training mode).
    pub dropout: Dropout,
    num_heads: usize,
}

crate::parameters!(MultiheadAttention { in_proj_weight, in_proj_bias, out_proj, dropout });

impl MultiheadAttention {
    /// A layer with biases and no dropout, initialized as PyTorch does (Xavier-uniform
    /// input projection, zero biases).
    ///
    /// # Panics
    /// As [`MultiheadAttention::try_new`] fails.
    #[must_use]
    #[track_caller]
    pub fn new(embed_dim: usize, num_heads: usize) -> MultiheadAttention {
        ok(MultiheadAttention::try_new(embed_dim, num_heads, 0.0, true))
    }

    /// A layer with attention dropout `dropout` and optional biases.
    ///
    /// # Errors
    /// [`Error::Shape`] when `embed_dim` is zero or not a multiple of `num_heads`;
    /// [`Error::Value`] for a dropout probability outside `[0, 1]`.
    #[track_caller]
    pub fn try_new(
        embed_dim: usize,
        num_heads: usize,
        dropout: f64,
        bias: bool,
    ) -> Result<MultiheadAttention> {
        if embed_dim == 0 || num_heads == 0 || !embed_dim.is_multiple_of(num_heads) {
            return Err(Error::shape(
                "MultiheadAttention::new",
                format!(
                    "embed_dim ({embed_dim}) must be a positive multiple of num_heads ({num_heads})"
                ),
            ));
        }
        let in_proj_weight = Tensor::zeros([3 * embed_dim, embed_dim]);
        init::xavier_uniform_(&in_proj_weight, 1.0)?;
        let out_proj = Linear::try_with_options(embed_dim, embed_dim, bias, DType::F32)?;
        let in_proj_bias = if bias { Some(Tensor::zeros([3 * embed_dim])) } else { None };
        if let Some(b) = &out_proj.bias {
            init::zeros_(b)?;
        }
        Ok(MultiheadAttention {
            in_proj_weight: in_proj_weight.requires_grad_(true),
            in_proj_bias: in_proj_bias.map(|b| b.requires_grad_(true)),
            out_proj,
            dropout: Dropout::try_new(dropout)?,
            num_heads,
        })
    }

    /// The number of heads.
    pub fn num_heads(&self) -> usize {
        self.num_heads
    }

    /// Attention of `query` (`[B, L, E]`) over `key` and `value` (`[B, S, E]`), PyTorch's
    /// `forward` with `need_weights=False`. As in PyTorch's module, a bool `attn_mask`
    /// (`[L, S]` or `[B·heads, L, S]`) and `key_padding_mask` (`[B, S]`) mark with `true`
    /// the positions that may **not** be attended (float masks are added).
    ///
    /// # Panics
    /// As [`MultiheadAttention::try_attend`] fails.
    #[must_use]
    #[track_caller]
    pub fn attend(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        attn_mask: Option<&Tensor>,
        key_padding_mask: Option<&Tensor>,
        is_causal: bool,
    ) -> Tensor {
        ok(self.try_attend(query, key, value, attn_mask, key_padding_mask, is_causal))
    }

    /// [`MultiheadAttention::attend`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when the inputs' shapes do not fit the layer or each other, or a
    /// mask does not broadcast; the errors of [`try_scaled_dot_product_attention_with`].
    #[track_caller]
    pub fn try_attend(
        &self,
        query: &Tensor,
        key: &Tensor,
        value: &Tensor,
        attn_mask: Option<&Tensor>,
        key_padding_mask: Option<&Tensor>,
        is_causal: bool,
    ) -> Result<Tensor> {
        const OP: &str = "MultiheadAttention";
        let _at = crate::engine::origin::enter();
        let unbatched = query.ndim() == 2;
        let batch = |t: &Tensor| if unbatched { t.try_unsqueeze(0) } else { Ok(t.clone()) };
        let (q, k, v) = (batch(query)?, batch(key)?, batch(value)?);
        let e = self.in_proj_weight.dims()[1];
        let h = self.num_heads;
        let fits = [&q, &k, &v]
            .iter()
            .all(|t| t.ndim() == 3 && t.dims()[2] == e && t.dims()[0] == q.dims()[0])
            && k.dims()[1] == v.dims()[1];
        if !fits {
            return Err(Error::shape(
                OP,
                format!(
                    "expected query [B, L, {e}] and key, value [B, S, {e}], got {}, {}, {}",
                    query.shape(),
                    key.shape(),
                    value.shape()
                ),
            ));
        }
        let (b, l, s) = (q.dims()[0] as i64, q.dims()[1] as i64, k.dims()[1] as i64);
        let project = |x: &Tensor, part: usize| -> Result<Tensor> {
            let w = self.in_proj_weight.try_narrow(0, part * e, e)?;
            let mut y = x.try_matmul(&w.try_t()?)?;
            if let Some(bias) = &self.in_proj_bias {
                y = y.try_add(&bias.try_narrow(0, part * e, e)?)?;
            }
            // [B, T, E] -> [B, heads, T, E/heads]
            let t = x.dims()[1] as i64;
            y.try_reshape(&[b, t, h as i64, (e / h) as i64])?.try_transpose(1, 2)
        };
        let (qh, kh, vh) = (project(&q, 0)?, project(&k, 1)?, project(&v, 2)?);
        let mask = self.combined_mask(attn_mask, key_padding_mask, b, l, s)?;
        let dropout_p = if self.dropout.training { self.dropout.p } else { 0.0 };
        let options =
            AttentionOptions { attn_mask: mask.as_ref(), is_causal, scale: None, dropout_p };
        let heads = try_scaled_dot_product_attention_with(&qh, &kh, &vh, options)?;
        let merged = heads.try_transpose(1, 2)?.try_reshape(&[b, l, e as i64])?;
        let out = self.out_proj.try_forward(&merged)?;
        if unbatched { out.try_squeeze(0) } else { Ok(out) }
    }

    /// PyTorch's masks (`true`: blocked) as one additive float mask for
    /// [`scaled_dot_product_attention`], `[B, heads, L, S]` or broadcastable to it.
    fn combined_mask(
        &self,
        attn_mask: Option<&Tensor>,
        key_padding_mask: Option<&Tensor>,
        b: i64,
        l: i64,
        s: i64,
    ) -> Result<Option<Tensor>> {
        let additive = |m: &Tensor| -> Tensor {
            if m.dtype() == DType::Bool {
                Tensor::where_(m, f64::NEG_INFINITY, 0.0)
            } else {
                m.float()
            }
        };
        let h = self.num_heads as i64;
        let mut total: Option<Tensor> = None;
        if let Some(m) = attn_mask {
            let m = match m.ndim() {
                2 => additive(m),
                3 => additive(m).try_reshape(&[b, h, l, s])?,
                _ => {
                    return Err(Error::shape(
                        "MultiheadAttention",
                        format!("attn_mask must be [L, S] or [B·heads, L, S], got {}", m.shape()),
                    ));
                }
            };
            total = Some(m);
        }
        if let Some(m) = key_padding_mask {
            if m.dims() != [b as usize, s as usize] {
                return Err(Error::shape(
                    "MultiheadAttention",
                    format!("key_padding_mask must be [B, S] = [{b}, {s}], got {}", m.shape()),
                ));
            }
            let m = additive(m).try_reshape(&[b, 1, 1, s])?;
            total = Some(match total {
                Some(t) => t.try_add(&m)?,
                None => m,
            });
        }
        Ok(total)
    }
}

impl Module for MultiheadAttention {
    #[track_caller]
    fn try_forward(&self, x: &Tensor) -> Result<Tensor> {
        self.try_attend(x, x, x, None, None, false)
    }
}
