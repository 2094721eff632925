//! Integer dot products of quantized rows with quantized activations, as llama.cpp computes
//! a decode step: the activations are quantized once per product ([`super::quantize`]:
//! Q8_0 blocks for Q8_0 and Q4_0 weights, Q8_K for Q4_K and Q6_K), each block's products
//! summed in `i32` and scaled once. On x86-64 with AVX2 the sums are `pmaddubsw`/`pmaddwd`
//! (32 products in two instructions, where the f32 loops of [`super::dot_rows`] convert
//! every weight to a float first; Q4_0 rows go eight at a time, one row per lane); the
//! portable build does the same integer arithmetic, so both give the same sums, and they
//! differ from the f32 product by the activations' rounding (at most half a step of each
//! block's scale per value).

use super::dot::{DotPath, host_path};
use super::{DequantizeError, GgmlType, half_at};

/// The activation blocks the integer product with `kind` weights reads, or `None` for a
/// type without one.
pub fn activation_type(kind: GgmlType) -> Option<GgmlType> {
    match kind {
        GgmlType::Q8_0 | GgmlType::Q4_0 => Some(GgmlType::Q8_0),
        GgmlType::Q4_K | GgmlType::Q6_K => Some(GgmlType::Q8_K),
        _ => None,
    }
}

/// `out[i] = row_i · a` for the `out.len()` rows of `kind` in `rows` and the activations
/// `a` quantized as [`activation_type`]`(kind)`, on the host's path.
///
/// # Errors
/// As [`dot_rows_int8_on`].
pub fn dot_rows_int8(
    kind: GgmlType,
    rows: &[u8],
    a: &[u8],
    out: &mut [f32],
) -> Result<(), DequantizeError> {
    dot_rows_int8_on(host_path(), kind, rows, a, out)
}

