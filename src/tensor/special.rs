//! Activations and accurate special functions composed of the elementwise primitives, so
//! they fuse into one kernel with their neighbors and differentiate through their parts.

use super::Tensor;
use crate::Result;

impl Tensor {
    /// This tensor as floating point (`f32` for integers and booleans), as the
    /// transcendental ops take it.
    pub(super) fn floating(&self) -> Tensor {
        if self.dtype().is_float() { self.clone() } else { self.to_dtype(crate::DType::F32) }
    }

    /// `ln(1 + x)`, accurate for tiny `x` where `(1 + x).log()` loses every digit (Kahan's
    /// method: `u = 1 + x`, then `x` itself where `u == 1`, else `ln(u)·x / (u - 1)`).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1e-10f64, 1.0, -0.5], [3]);
    /// let y = x.log1p().to_vec::<f64>();
    /// assert!((y[0] - 1e-10f64.ln_1p()).abs() < 1e-24); // (1 + 1e-10).ln() is 8e-18 off
    /// assert!((y[1] - 2f64.ln()).abs() < 1e-15);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn log1p(&self) -> Tensor {
        let x = self.floating();
        let u = &x + 1.0;
        // Where u == 1 the general branch is 0/0, and inf/inf where u is infinite: neither
        // is taken (x itself is the answer), and the denominator is replaced *before* the
        // division so that the gradient stays finite too.
        let own = u.eq(1.0).logical_or(u.eq(f64::INFINITY));
        let denominator = Tensor::where_(&own, 1.0, &u - 1.0);
        Tensor::where_(&own, &x, u.log() * &x / denominator)
    }

    /// `e^x - 1`, accurate for tiny `x` (Kahan's method: `u = e^x`, then `x` where `u == 1`,
    /// `u - 1` where that is -1 or `u` overflowed, else `(u - 1)·x / ln(u)`).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1e-10f64, 1.0, -40.0], [3]);
    /// let y = x.expm1().to_vec::<f64>();
    /// assert!((y[0] - 1e-10f64.exp_m1()).abs() < 1e-24);
    /// assert!((y[1] - 1f64.exp_m1()).abs() < 1e-15);
    /// assert_eq!(y[2], -1.0);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn expm1(&self) -> Tensor {
        let x = self.floating();
        let u = x.exp();
        let um1 = &u - 1.0;
        let one = u.eq(1.0);
        // Below about -37 (f64) e^x - 1 is -1; above the overflow it is inf.
        let saturated = um1.eq(-1.0).logical_or(u.eq(f64::INFINITY));
        // The untaken branches' inputs are replaced before the log and the division, so
        // that neither they nor their gradients become infinite.
        let safe_u = Tensor::where_(&one.logical_or(&saturated), std::f64::consts::E, &u);
        let general = &um1 * &x / safe_u.log();
        Tensor::where_(&one, &x, Tensor::where_(&saturated, &um1, &general))
    }

    /// The arctangent, in `(-π/2, π/2)`: Cephes' `atan` (range reduction to `|t| ≤ 0.66`
    /// through `tan(π/4)` and `tan(3π/8)`, then a rational function exact to double
    /// precision), composed of elementwise primitives so that it fuses and vectorizes.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![0.5f64, -3.0, 1e300, 0.0], [4]);
    /// let y = x.atan().to_vec::<f64>();
    /// for (y, x) in y.iter().zip([0.5f64, -3.0, 1e300, 0.0]) {
    ///     assert!((y - x.atan()).abs() <= 2.0 * f64::EPSILON * x.atan().abs(), "{y} {x}");
    /// }
    /// ```
    #[must_use]
    #[track_caller]
    pub fn atan(&self) -> Tensor {
        use std::f64::consts::{FRAC_PI_2, FRAC_PI_4};
        const TAN_3PI_8: f64 = 2.414_213_562_373_095;
        const MORE_BITS: f64 = 6.123_233_995_736_766e-17;
        const P: [f64; 5] = [
            -8.750_608_600_031_904e-1,
            -1.615_753_718_733_365e1,
            -7.500_855_792_314_705e1,
            -1.228_866_684_490_136e2,
            -6.485_021_904_942_025e1,
        ];
        const Q: [f64; 5] = [
            2.485_846_490_142_306e1,
            1.650_270_098_316_988_5e2,
            4.328_810_604_912_903e2,
            4.853_903_996_359_137e2,
            1.945_506_571_482_614e2,
        ];
        let x = self.floating();
        // |x| by a select, not `abs`, whose gradient at 0 is 0: atan'(0) is 1.
        let negative = x.lt(0.0);
        let a = Tensor::where_(&negative, -&x, &x);
        let big = a.gt(TAN_3PI_8);
        let mid = a.gt(0.66).logical_and(big.logical_not());
        // The untaken branches' divisors are replaced first, so no branch divides by zero.
        let inverse = -1.0 / Tensor::where_(&big, &a, 1.0);
        let shifted = (&a - 1.0) / (&a + 1.0);
        let t = Tensor::where_(&big, &inverse, Tensor::where_(&mid, &shifted, &a));
        let z = t.square();
        let p = P[1..].iter().fold(&z * P[0], |acc, &c| (acc + c) * &z);
        let q = Q[1..].iter().fold(&z + Q[0], |acc, &c| acc * &z + c);
        let r = &t + &t * p / q;
        // Constants in x's dtype: a bare f64 scalar would make an f32 tensor.
        let base = Tensor::where_(
            &big,
            x.full_like(FRAC_PI_2 + MORE_BITS),
            Tensor::where_(&mid, x.full_like(FRAC_PI_4 + 0.5 * MORE_BITS), x.full_like(0.0)),
        );
        let y = base + r;
        Tensor::where_(&negative, -&y, &y)
    }

    /// The sigmoid-weighted linear unit `x·σ(x)` (SiLU, also called swish).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let y = Tensor::from_vec(vec![0.0f32, 2.0], [2]).silu().to_vec::<f32>();
    /// assert_eq!(y[0], 0.0);
    /// assert!((y[1] - 2.0 / (1.0 + (-2f32).exp())).abs() < 1e-6);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn silu(&self) -> Tensor {
        let x = self.floating();
        &x * x.sigmoid()
    }

    /// GELU with PyTorch's tanh approximation (`approximate="tanh"`):
    /// `0.5·x·(1 + tanh(u))` with `u = √(2/π)·(x + 0.044715·x³)`, computed as the equal
    /// `x·sigmoid(2u)` (one exponential and one division per element instead of a `tanh`).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![-1.0f64, 0.5, 3.0], [3]);
    /// let (exact, approx) = (x.gelu().to_vec::<f64>(), x.gelu_tanh().to_vec::<f64>());
    /// assert!(exact.iter().zip(&approx).all(|(a, b)| (a - b).abs() < 1e-3));
    /// ```
    #[must_use]
    #[track_caller]
    pub fn gelu_tanh(&self) -> Tensor {
        let x = self.floating();
        let k = (2.0 / std::f64::consts::PI).sqrt();
        let inner = (&x + x.square() * &x * 0.044715) * (2.0 * k);
        &x * inner.sigmoid()
    }

    /// `ln(1 + e^(β·x)) / β`, and `x` itself where `β·x > threshold` (PyTorch's `softplus`,
    /// defaults `β = 1`, `threshold = 20`).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let y = Tensor::from_vec(vec![0.0f64, 30.0], [2]).softplus(1.0, 20.0).to_vec::<f64>();
    /// assert!((y[0] - 2f64.ln()).abs() < 1e-15);
    /// assert_eq!(y[1], 30.0);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn softplus(&self, beta: f64, threshold: f64) -> Tensor {
        let x = self.floating();
        let bx = &x * beta;
        let big = bx.gt(threshold);
        // The exponent is clamped where the linear branch is taken, so it never overflows
        // into an infinite (or NaN) gradient there.
        let soft = bx.clamp_max(threshold).exp().log1p() / beta;
        Tensor::where_(&big, &x, &soft)
    }

    /// `x` where positive, `negative_slope·x` elsewhere (PyTorch's `leaky_relu`, default
    /// slope 0.01).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![-2.0f32, 3.0], [2]);
    /// assert_eq!(x.leaky_relu(0.1).to_vec::<f32>(), vec![-0.2, 3.0]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn leaky_relu(&self, negative_slope: f64) -> Tensor {
        let x = self.floating();
        Tensor::where_(&x.gt(0.0), &x, &x * negative_slope)
    }

    /// `x` where positive, `α·(e^x - 1)` elsewhere (PyTorch's `elu`, default `α = 1`).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let y = Tensor::from_vec(vec![-1.0f64, 2.0], [2]).elu(1.0).to_vec::<f64>();
    /// assert!((y[0] - ((-1f64).exp() - 1.0)).abs() < 1e-15);
    /// assert_eq!(y[1], 2.0);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn elu(&self, alpha: f64) -> Tensor {
        let x = self.floating();
        let negative = x.clamp_max(0.0).expm1() * alpha;
        Tensor::where_(&x.gt(0.0), &x, &negative)
    }

    /// `1` for positive elements, `-1` for negative ones, `0` for zeros (NaN stays NaN), in
    /// this tensor's dtype. Its gradient is zero.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![-3.0f32, 0.0, 2.5], [3]);
    /// assert_eq!(x.sign().to_vec::<f32>(), vec![-1.0, 0.0, 1.0]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn sign(&self) -> Tensor {
        let x = self.detach();
        let positive = Tensor::where_(&x.gt(0.0), 1.0, 0.0).to_dtype(self.dtype());
        let negative = Tensor::where_(&x.lt(0.0), 1.0, 0.0).to_dtype(self.dtype());
        let s = positive - negative;
        if self.dtype().is_float() { Tensor::where_(&x.ne(&x), &x, &s) } else { s }
    }

    /// `1 / √x` (PyTorch's `rsqrt`): `inf` at 0, NaN below 0.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![4.0f32, 0.25], [2]);
    /// assert_eq!(x.rsqrt().to_vec::<f32>(), [0.5, 2.0]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn rsqrt(&self) -> Tensor {
        self.floating().sqrt().reciprocal()
    }

    /// Rounds toward zero (integers as they are); its gradient is zero.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![-1.7f32, 1.7, -0.5], [3]);
    /// assert_eq!(x.trunc().to_vec::<f32>(), [-1.0, 1.0, -0.0]);
    /// assert_eq!(x.frac().to_vec::<f32>()[1], 1.7 - 1.0);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn trunc(&self) -> Tensor {
        if !self.dtype().is_float() {
            return self.clone();
        }
        Tensor::where_(&self.lt(0.0), self.ceil(), self.floor())
    }

    /// The fractional part, `x - trunc(x)`, with `x`'s sign.
    #[must_use]
    #[track_caller]
    pub fn frac(&self) -> Tensor {
        self - self.trunc()
    }

    /// `ln(e^a + e^b)` without overflow (PyTorch's `logaddexp`): the larger plus
    /// `log1p(e^-|a - b|)`; two equal infinities give themselves.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let a = Tensor::from_vec(vec![1000.0f64, -1000.0, 0.0], [3]);
    /// let b = Tensor::from_vec(vec![1000.0f64, -1000.0, f64::NEG_INFINITY], [3]);
    /// let y = a.logaddexp(&b).to_vec::<f64>();
    /// assert!((y[0] - (1000.0 + 2f64.ln())).abs() < 1e-12 && y[2] == 0.0);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_logaddexp`] fails.
    #[must_use]
    #[track_caller]
    pub fn logaddexp(&self, other: &Tensor) -> Tensor {
        crate::error::ok(self.try_logaddexp(other))
    }

    /// [`Tensor::logaddexp`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`crate::Error::Shape`] when the shapes do not broadcast.
    #[track_caller]
    pub fn try_logaddexp(&self, other: &Tensor) -> Result<Tensor> {
        let (a, b) = (self.floating(), other.floating());
        let larger = a.try_maximum(&b)?;
        let y = &larger + (-(a.try_sub(&b)?.abs())).exp().log1p();
        // inf - inf is NaN: equal infinities are their own sum.
        let same_infinity = a.try_eq(&b)?.logical_and(a.isinf());
        Tensor::try_where_(&same_infinity, &larger, &y)
    }

    /// `x · ln(y)`, and 0 where `x` is 0 (unless `y` is NaN): PyTorch's `xlogy`, the
    /// entropy term that `0 · ln 0` would make NaN.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![0.0f64, 2.0], [2]);
    /// let y = Tensor::from_vec(vec![0.0f64, std::f64::consts::E], [2]);
    /// assert_eq!(x.xlogy(&y).to_vec::<f64>(), [0.0, 2.0]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_xlogy`] fails.
    #[must_use]
    #[track_caller]
    pub fn xlogy(&self, other: &Tensor) -> Tensor {
        crate::error::ok(self.try_xlogy(other))
    }

    /// [`Tensor::xlogy`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`crate::Error::Shape`] when the shapes do not broadcast.
    #[track_caller]
    pub fn try_xlogy(&self, other: &Tensor) -> Result<Tensor> {
        let (x, y) = (self.floating(), other.floating());
        let zero = x.eq(0.0).try_logical_and(y.isnan().logical_not())?;
        // The log's argument where it is not used is 1, so its gradient stays finite.
        let safe = Tensor::try_where_(&zero, 1.0, &y)?;
        Tensor::try_where_(&zero, 0.0, x.try_mul(safe.log())?)
    }

    /// `self + weight · (end - self)` (PyTorch's `lerp`, with its two formulas: from `self`
    /// below a weight of 0.5, from `end` above, so both ends are exact).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    /// let b = Tensor::from_vec(vec![3.0f32, 6.0], [2]);
    /// assert_eq!(a.lerp(&b, &Tensor::scalar(0.5f32)).to_vec::<f32>(), [2.0, 4.0]);
    /// assert_eq!(a.lerp(&b, &Tensor::scalar(1.0f32)).to_vec::<f32>(), [3.0, 6.0]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_lerp`] fails.
    #[must_use]
    #[track_caller]
    pub fn lerp(&self, end: &Tensor, weight: &Tensor) -> Tensor {
        crate::error::ok(self.try_lerp(end, weight))
    }

    /// [`Tensor::lerp`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`crate::Error::Shape`] when the shapes do not broadcast.
    #[track_caller]
    pub fn try_lerp(&self, end: &Tensor, weight: &Tensor) -> Result<Tensor> {
        let diff = end.try_sub(self)?;
        let low = self.try_add(weight.try_mul(&diff)?)?;
        let high = end.try_sub(diff.try_mul(&(1.0 - weight))?)?;
        Tensor::try_where_(&weight.lt(0.5), &low, &high)
    }

    /// Hyperbolic sine, `(e^x - e^-x) / 2` from two `expm1`s, so tiny `x` keep their digits.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1e-10f64, 1.0, -2.0], [3]);
    /// let (s, c) = (x.sinh().to_vec::<f64>(), x.cosh().to_vec::<f64>());
    /// assert!((s[0] - 1e-10).abs() < 1e-25 && (s[1] - 1f64.sinh()).abs() < 1e-15);
    /// assert!((c[2] - 2f64.cosh()).abs() < 1e-14);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn sinh(&self) -> Tensor {
        let x = self.floating();
        (x.expm1() - (-&x).expm1()) * 0.5
    }

    /// Hyperbolic cosine, `(e^x + e^-x) / 2`.
    #[must_use]
    #[track_caller]
    pub fn cosh(&self) -> Tensor {
        let x = self.floating();
        (x.exp() + (-&x).exp()) * 0.5
    }

    /// Inverse hyperbolic sine: `sign(x)·log1p(|x| + x²/(1 + √(1 + x²)))`, accurate near 0,
    /// and `sign(x)·(ln|x| + ln 2)` above 2²⁸ where `x²` would lose the rest.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1e-12f64, -3.0, 1e200], [3]);
    /// let y = x.asinh().to_vec::<f64>();
    /// assert!((y[0] - 1e-12).abs() < 1e-27 && (y[1] - (-3f64).asinh()).abs() < 1e-15);
    /// assert!((y[2] - 1e200f64.asinh()).abs() < 1e-12);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn asinh(&self) -> Tensor {
        let x = self.floating();
        let a = x.abs();
        let big = a.gt(BIG);
        // Where the large-argument branch is taken, the other one sees 1 (no overflow).
        let small = Tensor::where_(&big, 1.0, &a);
        let near = (&small + small.square() / (small.square() + 1.0).sqrt().add(1.0)).log1p();
        let far = a.log() + std::f64::consts::LN_2;
        let magnitude = Tensor::where_(&big, far, near);
        Tensor::where_(&x.lt(0.0), -&magnitude, &magnitude)
    }

    /// Inverse hyperbolic cosine: `log1p((x - 1) + √((x - 1)(x + 1)))`, accurate near 1, and
    /// `ln x + ln 2` above 2²⁸; NaN below 1.
    #[must_use]
    #[track_caller]
    pub fn acosh(&self) -> Tensor {
        let x = self.floating();
        let big = x.gt(BIG);
        let small = Tensor::where_(&big, 1.0, &x);
        let t = &small - 1.0;
        let near = (&t + (&t * (&small + 1.0)).sqrt()).log1p();
        Tensor::where_(&big, x.log() + std::f64::consts::LN_2, near)
    }

    /// Inverse hyperbolic tangent: `log1p(2x / (1 - x)) / 2`, accurate near 0; `±inf` at
    /// `±1`, NaN beyond.
    #[must_use]
    #[track_caller]
    pub fn atanh(&self) -> Tensor {
        let x = self.floating();
        ((&x * 2.0) / (1.0 - &x)).log1p() * 0.5
    }

    /// `√(a² + b²)` without overflow or underflow (PyTorch's `hypot`): the larger magnitude
    /// times `√(1 + (smaller/larger)²)`.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let a = Tensor::from_vec(vec![3e200f64, 0.0], [2]);
    /// let b = Tensor::from_vec(vec![4e200f64, 0.0], [2]);
    /// let h = a.hypot(&b).to_vec::<f64>();
    /// assert!((h[0] / 5e200 - 1.0).abs() < 1e-15 && h[1] == 0.0);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_hypot`] fails.
    #[must_use]
    #[track_caller]
    pub fn hypot(&self, other: &Tensor) -> Tensor {
        crate::error::ok(self.try_hypot(other))
    }

    /// [`Tensor::hypot`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`crate::Error::Shape`] when the shapes do not broadcast.
    #[track_caller]
    pub fn try_hypot(&self, other: &Tensor) -> Result<Tensor> {
        let (a, b) = (self.floating().abs(), other.floating().abs());
        let larger = a.try_maximum(&b)?;
        let smaller = a.try_minimum(&b)?;
        // 0/0 where both are 0: the ratio is taken as 0 there.
        let safe = Tensor::where_(&larger.eq(0.0), 1.0, &larger);
        let ratio = smaller / &safe;
        let y = &larger * (ratio.square() + 1.0).sqrt();
        // inf/inf is NaN: an infinite side makes the result infinite, even beside NaN (as
        // C's hypot).
        let infinite = a.isinf().try_logical_or(b.isinf())?;
        Tensor::try_where_(&infinite, f64::INFINITY, &y)
    }
}

/// Where the inverse hyperbolic functions switch to their large-argument forms: `x²` has
/// no room for the `1` beyond it.
const BIG: f64 = 268_435_456.0;
