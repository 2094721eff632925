//! Vectorized `exp`, `tanh`, `sigmoid`, `erf` and `log` for `f32x4`, as inline polynomials (Cranelift
//! has no transcendental instructions, and a call per lane would cost more than the math).
//!
//! The approximations are Cephes' `expf` and `tanhf`: `exp` reduces `x = n ln 2 + r` with
//! `|r| <= ln 2 / 2`, evaluates a degree-6 polynomial and scales by `2^n` built in the
//! exponent bits; `tanh` uses an odd polynomial below `|x| = 0.625` and `1 - 2 / (e^{2|x|} + 1)`
//! above; `sigmoid` is `1 / (1 + e^{-x})`. Measured errors against f64, over inputs whose
//! results are normal floats: `exp` at most 2 ULP, `tanh` at most 3 ULP, `sigmoid` at most 4
//! ULP, `erf` at most 2 ULP, `log` at most 1 ULP (the tests of this crate enforce the bounds). `exp` overflows to infinity where f32
//! does; below `-86.9` (where the result leaves the normal range) it returns `e^-86.9`, about
//! `1.8e-38`, so the absolute error there is below `2e-38`. NaN propagates.

#![allow(
    clippy::excessive_precision,
    reason = "Cephes' published coefficients, as published; the compiler rounds them"
)]

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{InstBuilder, MemFlagsData, Value, types};
use cranelift_frontend::FunctionBuilder;

fn splat(b: &mut FunctionBuilder<'_>, v: f32) -> Value {
    let s = b.ins().f32const(v);
    b.ins().splat(types::F32X4, s)
}

fn isplat(b: &mut FunctionBuilder<'_>, v: i32) -> Value {
    let s = b.ins().iconst(types::I32, i64::from(v));
    b.ins().splat(types::I32X4, s)
}

/// `min(x, hi)`, keeping a NaN `x`: one `minps`, where Cranelift's NaN-propagating `fmin`
/// takes about nine instructions.
fn clamp_above(b: &mut FunctionBuilder<'_>, x: Value, hi: Value) -> Value {
    let over = b.ins().fcmp(FloatCC::GreaterThan, x, hi);
    let mask = b.ins().bitcast(types::F32X4, MemFlagsData::new(), over);
    b.ins().bitselect(mask, hi, x)
}

/// `max(x, lo)`, keeping a NaN `x`.
fn clamp_below(b: &mut FunctionBuilder<'_>, x: Value, lo: Value) -> Value {
    let under = b.ins().fcmp(FloatCC::LessThan, x, lo);
    let mask = b.ins().bitcast(types::F32X4, MemFlagsData::new(), under);
    b.ins().bitselect(mask, lo, x)
}

/// `e^x` for four lanes.
pub(super) fn exp(b: &mut FunctionBuilder<'_>, x: Value) -> Value {
    // Above 88.73 the result overflows to infinity; below -86.9 it would leave the normal
    // range, where the exponent-bit scaling below cannot follow.
    let hi = splat(b, 88.73);
    let lo = splat(b, -86.9);
    let x = clamp_above(b, x, hi);
    let x = clamp_below(b, x, lo);
    let log2e = splat(b, std::f32::consts::LOG2_E);
    let t = b.ins().fmul(x, log2e);
    let n = b.ins().nearest(t);
    // r = x - n ln2, with ln2 split in two parts for precision.
    let c1 = splat(b, 0.693_359_4);
    let c2 = splat(b, -2.121_944_4e-4);
    let a = b.ins().fmul(n, c1);
    let r = b.ins().fsub(x, a);
    let a = b.ins().fmul(n, c2);
    let r = b.ins().fsub(r, a);
    let coeffs = [
        1.987_569_2e-4f32,
        1.398_2e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        5.000_000_1e-1,
    ];
    let p = horner(b, r, &coeffs);
    let r2 = b.ins().fmul(r, r);
    let p = b.ins().fmul(p, r2);
    let p = b.ins().fadd(p, r);
    let one = splat(b, 1.0);
    let y = b.ins().fadd(p, one);
    // 2^n as (2 y) 2^(n-1), with 2^(n-1) built in the exponent bits: n is integral and in
    // [-125, 128], so n - 1 is a normal exponent and 2^128 overflows only through the product.
    let magic = splat(b, 12_582_912.0); // 1.5 * 2^23: adding it leaves n in the low bits
    let shifted = b.ins().fadd(n, magic);
    let bits = b.ins().bitcast(types::I32X4, MemFlagsData::new(), shifted);
    let magic_bits = isplat(b, 0x4b40_0000);
    let ni = b.ins().isub(bits, magic_bits);
    let bias = isplat(b, 126);
    let e = b.ins().iadd(ni, bias);
    let e = b.ins().ishl_imm_u(e, 23);
    let scale = b.ins().bitcast(types::F32X4, MemFlagsData::new(), e);
    let y2 = b.ins().fadd(y, y);
    b.ins().fmul(y2, scale)
}

