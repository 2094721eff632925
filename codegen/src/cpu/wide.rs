//! `exp`, `tanh`, `sigmoid` and `erf` over arrays of `f32`, compiled by rustc for the host's widest
//! vectors (AVX-512: sixteen lanes; AVX2: eight), for kernels to call on blocks of values
//! (`staging.rs`). Cranelift's vectors are 128-bit, so these polynomials cost about a
//! quarter (AVX-512) or half (AVX2) of the instructions per value there.
//!
//! Each function is the lane of `math.rs` written out in scalar Rust, operation for
//! operation (the same constants, the same fused multiply-adds, the same `minps`/`maxps`
//! clamps), and the loop around it is left to the compiler's vectorizer. Both paths use
//! fused multiply-adds, so a value computed here is bit for bit the value the inline
//! polynomial computes; the tests check that on every input they sweep.

use super::math::{ERF_EDGE, ERF_LARGE_HI, ERF_LARGE_LO, ERF_LARGE_MID, ERF_SMALL, EXP_P, TANH_P};

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

/// One lane of `math::erf`.
#[inline(always)]
fn erf1(x: f32) -> f32 {
    let ax = x.abs();
    let s = x * x;
    let p = horner(s, &ERF_SMALL);
    let small = p.mul_add(x, x);
    let t = if 10.0 < ax { 10.0 } else { ax };
    let t2 = t * t;
    let r = horner(t, &ERF_LARGE_HI);
    let u = horner(t, &ERF_LARGE_MID);
    let mut r = r.mul_add(t2, u);
    for c in ERF_LARGE_LO {
        r = r.mul_add(t, c);
    }
    let r = r.mul_add(t, -t);
    let large = 1.0 - exp1(r);
    let large = f32::from_bits(large.to_bits() | (x.to_bits() & 0x8000_0000));
    if ax < ERF_EDGE { small } else { large }
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
batch!(erf_batch, erf1);

/// The running state of a one-pass `logsumexp` over a row (`logsumexp.rs` keeps one per
/// output in the kernel's stack frame): the largest value seen, and the sum of `exp(v - c)`
/// over the values seen, where `c` is that largest value when it is finite and 0 otherwise.
/// The sum is NaN once a NaN was seen.
#[repr(C)]
pub(super) struct LseState {
    pub(super) max: f64,
    pub(super) sum: f64,
}

/// Lanes of the block sums: a fixed sixteen, however many the host's vectors hold, so that
/// every host adds the same values in the same order and gets the same bits.
const LSE_LANES: usize = 16;

/// Values per block: 8 KiB, in L1 for the second pass.
pub(super) const LSE_BLOCK: usize = 2048;

/// Vectors of block maxima: comparisons that do not wait on each other (a maximum is exact
/// in any order).
const MAX_VECTORS: usize = 4;

/// How far ahead of the exponentials the block function asks for memory: the next block
/// (of this row, or of the row after it, which usually follows in memory) arrives while
/// this one computes, instead of when the next maximum asks for it.
const LSE_AHEAD: usize = 1024;

/// Asks the memory system for the `bytes` bytes from `at`, a cache line (64 bytes) at a
/// time, ahead of their use (nothing off x86-64). A prefetch is a hint: it reads nothing the
/// program sees and never faults, so `at` may lie past the values (its address is computed
/// with `wrapping_add`, never dereferenced). Also the runtime's quantized products' (a loop
/// reading eight rows side by side).
#[inline(always)]
pub fn prefetch(at: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..bytes).step_by(64) {
        // SAFETY: as above; SSE, which the instruction needs, is part of x86-64.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                at.wrapping_add(line).cast(),
            );
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (at, bytes);
}

fn lse_shift(max: f64) -> f64 {
    if max.is_finite() { max } else { 0.0 }
}

