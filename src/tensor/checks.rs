//! Predicates and repairs of values, with PyTorch's names and semantics: `isnan`, `isinf`,
//! `isfinite`, `nan_to_num`, `isclose`, `allclose`, `count_nonzero`. Compositions of the
//! elementwise primitives, so they fuse with their neighbors.

use super::Tensor;
use super::reduce::Dims;
use crate::{DType, Result};

/// The largest finite value of a float dtype, as an `f64`.
fn largest(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => f64::MAX,
        DType::F16 => f64::from(half::f16::MAX),
        DType::BF16 => f64::from(half::bf16::MAX),
        _ => f64::from(f32::MAX),
    }
}

impl Tensor {
    /// `true` where an element is NaN (never for integers and bools).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1.0f32, f32::NAN, f32::INFINITY], [3]);
    /// assert_eq!(x.isnan().to_vec::<bool>(), [false, true, false]);
    /// assert_eq!(x.isinf().to_vec::<bool>(), [false, false, true]);
    /// assert_eq!(x.isfinite().to_vec::<bool>(), [true, false, false]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn isnan(&self) -> Tensor {
        self.ne(self)
    }

    /// `true` where an element is `+inf` or `-inf` (never for integers and bools).
    #[must_use]
    #[track_caller]
    pub fn isinf(&self) -> Tensor {
        if !self.dtype().is_float() {
            return self.ne(self);
        }
        self.abs().eq(f64::INFINITY)
    }

    /// `true` where an element is neither infinite nor NaN (always for integers and bools).
    #[must_use]
    #[track_caller]
    pub fn isfinite(&self) -> Tensor {
        if !self.dtype().is_float() {
            return self.eq(self);
        }
        self.abs().lt(f64::INFINITY)
    }

    /// NaN replaced by `nan`, `+inf` by `posinf` and `-inf` by `neginf` (PyTorch's
    /// `nan_to_num`; `None` is the dtype's largest or smallest finite value). Integers and
    /// bools are returned as they are.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![f32::NAN, f32::INFINITY, -f32::INFINITY, 2.0], [4]);
    /// let y = x.nan_to_num(0.0, Some(1e6), None).to_vec::<f32>();
    /// assert_eq!(y, [0.0, 1e6, f32::MIN, 2.0]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn nan_to_num(&self, nan: f64, posinf: Option<f64>, neginf: Option<f64>) -> Tensor {
        if !self.dtype().is_float() {
            return self.clone();
        }
        let big = largest(self.dtype());
        let x = Tensor::where_(&self.isnan(), nan, self);
        let x = Tensor::where_(&self.eq(f64::INFINITY), posinf.unwrap_or(big), &x);
        Tensor::where_(&self.eq(f64::NEG_INFINITY), neginf.unwrap_or(-big), &x)
    }

    /// `true` where `|self - other| <= atol + rtol·|other|` (broadcast), or the two are
    /// equal (infinities of one sign), or, with `equal_nan`, both are NaN: PyTorch's
    /// `isclose`.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let a = Tensor::from_vec(vec![1.0f64, 1.0, f64::NAN], [3]);
    /// let b = Tensor::from_vec(vec![1.0 + 1e-9, 1.1, f64::NAN], [3]);
    /// assert_eq!(a.isclose(&b, 1e-5, 1e-8, false).to_vec::<bool>(), [true, false, false]);
    /// assert!(!a.allclose(&b, 1e-5, 1e-8, true));
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_isclose`] fails.
    #[must_use]
    #[track_caller]
    pub fn isclose(&self, other: &Tensor, rtol: f64, atol: f64, equal_nan: bool) -> Tensor {
        crate::error::ok(self.try_isclose(other, rtol, atol, equal_nan))
    }

    /// [`Tensor::isclose`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`crate::Error::Shape`] when the shapes do not broadcast; [`crate::Error::Value`] for
    /// a negative tolerance.
    #[track_caller]
    pub fn try_isclose(
        &self,
        other: &Tensor,
        rtol: f64,
        atol: f64,
        equal_nan: bool,
    ) -> Result<Tensor> {
        if rtol.is_nan() || atol.is_nan() || rtol < 0.0 || atol < 0.0 {
            return Err(crate::Error::value(
                "isclose",
                format!("rtol ({rtol}) and atol ({atol}) must be non-negative"),
            ));
        }
        // An infinite difference is never within the tolerance (infinite `other` makes the
        // tolerance infinite too): unequal infinities are not close.
        let error = self.try_sub(other)?.abs();
        let within = error.try_le(&(other.abs() * rtol + atol))?.logical_and(error.isfinite());
        let close = self.try_eq(other)?.logical_or(&within);
        if equal_nan {
            return Ok(close.logical_or(&self.isnan().try_logical_and(other.isnan())?));
        }
        Ok(close)
    }

    /// Whether every element is [`Tensor::isclose`] to `other`'s (computed now).
    ///
    /// # Panics
    /// As [`Tensor::try_allclose`] fails.
    #[must_use]
    #[track_caller]
    pub fn allclose(&self, other: &Tensor, rtol: f64, atol: f64, equal_nan: bool) -> bool {
        crate::error::ok(self.try_allclose(other, rtol, atol, equal_nan))
    }

    /// [`Tensor::allclose`], returning an error instead of panicking.
    ///
    /// # Errors
    /// As [`Tensor::try_isclose`], and the computation's errors.
    #[track_caller]
    pub fn try_allclose(
        &self,
        other: &Tensor,
        rtol: f64,
        atol: f64,
        equal_nan: bool,
    ) -> Result<bool> {
        self.try_isclose(other, rtol, atol, equal_nan)?.all().try_item::<bool>()
    }

    /// How many elements are not zero along `dims` (all of them for `&[]`), as `i64`:
    /// PyTorch's `count_nonzero`.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![0.0f32, 2.0, 0.0, -1.0, 3.0, 0.0], [2, 3]);
    /// assert_eq!(x.count_nonzero(&[] as &[i64]).item::<i64>(), 3);
    /// assert_eq!(x.count_nonzero(1).to_vec::<i64>(), [1, 2]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_count_nonzero`] fails.
    #[must_use]
    #[track_caller]
    pub fn count_nonzero(&self, dims: impl Dims) -> Tensor {
        crate::error::ok(self.try_count_nonzero(dims))
    }

    /// [`Tensor::count_nonzero`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`crate::Error::Shape`] for a dimension out of range.
    #[track_caller]
    pub fn try_count_nonzero(&self, dims: impl Dims) -> Result<Tensor> {
        let nonzero = self.ne(0.0).to_dtype(DType::I64);
        if dims.to_dims().is_empty() {
            return Ok(nonzero.sum());
        }
        nonzero.try_sum_dim(dims, false)
    }
}
