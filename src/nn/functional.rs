//! Losses and layer functions, PyTorch's `torch.nn.functional`.
//!
//! Each function records ordinary tensor ops, so it fuses with its neighbors and
//! differentiates like any other code: `cross_entropy` is a `log_softmax` (one reduction
//! kernel), a `gather` and a mean.
//!
//! ```
//! use kiln::nn::functional as F;
//! use kiln::prelude::*;
//!
//! let logits = Tensor::from_vec(vec![2.0f64, 1.0, 0.1, 0.5, 2.5, 0.3], [2, 3]);
//! let target = Tensor::from_vec(vec![0i64, 1], [2]);
//! let loss = F::cross_entropy(&logits, &target).item::<f64>();
//! // -(log_softmax([2, 1, .1])[0] + log_softmax([.5, 2.5, .3])[1]) / 2
//! assert!((loss - 0.3185).abs() < 1e-4);
//! ```

pub use super::attention::{
    AttentionOptions, CausalVariant, scaled_dot_product_attention,
    scaled_dot_product_attention_with, try_scaled_dot_product_attention_with,
};
pub use super::batchnorm::{BatchNormOptions, batch_norm, try_batch_norm};
pub use super::conv::{Conv1dOptions, Conv2dOptions, conv1d, conv2d, try_conv1d, try_conv2d};
pub use super::ctc::{CtcLossOptions, ctc_loss, try_ctc_loss};
pub use super::distance::{
    cosine_similarity, normalize, one_hot, pairwise_distance, try_cosine_similarity, try_normalize,
    try_one_hot, try_pairwise_distance,
};
pub use super::embedding::{embedding, embedding_bag, try_embedding, try_embedding_bag};
pub use super::fold::{
    ConvTranspose2dOptions, FoldOptions, conv_transpose2d, fold, try_conv_transpose2d, try_fold,
    try_unfold, unfold,
};
pub use super::grid::{affine_grid, grid_sample, try_affine_grid, try_grid_sample};
pub use super::losses::{
    KlReduction, binary_cross_entropy, huber_loss, kl_div, l1_loss, margin_ranking_loss,
    smooth_l1_loss, triplet_margin_loss, try_binary_cross_entropy, try_huber_loss, try_kl_div,
    try_l1_loss, try_margin_ranking_loss, try_smooth_l1_loss, try_triplet_margin_loss,
};
pub use super::norm::{group_norm, rms_norm, try_group_norm, try_rms_norm};
pub use super::pointwise::{
    celu, glu, hardshrink, hardsigmoid, hardswish, hardtanh, linear, logsigmoid, mish, prelu,
    relu6, selu, softmin, softshrink, softsign, tanhshrink, threshold, try_celu, try_glu,
    try_linear, try_prelu,
};
pub use super::pool::{
    Pool2dOptions, adaptive_avg_pool2d, adaptive_max_pool2d, avg_pool2d, max_pool2d,
    max_pool2d_with_indices, try_adaptive_avg_pool2d, try_adaptive_max_pool2d, try_avg_pool2d,
    try_max_pool2d, try_max_pool2d_with_indices,
};
pub use super::resize::{
    InterpolateMode, PadMode, Resize, interpolate, pad, try_interpolate, try_pad,
};
pub use super::sequence::{
    ConvTranspose1dOptions, Pool1dOptions, adaptive_avg_pool1d, adaptive_max_pool1d, avg_pool1d,
    bilinear, conv_transpose1d, gumbel_softmax, instance_norm, max_pool1d, try_adaptive_avg_pool1d,
    try_adaptive_max_pool1d, try_avg_pool1d, try_bilinear, try_conv_transpose1d,
    try_gumbel_softmax, try_instance_norm, try_max_pool1d,
};
pub use super::shuffle::{pixel_shuffle, pixel_unshuffle, try_pixel_shuffle, try_pixel_unshuffle};
pub use super::volume::{
    Conv3dOptions, Pool3dOptions, adaptive_avg_pool3d, adaptive_max_pool3d, avg_pool3d, conv3d,
    max_pool3d, try_adaptive_avg_pool3d, try_adaptive_max_pool3d, try_avg_pool3d, try_conv3d,
    try_max_pool3d,
};
use crate::error::ok;
use crate::{Error, Result, Tensor};