/// Folds values into `state`, a block at a time; each block's maximum first (one pass over the
/// block, in L1), the sum so far rescaled when the maximum grows, then `exp(v - c)` of each
/// value summed in f32 lanes and added to the f64 sum.
#[inline(always)]
fn lse_fold(values: &[f32], state: &mut LseState) {
    // Blocks small enough that the second pass over each reads L1.
    for block in values.chunks(LSE_BLOCK) {
        lse_block(block, state);
    }
}

#[inline(always)]
fn lse_block(values: &[f32], state: &mut LseState) {
    let mut top = [[f32::NEG_INFINITY; LSE_LANES]; MAX_VECTORS];
    let chunks = values.chunks_exact(LSE_LANES * MAX_VECTORS);
    let rest = chunks.remainder();
    for c in chunks {
        for (k, t) in top.iter_mut().enumerate() {
            for i in 0..LSE_LANES {
                let v = c[k * LSE_LANES + i];
                // `maxps`: a NaN value leaves the lane as it was; the sum below catches it.
                t[i] = if t[i] < v { v } else { t[i] };
            }
        }
    }
    for (i, &v) in rest.iter().enumerate() {
        let t = &mut top[0][i % LSE_LANES];
        *t = if *t < v { v } else { *t };
    }
    let block_max = tree(top.as_flattened_mut(), |a, b| if a < b { b } else { a });
    if block_max == f32::NEG_INFINITY {
        // Only -inf and NaN: nothing to add (exp1 would give its floor, not 0).
        if values.iter().any(|v| v.is_nan()) {
            state.sum = f64::NAN;
        }
        return;
    }
    let max = state.max.max(f64::from(block_max));
    if max > state.max {
        if state.sum != 0.0 {
            state.sum *= (lse_shift(state.max) - lse_shift(max)).exp();
        }
        state.max = max;
    }
    // exp1 of a NaN is NaN, so a NaN anywhere makes the sum NaN.
    let c = lse_shift(max) as f32;
    let rest = values.chunks_exact(LSE_LANES).remainder();
    let mut acc = [0f32; LSE_LANES];
    for (k, ch) in values.chunks_exact(LSE_LANES).enumerate() {
        let ahead = values.as_ptr().wrapping_add(k * LSE_LANES + LSE_AHEAD);
        prefetch(ahead.cast(), LSE_LANES * size_of::<f32>());
        for i in 0..LSE_LANES {
            acc[i] += exp1(ch[i] - c);
        }
    }
    for (i, &v) in rest.iter().enumerate() {
        acc[i] += exp1(v - c);
    }
    state.sum += tree(&mut acc.map(f64::from), |a, b| a + b);
}

/// `values` (a power of two of them) folded by halves: a few dependent steps instead of one
/// per value, in the same order on every host.
#[inline(always)]
fn tree<T: Copy>(values: &mut [T], f: impl Fn(T, T) -> T) -> T {
    let mut n = values.len();
    while n > 1 {
        n /= 2;
        for i in 0..n {
            values[i] = f(values[i], values[i + n]);
        }
    }
    values[0]
}

/// The `logsumexp` of everything folded into `state`: -inf for nothing (or only -inf), NaN
/// after a NaN, +inf after a +inf.
pub(super) extern "C" fn lse_end(state: *const LseState) -> f32 {
    lse_end_f64(state) as f32
}

/// [`lse_end`] unrounded: the result of a `logsumexp` of f32 values widened to f64, which
/// keeps the row's maximum exact beside the logarithm of the sum (a log-softmax subtracts
/// it from logits of any magnitude: `kiln_ir::passes::precise_log_softmax`).
pub(super) extern "C" fn lse_end_f64(state: *const LseState) -> f64 {
    // SAFETY: kernels pass their own state slot, initialized before the row.
    let s = unsafe { &*state };
    if s.sum.is_nan() {
        f64::NAN
    } else if s.max.is_infinite() {
        s.max
    } else {
        s.max + s.sum.ln()
    }
}

