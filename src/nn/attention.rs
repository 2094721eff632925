//! Scaled dot-product attention and multi-head attention.
//!
//! [`scaled_dot_product_attention`] runs **fused** without dropout, with no mask, a causal
//! triangle (either corner) or a bool mask: one attention op over tiles of queries and keys
//! with an online softmax (flash attention), whose backward recomputes the scores tile by
//! tile, so the `[.., L, S]` score matrix is never stored and memory grows linearly with the
//! sequence. A bool mask is an operand of the op, read through its broadcast view, and key
//! tiles it hides from every query of a tile are not read at all (a static key/value cache's
//! empty slots). Grouped-query attention (`enable_gqa`) shares each key/value head between
//! its query heads by broadcasting, without copying the keys. On the CPU it is a parallel
//! tiled kernel; on a GPU, CUDA kernels of one warp per query (or key) row with an online
//! softmax in f32 and f64. With a float mask or dropout it is composed of kiln's primitives
//! instead (a batched product, one fused scale–mask–softmax kernel, a batched product),
//! which stores the score matrix; the profile names the path (`attention` or `matmul`).

use super::dropout::Dropout;
use super::functional::try_dropout;
use super::linear::Linear;
use super::{Module, init};
use crate::error::ok;
use crate::{DType, Error, Result, Tensor};

/// Which corner the causal triangle starts from when there are fewer queries than keys
/// (PyTorch's `torch.nn.attention.bias.CausalVariant`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CausalVariant {
    /// Query `i` sees keys `0..=i` (PyTorch's `is_causal`).
    #[default]
    UpperLeft,
    /// Query `i` sees keys `0..=i + S - L`: the queries are the last `L` of `S` positions,
    /// as a chunk of new tokens after `S - L` cached ones. A query that sees no key gives
    /// zeros.
    LowerRight,
}

/// The optional parts of [`scaled_dot_product_attention_with`], PyTorch's keyword
/// arguments.
#[derive(Clone, Copy, Debug, Default)]
pub struct AttentionOptions<'a> {
    /// A bool mask (`true`: the query may attend to the key) or an additive float mask,
    /// broadcast to `[.., L, S]`.
    pub attn_mask: Option<&'a Tensor>,
    /// Keep each query from attending to later keys; not together with `attn_mask`.
    pub is_causal: bool,
    /// Which corner the causal triangle starts from (with `is_causal`).
    pub causal_variant: CausalVariant,
    /// The score scale (default `1/√E`, E the query's last dimension).
    pub scale: Option<f64>,
    /// The probability of dropping an attention weight (rescaling the rest). As in
    /// PyTorch, pass 0 outside training.
    pub dropout_p: f64,
    /// Grouped-query attention (PyTorch's `enable_gqa`): `k` and `v` have `Hkv` heads
    /// (dimension -3) and `q` a multiple `Hq` of them; query head `h` reads key/value head
    /// `h / (Hq / Hkv)`.
    pub enable_gqa: bool,
}

/// `softmax(q·kᵀ·scale + mask)·v`, as PyTorch's `functional.scaled_dot_product_attention`:
/// `q` is `[.., L, E]`, `k` is `[.., S, E]`, `v` is `[.., S, Ev]`; the leading (batch and
/// head) dimensions broadcast, and the result is `[.., L, Ev]`. A query whose keys are all
/// masked gives zeros and no gradient, as PyTorch's.
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

/// [`scaled_dot_product_attention`] with the rest of PyTorch's options: a scale, dropout,
/// the causal triangle's corner and grouped-query attention.
///
/// ```
/// use kiln::nn::functional::{self as F, AttentionOptions, CausalVariant};
/// use kiln::prelude::*;
/// // Two new queries after three cached keys, 4 query heads sharing 2 key/value heads.
/// let q = Tensor::randn([1, 4, 2, 8]);
/// let (k, v) = (Tensor::randn([1, 2, 5, 8]), Tensor::randn([1, 2, 5, 8]));
/// let options = AttentionOptions {
///     is_causal: true,
///     causal_variant: CausalVariant::LowerRight,
///     enable_gqa: true,
///     ..Default::default()
/// };
/// let y = F::scaled_dot_product_attention_with(&q, &k, &v, options);
/// assert_eq!(y.dims(), [1, 4, 2, 8]);
/// ```
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

const OP: &str = "scaled_dot_product_attention";

