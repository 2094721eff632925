//! Per-channel symmetric int8 weights (torchao's `Int8WeightOnlyConfig`, PyTorch's
//! `per_channel_symmetric`): each row of a weight is `i8` values and one `f32` scale,
//! `w ≈ scale · q`. [`quantize_rows_i8`] writes them; [`dot_rows_i8`] takes a decode step's
//! dot products with f32 inputs, [`dot_rows_i8_int8`] with inputs quantized to Q8_0 blocks
//! (integer products, as [`super::int8`] does for GGML's types). AVX2 loops where the host
//! has them ([`super::host_path`]), portable ones elsewhere, both tested.

use rayon::prelude::*;

use super::dot::{DotPath, host_path};
use super::{DequantizeError, GgmlType, half_at};

/// torchao's floor on a scale (`torch.finfo(torch.float32).eps`): a row of zeros keeps a
/// positive scale.
const EPS: f32 = f32::EPSILON;

/// Quantizes `x` (rows of `k` values) to `q` and one scale per row, as torchao does:
/// `scale = max(max|x| / 127.5, eps)` and `q = clamp(round_half_even(x · (1 / scale)),
/// -128, 127)`, in f32.
///
/// # Errors
/// [`DequantizeError::Size`] when `x` is not `scales.len()` rows of `k` values or `q` not
/// as long as `x`.
pub fn quantize_rows_i8(
    x: &[f32],
    k: usize,
    q: &mut [i8],
    scales: &mut [f32],
) -> Result<(), DequantizeError> {
    if scales.len().checked_mul(k) != Some(x.len()) || q.len() != x.len() {
        return Err(size(x.len(), q.len()));
    }
    if k == 0 {
        scales.fill(EPS);
        return Ok(());
    }
    let row = |((x, q), s): ((&[f32], &mut [i8]), &mut f32)| {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        *s = (amax / 127.5).max(EPS);
        let inv = 1.0 / *s;
        for (q, &v) in q.iter_mut().zip(x) {
            *q = (v * inv).round_ties_even().clamp(-128.0, 127.0) as i8;
        }
    };
    x.par_chunks(k).zip(q.par_chunks_mut(k)).zip(scales.par_iter_mut()).for_each(row);
    Ok(())
}

fn size(values: usize, bytes: usize) -> DequantizeError {
    DequantizeError::Size { kind: GgmlType::I8, values, bytes }
}

/// `out[i] = scales[i] · (row_i · x)` for the `out.len()` rows of `x.len()` values in
/// `rows`, on the host's path.
///
/// # Errors
/// As [`dot_rows_i8_on`].
pub fn dot_rows_i8(
    rows: &[i8],
    scales: &[f32],
    x: &[f32],
    out: &mut [f32],
) -> Result<(), DequantizeError> {
    dot_rows_i8_on(host_path(), rows, scales, x, out)
}

