//! Order statistics over a dimension: `median`, `kthvalue`, `quantile`. Built from the sort
//! and gathers, so gradients flow where PyTorch sends them: to the elements a statistic
//! picks.

use kiln_ir::normalize_axis;

use super::Tensor;
use crate::error::ok;
use crate::{Error, Result};

/// How [`Tensor::quantile`] picks a value between the two elements around the quantile's
/// position `q·(n-1)` (PyTorch's `interpolation`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Interpolation {
    /// `lo + (hi - lo)·frac` (the default).
    #[default]
    Linear,
    /// The element below.
    Lower,
    /// The element above.
    Higher,
    /// The nearer element (ties to the even position, as `round`).
    Nearest,
    /// `(lo + hi) / 2`.
    Midpoint,
}

impl Tensor {
    /// The median of all elements: the lower of the two middle values for an even count
    /// (PyTorch's `median()`), NaN if any element is NaN.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![4.0f32, 1.0, 3.0, 2.0], [4]);
    /// assert_eq!(x.median().item::<f32>(), 2.0);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn median(&self) -> Tensor {
        ok(self.try_reshape(&[-1]).and_then(|flat| flat.try_median_dim(0, false)).map(|(v, _)| v))
    }

    /// The median along `dim` and its position (PyTorch's `median(dim, keepdim)`): the lower
    /// middle value, NaN (and a NaN's position) on a line with a NaN.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1.0f32, 5.0, 3.0, 9.0, 7.0, 8.0], [2, 3]);
    /// let (values, indices) = x.median_dim(1, false);
    /// assert_eq!(values.to_vec::<f32>(), [3.0, 8.0]);
    /// assert_eq!(indices.to_vec::<i64>(), [2, 2]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_median_dim`] fails.
    #[must_use]
    #[track_caller]
    pub fn median_dim(&self, dim: i64, keepdim: bool) -> (Tensor, Tensor) {
        ok(self.try_median_dim(dim, keepdim))
    }

    /// [`Tensor::median_dim`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] for a `dim` out of range; [`Error::Shape`] for an empty line.
    #[track_caller]
    pub fn try_median_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let x = if self.ndim() == 0 { self.try_reshape(&[1])? } else { self.clone() };
        let axis = normalize_axis("median", dim, x.ndim())?;
        let n = x.dims()[axis];
        if n == 0 {
            return Err(Error::shape("median", "cannot take the median of an empty line"));
        }
        // NaN sorts last: with `c` NaNs the first of them is at `n - c`.
        let nans = x.isnan().try_sum_dim(axis as i64, true)?.long();
        let middle = ((n - 1) / 2) as f64;
        let first_nan = &nans * -1 + n as f64;
        let at = Tensor::try_where_(&nans.gt(0.0), &first_nan, middle)?.long();
        pick(&x, axis, &at, keepdim)
    }

    /// The `k`-th smallest element along `dim` (1-based) and its position (PyTorch's
    /// `kthvalue`; NaN counts as the largest).
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![3.0f32, 1.0, 2.0], [3]);
    /// let (v, i) = x.kthvalue(2, 0, false);
    /// assert_eq!((v.item::<f32>(), i.item::<i64>()), (2.0, 2));
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_kthvalue`] fails.
    #[must_use]
    #[track_caller]
    pub fn kthvalue(&self, k: usize, dim: i64, keepdim: bool) -> (Tensor, Tensor) {
        ok(self.try_kthvalue(k, dim, keepdim))
    }

    /// [`Tensor::kthvalue`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] for a `dim` out of range or `k` outside `1..=len`.
    #[track_caller]
    pub fn try_kthvalue(&self, k: usize, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        let x = if self.ndim() == 0 { self.try_reshape(&[1])? } else { self.clone() };
        let axis = normalize_axis("kthvalue", dim, x.ndim())?;
        let n = x.dims()[axis];
        if k == 0 || k > n {
            return Err(Error::Index {
                op: "kthvalue",
                detail: format!("k = {k} is outside 1..={n} (the length of dimension {dim})"),
            });
        }
        let mut line = x.dims().to_vec();
        line[axis] = 1;
        let at = Tensor::full(line, (k - 1) as f64).long();
        pick(&x, axis, &at, keepdim)
    }

    /// The `q`-quantile of all elements (`dim` `None`) or along `dim` (PyTorch's `quantile`):
    /// the value at position `q·(n-1)` of the sorted line, between its neighbours as
    /// `interpolation` says; NaN on a line with a NaN. Gradients flow to the one or two
    /// elements it reads.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// use kiln::Interpolation;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [4]);
    /// assert_eq!(x.quantile(0.5, None, false, Interpolation::Linear).item::<f32>(), 2.5);
    /// assert_eq!(x.quantile(0.5, None, false, Interpolation::Lower).item::<f32>(), 2.0);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_quantile`] fails.
    #[must_use]
    #[track_caller]
    pub fn quantile(
        &self,
        q: f64,
        dim: Option<i64>,
        keepdim: bool,
        interpolation: Interpolation,
    ) -> Tensor {
        ok(self.try_quantile(q, dim, keepdim, interpolation))
    }

    /// [`Tensor::quantile`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Value`] for `q` outside `[0, 1]`; [`Error::DType`] for a non-float tensor;
    /// [`Error::Index`] for a `dim` out of range; [`Error::Shape`] for an empty line.
    #[track_caller]
    pub fn try_quantile(
        &self,
        q: f64,
        dim: Option<i64>,
        keepdim: bool,
        interpolation: Interpolation,
    ) -> Result<Tensor> {
        if !(0.0..=1.0).contains(&q) {
            return Err(Error::value("quantile", format!("q must be in [0, 1], got {q}")));
        }
        if !self.dtype().is_float() {
            return Err(Error::dtype(
                "quantile",
                format!("takes a floating-point tensor, got {}", self.dtype()),
            ));
        }
        let (x, axis) = match dim {
            Some(d) => {
                let x = if self.ndim() == 0 { self.try_reshape(&[1])? } else { self.clone() };
                let axis = normalize_axis("quantile", d, x.ndim())?;
                (x, axis)
            }
            None => (self.try_reshape(&[-1])?, 0),
        };
        let n = x.dims()[axis];
        if n == 0 {
            return Err(Error::shape("quantile", "cannot take a quantile of an empty line"));
        }
        let (sorted, _) = x.try_sort(axis as i64, false)?;
        let pos = q * (n - 1) as f64;
        let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
        let frac = pos - lo as f64;
        let at = |i: usize| sorted.try_narrow(axis as i64, i, 1);
        let value = match interpolation {
            Interpolation::Lower => at(lo)?,
            Interpolation::Higher => at(hi)?,
            Interpolation::Nearest => {
                at(if frac == 0.5 { lo + lo % 2 } else { pos.round() as usize })?
            }
            Interpolation::Midpoint => (at(lo)? + at(hi)?) * 0.5,
            Interpolation::Linear => {
                let (a, b) = (at(lo)?, at(hi)?);
                &a + (b - &a) * frac
            }
        };
        // A NaN sorts last and reaches no quantile but the top: NaN for the whole line.
        let nan = x.isnan().any_dim(axis as i64, true);
        let value = Tensor::try_where_(&nan, f64::NAN, &value)?;
        match (dim, keepdim) {
            (Some(_), true) => Ok(value),
            (Some(_), false) => value.try_squeeze(axis as i64),
            (None, true) => value.try_reshape(&vec![1i64; self.ndim()]),
            (None, false) => value.try_reshape(&[]),
        }
    }
}

/// The elements of `x` at sorted positions `at` (`[.., 1, ..]` along `axis`, i64) and their
/// original positions, squeezed along `axis` unless `keepdim`.
fn pick(x: &Tensor, axis: usize, at: &Tensor, keepdim: bool) -> Result<(Tensor, Tensor)> {
    let order = x.try_argsort(axis as i64, false)?;
    let indices = order.try_gather(axis as i64, at)?;
    let values = x.try_gather(axis as i64, &indices)?;
    if keepdim {
        Ok((values, indices))
    } else {
        Ok((values.try_squeeze(axis as i64)?, indices.try_squeeze(axis as i64)?))
    }
}
