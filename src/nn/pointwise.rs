//! The rest of PyTorch's pointwise activations, as `functional` functions and as modules:
//! `relu6`, `hardtanh`, `hardsigmoid`, `hardswish`, `mish`, `selu`, `celu`, `logsigmoid`,
//! `softsign`, `softshrink`, `hardshrink`, `tanhshrink`, `threshold`, `glu`, `softmin`,
//! `prelu`, and `linear`. Each is a composition of elementwise ops (so it fuses with its
//! neighbours and differentiates), written in the form that stays finite where the naive one
//! overflows (`logsigmoid`, `mish`), with PyTorch's gradient at the kinks of the clamps
//! (zero on the flat side, boundaries included).

use super::{Module, Parameters};
use crate::error::ok;
use crate::{Error, Result, Tensor};

/// SELU's `α` and `λ` (Klambauer et al., as PyTorch's constants).
const SELU_ALPHA: f64 = 1.673_263_242_354_377_3;
const SELU_SCALE: f64 = 1.050_700_987_355_480_5;

/// `x` clamped to `[min, max]`, with a zero gradient at and beyond both ends (PyTorch's
/// `hardtanh`; defaults -1 and 1).
///
/// ```
/// use kiln::nn::functional as F;
/// use kiln::prelude::*;
/// let x = Tensor::from_vec(vec![-3.0f32, 0.5, 8.0], [3]);
/// assert_eq!(F::hardtanh(&x, -1.0, 1.0).to_vec::<f32>(), [-1.0, 0.5, 1.0]);
/// assert_eq!(F::relu6(&x).to_vec::<f32>(), [0.0, 0.5, 6.0]);
/// ```
#[track_caller]
#[must_use]
pub fn hardtanh(input: &Tensor, min: f64, max: f64) -> Tensor {
    let x = input;
    Tensor::where_(&x.le(min), min, Tensor::where_(&x.ge(max), max, x))
}

/// `min(max(x, 0), 6)` (PyTorch's `relu6`).
#[track_caller]
#[must_use]
pub fn relu6(input: &Tensor) -> Tensor {
    hardtanh(input, 0.0, 6.0)
}

/// `relu6(x + 3) / 6` (PyTorch's `hardsigmoid`).
#[track_caller]
#[must_use]
pub fn hardsigmoid(input: &Tensor) -> Tensor {
    relu6(&(input + 3.0)) / 6.0
}

/// `x · relu6(x + 3) / 6` (PyTorch's `hardswish`, MobileNetV3's activation).
#[track_caller]
#[must_use]
pub fn hardswish(input: &Tensor) -> Tensor {
    input * hardsigmoid(input)
}

/// `ln(1 + e^x)` written as `max(x, 0) + ln(1 + e^-|x|)`, finite for every `x`.
fn stable_softplus(x: &Tensor) -> Tensor {
    x.relu() + (-x.abs()).exp().log1p()
}

/// `x · tanh(softplus(x))` (PyTorch's `mish`).
#[track_caller]
#[must_use]
pub fn mish(input: &Tensor) -> Tensor {
    input * stable_softplus(input).tanh()
}

/// `λ (max(0, x) + min(0, α (e^x - 1)))` with PyTorch's `α` and `λ` (`selu`).
#[track_caller]
#[must_use]
pub fn selu(input: &Tensor) -> Tensor {
    celu_scaled(input, SELU_ALPHA, 1.0) * SELU_SCALE
}

/// `max(0, x) + min(0, α (e^(x/α) - 1))` (PyTorch's `celu`; default `α = 1`).
///
/// # Panics
/// As [`try_celu`] fails.
#[track_caller]
#[must_use]
pub fn celu(input: &Tensor, alpha: f64) -> Tensor {
    ok(try_celu(input, alpha))
}

/// [`celu`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Value`] for `alpha = 0` (it divides `x`; PyTorch refuses it too).
#[track_caller]
pub fn try_celu(input: &Tensor, alpha: f64) -> Result<Tensor> {
    if alpha == 0.0 {
        return Err(Error::value("celu", "alpha must not be 0 (x is divided by it)"));
    }
    Ok(celu_scaled(input, alpha, 1.0 / alpha))
}

/// `max(0, x) + min(0, α (e^(s·x) - 1))`: `expm1` of the negative side only, so a large
/// positive `x` never overflows an exponential the `where` then discards.
fn celu_scaled(x: &Tensor, alpha: f64, s: f64) -> Tensor {
    let negative = (x.clamp_max(0.0) * s).expm1() * alpha;
    Tensor::where_(&x.gt(0.0), x, &negative)
}

