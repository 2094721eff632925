//! Batch normalization: the function, and the `BatchNorm1d`/`BatchNorm2d` layers whose running
//! statistics are *buffers* (saved, loaded and moved with the model, never trained).
//!
//! In training mode the running statistics are updated in place, under `no_grad`, from the
//! batch statistics the forward pass computes anyway. The update is an ordinary recorded
//! write: inside [`crate::compile()`] it is part of the compiled plan (replayed on every call,
//! never dropped), and outside it joins the next realization on the thread, as the update
//! in eager PyTorch would have happened by then.

use super::{Module, Parameters};
use crate::error::ok;
use crate::{DType, Error, Result, Tensor};

/// The options of [`batch_norm`]: PyTorch's `training`, `momentum` and `eps`, with its
/// defaults (evaluation mode, 0.1, 1e-5).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchNormOptions {
    /// Normalize with the batch's statistics (and update the running ones) instead of the
    /// running statistics.
    pub training: bool,
    /// The weight of the batch statistics in the running ones:
    /// `running = (1 - momentum)·running + momentum·batch`.
    pub momentum: f64,
    /// Added to the variance for stability.
    pub eps: f64,
}

impl Default for BatchNormOptions {
    fn default() -> BatchNormOptions {
        BatchNormOptions { training: false, momentum: 0.1, eps: 1e-5 }
    }
}

/// Batch normalization over channel dimension 1 of `input` (`[N, C]`, `[N, C, L]`,
/// `[N, C, H, W]`, ...), as PyTorch's `F.batch_norm`.
///
/// In training mode each channel is normalized with the batch's mean and biased variance
/// over every other dimension, and `running_mean`/`running_var` (when given) are updated
/// in place with the mean and the *unbiased* variance. In evaluation mode the running
/// statistics normalize: the whole layer is one scale and shift per channel, which fuses
/// into the kernel that produced `input`.
///
/// # Panics
/// As [`try_batch_norm`] fails.
///
/// ```
/// use kiln::nn::functional::{self as F, BatchNormOptions};
/// use kiln::prelude::*;
///
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 5.0], [4, 1]);
/// let (mean, var) = (Tensor::zeros([1]), Tensor::ones([1]));
/// let train = BatchNormOptions { training: true, ..Default::default() };
/// let y = F::batch_norm(&x, Some(&mean), Some(&var), None, None, train);
/// assert!(y.mean().item::<f32>().abs() < 1e-6);
/// assert!((mean.item::<f32>() - 0.1 * 2.75).abs() < 1e-6); // updated in place
/// ```
#[track_caller]
pub fn batch_norm(
    input: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    options: BatchNormOptions,
) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_batch_norm(input, running_mean, running_var, weight, bias, options))
}

/// [`batch_norm`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the input has fewer than 2 dimensions, a statistic, weight or bias
/// is not `[C]`, or a training batch has one value per channel; [`Error::Value`] when
/// evaluation mode has no running statistics or `eps`/`momentum` are out of range;
/// [`Error::DType`] for a non-float input.
#[track_caller]
pub fn try_batch_norm(
    input: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    options: BatchNormOptions,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    // Under autocast, in f32 (`crate::autocast`).
    let input = &input.autocast_widened();
    normalize(input, running_mean, running_var, weight, bias, options, None)
}

