//! Normalization layers.

use super::{Module, functional};
use crate::error::ok;
use crate::{DType, Error, Result, Tensor};

/// Normalizes over the trailing `normalized_shape` dimensions to zero mean and unit
/// (biased) variance, then applies a learned elementwise scale (ones) and shift (zeros),
/// as PyTorch's `nn.LayerNorm`.
///
/// ```
/// use kiln::nn::{LayerNorm, Module};
/// use kiln::prelude::*;
///
/// let ln = LayerNorm::new(&[8]);
/// let y = ln.forward(&(Tensor::randn([4, 8]) * 3.0 + 2.0));
/// let mean = y.mean_dim(-1, false).abs().max().item::<f32>();
/// assert!(mean < 1e-5);
/// ```
#[derive(Clone, Debug)]
pub struct LayerNorm {
    /// The trailing shape normalized over.
    pub normalized_shape: Vec<usize>,
    /// Added to the variance for stability (`1e-5` by default).
    pub eps: f64,
    /// The learned scale, shaped `normalized_shape`.
    pub weight: Option<Tensor>,
    /// The learned shift, shaped `normalized_shape`.
    pub bias: Option<Tensor>,
}

impl LayerNorm {
    /// A layer norm with a learned scale and shift and `eps = 1e-5`.
    ///
    /// # Panics
    /// As [`LayerNorm::try_with_options`] fails.
    #[must_use]
    #[track_caller]
    pub fn new(normalized_shape: &[usize]) -> LayerNorm {
        ok(LayerNorm::try_with_options(normalized_shape, 1e-5, true))
    }

    /// A layer norm with a chosen `eps`, with or without the learned scale and shift.
    ///
    /// # Panics
    /// As [`LayerNorm::try_with_options`] fails.
    #[must_use]
    #[track_caller]
    pub fn with_options(
        normalized_shape: &[usize],
        eps: f64,
        elementwise_affine: bool,
    ) -> LayerNorm {
        ok(LayerNorm::try_with_options(normalized_shape, eps, elementwise_affine))
    }

    /// [`LayerNorm::with_options`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] for a negative or NaN `eps`, or a shape no memory can hold;
    /// [`Error::Runtime`] when the parameters cannot be allocated.
    #[track_caller]
    pub fn try_with_options(
        normalized_shape: &[usize],
        eps: f64,
        elementwise_affine: bool,
    ) -> Result<LayerNorm> {
        if eps.is_nan() || eps < 0.0 {
            return Err(Error::shape("LayerNorm", format!("eps must be >= 0, got {eps}")));
        }
        let param = |value: f64| -> Result<Tensor> {
            let t = Tensor::try_full_dtype(normalized_shape, value, DType::F32)?;
            t.try_realize()?;
            Ok(t.requires_grad_(true))
        };
        let (weight, bias) =
            if elementwise_affine { (Some(param(1.0)?), Some(param(0.0)?)) } else { (None, None) };
        Ok(LayerNorm { normalized_shape: normalized_shape.to_vec(), eps, weight, bias })
    }
}

crate::parameters!(LayerNorm { weight, bias });

impl Module for LayerNorm {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        functional::try_layer_norm(
            input,
            &self.normalized_shape,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )
    }
}

/// Group normalization (PyTorch's `F.group_norm`): the channels of `input` (`[N, C, ...]`)
/// are split into `num_groups` groups, each sample's group is normalized to zero mean and
/// unit (biased) variance, then an optional per-channel `weight` and `bias` (`[C]`) apply.
/// The statistics are per sample, so training and evaluation agree.
///
/// # Panics
/// As [`try_group_norm`] fails.
///
/// ```
/// use kiln::nn::functional as F;
/// use kiln::prelude::*;
/// let x = Tensor::randn([2, 6, 4, 4]) * 3.0 + 1.0;
/// let y = F::group_norm(&x, 3, None, None, 1e-5);
/// let per_group = y.reshape(&[2, 3, -1]).mean_dim(-1, false);
/// assert!(per_group.abs().max().item::<f32>() < 1e-5);
/// ```
#[track_caller]
pub fn group_norm(
    input: &Tensor,
    num_groups: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_group_norm(input, num_groups, weight, bias, eps))
}