/// `tanh(x)` for four lanes.
pub(super) fn tanh(b: &mut FunctionBuilder<'_>, x: Value) -> Value {
    let ax = b.ins().fabs(x);
    // Small |x|: x + x^3 P(x^2).
    let z = b.ins().fmul(x, x);
    let coeffs =
        [-5.704_988_7e-3f32, 2.063_908_9e-2, -5.373_971_6e-2, 1.333_144_2e-1, -3.333_328_2e-1];
    let p = horner(b, z, &coeffs);
    let p = b.ins().fmul(p, z);
    let p = b.ins().fmul(p, x);
    let small = b.ins().fadd(p, x);
    // Large |x|: sign(x) (1 - 2 / (e^{2|x|} + 1)), with |x| capped at 10, past which tanh rounds to 1 in f32.
    let cap = splat(b, 10.0);
    let capped = clamp_above(b, ax, cap);
    let two_x = b.ins().fadd(capped, capped);
    let e = exp(b, two_x);
    let one = splat(b, 1.0);
    let two = splat(b, 2.0);
    let d = b.ins().fadd(e, one);
    let q = b.ins().fdiv(two, d);
    let large = b.ins().fsub(one, q);
    let large = with_sign_of(b, large, x);
    let threshold = splat(b, 0.625);
    let is_small = b.ins().fcmp(FloatCC::LessThan, ax, threshold);
    let mask = b.ins().bitcast(types::F32X4, MemFlagsData::new(), is_small);
    // NaN compares false, takes the large branch, and stays NaN through exp.
    b.ins().bitselect(mask, small, large)
}

/// `1 / (1 + e^{-x})` for four lanes.
pub(super) fn sigmoid(b: &mut FunctionBuilder<'_>, x: Value) -> Value {
    let nx = b.ins().fneg(x);
    let e = exp(b, nx);
    let one = splat(b, 1.0);
    let d = b.ins().fadd(e, one);
    b.ins().fdiv(one, d)
}

/// `magnitude` (non-negative) with the sign bit of `x`.
fn with_sign_of(b: &mut FunctionBuilder<'_>, magnitude: Value, x: Value) -> Value {
    let sign_mask = isplat(b, i32::MIN);
    let xbits = b.ins().bitcast(types::I32X4, MemFlagsData::new(), x);
    let sign = b.ins().band(xbits, sign_mask);
    let mbits = b.ins().bitcast(types::I32X4, MemFlagsData::new(), magnitude);
    let signed = b.ins().bor(mbits, sign);
    b.ins().bitcast(types::F32X4, MemFlagsData::new(), signed)
}

/// `c[0] z^(n-1) + ... + c[n-1]` by Horner's rule.
fn horner(b: &mut FunctionBuilder<'_>, z: Value, coeffs: &[f32]) -> Value {
    let mut p = splat(b, coeffs[0]);
    for &c in &coeffs[1..] {
        let cv = splat(b, c);
        p = b.ins().fmul(p, z);
        p = b.ins().fadd(p, cv);
    }
    p
}

/// `erf(x)` for four lanes: Cephes' `erff`. Below `|x| = 1`, `x T(x^2)`; above,
/// `1 - e^{-x^2} P(1/x^2) / |x|` with one polynomial on `[1, 2)` and another beyond, and the
/// sign of `x`. Past `|x| = 10` the result is `±1` in f32 (and `|x|` is capped there, so
/// infinities give `±1`); NaN propagates.
pub(super) fn erf(b: &mut FunctionBuilder<'_>, x: Value) -> Value {
    const T: [f32; 7] = [
        7.853861353153693e-5,
        -8.010193625184903e-4,
        5.188327685732524e-3,
        -2.685381193529856e-2,
        1.128358514861418e-1,
        -3.761262582423300e-1,
        1.128379165726710,
    ];
    const P: [f32; 9] = [
        2.326819970068386e-2,
        -1.387039388740657e-1,
        3.687424674597105e-1,
        -5.824733027278666e-1,
        6.210004621745983e-1,
        -4.944515323274145e-1,
        3.404879937665872e-1,
        -2.741127028184656e-1,
        5.638259427386472e-1,
    ];
    const R: [f32; 8] = [
        -1.047766399936249e1,
        1.297719955372516e1,
        -7.495518717768503,
        2.921019019210786,
        -1.015265279202700,
        4.218463358204948e-1,
        -2.820767439740514e-1,
        5.641895067754075e-1,
    ];
    let ax = b.ins().fabs(x);
    let z = b.ins().fmul(x, x);
    let t = horner(b, z, &T);
    let small = b.ins().fmul(x, t);

    let cap = splat(b, 10.0);
    let a = clamp_above(b, ax, cap);
    let one = splat(b, 1.0);
    let q = b.ins().fdiv(one, a);
    let y = b.ins().fmul(q, q);
    let p_near = horner(b, y, &P);
    let p_far = horner(b, y, &R);
    let two = splat(b, 2.0);
    let near = b.ins().fcmp(FloatCC::LessThan, a, two);
    let near = b.ins().bitcast(types::F32X4, MemFlagsData::new(), near);
    let p = b.ins().bitselect(near, p_near, p_far);
    let a2 = b.ins().fmul(a, a);
    let na2 = b.ins().fneg(a2);
    let e = exp(b, na2);
    let erfc = b.ins().fmul(e, q);
    let erfc = b.ins().fmul(erfc, p);
    let large = b.ins().fsub(one, erfc);
    let large = with_sign_of(b, large, x);

    let is_small = b.ins().fcmp(FloatCC::LessThan, ax, one);
    let mask = b.ins().bitcast(types::F32X4, MemFlagsData::new(), is_small);
    // NaN compares false and takes the large branch, where it propagates.
    b.ins().bitselect(mask, small, large)
}