/// [`try_batch_norm`]; with `count`, the running statistics take a cumulative average
/// (momentum `1 / count`, `count` a tensor so a compiled plan reads it afresh).
#[track_caller]
fn normalize(
    input: &Tensor,
    running_mean: Option<&Tensor>,
    running_var: Option<&Tensor>,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    options: BatchNormOptions,
    count: Option<&Tensor>,
) -> Result<Tensor> {
    const OP: &str = "batch_norm";
    let BatchNormOptions { training, momentum, eps } = options;
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
    if !(0.0..=1.0).contains(&momentum) {
        return Err(Error::value(OP, format!("momentum must be in [0, 1], got {momentum}")));
    }
    let c = input.dims()[1];
    for (what, t) in [
        ("running_mean", running_mean),
        ("running_var", running_var),
        ("weight", weight),
        ("bias", bias),
    ] {
        if let Some(t) = t
            && t.dims() != [c]
        {
            return Err(Error::shape(
                OP,
                format!(
                    "the {what} must have shape [{c}] for an input of shape {}, got {}",
                    input.shape(),
                    t.shape()
                ),
            ));
        }
    }
    if running_mean.is_some() != running_var.is_some() {
        return Err(Error::value(
            OP,
            "give both running_mean and running_var, or neither".to_string(),
        ));
    }
    // [1, C, 1, ...]: a per-channel vector broadcast against the input.
    let mut channel_shape = vec![1i64; input.ndim()];
    channel_shape[1] = c as i64;
    let per_channel =
        |t: &Tensor| -> Result<Tensor> { t.to_dtype(input.dtype()).try_reshape(&channel_shape) };
    let (scale, shift) = if training {
        let values = input.numel() / c.max(1);
        if values <= 1 {
            return Err(Error::shape(
                OP,
                format!(
                    "training needs more than one value per channel, got an input of shape {}; use a larger batch or evaluation mode",
                    input.shape()
                ),
            ));
        }
        let dims: Vec<i64> = (0..input.ndim() as i64).filter(|&d| d != 1).collect();
        let mean = input.try_mean_dim(dims.clone(), true)?;
        let centered = input.try_sub(&mean)?;
        let var = centered.try_mul(&centered)?.try_mean_dim(dims, true)?;
        if let (Some(rm), Some(rv)) = (running_mean, running_var) {
            let unbiased = values as f64 / (values - 1) as f64;
            // A fixed momentum is a Rust scalar (a constant on any device); a cumulative
            // average reads the count buffer, which lives with the statistics.
            let cumulative = count.map(|n| n.to_dtype(DType::F64).reciprocal());
            update_running(rm, &mean, momentum, cumulative.as_ref(), 1.0)?;
            update_running(rv, &var, momentum, cumulative.as_ref(), unbiased)?;
        }
        // The forward keeps `centered` so the gradient sees the batch mean's dependence.
        let inv = (var + eps).sqrt().reciprocal();
        // One per-channel scale, so that the backward takes one sum of `g · centered` for
        // both the weight's and the variance's gradient instead of one each over the input.
        let scale = match weight {
            Some(w) => inv.try_mul(&per_channel(w)?)?,
            None => inv,
        };
        let mut y = centered.try_mul(&scale)?;
        if let Some(b) = bias {
            y = y.try_add(&per_channel(b)?)?;
        }
        return Ok(y);
    } else {
        let (Some(rm), Some(rv)) = (running_mean, running_var) else {
            return Err(Error::value(
                OP,
                "evaluation mode normalizes with the running statistics, and none were given; pass running_mean and running_var, or set training",
            ));
        };
        let inv = (per_channel(rv)? + eps).sqrt().reciprocal();
        let scale = match weight {
            Some(w) => inv.try_mul(&per_channel(w)?)?,
            None => inv,
        };
        let shift = per_channel(rm)?.try_mul(&scale)?.try_neg()?;
        let shift = match bias {
            Some(b) => shift.try_add(&per_channel(b)?)?,
            None => shift,
        };
        (scale, shift)
    };
    input.try_mul(&scale)?.try_add(&shift)
}

/// `running += momentum·(factor·batch - running)`, in place and outside autograd; the
/// momentum is `cumulative` when given.
#[track_caller]
fn update_running(
    running: &Tensor,
    batch: &Tensor,
    momentum: f64,
    cumulative: Option<&Tensor>,
    factor: f64,
) -> Result<()> {
    crate::no_grad(|| {
        let batch = batch.detach().try_reshape(&[-1])?.to_dtype(running.dtype());
        let delta = batch.try_mul(factor)?.try_sub(running)?;
        let step = match cumulative {
            Some(m) => delta.try_mul(m.to_dtype(running.dtype()))?,
            None => delta.try_mul(momentum)?,
        };
        let new = running.try_add(&step)?;
        running.try_copy_(&new)?;
        crate::engine::realize::ride_along(running.storage());
        Ok(())
    })
}

