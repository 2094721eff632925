//! Reductions: over all elements, or over a list of dimensions with `keepdim`.

use kiln_ir::{DType, Op, ReduceOp, normalize_axis};

use super::Tensor;
use crate::error::ok;
use crate::{Error, Result};

/// One dimension or a list of them, for the `_dim` reductions: `1`, `-1`, `[0, 2]`,
/// `&[0, 2][..]` or `vec![0, 2]`. Negative dimensions count from the end; an empty list
/// means every dimension, as in PyTorch.
pub trait Dims {
    /// The dimensions as given.
    fn to_dims(&self) -> Vec<i64>;
}

macro_rules! dims_impl {
    ($($t:ty),*) => {$(
        impl Dims for $t {
            fn to_dims(&self) -> Vec<i64> {
                vec![*self as i64]
            }
        }
        impl<const N: usize> Dims for [$t; N] {
            fn to_dims(&self) -> Vec<i64> {
                self.iter().map(|&d| d as i64).collect()
            }
        }
        impl Dims for &[$t] {
            fn to_dims(&self) -> Vec<i64> {
                self.iter().map(|&d| d as i64).collect()
            }
        }
        impl Dims for Vec<$t> {
            fn to_dims(&self) -> Vec<i64> {
                self.iter().map(|&d| d as i64).collect()
            }
        }
    )*};
}
dims_impl!(i64, i32, usize);

impl Tensor {
    /// Normalizes `dims` to sorted, distinct axes.
    fn axes(&self, op: &'static str, dims: &impl Dims) -> Result<Vec<usize>> {
        let given = dims.to_dims();
        if given.is_empty() {
            return Ok((0..self.ndim()).collect());
        }
        let mut axes = Vec::with_capacity(given.len());
        for d in given {
            let a = normalize_axis(op, d, self.ndim())?;
            if axes.contains(&a) {
                return Err(Error::index(
                    op,
                    format!("dimension {a} appears more than once in {:?}", dims.to_dims()),
                ));
            }
            axes.push(a);
        }
        axes.sort_unstable();
        Ok(axes)
    }

    #[track_caller]
    fn reduce(&self, op: ReduceOp, axes: Vec<usize>, keepdim: bool) -> Result<Tensor> {
        let kept = Tensor::from_op(Op::Reduce { op, axes: axes.clone() }, &[self])?;
        if keepdim {
            return Ok(kept);
        }
        Ok(kept.restrided(|v| axes.iter().rev().fold(v.clone(), |v, &a| v.squeeze(a))))
    }

    /// Integers and bools sum as `i64`, as in PyTorch.
    #[track_caller]
    fn for_sum(&self) -> Tensor {
        if self.dtype().is_float() { self.clone() } else { self.to_dtype(DType::I64) }
    }