/// `ln(x)` for four lanes: Cephes' `logf`. `x = m 2^e` with `m` in `[√½, √2)`, then
/// `ln(1 + f) ≈ f - f²/2 + f³ P(f)` and `e ln 2` added in two parts. Subnormal inputs are
/// scaled into the normal range first; `ln(0) = -inf`, `ln(inf) = inf`, negative inputs and
/// NaN give NaN.
pub(super) fn log(b: &mut FunctionBuilder<'_>, x: Value) -> Value {
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
    let as_f = |b: &mut FunctionBuilder<'_>, v: Value| b.ins().bitcast(types::F32X4, flags, v);
    let as_i = |b: &mut FunctionBuilder<'_>, v: Value| b.ins().bitcast(types::I32X4, flags, v);
    // Subnormals: multiply by 2^23 and take 23 off the exponent.
    let min_normal = splat(b, f32::MIN_POSITIVE);
    let tiny = b.ins().fcmp(FloatCC::LessThan, x, min_normal);
    let scale = splat(b, 8_388_608.0);
    let scaled = b.ins().fmul(x, scale);
    let tiny_f = as_f(b, tiny);
    let xs = b.ins().bitselect(tiny_f, scaled, x);
    let bits = as_i(b, xs);
    let exp_bits = b.ins().ushr_imm_u(bits, 23);
    let byte = isplat(b, 0xff);
    let exp_bits = b.ins().band(exp_bits, byte);
    let bias = isplat(b, 126);
    let e = b.ins().isub(exp_bits, bias);
    let adjust = isplat(b, 23);
    let zero_i = isplat(b, 0);
    let tiny_i = as_i(b, tiny);
    let adjust = b.ins().bitselect(tiny_i, adjust, zero_i);
    let e = b.ins().isub(e, adjust);
    let mant_mask = isplat(b, 0x807f_ffff_u32 as i32);
    let half_bits = isplat(b, 0x3f00_0000);
    let m = b.ins().band(bits, mant_mask);
    let m = b.ins().bor(m, half_bits);
    let m = as_f(b, m);
    // Below √½, use 2m and one less in the exponent.
    let sqrt_half = splat(b, std::f32::consts::FRAC_1_SQRT_2);
    let low = b.ins().fcmp(FloatCC::LessThan, m, sqrt_half);
    let low_i = as_i(b, low);
    let one_i = isplat(b, 1);
    let dec = b.ins().bitselect(low_i, one_i, zero_i);
    let e = b.ins().isub(e, dec);
    let e = b.ins().fcvt_from_sint(types::F32X4, e);
    let one = splat(b, 1.0);
    let zero = splat(b, 0.0);
    let f = b.ins().fsub(m, one);
    let low_f = as_f(b, low);
    let extra = b.ins().bitselect(low_f, m, zero);
    let f = b.ins().fadd(f, extra);
    let z = b.ins().fmul(f, f);
    let p = horner(b, f, &P);
    let y = b.ins().fmul(p, f);
    let y = b.ins().fmul(y, z);
    let q1 = splat(b, -2.12194440e-4);
    let t = b.ins().fmul(e, q1);
    let y = b.ins().fadd(y, t);
    let minus_half = splat(b, -0.5);
    let t = b.ins().fmul(z, minus_half);
    let y = b.ins().fadd(y, t);
    let r = b.ins().fadd(f, y);
    let q2 = splat(b, 0.693359375);
    let t = b.ins().fmul(e, q2);
    let r = b.ins().fadd(r, t);
    // Special values, last to first in priority.
    let inf = splat(b, f32::INFINITY);
    let is_inf = b.ins().fcmp(FloatCC::Equal, x, inf);
    let is_inf = as_f(b, is_inf);
    let r = b.ins().bitselect(is_inf, inf, r);
    let is_zero = b.ins().fcmp(FloatCC::Equal, x, zero);
    let is_zero = as_f(b, is_zero);
    let neg_inf = splat(b, f32::NEG_INFINITY);
    let r = b.ins().bitselect(is_zero, neg_inf, r);
    let invalid = b.ins().fcmp(FloatCC::UnorderedOrLessThan, x, zero);
    let invalid = as_f(b, invalid);
    let nan = splat(b, f32::NAN);
    b.ins().bitselect(invalid, nan, r)
}
