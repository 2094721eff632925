//! Vectorized `exp`, `tanh`, `sigmoid`, `erf`, `log`, `sin`, `cos` and `pow` for `f32x4`, as
//! inline polynomials (Cranelift has no transcendental instructions, and a call per lane
//! would cost more than the math). Horner steps use fused multiply-add where the host has it.
//!
//! The approximations are Cephes' `expf` and `tanhf`: `exp` reduces `x = n ln 2 + r` with
//! `|r| <= ln 2 / 2`, evaluates a degree-6 polynomial and scales by `2^n` built in the
//! exponent bits; `tanh` uses an odd polynomial below `|x| = 0.625` and `1 - 2 / (e^{2|x|} + 1)`
//! above; `sigmoid` is `1 / (1 + e^{-x})`. `sin` and `cos` reduce the argument by `π/2` in
//! f64 (a three-part Cody-Waite split, exact up to `|x| = 2^23`) and evaluate Cephes' `sinf`
//! and `cosf` polynomials in f32; beyond `2^23`, and for infinities and NaN, the lanes go to
//! the scalar f64 functions. `pow` computes `e^{y ln |x|}` in f64 lanes (a series for `ln`
//! and a Taylor polynomial for `exp`, both far more precise than f32 needs), so its error
//! does not grow with `|y ln x|`; zero, infinite and NaN operands and negative bases with
//! fractional exponents go to the scalar function, which implements IEEE's special cases.
//!
//! Measured errors against f64, over inputs whose results are normal floats (the tests of
//! this crate enforce the bounds): `exp` at most 2 ULP, `tanh` at most 3, `sigmoid` at most 4,
//! `erf` at most 2, `log` at most 1, `sin` and `cos` at most 2 (including the f32 inputs
//! nearest to multiples of `π/2`), `pow` at most 1. `exp` overflows to infinity where f32
//! does; below about `-87` (where the result leaves the normal range) it returns 0, so
//! `exp(-inf)` is exactly 0 and the absolute error there is below `1.7e-38`. NaN propagates.

#![allow(
    clippy::excessive_precision,
    reason = "Cephes' published coefficients, as published; the compiler rounds them"
)]

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Value, types};
use cranelift_frontend::FunctionBuilder;

/// A function builder and what the host's vector unit offers.
pub(super) struct Math<'r, 'f> {
    pub(super) b: &'r mut FunctionBuilder<'f>,
    /// Fused multiply-add is available (x86 `has_fma`, always on aarch64): a Horner step is
    /// one instruction instead of two, and rounds once.
    pub(super) fma: bool,
}

impl Math<'_, '_> {
    /// `a * x + c`, fused when the host can.
    fn mul_add(&mut self, a: Value, x: Value, c: Value) -> Value {
        if self.fma {
            self.b.ins().fma(a, x, c)
        } else {
            let p = self.b.ins().fmul(a, x);
            self.b.ins().fadd(p, c)
        }
    }
}

fn splat(m: &mut Math<'_, '_>, v: f32) -> Value {
    let s = m.b.ins().f32const(v);
    m.b.ins().splat(types::F32X4, s)
}

fn isplat(m: &mut Math<'_, '_>, v: i32) -> Value {
    let s = m.b.ins().iconst(types::I32, i64::from(v));
    m.b.ins().splat(types::I32X4, s)
}

/// `min(x, hi)`, keeping a NaN `x`: one `minps` (written `hi < x` so that the x86 backend
/// matches it), where Cranelift's NaN-propagating `fmin` takes about nine instructions.
fn clamp_above(m: &mut Math<'_, '_>, x: Value, hi: Value) -> Value {
    let over = m.b.ins().fcmp(FloatCC::LessThan, hi, x);
    let ty = m.b.func.dfg.value_type(x);
    let mask = m.b.ins().bitcast(ty, MemFlagsData::new(), over);
    m.b.ins().bitselect(mask, hi, x)
}