/// A block function of a `logsumexp` kernel: folds `values[..n]` into `state`.
pub(super) type LseBlock = extern "C" fn(values: *const f32, n: usize, state: *mut LseState);

mod lse {
    use super::{LseState, lse_fold};

    /// # Safety
    /// The host has AVX-512F and FMA; `values` points at `n` floats, `state` at a state.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn avx512(values: *const f32, n: usize, state: *mut LseState) {
        // SAFETY: as the caller promises.
        unsafe { lse_fold(std::slice::from_raw_parts(values, n), &mut *state) }
    }

    /// # Safety
    /// The host has AVX2 and FMA; `values` points at `n` floats, `state` at a state.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2(values: *const f32, n: usize, state: *mut LseState) {
        // SAFETY: as the caller promises.
        unsafe { lse_fold(std::slice::from_raw_parts(values, n), &mut *state) }
    }

    #[cfg(target_arch = "x86_64")]
    pub(super) extern "C" fn on_avx512(values: *const f32, n: usize, state: *mut LseState) {
        // SAFETY: chosen by `lse_for_host` only where the features were detected; kernels
        // pass their scratch block, its length and their state slot.
        unsafe { avx512(values, n, state) }
    }

    #[cfg(target_arch = "x86_64")]
    pub(super) extern "C" fn on_avx2(values: *const f32, n: usize, state: *mut LseState) {
        // SAFETY: as `on_avx512`.
        unsafe { avx2(values, n, state) }
    }

    /// Without AVX2 and FMA: the same lanes, on whatever vectors the build targets. The
    /// polynomial's `mul_add` is then a library call, still exact, so the bits match.
    pub(super) extern "C" fn plain(values: *const f32, n: usize, state: *mut LseState) {
        // SAFETY: kernels pass their scratch block, its length and their state slot.
        unsafe { lse_fold(std::slice::from_raw_parts(values, n), &mut *state) }
    }
}

/// Lanes of an exponential row's sum: a fixed sixteen, as for `logsumexp`, so that every host
/// adds the same values in the same order.
const SUM_LANES: usize = 16;

/// `exp(x - shift)` of each of the `n` values at `x`, stored at `out` unless it is null, and
/// the sum of those results in f64 (lane `i` adds the values at `i mod 16`, then the lanes
/// fold by halves). Each group of sixteen is read before it is written, so `out` may be `x`.
///
/// # Safety
/// `x` points at `n` floats; `out` is null or points at `n` writable floats.
#[inline(always)]
unsafe fn exp_sum(x: *const f32, shift: f32, out: *mut f32, n: usize) -> f64 {
    let mut acc = [0f64; SUM_LANES];
    let whole = n - n % SUM_LANES;
    let mut i = 0;
    while i < whole {
        // SAFETY: `i + SUM_LANES <= n`, within both rows.
        let v: [f32; SUM_LANES] = unsafe { x.add(i).cast::<[f32; SUM_LANES]>().read_unaligned() };
        // A loop, not `map`: a closure would not inherit the caller's target features.
        let mut e = [0f32; SUM_LANES];
        for l in 0..SUM_LANES {
            e[l] = exp1(v[l] - shift);
        }
        if !out.is_null() {
            // SAFETY: as above.
            unsafe { out.add(i).cast::<[f32; SUM_LANES]>().write_unaligned(e) };
        }
        for l in 0..SUM_LANES {
            acc[l] += f64::from(e[l]);
        }
        i += SUM_LANES;
    }
    for (l, i) in (whole..n).enumerate() {
        // SAFETY: `i < n`.
        let e = exp1(unsafe { *x.add(i) } - shift);
        if !out.is_null() {
            // SAFETY: `i < n`.
            unsafe { *out.add(i) = e };
        }
        acc[l] += f64::from(e);
    }
    tree(&mut acc, |a, b| a + b)
}