/// `min(x, 0) - ln(1 + e^-|x|)`, the logarithm of the sigmoid without overflow (PyTorch's
/// `logsigmoid`).
#[track_caller]
#[must_use]
pub fn logsigmoid(input: &Tensor) -> Tensor {
    input.clamp_max(0.0) - (-input.abs()).exp().log1p()
}

/// `x / (1 + |x|)` (PyTorch's `softsign`).
#[track_caller]
#[must_use]
pub fn softsign(input: &Tensor) -> Tensor {
    input / (input.abs() + 1.0)
}

/// `x - λ` above `λ`, `x + λ` below `-λ`, 0 between (PyTorch's `softshrink`; default 0.5).
#[track_caller]
#[must_use]
pub fn softshrink(input: &Tensor, lambda: f64) -> Tensor {
    let x = input;
    let inner = Tensor::where_(&x.lt(-lambda), x + lambda, x.zeros_like());
    Tensor::where_(&x.gt(lambda), x - lambda, &inner)
}

/// `x` where `|x| > λ`, 0 elsewhere (PyTorch's `hardshrink`; default 0.5).
#[track_caller]
#[must_use]
pub fn hardshrink(input: &Tensor, lambda: f64) -> Tensor {
    Tensor::where_(&input.abs().gt(lambda), input, input.zeros_like())
}

/// `x - tanh(x)` (PyTorch's `tanhshrink`).
#[track_caller]
#[must_use]
pub fn tanhshrink(input: &Tensor) -> Tensor {
    input - input.tanh()
}

/// `x` where `x > threshold`, `value` elsewhere (PyTorch's `threshold`).
#[track_caller]
#[must_use]
pub fn threshold(input: &Tensor, threshold: f64, value: f64) -> Tensor {
    Tensor::where_(&input.gt(threshold), input, value)
}

/// `softmax(-x)` along `dim` (PyTorch's `softmin`).
#[track_caller]
#[must_use]
pub fn softmin(input: &Tensor, dim: i64) -> Tensor {
    (-input).softmax(dim)
}

/// The gated linear unit (PyTorch's `glu`): the first half of `dim` times the sigmoid of the
/// second.
///
/// # Panics
/// As [`try_glu`] fails.
#[track_caller]
#[must_use]
pub fn glu(input: &Tensor, dim: i64) -> Tensor {
    ok(try_glu(input, dim))
}

/// [`glu`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when `dim`'s size is odd, [`Error::Index`] when it is out of range.
#[track_caller]
pub fn try_glu(input: &Tensor, dim: i64) -> Result<Tensor> {
    let d = kiln_ir::normalize_axis("glu", dim, input.ndim())?;
    let size = input.dims()[d];
    if !size.is_multiple_of(2) {
        return Err(Error::shape(
            "glu",
            format!("halves dimension {d}, which has odd size {size} (shape {})", input.shape()),
        ));
    }
    let (a, b) = (input.try_narrow(dim, 0, size / 2)?, input.try_narrow(dim, size / 2, size / 2)?);
    a.try_mul(b.sigmoid())
}

/// `x` where non-negative, `w·x` elsewhere, `w` one value or one per channel (dimension 1)
/// (PyTorch's `prelu`).
///
/// # Panics
/// As [`try_prelu`] fails.
#[track_caller]
#[must_use]
pub fn prelu(input: &Tensor, weight: &Tensor) -> Tensor {
    ok(try_prelu(input, weight))
}

/// [`prelu`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] for a weight that is neither one value nor one per channel.
#[track_caller]
pub fn try_prelu(input: &Tensor, weight: &Tensor) -> Result<Tensor> {
    let channels = if input.ndim() >= 2 { input.dims()[1] } else { 1 };
    let n = weight.numel();
    if weight.ndim() > 1 || (n != 1 && n != channels) {
        return Err(Error::shape(
            "prelu",
            format!(
                "takes one weight or one per channel ({channels} for input {}), got {}",
                input.shape(),
                weight.shape()
            ),
        ));
    }
    let w = if n == 1 || input.ndim() < 2 {
        weight.try_reshape(&[] as &[i64])?
    } else {
        let mut dims = vec![1i64; input.ndim()];
        dims[1] = n as i64;
        weight.try_reshape(&dims)?
    };
    Tensor::try_where_(&input.ge(0.0), input, input.try_mul(&w)?)
}