/// `max(x, lo)`, keeping a NaN `x`.
fn clamp_below(m: &mut Math<'_, '_>, x: Value, lo: Value) -> Value {
    let under = m.b.ins().fcmp(FloatCC::LessThan, x, lo);
    let ty = m.b.func.dfg.value_type(x);
    let mask = m.b.ins().bitcast(ty, MemFlagsData::new(), under);
    m.b.ins().bitselect(mask, lo, x)
}

/// Cephes' `expf` polynomial, highest degree first (shared with `wide.rs`).
pub(super) const EXP_P: [f32; 6] =
    [1.987_569_2e-4f32, 1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5.000_000_1e-1];

/// Cephes' `tanhf` polynomial for small arguments, highest degree first.
pub(super) const TANH_P: [f32; 5] =
    [-5.704_988_7e-3f32, 2.063_908_9e-2, -5.373_971_6e-2, 1.333_144_2e-1, -3.333_328_2e-1];

/// `e^x` for four lanes.
pub(super) fn exp(m: &mut Math<'_, '_>, x: Value) -> Value {
    // Above 88.73 the result overflows to infinity. Below about -87 it would leave the
    // normal range: the exponent bits built below saturate at 0 there, so those lanes give 0
    // (exactly what `-inf` and masked scores in a softmax need; the true value is below
    // 1.7e-38). The clamp at -88 keeps `n` within the integer trick's range.
    let hi = splat(m, 88.73);
    let lo = splat(m, -88.0);
    let x = clamp_above(m, x, hi);
    let x = clamp_below(m, x, lo);
    let log2e = splat(m, std::f32::consts::LOG2_E);
    let t = m.b.ins().fmul(x, log2e);
    // n = round(t), half to even: adding 1.5 * 2^23 rounds |t| < 2^22 to an integer and
    // leaves it in the low mantissa bits, which build 2^n below without a conversion.
    let magic = splat(m, 12_582_912.0);
    let shifted = m.b.ins().fadd(t, magic);
    let n = m.b.ins().fsub(shifted, magic);
    // r = x - n ln2, with ln2 split in two parts for precision.
    let c1 = splat(m, -0.693_359_4);
    let c2 = splat(m, 2.121_944_4e-4);
    let r = m.mul_add(n, c1, x);
    let r = m.mul_add(n, c2, r);
    let p = horner(m, r, &EXP_P);
    let r2 = m.b.ins().fmul(r, r);
    let p = m.mul_add(p, r2, r);
    let one = splat(m, 1.0);
    let y = m.b.ins().fadd(p, one);
    // 2^n as (2 y) 2^(n-1), with 2^(n-1) built in the exponent bits: n is integral and in
    // [-127, 128]; n - 1 is a normal exponent down to n = -125 (below, the bits saturate to
    // +0.0), and 2^128 overflows only through the product.
    let bits = m.b.ins().bitcast(types::I32X4, MemFlagsData::new(), shifted);
    let bias = isplat(m, 126 - 0x4b40_0000); // n - 1 + 127, less the magic number's bits
    let e = m.b.ins().iadd(bits, bias);
    let none = isplat(m, 0);
    let e = m.b.ins().smax(e, none);
    let e = m.b.ins().ishl_imm_u(e, 23);
    let scale = m.b.ins().bitcast(types::F32X4, MemFlagsData::new(), e);
    let y2 = m.b.ins().fadd(y, y);
    m.b.ins().fmul(y2, scale)
}