    /// The sum of all elements, as a zero-dimensional tensor (integers and bools sum as `i64`).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1i32, 2, 3, 4], [2, 2]);
    /// assert_eq!(x.sum().item::<i64>(), 10);
    /// assert_eq!(x.sum().dtype(), DType::I64);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn sum(&self) -> Tensor {
        let x = self.for_sum();
        ok(x.reduce(ReduceOp::Sum, (0..self.ndim()).collect(), false))
    }

    /// The sum over `dims`, keeping them as size 1 when `keepdim`.
    ///
    /// # Panics
    /// If a dimension is out of range; [`Tensor::try_sum_dim`] returns the error.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::arange(0.0f32, 6.0, 1.0).view(&[2, 3]);
    /// assert_eq!(x.sum_dim(0, false).to_vec::<f32>(), vec![3.0, 5.0, 7.0]);
    /// assert_eq!(x.sum_dim([0, 1], true).dims(), &[1, 1]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn sum_dim(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        ok(self.try_sum_dim(dims, keepdim))
    }

    /// [`Tensor::sum_dim`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] when a dimension is out of range or repeated.
    #[track_caller]
    pub fn try_sum_dim(&self, dims: impl Dims, keepdim: bool) -> Result<Tensor> {
        let axes = self.axes("sum", &dims)?;
        self.for_sum().reduce(ReduceOp::Sum, axes, keepdim)
    }

    /// The mean of all elements (float tensors only; NaN for an empty tensor).
    ///
    /// # Panics
    /// On an integer or bool tensor; [`Tensor::try_mean`] returns the error.
    #[must_use]
    #[track_caller]
    pub fn mean(&self) -> Tensor {
        ok(self.try_mean())
    }

    /// [`Tensor::mean`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::DType`] on an integer or bool tensor.
    #[track_caller]
    pub fn try_mean(&self) -> Result<Tensor> {
        self.try_mean_dim(Vec::<i64>::new(), false)
    }

    /// The mean over `dims` (float tensors only), keeping them as size 1 when `keepdim`.
    ///
    /// # Panics
    /// On an integer tensor or a bad dimension; [`Tensor::try_mean_dim`] returns the error.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 5.0], [2, 2]);
    /// assert_eq!(x.mean_dim(-1, true).to_vec::<f32>(), vec![1.5, 4.0]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn mean_dim(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        ok(self.try_mean_dim(dims, keepdim))
    }

    /// [`Tensor::mean_dim`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::DType`] on an integer or bool tensor; [`Error::Index`] for a bad dimension.
    #[track_caller]
    pub fn try_mean_dim(&self, dims: impl Dims, keepdim: bool) -> Result<Tensor> {
        if !self.dtype().is_float() {
            return Err(Error::dtype(
                "mean",
                format!(
                    "needs a float tensor, got {}; convert it first with .float()",
                    self.dtype()
                ),
            ));
        }
        let axes = self.axes("mean", &dims)?;
        let count: usize = axes.iter().map(|&a| self.dims()[a]).product();
        let sum = self.reduce(ReduceOp::Sum, axes, keepdim)?;
        sum.try_div(count as f64)
    }

    /// The largest element, as a zero-dimensional tensor (NaN if any element is NaN).
    ///
    /// # Panics
    /// On an empty tensor; [`Tensor::try_max`] returns the error.
    #[must_use]
    #[track_caller]
    pub fn max(&self) -> Tensor {
        ok(self.try_max())
    }

    /// [`Tensor::max`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] on an empty tensor.
    #[track_caller]
    pub fn try_max(&self) -> Result<Tensor> {
        self.reduce(ReduceOp::Max, (0..self.ndim()).collect(), false)
    }

    /// The smallest element, as a zero-dimensional tensor (NaN if any element is NaN).
    ///
    /// # Panics
    /// On an empty tensor; [`Tensor::try_min`] returns the error.
    #[must_use]
    #[track_caller]
    pub fn min(&self) -> Tensor {
        ok(self.try_min())
    }

    /// [`Tensor::min`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] on an empty tensor.
    #[track_caller]
    pub fn try_min(&self) -> Result<Tensor> {
        self.reduce(ReduceOp::Min, (0..self.ndim()).collect(), false)
    }

    /// The largest elements along `dim` and their indices (`i64`; the first index on ties,
    /// a NaN counts as largest).
    ///
    /// # Panics
    /// On a bad dimension or an empty one; [`Tensor::try_max_dim`] returns the error.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1.0f32, 7.0, 7.0, 4.0, 2.0, 0.0], [2, 3]);
    /// let (values, indices) = x.max_dim(1, false);
    /// assert_eq!(values.to_vec::<f32>(), vec![7.0, 4.0]);
    /// assert_eq!(indices.to_vec::<i64>(), vec![1, 0]);
    /// ```
    #[track_caller]
    pub fn max_dim(&self, dim: i64, keepdim: bool) -> (Tensor, Tensor) {
        ok(self.try_max_dim(dim, keepdim))
    }

    /// [`Tensor::max_dim`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] for a bad dimension; [`Error::Shape`] for an empty one.
    #[track_caller]
    pub fn try_max_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        self.extreme_dim(ReduceOp::Max, ReduceOp::ArgMax, "max_dim", dim, keepdim)
    }

    /// The extreme values along `dim` and their indices. When gradients are recorded the
    /// values are selected by the indices, so that (as in PyTorch) the gradient flows only to
    /// the returned index, also on ties.
    #[track_caller]
    fn extreme_dim(
        &self,
        value: ReduceOp,
        index: ReduceOp,
        op: &'static str,
        dim: i64,
        keepdim: bool,
    ) -> Result<(Tensor, Tensor)> {
        let axis = normalize_axis(op, dim, self.ndim())?;
        let indices = self.reduce(index, vec![axis], true)?;
        let values = if self.requires_grad() && super::grad_mode::is_grad_enabled() {
            let mut positions_shape = vec![1; self.ndim()];
            positions_shape[axis] = self.dims()[axis];
            let positions = Tensor::arange(0i64, self.dims()[axis] as i64, 1)
                .try_to(self.device())?
                .try_reshape(&positions_shape.iter().map(|&d| d as i64).collect::<Vec<_>>())?;
            let hit = positions.try_eq(&indices)?;
            Tensor::try_where_(&hit, self, 0.0)?.try_sum_dim(axis, true)?
        } else {
            self.reduce(value, vec![axis], true)?
        };
        if keepdim {
            return Ok((values, indices));
        }
        Ok((values.try_squeeze(axis as i64)?, indices.try_squeeze(axis as i64)?))
    }

    /// The smallest elements along `dim` and their indices (`i64`; the first index on ties,
    /// a NaN counts as smallest).
    ///
    /// # Panics
    /// On a bad dimension or an empty one; [`Tensor::try_min_dim`] returns the error.
    #[track_caller]
    pub fn min_dim(&self, dim: i64, keepdim: bool) -> (Tensor, Tensor) {
        ok(self.try_min_dim(dim, keepdim))
    }

    /// [`Tensor::min_dim`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] for a bad dimension; [`Error::Shape`] for an empty one.
    #[track_caller]
    pub fn try_min_dim(&self, dim: i64, keepdim: bool) -> Result<(Tensor, Tensor)> {
        self.extreme_dim(ReduceOp::Min, ReduceOp::ArgMin, "min_dim", dim, keepdim)
    }

    /// The index of the largest element along `dim` (`i64`).
    ///
    /// # Panics
    /// On a bad dimension or an empty one.
    #[must_use]
    #[track_caller]
    pub fn argmax(&self, dim: i64, keepdim: bool) -> Tensor {
        ok(self.try_max_dim(dim, keepdim)).1
    }

    /// The index of the smallest element along `dim` (`i64`).
    ///
    /// # Panics
    /// On a bad dimension or an empty one.
    #[must_use]
    #[track_caller]
    pub fn argmin(&self, dim: i64, keepdim: bool) -> Tensor {
        ok(self.try_min_dim(dim, keepdim)).1
    }
}