/// How a loss combines its per-element values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// The mean over elements (the default, as in PyTorch).
    #[default]
    Mean,
    /// The sum over elements.
    Sum,
    /// No reduction: one loss per element.
    None,
}

impl Reduction {
    pub(super) fn apply(self, losses: &Tensor) -> Result<Tensor> {
        match self {
            Reduction::Mean => losses.try_mean(),
            Reduction::Sum => Ok(losses.sum()),
            Reduction::None => Ok(losses.clone()),
        }
    }
}

/// Options of [`cross_entropy_with`]; the defaults are PyTorch's, except `ignore_index`
/// (PyTorch's default of `-100` is opt-in here, as `Some(-100)`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CrossEntropyOptions {
    /// How per-sample losses combine.
    pub reduction: Reduction,
    /// The weight `ε` of a uniform target mixed into the one-hot target: the loss becomes
    /// `(1-ε)·nll + ε·mean_c(-log p_c)`.
    pub label_smoothing: f64,
    /// A target value whose samples contribute nothing (padding); the mean is over the rest.
    pub ignore_index: Option<i64>,
}

/// [`Tensor::softmax`] as a function.
#[track_caller]
#[must_use]
pub fn softmax(input: &Tensor, dim: i64) -> Tensor {
    let _at = crate::engine::origin::enter();
    input.softmax(dim)
}

/// [`Tensor::log_softmax`] as a function.
#[track_caller]
#[must_use]
pub fn log_softmax(input: &Tensor, dim: i64) -> Tensor {
    let _at = crate::engine::origin::enter();
    input.log_softmax(dim)
}

/// The cross-entropy between `input` logits (`[N, C]`, `[N, C, d...]` or `[C]`) and integer
/// class indices `target` (`[N]`, `[N, d...]` or `[]`), averaged over samples. Computed
/// through `log_softmax`, so large logits do not overflow.
///
/// # Panics
/// As [`try_cross_entropy_with`] fails.
#[track_caller]
#[must_use]
pub fn cross_entropy(input: &Tensor, target: &Tensor) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_cross_entropy_with(input, target, CrossEntropyOptions::default()))
}

/// [`cross_entropy`] with a reduction, label smoothing or an ignored index.
///
/// # Panics
/// As [`try_cross_entropy_with`] fails.
///
/// ```
/// use kiln::nn::functional::{self as F, CrossEntropyOptions, Reduction};
/// use kiln::prelude::*;
///
/// let logits = Tensor::zeros([3, 4]);
/// let target = Tensor::from_vec(vec![0i64, 3, 1], [3]);
/// let opts = CrossEntropyOptions { reduction: Reduction::None, ..Default::default() };
/// let per_sample = F::cross_entropy_with(&logits, &target, opts);
/// assert_eq!(per_sample.dims(), &[3]);
/// assert!((per_sample.to_vec::<f32>()[0] - 4f32.ln()).abs() < 1e-6);
/// ```
#[track_caller]
#[must_use]
pub fn cross_entropy_with(input: &Tensor, target: &Tensor, options: CrossEntropyOptions) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_cross_entropy_with(input, target, options))
}