/// [`dot_rows_i8`] on `path`.
///
/// # Errors
/// [`DequantizeError::Size`] when `rows` is not `out.len()` rows of `x.len()` values or
/// `scales` not one per row.
pub fn dot_rows_i8_on(
    path: DotPath,
    rows: &[i8],
    scales: &[f32],
    x: &[f32],
    out: &mut [f32],
) -> Result<(), DequantizeError> {
    let k = x.len();
    if out.len().checked_mul(k) != Some(rows.len()) || scales.len() != out.len() {
        return Err(size(out.len().saturating_mul(k), rows.len()));
    }
    if k == 0 {
        out.fill(0.0);
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if path == DotPath::Avx2 && host_path() == DotPath::Avx2 {
        for ((w, s), o) in rows.chunks_exact(k).zip(scales).zip(out.iter_mut()) {
            // SAFETY: the CPU has AVX2, FMA and F16C (`host_path`); `w` and `x` are `k` long.
            *o = s * unsafe { avx2::f32_row(w, x) };
        }
        return Ok(());
    }
    let _ = path;
    for ((w, s), o) in rows.chunks_exact(k).zip(scales).zip(out.iter_mut()) {
        // Eight lanes, as the vector loop sums them.
        let mut lanes = [0f32; 8];
        for (i, (&q, &v)) in w.iter().zip(x).enumerate() {
            lanes[i % 8] += f32::from(q) * v;
        }
        *o = s * lanes.iter().sum::<f32>();
    }
    Ok(())
}

/// `out[i] = scales[i] · (row_i · a)` for `a` the input quantized to Q8_0 blocks (as many
/// values as each row), on the host's path.
///
/// # Errors
/// As [`dot_rows_i8_int8_on`].
pub fn dot_rows_i8_int8(
    rows: &[i8],
    scales: &[f32],
    a: &[u8],
    out: &mut [f32],
) -> Result<(), DequantizeError> {
    dot_rows_i8_int8_on(host_path(), rows, scales, a, out)
}

/// [`dot_rows_i8_int8`] on `path`: per block of 32 an exact `i32` sum of products, scaled by
/// the block's activation scale, the row's sum scaled by its weight scale.
///
/// # Errors
/// [`DequantizeError::Size`] when `a` is not whole Q8_0 blocks, `rows` not `out.len()` rows
/// of as many values, or `scales` not one per row.
pub fn dot_rows_i8_int8_on(
    path: DotPath,
    rows: &[i8],
    scales: &[f32],
    a: &[u8],
    out: &mut [f32],
) -> Result<(), DequantizeError> {
    let k = a.len() / 34 * 32;
    let whole = a.len().is_multiple_of(34);
    if !whole || out.len().checked_mul(k) != Some(rows.len()) || scales.len() != out.len() {
        return Err(size(out.len().saturating_mul(k), rows.len()));
    }
    if k == 0 {
        out.fill(0.0);
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if path == DotPath::Avx2 && host_path() == DotPath::Avx2 {
        for ((w, s), o) in rows.chunks_exact(k).zip(scales).zip(out.iter_mut()) {
            // SAFETY: the CPU has AVX2, FMA and F16C (`host_path`); `w` holds the values of
            // `a`'s whole blocks.
            *o = s * unsafe { avx2::int8_row(w, a) };
        }
        return Ok(());
    }
    let _ = path;
    for ((w, s), o) in rows.chunks_exact(k).zip(scales).zip(out.iter_mut()) {
        let mut total = 0f32;
        for (wb, ab) in w.chunks_exact(32).zip(a.chunks_exact(34)) {
            let sum: i32 =
                wb.iter().zip(&ab[2..]).map(|(&q, &v)| i32::from(q) * i32::from(v as i8)).sum();
            total += half_at(ab, 0) * sum as f32;
        }
        *o = s * total;
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::int8::avx2::{half, hsum};

    /// `Σ w·x`: eight weights widened to f32 at a time, two accumulators; the tail of fewer
    /// than eight in the scalar lanes' order.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn f32_row(w: &[i8], x: &[f32]) -> f32 {
        let n = w.len().min(x.len());
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        // SAFETY: every load reads 8 values at `i + 8 <= n` (or 16 at `i + 16 <= n`).
        unsafe {
            while i + 16 <= n {
                let q = _mm_loadu_si128(w.as_ptr().add(i).cast());
                let w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                let w1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
                acc0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x.as_ptr().add(i)), acc0);
                acc1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x.as_ptr().add(i + 8)), acc1);
                i += 16;
            }
            while i + 8 <= n {
                let q = _mm_loadl_epi64(w.as_ptr().add(i).cast());
                let w0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                acc0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x.as_ptr().add(i)), acc0);
                i += 8;
            }
            let tail: f32 = (i..n).map(|j| f32::from(w[j]) * x[j]).sum();
            hsum(_mm256_add_ps(acc0, acc1)) + tail
        }
    }

    /// `Σ` over Q8_0 blocks of `d_a · Σ w·a`, each block's products in `i32` lanes
    /// (`pmaddubsw` on `|w|` and `a` carrying `w`'s signs: `a` never holds -128, and
    /// `|-128|` is 128 as an unsigned byte).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn int8_row(w: &[i8], a: &[u8]) -> f32 {
        let ones = _mm256_set1_epi16(1);
        let mut acc = _mm256_setzero_ps();
        for (wb, ab) in w.chunks_exact(32).zip(a.chunks_exact(34)) {
            // SAFETY: `wb` is 32 bytes and `ab[2..]` 32 bytes (whole blocks, checked by the
            // caller); the CPU has AVX2, FMA and F16C.
            unsafe {
                let q = _mm256_loadu_si256(wb.as_ptr().cast());
                let v = _mm256_loadu_si256(ab.as_ptr().add(2).cast());
                let products = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(v, q));
                let sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(products, ones));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(half(ab, 0)), sums, acc);
            }
        }
        // SAFETY: the CPU has AVX2, FMA and F16C.
        unsafe { hsum(acc) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng_values(n: usize, seed: u64) -> Vec<f32> {
        (0..n as u64).map(|i| (kiln_ir::random::uniform(seed, i, 24) * 4.0 - 2.0) as f32).collect()
    }

    fn paths() -> Vec<DotPath> {
        let mut paths = vec![DotPath::Portable];
        if host_path() == DotPath::Avx2 {
            paths.push(DotPath::Avx2);
        }
        paths
    }

    #[test]
    fn rows_quantize_as_torchao_does() {
        // max|x| = 2.55: scale 0.02, and -2.55 / 0.02 = -127.5 rounds half to even (-128).
        let x = [-2.55f32, 1.27, 0.01, 0.03, 0.0, 0.0, 0.0, 0.0];
        let (mut q, mut s) = ([0i8; 8], [0f32; 2]);
        quantize_rows_i8(&x, 4, &mut q, &mut s).unwrap();
        assert_eq!(s, [2.55f32 / 127.5, EPS]);
        let inv = 1.0 / s[0];
        let want: Vec<i8> =
            x[..4].iter().map(|v| (v * inv).round_ties_even().clamp(-128.0, 127.0) as i8).collect();
        assert_eq!(&q[..4], &want[..]);
        assert_eq!(q[0], -128);
        assert_eq!(&q[4..], &[0; 4]);
        assert!(quantize_rows_i8(&x, 3, &mut q, &mut s).is_err());
    }

    #[test]
    fn products_match_the_f64_product_of_the_values_on_every_path() {
        for (n, k) in [(5usize, 1usize), (3, 7), (4, 32), (6, 77), (3, 96)] {
            let w = rng_values(n * k, 1 + k as u64);
            let (mut q, mut s) = (vec![0i8; n * k], vec![0f32; n]);
            quantize_rows_i8(&w, k, &mut q, &mut s).unwrap();
            let x = rng_values(k, 50 + k as u64);
            let want: Vec<f64> = (0..n)
                .map(|r| {
                    let row = &q[r * k..(r + 1) * k];
                    let dot: f64 =
                        row.iter().zip(&x).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
                    f64::from(s[r]) * dot
                })
                .collect();
            for path in paths() {
                let mut out = vec![0f32; n];
                dot_rows_i8_on(path, &q, &s, &x, &mut out).unwrap();
                for (o, w) in out.iter().zip(&want) {
                    assert!((f64::from(*o) - w).abs() < 1e-5 * (1.0 + w.abs()), "{path:?} {n}x{k}");
                }
            }
            if !k.is_multiple_of(32) {
                continue;
            }
            // Integer products: against the f64 product of the dequantized activations.
            let mut a = vec![0u8; k / 32 * 34];
            super::super::quantize(GgmlType::Q8_0, &x, &mut a).unwrap();
            let mut xa = vec![0f32; k];
            super::super::dequantize(GgmlType::Q8_0, &a, &mut xa).unwrap();
            let want: Vec<f64> = (0..n)
                .map(|r| {
                    let row = &q[r * k..(r + 1) * k];
                    let dot: f64 =
                        row.iter().zip(&xa).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
                    f64::from(s[r]) * dot
                })
                .collect();
            for path in paths() {
                let mut out = vec![0f32; n];
                dot_rows_i8_int8_on(path, &q, &s, &a, &mut out).unwrap();
                for (o, w) in out.iter().zip(&want) {
                    assert!(
                        (f64::from(*o) - w).abs() < 1e-5 * (1.0 + w.abs()),
                        "{path:?} int8 {n}x{k}"
                    );
                }
            }
        }
    }

    #[test]
    fn sizes_that_disagree_are_errors() {
        let mut out = [0f32; 2];
        assert!(dot_rows_i8(&[0; 6], &[1.0; 2], &[0.0; 4], &mut out).is_err());
        assert!(dot_rows_i8(&[0; 8], &[1.0; 1], &[0.0; 4], &mut out).is_err());
        assert!(dot_rows_i8_int8(&[0; 64], &[1.0; 2], &[0; 33], &mut out).is_err());
        assert!(dot_rows_i8_int8(&[0; 32], &[1.0; 2], &[0; 34], &mut out).is_err());
    }
}
