//! What every scalar op computes: the one definition that the reference executor, the
//! kernel interpreter, constant folding and the CPU code generator's helper calls share.
//!
//! - Floats compute in f64 and round to their dtype after every op ([`round`]): `f32` by
//!   `as`, `f16` and `bf16` once from f64 ([`f16_from_f64`]). The transcendental functions
//!   are Rust's f64 functions, `erf` is `libm`'s.
//! - Integers compute in i64 with wrapping arithmetic, then wrap to their width ([`wrap`]).
//! - Casts follow Rust's `as`: float to integer truncates toward zero and saturates (NaN is
//!   0), anything non-zero is `true`.
//! - `maximum` and `minimum` of floats propagate NaN (as PyTorch does); comparisons with
//!   NaN are false except `!=`.

use half::{bf16, f16};

use crate::{BinaryOp, DType, UnaryOp};

/// The error function (libm's, to within an ulp of f64).
pub fn erf(x: f64) -> f64 {
    libm::erf(x)
}

/// `log(sum(exp(x)))` of `items` in f64, shifted by their maximum: -inf for no elements
/// (or only -inf), NaN if any is NaN, +inf if any is +inf.
pub fn logsumexp(items: impl Iterator<Item = f64> + Clone) -> f64 {
    if items.clone().any(f64::is_nan) {
        return f64::NAN;
    }
    let m = items.clone().fold(f64::NEG_INFINITY, f64::max);
    if m.is_infinite() {
        return m;
    }
    m + items.map(|v| (v - m).exp()).sum::<f64>().ln()
}

/// A float unary op in f64 (before rounding to the dtype).
///
/// # Panics
/// For `logical_not`, which takes bools.
pub fn unary(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Tan => x.tan(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Relu => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        UnaryOp::Erf => erf(x),
        UnaryOp::Erfc => libm::erfc(x),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        UnaryOp::Not => unreachable!("logical_not takes bool"),
    }
}

/// An integer unary op (wrapping).
///
/// # Panics
/// For the float-only ops.
pub fn unary_int(op: UnaryOp, x: i64) -> i64 {
    match op {
        UnaryOp::Neg => x.wrapping_neg(),
        UnaryOp::Abs => x.wrapping_abs(),
        UnaryOp::Relu => x.max(0),
        other => unreachable!("{} is float-only", other.name()),
    }
}

/// A float arithmetic op in f64 (before rounding to the dtype).
///
/// # Panics
/// For comparisons and logical ops.
pub fn binary(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        // Rust's `%` of floats is C's `fmod`, exact.
        BinaryOp::Rem => a % b,
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Maximum | BinaryOp::Minimum if a.is_nan() || b.is_nan() => f64::NAN,
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum => a.min(b),
        other => unreachable!("{} does not take floats", other.name()),
    }
}

/// An integer arithmetic op (wrapping).
///
/// # Panics
/// For comparisons, logical ops and the float-only ops.
pub fn binary_int(op: BinaryOp, a: i64, b: i64) -> i64 {
    match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum => a.min(b),
        BinaryOp::Div if b == 0 => 0,
        BinaryOp::Div => a.wrapping_div(b),
        BinaryOp::Rem if b == 0 => 0,
        BinaryOp::Rem => a.wrapping_rem(b),
        BinaryOp::BitAnd => a & b,
        BinaryOp::BitOr => a | b,
        BinaryOp::BitXor => a ^ b,
        // A narrower dtype's value is held sign- or zero-extended, so shifting the i64 and
        // wrapping to the dtype afterwards is the narrow shift (0 past its width for `<<`,
        // the sign past it for `>>`).
        BinaryOp::Shl if (0..64).contains(&b) => a << b,
        BinaryOp::Shl => 0,
        BinaryOp::Shr if (0..64).contains(&b) => a >> b,
        BinaryOp::Shr => a >> 63,
        other => unreachable!("{} does not take integers", other.name()),
    }
}

/// A logical op of bools (`maximum` is `or`, `minimum` is `and`).
///
/// # Panics
/// For arithmetic ops and comparisons.
pub fn binary_bool(op: BinaryOp, a: bool, b: bool) -> bool {
    match op {
        BinaryOp::And | BinaryOp::Minimum => a && b,
        BinaryOp::Or | BinaryOp::Maximum => a || b,
        other => unreachable!("{} does not take bools", other.name()),
    }
}

/// A comparison.
///
/// # Panics
/// For ops that are not comparisons.
pub fn compare<T: PartialOrd>(op: BinaryOp, a: T, b: T) -> bool {
    match op {
        BinaryOp::Eq => a == b,
        BinaryOp::Ne => a != b,
        BinaryOp::Lt => a < b,
        BinaryOp::Le => a <= b,
        BinaryOp::Gt => a > b,
        BinaryOp::Ge => a >= b,
        other => unreachable!("{} is not a comparison", other.name()),
    }
}