/// [`dot_rows_int8`] on `path`.
///
/// # Errors
/// [`DequantizeError::Unsupported`] for a type without an [`activation_type`];
/// [`DequantizeError::Size`] when `a` is not whole activation blocks or `rows` is not
/// `out.len()` rows of as many values.
pub fn dot_rows_int8_on(
    path: DotPath,
    kind: GgmlType,
    rows: &[u8],
    a: &[u8],
    out: &mut [f32],
) -> Result<(), DequantizeError> {
    let act = activation_type(kind).ok_or(DequantizeError::Unsupported(kind))?;
    let (act_values, act_size) = act.block().expect("an activation type is known");
    let values = a.len() / act_size * act_values;
    let row_bytes = kind.bytes_of(values).filter(|_| a.len().is_multiple_of(act_size));
    if row_bytes.and_then(|r| r.checked_mul(out.len())) != Some(rows.len()) {
        let values = out.len().saturating_mul(values);
        return Err(DequantizeError::Size { kind, values, bytes: rows.len() });
    }
    let row_bytes = row_bytes.expect("checked above");
    if row_bytes == 0 {
        out.fill(0.0);
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if path == DotPath::Avx2 && host_path() == DotPath::Avx2 {
        let (mut rows, mut out) = (rows, out);
        if kind == GgmlType::Q4_0 && out.len() >= 8 {
            // Eight rows at a time (the rest one by one below), with each activation
            // block's sum times 8 computed once for all of them.
            let corrections: Vec<i32> = a
                .chunks_exact(34)
                .map(|b| 8 * b[2..].iter().map(|&v| i32::from(v as i8)).sum::<i32>())
                .collect();
            let whole = out.len() / 8 * 8;
            let (groups, rest) = rows.split_at(whole * row_bytes);
            let (outs, rest_out) = out.split_at_mut(whole);
            for (w, o) in groups.chunks_exact(8 * row_bytes).zip(outs.chunks_exact_mut(8)) {
                // SAFETY: the CPU has AVX2, FMA and F16C (`host_path`); `w` is eight rows of
                // the blocks `a` has (checked above), `corrections` one per block.
                unsafe { avx2::q4_0_rows8(w, a, &corrections, o) };
            }
            (rows, out) = (rest, rest_out);
        }
        let row: unsafe fn(&[u8], &[u8]) -> f32 = match kind {
            GgmlType::Q8_0 => avx2::q8_0_row,
            GgmlType::Q4_0 => avx2::q4_0_row,
            GgmlType::Q4_K => avx2::q4_k_row,
            _ => avx2::q6_k_row,
        };
        for (w, o) in rows.chunks_exact(row_bytes).zip(out.iter_mut()) {
            // SAFETY: the CPU has AVX2, FMA and F16C (`host_path`); `w` and `a` are whole
            // blocks of one row's values (checked above).
            *o = unsafe { row(w, a) };
        }
        return Ok(());
    }
    let _ = path;
    let row: fn(&[u8], &[u8]) -> f32 = match kind {
        GgmlType::Q8_0 => q8_0_row,
        GgmlType::Q4_0 => q4_0_row,
        GgmlType::Q4_K => q4_k_row,
        _ => q6_k_row,
    };
    for (w, o) in rows.chunks_exact(row_bytes).zip(out.iter_mut()) {
        *o = row(w, a);
    }
    Ok(())
}

fn i8_at(b: &[u8], at: usize) -> i32 {
    i32::from(b[at] as i8)
}

/// The `f32` scale of a Q8_K block.
fn q8_k_scale(a: &[u8]) -> f32 {
    f32::from_le_bytes([a[0], a[1], a[2], a[3]])
}

fn q8_0_row(w: &[u8], a: &[u8]) -> f32 {
    let mut total = 0f32;
    for (wb, ab) in w.chunks_exact(34).zip(a.chunks_exact(34)) {
        let sum: i32 = (2..34).map(|j| i8_at(wb, j) * i8_at(ab, j)).sum();
        total += half_at(wb, 0) * half_at(ab, 0) * sum as f32;
    }
    total
}

fn q4_0_row(w: &[u8], a: &[u8]) -> f32 {
    let mut total = 0f32;
    for (wb, ab) in w.chunks_exact(18).zip(a.chunks_exact(34)) {
        let sum: i32 = (0..16)
            .map(|j| {
                let q = wb[2 + j];
                (i32::from(q & 15) - 8) * i8_at(ab, 2 + j)
                    + (i32::from(q >> 4) - 8) * i8_at(ab, 18 + j)
            })
            .sum();
        total += half_at(wb, 0) * half_at(ab, 0) * sum as f32;
    }
    total
}

/// Q4_K's eight 6-bit scales and mins (`get_scale_min_k4` for each sub-block).
fn scales_mins_k4(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut scales, mut mins) = ([0; 8], [0; 8]);
    for j in 0..8 {
        (scales[j], mins[j]) = super::scale_min_k4(j, s);
    }
    (scales, mins)
}

fn q4_k_row(w: &[u8], a: &[u8]) -> f32 {
    let mut total = 0f32;
    for (wb, ab) in w.chunks_exact(144).zip(a.chunks_exact(292)) {
        let (scales, mins) = scales_mins_k4(&wb[4..16]);
        let (mut sum, mut min_sum) = (0i32, 0i32);
        for j in 0..8 {
            let qs = &wb[16 + 32 * (j / 2)..48 + 32 * (j / 2)];
            let part: i32 = (0..32)
                .map(|l| {
                    let q = if j % 2 == 0 { qs[l] & 15 } else { qs[l] >> 4 };
                    i32::from(q) * i8_at(ab, 4 + 32 * j + l)
                })
                .sum();
            sum += i32::from(scales[j]) * part;
            let bsums = i16_at(ab, 260 + 4 * j) + i16_at(ab, 262 + 4 * j);
            min_sum += i32::from(mins[j]) * bsums;
        }
        let da = q8_k_scale(ab);
        total += da * half_at(wb, 0) * sum as f32 - da * half_at(wb, 2) * min_sum as f32;
    }
    total
}

fn i16_at(b: &[u8], at: usize) -> i32 {
    i32::from(i16::from_le_bytes([b[at], b[at + 1]]))
}