/// `tanh(x)` for four lanes.
pub(super) fn tanh(m: &mut Math<'_, '_>, x: Value) -> Value {
    let ax = m.b.ins().fabs(x);
    // Small |x|: x + x^3 P(x^2).
    let z = m.b.ins().fmul(x, x);
    let p = horner(m, z, &TANH_P);
    let p = m.b.ins().fmul(p, z);
    let small = m.mul_add(p, x, x);
    // Large |x|: sign(x) (1 - 2 / (e^{2|x|} + 1)), with |x| capped at 10, past which tanh rounds to 1 in f32.
    let cap = splat(m, 10.0);
    let capped = clamp_above(m, ax, cap);
    let two_x = m.b.ins().fadd(capped, capped);
    let e = exp(m, two_x);
    let one = splat(m, 1.0);
    let two = splat(m, 2.0);
    let d = m.b.ins().fadd(e, one);
    let q = m.b.ins().fdiv(two, d);
    let large = m.b.ins().fsub(one, q);
    let large = with_sign_of(m, large, x);
    let threshold = splat(m, 0.625);
    let is_small = m.b.ins().fcmp(FloatCC::LessThan, ax, threshold);
    let mask = m.b.ins().bitcast(types::F32X4, MemFlagsData::new(), is_small);
    // NaN compares false, takes the large branch, and stays NaN through exp.
    m.b.ins().bitselect(mask, small, large)
}

/// `1 / (1 + e^{-x})` for four lanes.
pub(super) fn sigmoid(m: &mut Math<'_, '_>, x: Value) -> Value {
    let nx = m.b.ins().fneg(x);
    let e = exp(m, nx);
    let one = splat(m, 1.0);
    let d = m.b.ins().fadd(e, one);
    m.b.ins().fdiv(one, d)
}

/// `magnitude` (non-negative) with the sign bit of `x`.
fn with_sign_of(m: &mut Math<'_, '_>, magnitude: Value, x: Value) -> Value {
    let sign_mask = isplat(m, i32::MIN);
    let xbits = m.b.ins().bitcast(types::I32X4, MemFlagsData::new(), x);
    let sign = m.b.ins().band(xbits, sign_mask);
    let mbits = m.b.ins().bitcast(types::I32X4, MemFlagsData::new(), magnitude);
    let signed = m.b.ins().bor(mbits, sign);
    m.b.ins().bitcast(types::F32X4, MemFlagsData::new(), signed)
}

/// `c[0] z^(n-1) + ... + c[n-1]` by Horner's rule.
fn horner(m: &mut Math<'_, '_>, z: Value, coeffs: &[f32]) -> Value {
    let mut p = splat(m, coeffs[0]);
    for &c in &coeffs[1..] {
        let cv = splat(m, c);
        p = m.mul_add(p, z, cv);
    }
    p
}

/// `erf`'s two branches meet at `|x| = 475/512`.
pub(super) const ERF_EDGE: f32 = 0.927_734_4;
/// `erf(x) = x + x p(x^2)` below the edge: `p`'s coefficients, highest first.
pub(super) const ERF_SMALL: [f32; 6] = [
    -5.967_617e-4,
    4.991_194_2e-3,
    -2.676_813_5e-2,
    1.128_199_3e-1,
    -3.761_253_4e-1,
    1.283_791_7e-1,
];
/// `erf(t) = 1 - e^{q(t)}` above it, `q(t) = (HI(t) t^2 + MID(t))` then `LO` by Horner, then
/// `· t - t`.
pub(super) const ERF_LARGE_HI: [f32; 2] = [-1.728_534_7e-5, 3.831_971_3e-4];
pub(super) const ERF_LARGE_MID: [f32; 2] = [-3.883_964_4e-3, 2.425_462_2e-2];
pub(super) const ERF_LARGE_LO: [f32; 3] = [-1.067_778_8e-1, -6.348_467e-1, -1.287_175_1e-1];