/// Batch normalization as a layer (PyTorch's `nn.BatchNorm1d` for `D = 1`, `nn.BatchNorm2d`
/// for `D = 2`): a learned per-channel scale (ones) and shift (zeros), and the running mean
/// (zeros), variance (ones) and batch count as buffers. Use the aliases [`BatchNorm1d`] and
/// [`BatchNorm2d`].
///
/// ```
/// use kiln::nn::{BatchNorm2d, Module, Parameters};
/// use kiln::prelude::*;
///
/// let mut bn = BatchNorm2d::new(3);
/// let x = Tensor::randn([8, 3, 5, 5]) * 2.0 + 1.0;
/// let y = bn.forward(&x);                       // training: batch statistics
/// assert!(y.mean().item::<f32>().abs() < 1e-5);
/// assert_eq!(bn.num_batches_tracked.item::<i64>(), 1);
/// let names: Vec<String> = bn.named_buffers().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["running_mean", "running_var", "num_batches_tracked"]);
/// bn.eval();                                    // evaluation: running statistics
/// let _ = bn.forward(&x);
/// assert_eq!(bn.num_batches_tracked.item::<i64>(), 1);
/// ```
#[derive(Clone, Debug)]
pub struct BatchNorm<const D: usize> {
    /// The channel count `C`.
    pub num_features: usize,
    /// Added to the variance (1e-5 by default).
    pub eps: f64,
    /// The running statistics' update weight (0.1); `None` for a cumulative average over
    /// every batch seen, as PyTorch's `momentum=None`.
    pub momentum: Option<f64>,
    /// The learned scale `[C]` (absent without `affine`).
    pub weight: Option<Tensor>,
    /// The learned shift `[C]` (absent without `affine`).
    pub bias: Option<Tensor>,
    /// The running mean `[C]`, a buffer.
    pub running_mean: Tensor,
    /// The running (unbiased) variance `[C]`, a buffer.
    pub running_var: Tensor,
    /// How many training batches updated the running statistics, an `i64` scalar buffer.
    pub num_batches_tracked: Tensor,
    /// Training mode (the default): normalize with batch statistics and update the running
    /// ones.
    pub training: bool,
}

/// [`BatchNorm`] over `[N, C]` or `[N, C, L]` inputs.
pub type BatchNorm1d = BatchNorm<1>;
/// [`BatchNorm`] over `[N, C, H, W]` inputs.
pub type BatchNorm2d = BatchNorm<2>;

impl<const D: usize> BatchNorm<D> {
    /// A layer over `num_features` channels with PyTorch's defaults: `eps = 1e-5`,
    /// `momentum = 0.1`, a learned scale and shift, in training mode.
    ///
    /// # Panics
    /// As [`BatchNorm::try_with_options`] fails.
    #[must_use]
    #[track_caller]
    pub fn new(num_features: usize) -> BatchNorm<D> {
        ok(BatchNorm::try_with_options(num_features, 1e-5, Some(0.1), true))
    }

    /// A layer with chosen `eps`, `momentum` (`None`: cumulative average) and `affine`.
    ///
    /// # Panics
    /// As [`BatchNorm::try_with_options`] fails.
    #[must_use]
    #[track_caller]
    pub fn with_options(
        num_features: usize,
        eps: f64,
        momentum: Option<f64>,
        affine: bool,
    ) -> BatchNorm<D> {
        ok(BatchNorm::try_with_options(num_features, eps, momentum, affine))
    }