/// An integer wrapped to `dtype`'s width (`i32`, `i8` and `u8` wrap; `i64` is itself, and
/// so is a value of a float or bool dtype).
pub fn wrap(dtype: DType, v: i64) -> i64 {
    match dtype {
        DType::I32 => i64::from(v as i32),
        DType::I8 => i64::from(v as i8),
        DType::U8 => i64::from(v as u8),
        DType::I64 | DType::F32 | DType::F64 | DType::F16 | DType::BF16 | DType::Bool => v,
    }
}

/// A value computed in f64 stored as `dtype` and read back: floats rounded to the dtype,
/// integers (carried in f64) truncated and wrapped to its width, bools 0 or 1.
pub fn round(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F64 => v,
        DType::F32 => f64::from(v as f32),
        DType::F16 => f16_from_f64(v).to_f64(),
        DType::BF16 => bf16_from_f64(v).to_f64(),
        DType::I64 | DType::I32 | DType::I8 | DType::U8 => wrap(dtype, v as i64) as f64,
        DType::Bool => f64::from(u8::from(v != 0.0)),
    }
}

/// A cast of `v` (of dtype `from`, carried in f64) to `to`, before rounding to `to`.
pub fn cast(v: f64, from: DType, to: DType) -> f64 {
    match (from.is_float(), to) {
        (_, DType::Bool) => f64::from(u8::from(v != 0.0)),
        (true, t) if !t.is_float() => {
            if v.is_nan() {
                0.0
            } else {
                v.trunc()
            }
        }
        _ => v,
    }
}

/// Any unary op on a value of `dtype` carried in f64 (integers and bools too): what the
/// kernel interpreter and constant folding evaluate.
pub fn unary_any(op: UnaryOp, x: f64, dtype: DType) -> f64 {
    match dtype {
        DType::Bool => f64::from(u8::from(x == 0.0)),
        d if d.is_float() => unary(op, x),
        _ => unary_int(op, x as i64) as f64,
    }
}

/// Any binary op on values of `dtype` carried in f64 (comparisons give 0 or 1).
pub fn binary_any(op: BinaryOp, a: f64, b: f64, dtype: DType) -> f64 {
    if op.is_comparison() {
        return f64::from(u8::from(compare(op, a, b)));
    }
    match dtype {
        DType::Bool => f64::from(u8::from(binary_bool(op, a != 0.0, b != 0.0))),
        d if d.is_float() => binary(op, a, b),
        _ => binary_int(op, a as i64, b as i64) as f64,
    }
}

/// `v` rounded once to the nearest `f16` (ties to even).
///
/// `half::f16::from_f64` converts through `f32` (in hardware on x86), which rounds twice: a
/// value just above a tie between two `f16`s lands on the tie in `f32` and then goes to the
/// even one. Rounding to `f32` *to odd* instead keeps the lost bits' inexactness in the last
/// bit, and 24 bits are enough for that bit to decide an 11-bit rounding correctly.
///
/// ```
/// use kiln_ir::f16_from_f64;
/// let just_above_tie = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
/// assert_eq!(f16_from_f64(just_above_tie).to_f64(), 1.0 + 2f64.powi(-10));
/// ```
pub fn f16_from_f64(v: f64) -> f16 {
    f16::from_f32(f32_to_odd(v))
}

/// `v` rounded once to the nearest `bf16` (ties to even); see [`f16_from_f64`].
pub fn bf16_from_f64(v: f64) -> bf16 {
    bf16::from_f32(f32_to_odd(v))
}

/// An `f32` rounded to `f16` precision (once: from `f32` there is no double rounding).
pub fn round_f32_to_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// An `f32` rounded to `bf16` precision.
pub fn round_f32_to_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

