//! `lgamma` and `digamma`, composed of elementwise primitives (so they fuse and
//! differentiate: `lgamma`'s gradient is the derivative of its own expression, within the
//! accuracy of `digamma`). Both compute in f64 and round to the input's float type.

use std::f64::consts::PI;

use super::Tensor;

/// Lanczos' coefficients for `g = 7`, `n = 9` (relative error about 1e-15 on the real line).
const LANCZOS_G: f64 = 7.0;
const LANCZOS: [f64; 9] = [
    0.999_999_999_999_809_9,
    676.520_368_121_885_1,
    -1_259.139_216_722_402_8,
    771.323_428_777_653_1,
    -176.615_029_162_140_6,
    12.507_343_278_686_905,
    -0.138_571_095_265_720_12,
    9.984_369_578_019_572e-6,
    1.505_632_735_149_311_6e-7,
];

impl Tensor {
    /// `ln|Γ(x)|` (PyTorch's `lgamma`): Lanczos' approximation for `x ≥ 1/2` and the
    /// reflection `ln π - ln|sin πx| - lnΓ(1 - x)` below; `+∞` at zero and the negative
    /// integers and at `+∞`. Within about 1e-14 of the true value (absolute where it is
    /// below 1, relative above).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let y = Tensor::from_vec(vec![0.5f64, 5.0, -2.5], [3]).lgamma().to_vec::<f64>();
    /// assert!((y[0] - std::f64::consts::PI.sqrt().ln()).abs() < 1e-14);
    /// assert!((y[1] - 24f64.ln()).abs() < 1e-13);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn lgamma(&self) -> Tensor {
        let x = self.floating().double();
        let left = x.lt(0.5);
        // Below 1/2 the argument is reflected: 1 - x ≥ 1/2.
        let z = Tensor::where_(&left, 1.0 - &x, &x) - 1.0;
        let mut a = z.full_like(LANCZOS[0]);
        for (i, &c) in LANCZOS.iter().enumerate().skip(1) {
            a = a + c / (&z + i as f64);
        }
        let t = &z + (LANCZOS_G + 0.5);
        let right = (&z + 0.5) * t.log() - &t + a.log() + 0.5 * (2.0 * PI).ln();
        // |sin πx| from the distance to the nearest integer, exact for any x.
        let r = &x - x.round();
        let reflected = PI.ln() - (r * PI).sin().abs().log() - &right;
        let y = Tensor::where_(&left, &reflected, &right);
        let pole = x.le(0.0).logical_and(x.eq(x.floor()));
        let y = Tensor::where_(&pole.logical_or(x.eq(f64::INFINITY)), f64::INFINITY, &y);
        y.to_dtype(self.floating().dtype())
    }

    /// The digamma function `ψ(x) = d/dx ln Γ(x)` (PyTorch's `digamma`): for `x ≥ 1/2` the
    /// recurrence to `x + 10` and the asymptotic series there, below the reflection
    /// `ψ(1 - x) - π / tan πx`; `-∞` at zero and NaN at the negative integers, as PyTorch.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let euler = 0.577_215_664_901_532_9;
    /// let y = Tensor::from_vec(vec![1.0f64, 2.0], [2]).digamma().to_vec::<f64>();
    /// assert!((y[0] + euler).abs() < 1e-14 && (y[1] - (1.0 - euler)).abs() < 1e-14);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn digamma(&self) -> Tensor {
        let x = self.floating().double();
        let left = x.lt(0.5);
        let z = Tensor::where_(&left, 1.0 - &x, &x);
        // ψ(z) = ψ(z + 10) - Σ 1/(z + k), then the series in 1/y² at y = z + 10.
        let mut shift = z.zeros_like();
        for k in 0..10 {
            shift = shift + 1.0 / (&z + k as f64);
        }
        let y = &z + 10.0;
        let w = 1.0 / y.square();
        // 1/12 - 1/120 w + 1/252 w² - 1/240 w³ + 1/132 w⁴ - 691/32760 w⁵ + 1/12 w⁶, times w.
        let coeffs = [
            1.0 / 12.0,
            -1.0 / 120.0,
            1.0 / 252.0,
            -1.0 / 240.0,
            1.0 / 132.0,
            -691.0 / 32760.0,
            1.0 / 12.0,
        ];
        let series = coeffs.iter().rev().fold(w.zeros_like(), |acc, &c| acc * &w + c) * &w;
        let right = y.log() - 0.5 / &y - series - shift;
        let r = &x - x.round();
        let reflected = &right - PI / (r * PI).tan();
        let value = Tensor::where_(&left, &reflected, &right);
        let zero = x.eq(0.0);
        let negative_integer = x.lt(0.0).logical_and(x.eq(x.floor()));
        let value = Tensor::where_(&negative_integer, f64::NAN, &value);
        let value = Tensor::where_(&zero, f64::NEG_INFINITY, &value);
        let value = Tensor::where_(&x.eq(f64::INFINITY), f64::INFINITY, &value);
        value.to_dtype(self.floating().dtype())
    }
}