    /// [`BatchNorm::with_options`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Value`] for a negative or NaN `eps`, or a momentum outside `[0, 1]`.
    #[track_caller]
    pub fn try_with_options(
        num_features: usize,
        eps: f64,
        momentum: Option<f64>,
        affine: bool,
    ) -> Result<BatchNorm<D>> {
        let op = Self::NAME;
        if eps.is_nan() || eps < 0.0 {
            return Err(Error::value(op, format!("eps must be >= 0, got {eps}")));
        }
        if let Some(m) = momentum
            && !(0.0..=1.0).contains(&m)
        {
            return Err(Error::value(op, format!("momentum must be in [0, 1], got {m}")));
        }
        let filled = |value: f64, dtype: DType| -> Result<Tensor> {
            let t = Tensor::try_full_dtype([num_features], value, dtype)?;
            t.try_realize()?;
            Ok(t)
        };
        let (weight, bias) = if affine {
            (
                Some(filled(1.0, DType::F32)?.requires_grad_(true)),
                Some(filled(0.0, DType::F32)?.requires_grad_(true)),
            )
        } else {
            (None, None)
        };
        let num_batches_tracked = Tensor::try_full_dtype(Vec::<usize>::new(), 0.0, DType::I64)?;
        num_batches_tracked.try_realize()?;
        Ok(BatchNorm {
            num_features,
            eps,
            momentum,
            weight,
            bias,
            running_mean: filled(0.0, DType::F32)?,
            running_var: filled(1.0, DType::F32)?,
            num_batches_tracked,
            training: true,
        })
    }

    const NAME: &'static str = if D == 1 { "BatchNorm1d" } else { "BatchNorm2d" };

    /// Resets the running statistics to zeros, ones and a count of 0.
    ///
    /// # Errors
    /// [`Error::Runtime`] when the buffers cannot be written.
    pub fn reset_running_stats(&self) -> Result<()> {
        crate::no_grad(|| {
            self.running_mean.try_fill_(0.0)?;
            self.running_var.try_fill_(1.0)?;
            self.num_batches_tracked.try_fill_(0)?;
            Tensor::try_realize_all(&[
                &self.running_mean,
                &self.running_var,
                &self.num_batches_tracked,
            ])
        })
    }
}

impl<const D: usize> Parameters for BatchNorm<D> {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        self.weight.visit(&super::join(prefix, "weight"), f);
        self.bias.visit(&super::join(prefix, "bias"), f);
    }

    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
        self.weight.visit_mut(&super::join(prefix, "weight"), f);
        self.bias.visit_mut(&super::join(prefix, "bias"), f);
    }

    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        f(&super::join(prefix, "running_mean"), &self.running_mean);
        f(&super::join(prefix, "running_var"), &self.running_var);
        f(&super::join(prefix, "num_batches_tracked"), &self.num_batches_tracked);
    }

    fn visit_buffers_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
        f(&super::join(prefix, "running_mean"), &mut self.running_mean);
        f(&super::join(prefix, "running_var"), &mut self.running_var);
        f(&super::join(prefix, "num_batches_tracked"), &mut self.num_batches_tracked);
    }

    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}

impl<const D: usize> Module for BatchNorm<D> {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        let ok_rank = if D == 1 { matches!(input.ndim(), 2 | 3) } else { input.ndim() == D + 2 };
        if !ok_rank {
            let want = if D == 1 { "[N, C] or [N, C, L]" } else { "[N, C, H, W]" };
            return Err(Error::shape(
                Self::NAME,
                format!("expects an input of shape {want}, got {}", input.shape()),
            ));
        }
        if input.dims()[1] != self.num_features {
            return Err(Error::shape(
                Self::NAME,
                format!(
                    "the layer has {} channels, the input of shape {} has {} (dimension 1)",
                    self.num_features,
                    input.shape(),
                    input.dims()[1]
                ),
            ));
        }
        if self.training {
            crate::no_grad(|| self.num_batches_tracked.try_add_(1))?;
            crate::engine::realize::ride_along(self.num_batches_tracked.storage());
        }
        let cumulative = self.momentum.is_none() && self.training;
        normalize(
            input,
            Some(&self.running_mean),
            Some(&self.running_var),
            self.weight.as_ref(),
            self.bias.as_ref(),
            BatchNormOptions {
                training: self.training,
                momentum: self.momentum.unwrap_or(0.0),
                eps: self.eps,
            },
            cumulative.then_some(&self.num_batches_tracked),
        )
    }
}
