//! The inverse trigonometric functions beside `atan` (`asin`, `acos`, `atan2`), signs
//! (`signbit`, `copysign`) and `clamp` with tensor bounds: compositions of elementwise
//! primitives, accurate at the domain's edges, so they fuse and differentiate.

use std::f64::consts::{FRAC_PI_2, FRAC_PI_4, PI};

use super::Tensor;
use crate::error::ok;
use crate::{Error, Result};

impl Tensor {
    /// The arcsine, in `[-π/2, π/2]`; NaN outside `[-1, 1]`. Computed as
    /// `atan(x / √((1 - x)(1 + x)))`, whose divisor keeps its digits near `±1`.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let y = Tensor::from_vec(vec![0.5f64, -1.0, 0.999999], [3]).asin().to_vec::<f64>();
    /// for (y, x) in y.iter().zip([0.5f64, -1.0, 0.999999]) {
    ///     assert!((y - x.asin()).abs() <= 4.0 * f64::EPSILON * x.asin().abs());
    /// }
    /// ```
    #[must_use]
    #[track_caller]
    pub fn asin(&self) -> Tensor {
        let x = self.floating();
        let d = ((1.0 - &x) * (1.0 + &x)).sqrt();
        let edge = d.eq(0.0);
        // The divisor at ±1 replaced first: no branch divides by zero.
        let inner = (&x / Tensor::where_(&edge, 1.0, &d)).atan();
        let half_pi = Tensor::where_(&x.lt(0.0), x.full_like(-FRAC_PI_2), x.full_like(FRAC_PI_2));
        Tensor::where_(&edge, &half_pi, &inner)
    }

    /// The arccosine, in `[0, π]`; NaN outside `[-1, 1]`. Computed as
    /// `2·atan(√((1 - x) / (1 + x)))`, accurate near both ends.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let y = Tensor::from_vec(vec![0.5f64, -1.0, 0.999999], [3]).acos().to_vec::<f64>();
    /// for (y, x) in y.iter().zip([0.5f64, -1.0, 0.999999]) {
    ///     assert!((y - x.acos()).abs() <= 4.0 * f64::EPSILON * x.acos().abs());
    /// }
    /// ```
    #[must_use]
    #[track_caller]
    pub fn acos(&self) -> Tensor {
        let x = self.floating();
        let minus_one = x.eq(-1.0);
        // At -1 the ratio is 2/0: π exactly, without the infinity.
        let ratio = (1.0 - &x) / Tensor::where_(&minus_one, 1.0, 1.0 + &x);
        let y = ratio.sqrt().atan() * 2.0;
        Tensor::where_(&minus_one, x.full_like(PI), &y)
    }

    /// The angle of the point `(other, self)`, `atan2(y = self, x = other)` in `[-π, π]`, with
    /// C's (and PyTorch's) signed zeros and infinities: `atan2(±0, -0) = ±π`,
    /// `atan2(±∞, -∞) = ±3π/4`. Broadcasts.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let y = Tensor::from_vec(vec![1.0f64, 1.0, -0.0, 0.0], [4]);
    /// let x = Tensor::from_vec(vec![-1.0f64, 0.0, -1.0, -0.0], [4]);
    /// let want = [1f64.atan2(-1.0), 1f64.atan2(0.0), (-0f64).atan2(-1.0), 0f64.atan2(-0.0)];
    /// assert_eq!(y.atan2(&x).to_vec::<f64>(), want);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_atan2`] fails.
    #[must_use]
    #[track_caller]
    pub fn atan2(&self, other: &Tensor) -> Tensor {
        ok(self.try_atan2(other))
    }