/// `erf(x)` for four lanes, without a division (Norbert Juffa's `erff`, under 1 ulp with
/// fused multiply-adds and an exact `exp`): below `|x| = 0.9277`, `x + x p(x^2)`; above,
/// `1 - e^{q(|x|)}` with the sign of `x`, where `q` is a degree-7 polynomial whose two
/// highest-order pairs are evaluated side by side and joined by `t^2` (fewer dependent steps).
/// `|x|` is capped at 10, where the result is `±1` in f32 (so infinities give `±1`); NaN
/// takes the second branch and propagates. Half the work of a rational form with `1/x`,
/// which matters to GELU, whose erf dominates a transformer MLP's elementwise time.
pub(super) fn erf(m: &mut Math<'_, '_>, x: Value) -> Value {
    let ax = m.b.ins().fabs(x);
    let s = m.b.ins().fmul(x, x);
    let p = horner(m, s, &ERF_SMALL);
    let small = m.mul_add(p, x, x);

    let cap = splat(m, 10.0);
    let t = clamp_above(m, ax, cap);
    let t2 = m.b.ins().fmul(t, t);
    let r = horner(m, t, &ERF_LARGE_HI);
    let u = horner(m, t, &ERF_LARGE_MID);
    let mut r = m.mul_add(r, t2, u);
    for c in ERF_LARGE_LO {
        let c = splat(m, c);
        r = m.mul_add(r, t, c);
    }
    let neg_t = m.b.ins().fneg(t);
    let r = m.mul_add(r, t, neg_t);
    let e = exp(m, r);
    let one = splat(m, 1.0);
    let large = m.b.ins().fsub(one, e);
    let large = with_sign_of(m, large, x);

    let edge = splat(m, ERF_EDGE);
    let is_small = m.b.ins().fcmp(FloatCC::LessThan, ax, edge);
    let mask = m.b.ins().bitcast(types::F32X4, MemFlagsData::new(), is_small);
    m.b.ins().bitselect(mask, small, large)
}

/// `ln(x)` for four lanes: Cephes' `logf`. `x = m 2^e` with `m` in `[√½, √2)`, then
/// `ln(1 + f) ≈ f - f²/2 + f³ P(f)` and `e ln 2` added in two parts. Subnormal inputs are
/// scaled into the normal range first; `ln(0) = -inf`, `ln(inf) = inf`, negative inputs and
/// NaN give NaN.
pub(super) fn log(m: &mut Math<'_, '_>, x: Value) -> Value {
    const P: [f32; 9] = [
        7.0376836292e-2,
        -1.1514610310e-1,
        1.1676998740e-1,
        -1.2420140846e-1,
        1.4249322787e-1,
        -1.6668057665e-1,
        2.0000714765e-1,
        -2.4999993993e-1,
        3.3333331174e-1,
    ];
    let flags = MemFlagsData::new();
    let as_f = |m: &mut Math<'_, '_>, v: Value| m.b.ins().bitcast(types::F32X4, flags, v);
    let as_i = |m: &mut Math<'_, '_>, v: Value| m.b.ins().bitcast(types::I32X4, flags, v);
    // Subnormals: multiply by 2^23 and take 23 off the exponent.
    let min_normal = splat(m, f32::MIN_POSITIVE);
    let tiny = m.b.ins().fcmp(FloatCC::LessThan, x, min_normal);
    let scale = splat(m, 8_388_608.0);
    let scaled = m.b.ins().fmul(x, scale);
    let tiny_f = as_f(m, tiny);
    let xs = m.b.ins().bitselect(tiny_f, scaled, x);
    let bits = as_i(m, xs);
    let exp_bits = m.b.ins().ushr_imm_u(bits, 23);
    let byte = isplat(m, 0xff);
    let exp_bits = m.b.ins().band(exp_bits, byte);
    let bias = isplat(m, 126);
    let e = m.b.ins().isub(exp_bits, bias);
    let adjust = isplat(m, 23);
    let zero_i = isplat(m, 0);
    let tiny_i = as_i(m, tiny);
    let adjust = m.b.ins().bitselect(tiny_i, adjust, zero_i);
    let e = m.b.ins().isub(e, adjust);
    let mant_mask = isplat(m, 0x807f_ffff_u32 as i32);
    let half_bits = isplat(m, 0x3f00_0000);
    let mant = m.b.ins().band(bits, mant_mask);
    let mant = m.b.ins().bor(mant, half_bits);
    let mant = as_f(m, mant);
    // Below √½, use 2m and one less in the exponent.
    let sqrt_half = splat(m, std::f32::consts::FRAC_1_SQRT_2);
    let low = m.b.ins().fcmp(FloatCC::LessThan, mant, sqrt_half);
    let low_i = as_i(m, low);
    let one_i = isplat(m, 1);
    let dec = m.b.ins().bitselect(low_i, one_i, zero_i);
    let e = m.b.ins().isub(e, dec);
    let e = m.b.ins().fcvt_from_sint(types::F32X4, e);
    let one = splat(m, 1.0);
    let zero = splat(m, 0.0);
    let f = m.b.ins().fsub(mant, one);
    let low_f = as_f(m, low);
    let extra = m.b.ins().bitselect(low_f, mant, zero);
    let f = m.b.ins().fadd(f, extra);
    let z = m.b.ins().fmul(f, f);
    let p = horner(m, f, &P);
    let y = m.b.ins().fmul(p, f);
    let y = m.b.ins().fmul(y, z);
    let q1 = splat(m, -2.12194440e-4);
    let y = m.mul_add(e, q1, y);
    let minus_half = splat(m, -0.5);
    let y = m.mul_add(z, minus_half, y);
    let r = m.b.ins().fadd(f, y);
    let q2 = splat(m, 0.693359375);
    let r = m.mul_add(e, q2, r);
    // Special values, last to first in priority.
    let inf = splat(m, f32::INFINITY);
    let is_inf = m.b.ins().fcmp(FloatCC::Equal, x, inf);
    let is_inf = as_f(m, is_inf);
    let r = m.b.ins().bitselect(is_inf, inf, r);
    let is_zero = m.b.ins().fcmp(FloatCC::Equal, x, zero);
    let is_zero = as_f(m, is_zero);
    let neg_inf = splat(m, f32::NEG_INFINITY);
    let r = m.b.ins().bitselect(is_zero, neg_inf, r);
    let invalid = m.b.ins().fcmp(FloatCC::UnorderedOrLessThan, x, zero);
    let invalid = as_f(m, invalid);
    let nan = splat(m, f32::NAN);
    m.b.ins().bitselect(invalid, nan, r)
}