fn q6_k_row(w: &[u8], a: &[u8]) -> f32 {
    let mut total = 0f32;
    for (wb, ab) in w.chunks_exact(210).zip(a.chunks_exact(292)) {
        let mut sums = [0i32; 16];
        for half in 0..2 {
            let (ql, qh) = (&wb[64 * half..], &wb[128 + 32 * half..]);
            for l in 0..32 {
                let h = qh[l];
                let q = [
                    (ql[l] & 15) | ((h & 3) << 4),
                    (ql[l + 32] & 15) | (((h >> 2) & 3) << 4),
                    (ql[l] >> 4) | (((h >> 4) & 3) << 4),
                    (ql[l + 32] >> 4) | (((h >> 6) & 3) << 4),
                ];
                for (k, &q) in q.iter().enumerate() {
                    let v = 128 * half + 32 * k + l;
                    sums[v / 16] += (i32::from(q) - 32) * i8_at(ab, 4 + v);
                }
            }
        }
        let sum: i32 = sums.iter().enumerate().map(|(s, &v)| i8_at(wb, 192 + s) * v).sum();
        total += q8_k_scale(ab) * half_at(wb, 208) * sum as f32;
    }
    total
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use std::arch::x86_64::*;

    /// The `f16` at `b[at..at + 2]` (F16C).
    #[inline(always)]
    pub(in crate::quant) unsafe fn half(b: &[u8], at: usize) -> f32 {
        let bits = i32::from(u16::from_le_bytes([b[at], b[at + 1]]));
        // SAFETY: the CPU has AVX2, FMA and F16C (these run only where `host_path` found them).
        unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits))) }
    }

    #[inline(always)]
    unsafe fn load(b: &[u8], at: usize) -> __m256i {
        assert!(at + 32 <= b.len());
        // SAFETY: 32 bytes from `at` lie in `b` (asserted; the callers' offsets are
        // constants inside whole blocks, so the check folds away).
        unsafe { _mm256_loadu_si256(b.as_ptr().add(at).cast()) }
    }

    /// The sum of the eight lanes (also the f32 dot products' in `matmul::gemv`). Compiled
    /// with AVX itself, so that its intrinsics inline into it and it into its callers (without
    /// the attribute, `gemv`'s decode products measured 12-15% slower).
    ///
    /// # Safety
    /// The CPU has AVX (every caller runs only where AVX2 was found).
    #[target_feature(enable = "avx")]
    #[inline]
    pub(crate) unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// `Σ w·a` of 32 pairs of signed bytes in eight `i32` lanes. `a` (the activations)
    /// never holds -128, so moving `w`'s signs onto it is exact and each pair of products
    /// fits `pmaddubsw`'s `i16`.
    #[inline(always)]
    unsafe fn dot_i8(w: __m256i, a: __m256i) -> __m256i {
        // SAFETY: the CPU has AVX2, FMA and F16C (these run only where `host_path` found them).
        unsafe {
            let products = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
            _mm256_madd_epi16(products, _mm256_set1_epi16(1))
        }
    }

    /// Two blocks' scale products (`w` and `a` scales of blocks `i` and `i + 1`), each
    /// broadcast over four lanes: one conversion of four `f16`s.
    #[inline(always)]
    unsafe fn scales2(w0: &[u8], a0: &[u8], w1: &[u8], a1: &[u8]) -> __m256 {
        let bits = |b: &[u8]| i16::from_le_bytes([b[0], b[1]]);
        // SAFETY: the CPU has AVX2, FMA and F16C (these run only where `host_path` found them).
        unsafe {
            let h = _mm_setr_epi16(bits(w0), bits(a0), bits(w1), bits(a1), 0, 0, 0, 0);
            let f = _mm_cvtph_ps(h);
            // [w0 a0 w1 a1] times [a0 w0 a1 w1]: [d0 d0 d1 d1].
            let d = _mm_mul_ps(f, _mm_shuffle_ps(f, f, 0b10_11_00_01));
            let d0 = _mm_shuffle_ps(d, d, 0);
            let d1 = _mm_shuffle_ps(d, d, 0b10_10_10_10);
            _mm256_set_m128(d1, d0)
        }
    }

    /// `Σ` over pairs of blocks with two accumulators (one block's sum in each half of a
    /// register would need a shuffle; two independent chains hide the multiply-add's
    /// latency), the odd last block alone.
    #[inline(always)]
    unsafe fn pairs(
        w: &[u8],
        a: &[u8],
        (w_size, a_size): (usize, usize),
        sum: impl Fn(&[u8], &[u8]) -> __m256i,
    ) -> f32 {
        // SAFETY: the CPU has AVX2, FMA and F16C (these run only where `host_path` found them).
        unsafe {
            let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let mut ws = w.chunks_exact(2 * w_size);
            let mut as_ = a.chunks_exact(2 * a_size);
            for (wb, ab) in (&mut ws).zip(&mut as_) {
                let (w0, w1) = wb.split_at(w_size);
                let (a0, a1) = ab.split_at(a_size);
                let d = scales2(w0, a0, w1, a1);
                let (s0, s1) = (_mm256_cvtepi32_ps(sum(w0, a0)), _mm256_cvtepi32_ps(sum(w1, a1)));
                acc0 = _mm256_fmadd_ps(_mm256_permute2f128_ps(d, d, 0x00), s0, acc0);
                acc1 = _mm256_fmadd_ps(_mm256_permute2f128_ps(d, d, 0x11), s1, acc1);
            }
            if let (w0 @ [_, ..], a0 @ [_, ..]) = (ws.remainder(), as_.remainder()) {
                let d = _mm256_set1_ps(half(w0, 0) * half(a0, 0));
                acc0 = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum(w0, a0)), acc0);
            }
            hsum(_mm256_add_ps(acc0, acc1))
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_0_row(w: &[u8], a: &[u8]) -> f32 {
        // SAFETY: the CPU has AVX2, FMA and F16C (these run only where `host_path` found them).
        unsafe { pairs(w, a, (34, 34), |w, a| dot_i8(load(w, 2), load(a, 2))) }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_0_row(w: &[u8], a: &[u8]) -> f32 {
        let (low, eight) = (_mm256_set1_epi8(15), _mm256_set1_epi8(8));
        let sum = |wb: &[u8], ab: &[u8]| {
            let q: [u8; 16] = wb[2..18].try_into().expect("a Q4_0 block");
            // SAFETY: the CPU has AVX2, FMA and F16C (these run only where `host_path` found them).
            unsafe {
                let q = _mm_loadu_si128(q.as_ptr().cast());
                // Low nibbles are values 0-15, high nibbles 16-31.
                let both = _mm256_set_m128i(_mm_srli_epi16(q, 4), q);
                let w = _mm256_sub_epi8(_mm256_and_si256(both, low), eight);
                dot_i8(w, load(ab, 2))
            }
        };
        // SAFETY: the CPU has AVX2, FMA and F16C (these run only where `host_path` found them).
        unsafe { pairs(w, a, (18, 34), sum) }
    }

    /// Eight Q4_0 rows (`w`, one after another) times the Q8_0 activations `a`, into `out`.
    ///
    /// The row-at-a-time loop spends most of its instructions on what each row repeats:
    /// moving signs onto the activations, a horizontal sum, a scale at a time. Here a block's
    /// eight rows of 16 nibble bytes are transposed so that each 32-bit lane holds four
    /// bytes of one row; each group of four activations is broadcast to every lane, and the
    /// unsigned nibbles (0-15) multiply it in `pmaddubsw` directly. The lanes end as the
    /// eight rows' sums `Σ q·a`, from which `corrections[b]` (`8 · Σ a` of block `b`) takes
    /// the nibbles' offset of 8, and one conversion of eight `f16`s gives the rows' scales.
    /// Eight `pmaddubsw` results of at most `2 · 15 · 127` each add in `i16` without
    /// overflow (30,480).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_0_rows8(w: &[u8], a: &[u8], corrections: &[i32], out: &mut [f32]) {
        let blocks = corrections.len();
        let row_bytes = 18 * blocks;
        assert!(w.len() == 8 * row_bytes && a.len() == 34 * blocks && out.len() == 8);
        let (wp, ap) = (w.as_ptr(), a.as_ptr());
        // SAFETY: the CPU has AVX2, FMA and F16C (these run only where `host_path` found
        // them); every read is inside block `b` of row `r < 8` of `w` or block `b` of `a`
        // (sizes asserted above), and `out` holds eight floats.
        unsafe {
            let (low, ones) = (_mm256_set1_epi8(15), _mm256_set1_epi16(1));
            let mut acc = _mm256_setzero_ps();
            // The eight rows are one run of `8 · row_bytes` bytes, read as eight streams 18
            // bytes a step apart, which the hardware prefetchers left waiting on memory. Each
            // block's step asks for its share of the next eight rows' bytes (144 per block),
            // so that they arrive while these are multiplied. (The row-at-a-time loops read
            // one stream the hardware follows: asking for the row two ahead there made Q8_0's
            // and per-channel int8's decode 5-14% slower, so they do not.)
            let next = wp.wrapping_add(8 * row_bytes);
            for (b, &correction) in corrections.iter().enumerate() {
                kiln_codegen::cpu::prefetch(next.wrapping_add(144 * b), 192);
                let block = |r: usize| wp.add(r * row_bytes + 18 * b);
                let nibbles = |r: usize| _mm_loadu_si128(block(r).add(2).cast());
                let pair = |r: usize| _mm256_set_m128i(nibbles(r + 4), nibbles(r));
                let (q0, q1, q2, q3) = (pair(0), pair(1), pair(2), pair(3));
                let (t0, t1) = (_mm256_unpacklo_epi32(q0, q1), _mm256_unpackhi_epi32(q0, q1));
                let (t2, t3) = (_mm256_unpacklo_epi32(q2, q3), _mm256_unpackhi_epi32(q2, q3));
                // Lane r of x[k]: bytes 4k..4k + 4 of row r (values 4k.. low, 16 + 4k.. high).
                let x = [
                    _mm256_unpacklo_epi64(t0, t2),
                    _mm256_unpackhi_epi64(t0, t2),
                    _mm256_unpacklo_epi64(t1, t3),
                    _mm256_unpackhi_epi64(t1, t3),
                ];
                let values = ap.add(34 * b + 2);
                let four =
                    |at: usize| _mm256_set1_epi32(values.add(at).cast::<i32>().read_unaligned());
                let mut sum = _mm256_setzero_si256();
                for (k, x) in x.into_iter().enumerate() {
                    let (lo, hi) =
                        (_mm256_and_si256(x, low), _mm256_and_si256(_mm256_srli_epi16(x, 4), low));
                    sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(lo, four(4 * k)));
                    sum = _mm256_add_epi16(sum, _mm256_maddubs_epi16(hi, four(16 + 4 * k)));
                }
                let sums =
                    _mm256_sub_epi32(_mm256_madd_epi16(sum, ones), _mm256_set1_epi32(correction));
                let scale = |r: usize| block(r).cast::<i16>().read_unaligned();
                let h = _mm_setr_epi16(
                    scale(0),
                    scale(1),
                    scale(2),
                    scale(3),
                    scale(4),
                    scale(5),
                    scale(6),
                    scale(7),
                );
                let d = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(half(a, 34 * b)));
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sums), acc);
            }
            _mm256_storeu_ps(out.as_mut_ptr(), acc);
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_k_row(w: &[u8], a: &[u8]) -> f32 {
        let (mut acc, mut acc_min) = (_mm256_setzero_ps(), _mm_setzero_ps());
        let low = _mm256_set1_epi8(15);
        for (wb, ab) in w.chunks_exact(144).zip(a.chunks_exact(292)) {
            let (scales, mins) = super::scales_mins_k4(&wb[4..16]);
            let bsums: [u8; 32] = ab[260..292].try_into().expect("a Q8_K block");
            // SAFETY: the CPU has AVX2, FMA and F16C (these run only where `host_path` found them).
            unsafe {
                let da = super::q8_k_scale(ab);
                // The mins times each sub-block's activation sum (pairs of the block's
                // sums of 16).
                let bsums = _mm256_loadu_si256(bsums.as_ptr().cast());
                let pairs = _mm_hadd_epi16(
                    _mm256_castsi256_si128(bsums),
                    _mm256_extracti128_si256(bsums, 1),
                );
                let mins = _mm_cvtepu8_epi16(_mm_loadl_epi64(mins.as_ptr().cast()));
                let by_min = _mm_cvtepi32_ps(_mm_madd_epi16(mins, pairs));
                acc_min = _mm_fmadd_ps(_mm_set1_ps(-da * half(wb, 2)), by_min, acc_min);
                let mut sum = _mm256_setzero_si256();
                for j in 0..4 {
                    let q = load(wb, 16 + 32 * j);
                    let q_low = _mm256_and_si256(q, low);
                    let q_high = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
                    let p_low = _mm256_maddubs_epi16(q_low, load(ab, 4 + 64 * j));
                    let p_high = _mm256_maddubs_epi16(q_high, load(ab, 36 + 64 * j));
                    let s_low = _mm256_set1_epi16(i16::from(scales[2 * j]));
                    let s_high = _mm256_set1_epi16(i16::from(scales[2 * j + 1]));
                    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(s_low, p_low));
                    sum = _mm256_add_epi32(sum, _mm256_madd_epi16(s_high, p_high));
                }
                let d = _mm256_set1_ps(da * half(wb, 0));
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum), acc);
            }
        }
        // SAFETY: the CPU has AVX2, FMA and F16C (these run only where `host_path` found them).
        unsafe {
            let m = _mm_add_ps(acc_min, _mm_movehl_ps(acc_min, acc_min));
            hsum(acc) + _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)))
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q6_k_row(w: &[u8], a: &[u8]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let (low, two, offset) = (_mm256_set1_epi8(15), _mm256_set1_epi8(3), _mm256_set1_epi8(32));
        for (wb, ab) in w.chunks_exact(210).zip(a.chunks_exact(292)) {
            // SAFETY: the CPU has AVX2, FMA and F16C (these run only where `host_path` found them).
            unsafe {
                let mut sum = _mm256_setzero_si256();
                for half in 0..2 {
                    let (ql0, ql1) = (load(wb, 64 * half), load(wb, 64 * half + 32));
                    let qh = load(wb, 128 + 32 * half);
                    let high = |shift: i32| {
                        let bits = match shift {
                            0 => qh,
                            2 => _mm256_srli_epi16(qh, 2),
                            4 => _mm256_srli_epi16(qh, 4),
                            _ => _mm256_srli_epi16(qh, 6),
                        };
                        _mm256_slli_epi16(_mm256_and_si256(bits, two), 4)
                    };
                    let q = [
                        _mm256_or_si256(_mm256_and_si256(ql0, low), high(0)),
                        _mm256_or_si256(_mm256_and_si256(ql1, low), high(2)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low), high(4)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low), high(6)),
                    ];
                    for (k, &q) in q.iter().enumerate() {
                        let a = load(ab, 4 + 128 * half + 32 * k);
                        // (q - 32)·a as q·a less 32·a (pmaddubsw takes unsigned q).
                        let p = _mm256_sub_epi16(
                            _mm256_maddubs_epi16(q, a),
                            _mm256_maddubs_epi16(offset, a),
                        );
                        // Values 0-15 of the 32 take one scale, 16-31 the next.
                        let s = 192 + 8 * half + 2 * k;
                        let scale = _mm256_set_m128i(
                            _mm_set1_epi16(i16::from(wb[s + 1] as i8)),
                            _mm_set1_epi16(i16::from(wb[s] as i8)),
                        );
                        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(scale, p));
                    }
                }
                let d = _mm256_set1_ps(super::q8_k_scale(ab) * half(wb, 208));
                acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sum), acc);
            }
        }
        // SAFETY: the CPU has AVX2, FMA and F16C (these run only where `host_path` found them).
        unsafe { hsum(acc) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{dequantize, quantize};

    /// Pseudo-random weight blocks with small finite scales (as `dot.rs`'s tests make them).
    fn blocks(kind: GgmlType, rows: usize, cols: usize, seed: u32) -> Vec<u8> {
        let (values, size) = kind.block().unwrap();
        let mut state = seed;
        let mut bytes: Vec<u8> = (0..rows * cols / values * size)
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 24) as u8
            })
            .collect();
        let fields: &[usize] = match kind {
            GgmlType::Q4_K => &[0, 2],
            GgmlType::Q6_K => &[208],
            _ => &[0],
        };
        for block in bytes.chunks_exact_mut(size) {
            for &at in fields {
                block[at] = 0;
                block[at + 1] = 0x20 | (block[at + 1] & 0x83);
            }
        }
        bytes
    }

    #[test]
    fn integer_products_are_the_f64_products_of_both_sides_values() {
        let kinds = [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K];
        // 19 rows: AVX2's Q4_0 loop takes eight at a time and leaves three; 800 values are
        // an odd count of 32-value blocks. The last case is every nibble 15 against every
        // activation 127, the largest sum Q4_0's eight-row loop adds in 16 bits.
        let cases: [(usize, usize, bool); 4] =
            [(7, 768, false), (19, 800, false), (19, 768, false), (16, 64, true)];
        for (kind, (rows, cols, extreme)) in kinds.into_iter().flat_map(|k| cases.map(|c| (k, c))) {
            if !cols.is_multiple_of(kind.block().unwrap().0) || (extreme && kind != GgmlType::Q4_0)
            {
                continue;
            }
            let mut bytes = blocks(kind, rows, cols, 5);
            if extreme {
                for block in bytes.chunks_exact_mut(18) {
                    block[2..].fill(0xff);
                }
            }
            let x: Vec<f32> = (0..cols)
                .map(|i| if extreme { 1.0 } else { ((i * 37 % 101) as f32 - 50.0) / 25.0 })
                .collect();
            let act = activation_type(kind).unwrap();
            let mut a = vec![0; act.bytes_of(cols).unwrap()];
            quantize(act, &x, &mut a).unwrap();
            let mut xq = vec![0f32; cols];
            dequantize(act, &a, &mut xq).unwrap();
            let mut w = vec![0f32; rows * cols];
            dequantize(kind, &bytes, &mut w).unwrap();
            let mut results = vec![];
            for path in [DotPath::Portable, DotPath::Avx2] {
                let mut out = vec![0f32; rows];
                dot_rows_int8_on(path, kind, &bytes, &a, &mut out).unwrap();
                for (r, &got) in out.iter().enumerate() {
                    let row = &w[r * cols..(r + 1) * cols];
                    let terms = row.iter().zip(&xq).map(|(&w, &x)| f64::from(w) * f64::from(x));
                    let want: f64 = terms.clone().sum();
                    let scale: f64 = terms.map(f64::abs).sum();
                    let error = (f64::from(got) - want).abs() / scale;
                    assert!(
                        error < 1e-5,
                        "{kind} {path:?} {rows}x{cols} row {r}: {got} against {want}"
                    );
                }
                results.push(out);
            }
            // Both builds sum the same integers; only the float accumulation order differs.
            for (p, v) in results[0].iter().zip(&results[1]) {
                assert!((p - v).abs() <= 1e-5 * p.abs().max(1.0), "{kind}: {p} and {v}");
            }
        }
    }

    #[test]
    fn types_without_activations_and_wrong_sizes_are_errors() {
        let mut out = [0f32; 2];
        let q5 = GgmlType::Q5_0;
        assert_eq!(
            dot_rows_int8(q5, &[0; 44], &[0; 34], &mut out),
            Err(DequantizeError::Unsupported(q5))
        );
        assert!(dot_rows_int8(GgmlType::Q8_0, &[0; 67], &[0; 34], &mut out).is_err());
        assert!(dot_rows_int8(GgmlType::Q8_0, &[0; 68], &[0; 33], &mut out).is_err());
        assert!(dot_rows_int8(GgmlType::Q4_K, &[0; 288], &[0; 291], &mut out).is_err());
        dot_rows_int8(GgmlType::Q4_K, &[0; 288], &[0; 292], &mut out).unwrap();
    }
}