/// [`group_norm`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the input is not `[N, C, ...]`, `num_groups` does not divide `C`,
/// or the weight or bias is not `[C]`; [`Error::Value`] for a negative `eps`;
/// [`Error::DType`] for a non-float input.
#[track_caller]
pub fn try_group_norm(
    input: &Tensor,
    num_groups: usize,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    // Under autocast, in f32 (`crate::autocast`).
    let input = &input.autocast_widened();
    const OP: &str = "group_norm";
    if input.ndim() < 2 {
        return Err(Error::shape(
            OP,
            format!("expects an input of shape [N, C, ...], got {}", input.shape()),
        ));
    }
    if !input.dtype().is_float() {
        return Err(Error::dtype(
            OP,
            format!("the input must be floating point, got {}", input.dtype()),
        ));
    }
    if eps.is_nan() || eps < 0.0 {
        return Err(Error::value(OP, format!("eps must be >= 0, got {eps}")));
    }
    let (n, c) = (input.dims()[0], input.dims()[1]);
    if num_groups == 0 || !c.is_multiple_of(num_groups) {
        return Err(Error::shape(
            OP,
            format!("num_groups = {num_groups} must divide the input's {c} channels"),
        ));
    }
    for (what, t) in [("weight", weight), ("bias", bias)] {
        if let Some(t) = t
            && t.dims() != [c]
        {
            return Err(Error::shape(
                OP,
                format!("the {what} must have shape [{c}], got {}", t.shape()),
            ));
        }
    }
    let grouped = input.try_reshape(&[n as i64, num_groups as i64, -1])?;
    let mean = grouped.try_mean_dim(-1, true)?;
    let centered = grouped.try_sub(&mean)?;
    let var = centered.try_mul(&centered)?.try_mean_dim(-1, true)?;
    let dims: Vec<i64> = input.dims().iter().map(|&d| d as i64).collect();
    let mut y = centered.try_mul((var + eps).sqrt().reciprocal())?.try_reshape(&dims)?;
    let mut channel_shape = vec![1i64; input.ndim()];
    channel_shape[1] = c as i64;
    if let Some(w) = weight {
        y = y.try_mul(&w.try_reshape(&channel_shape)?)?;
    }
    if let Some(b) = bias {
        y = y.try_add(&b.try_reshape(&channel_shape)?)?;
    }
    Ok(y)
}

/// Group normalization as a layer (PyTorch's `nn.GroupNorm`), with a learned per-channel
/// scale (ones) and shift (zeros).
///
/// ```
/// use kiln::nn::{GroupNorm, Module};
/// use kiln::prelude::*;
/// let gn = GroupNorm::new(2, 4);
/// assert_eq!(gn.forward(&Tensor::randn([3, 4, 5])).dims(), &[3, 4, 5]);
/// ```
#[derive(Clone, Debug)]
pub struct GroupNorm {
    /// How many groups the channels split into.
    pub num_groups: usize,
    /// The channel count.
    pub num_channels: usize,
    /// Added to the variance (1e-5 by default).
    pub eps: f64,
    /// The learned scale `[C]`.
    pub weight: Option<Tensor>,
    /// The learned shift `[C]`.
    pub bias: Option<Tensor>,
}

impl GroupNorm {
    /// `num_channels` channels in `num_groups` groups, `eps = 1e-5`, learned scale and shift.
    ///
    /// # Panics
    /// As [`GroupNorm::try_with_options`] fails.
    #[must_use]
    #[track_caller]
    pub fn new(num_groups: usize, num_channels: usize) -> GroupNorm {
        ok(GroupNorm::try_with_options(num_groups, num_channels, 1e-5, true))
    }

