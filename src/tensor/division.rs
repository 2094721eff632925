//! Division that rounds, and the remainders that go with it: PyTorch's `div` with a
//! `rounding_mode`, `floor_divide`, `fmod` and `remainder`, exact for floats (from C's `fmod`,
//! the [`BinaryOp::Rem`] primitive) and for integers.
//!
//! Integer division by zero gives 0 here (a fused kernel cannot stop to raise, as PyTorch's
//! CPU does; its CUDA leaves the value undefined).

use kiln_ir::{BinaryOp, DType};

use super::Tensor;
use super::arith::Operand;
use crate::Result;
use crate::error::ok;

/// How [`Tensor::div_rounding`] rounds the quotient (PyTorch's `rounding_mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rounding {
    /// Toward zero, as C's integer division (`"trunc"`).
    Trunc,
    /// Toward negative infinity, as Python's `//` (`"floor"`).
    Floor,
}

impl Tensor {
    /// `self / other` rounded as `mode` says, keeping an integer dtype (PyTorch's
    /// `torch.div(a, b, rounding_mode=...)`); the gradient is zero, as PyTorch's.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// use kiln::Rounding;
    /// let a = Tensor::from_vec(vec![7i64, -7, 7, -7], [4]);
    /// let b = Tensor::from_vec(vec![2i64, 2, -2, -2], [4]);
    /// assert_eq!(a.div_rounding(&b, Rounding::Trunc).to_vec::<i64>(), [3, -3, -3, 3]);
    /// assert_eq!(a.div_rounding(&b, Rounding::Floor).to_vec::<i64>(), [3, -4, -4, 3]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_div_rounding`] fails.
    #[must_use]
    #[track_caller]
    pub fn div_rounding<'a>(&self, other: impl Into<Operand<'a>>, mode: Rounding) -> Tensor {
        ok(self.try_div_rounding(other, mode))
    }

    /// [`Tensor::div_rounding`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`crate::Error::Shape`] when the shapes do not broadcast, [`crate::Error::DType`] for two
    /// bool operands.
    #[track_caller]
    pub fn try_div_rounding<'a>(
        &self,
        other: impl Into<Operand<'a>>,
        mode: Rounding,
    ) -> Result<Tensor> {
        let other = other.into();
        let dtype = self.common_dtype(&other);
        if dtype.is_float() {
            let (a, b) = self.pair(other, dtype, "div")?;
            return Ok(match mode {
                Rounding::Trunc => a.try_div(&b)?.trunc(),
                Rounding::Floor => floor_quotient(&a, &b)?,
            });
        }
        let (a, b) = self.pair(other, integer(dtype), "div")?;
        let q = a.binary_as(BinaryOp::Div, Operand::from(&b), false, a.dtype())?;
        if mode == Rounding::Trunc {
            return Ok(q);
        }
        // One less where the division was inexact and the signs differ.
        let r = a.binary_as(BinaryOp::Rem, Operand::from(&b), false, a.dtype())?;
        let down = r.ne(0).logical_and(r.lt(0).ne(b.lt(0)));
        q.try_sub(down.to_dtype(q.dtype()))
    }

    /// `self / other` rounded toward negative infinity (Python's `//`, PyTorch's
    /// `floor_divide`): [`Tensor::div_rounding`] with [`Rounding::Floor`].
    ///
    /// # Panics
    /// As [`Tensor::try_div_rounding`] fails.
    #[must_use]
    #[track_caller]
    pub fn floor_divide<'a>(&self, other: impl Into<Operand<'a>>) -> Tensor {
        ok(self.try_div_rounding(other, Rounding::Floor))
    }

    /// The remainder of [`Rounding::Trunc`] division, with `self`'s sign (C's `fmod`,
    /// PyTorch's `fmod`); exact for floats. Its gradient is PyTorch's: `1` for `self`,
    /// `-trunc(self / other)` for `other`.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let a = Tensor::from_vec(vec![-7.5f64, 7.5, 1e300], [3]);
    /// assert_eq!(a.fmod(2.0).to_vec::<f64>(), [-1.5, 1.5, 1e300 % 2.0]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_fmod`] fails.
    #[must_use]
    #[track_caller]
    pub fn fmod<'a>(&self, other: impl Into<Operand<'a>>) -> Tensor {
        ok(self.try_fmod(other))
    }

    /// [`Tensor::fmod`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`crate::Error::Shape`] when the shapes do not broadcast, [`crate::Error::DType`] for two
    /// bool operands.
    #[track_caller]
    pub fn try_fmod<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        self.binary(BinaryOp::Rem, other.into(), false)
    }

    /// The remainder of [`Rounding::Floor`] division, with `other`'s sign (Python's `%`,
    /// PyTorch's `remainder`): `self - floor(self / other) * other`, computed exactly from
    /// [`Tensor::fmod`].
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let a = Tensor::from_vec(vec![-7i64, 7, -7, 7], [4]);
    /// let b = Tensor::from_vec(vec![3i64, 3, -3, -3], [4]);
    /// assert_eq!(a.remainder(&b).to_vec::<i64>(), [2, 1, -1, -2]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_remainder`] fails.
    #[must_use]
    #[track_caller]
    pub fn remainder<'a>(&self, other: impl Into<Operand<'a>>) -> Tensor {
        ok(self.try_remainder(other))
    }

    /// [`Tensor::remainder`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`crate::Error::Shape`] when the shapes do not broadcast, [`crate::Error::DType`] for two
    /// bool operands.
    #[track_caller]
    pub fn try_remainder<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        let other = other.into();
        let dtype = self.common_dtype(&other);
        if dtype == DType::Bool {
            return Err(crate::Error::dtype(
                "remainder",
                "is not defined for two bool operands; cast one with .long() first",
            ));
        }
        let (a, b) = self.pair(other, dtype, "remainder")?;
        let r = a.try_fmod(&b)?;
        let shift = r.ne(0).logical_and(r.lt(0).ne(b.lt(0)));
        Tensor::try_where_(&shift, r.try_add(&b)?, &r)
    }

    /// `self` and `other` broadcast together and converted to `dtype`.
    #[track_caller]
    fn pair(&self, other: Operand<'_>, dtype: DType, op: &'static str) -> Result<(Tensor, Tensor)> {
        let other = match other {
            Operand::Tensor(t) => t.into_owned(),
            Operand::Scalar(s) => Tensor::try_full_dtype(Vec::<usize>::new(), s, dtype)?,
        };
        let shape = self.shape().broadcast(other.shape(), op)?;
        Ok((self.to_dtype(dtype).broadcast_to(&shape), other.to_dtype(dtype).broadcast_to(&shape)))
    }
}

