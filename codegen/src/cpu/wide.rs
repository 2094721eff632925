//! `exp`, `tanh` and `sigmoid` over arrays of `f32`, compiled by rustc for the host's widest
//! vectors (AVX-512: sixteen lanes; AVX2: eight), for kernels to call on blocks of values
//! (`staging.rs`). Cranelift's vectors are 128-bit, so these polynomials cost about a
//! quarter (AVX-512) or half (AVX2) of the instructions per value there.
//!
//! Each function is the lane of `math.rs` written out in scalar Rust, operation for
//! operation (the same constants, the same fused multiply-adds, the same `minps`/`maxps`
//! clamps), and the loop around it is left to the compiler's vectorizer. Both paths use
//! fused multiply-adds, so a value computed here is bit for bit the value the inline
//! polynomial computes; the tests check that on every input they sweep.

use super::math::{EXP_P, TANH_P};

/// One lane of `math::exp`.
#[inline(always)]
fn exp1(x: f32) -> f32 {
    // `hi < x ? hi : x` and `x < lo ? lo : x` are `minps`/`maxps`, which keep a NaN `x`.
    let x = if 88.73 < x { 88.73 } else { x };
    let x = if x < -88.0 { -88.0 } else { x };
    let t = x * std::f32::consts::LOG2_E;
    let shifted = t + 12_582_912.0;
    let n = shifted - 12_582_912.0;
    let r = n.mul_add(-0.693_359_4, x);
    let r = n.mul_add(2.121_944_4e-4, r);
    let p = horner(r, &EXP_P);
    let p = p.mul_add(r * r, r);
    let y = p + 1.0;
    let e = (shifted.to_bits() as i32).wrapping_add(126 - 0x4b40_0000).max(0);
    let scale = f32::from_bits((e << 23) as u32);
    (y + y) * scale
}

/// One lane of `math::tanh`.
#[inline(always)]
fn tanh1(x: f32) -> f32 {
    let ax = x.abs();
    let z = x * x;
    let p = horner(z, &TANH_P);
    let small = (p * z).mul_add(x, x);
    let capped = if 10.0 < ax { 10.0 } else { ax };
    let e = exp1(capped + capped);
    let large = 1.0 - 2.0 / (e + 1.0);
    let large = f32::from_bits(large.to_bits() | (x.to_bits() & 0x8000_0000));
    if ax < 0.625 { small } else { large }
}

/// One lane of `math::sigmoid`.
#[inline(always)]
fn sigmoid1(x: f32) -> f32 {
    1.0 / (exp1(-x) + 1.0)
}

#[inline(always)]
fn horner(z: f32, coeffs: &[f32]) -> f32 {
    let mut p = coeffs[0];
    for &c in &coeffs[1..] {
        p = p.mul_add(z, c);
    }
    p
}

/// A batch function: `values[..n]` replaced by `f` of each, in place.
pub(super) type Batch = extern "C" fn(values: *mut f32, n: usize);

macro_rules! batch {
    ($name:ident, $one:ident) => {
        mod $name {
            /// # Safety
            /// The host has AVX-512F and FMA; `values` points at `n` writable floats.
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,fma")]
            unsafe fn avx512(values: *mut f32, n: usize) {
                // SAFETY: the caller passes `n` writable floats.
                let s = unsafe { std::slice::from_raw_parts_mut(values, n) };
                for v in s {
                    *v = super::$one(*v);
                }
            }

            /// # Safety
            /// The host has AVX2 and FMA; `values` points at `n` writable floats.
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2(values: *mut f32, n: usize) {
                // SAFETY: the caller passes `n` writable floats.
                let s = unsafe { std::slice::from_raw_parts_mut(values, n) };
                for v in s {
                    *v = super::$one(*v);
                }
            }

            #[cfg(target_arch = "x86_64")]
            pub(super) extern "C" fn on_avx512(values: *mut f32, n: usize) {
                // SAFETY: chosen by `for_host` only where the features were detected; kernels
                // pass a block of their stack scratch and its length.
                unsafe { avx512(values, n) }
            }

            #[cfg(target_arch = "x86_64")]
            pub(super) extern "C" fn on_avx2(values: *mut f32, n: usize) {
                // SAFETY: as `on_avx512`.
                unsafe { avx2(values, n) }
            }

            /// Hosts without wide vectors never stage; the symbol exists so that every host
            /// declares the same functions (the kernels' text does not depend on the host).
            pub(super) extern "C" fn plain(values: *mut f32, n: usize) {
                // SAFETY: kernels pass a block of their stack scratch and its length.
                let s = unsafe { std::slice::from_raw_parts_mut(values, n) };
                for v in s {
                    *v = super::$one(*v);
                }
            }
        }
    };
}

