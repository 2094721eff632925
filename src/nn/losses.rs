//! The regression and divergence losses of `torch.nn.functional`: `l1_loss`,
//! `smooth_l1_loss`, `huber_loss`, `binary_cross_entropy` (on probabilities) and `kl_div`,
//! with PyTorch's arguments, defaults and edge cases. Compositions of tensor ops: they fuse
//! and differentiate as the rest.

use super::functional::{Reduction, same_shape};
use crate::{Error, Result, Tensor};

/// `|input - target|`, reduced (PyTorch's `l1_loss`).
///
/// ```
/// use kiln::nn::functional::{self as F, Reduction};
/// use kiln::prelude::*;
/// let x = Tensor::from_vec(vec![1.0f32, -2.0], [2]);
/// let y = Tensor::from_vec(vec![0.5f32, 1.0], [2]);
/// assert_eq!(F::l1_loss(&x, &y, Reduction::Mean).item::<f32>(), 1.75);
/// ```
///
/// # Panics
/// As [`try_l1_loss`] fails.
#[must_use]
#[track_caller]
pub fn l1_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Tensor {
    crate::error::ok(try_l1_loss(input, target, reduction))
}

/// [`l1_loss`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the shapes differ.
#[track_caller]
pub fn try_l1_loss(input: &Tensor, target: &Tensor, reduction: Reduction) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    same_shape("l1_loss", input, target)?;
    reduction.apply(&input.try_sub(target)?.abs())
}

/// The error `d = input - target` squared (halved, over `beta`) below `beta` and absolute
/// (less `beta / 2`) above: PyTorch's `smooth_l1_loss` (`beta` 0 is [`l1_loss`]).
///
/// # Panics
/// As [`try_smooth_l1_loss`] fails.
#[must_use]
#[track_caller]
pub fn smooth_l1_loss(input: &Tensor, target: &Tensor, reduction: Reduction, beta: f64) -> Tensor {
    crate::error::ok(try_smooth_l1_loss(input, target, reduction, beta))
}

/// [`smooth_l1_loss`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the shapes differ; [`Error::Value`] for a negative `beta`.
#[track_caller]
pub fn try_smooth_l1_loss(
    input: &Tensor,
    target: &Tensor,
    reduction: Reduction,
    beta: f64,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    same_shape("smooth_l1_loss", input, target)?;
    if beta.is_nan() || beta < 0.0 {
        return Err(Error::value("smooth_l1_loss", format!("beta must be >= 0, got {beta}")));
    }
    let d = input.try_sub(target)?.abs();
    if beta == 0.0 {
        return reduction.apply(&d);
    }
    let losses = Tensor::where_(&d.lt(beta), d.square() * (0.5 / beta), &d - 0.5 * beta);
    reduction.apply(&losses)
}

/// The error squared (halved) below `delta` and `delta·(|d| - delta/2)` above: PyTorch's
/// `huber_loss` (`smooth_l1_loss` times `delta`).
///
/// ```
/// use kiln::nn::functional::{self as F, Reduction};
/// use kiln::prelude::*;
/// let x = Tensor::from_vec(vec![0.5f64, 3.0], [2]);
/// let losses = F::huber_loss(&x, &Tensor::zeros([2]).double(), Reduction::None, 1.0);
/// assert_eq!(losses.to_vec::<f64>(), [0.125, 2.5]);
/// ```
///
/// # Panics
/// As [`try_huber_loss`] fails.
#[must_use]
#[track_caller]
pub fn huber_loss(input: &Tensor, target: &Tensor, reduction: Reduction, delta: f64) -> Tensor {
    crate::error::ok(try_huber_loss(input, target, reduction, delta))
}

/// [`huber_loss`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the shapes differ; [`Error::Value`] unless `delta > 0`.
#[track_caller]
pub fn try_huber_loss(
    input: &Tensor,
    target: &Tensor,
    reduction: Reduction,
    delta: f64,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    same_shape("huber_loss", input, target)?;
    if delta.is_nan() || delta <= 0.0 {
        return Err(Error::value("huber_loss", format!("delta must be > 0, got {delta}")));
    }
    let d = input.try_sub(target)?.abs();
    let losses = Tensor::where_(&d.lt(delta), d.square() * 0.5, (&d - 0.5 * delta) * delta);
    reduction.apply(&losses)
}

/// `-(y·ln p + (1 - y)·ln(1 - p))` for probabilities `p` (PyTorch's `binary_cross_entropy`;
/// each log is clamped at -100, as PyTorch does, so `p` of 0 or 1 gives a finite loss).
/// Prefer [`super::functional::binary_cross_entropy_with_logits`] on logits.
///
/// # Panics
/// As [`try_binary_cross_entropy`] fails.
#[must_use]
#[track_caller]
pub fn binary_cross_entropy(input: &Tensor, target: &Tensor, reduction: Reduction) -> Tensor {
    crate::error::ok(try_binary_cross_entropy(input, target, reduction))
}

/// [`binary_cross_entropy`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the shapes differ.
#[track_caller]
pub fn try_binary_cross_entropy(
    input: &Tensor,
    target: &Tensor,
    reduction: Reduction,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    same_shape("binary_cross_entropy", input, target)?;
    let log_p = input.log().clamp_min(-100.0);
    let log_q = (1.0 - input).log().clamp_min(-100.0);
    let losses = -(target.try_mul(&log_p)? + (1.0 - target).try_mul(&log_q)?);
    reduction.apply(&losses)
}