/// `v` rounded to `f32` toward zero, with the last bit set when that was inexact.
fn f32_to_odd(v: f64) -> f32 {
    let nearest = v as f32;
    let bits = nearest.to_bits();
    if v.is_nan() || f64::from(nearest) == v || bits & 1 == 1 {
        return nearest;
    }
    // The nearest value is even, so the odd one is its neighbour on `v`'s other side.
    let away = f64::from(nearest).abs() > v.abs();
    f32::from_bits(if away { bits - 1 } else { bits + 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_published_values() {
        // Abramowitz & Stegun, table 7.1 (to the digits given there and beyond, from the
        // defining integral).
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.0, 0.999_977_909_503_001_4),
            (6.0, 1.0),
        ] {
            assert!((erf(x) - want).abs() < 1e-15, "erf({x}) = {}", erf(x));
            assert!((erf(-x) + want).abs() < 1e-15);
        }
        assert!(erf(f64::NAN).is_nan());
    }

    #[test]
    fn rounding_to_16_bits_is_once_from_f64() {
        // Independent oracle: the exact neighbours from the bit patterns, tie to even.
        let f16_up = |k: u16| f16::from_bits(k).to_f64();
        for k in [0x3c00u16, 0x3c01, 0x4500, 0x7bfe, 0x0001, 0x0400] {
            let (lo, hi) = (f16_up(k), f16_up(k + 1));
            let mid = (lo + hi) / 2.0;
            let even = if k % 2 == 0 { lo } else { hi };
            assert_eq!(f16_from_f64(mid).to_f64(), even, "tie at {mid}");
            let nudge = (hi - lo) * 2f64.powi(-30);
            assert_eq!(f16_from_f64(mid + nudge).to_f64(), hi, "above the tie at {mid}");
            assert_eq!(f16_from_f64(mid - nudge).to_f64(), lo, "below the tie at {mid}");
        }
        let bf16_up = |k: u16| bf16::from_bits(k).to_f64();
        for k in [0x3f80u16, 0x3f81, 0x4049] {
            let (lo, hi) = (bf16_up(k), bf16_up(k + 1));
            let mid = (lo + hi) / 2.0;
            let nudge = (hi - lo) * 2f64.powi(-40);
            assert_eq!(bf16_from_f64(mid + nudge).to_f64(), hi);
            assert_eq!(bf16_from_f64(mid - nudge).to_f64(), lo);
        }
    }

    #[test]
    fn integers_wrap_and_casts_truncate() {
        assert_eq!(wrap(DType::I32, i64::from(i32::MAX) + 1), i64::from(i32::MIN));
        assert_eq!(wrap(DType::U8, 300), 44);
        assert_eq!(wrap(DType::U8, -1), 255);
        assert_eq!(wrap(DType::I8, 128), -128);
        assert_eq!(wrap(DType::I8, -129), 127);
        assert_eq!(binary_int(BinaryOp::Add, i64::MAX, 1), i64::MIN);
        assert_eq!(binary_int(BinaryOp::Div, -7, 2), -3);
        assert_eq!(binary_int(BinaryOp::Div, i64::MIN, -1), i64::MIN);
        assert_eq!(binary_int(BinaryOp::Rem, -7, 2), -1);
        assert_eq!(binary_int(BinaryOp::Rem, 7, 0), 0);
        assert_eq!(wrap(DType::I32, binary_int(BinaryOp::Shl, 1, 40)), 0);
        assert_eq!(wrap(DType::U8, binary_int(BinaryOp::Shl, 200, 1)), 144);
        assert_eq!(binary_int(BinaryOp::Shr, -5, 70), -1);
        assert_eq!(binary_int(BinaryOp::Shl, 5, -1), 0);
        assert_eq!(unary_int(UnaryOp::Abs, i64::MIN), i64::MIN);
        assert_eq!(round(DType::I32, 2_147_483_648.0), -2_147_483_648.0);
        assert_eq!(cast(-2.7, DType::F32, DType::I64), -2.0);
        assert_eq!(cast(f64::NAN, DType::F32, DType::I32), 0.0);
        assert_eq!(cast(0.5, DType::F32, DType::Bool), 1.0);
    }

    #[test]
    fn float_ops_follow_ieee_and_pytorch() {
        assert!(binary(BinaryOp::Maximum, f64::NAN, 1.0).is_nan());
        assert!(binary(BinaryOp::Minimum, 1.0, f64::NAN).is_nan());
        assert_eq!(binary(BinaryOp::Pow, 0.0, 0.0), 1.0);
        assert!(binary(BinaryOp::Pow, -8.0, 1.0 / 3.0).is_nan());
        assert_eq!(binary(BinaryOp::Rem, -7.5, 2.0), -1.5);
        assert_eq!(binary(BinaryOp::Rem, 1e300, 3.0), 1e300 % 3.0);
        assert!(binary(BinaryOp::Rem, 1.0, 0.0).is_nan());
        assert_eq!(unary(UnaryOp::Round, 2.5), 2.0);
        assert_eq!(unary(UnaryOp::Round, -3.5), -4.0);
        assert_eq!(unary(UnaryOp::Relu, -3.0), 0.0);
        assert!(!compare(BinaryOp::Lt, f64::NAN, 1.0));
        assert!(compare(BinaryOp::Ne, f64::NAN, f64::NAN));
        assert_eq!(round(DType::F32, 0.1), f64::from(0.1f32));
        assert_eq!(unary_any(UnaryOp::Not, 0.0, DType::Bool), 1.0);
        assert_eq!(binary_any(BinaryOp::Or, 0.0, 2.0, DType::Bool), 1.0);
    }
}