/// [`scaled_dot_product_attention_with`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the operands are not at least 2-D, their feature or sequence
/// dimensions disagree, the leading dimensions or the mask do not broadcast, the query heads
/// are not a multiple of the key/value heads (with `enable_gqa`), or both a mask and
/// `is_causal` are given; [`Error::DType`] for non-float operands or an integer mask;
/// [`Error::Value`] for a dropout probability outside `[0, 1]`.
#[track_caller]
pub fn try_scaled_dot_product_attention_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    options: AttentionOptions<'_>,
) -> Result<Tensor> {
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
    if let Some(mask) = options.attn_mask
        && !(mask.dtype() == DType::Bool || mask.dtype().is_float())
    {
        return Err(Error::dtype(
            OP,
            format!(
                "attn_mask must be bool (true = attend) or float (added), got {}",
                mask.dtype()
            ),
        ));
    }
    let scale = options.scale.unwrap_or(1.0 / (last(q, 1) as f64).sqrt());
    let same_dtype = q.dtype() == k.dtype() && k.dtype() == v.dtype();
    let bool_mask = options.attn_mask.is_none_or(|m| m.dtype() == DType::Bool);
    if options.enable_gqa {
        return grouped(q, k, v, options, scale);
    }
    if bool_mask && options.dropout_p == 0.0 && same_dtype {
        return fused(q, k, v, options, scale);
    }
    composed(q, k, v, options, scale)
}

/// Grouped-query attention: the query heads grouped by the key/value head they share
/// (`[.., Hkv, Hq/Hkv, L, E]`), so that keys and values (`[.., Hkv, 1, S, E]`) broadcast over
/// each group, without a copy, on the fused path; the composed path repeats them.
fn grouped(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    options: AttentionOptions<'_>,
    scale: f64,
) -> Result<Tensor> {
    let heads = |t: &Tensor| (t.ndim() >= 3).then(|| t.dims()[t.ndim() - 3]);
    let (Some(hq), Some(hk), Some(hv)) = (heads(q), heads(k), heads(v)) else {
        return Err(Error::shape(
            OP,
            format!(
                "enable_gqa needs [.., H, L, E] operands, got q {}, k {}, v {}",
                q.shape(),
                k.shape(),
                v.shape()
            ),
        ));
    };
    if hk != hv || hk == 0 || hq % hk != 0 {
        return Err(Error::shape(
            OP,
            format!(
                "enable_gqa needs as many key as value heads, dividing the query heads; got \
                 {hq} query, {hk} key and {hv} value heads (dimension -3 of q {}, k {}, v {})",
                q.shape(),
                k.shape(),
                v.shape()
            ),
        ));
    }
    let rep = hq / hk;
    let options = AttentionOptions { enable_gqa: false, ..options };
    let bool_mask = options.attn_mask.is_none_or(|m| m.dtype() == DType::Bool);
    let same_dtype = q.dtype() == k.dtype() && k.dtype() == v.dtype();
    if rep == 1 || !(bool_mask && options.dropout_p == 0.0 && same_dtype) {
        // Each key/value head repeated for its query heads, as PyTorch's repeat_interleave.
        let widen = |t: &Tensor| -> Result<Tensor> {
            if rep == 1 {
                return Ok(t.clone());
            }
            let mut dims: Vec<i64> = t.dims().iter().map(|&d| d as i64).collect();
            let at = dims.len() - 2;
            let expanded = {
                let mut e = dims.clone();
                e.insert(at, rep as i64);
                e
            };
            dims[at - 1] = hq as i64;
            t.try_unsqueeze(at as i64)?.try_expand(&expanded)?.try_reshape(&dims)
        };
        return try_scaled_dot_product_attention_with(q, &widen(k)?, &widen(v)?, options);
    }
    // [.., Hq, L, E] -> [.., Hkv, rep, L, E]; k and v [.., Hkv, 1, S, E].
    let group = |t: &Tensor| -> Result<Tensor> {
        let mut dims: Vec<i64> = t.dims().iter().map(|&d| d as i64).collect();
        let at = dims.len() - 3;
        dims.splice(at..=at, [hk as i64, rep as i64]);
        t.try_reshape(&dims)
    };
    let shared = |t: &Tensor| t.try_unsqueeze(t.ndim() as i64 - 2);
    let mask = match options.attn_mask {
        // A mask with a head dimension of Hq is grouped as the queries; one without
        // (fewer than three dimensions, or a head dimension of 1) broadcasts.
        Some(m) if m.ndim() >= 3 && m.dims()[m.ndim() - 3] == hq => Some(group(m)?),
        Some(m) if m.ndim() >= 3 => Some(shared(m)?),
        other => other.cloned(),
    };
    let options = AttentionOptions { attn_mask: mask.as_ref(), ..options };
    let y = fused(&group(q)?, &shared(k)?, &shared(v)?, options, scale)?;
    let mut dims: Vec<i64> = y.dims().iter().map(|&d| d as i64).collect();
    let at = dims.len() - 4;
    dims.splice(at..at + 2, [hq as i64]);
    y.try_reshape(&dims)
}

