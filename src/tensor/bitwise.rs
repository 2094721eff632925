//! Bitwise ops of integer tensors (PyTorch's `bitwise_*`): on bools they are the logical ops,
//! as in PyTorch; floats are refused.

use kiln_ir::{BinaryOp, DType};

use super::Tensor;
use super::arith::Operand;
use crate::error::ok;
use crate::{Error, Result};

impl Tensor {
    /// Bitwise and (logical and of bools).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![12i64, -1, 5], [3]);
    /// assert_eq!(x.bitwise_and(10).to_vec::<i64>(), [8, 10, 0]);
    /// assert_eq!(x.bitwise_or(3).to_vec::<i64>(), [15, -1, 7]);
    /// assert_eq!(x.bitwise_xor(6).to_vec::<i64>(), [10, -7, 3]);
    /// assert_eq!(x.bitwise_not().to_vec::<i64>(), [-13, 0, -6]);
    /// assert_eq!(x.bitwise_left_shift(2).to_vec::<i64>(), [48, -4, 20]);
    /// assert_eq!(x.bitwise_right_shift(2).to_vec::<i64>(), [3, -1, 1]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_bitwise_and`] fails.
    #[must_use]
    #[track_caller]
    pub fn bitwise_and<'a>(&self, other: impl Into<Operand<'a>>) -> Tensor {
        ok(self.try_bitwise_and(other))
    }

    /// [`Tensor::bitwise_and`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::DType`] for a float operand, [`Error::Shape`] when the shapes do not broadcast.
    #[track_caller]
    pub fn try_bitwise_and<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        self.bitwise(BinaryOp::BitAnd, other.into())
    }

    /// Bitwise or (logical or of bools).
    ///
    /// # Panics
    /// As [`Tensor::try_bitwise_or`] fails.
    #[must_use]
    #[track_caller]
    pub fn bitwise_or<'a>(&self, other: impl Into<Operand<'a>>) -> Tensor {
        ok(self.try_bitwise_or(other))
    }

    /// [`Tensor::bitwise_or`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::DType`] for a float operand, [`Error::Shape`] when the shapes do not broadcast.
    #[track_caller]
    pub fn try_bitwise_or<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        self.bitwise(BinaryOp::BitOr, other.into())
    }

    /// Bitwise exclusive or (`!=` of bools).
    ///
    /// # Panics
    /// As [`Tensor::try_bitwise_xor`] fails.
    #[must_use]
    #[track_caller]
    pub fn bitwise_xor<'a>(&self, other: impl Into<Operand<'a>>) -> Tensor {
        ok(self.try_bitwise_xor(other))
    }

    /// [`Tensor::bitwise_xor`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::DType`] for a float operand, [`Error::Shape`] when the shapes do not broadcast.
    #[track_caller]
    pub fn try_bitwise_xor<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        self.bitwise(BinaryOp::BitXor, other.into())
    }

    /// `self << other`, wrapping to the dtype; a shift by a negative amount or by at least the
    /// width gives 0, as PyTorch's.
    ///
    /// # Panics
    /// As [`Tensor::try_bitwise_left_shift`] fails.
    #[must_use]
    #[track_caller]
    pub fn bitwise_left_shift<'a>(&self, other: impl Into<Operand<'a>>) -> Tensor {
        ok(self.try_bitwise_left_shift(other))
    }

    /// [`Tensor::bitwise_left_shift`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::DType`] for a float or bool operand, [`Error::Shape`] when the shapes do not
    /// broadcast.
    #[track_caller]
    pub fn try_bitwise_left_shift<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        self.binary(BinaryOp::Shl, other.into(), false)
    }

    /// `self >> other`, filling with the sign for `i32` and `i64` (zeros for `u8`); a shift by
    /// a negative amount or by at least the width leaves only the sign, as PyTorch's.
    ///
    /// # Panics
    /// As [`Tensor::try_bitwise_right_shift`] fails.
    #[must_use]
    #[track_caller]
    pub fn bitwise_right_shift<'a>(&self, other: impl Into<Operand<'a>>) -> Tensor {
        ok(self.try_bitwise_right_shift(other))
    }

    /// [`Tensor::bitwise_right_shift`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::DType`] for a float or bool operand, [`Error::Shape`] when the shapes do not
    /// broadcast.
    #[track_caller]
    pub fn try_bitwise_right_shift<'a>(&self, other: impl Into<Operand<'a>>) -> Result<Tensor> {
        self.binary(BinaryOp::Shr, other.into(), false)
    }

    /// Bitwise not, `-x - 1` in two's complement (logical not of bools).
    ///
    /// # Panics
    /// As [`Tensor::try_bitwise_not`] fails.
    #[must_use]
    #[track_caller]
    pub fn bitwise_not(&self) -> Tensor {
        ok(self.try_bitwise_not())
    }

    /// [`Tensor::bitwise_not`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::DType`] for a float tensor.
    #[track_caller]
    pub fn try_bitwise_not(&self) -> Result<Tensor> {
        match self.dtype() {
            DType::Bool => Ok(self.logical_not()),
            d if d.is_float() => Err(Error::dtype(
                "bitwise_not",
                format!("is defined for integer and bool tensors, not {d}"),
            )),
            // Every bit flipped: -x - 1 wraps to it in every width, u8 included (255 - x).
            _ => self.try_neg()?.try_sub(1),
        }
    }

    /// A bitwise op; two bools take the logical one.
    #[track_caller]
    fn bitwise(&self, op: BinaryOp, other: Operand<'_>) -> Result<Tensor> {
        if self.common_dtype(&other) != DType::Bool {
            return self.binary(op, other, false);
        }
        let other = match other {
            Operand::Tensor(t) => t.into_owned(),
            Operand::Scalar(s) => Tensor::try_full_dtype(Vec::<usize>::new(), s, DType::Bool)?,
        };
        match op {
            BinaryOp::BitAnd => self.try_logical_and(&other),
            BinaryOp::BitOr => self.try_logical_or(&other),
            _ => self.try_ne(&other),
        }
    }
}