impl Tensor {
    /// The product of all elements (integers and bools multiply as `i64`).
    #[must_use]
    #[track_caller]
    pub fn prod(&self) -> Tensor {
        ok(self.for_sum().reduce(ReduceOp::Prod, (0..self.ndim()).collect(), false))
    }

    /// The product over `dims`, keeping them as size 1 when `keepdim`.
    ///
    /// # Panics
    /// If a dimension is out of range; [`Tensor::try_prod_dim`] returns the error.
    #[must_use]
    #[track_caller]
    pub fn prod_dim(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        ok(self.try_prod_dim(dims, keepdim))
    }

    /// [`Tensor::prod_dim`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] when a dimension is out of range or repeated.
    #[track_caller]
    pub fn try_prod_dim(&self, dims: impl Dims, keepdim: bool) -> Result<Tensor> {
        let axes = self.axes("prod", &dims)?;
        self.for_sum().reduce(ReduceOp::Prod, axes, keepdim)
    }

    /// The largest elements over `dims` (several at once), keeping them when `keepdim`. The
    /// gradient is shared evenly among tied maxima, as in PyTorch.
    ///
    /// # Panics
    /// On a bad or empty dimension; [`Tensor::try_amax`] returns the error.
    #[must_use]
    #[track_caller]
    pub fn amax(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        ok(self.try_amax(dims, keepdim))
    }

    /// [`Tensor::amax`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] for a bad dimension; [`Error::Shape`] for an empty one.
    #[track_caller]
    pub fn try_amax(&self, dims: impl Dims, keepdim: bool) -> Result<Tensor> {
        let axes = self.axes("amax", &dims)?;
        self.reduce(ReduceOp::Max, axes, keepdim)
    }

    /// The smallest elements over `dims`, keeping them when `keepdim`.
    ///
    /// # Panics
    /// On a bad or empty dimension; [`Tensor::try_amin`] returns the error.
    #[must_use]
    #[track_caller]
    pub fn amin(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        ok(self.try_amin(dims, keepdim))
    }

    /// [`Tensor::amin`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] for a bad dimension; [`Error::Shape`] for an empty one.
    #[track_caller]
    pub fn try_amin(&self, dims: impl Dims, keepdim: bool) -> Result<Tensor> {
        let axes = self.axes("amin", &dims)?;
        self.reduce(ReduceOp::Min, axes, keepdim)
    }

    /// The unbiased variance of all elements (`correction = 1`, as in PyTorch).
    ///
    /// # Panics
    /// On a non-float tensor.
    #[must_use]
    #[track_caller]
    pub fn var(&self) -> Tensor {
        ok(self.try_var_dim_correction(Vec::<i64>::new(), 1.0, false))
    }