/// [`cross_entropy_with`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when `target`'s shape is not `input`'s without the class dimension;
/// [`Error::DType`] for float targets or integer logits; [`Error::Value`] for a label
/// smoothing outside `[0, 1]`. A class index outside `[0, C)` fails when the loss is computed
/// ([`Error::Runtime`]).
#[track_caller]
pub fn try_cross_entropy_with(
    input: &Tensor,
    target: &Tensor,
    options: CrossEntropyOptions,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    // Under autocast, in f32 (`crate::autocast`).
    let input = &input.autocast_widened();
    const OP: &str = "cross_entropy";
    let eps = options.label_smoothing;
    if !(0.0..=1.0).contains(&eps) {
        return Err(Error::value(OP, format!("label_smoothing must be in [0, 1], got {eps}")));
    }
    let class_dim = check_class_target(OP, input, target)?;
    let logp = input.try_log_softmax(class_dim)?;
    nll_from_log_probs(OP, &logp, target, class_dim, options)
}

/// The negative log-likelihood of integer class indices `target` under log-probabilities
/// `input` (the output of [`log_softmax`]), with the shapes of [`cross_entropy`].
///
/// # Panics
/// As [`try_nll_loss_with`] fails.
///
/// ```
/// use kiln::nn::functional as F;
/// use kiln::prelude::*;
///
/// let logp = Tensor::from_vec(vec![-0.5f32, -1.0, -2.0, -0.25], [2, 2]);
/// let target = Tensor::from_vec(vec![1i64, 0], [2]);
/// assert_eq!(F::nll_loss(&logp, &target).item::<f32>(), 1.5);
/// ```
#[track_caller]
#[must_use]
pub fn nll_loss(input: &Tensor, target: &Tensor) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_nll_loss_with(input, target, Reduction::Mean, None))
}

/// [`nll_loss`] with a reduction and an optional ignored target value.
///
/// # Panics
/// As [`try_nll_loss_with`] fails.
#[track_caller]
#[must_use]
pub fn nll_loss_with(
    input: &Tensor,
    target: &Tensor,
    reduction: Reduction,
    ignore_index: Option<i64>,
) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_nll_loss_with(input, target, reduction, ignore_index))
}

/// [`nll_loss_with`], returning an error instead of panicking.
///
/// # Errors
/// As [`try_cross_entropy_with`].
#[track_caller]
pub fn try_nll_loss_with(
    input: &Tensor,
    target: &Tensor,
    reduction: Reduction,
    ignore_index: Option<i64>,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    // Under autocast, in f32 (`crate::autocast`).
    let input = &input.autocast_widened();
    const OP: &str = "nll_loss";
    let class_dim = check_class_target(OP, input, target)?;
    let options = CrossEntropyOptions { reduction, label_smoothing: 0.0, ignore_index };
    nll_from_log_probs(OP, input, target, class_dim, options)
}

/// Checks logits/log-probabilities against class targets; returns the class dimension.
fn check_class_target(op: &'static str, input: &Tensor, target: &Tensor) -> Result<i64> {
    if !input.dtype().is_float() {
        return Err(Error::dtype(
            op,
            format!(
                "the input must be floating point, got {}; convert it with .float()",
                input.dtype()
            ),
        ));
    }
    if !target.dtype().is_int() {
        return Err(Error::dtype(
            op,
            format!(
                "the target must hold integer class indices, got {}; for probabilities use a soft-target loss, for float labels convert with .long()",
                target.dtype()
            ),
        ));
    }
    let class_dim = usize::from(input.ndim() >= 2);
    let mut expected = input.dims().to_vec();
    if expected.is_empty() {
        return Err(Error::shape(op, "the input must have a class dimension, got a scalar"));
    }
    expected.remove(class_dim);
    if target.dims() != expected.as_slice() {
        return Err(Error::shape(
            op,
            format!(
                "input of shape {} (classes in dimension {class_dim}) needs a target of shape {expected:?}, got {}",
                input.shape(),
                target.shape()
            ),
        ));
    }
    Ok(class_dim as i64)
}

