//! Sampling from tensors of probabilities, and vector norms.

use kiln_ir::{DType, normalize_axis};

use super::{Dims, Tensor};
use crate::error::ok;
use crate::{Error, Result};

impl Tensor {
    /// Draws `num_samples` category indices (`i64`) from each row of non-negative weights
    /// (`[n]` or `[batch, n]`, not necessarily normalized), as PyTorch's `multinomial`.
    /// With `replacement` every draw is independent (an inverse-CDF lookup); without it no
    /// category repeats within a row (exponential races: the `num_samples` smallest of
    /// `Exp(1)/wᵢ`, which is sequential sampling without replacement), and zero-weight
    /// categories come last. The uniform draws come from the counter-based generator
    /// ([`crate::manual_seed`]), so the same seed gives the same draws on every device.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// kiln::manual_seed(0);
    /// let w = Tensor::from_vec(vec![0.0f32, 1.0, 3.0, 0.0], [4]);
    /// let draws = w.multinomial(1000, true).to_vec::<i64>();
    /// assert!(draws.iter().all(|&i| i == 1 || i == 2));
    /// let twos = draws.iter().filter(|&&i| i == 2).count();
    /// assert!((650..850).contains(&twos), "{twos}");
    /// let mut both = w.multinomial(2, false).to_vec::<i64>();
    /// both.sort();
    /// assert_eq!(both, [1, 2]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_multinomial`] fails.
    #[must_use]
    #[track_caller]
    pub fn multinomial(&self, num_samples: usize, replacement: bool) -> Tensor {
        ok(self.try_multinomial(num_samples, replacement))
    }

    /// [`Tensor::multinomial`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] unless the weights are 1-D or 2-D with at least one category;
    /// [`Error::DType`] for integer weights; [`Error::Value`] for zero samples, more samples
    /// than categories without replacement, or weights already computed whose row is not a
    /// distribution (a negative, infinite or NaN weight, or a zero total). Weights the
    /// program still has to compute are checked when the draws are: the realization fails
    /// with [`Error::Runtime`], naming the row.
    #[track_caller]
    pub fn try_multinomial(&self, num_samples: usize, replacement: bool) -> Result<Tensor> {
        const OP: &str = "multinomial";
        if !(1..=2).contains(&self.ndim()) || self.dims()[self.ndim() - 1] == 0 {
            return Err(Error::shape(
                OP,
                format!(
                    "takes weights of shape [n] or [batch, n] with n > 0, got {}",
                    self.shape()
                ),
            ));
        }
        if !self.dtype().is_float() {
            return Err(Error::dtype(OP, format!("takes float weights, got {}", self.dtype())));
        }
        let n = self.dims()[self.ndim() - 1];
        if num_samples == 0 || (!replacement && num_samples > n) {
            return Err(Error::value(
                OP,
                format!(
                    "cannot draw {num_samples} samples from {n} categories {}",
                    if replacement { "" } else { "without replacement; pass replacement = true" }
                ),
            ));
        }
        let w = self.detach().double();
        self.check_distribution_now()?;
        let mut draw_dims = self.dims().to_vec();
        let draws = if replacement {
            // Category k is drawn when cdf[k-1] <= u·total < cdf[k]; u < 1 keeps it below n.
            let cdf = w.try_cumsum(-1)?;
            let total = cdf.try_narrow(-1, n - 1, 1)?;
            *draw_dims.last_mut().expect("rank >= 1") = num_samples;
            let u = Tensor::rand_on(draw_dims.into(), DType::F64, self.device())? * total;
            let below = cdf.try_unsqueeze(-2)?.le(&u.try_unsqueeze(-1)?);
            below.try_sum_dim(-1, false)?
        } else {
            // Exp(1)/w: the first arrivals of independent races are a draw without
            // replacement.
            let u = Tensor::rand_on(draw_dims.into(), DType::F64, self.device())?;
            let arrival = -u.log1p_neg() / &w;
            arrival.try_topk(num_samples, -1, false)?.1
        };
        // Weights computed by the program are checked when the draws are: a row that is not
        // a distribution fails the realization, naming the row (as PyTorch raises).
        let each = w.ge(0.0).logical_and(w.lt(f64::INFINITY)).logical_not().double();
        let ok =
            each.try_sum_dim(-1, false)?.eq(0.0).logical_and(w.try_sum_dim(-1, false)?.gt(0.0));
        let check = kiln_ir::Op::Check(kiln_ir::Check::MultinomialWeights);
        Tensor::from_op(check, &[&draws, &ok.flatten()])
    }

    /// Weights already computed on the host are checked at once: a row that is not a
    /// distribution is an error at the call (lazy weights are checked when drawn from).
    fn check_distribution_now(&self) -> Result<()> {
        let Some(buffer) = self.storage().node().buffer() else { return Ok(()) };
        if buffer.device() != crate::Device::Cpu {
            return Ok(());
        }
        let values = buffer.gather::<f64>(self.layout());
        let n = self.dims()[self.ndim() - 1];
        let row = values.chunks(n).position(|r| {
            r.iter().any(|v| !(*v >= 0.0 && v.is_finite())) || r.iter().sum::<f64>() <= 0.0
        });
        match row {
            Some(row) => {
                let check = kiln_ir::Check::MultinomialWeights;
                Err(Error::value(check.op(), check.failure(row)))
            }
            None => Ok(()),
        }
    }

