//! `erfinv`, composed of elementwise primitives: an initial value within about 1e-7, then
//! Newton's method on `erf` (or, past 1/2, on `ln erfc`, which stays well conditioned up to
//! `x = 1 - 1e-16`). Every step differentiates, so the gradient (and the second) is the
//! derivative of the expression, equal to `√π/2 · e^(y²)` to within rounding.

use super::Tensor;

/// Giles' single-precision coefficients ("Approximating the erfinv function", GPU Computing
/// Gems, 2011), highest power first: for `w = -ln(1 - x²) < 5` in `w - 2.5` ...
const CENTRAL: [f64; 9] = [
    2.810_226_36e-08,
    3.432_739_39e-07,
    -3.523_387_7e-06,
    -4.391_506_54e-06,
    0.000_218_580_87,
    -0.001_253_725_03,
    -0.004_177_681_64,
    0.246_640_727,
    1.501_409_41,
];
/// ... and for `w ≥ 5` in `√w - 3`.
const OUTER: [f64; 9] = [
    -0.000_200_214_257,
    0.000_100_950_558,
    0.001_349_343_22,
    -0.003_673_428_44,
    0.005_739_507_73,
    -0.007_622_461_3,
    0.009_438_870_47,
    1.001_674_06,
    2.832_976_82,
];
/// Past this `w` (`1 - |x|` below about 1e-7) the polynomials are out of their range and the
/// asymptotic `erfc(y) ≈ e^(-y²) / (y√π)` starts instead.
const TAIL: f64 = 16.0;
/// Three Newton steps take 1e-3 (the asymptotic start) to rounding; 1e-7 needs two.
const STEPS: usize = 3;

impl Tensor {
    /// The inverse error function (PyTorch's `erfinv`): `erf(erfinv(x)) = x` on `(-1, 1)`,
    /// `±inf` at `±1`, NaN outside. Computed in f64 and rounded to the input's float type;
    /// within a few units of 1e-16 (relative) in f64.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let y = Tensor::from_vec(vec![0.5f64, -0.999, 1.0], [3]).erfinv().to_vec::<f64>();
    /// assert!((y[0] - 0.476_936_276_204_469_9).abs() < 1e-15);
    /// assert!((y[1] + 2.326_753_765_513_524_6).abs() < 1e-14);
    /// assert_eq!(y[2], f64::INFINITY);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn erfinv(&self) -> Tensor {
        let x = self.floating().double();
        // |x| as x times its sign held constant, so that the gradient reaches x = 0.
        let sign = Tensor::where_(&x.lt(0.0), -1.0, 1.0);
        let a = &x * &sign;
        // The steps run on a safe stand-in where the answer is not theirs (|x| ≥ 1, NaN), so
        // that no infinity reaches a gradient through an unused branch.
        let inside = a.lt(1.0);
        let a = Tensor::where_(&inside, &a, 0.5);
        let mut y = start(&a);
        let central = a.le(0.5);
        let (a_central, a_outer) =
            (Tensor::where_(&central, &a, 0.25), Tensor::where_(&central, 0.75, &a));
        let log_q = (-&a_outer).log1p();
        for _ in 0..STEPS {
            let (y_central, y_outer) =
                (Tensor::where_(&central, &y, 0.25), Tensor::where_(&central, 1.0, &y));
            let slope = |y: &Tensor| (-y.square()).exp() * std::f64::consts::FRAC_2_SQRT_PI;
            // Near 0: erf(y) = a. Past 1/2: ln erfc(y) = ln(1 - a), whose slope is about -2y.
            let central_step = (y_central.erf() - &a_central) / slope(&y_central);
            let e = y_outer.erfc();
            let outer_step = (e.log() - &log_q) / (-slope(&y_outer) / &e);
            y = &y - Tensor::where_(&central, &central_step, &outer_step);
        }
        // At ±0 the answer is x·√π/2: its sign and its slope.
        let y = Tensor::where_(&x.eq(0.0), &x * (std::f64::consts::PI.sqrt() / 2.0), &(y * sign));
        let edge = Tensor::where_(&x.abs().eq(1.0), x.sign() * f64::INFINITY, f64::NAN);
        Tensor::where_(&inside, &y, &edge).to_dtype(self.floating().dtype())
    }
}

/// The starting value for `a = |x|` in `[0, 1)`: Giles' polynomials, or the asymptotic tail.
fn start(a: &Tensor) -> Tensor {
    let w = -((1.0 - a) * (1.0 + a)).log();
    let polynomial = |coeffs: &[f64], t: &Tensor| {
        coeffs.iter().skip(1).fold(t.full_like(coeffs[0]), |p, &c| p * t + c)
    };
    let near = w.lt(5.0);
    let central = polynomial(&CENTRAL, &(Tensor::where_(&near, &w, 2.5) - 2.5));
    let outer = polynomial(&OUTER, &(Tensor::where_(&near, 9.0, &w).sqrt() - 3.0));
    let from_polynomials = Tensor::where_(&near, &central, &outer) * a;
    // y² = L - ln y with L = -ln((1 - a)√π), by two fixed-point steps from y = √L.
    let tail = w.ge(TAIL);
    let q = Tensor::where_(&tail, 1.0 - a, 1e-8);
    let l = -(q * std::f64::consts::PI.sqrt()).log();
    let y = (&l - l.sqrt().log()).sqrt();
    let y = (&l - y.log()).sqrt();
    Tensor::where_(&tail, &y, &from_polynomials)
}
