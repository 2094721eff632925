//! Parameter initialization in place, PyTorch's `torch.nn.init`: each function overwrites
//! a tensor (a parameter, typically) under `no_grad` with values drawn from the thread's
//! generator ([`crate::manual_seed`]), on the tensor's device and in its dtype.
//!
//! ```
//! use kiln::nn::{Linear, init};
//! use kiln::prelude::*;
//!
//! kiln::manual_seed(0);
//! let layer = Linear::new(256, 128);
//! init::kaiming_normal_(&layer.weight, 0.0, init::FanMode::FanIn, init::Nonlinearity::ReLU).unwrap();
//! init::zeros_(layer.bias.as_ref().unwrap()).unwrap();
//! let std = layer.weight.std().item::<f32>();
//! assert!((std - (2.0f32 / 256.0).sqrt()).abs() < 0.005);
//! ```

use crate::{Error, Result, Tensor};

/// The activation a layer feeds, for [`calculate_gain`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Nonlinearity {
    /// No activation (also convolutions and sigmoids): gain 1.
    Linear,
    /// Gain 1.
    Sigmoid,
    /// Gain 5/3.
    Tanh,
    /// Gain √2.
    ReLU,
    /// Gain `√(2 / (1 + slope²))`.
    LeakyReLU(f64),
    /// Gain 3/4.
    SELU,
}

/// Which fan [`kaiming_uniform_`] and [`kaiming_normal_`] preserve the variance of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FanMode {
    /// The forward pass (PyTorch's default).
    FanIn,
    /// The backward pass.
    FanOut,
}

/// PyTorch's `calculate_gain`: the factor that keeps activations' variance through the
/// nonlinearity.
pub fn calculate_gain(nonlinearity: Nonlinearity) -> f64 {
    match nonlinearity {
        Nonlinearity::Linear | Nonlinearity::Sigmoid => 1.0,
        Nonlinearity::Tanh => 5.0 / 3.0,
        Nonlinearity::ReLU => 2f64.sqrt(),
        Nonlinearity::LeakyReLU(slope) => (2.0 / (1.0 + slope * slope)).sqrt(),
        Nonlinearity::SELU => 0.75,
    }
}

/// `(fan_in, fan_out)` of a weight: `[out, in, k...]` gives `in·∏k` and `out·∏k`, as PyTorch.
///
/// # Errors
/// [`Error::Shape`] for a tensor with fewer than 2 dimensions.
pub fn fans(t: &Tensor) -> Result<(usize, usize)> {
    let d = t.dims();
    if d.len() < 2 {
        return Err(Error::shape(
            "init",
            format!("fans need a tensor with at least 2 dimensions, got shape {}", t.shape()),
        ));
    }
    let receptive: usize = d[2..].iter().product();
    Ok((d[1] * receptive, d[0] * receptive))
}

/// Overwrites `t` with `values` (converted and moved to `t`'s dtype and device), realized.
fn fill_with(t: &Tensor, values: Tensor) -> Result<()> {
    crate::no_grad(|| {
        let values = values.to_dtype(t.dtype()).try_to(t.device())?;
        t.try_copy_(&values)?;
        t.try_realize()
    })
}

fn check_float(op: &'static str, t: &Tensor) -> Result<()> {
    if t.dtype().is_float() {
        Ok(())
    } else {
        Err(Error::dtype(op, format!("initializes floating-point tensors, got {}", t.dtype())))
    }
}

/// Uniform values in `[low, high)`.
///
/// # Errors
/// [`Error::Value`] when `low > high` or a bound is not finite; [`Error::DType`] for a
/// non-float tensor.
pub fn uniform_(t: &Tensor, low: f64, high: f64) -> Result<()> {
    check_float("uniform_", t)?;
    if !(low.is_finite() && high.is_finite() && low <= high) {
        return Err(Error::value(
            "uniform_",
            format!("needs finite low <= high, got [{low}, {high})"),
        ));
    }
    fill_with(
        t,
        Tensor::try_rand(t.shape().clone())?.to_dtype(crate::DType::F64) * (high - low) + low,
    )
}

/// Normal values with mean `mean` and standard deviation `std`.
///
/// # Errors
/// [`Error::Value`] for a negative or non-finite `std`; [`Error::DType`] for a non-float
/// tensor.
pub fn normal_(t: &Tensor, mean: f64, std: f64) -> Result<()> {
    check_float("normal_", t)?;
    if !(std.is_finite() && std >= 0.0 && mean.is_finite()) {
        return Err(Error::value(
            "normal_",
            format!("needs a finite mean and std >= 0, got {mean}, {std}"),
        ));
    }
    fill_with(t, Tensor::try_randn(t.shape().clone())?.to_dtype(crate::DType::F64) * std + mean)
}