    /// [`GroupNorm::new`] with a chosen `eps` and `affine`, returning an error instead of
    /// panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when `num_groups` does not divide `num_channels`; [`Error::Value`]
    /// for a negative `eps`.
    #[track_caller]
    pub fn try_with_options(
        num_groups: usize,
        num_channels: usize,
        eps: f64,
        affine: bool,
    ) -> Result<GroupNorm> {
        if num_groups == 0 || !num_channels.is_multiple_of(num_groups) {
            return Err(Error::shape(
                "GroupNorm",
                format!("num_groups = {num_groups} must divide num_channels = {num_channels}"),
            ));
        }
        if eps.is_nan() || eps < 0.0 {
            return Err(Error::value("GroupNorm", format!("eps must be >= 0, got {eps}")));
        }
        let param = |value: f64| -> Result<Tensor> {
            let t = Tensor::try_full_dtype([num_channels], value, DType::F32)?;
            t.try_realize()?;
            Ok(t.requires_grad_(true))
        };
        let (weight, bias) =
            if affine { (Some(param(1.0)?), Some(param(0.0)?)) } else { (None, None) };
        Ok(GroupNorm { num_groups, num_channels, eps, weight, bias })
    }
}

crate::parameters!(GroupNorm { weight, bias });

impl Module for GroupNorm {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        if input.ndim() < 2 || input.dims()[1] != self.num_channels {
            return Err(Error::shape(
                "GroupNorm",
                format!(
                    "expects an input of shape [N, {}, ...], got {}",
                    self.num_channels,
                    input.shape()
                ),
            ));
        }
        try_group_norm(input, self.num_groups, self.weight.as_ref(), self.bias.as_ref(), self.eps)
    }
}

/// Root-mean-square normalization over the trailing `normalized_shape` dimensions
/// (PyTorch's `F.rms_norm`): `x / sqrt(mean(x²) + eps) · weight`, with `eps` the dtype's
/// machine epsilon when `None`, as PyTorch's default.
///
/// # Panics
/// As [`try_rms_norm`] fails.
///
/// ```
/// use kiln::nn::functional as F;
/// use kiln::prelude::*;
/// let x = Tensor::from_vec(vec![3.0f64, 4.0], [1, 2]);
/// let y = F::rms_norm(&x, &[2], None, Some(0.0)).to_vec::<f64>();
/// let rms = (12.5f64).sqrt();
/// assert!((y[0] - 3.0 / rms).abs() < 1e-15 && (y[1] - 4.0 / rms).abs() < 1e-15);
/// ```
#[track_caller]
pub fn rms_norm(
    input: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    eps: Option<f64>,
) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_rms_norm(input, normalized_shape, weight, eps))
}

/// [`rms_norm`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the input does not end in `normalized_shape` or the weight is not
/// of that shape; [`Error::DType`] for a non-float input; [`Error::Value`] for a negative
/// `eps`.
#[track_caller]
pub fn try_rms_norm(
    input: &Tensor,
    normalized_shape: &[usize],
    weight: Option<&Tensor>,
    eps: Option<f64>,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    // Under autocast, in f32 (`crate::autocast`).
    let input = &input.autocast_widened();
    const OP: &str = "rms_norm";
    let dims = normalized_dims(OP, input, normalized_shape, &[("weight", weight)])?;
    let eps = match eps {
        Some(e) if e.is_nan() || e < 0.0 => {
            return Err(Error::value(OP, format!("eps must be >= 0, got {e}")));
        }
        Some(e) => e,
        None => machine_epsilon(input.dtype()),
    };
    let mean_square = input.try_mul(input)?.try_mean_dim(dims, true)?;
    let y = input.try_mul((mean_square + eps).sqrt().reciprocal())?;
    match weight {
        Some(w) => y.try_mul(w),
        None => Ok(y),
    }
}