/// Inputs of `sin` and `cos` up to this magnitude take the vector path; larger ones, infinities
/// and NaN go to the scalar f64 functions lane by lane (the reduction below is exact only
/// while `x 2/π` stays under `2^23`).
pub(super) const TRIG_LIMIT: f32 = 8_388_608.0;

/// `x` as bytes, for shuffles.
fn as_bytes(m: &mut Math<'_, '_>, x: Value) -> Value {
    let flags = MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
    m.b.ins().bitcast(types::I8X16, flags, x)
}

fn bytes_as(m: &mut Math<'_, '_>, x: Value, ty: types::Type) -> Value {
    let flags = MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little);
    m.b.ins().bitcast(ty, flags, x)
}

fn shuffle(m: &mut Math<'_, '_>, a: Value, b: Value, mask: [u8; 16]) -> Value {
    let imm = m.b.func.dfg.immediates.push(mask.to_vec().into());
    m.b.ins().shuffle(a, b, imm)
}

/// Four f32 lanes as two f64x2 vectors (lanes 0-1 and 2-3), exactly.
pub(super) fn widen(m: &mut Math<'_, '_>, x: Value) -> (Value, Value) {
    let lo = m.b.ins().fvpromote_low(x);
    let bytes = as_bytes(m, x);
    let high_first =
        shuffle(m, bytes, bytes, [8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7]);
    let high_first = bytes_as(m, high_first, types::F32X4);
    let hi = m.b.ins().fvpromote_low(high_first);
    (lo, hi)
}

/// The inverse of [`widen`], rounding each lane to f32.
fn narrow(m: &mut Math<'_, '_>, lo: Value, hi: Value) -> Value {
    let lo = m.b.ins().fvdemote(lo);
    let hi = m.b.ins().fvdemote(hi);
    let (lo, hi) = (as_bytes(m, lo), as_bytes(m, hi));
    let joined = shuffle(m, lo, hi, [0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23]);
    bytes_as(m, joined, types::F32X4)
}

fn splat64(m: &mut Math<'_, '_>, v: f64) -> Value {
    let s = m.b.ins().f64const(v);
    m.b.ins().splat(types::F64X2, s)
}