fn nll_from_log_probs(
    op: &'static str,
    logp: &Tensor,
    target: &Tensor,
    class_dim: i64,
    options: CrossEntropyOptions,
) -> Result<Tensor> {
    let target = target.long();
    let keep = options.ignore_index.map(|ignored| target.ne(ignored));
    // Ignored samples gather class 0 (always in range) and are masked out below.
    let safe_target = match &keep {
        Some(keep) => Tensor::try_where_(keep, &target, 0)?,
        None => target.clone(),
    };
    let picked = logp.try_gather(class_dim, &safe_target.try_unsqueeze(class_dim)?)?;
    let mut losses = picked.try_squeeze(class_dim)?.neg();
    let eps = options.label_smoothing;
    if eps > 0.0 {
        let uniform = logp.try_mean_dim(class_dim, false)?.neg();
        losses = losses * (1.0 - eps) + uniform * eps;
    }
    match (&keep, options.reduction) {
        (None, reduction) => reduction.apply(&losses),
        (Some(keep), reduction) => {
            let masked = Tensor::try_where_(keep, &losses, 0.0)?;
            match reduction {
                Reduction::Mean => {
                    let count = keep.to_dtype(masked.dtype()).sum();
                    masked.sum().try_div(&count)
                }
                other => other.apply(&masked),
            }
        }
    }
    .map_err(|e| match e {
        Error::Shape { detail, .. } => Error::Shape { op, detail },
        other => other,
    })
}

/// The mean squared error between `input` and a `target` of the same shape.
///
/// # Panics
/// As [`try_mse_loss_with`] fails.
///
/// ```
/// use kiln::nn::functional as F;
/// use kiln::prelude::*;
/// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]);
/// let b = Tensor::from_vec(vec![1.0f32, 0.0, 6.0], [3]);
/// assert_eq!(F::mse_loss(&a, &b).item::<f32>(), (0.0 + 4.0 + 9.0) / 3.0);
/// ```
#[track_caller]
#[must_use]
pub fn mse_loss(input: &Tensor, target: &Tensor) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_mse_loss_with(input, target, Reduction::Mean))
}

/// [`mse_loss`] with a reduction.
///
/// # Panics
/// As [`try_mse_loss_with`] fails.
#[track_caller]
#[must_use]
pub fn mse_loss_with(input: &Tensor, target: &Tensor, reduction: Reduction) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_mse_loss_with(input, target, reduction))
}

/// [`mse_loss_with`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the shapes differ (PyTorch broadcasts with a warning; that is
/// almost always a bug, so kiln asks for an explicit `expand`).
#[track_caller]
pub fn try_mse_loss_with(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    // Under autocast, in f32 (`crate::autocast`).
    let input = &input.autocast_widened();
    let target = &target.autocast_widened();
    same_shape("mse_loss", input, target)?;
    reduction.apply(&input.try_sub(target)?.square())
}

/// The binary cross-entropy between `logits` and `target` probabilities of the same shape,
/// computed stably as `max(x, 0) - x·y + log(1 + e^-|x|)`.
///
/// # Panics
/// As [`try_binary_cross_entropy_with_logits`] fails.
///
/// ```
/// use kiln::nn::functional as F;
/// use kiln::prelude::*;
/// let x = Tensor::from_vec(vec![0.0f64, 1000.0], [2]);
/// let y = Tensor::from_vec(vec![1.0f64, 0.0], [2]);
/// let loss = F::binary_cross_entropy_with_logits(&x, &y).item::<f64>();
/// assert!((loss - (2f64.ln() + 1000.0) / 2.0).abs() < 1e-9);
/// ```
#[track_caller]
#[must_use]
pub fn binary_cross_entropy_with_logits(logits: &Tensor, target: &Tensor) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_binary_cross_entropy_with_logits(logits, target, Reduction::Mean))
}