/// A row function of a sum of exponentials (`rows.rs`): `exp(x[i] - shift)` for `i < n`,
/// written to `out[i]` unless `out` is null, and their sum.
pub(super) type ExpSumRow =
    extern "C" fn(x: *const f32, shift: f32, out: *mut f32, n: usize) -> f64;

mod exp_sum_row {
    use super::exp_sum as run;

    /// # Safety
    /// The host has AVX-512F and FMA; otherwise as `exp_sum`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn avx512(x: *const f32, shift: f32, out: *mut f32, n: usize) -> f64 {
        // SAFETY: as the caller promises.
        unsafe { run(x, shift, out, n) }
    }

    /// # Safety
    /// The host has AVX2 and FMA; otherwise as `exp_sum`.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2(x: *const f32, shift: f32, out: *mut f32, n: usize) -> f64 {
        // SAFETY: as the caller promises.
        unsafe { run(x, shift, out, n) }
    }

    #[cfg(target_arch = "x86_64")]
    pub(super) extern "C" fn on_avx512(x: *const f32, shift: f32, out: *mut f32, n: usize) -> f64 {
        // SAFETY: chosen by `exp_sum_for_host` only where the features were detected; kernels
        // pass a row of an f32 input, a row of their f32 output (or null) and the row's length.
        unsafe { avx512(x, shift, out, n) }
    }

    #[cfg(target_arch = "x86_64")]
    pub(super) extern "C" fn on_avx2(x: *const f32, shift: f32, out: *mut f32, n: usize) -> f64 {
        // SAFETY: as `on_avx512`.
        unsafe { avx2(x, shift, out, n) }
    }

    pub(super) extern "C" fn plain(x: *const f32, shift: f32, out: *mut f32, n: usize) -> f64 {
        // SAFETY: as `on_avx512`.
        unsafe { run(x, shift, out, n) }
    }
}

/// The exponential row function for this host.
pub(super) fn exp_sum_for_host() -> ExpSumRow {
    #[cfg(target_arch = "x86_64")]
    match lanes() {
        Some(16) => return exp_sum_row::on_avx512,
        Some(_) => return exp_sum_row::on_avx2,
        None => {}
    }
    exp_sum_row::plain
}

/// The `logsumexp` block function for this host.
pub(super) fn lse_for_host() -> LseBlock {
    #[cfg(target_arch = "x86_64")]
    match lanes() {
        Some(16) => return lse::on_avx512,
        Some(_) => return lse::on_avx2,
        None => {}
    }
    lse::plain
}

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