    /// [`Tensor::atan2`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when the tensors do not broadcast.
    #[track_caller]
    pub fn try_atan2(&self, other: &Tensor) -> Result<Tensor> {
        let (y, x) = (self.floating(), other.floating());
        let shape = y.shape().broadcast(x.shape(), "atan2")?;
        let (y, x) = (y.broadcast_to(&shape), x.broadcast_to(&shape));
        let signed = |v: f64| Tensor::where_(&y.signbit(), y.full_like(-v), y.full_like(v));
        // x = 0 divides by one instead; that branch is replaced below.
        let zero_x = x.eq(0.0);
        let base = (&y / Tensor::where_(&zero_x, 1.0, &x)).atan();
        let left = &base + signed(PI);
        let on_axis = Tensor::where_(
            &y.eq(0.0),
            Tensor::where_(&x.signbit(), signed(PI), &y),
            signed(FRAC_PI_2),
        );
        let general = Tensor::where_(&zero_x, &on_axis, Tensor::where_(&x.lt(0.0), &left, &base));
        // Both infinite: the quotient is NaN; the corners are ±π/4 and ±3π/4.
        let corners = Tensor::where_(&x.gt(0.0), signed(FRAC_PI_4), signed(3.0 * FRAC_PI_4));
        let both_infinite = y.isinf().logical_and(x.isinf());
        let result = Tensor::where_(&both_infinite, &corners, &general);
        // A NaN in either makes NaN (the branches above would pick a constant for some).
        let nan = y.isnan().logical_or(x.isnan());
        Ok(Tensor::where_(&nan, &y + &x, &result))
    }

    /// Whether each element's sign bit is set (`-0.0` and negative NaNs included, as
    /// PyTorch's `signbit`), as `Bool`.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![-0.0f32, 0.0, -2.0, 3.0], [4]);
    /// assert_eq!(x.signbit().to_vec::<bool>(), [true, false, true, false]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn signbit(&self) -> Tensor {
        if !self.dtype().is_float() {
            return self.lt(0.0);
        }
        // -0.0 is the zero whose reciprocal is -∞; a NaN's sign is not visible to
        // arithmetic and reads as positive.
        let zero = self.eq(0.0);
        let reciprocal = 1.0 / Tensor::where_(&zero, self, 1.0);
        self.lt(0.0).logical_or(zero.logical_and(reciprocal.lt(0.0)))
    }

    /// `|self|` with the sign of `other` (C's `copysign`; `-0.0` counts as negative).
    /// Broadcasts; the gradient flows to `self`.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![2.0f32, -3.0, 1.0], [3]);
    /// let s = Tensor::from_vec(vec![-1.0f32, 1.0, -0.0], [3]);
    /// assert_eq!(x.copysign(&s).to_vec::<f32>(), [-2.0, 3.0, -1.0]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_copysign`] fails.
    #[must_use]
    #[track_caller]
    pub fn copysign(&self, other: &Tensor) -> Tensor {
        ok(self.try_copysign(other))
    }

    /// [`Tensor::copysign`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when the tensors do not broadcast.
    #[track_caller]
    pub fn try_copysign(&self, other: &Tensor) -> Result<Tensor> {
        let x = self.floating();
        let magnitude = x.abs();
        Tensor::try_where_(&other.signbit(), &-&magnitude, &magnitude)
    }

    /// Each element limited to `[min, max]` elementwise, the bounds tensors that broadcast
    /// (PyTorch's `clamp` with tensor bounds; either may be absent). Where `min > max` the
    /// result is `max`, as PyTorch's; NaN stays NaN.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![-5.0f32, 0.5, 9.0], [3]);
    /// let lo = Tensor::from_vec(vec![-1.0f32, 1.0, 0.0], [3]);
    /// assert_eq!(x.clamp_tensor(Some(&lo), Some(&Tensor::scalar(2.0f32))).to_vec::<f32>(), [-1.0, 1.0, 2.0]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_clamp_tensor`] fails.
    #[must_use]
    #[track_caller]
    pub fn clamp_tensor(&self, min: Option<&Tensor>, max: Option<&Tensor>) -> Tensor {
        ok(self.try_clamp_tensor(min, max))
    }

    /// [`Tensor::clamp_tensor`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Value`] with neither bound; [`Error::Shape`] when a bound does not broadcast.
    #[track_caller]
    pub fn try_clamp_tensor(&self, min: Option<&Tensor>, max: Option<&Tensor>) -> Result<Tensor> {
        if min.is_none() && max.is_none() {
            return Err(Error::value("clamp", "needs at least one of min and max"));
        }
        let mut y = self.clone();
        if let Some(lo) = min {
            // max(x, lo) that keeps a NaN x: the bound wins only where x < lo.
            y = Tensor::try_where_(&y.try_lt(lo)?, lo, &y)?;
        }
        if let Some(hi) = max {
            y = Tensor::try_where_(&y.try_gt(hi)?, hi, &y)?;
        }
        Ok(y)
    }
}