/// [`binary_cross_entropy_with_logits`] with a reduction.
///
/// # Errors
/// [`Error::Shape`] when the shapes differ, [`Error::DType`] for non-float logits.
#[track_caller]
pub fn try_binary_cross_entropy_with_logits(
    logits: &Tensor,
    target: &Tensor,
    reduction: Reduction,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    const OP: &str = "binary_cross_entropy_with_logits";
    same_shape(OP, logits, target)?;
    if !logits.dtype().is_float() {
        return Err(Error::dtype(
            OP,
            format!("logits must be floating point, got {}", logits.dtype()),
        ));
    }
    let softplus_neg_abs = (logits.abs().neg().exp() + 1.0).log();
    let losses = logits.clamp_min(0.0).try_sub(&logits.try_mul(target)?)? + softplus_neg_abs;
    reduction.apply(&losses)
}

pub(super) fn same_shape(op: &'static str, input: &Tensor, target: &Tensor) -> Result<()> {
    if input.shape() == target.shape() {
        return Ok(());
    }
    Err(Error::shape(
        op,
        format!(
            "input shape {} and target shape {} differ; reshape or expand the target explicitly",
            input.shape(),
            target.shape()
        ),
    ))
}

/// Dropout: when `training`, zeroes each element with probability `p` and scales the rest by
/// `1/(1-p)`; otherwise returns the input.
///
/// # Panics
/// As [`try_dropout`] fails.
#[track_caller]
#[must_use]
pub fn dropout(input: &Tensor, p: f64, training: bool) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_dropout(input, p, training))
}

/// [`dropout`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Value`] when `p` is not in `[0, 1]`; [`Error::DType`] for a non-float input.
#[track_caller]
pub fn try_dropout(input: &Tensor, p: f64, training: bool) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    if !(0.0..=1.0).contains(&p) {
        return Err(Error::value("dropout", format!("p must be in [0, 1], got {p}")));
    }
    if !input.dtype().is_float() {
        return Err(Error::dtype(
            "dropout",
            format!("the input must be floating point, got {}", input.dtype()),
        ));
    }
    if !training || p == 0.0 {
        return Ok(input.clone());
    }
    if p == 1.0 {
        return Ok(input * 0.0);
    }
    let keep = uniform_on(input.shape().clone(), input.device())?.ge(p);
    Tensor::try_where_(&keep, &(input * (1.0 / (1.0 - p))), 0.0)
}

/// Uniform `f32` values in `[0, 1)` on `device`: a dropout mask's draw, in `f32` whatever the
/// input's dtype (so the kept positions do not depend on it) and on the input's device.
fn uniform_on(shape: kiln_ir::Shape, device: crate::Device) -> Result<Tensor> {
    let key = crate::random::next_key();
    let op = kiln_ir::Op::Random { dist: kiln_ir::RandomDist::Uniform, key };
    Tensor::from_leaf_on(op, shape, kiln_ir::DType::F32, device)
}

/// [`Tensor::silu`] as a function.
#[track_caller]
#[must_use]
pub fn silu(input: &Tensor) -> Tensor {
    let _at = crate::engine::origin::enter();
    input.silu()
}

/// GELU: exact (through `erf`, [`Tensor::gelu`]) or, with `tanh_approximation`, PyTorch's
/// `approximate="tanh"` ([`Tensor::gelu_tanh`]).
#[track_caller]
#[must_use]
pub fn gelu(input: &Tensor, tanh_approximation: bool) -> Tensor {
    let _at = crate::engine::origin::enter();
    if tanh_approximation { input.gelu_tanh() } else { input.gelu() }
}

/// [`Tensor::softplus`] as a function.
#[track_caller]
#[must_use]
pub fn softplus(input: &Tensor, beta: f64, threshold: f64) -> Tensor {
    let _at = crate::engine::origin::enter();
    input.softplus(beta, threshold)
}

/// [`Tensor::leaky_relu`] as a function.
#[track_caller]
#[must_use]
pub fn leaky_relu(input: &Tensor, negative_slope: f64) -> Tensor {
    let _at = crate::engine::origin::enter();
    input.leaky_relu(negative_slope)
}

