//! Running reductions that are not sums: `logcumsumexp`, `cummax` and `cummin`, as
//! [`Opaque`] ops over the rows of the last dimension (another dimension is moved last as a
//! strided view, not copied). Each CPU function scans a row in order; on a GPU they run on
//! host copies, a `Host` step in profiles.

use std::sync::LazyLock;

use kiln_ir::{DType, Element};

use super::{CpuInput, CpuOutput, Opaque, Split};
use crate::error::{Result, ok};
use crate::tensor::Tensor;

/// Calls `f` with each row of the output chunk (whole rows: [`Split::Rows`]) and the
/// matching row of `x` (same shape as the output), read through its strides.
fn each_row<T: Element, O: Element>(
    x: &CpuInput<'_>,
    out: &mut CpuOutput<'_>,
    mut f: impl FnMut(&[T], &mut [O]),
) -> std::result::Result<(), String> {
    let len = out.shape().last().copied().unwrap_or(1).max(1);
    let start = out.start();
    let data = x.data::<T>()?;
    let mut row = Vec::with_capacity(len);
    for (k, chunk) in out.values::<O>()?.chunks_mut(len).enumerate() {
        let first = start + k * len;
        row.clear();
        row.extend((0..chunk.len()).map(|j| data[x.position_of(first + j)]));
        f(&row, chunk);
    }
    Ok(())
}

/// `ln(e^a + e^b)` in f64: equal infinities are their own sum, NaN spreads.
fn logaddexp(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        return f64::NAN;
    }
    let (hi, lo) = if a > b { (a, b) } else { (b, a) };
    if lo == f64::NEG_INFINITY || hi == lo && hi.is_infinite() {
        return hi;
    }
    hi + (lo - hi).exp().ln_1p()
}