/// Attention composed of kiln's primitives: a batched product, the masked softmax, and a
/// batched product. A query whose scores are all `-inf` gets zero weights (PyTorch's safe
/// softmax), not 0/0.
fn composed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    options: AttentionOptions<'_>,
    scale: f64,
) -> Result<Tensor> {
    let (l, s) = (q.dims()[q.ndim() - 2], k.dims()[k.ndim() - 2]);
    let scores = q.try_matmul(&k.try_transpose(-2, -1)?)? * scale;
    let (scores, masked) = if options.is_causal {
        let keep = causal_keep(l, s, options.causal_variant)?.try_to(scores.device())?;
        (Tensor::try_where_(&keep, &scores, f64::NEG_INFINITY)?, true)
    } else if let Some(mask) = options.attn_mask {
        match mask.dtype() {
            DType::Bool => (Tensor::try_where_(mask, &scores, f64::NEG_INFINITY)?, true),
            _ => (scores.try_add(mask.to_dtype(scores.dtype()))?, true),
        }
    } else {
        (scores, false)
    };
    let weights = if masked {
        // Rows that see no key are softmaxed as zeros and then zeroed, so that neither
        // their values nor their gradients are 0/0.
        let seen = scores.try_amax(-1, true)?.try_gt(f64::NEG_INFINITY)?;
        let safe = Tensor::try_where_(&seen, &scores, 0.0)?;
        Tensor::try_where_(&seen, safe.softmax(-1), 0.0)?
    } else {
        scores.softmax(-1)
    };
    let weights = if options.dropout_p > 0.0 {
        try_dropout(&weights, options.dropout_p, true)?
    } else {
        weights
    };
    weights.try_matmul(v)
}

/// `[l, s]`: `true` where a query sees a key under the causal triangle from `variant`'s
/// corner.
fn causal_keep(l: usize, s: usize, variant: CausalVariant) -> Result<Tensor> {
    let rows = Tensor::try_arange(0i64, l as i64, 1)?.try_reshape(&[l as i64, 1])?;
    let cols = Tensor::try_arange(0i64, s as i64, 1)?.try_reshape(&[1, s as i64])?;
    Ok(match variant {
        CausalVariant::UpperLeft => cols.le(&rows),
        CausalVariant::LowerRight => cols.le(&(rows + (s as f64 - l as f64))),
    })
}

/// The fused attention op over the operands (and a bool mask) broadcast to one batch shape
/// (a view: a transposed, sliced or broadcast operand is read in place on the CPU).
fn fused(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    options: AttentionOptions<'_>,
    scale: f64,
) -> Result<Tensor> {
    use kiln_ir::AttentionMask;
    let lead = |t: &Tensor| crate::Shape::new(t.dims()[..t.ndim().saturating_sub(2)].to_vec());
    let mut batch = lead(q).broadcast(&lead(k), OP)?.broadcast(&lead(v), OP)?;
    if let Some(mask) = options.attn_mask {
        batch = batch.broadcast(&lead(mask), OP)?;
    }
    // The op wants at least one batch dimension.
    let batch: Vec<i64> = match batch.dims() {
        [] => vec![1],
        dims => dims.iter().map(|&d| d as i64).collect(),
    };
    let expand = |t: &Tensor, rows: usize, cols: usize| -> Result<Tensor> {
        let mut dims = batch.clone();
        dims.extend([rows as i64, cols as i64]);
        t.try_expand(&dims).map_err(|_| {
            Error::shape(
                OP,
                format!(
                    "{} does not broadcast to [.., L, S] = {dims:?} (q {}, k {})",
                    t.shape(),
                    q.shape(),
                    k.shape()
                ),
            )
        })
    };
    let operand = |t: &Tensor| expand(t, t.dims()[t.ndim() - 2], t.dims()[t.ndim() - 1]);
    let (l, s) = (q.dims()[q.ndim() - 2], k.dims()[k.ndim() - 2]);
    let mut operands = vec![operand(q)?, operand(k)?, operand(v)?];
    let mask = match (options.attn_mask, options.is_causal, options.causal_variant) {
        (Some(m), ..) => {
            operands.push(expand(m, l, s)?);
            AttentionMask::Given
        }
        (None, true, CausalVariant::UpperLeft) => AttentionMask::Causal,
        (None, true, CausalVariant::LowerRight) => AttentionMask::CausalLowerRight,
        (None, false, _) => AttentionMask::None,
    };
    let op = kiln_ir::Op::Attention { mask, scale: scale.to_bits() };
    let out = Tensor::from_op(op, &operands.iter().collect::<Vec<_>>())?;
    if q.ndim() == 2
        && k.ndim() == 2
        && v.ndim() == 2
        && options.attn_mask.is_none_or(|m| m.ndim() <= 2)
    {
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
        let options = AttentionOptions {
            attn_mask: mask.as_ref(),
            is_causal,
            dropout_p,
            ..Default::default()
        };
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