/// How [`kl_div`] combines its pointwise terms: PyTorch's `reduction` strings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KlReduction {
    /// The mean over every element (PyTorch's default, which it warns about).
    #[default]
    Mean,
    /// The sum over elements divided by the batch size (the first dimension): the
    /// divergence per sample, what the definition asks for.
    BatchMean,
    /// The sum over elements.
    Sum,
    /// No reduction.
    None,
}

/// The Kullback-Leibler divergence `target·(ln target - input)` pointwise, for `input` given
/// as log-probabilities, with `0·ln 0 = 0` (PyTorch's `kl_div`; with `log_target`,
/// `target` holds log-probabilities too: `e^target·(target - input)`).
///
/// ```
/// use kiln::nn::functional::{self as F, KlReduction};
/// use kiln::prelude::*;
/// let log_q = Tensor::from_vec(vec![-1.0f64, -2.0], [2]);
/// let p = Tensor::from_vec(vec![0.0f64, 0.5], [2]);
/// let kl = F::kl_div(&log_q, &p, KlReduction::Sum, false).item::<f64>();
/// assert!((kl - 0.5 * (0.5f64.ln() + 2.0)).abs() < 1e-12);
/// ```
///
/// # Panics
/// As [`try_kl_div`] fails.
#[must_use]
#[track_caller]
pub fn kl_div(input: &Tensor, target: &Tensor, reduction: KlReduction, log_target: bool) -> Tensor {
    crate::error::ok(try_kl_div(input, target, reduction, log_target))
}

/// [`kl_div`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the shapes differ, or for `BatchMean` of a 0-dimensional input.
#[track_caller]
pub fn try_kl_div(
    input: &Tensor,
    target: &Tensor,
    reduction: KlReduction,
    log_target: bool,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    same_shape("kl_div", input, target)?;
    let terms = if log_target {
        target.exp().try_mul(&target.try_sub(input)?)?
    } else {
        target.try_xlogy(target)?.try_sub(&target.try_mul(input)?)?
    };
    match reduction {
        KlReduction::Mean => Reduction::Mean.apply(&terms),
        KlReduction::Sum => Reduction::Sum.apply(&terms),
        KlReduction::None => Reduction::None.apply(&terms),
        KlReduction::BatchMean => match input.dims().first() {
            Some(&batch) => Ok(terms.sum() / batch.max(1) as f64),
            None => {
                Err(Error::shape("kl_div", "BatchMean needs a batch dimension (input of rank 0)"))
            }
        },
    }
}

/// `max(0, -y·(x1 - x2) + margin)` for labels `y` of ±1 (PyTorch's `margin_ranking_loss`).
///
/// # Panics
/// As [`try_margin_ranking_loss`] fails.
#[must_use]
#[track_caller]
pub fn margin_ranking_loss(
    x1: &Tensor,
    x2: &Tensor,
    y: &Tensor,
    margin: f64,
    reduction: Reduction,
) -> Tensor {
    crate::error::ok(try_margin_ranking_loss(x1, x2, y, margin, reduction))
}

/// [`margin_ranking_loss`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the shapes differ.
#[track_caller]
pub fn try_margin_ranking_loss(
    x1: &Tensor,
    x2: &Tensor,
    y: &Tensor,
    margin: f64,
    reduction: Reduction,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    same_shape("margin_ranking_loss", x1, x2)?;
    same_shape("margin_ranking_loss", x1, y)?;
    let losses = (-(y.try_mul(&x1.try_sub(x2)?)?) + margin).relu();
    reduction.apply(&losses)
}

/// `max(d(a, p) - d(a, n) + margin, 0)` with `d` the [`super::functional::pairwise_distance`]
/// of order `p` (and `eps`) along the last dimension; with `swap`, `d(a, n)` is the
/// smaller of it and `d(p, n)` (PyTorch's `triplet_margin_loss`; margin 1, p 2, eps 1e-6
/// there).
///
/// # Panics
/// As [`try_triplet_margin_loss`] fails.
#[allow(clippy::too_many_arguments, reason = "PyTorch's arguments, in its order")]
#[must_use]
#[track_caller]
pub fn triplet_margin_loss(
    anchor: &Tensor,
    positive: &Tensor,
    negative: &Tensor,
    margin: f64,
    p: f64,
    eps: f64,
    swap: bool,
    reduction: Reduction,
) -> Tensor {
    crate::error::ok(try_triplet_margin_loss(
        anchor, positive, negative, margin, p, eps, swap, reduction,
    ))
}

/// [`triplet_margin_loss`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the shapes do not broadcast.
#[allow(clippy::too_many_arguments, reason = "PyTorch's arguments, in its order")]
#[track_caller]
pub fn try_triplet_margin_loss(
    anchor: &Tensor,
    positive: &Tensor,
    negative: &Tensor,
    margin: f64,
    p: f64,
    eps: f64,
    swap: bool,
    reduction: Reduction,
) -> Result<Tensor> {
    use super::functional::try_pairwise_distance as d;
    let _at = crate::engine::origin::enter();
    let near = d(anchor, positive, p, eps, false)?;
    let mut far = d(anchor, negative, p, eps, false)?;
    if swap {
        far = far.try_minimum(&d(positive, negative, p, eps, false)?)?;
    }
    reduction.apply(&(near.try_sub(&far)? + margin).relu())
}