/// [`Tensor::elu`] as a function.
#[track_caller]
#[must_use]
pub fn elu(input: &Tensor, alpha: f64) -> Tensor {
    let _at = crate::engine::origin::enter();
    input.elu(alpha)
}

/// Channel dropout (PyTorch's `F.dropout2d`): in training mode each channel of each sample
/// of `input` (`[N, C, H, W]`, or `[C, H, W]` unbatched) is zeroed whole with probability `p`
/// and the kept ones are scaled by `1/(1-p)`; in evaluation mode the input passes through.
///
/// # Panics
/// As [`try_dropout2d`] fails.
///
/// ```
/// use kiln::nn::functional as F;
/// use kiln::prelude::*;
/// let y = F::dropout2d(&Tensor::ones([4, 8, 3, 3]), 0.5, true);
/// let per_channel = y.sum_dim([2i64, 3].as_slice(), false); // 0 or 9 / (1 - 0.5)
/// assert!(per_channel.to_vec::<f32>().iter().all(|&s| s == 0.0 || s == 18.0));
/// ```
#[track_caller]
#[must_use]
pub fn dropout2d(input: &Tensor, p: f64, training: bool) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_dropout2d(input, p, training))
}

/// [`dropout2d`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Value`] when `p` is not in `[0, 1]`; [`Error::Shape`] when the input is not
/// 3- or 4-dimensional; [`Error::DType`] for a non-float input.
#[track_caller]
pub fn try_dropout2d(input: &Tensor, p: f64, training: bool) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    if !matches!(input.ndim(), 3 | 4) {
        return Err(Error::shape(
            "dropout2d",
            format!("expects an input of shape [N, C, H, W] or [C, H, W], got {}", input.shape()),
        ));
    }
    if !(0.0..=1.0).contains(&p) {
        return Err(Error::value("dropout2d", format!("p must be in [0, 1], got {p}")));
    }
    if !input.dtype().is_float() {
        return Err(Error::dtype(
            "dropout2d",
            format!("the input must be floating point, got {}", input.dtype()),
        ));
    }
    if !training || p == 0.0 {
        return Ok(input.clone());
    }
    if p == 1.0 {
        return Ok(input * 0.0);
    }
    let mut mask_shape = input.dims().to_vec();
    let k = mask_shape.len();
    mask_shape[k - 2..].fill(1);
    let keep = uniform_on(mask_shape.into(), input.device())?.ge(p);
    Tensor::try_where_(&keep, &(input * (1.0 / (1.0 - p))), 0.0)
}

/// Layer normalization over the trailing `normalized_shape` dimensions (biased variance,
/// as PyTorch), then an optional elementwise `weight` and `bias` of that shape.
///
/// # Panics
/// As [`try_layer_norm`] fails.
#[track_caller]
#[must_use]
pub fn layer_norm(
    input: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_layer_norm(input, normalized_shape, weight, bias, eps))
}

/// [`layer_norm`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the input does not end in `normalized_shape` or the weight or bias
/// have another shape; [`Error::DType`] for a non-float input.
#[track_caller]
pub fn try_layer_norm(
    input: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    // Under autocast, in f32 (`crate::autocast`).
    let input = &input.autocast_widened();
    const OP: &str = "layer_norm";
    let dims = super::norm::normalized_dims(
        OP,
        input,
        normalized_shape,
        &[("weight", weight), ("bias", bias)],
    )?;
    let mean = input.try_mean_dim(dims.clone(), true)?;
    let centered = input - &mean;
    let var = centered.square().try_mean_dim(dims, true)?;
    let mut y = centered / (var + eps).sqrt();
    if let Some(w) = weight {
        y = y.try_mul(w)?;
    }
    if let Some(b) = bias {
        y = y.try_add(b)?;
    }
    Ok(y)
}