/// The trailing dimensions `normalized_shape` names, after checking that `input` is a float
/// tensor ending in that shape and that each given affine tensor has it (layer and RMS
/// norm's shared checks).
pub(super) fn normalized_dims(
    op: &'static str,
    input: &Tensor,
    normalized_shape: &[usize],
    affine: &[(&str, Option<&Tensor>)],
) -> Result<Vec<i64>> {
    let (n, k) = (input.ndim(), normalized_shape.len());
    if k == 0 || k > n || &input.dims()[n - k..] != normalized_shape {
        return Err(Error::shape(
            op,
            format!(
                "the input of shape {} must end in the normalized shape {normalized_shape:?}",
                input.shape()
            ),
        ));
    }
    if !input.dtype().is_float() {
        return Err(Error::dtype(
            op,
            format!("the input must be floating point, got {}", input.dtype()),
        ));
    }
    for (what, t) in affine {
        if let Some(t) = t
            && t.dims() != normalized_shape
        {
            return Err(Error::shape(
                op,
                format!("the {what} must have shape {normalized_shape:?}, got {}", t.shape()),
            ));
        }
    }
    Ok((n - k..n).map(|d| d as i64).collect())
}

/// PyTorch's `torch.finfo(dtype).eps`.
fn machine_epsilon(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::EPSILON,
        DType::F16 => 0.000_976_562_5,
        DType::BF16 => 0.007_812_5,
        _ => f64::from(f32::EPSILON),
    }
}

/// Root-mean-square normalization as a layer (PyTorch's `nn.RMSNorm`), with a learned
/// elementwise scale (ones).
///
/// ```
/// use kiln::nn::{Module, RmsNorm};
/// use kiln::prelude::*;
/// let norm = RmsNorm::new(&[8]);
/// let y = norm.forward(&(Tensor::randn([4, 8]) * 5.0));
/// let rms = y.square().mean_dim(-1, false).sqrt();
/// assert!((rms - 1.0).abs().max().item::<f32>() < 1e-3);
/// ```
#[derive(Clone, Debug)]
pub struct RmsNorm {
    /// The trailing shape normalized over.
    pub normalized_shape: Vec<usize>,
    /// Added to the mean square; `None` for the dtype's machine epsilon.
    pub eps: Option<f64>,
    /// The learned scale, shaped `normalized_shape`.
    pub weight: Option<Tensor>,
}

impl RmsNorm {
    /// A layer with a learned scale and the default `eps`.
    ///
    /// # Panics
    /// As [`RmsNorm::try_with_options`] fails.
    #[must_use]
    #[track_caller]
    pub fn new(normalized_shape: &[usize]) -> RmsNorm {
        ok(RmsNorm::try_with_options(normalized_shape, None, true))
    }

    /// A layer with a chosen `eps`, with or without the learned scale.
    ///
    /// # Errors
    /// [`Error::Value`] for a negative or NaN `eps`; [`Error::Shape`] for a shape no memory
    /// can hold.
    #[track_caller]
    pub fn try_with_options(
        normalized_shape: &[usize],
        eps: Option<f64>,
        elementwise_affine: bool,
    ) -> Result<RmsNorm> {
        if let Some(e) = eps
            && (e.is_nan() || e < 0.0)
        {
            return Err(Error::value("RmsNorm", format!("eps must be >= 0, got {e}")));
        }
        let weight = if elementwise_affine {
            let t = Tensor::try_full_dtype(normalized_shape, 1.0, DType::F32)?;
            t.try_realize()?;
            Some(t.requires_grad_(true))
        } else {
            None
        };
        Ok(RmsNorm { normalized_shape: normalized_shape.to_vec(), eps, weight })
    }
}

crate::parameters!(RmsNorm { weight });

impl Module for RmsNorm {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        try_rms_norm(input, &self.normalized_shape, self.weight.as_ref(), self.eps)
    }
}