    /// The unbiased variance over `dims`.
    ///
    /// # Panics
    /// On a non-float tensor or a bad dimension.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    /// assert_eq!(x.var_dim(1, false).to_vec::<f32>(), vec![0.5, 0.5]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn var_dim(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        ok(self.try_var_dim_correction(dims, 1.0, keepdim))
    }

    /// The variance over `dims` with `sum((x - mean)^2) / (n - correction)`: 1 is the
    /// unbiased estimate, 0 the population variance.
    ///
    /// # Errors
    /// [`Error::DType`] on a non-float tensor; [`Error::Index`] for a bad dimension.
    #[track_caller]
    pub fn try_var_dim_correction(
        &self,
        dims: impl Dims,
        correction: f64,
        keepdim: bool,
    ) -> Result<Tensor> {
        if !self.dtype().is_float() {
            return Err(Error::dtype(
                "var",
                format!(
                    "needs a float tensor, got {}; convert it first with .float()",
                    self.dtype()
                ),
            ));
        }
        let axes = self.axes("var", &dims)?;
        let n: usize = axes.iter().map(|&a| self.dims()[a]).product();
        let mean = self.try_mean_dim(axes.clone(), true)?;
        let centered = self.try_sub(&mean)?;
        let ss = centered.try_mul(&centered)?.try_sum_dim(axes, keepdim)?;
        ss.try_div((n as f64 - correction).max(0.0))
    }

    /// The unbiased standard deviation of all elements.
    ///
    /// # Panics
    /// On a non-float tensor.
    #[must_use]
    #[track_caller]
    pub fn std(&self) -> Tensor {
        self.var().sqrt()
    }

    /// The unbiased standard deviation over `dims`.
    ///
    /// # Panics
    /// On a non-float tensor or a bad dimension.
    #[must_use]
    #[track_caller]
    pub fn std_dim(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        self.var_dim(dims, keepdim).sqrt()
    }

    /// The standard deviation over `dims` with a correction (see
    /// [`Tensor::try_var_dim_correction`]).
    ///
    /// # Errors
    /// As [`Tensor::try_var_dim_correction`].
    #[track_caller]
    pub fn try_std_dim_correction(
        &self,
        dims: impl Dims,
        correction: f64,
        keepdim: bool,
    ) -> Result<Tensor> {
        Ok(self.try_var_dim_correction(dims, correction, keepdim)?.sqrt())
    }

    /// `log(sum(exp(x)))` over `dims`, computed stably: inputs of 1000 give 1000 + log 2,
    /// not infinity. An empty dimension gives -inf, as in PyTorch. One reduction: on the CPU
    /// a single pass over the input (the running maximum and a rescaled sum), elsewhere max,
    /// exp, sum and log.
    ///
    /// # Panics
    /// On a bad dimension; [`Tensor::try_logsumexp`] returns the error.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1000.0f32, 1000.0], [2]);
    /// assert!((x.logsumexp(0, false).item::<f32>() - (1000.0 + 2f32.ln())).abs() < 1e-3);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn logsumexp(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        ok(self.try_logsumexp(dims, keepdim))
    }

    /// [`Tensor::logsumexp`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] for a bad dimension.
    #[track_caller]
    pub fn try_logsumexp(&self, dims: impl Dims, keepdim: bool) -> Result<Tensor> {
        let x = if self.dtype().is_float() { self.clone() } else { self.to_dtype(DType::F32) };
        let axes = x.axes("logsumexp", &dims)?;
        x.reduce(ReduceOp::LogSumExp, axes, keepdim)
    }

    /// `exp(x) / sum(exp(x))` along `dim`, computed stably (shifted by the maximum): inputs
    /// of 1000 give 0.5/0.5, not NaN.
    ///
    /// # Panics
    /// If `dim` is out of range; [`Tensor::try_softmax`] returns the error.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1000.0f32, 1000.0], [2]);
    /// assert_eq!(x.softmax(0).to_vec::<f32>(), vec![0.5, 0.5]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn softmax(&self, dim: i64) -> Tensor {
        ok(self.try_softmax(dim))
    }

    /// [`Tensor::softmax`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] when `dim` is out of range.
    #[track_caller]
    pub fn try_softmax(&self, dim: i64) -> Result<Tensor> {
        let x = if self.dtype().is_float() { self.clone() } else { self.to_dtype(DType::F32) };
        let x = x.autocast_widened();
        let axis = normalize_axis("softmax", dim, x.ndim())?;
        if x.numel() == 0 {
            return Ok(x);
        }
        // exp(x - max) once, stored and summed in one pass, then one reciprocal per row and
        // a product per element, as PyTorch's CPU kernels do: a division per element costs
        // several times a product on every CPU. (exp(x - logsumexp(x)) would compute the
        // exponential twice, and logsumexp(x) rounded to f32 would cost the largest outputs
        // ulp(max) of relative accuracy.)
        let e = x.try_sub(&x.stable_shift(&[axis])?)?.exp();
        e.try_mul(e.try_sum_dim(axis, true)?.reciprocal())
    }

    /// The maximum over `axes` (kept), with infinities replaced by 0 and no gradient: the
    /// shift that keeps `exp` from overflowing.
    #[track_caller]
    fn stable_shift(&self, axes: &[usize]) -> Result<Tensor> {
        let m = self.detach().reduce(ReduceOp::Max, axes.to_vec(), true)?;
        let finite = m.abs().try_lt(f64::INFINITY)?;
        Tensor::try_where_(&finite, &m, 0.0)
    }

    /// `log(softmax(x))` along `dim`, computed stably as `(x - max) - log(Σ exp(x - max))`:
    /// the result is as precise as itself at any logit magnitude (the planner's
    /// `precise_log_softmax` pass; on the CPU from the one-pass log-sum-exp, kept in f64).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1000.0f32, 1000.0], [2]);
    /// assert_eq!(x.log_softmax(0).to_vec::<f32>(), vec![-std::f32::consts::LN_2; 2]);
    /// ```
    ///
    /// # Panics
    /// If `dim` is out of range; [`Tensor::try_log_softmax`] returns the error.
    #[must_use]
    #[track_caller]
    pub fn log_softmax(&self, dim: i64) -> Tensor {
        ok(self.try_log_softmax(dim))
    }

    /// [`Tensor::log_softmax`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] when `dim` is out of range.
    #[track_caller]
    pub fn try_log_softmax(&self, dim: i64) -> Result<Tensor> {
        let x = if self.dtype().is_float() { self.clone() } else { self.to_dtype(DType::F32) };
        let x = x.autocast_widened();
        let axis = normalize_axis("log_softmax", dim, x.ndim())?;
        if x.numel() == 0 {
            return Ok(x);
        }
        if matches!(x.dtype(), DType::F16 | DType::BF16) {
            // Half precision cannot hold logsumexp(x) finely enough to subtract it (at 1000
            // its ulp is 0.5): shift by the maximum first, as PyTorch does.
            let y = x.try_sub(&x.stable_shift(&[axis])?)?;
            return y.try_sub(&y.reduce(ReduceOp::LogSumExp, vec![axis], true)?);
        }
        x.try_sub(&x.reduce(ReduceOp::LogSumExp, vec![axis], true)?)
    }

    /// The running sum along `dim` (integers and bools sum as `i64`).
    ///
    /// # Panics
    /// If `dim` is out of range; [`Tensor::try_cumsum`] returns the error.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// assert_eq!(Tensor::arange(1i64, 5, 1).cumsum(0).to_vec::<i64>(), vec![1, 3, 6, 10]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn cumsum(&self, dim: i64) -> Tensor {
        ok(self.try_cumsum(dim))
    }

    /// [`Tensor::cumsum`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] when `dim` is out of range.
    #[track_caller]
    pub fn try_cumsum(&self, dim: i64) -> Result<Tensor> {
        let axis = normalize_axis("cumsum", dim, self.ndim())?;
        Tensor::from_op(Op::CumSum { axis }, &[&self.for_sum()])
    }

    /// Whether every element is non-zero (`true` for an empty tensor).
    #[must_use]
    #[track_caller]
    pub fn all(&self) -> Tensor {
        ok(self.bool().reduce(ReduceOp::Min, (0..self.ndim()).collect(), false))
    }

    /// Whether any element is non-zero (`false` for an empty tensor).
    #[must_use]
    #[track_caller]
    pub fn any(&self) -> Tensor {
        ok(self.bool().reduce(ReduceOp::Max, (0..self.ndim()).collect(), false))
    }

    /// Whether every element over `dims` is non-zero.
    ///
    /// # Panics
    /// If a dimension is out of range.
    #[must_use]
    #[track_caller]
    pub fn all_dim(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        let axes = ok(self.axes("all", &dims));
        ok(self.bool().reduce(ReduceOp::Min, axes, keepdim))
    }

    /// Whether any element over `dims` is non-zero.
    ///
    /// # Panics
    /// If a dimension is out of range.
    #[must_use]
    #[track_caller]
    pub fn any_dim(&self, dims: impl Dims, keepdim: bool) -> Tensor {
        let axes = ok(self.axes("any", &dims));
        ok(self.bool().reduce(ReduceOp::Max, axes, keepdim))
    }
}