batch!(exp_batch, exp1);
batch!(tanh_batch, tanh1);
batch!(sigmoid_batch, sigmoid1);

/// The vector width the batch functions run at on this host (16 or 8 lanes), or `None`
/// where the host lacks AVX2 with FMA (kernels then keep the inline polynomials).
pub(super) fn lanes() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        let fma = std::arch::is_x86_feature_detected!("fma");
        if fma && std::arch::is_x86_feature_detected!("avx512f") {
            return Some(16);
        }
        if fma && std::arch::is_x86_feature_detected!("avx2") {
            return Some(8);
        }
    }
    None
}

/// The batch functions for this host by helper name (plain loops where [`lanes`] is `None`:
/// kernels do not call them there).
pub(super) fn for_host() -> Vec<(&'static str, Batch)> {
    type Three = (Batch, Batch, Batch);
    #[cfg(target_arch = "x86_64")]
    let wide: Option<Three> = match lanes() {
        Some(16) => Some((exp_batch::on_avx512, tanh_batch::on_avx512, sigmoid_batch::on_avx512)),
        Some(_) => Some((exp_batch::on_avx2, tanh_batch::on_avx2, sigmoid_batch::on_avx2)),
        None => None,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let wide: Option<Three> = None;
    let (exp, tanh, sigmoid) =
        wide.unwrap_or((exp_batch::plain, tanh_batch::plain, sigmoid_batch::plain));
    vec![("kiln_exp_f32s", exp), ("kiln_tanh_f32s", tanh), ("kiln_sigmoid_f32s", sigmoid)]
}

/// A batch function as a kernel calls it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct Helper {
    /// The batch function's symbol.
    pub(super) name: &'static str,
    /// A function of the kernel's own module that calls it and preserves every register
    /// (`preserve_all`): a kernel's loop keeps its accumulators and constants in registers
    /// across the once-a-block call, where a System V call would clobber every vector register
    /// and the register allocator would spill the loop's accumulators for the whole loop.
    pub(super) preserving: &'static str,
}

/// The batch function that computes `op` over a block, if there is one.
pub(super) fn helper_for(op: kiln_ir::UnaryOp) -> Option<Helper> {
    use kiln_ir::UnaryOp;
    let (name, preserving) = match op {
        UnaryOp::Exp => ("kiln_exp_f32s", "kiln_exp_f32s_preserving"),
        UnaryOp::Tanh => ("kiln_tanh_f32s", "kiln_tanh_f32s_preserving"),
        UnaryOp::Sigmoid => ("kiln_sigmoid_f32s", "kiln_sigmoid_f32s_preserving"),
        _ => return None,
    };
    Some(Helper { name, preserving })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_functions_match_their_scalar_lanes() {
        let mut inputs: Vec<f32> = (0..40_000).map(|i| -100.0 + i as f32 * 0.005_000_1).collect();
        inputs.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-30, -1e-30]);
        for (name, f) in for_host() {
            let one: fn(f32) -> f32 = match name {
                "kiln_exp_f32s" => exp1,
                "kiln_tanh_f32s" => tanh1,
                _ => sigmoid1,
            };
            // Odd lengths and offsets reach the vector loop's remainder.
            for n in [1, 7, 16, 37, inputs.len()] {
                let mut v = inputs[..n].to_vec();
                f(v.as_mut_ptr(), n);
                for (x, y) in inputs[..n].iter().zip(&v) {
                    let want = one(*x);
                    assert!(want.to_bits() == y.to_bits(), "{name}({x}) = {y}, lane gives {want}");
                }
            }
        }
    }
}
