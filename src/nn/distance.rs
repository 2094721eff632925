//! Norms and distances of `torch.nn.functional`: `normalize`, `cosine_similarity`,
//! `pairwise_distance`, and `one_hot`, with PyTorch's arguments and defaults.

use crate::{DType, Error, Result, Tensor};

/// `x / max(‖x‖_p, eps)` along `dim` (PyTorch's `normalize`: `p` 2, `dim` 1, `eps` 1e-12 by
/// default there); a zero vector stays zero.
///
/// ```
/// use kiln::nn::functional as F;
/// use kiln::prelude::*;
/// let x = Tensor::from_vec(vec![3.0f32, 4.0, 0.0, 0.0], [2, 2]);
/// assert_eq!(F::normalize(&x, 2.0, 1, 1e-12).to_vec::<f32>(), [0.6, 0.8, 0.0, 0.0]);
/// ```
///
/// # Panics
/// As [`try_normalize`] fails.
#[must_use]
#[track_caller]
pub fn normalize(x: &Tensor, p: f64, dim: i64, eps: f64) -> Tensor {
    crate::error::ok(try_normalize(x, p, dim, eps))
}

/// [`normalize`], returning an error instead of panicking.
///
/// # Errors
/// As [`Tensor::try_vector_norm`]: a dimension out of range, a non-float tensor.
#[track_caller]
pub fn try_normalize(x: &Tensor, p: f64, dim: i64, eps: f64) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    x.try_div(x.try_vector_norm(p, dim, true)?.clamp_min(eps))
}

/// The cosine of the angle between `x1` and `x2` along `dim` (broadcast): the dot product
/// of each normalized by `max(‖x‖, eps)`, as PyTorch's `cosine_similarity` (`dim` 1, `eps`
/// 1e-8 there).
///
/// ```
/// use kiln::nn::functional as F;
/// use kiln::prelude::*;
/// let a = Tensor::from_vec(vec![3.0f64, 4.0], [1, 2]);
/// let b = Tensor::from_vec(vec![4.0f64, 3.0], [1, 2]);
/// assert!((F::cosine_similarity(&a, &b, 1, 1e-8).item::<f64>() - 0.96).abs() < 1e-12);
/// ```
///
/// # Panics
/// As [`try_cosine_similarity`] fails.
#[must_use]
#[track_caller]
pub fn cosine_similarity(x1: &Tensor, x2: &Tensor, dim: i64, eps: f64) -> Tensor {
    crate::error::ok(try_cosine_similarity(x1, x2, dim, eps))
}

/// [`cosine_similarity`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the shapes do not broadcast or `dim` is out of range.
#[track_caller]
pub fn try_cosine_similarity(x1: &Tensor, x2: &Tensor, dim: i64, eps: f64) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    let unit = |x: &Tensor| -> Result<Tensor> {
        x.try_div(x.try_vector_norm(2.0, dim, true)?.clamp_min(eps))
    };
    unit(x1)?.try_mul(&unit(x2)?)?.try_sum_dim(dim, false)
}

/// `‖x1 - x2 + eps‖_p` along the last dimension (PyTorch's `pairwise_distance`: `p` 2, `eps`
/// 1e-6, `keepdim` false there).
///
/// # Panics
/// As [`try_pairwise_distance`] fails.
#[must_use]
#[track_caller]
pub fn pairwise_distance(x1: &Tensor, x2: &Tensor, p: f64, eps: f64, keepdim: bool) -> Tensor {
    crate::error::ok(try_pairwise_distance(x1, x2, p, eps, keepdim))
}

/// [`pairwise_distance`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the shapes do not broadcast.
#[track_caller]
pub fn try_pairwise_distance(
    x1: &Tensor,
    x2: &Tensor,
    p: f64,
    eps: f64,
    keepdim: bool,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    (x1.try_sub(x2)? + eps).try_vector_norm(p, -1, keepdim)
}

/// Class indices `[..]` (i64) as one-hot rows `[.., num_classes]` of i64 (PyTorch's
/// `one_hot`; `None` takes the largest index plus one, read now).
///
/// ```
/// use kiln::nn::functional as F;
/// use kiln::prelude::*;
/// let y = Tensor::from_vec(vec![2i64, 0], [2]);
/// assert_eq!(F::one_hot(&y, Some(3)).to_vec::<i64>(), [0, 0, 1, 1, 0, 0]);
/// ```
///
/// # Panics
/// As [`try_one_hot`] fails.
#[must_use]
#[track_caller]
pub fn one_hot(indices: &Tensor, num_classes: Option<usize>) -> Tensor {
    crate::error::ok(try_one_hot(indices, num_classes))
}

/// [`one_hot`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::DType`] for indices that are not i64; [`Error::Index`] for an index outside
/// `0..num_classes` (read now, as PyTorch checks).
#[track_caller]
pub fn try_one_hot(indices: &Tensor, num_classes: Option<usize>) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    if indices.dtype() != DType::I64 {
        return Err(Error::dtype(
            "one_hot",
            format!("takes i64 class indices, got {}; cast with .long()", indices.dtype()),
        ));
    }
    let values = indices.try_to_vec::<i64>()?;
    let (lo, hi) = (values.iter().copied().min(), values.iter().copied().max());
    let classes = match num_classes {
        Some(c) => c,
        None => hi.map_or(0, |h| (h + 1).max(0) as usize),
    };
    if let Some(bad) = lo.filter(|&l| l < 0).or(hi.filter(|&h| h >= classes as i64)) {
        return Err(Error::Index {
            op: "one_hot",
            detail: format!("class {bad} is outside 0..{classes}"),
        });
    }
    let all = Tensor::try_arange(0i64, classes as i64, 1)?;
    Ok(indices.try_unsqueeze(-1)?.try_eq(&all)?.to_dtype(DType::I64))
}