/// Normal values with mean `mean` and standard deviation `std`, redrawn until every value
/// lies in `[low, high]` (PyTorch's `trunc_normal_`; the bounds are absolute values, not in
/// units of `std`). It reads how many values are out of range, so it cannot run inside
/// [`crate::compile()`].
///
/// # Errors
/// [`Error::Value`] when `low >= high`, `std` is not positive, or the interval is so far
/// in the tail that 100 redraws do not fill it; [`Error::DType`] for a non-float tensor.
pub fn trunc_normal_(t: &Tensor, mean: f64, std: f64, low: f64, high: f64) -> Result<()> {
    const OP: &str = "trunc_normal_";
    check_float(OP, t)?;
    if !(std > 0.0 && std.is_finite() && low < high) {
        return Err(Error::value(
            OP,
            format!("needs std > 0 and low < high, got std {std}, [{low}, {high}]"),
        ));
    }
    let draw = || -> Result<Tensor> {
        Ok(Tensor::try_randn(t.shape().clone())?.to_dtype(crate::DType::F64) * std + mean)
    };
    let mut values = draw()?;
    for _ in 0..100 {
        let outside = values.lt(low).logical_or(values.gt(high));
        if outside.any().try_item::<bool>()? {
            values = Tensor::where_(&outside, &draw()?, &values);
            values.try_realize()?;
        } else {
            return fill_with(t, values);
        }
    }
    Err(Error::value(OP, format!("[{low}, {high}] is too far in the tail of N({mean}, {std}²)")))
}

/// Every element `value`.
///
/// # Errors
/// [`Error::Runtime`] when the write fails.
pub fn constant_(t: &Tensor, value: f64) -> Result<()> {
    crate::no_grad(|| {
        t.try_fill_(value)?;
        t.try_realize()
    })
}

/// Every element 0.
///
/// # Errors
/// As [`constant_`].
pub fn zeros_(t: &Tensor) -> Result<()> {
    constant_(t, 0.0)
}

/// Every element 1.
///
/// # Errors
/// As [`constant_`].
pub fn ones_(t: &Tensor) -> Result<()> {
    constant_(t, 1.0)
}

/// Glorot uniform: `U(-b, b)` with `b = gain·√(6 / (fan_in + fan_out))`.
///
/// # Errors
/// As [`fans`] and [`uniform_`].
pub fn xavier_uniform_(t: &Tensor, gain: f64) -> Result<()> {
    let (fan_in, fan_out) = fans(t)?;
    let bound = gain * (6.0 / (fan_in + fan_out).max(1) as f64).sqrt();
    uniform_(t, -bound, bound)
}

/// Glorot normal: `N(0, std²)` with `std = gain·√(2 / (fan_in + fan_out))`.
///
/// # Errors
/// As [`fans`] and [`normal_`].
pub fn xavier_normal_(t: &Tensor, gain: f64) -> Result<()> {
    let (fan_in, fan_out) = fans(t)?;
    normal_(t, 0.0, gain * (2.0 / (fan_in + fan_out).max(1) as f64).sqrt())
}

/// The standard deviation of He initialization.
fn kaiming_std(t: &Tensor, a: f64, mode: FanMode, nonlinearity: Nonlinearity) -> Result<f64> {
    let (fan_in, fan_out) = fans(t)?;
    let fan = match mode {
        FanMode::FanIn => fan_in,
        FanMode::FanOut => fan_out,
    };
    let nonlinearity = match nonlinearity {
        Nonlinearity::LeakyReLU(_) => Nonlinearity::LeakyReLU(a),
        other => other,
    };
    Ok(calculate_gain(nonlinearity) / (fan.max(1) as f64).sqrt())
}

/// He uniform: `U(-b, b)` with `b = √3·gain / √fan` (PyTorch's defaults: `a = 0`,
/// `FanIn`, `LeakyReLU`; `a` is the leaky slope and only used with `LeakyReLU`).
///
/// # Errors
/// As [`fans`] and [`uniform_`].
pub fn kaiming_uniform_(
    t: &Tensor,
    a: f64,
    mode: FanMode,
    nonlinearity: Nonlinearity,
) -> Result<()> {
    let bound = 3f64.sqrt() * kaiming_std(t, a, mode, nonlinearity)?;
    uniform_(t, -bound, bound)
}

/// He normal: `N(0, std²)` with `std = gain / √fan`.
///
/// # Errors
/// As [`fans`] and [`normal_`].
pub fn kaiming_normal_(
    t: &Tensor,
    a: f64,
    mode: FanMode,
    nonlinearity: Nonlinearity,
) -> Result<()> {
    normal_(t, 0.0, kaiming_std(t, a, mode, nonlinearity)?)
}