/// The batch function for this host that computes `batch` (a plain loop where [`lanes`] is
/// `None`: kernels do not call it there).
pub(super) fn for_host(batch: super::helpers::Batch) -> Batch {
    use super::helpers::Batch as Op;
    type Four = [Batch; 4];
    #[cfg(target_arch = "x86_64")]
    let wide: Option<Four> = match lanes() {
        Some(16) => Some([
            exp_batch::on_avx512,
            tanh_batch::on_avx512,
            sigmoid_batch::on_avx512,
            erf_batch::on_avx512,
        ]),
        Some(_) => Some([
            exp_batch::on_avx2,
            tanh_batch::on_avx2,
            sigmoid_batch::on_avx2,
            erf_batch::on_avx2,
        ]),
        None => None,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let wide: Option<Four> = None;
    let [exp, tanh, sigmoid, erf] = wide.unwrap_or([
        exp_batch::plain,
        tanh_batch::plain,
        sigmoid_batch::plain,
        erf_batch::plain,
    ]);
    match batch {
        Op::Exp => exp,
        Op::Tanh => tanh,
        Op::Sigmoid => sigmoid,
        Op::Erf => erf,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_batch_functions_match_their_scalar_lanes() {
        let mut inputs: Vec<f32> = (0..40_000).map(|i| -100.0 + i as f32 * 0.005_000_1).collect();
        inputs.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e-30, -1e-30]);
        use super::super::helpers::Batch as Op;
        for op in [Op::Exp, Op::Tanh, Op::Sigmoid, Op::Erf] {
            let (f, name) = (for_host(op), format!("{op:?}"));
            let one: fn(f32) -> f32 = match op {
                Op::Exp => exp1,
                Op::Tanh => tanh1,
                Op::Sigmoid => sigmoid1,
                Op::Erf => erf1,
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

    /// A module's `plain` function, then its AVX2 and AVX-512 ones where this CPU runs them.
    macro_rules! host_paths {
        ($m:ident) => {{
            let mut paths = vec![$m::plain as _];
            #[cfg(target_arch = "x86_64")]
            {
                let fma = std::arch::is_x86_feature_detected!("fma");
                if fma && std::arch::is_x86_feature_detected!("avx2") {
                    paths.push($m::on_avx2 as _);
                }
                if fma && std::arch::is_x86_feature_detected!("avx512f") {
                    paths.push($m::on_avx512 as _);
                }
            }
            paths
        }};
    }

    /// 5,000 values spread over [-20, 20) in a scrambled order.
    fn spread() -> Vec<f32> {
        (0..5000).map(|i| ((i * 7919) % 2000) as f32 * 0.02 - 20.0).collect()
    }

    #[test]
    fn the_exponential_row_sums_agree_bit_for_bit_on_every_host_path() {
        let values = spread();
        let paths: Vec<ExpSumRow> = host_paths!(exp_sum_row);
        for n in [0, 1, 15, 16, 17, 64, 2049, 5000] {
            let shift = 1.5f32;
            let mut sums = Vec::new();
            for f in &paths {
                let mut out = vec![f32::NAN; n];
                let s = f(values.as_ptr(), shift, out.as_mut_ptr(), n);
                for (x, y) in values[..n].iter().zip(&out) {
                    assert_eq!(y.to_bits(), exp1(x - shift).to_bits(), "exp({x} - {shift})");
                }
                // Without an output, and in place, the sum is the same.
                assert_eq!(
                    f(values.as_ptr(), shift, std::ptr::null_mut(), n).to_bits(),
                    s.to_bits()
                );
                let mut inplace = values[..n].to_vec();
                let p = inplace.as_mut_ptr();
                assert_eq!(f(p, shift, p, n).to_bits(), s.to_bits());
                assert_eq!(inplace, out);
                sums.push(s.to_bits());
            }
            assert!(sums.windows(2).all(|w| w[0] == w[1]), "n = {n}: {sums:?}");
            let want: f64 = values[..n].iter().map(|&x| f64::from(x - shift).exp()).sum();
            let got = f64::from_bits(sums[0]);
            assert!((got - want).abs() <= 1e-6 * want.max(1.0), "n = {n}: {got} vs {want}");
        }
    }

    #[test]
    fn the_logsumexp_folds_agree_bit_for_bit_on_every_host_path() {
        // The same lanes in the same order on every path: AVX-512, AVX2 and plain give the
        // same state, and it matches the f64 reference.
        let values = spread();
        let paths: Vec<LseBlock> = host_paths!(lse);
        for n in [1, 15, 16, 17, 64, 2048, 2049, 5000] {
            let results: Vec<(u64, u64)> = paths
                .iter()
                .map(|f| {
                    let mut state = LseState { max: f64::NEG_INFINITY, sum: 0.0 };
                    f(values.as_ptr(), n, &mut state);
                    (state.max.to_bits(), state.sum.to_bits())
                })
                .collect();
            assert!(results.windows(2).all(|w| w[0] == w[1]), "n = {n}: {results:?}");
            let state =
                LseState { max: f64::from_bits(results[0].0), sum: f64::from_bits(results[0].1) };
            let want = kiln_ir::semantics::logsumexp(values[..n].iter().map(|&v| f64::from(v)));
            let got = f64::from(lse_end(&state));
            assert!((got - want).abs() < 2e-6 * want.abs().max(1.0), "n = {n}: {got} vs {want}");
        }
    }
}