/// Cody-Waite reduction of two f64 lanes: `x = j π/2 + r`, returning `r` and `j mod 4`
/// (after adding `shift` quadrants). `π/2` is split in three parts, the first two of 30
/// significant bits, so `j p1` and `j p2` are exact for `j < 2^23` and `r` carries about
/// 2^-53 relative error however close `x` is to a multiple of `π/2`.
fn reduce_quadrant(m: &mut Math<'_, '_>, x: Value, shift: f64) -> (Value, Value) {
    let two_over_pi = splat64(m, std::f64::consts::FRAC_2_PI);
    let t = m.b.ins().fmul(x, two_over_pi);
    let j = m.b.ins().nearest(t);
    let mut r = x;
    for p in [1.570_796_327_665_448_2, -8.705_515_692_000_731e-10, -3.503_434_398_089_93e-19] {
        let pv = splat64(m, p);
        let jp = m.b.ins().fmul(j, pv);
        r = m.b.ins().fsub(r, jp);
    }
    let shift = splat64(m, shift);
    let j = m.b.ins().fadd(j, shift);
    let quarter = splat64(m, 0.25);
    let four = splat64(m, 4.0);
    let jq = m.b.ins().fmul(j, quarter);
    let jq = m.b.ins().floor(jq);
    let jq4 = m.b.ins().fmul(jq, four);
    let q = m.b.ins().fsub(j, jq4);
    (r, q)
}

/// `sin(x)` (`cos = false`) or `cos(x)` for four lanes with `|x| <= TRIG_LIMIT`: Cephes'
/// `sinf`/`cosf` polynomials on an argument reduced in f64. Other lanes give garbage; the
/// caller sends them to the scalar functions.
pub(super) fn sin_cos(m: &mut Math<'_, '_>, x: Value, cos: bool) -> Value {
    let ax = m.b.ins().fabs(x);
    let (lo, hi) = widen(m, ax);
    let shift = if cos { 1.0 } else { 0.0 };
    let (r_lo, q_lo) = reduce_quadrant(m, lo, shift);
    let (r_hi, q_hi) = reduce_quadrant(m, hi, shift);
    let r = narrow(m, r_lo, r_hi);
    let q = narrow(m, q_lo, q_hi);
    let z = m.b.ins().fmul(r, r);
    // sin r = r + r z S(z)
    let s = horner(m, z, &[-1.951_529_589_1e-4, 8.332_160_873_6e-3, -1.666_665_461_1e-1]);
    let rz = m.b.ins().fmul(r, z);
    let sin_r = m.mul_add(rz, s, r);
    // cos r = 1 - z/2 + z² C(z)
    let c = horner(
        m,
        z,
        &[2.443_315_711_809_948e-5, -1.388_731_625_493_765e-3, 4.166_664_568_298_827e-2],
    );
    let z2 = m.b.ins().fmul(z, z);
    let minus_half = splat(m, -0.5);
    let one = splat(m, 1.0);
    let c0 = m.mul_add(z, minus_half, one);
    let cos_r = m.mul_add(z2, c, c0);
    // Quadrants 1 and 3 take the cosine; 2 and 3 are negated.
    let flags = MemFlagsData::new();
    let lane_mask = |m: &mut Math<'_, '_>, a: f32, b: f32| {
        let av = splat(m, a);
        let bv = splat(m, b);
        let is_a = m.b.ins().fcmp(FloatCC::Equal, q, av);
        let is_b = m.b.ins().fcmp(FloatCC::Equal, q, bv);
        m.b.ins().bor(is_a, is_b)
    };
    let odd = lane_mask(m, 1.0, 3.0);
    let negative = lane_mask(m, 2.0, 3.0);
    let odd_f = m.b.ins().bitcast(types::F32X4, flags, odd);
    let y = m.b.ins().bitselect(odd_f, cos_r, sin_r);
    let sign_bit = isplat(m, i32::MIN);
    let mut flip = m.b.ins().band(negative, sign_bit);
    if !cos {
        // sin is odd: the input's sign joins the quadrant's.
        let xbits = m.b.ins().bitcast(types::I32X4, flags, x);
        let xsign = m.b.ins().band(xbits, sign_bit);
        flip = m.b.ins().bxor(flip, xsign);
    }
    let ybits = m.b.ins().bitcast(types::I32X4, flags, y);
    let ybits = m.b.ins().bxor(ybits, flip);
    m.b.ins().bitcast(types::F32X4, flags, ybits)
}