    /// A 0/1 draw for every element with the element as its probability (PyTorch's
    /// `bernoulli`), in the tensor's dtype.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// kiln::manual_seed(0);
    /// let p = Tensor::full([1000], 0.25f32);
    /// let mean = p.bernoulli().mean().item::<f32>();
    /// assert!((mean - 0.25).abs() < 0.05, "{mean}");
    /// ```
    ///
    /// # Panics
    /// For non-float probabilities.
    #[must_use]
    #[track_caller]
    pub fn bernoulli(&self) -> Tensor {
        ok(self.try_bernoulli())
    }

    /// [`Tensor::bernoulli`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::DType`] for non-float probabilities.
    #[track_caller]
    pub fn try_bernoulli(&self) -> Result<Tensor> {
        if !self.dtype().is_float() {
            return Err(Error::dtype(
                "bernoulli",
                format!("takes float probabilities, got {}", self.dtype()),
            ));
        }
        let u = Tensor::rand_on(self.shape().clone(), DType::F32, self.device())?;
        Ok(u.lt(self.detach().float()).to_dtype(self.dtype()))
    }

    /// The vector `ord`-norm over `dims` (every dimension when `dims` is empty), as
    /// PyTorch's `linalg.vector_norm`: `(Σ|x|^ord)^(1/ord)`, with `ord = ∞` the largest
    /// `|x|`, `-∞` the smallest, and `0` the count of non-zeros. The 2-norm's gradient at
    /// an all-zero vector is 0, as in PyTorch.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![3.0f32, -4.0, 0.0, 1.0], [2, 2]);
    /// assert_eq!(x.vector_norm(2.0, [0i64; 0], false).item::<f32>(), 26f32.sqrt());
    /// assert_eq!(x.vector_norm(1.0, [1], false).to_vec::<f32>(), [7.0, 1.0]);
    /// assert_eq!(x.vector_norm(f64::INFINITY, [0i64; 0], false).item::<f32>(), 4.0);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_vector_norm`] fails.
    #[must_use]
    #[track_caller]
    pub fn vector_norm(&self, ord: f64, dims: impl Dims, keepdim: bool) -> Tensor {
        ok(self.try_vector_norm(ord, dims, keepdim))
    }

    /// [`Tensor::vector_norm`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::DType`] for non-float tensors; [`Error::Index`] for a dimension out of
    /// range; [`Error::Value`] for a NaN `ord`.
    #[track_caller]
    pub fn try_vector_norm(&self, ord: f64, dims: impl Dims, keepdim: bool) -> Result<Tensor> {
        const OP: &str = "vector_norm";
        if !self.dtype().is_float() {
            return Err(Error::dtype(OP, format!("takes a float tensor, got {}", self.dtype())));
        }
        if ord.is_nan() {
            return Err(Error::value(OP, "ord must be a number or ±infinity, got NaN"));
        }
        let mut dims = dims.to_dims();
        if dims.is_empty() {
            dims = (0..self.ndim() as i64).collect();
        }
        for &d in &dims {
            normalize_axis(OP, d, self.ndim())?;
        }
        let a = self.abs();
        Ok(if ord == f64::INFINITY {
            a.try_amax(dims, keepdim)?
        } else if ord == f64::NEG_INFINITY {
            a.try_amin(dims, keepdim)?
        } else if ord == 0.0 {
            a.ne(0.0).to_dtype(self.dtype()).try_sum_dim(dims, keepdim)?
        } else if ord == 1.0 {
            a.try_sum_dim(dims, keepdim)?
        } else if ord == 2.0 {
            // sqrt through a guarded argument, so an all-zero vector has gradient 0, not NaN.
            let s = self.square().try_sum_dim(dims, keepdim)?;
            let zero = s.eq(0.0);
            Tensor::try_where_(&zero, 0.0, Tensor::try_where_(&zero, 1.0, &s)?.sqrt())?
        } else {
            a.pow(ord).try_sum_dim(dims, keepdim)?.pow(1.0 / ord)
        })
    }
}

impl Tensor {
    /// `ln(1 - x)` for `x` in `[0, 1)`: the uniform-to-exponential transform without the
    /// cancellation of `(1 - x).ln()` near 0.
    fn log1p_neg(&self) -> Tensor {
        (-self).log1p()
    }
}

#[cfg(test)]
mod tests {
    use crate::Tensor;

    #[test]
    fn float_weights_and_shapes_are_checked() {
        let ints = Tensor::from_vec(vec![1i64, 2], [2]);
        assert!(ints.try_multinomial(1, true).is_err());
        let w = Tensor::ones([2, 3, 4]);
        assert!(w.try_multinomial(1, true).is_err());
        assert!(Tensor::ones([3]).try_multinomial(4, false).is_err());
        assert!(Tensor::ones([3]).try_multinomial(0, true).is_err());
        assert!(Tensor::ones([3]).try_multinomial(4, true).is_ok());
        assert!(ints.try_bernoulli().is_err());
        assert!(ints.try_vector_norm(2.0, [0], false).is_err());
        assert!(Tensor::ones([3]).try_vector_norm(f64::NAN, [0], false).is_err());
    }
}