/// `x Wᵀ + b` (PyTorch's `F.linear`): `weight` `[out, in]`, `bias` `[out]`.
///
/// # Panics
/// As [`try_linear`] fails.
#[track_caller]
#[must_use]
pub fn linear(input: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Tensor {
    ok(try_linear(input, weight, bias))
}

/// [`linear`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the input's last dimension is not the weight's.
#[track_caller]
pub fn try_linear(input: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
    let y = input.try_matmul(&weight.try_transpose(-2, -1)?)?;
    match bias {
        Some(b) => y.try_add(b),
        None => Ok(y),
    }
}

activation! {
    /// [`relu6`] (PyTorch's `nn.ReLU6`).
    ReLU6 => |x| Ok(relu6(x));
    /// [`hardsigmoid`] (PyTorch's `nn.Hardsigmoid`).
    Hardsigmoid => |x| Ok(hardsigmoid(x));
    /// [`hardswish`] (PyTorch's `nn.Hardswish`).
    Hardswish => |x| Ok(hardswish(x));
    /// [`mish`] (PyTorch's `nn.Mish`).
    Mish => |x| Ok(mish(x));
    /// [`selu`] (PyTorch's `nn.SELU`).
    SELU => |x| Ok(selu(x));
    /// [`logsigmoid`] (PyTorch's `nn.LogSigmoid`).
    LogSigmoid => |x| Ok(logsigmoid(x));
    /// [`softsign`] (PyTorch's `nn.Softsign`).
    Softsign => |x| Ok(softsign(x));
    /// [`tanhshrink`] (PyTorch's `nn.Tanhshrink`).
    Tanhshrink => |x| Ok(tanhshrink(x));
}

arguments! {
    /// [`hardtanh`] (PyTorch's `nn.Hardtanh`).
    Hardtanh { min_val: f64 = -1.0, max_val: f64 = 1.0 }

    /// [`celu`] (PyTorch's `nn.CELU`).
    CELU { alpha: f64 = 1.0 }

    /// [`softshrink`] (PyTorch's `nn.Softshrink`).
    Softshrink { lambd: f64 = 0.5 }

    /// [`hardshrink`] (PyTorch's `nn.Hardshrink`).
    Hardshrink { lambd: f64 = 0.5 }

    /// [`threshold`] (PyTorch's `nn.Threshold`).
    Threshold { threshold: f64 = 0.0, value: f64 = 0.0 }

    /// [`glu`] (PyTorch's `nn.GLU`; default `dim = -1`).
    GLU { dim: i64 = -1 }

    /// [`softmin`] (PyTorch's `nn.Softmin`; default `dim = -1`).
    Softmin { dim: i64 = -1 }

    /// Softmax along `dim` (PyTorch's `nn.Softmax`; default `dim = -1`).
    Softmax { dim: i64 = -1 }

    /// Log-softmax along `dim` (PyTorch's `nn.LogSoftmax`; default `dim = -1`).
    LogSoftmax { dim: i64 = -1 }
}

parameterized_activation! {
    Hardtanh => |s, x| hardtanh(x, s.min_val, s.max_val);
    CELU => |s, x| try_celu(x, s.alpha)?;
    Softshrink => |s, x| softshrink(x, s.lambd);
    Hardshrink => |s, x| hardshrink(x, s.lambd);
    Threshold => |s, x| threshold(x, s.threshold, s.value);
    GLU => |s, x| try_glu(x, s.dim)?;
    Softmin => |s, x| softmin(x, s.dim);
    Softmax => |s, x| x.softmax(s.dim);
    LogSoftmax => |s, x| x.log_softmax(s.dim);
}

/// [`prelu`] with a learned slope (PyTorch's `nn.PReLU`): `weight` holds `num_parameters`
/// slopes (1, or one per channel), 0.25 at first.
///
/// ```
/// use kiln::nn::{Module, PReLU};
/// use kiln::prelude::*;
/// let act = PReLU::new(1);
/// assert_eq!(act.forward(&Tensor::from_vec(vec![-4.0f32, 2.0], [2])).to_vec::<f32>(), [-1.0, 2.0]);
/// ```
#[derive(Clone, Debug)]
pub struct PReLU {
    /// `[num_parameters]`.
    pub weight: Tensor,
}

impl PReLU {
    /// `num_parameters` slopes of 0.25, in `f32`.
    #[must_use]
    pub fn new(num_parameters: usize) -> PReLU {
        PReLU { weight: Tensor::full([num_parameters], 0.25).requires_grad_(true) }
    }
}

crate::parameters!(PReLU { weight });

impl Module for PReLU {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        try_prelu(input, &self.weight)
    }
}