fn isplat64(m: &mut Math<'_, '_>, v: i64) -> Value {
    let s = m.b.ins().iconst(types::I64, v);
    m.b.ins().splat(types::I64X2, s)
}

/// [`horner`] on f64 lanes.
fn horner64(m: &mut Math<'_, '_>, z: Value, coeffs: &[f64]) -> Value {
    let mut p = splat64(m, coeffs[0]);
    for &c in &coeffs[1..] {
        let cv = splat64(m, c);
        p = m.mul_add(p, z, cv);
    }
    p
}

/// `x^y` for two f64 lanes with `x > 0` finite, accurate to about 2^-40 relative: enough that
/// rounding to f32 is within one ULP for any `y`. `ln x = e ln 2 + 2 atanh((m-1)/(m+1))` with
/// `m` in `[√½, √2)` (series to `s^15`), then `e^t` with `t = y ln x` clamped to `±200`
/// (beyond the f32 range either way) by `t = n ln 2 + r` and a degree-8 Taylor polynomial.
fn pow_positive64(m: &mut Math<'_, '_>, x: Value, y: Value) -> Value {
    let flags = MemFlagsData::new();
    let bits = m.b.ins().bitcast(types::I64X2, flags, x);
    let e = m.b.ins().ushr_imm_u(bits, 52);
    let magic = isplat64(m, 0x4330_0000_0000_0000);
    let e = m.b.ins().bor(e, magic);
    let e = m.b.ins().bitcast(types::F64X2, flags, e);
    let bias = splat64(m, 4_503_599_627_370_496.0 + 1023.0);
    let e = m.b.ins().fsub(e, bias);
    let mant_mask = isplat64(m, 0x000f_ffff_ffff_ffff);
    let one_bits = isplat64(m, 0x3ff0_0000_0000_0000);
    let mant = m.b.ins().band(bits, mant_mask);
    let mant = m.b.ins().bor(mant, one_bits);
    let mant = m.b.ins().bitcast(types::F64X2, flags, mant);
    let sqrt2 = splat64(m, std::f64::consts::SQRT_2);
    let big = m.b.ins().fcmp(FloatCC::GreaterThan, mant, sqrt2);
    let big = m.b.ins().bitcast(types::F64X2, flags, big);
    let half = splat64(m, 0.5);
    let halved = m.b.ins().fmul(mant, half);
    let mant = m.b.ins().bitselect(big, halved, mant);
    let one = splat64(m, 1.0);
    let e1 = m.b.ins().fadd(e, one);
    let e = m.b.ins().bitselect(big, e1, e);
    let num = m.b.ins().fsub(mant, one);
    let den = m.b.ins().fadd(mant, one);
    let s = m.b.ins().fdiv(num, den);
    let s2 = m.b.ins().fmul(s, s);
    let series = horner64(
        m,
        s2,
        &[1.0 / 15.0, 1.0 / 13.0, 1.0 / 11.0, 1.0 / 9.0, 1.0 / 7.0, 1.0 / 5.0, 1.0 / 3.0, 1.0],
    );
    let two_s = m.b.ins().fadd(s, s);
    let ln_m = m.b.ins().fmul(two_s, series);
    let ln2 = splat64(m, std::f64::consts::LN_2);
    let ln_x = m.mul_add(e, ln2, ln_m);
    let t = m.b.ins().fmul(y, ln_x);
    let hi = splat64(m, 200.0);
    let lo = splat64(m, -200.0);
    let t = clamp_above(m, t, hi);
    let t = clamp_below(m, t, lo);
    let log2e = splat64(m, std::f64::consts::LOG2_E);
    let n = m.b.ins().fmul(t, log2e);
    let n = m.b.ins().nearest(n);
    // ln 2 in two parts, the first with 32 significant bits so that `n ln2_hi` is exact.
    let ln2_hi = splat64(m, -6.931_471_803_691_238_2e-1);
    let ln2_lo = splat64(m, -1.908_214_929_270_587_7e-10);
    let r = m.mul_add(n, ln2_hi, t);
    let r = m.mul_add(n, ln2_lo, r);
    let taylor = [
        1.0 / 40320.0,
        1.0 / 5040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ];
    let p = horner64(m, r, &taylor);
    // 2^n in the exponent bits (n is integral and in [-289, 289]).
    let shift = splat64(m, 4_503_599_627_370_496.0 + 1023.0);
    let nb = m.b.ins().fadd(n, shift);
    let nb = m.b.ins().bitcast(types::I64X2, flags, nb);
    let nb = m.b.ins().isub(nb, magic);
    let nb = m.b.ins().ishl_imm_u(nb, 52);
    let scale = m.b.ins().bitcast(types::F64X2, flags, nb);
    m.b.ins().fmul(p, scale)
}