fn logcumsumexp_cpu<T: Element + Into<f64>>(
    inputs: &[CpuInput<'_>],
    out: &mut CpuOutput<'_>,
) -> std::result::Result<(), String> {
    each_row::<T, T>(&inputs[0], out, |row, values| {
        let mut acc = f64::NEG_INFINITY;
        for (v, &x) in values.iter_mut().zip(row) {
            acc = logaddexp(acc, x.into());
            *v = T::from_scalar(acc.into());
        }
    })
}

static LOGCUMSUMEXP: LazyLock<Opaque> = LazyLock::new(|| {
    Opaque::builder("logcumsumexp", 1, |inputs, out| match out.dtype() {
        DType::F32 => logcumsumexp_cpu::<f32>(inputs, out),
        DType::F64 => logcumsumexp_cpu::<f64>(inputs, out),
        d => Err(format!("computes in f32 or f64, not {d}")),
    })
    .split(Split::Rows)
    .host_on_gpu()
    .backward(|saved, grad| {
        // PyTorch's rule: Σ_{j ≥ i} g_j e^(x_i - y_j), the positive and negative parts of g
        // each summed in log space (by this op, reversed), so nothing overflows.
        let (x, y) = (&saved.inputs()[0], saved.output());
        let lowest = if x.dtype() == DType::F64 { f64::MIN } else { f64::from(f32::MIN) };
        let log_abs = grad.abs().log();
        let reversed = |t: &Tensor| t.flip(&[-1]).logcumsumexp(-1).flip(&[-1]);
        let part = |mask: Tensor| {
            let log_g = Tensor::where_(&mask, &log_abs, lowest);
            (reversed(&(log_g - y)) + x).exp()
        };
        Ok(vec![Some(part(grad.gt(0.0)) - part(grad.lt(0.0)))])
    })
    .build()
});

/// Which running extreme a scan keeps.
#[derive(Clone, Copy)]
enum Extreme {
    Max,
    Min,
}

/// The index of the running extreme, as PyTorch's: a tie moves to the later element, and a
/// NaN is the extreme from there on (each later NaN taking its place).
fn extreme_cpu<T: Element + PartialOrd>(
    inputs: &[CpuInput<'_>],
    out: &mut CpuOutput<'_>,
    which: Extreme,
) -> std::result::Result<(), String> {
    #[allow(clippy::eq_op)] // x != x: the NaN test for every element type
    let nan = |x: T| x != x;
    each_row::<T, i64>(&inputs[0], out, |row, indices| {
        let mut best = 0usize;
        for (i, (&x, at)) in row.iter().zip(indices.iter_mut()).enumerate() {
            let b = row[best];
            let wins = match which {
                Extreme::Max => x >= b,
                Extreme::Min => x <= b,
            };
            if nan(x) || (!nan(b) && wins) {
                best = i;
            }
            *at = best as i64;
        }
    })
}

fn extreme_op(name: &'static str, which: Extreme) -> Opaque {
    Opaque::builder(name, 1, move |inputs, out| {
        let x = &inputs[0];
        match x.dtype() {
            DType::F32 => extreme_cpu::<f32>(inputs, out, which),
            DType::F64 => extreme_cpu::<f64>(inputs, out, which),
            DType::F16 => extreme_cpu::<half::f16>(inputs, out, which),
            DType::BF16 => extreme_cpu::<half::bf16>(inputs, out, which),
            DType::I64 => extreme_cpu::<i64>(inputs, out, which),
            DType::I32 => extreme_cpu::<i32>(inputs, out, which),
            DType::I8 => extreme_cpu::<i8>(inputs, out, which),
            DType::U8 => extreme_cpu::<u8>(inputs, out, which),
            DType::Bool => extreme_cpu::<bool>(inputs, out, which),
        }
    })
    .shape(|inputs| Ok((inputs[0].0.clone(), DType::I64)))
    .split(Split::Rows)
    .host_on_gpu()
    .build()
}

static CUMMAX: LazyLock<Opaque> = LazyLock::new(|| extreme_op("cummax", Extreme::Max));
static CUMMIN: LazyLock<Opaque> = LazyLock::new(|| extreme_op("cummin", Extreme::Min));

impl Tensor {
    /// `ln Σ_{j ≤ i} e^(x_j)` along `dim` (PyTorch's `logcumsumexp`), accumulated in f64 in
    /// log space, so a row spanning any range of magnitudes keeps its digits; integers are
    /// computed as `f32`, 16-bit floats in f32 and rounded back. Its gradient is PyTorch's,
    /// itself made of `logcumsumexp` (so it differentiates again).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![-1000.0f64, 0.0, 0.0], [3]);
    /// let y = x.logcumsumexp(0).to_vec::<f64>();
    /// assert_eq!(y[0], -1000.0);
    /// assert!((y[2] - 2f64.ln()).abs() < 1e-15);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_logcumsumexp`] fails.
    #[must_use]
    #[track_caller]
    pub fn logcumsumexp(&self, dim: i64) -> Tensor {
        ok(self.try_logcumsumexp(dim))
    }

    /// [`Tensor::logcumsumexp`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`crate::Error::Index`] when `dim` is out of range.
    #[track_caller]
    pub fn try_logcumsumexp(&self, dim: i64) -> Result<Tensor> {
        let dtype = self.dtype();
        let x = match dtype {
            DType::F32 | DType::F64 => self.clone(),
            _ => self.float(),
        };
        let y = along_last("logcumsumexp", &x, dim, |x| LOGCUMSUMEXP.try_call(&[x]))?;
        Ok(if dtype.is_float() { y.to_dtype(dtype) } else { y })
    }

    /// The running maximum along `dim` and where it was found (PyTorch's `cummax`): a tie
    /// takes the later index, and a NaN, once seen, is the maximum. The values are
    /// differentiable (the gradient goes to the index that holds each).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let (values, indices) = Tensor::from_vec(vec![1i64, 3, 3, 2], [4]).cummax(0);
    /// assert_eq!(values.to_vec::<i64>(), [1, 3, 3, 3]);
    /// assert_eq!(indices.to_vec::<i64>(), [0, 1, 2, 2]);
    /// ```
    ///
    /// # Panics
    /// When `dim` is out of range; [`Tensor::try_cummax`] returns the error.
    #[must_use]
    #[track_caller]
    pub fn cummax(&self, dim: i64) -> (Tensor, Tensor) {
        ok(self.try_cummax(dim))
    }

    /// [`Tensor::cummax`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`crate::Error::Index`] when `dim` is out of range.
    #[track_caller]
    pub fn try_cummax(&self, dim: i64) -> Result<(Tensor, Tensor)> {
        self.running_extreme(dim, &CUMMAX)
    }

    /// The running minimum along `dim` and where it was found (PyTorch's `cummin`), as
    /// [`Tensor::cummax`].
    ///
    /// # Panics
    /// When `dim` is out of range; [`Tensor::try_cummin`] returns the error.
    #[must_use]
    #[track_caller]
    pub fn cummin(&self, dim: i64) -> (Tensor, Tensor) {
        ok(self.try_cummin(dim))
    }

    /// [`Tensor::cummin`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`crate::Error::Index`] when `dim` is out of range.
    #[track_caller]
    pub fn try_cummin(&self, dim: i64) -> Result<(Tensor, Tensor)> {
        self.running_extreme(dim, &CUMMIN)
    }

    #[track_caller]
    fn running_extreme(&self, dim: i64, op: &'static LazyLock<Opaque>) -> Result<(Tensor, Tensor)> {
        let indices = along_last(op.name(), self, dim, |x| op.try_call(&[x]))?;
        let dim = if self.ndim() == 0 { 0 } else { dim };
        let values = if self.ndim() == 0 { self.clone() } else { self.try_gather(dim, &indices)? };
        Ok((values, indices))
    }
}

/// `f` applied with dimension `dim` of `x` moved last (a view), its result moved back; a
/// scalar is a row of one.
#[track_caller]
pub(crate) fn along_last(
    op: &'static str,
    x: &Tensor,
    dim: i64,
    f: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    if x.ndim() == 0 {
        kiln_ir::normalize_axis(op, dim, 1)?;
        return f(&x.try_reshape(&[1])?)?.try_reshape(&[] as &[i64]);
    }
    let last = x.ndim() as i64 - 1;
    let moved = x.try_movedim(dim, last)?;
    let dim = kiln_ir::normalize_axis(op, dim, x.ndim())? as i64;
    f(&moved)?.try_movedim(last, dim)
}