/// Bools divide as `i64` (PyTorch refuses two bools for `remainder`, and so does
/// [`BinaryOp::Rem`]; `div` of bools counts them).
fn integer(dtype: DType) -> DType {
    if dtype == DType::Bool { DType::I64 } else { dtype }
}

/// `floor(a / b)` for floats as PyTorch computes it (`div_floor_floating`): from the exact
/// remainder, so that `a - floor_quotient * b` is `remainder(a, b)`, then the quotient rounded
/// to the nearest integer (it is one up to rounding); a zero divisor gives `a / b`.
#[track_caller]
fn floor_quotient(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let m = a.try_fmod(b)?;
    let mut div = a.try_sub(&m)?.try_div(b)?;
    let down = m.ne(0.0).logical_and(m.lt(0.0).ne(b.lt(0.0)));
    div = Tensor::try_where_(&down, div.try_sub(1.0)?, &div)?;
    let floor = div.floor();
    let floor = Tensor::try_where_(&div.try_sub(&floor)?.gt(0.5), floor.try_add(1.0)?, &floor)?;
    // A zero quotient keeps the sign of the true one (`q · 0` is ±0 with q's sign).
    let signed_zero = a.try_div(b)?.try_mul(0.0)?;
    let q = Tensor::try_where_(&div.eq(0.0), &signed_zero, &floor)?;
    Tensor::try_where_(&b.eq(0.0), a.try_div(b)?, &q)
}