/// `x^y` for four f32 lanes where `x` is finite and non-zero, `y` finite, and `y` integral
/// when `x < 0` (the lanes [`pow_fast_lanes`] marks); other lanes give garbage and the
/// caller sends them to the scalar function. Computed in f64: at most 1 ULP.
pub(super) fn pow(m: &mut Math<'_, '_>, x: Value, y: Value) -> Value {
    let ax = m.b.ins().fabs(x);
    let (x_lo, x_hi) = widen(m, ax);
    let (y_lo, y_hi) = widen(m, y);
    let lo = pow_positive64(m, x_lo, y_lo);
    let hi = pow_positive64(m, x_hi, y_hi);
    let r = narrow(m, lo, hi);
    // A negative base with an odd exponent gives a negative result.
    let flags = MemFlagsData::new();
    let half = splat(m, 0.5);
    let hy = m.b.ins().fmul(y, half);
    let fl = m.b.ins().floor(hy);
    let odd = m.b.ins().fcmp(FloatCC::NotEqual, hy, fl);
    let xbits = m.b.ins().bitcast(types::I32X4, flags, x);
    let sign_bit = isplat(m, i32::MIN);
    let xsign = m.b.ins().band(xbits, sign_bit);
    let flip = m.b.ins().band(xsign, odd);
    let rbits = m.b.ins().bitcast(types::I32X4, flags, r);
    let rbits = m.b.ins().bxor(rbits, flip);
    m.b.ins().bitcast(types::F32X4, flags, rbits)
}

/// The lanes [`pow`] computes: an all-ones `i32x4` lane where `x` is finite and non-zero,
/// `y` is finite, and `y` is an integer if `x < 0`.
pub(super) fn pow_fast_lanes(m: &mut Math<'_, '_>, x: Value, y: Value) -> Value {
    let ax = m.b.ins().fabs(x);
    let ay = m.b.ins().fabs(y);
    let zero = splat(m, 0.0);
    let inf = splat(m, f32::INFINITY);
    let positive = m.b.ins().fcmp(FloatCC::GreaterThan, ax, zero);
    let finite_x = m.b.ins().fcmp(FloatCC::LessThan, ax, inf);
    let finite_y = m.b.ins().fcmp(FloatCC::LessThan, ay, inf);
    let x_pos = m.b.ins().fcmp(FloatCC::GreaterThan, x, zero);
    let fy = m.b.ins().floor(y);
    let integral = m.b.ins().fcmp(FloatCC::Equal, y, fy);
    let sign_ok = m.b.ins().bor(x_pos, integral);
    let ok = m.b.ins().band(positive, finite_x);
    let ok = m.b.ins().band(ok, finite_y);
    m.b.ins().band(ok, sign_ok)
}
