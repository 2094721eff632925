//! Quantization to GGML's blocks, as GGML's reference functions (`quantize_row_*_ref`) do:
//! weights to Q8_0, Q4_0 or Q4_K (what `quantize_` in `kiln-models` writes), and
//! activations to Q8_0 or Q8_K for the integer dot products of [`super::int8`].

use half::f16;
use rayon::prelude::*;

use super::{DequantizeError, GgmlType};

/// The types [`quantize`] writes.
pub fn quantized() -> impl Iterator<Item = GgmlType> {
    [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q8_K].into_iter()
}

/// Writes `x` as `kind` blocks into `out` (its length the size of `x.len()` values).
///
/// Q8_0: per block of 32, `d = max|x| / 127` (an `f16`), `q = round(x / d)`. Q4_0: `d` is
/// the value of largest magnitude over -8, `q = min(15, trunc(x / d + 8.5))`. Q4_K: per
/// sub-block of 32 a scale and min found by GGML's weighted search (`make_qkx2_quants`),
/// both stored in 6 bits relative to the super-block's `f16` pair. Q8_K (256
/// values, an `f32` scale and the sums of each 16 quantized values, for the K-quants'
/// integer products): `q = round(-127 x / m)` for `m` the value of largest magnitude,
/// `d = -m / 127`. A block of zeros has scale 0.
///
/// # Errors
/// [`DequantizeError::Unsupported`] for a type outside [`quantized`];
/// [`DequantizeError::Size`] when `out` is not the size of `x.len()` values.
pub fn quantize(kind: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), DequantizeError> {
    let block: fn(&[f32], &mut [u8]) = match kind {
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q4_0 => q4_0,
        GgmlType::Q4_K => q4_k,
        GgmlType::Q8_K => q8_k,
        _ => return Err(DequantizeError::Unsupported(kind)),
    };
    if kind.bytes_of(x.len()) != Some(out.len()) {
        return Err(DequantizeError::Size { kind, values: x.len(), bytes: out.len() });
    }
    let (values, size) = kind.block().expect("a quantized type is known");
    let run = |(x, b): (&[f32], &mut [u8])| {
        #[cfg(target_arch = "x86_64")]
        if kind == GgmlType::Q8_0 && super::host_path() == super::DotPath::Avx2 {
            // SAFETY: the CPU has AVX2, FMA and F16C (`host_path`).
            return unsafe { q8_0_avx2(x, b) };
        }
        for (x, b) in x.chunks_exact(values).zip(b.chunks_exact_mut(size)) {
            block(x, b);
        }
    };
    // A model's weights are quantized in runs of whole blocks on every core.
    let blocks_per_run = super::RUN / values;
    if x.len() <= super::RUN {
        run((x, out));
    } else {
        x.par_chunks(blocks_per_run * values)
            .zip(out.par_chunks_mut(blocks_per_run * size))
            .for_each(run);
    }
    Ok(())
}

/// [`q8_0`] over whole blocks in AVX2 registers, with its values: activations are
/// quantized once per product, and the scalar loop's saturating conversions took about as
/// long as a prefill's integer product of the same rows with a 256-output weight.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_avx2(x: &[f32], b: &mut [u8]) {
    use std::arch::x86_64::*;
    let sign = _mm256_set1_ps(-0.0);
    // `round` as `roundf` (halves away from zero): `trunc(v + copysign(pred(0.5), v))`.
    let half = _mm256_set1_ps(0.499_999_97);
    let (lo, hi) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
    // NaN lanes to zero, as `as` converts them (and as `max` skips them).
    let scrub = |v: __m256| _mm256_and_ps(v, _mm256_cmp_ps::<_CMP_ORD_Q>(v, v));
    for (x, b) in x.chunks_exact(32).zip(b.chunks_exact_mut(34)) {
        // SAFETY: `x` holds 32 values.
        let v: [__m256; 4] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) });
        let abs = v.map(|v| scrub(_mm256_andnot_ps(sign, v)));
        let m = _mm256_max_ps(_mm256_max_ps(abs[0], abs[1]), _mm256_max_ps(abs[2], abs[3]));
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        let d = amax / 127.0;
        let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        b[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        let q = v.map(|v| {
            let v = _mm256_mul_ps(v, id);
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(_mm256_add_ps(
                v,
                _mm256_or_ps(_mm256_and_ps(v, sign), half),
            ));
            _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(scrub(r), lo), hi))
        });
        let bytes =
            _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        // The packs interleave 128-bit halves: put the four runs of eight back in order.
        let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: `b` holds 34 bytes; the values are its last 32.
        unsafe { _mm256_storeu_si256(b.as_mut_ptr().add(2).cast(), bytes) };
    }
}

fn q8_0(x: &[f32], b: &mut [u8]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    b[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    for (q, &v) in b[2..34].iter_mut().zip(x) {
        *q = (v * id).round() as i8 as u8;
    }
}

/// The value of largest magnitude (the first of equals, as GGML's loop keeps it).
fn extreme(x: &[f32]) -> f32 {
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn q4_0(x: &[f32], b: &mut [u8]) {
    let d = extreme(x) / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    b[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
    for (j, q) in b[2..18].iter_mut().enumerate() {
        let low = ((x[j] * id + 8.5) as i8).min(15) as u8;
        let high = ((x[j + 16] * id + 8.5) as i8).min(15) as u8;
        *q = low | (high << 4);
    }
}

/// `d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]` (`quantize_row_q4_K_ref`).
fn q4_k(x: &[f32], b: &mut [u8]) {
    let mut levels = [0u8; 256];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    for (j, x) in x.chunks_exact(32).enumerate() {
        let rms = (x.iter().map(|v| v * v).sum::<f32>() / 32.0).sqrt();
        let weights: [f32; 32] = std::array::from_fn(|l| rms + x[l].abs());
        (scales[j], mins[j]) = scale_and_min(x, &weights, &mut levels[32 * j..32 * j + 32]);
    }
    let max_scale = scales.iter().fold(0f32, |m, &s| m.max(s));
    let max_min = mins.iter().fold(0f32, |m, &s| m.max(s));
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let packed = &mut b[4..16];
    packed.fill(0);
    for j in 0..8 {
        let ls = ((inv_scale * scales[j]).round_ties_even() as u8).min(63);
        let lm = ((inv_min * mins[j]).round_ties_even() as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 15) | ((lm & 15) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let (d, dmin) = (f16::from_f32(max_scale / 63.0), f16::from_f32(max_min / 63.0));
    b[..2].copy_from_slice(&d.to_le_bytes());
    b[2..4].copy_from_slice(&dmin.to_le_bytes());
    // The levels again against the stored (rounded) scales and mins.
    for (j, x) in x.chunks_exact(32).enumerate() {
        let (sc, m) = super::scale_min_k4(j, &b[4..16]);
        let d = d.to_f32() * f32::from(sc);
        if d == 0.0 {
            continue;
        }
        let dm = dmin.to_f32() * f32::from(m);
        for (l, &v) in levels[32 * j..32 * j + 32].iter_mut().zip(x) {
            *l = ((v + dm) / d).round_ties_even().clamp(0.0, 15.0) as u8;
        }
    }
    for (run, q) in b[16..144].chunks_exact_mut(32).enumerate() {
        for (l, q) in q.iter_mut().enumerate() {
            *q = levels[64 * run + l] | (levels[64 * run + l + 32] << 4);
        }
    }
}

/// GGML's `make_qkx2_quants(32, 15, x, weights, L, &min, Laux, -1, 0.1, 20, false)`: the
/// scale and (negated) min of 4-bit levels `L` with `x ≈ scale·L - min`, the weighted
/// squared error least over 21 trial scales, each refined by least squares.
fn scale_and_min(x: &[f32], weights: &[f32; 32], levels: &mut [u8]) -> (f32, f32) {
    const NMAX: f32 = 15.0;
    let (mut min, mut max) = (x[0], x[0]);
    let (mut sum_w, mut sum_x) = (0f32, 0f32);
    for (&v, &w) in x.iter().zip(weights) {
        min = min.min(v);
        max = max.max(v);
        sum_w += w;
        sum_x += w * v;
    }
    min = min.min(0.0);
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }
    let level = |iscale: f32, v: f32, min: f32| {
        ((iscale * (v - min)).round_ties_even() as i32).clamp(0, NMAX as i32) as u8
    };
    let iscale = NMAX / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best = 0f32;
    for ((l, &v), &w) in levels.iter_mut().zip(x).zip(weights) {
        *l = level(iscale, v, min);
        let diff = scale * f32::from(*l) + min - v;
        best += w * (diff * diff);
    }
    let mut trial = [0u8; 32];
    for step in 0..=20 {
        let iscale = (-1.0 + 0.1 * step as f32 + NMAX) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for ((t, &v), &w) in trial.iter_mut().zip(x).zip(weights) {
            *t = level(iscale, v, min);
            let l = f32::from(*t);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * v;
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det <= 0.0 {
            continue;
        }
        let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
        let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
        if this_min > 0.0 {
            this_min = 0.0;
            this_scale = sum_xl / sum_l2;
        }
        let error: f32 = trial
            .iter()
            .zip(x)
            .zip(weights)
            .map(|((&l, &v), &w)| {
                let diff = this_scale * f32::from(l) + this_min - v;
                w * (diff * diff)
            })
            .sum();
        if error < best {
            levels.copy_from_slice(&trial);
            best = error;
            scale = this_scale;
            min = this_min;
        }
    }
    (scale, -min)
}

/// `d: f32, qs: [i8; 256], bsums: [i16; 16]`.
fn q8_k(x: &[f32], b: &mut [u8]) {
    let max = extreme(x);
    b.fill(0);
    if max == 0.0 {
        return;
    }
    let iscale = -127.0 / max;
    for (q, &v) in b[4..260].iter_mut().zip(x) {
        *q = ((iscale * v).round_ties_even() as i32).min(127) as i8 as u8;
    }
    for j in 0..16 {
        let sum: i16 = b[4 + 16 * j..20 + 16 * j].iter().map(|&q| i16::from(q as i8)).sum();
        b[260 + 2 * j..262 + 2 * j].copy_from_slice(&sum.to_le_bytes());
    }
    b[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((state >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 6.0
            })
            .collect()
    }

    #[test]
    fn blocks_dequantize_within_half_a_step_of_their_values() {
        let x = values(1024, 3);
        for kind in [GgmlType::Q8_0, GgmlType::Q4_0] {
            let mut bytes = vec![0; kind.bytes_of(x.len()).unwrap()];
            quantize(kind, &x, &mut bytes).unwrap();
            let mut back = vec![0.0; x.len()];
            dequantize(kind, &bytes, &mut back).unwrap();
            for (block, (x, back)) in x.chunks(32).zip(back.chunks(32)).enumerate() {
                let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                // Q4_0's step is amax / 8, and the end of its range one step short.
                // The scale is stored as an f16 (relative error 2^-11, times |q| <= 127).
                let step = if kind == GgmlType::Q8_0 { amax / 127.0 } else { amax / 8.0 };
                for (v, b) in x.iter().zip(back) {
                    let allowed = if kind == GgmlType::Q8_0 { 0.57 } else { 1.01 } * step;
                    assert!((v - b).abs() <= allowed, "{kind} block {block}: {v} read as {b}");
                }
            }
        }
    }

    #[test]
    fn q4_k_blocks_dequantize_within_a_step_and_closer_than_q4_0() {
        let x = values(2048, 9);
        let error = |kind: GgmlType| {
            let mut bytes = vec![0; kind.bytes_of(x.len()).unwrap()];
            quantize(kind, &x, &mut bytes).unwrap();
            let mut back = vec![0.0; x.len()];
            dequantize(kind, &bytes, &mut back).unwrap();
            (bytes, back.iter().zip(&x).map(|(b, v)| f64::from(b - v).powi(2)).sum::<f64>())
        };
        let (bytes, q4_k) = error(GgmlType::Q4_K);
        let (_, q4_0) = error(GgmlType::Q4_0);
        // Per-sub-block mins and searched scales: a smaller squared error than Q4_0's.
        assert!(q4_k < 0.8 * q4_0, "Q4_K {q4_k} against Q4_0 {q4_0}");
        // Every value within one step (d * scale of its sub-block) of its level's value.
        let mut back = vec![0.0; 256];
        for (block, (b, x)) in bytes.chunks_exact(144).zip(x.chunks_exact(256)).enumerate() {
            dequantize(GgmlType::Q4_K, b, &mut back).unwrap();
            let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
            for j in 0..8 {
                let step = d * f32::from(crate::quant::scale_min_k4(j, &b[4..16]).0);
                for l in 32 * j..32 * j + 32 {
                    let off = (back[l] - x[l]).abs();
                    assert!(off <= step * 1.01, "block {block} value {l}: {off} > {step}");
                }
            }
        }
        // A constant block and a block of zeros.
        let mut b = [0; 144];
        quantize(GgmlType::Q4_K, &[0.0; 256], &mut b).unwrap();
        assert!(b.iter().all(|&v| v == 0));
        quantize(GgmlType::Q4_K, &[-1.5; 256], &mut b).unwrap();
        dequantize(GgmlType::Q4_K, &b, &mut back).unwrap();
        assert!(back.iter().all(|&v| (v + 1.5).abs() < 0.05), "{:?}", &back[..4]);
    }

    #[test]
    fn q8_k_blocks_hold_their_sums_and_scale() {
        let mut x = values(512, 5);
        x[256..].fill(0.0);
        let mut b = vec![0; 584];
        quantize(GgmlType::Q8_K, &x, &mut b).unwrap();
        let d = f32::from_le_bytes(b[..4].try_into().unwrap());
        for (j, v) in x[..256].iter().enumerate() {
            let q = f32::from(b[4 + j] as i8);
            assert!((q * d - v).abs() <= 0.51 * d.abs(), "{j}: {v} as {q} x {d}");
        }
        for j in 0..16 {
            let sum: i32 = b[4 + 16 * j..20 + 16 * j].iter().map(|&q| i32::from(q as i8)).sum();
            assert_eq!(i32::from(i16::from_le_bytes([b[260 + 2 * j], b[261 + 2 * j]])), sum);
        }
        assert!(b[292..].iter().all(|&v| v == 0), "a block of zeros");
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn q8_0_s_vector_loop_gives_the_scalar_loop_s_bytes() {
        if crate::quant::host_path() != crate::quant::DotPath::Avx2 {
            let why = "this CPU has no AVX2: the scalar loop is all there is";
            kiln_ir::testing::skip("q8_0_s_vector_loop", why, &[]);
            return;
        }
        let mut x = values(32 * 64, 9);
        // Ties of the rounding (the block's maximum 127 makes `d` 1), NaN, infinities,
        // zeros, subnormals and a block of one huge value.
        x[..6].copy_from_slice(&[127.0, 0.5, -0.5, 1.5, -2.5, 126.5]);
        x[40] = f32::NAN;
        x[70] = f32::INFINITY;
        x[100] = f32::NEG_INFINITY;
        x[128..160].fill(0.0);
        x[160..192].fill(1e-42);
        x[200] = 3e38;
        let (mut scalar, mut vector) = (vec![0u8; 64 * 34], vec![0u8; 64 * 34]);
        for (x, b) in x.chunks_exact(32).zip(scalar.chunks_exact_mut(34)) {
            q8_0(x, b);
        }
        // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
        unsafe { q8_0_avx2(&x, &mut vector) };
        for (i, (s, v)) in scalar.chunks_exact(34).zip(vector.chunks_exact(34)).enumerate() {
            assert_eq!(s, v, "block {i}");
        }
    }

    #[test]
    fn q4_0_matches_ggml_s_rounding() {
        // The extreme is -4 (d = 0.5): -4 -> 0, 3.5 -> 15, 3.74 -> min(15, 16) = 15,
        // 0.26 -> trunc(9.02) = 9, -0.26 -> trunc(7.98) = 7.
        let mut x = vec![0.0; 32];
        x[..5].copy_from_slice(&[-4.0, 3.5, 3.74, 0.26, -0.26]);
        let mut b = [0; 18];
        quantize(GgmlType::Q4_0, &x, &mut b).unwrap();
        assert_eq!(f16::from_le_bytes([b[0], b[1]]).to_f32(), 0.5);
        let low: Vec<u8> = b[2..7].iter().map(|q| q & 15).collect();
        assert_eq!(low, [0, 15, 15, 9, 7]);
    }

    #[test]
    fn other_types_and_sizes_are_errors() {
        let mut b = [0; 34];
        assert!(quantize(GgmlType::Q6_K, &[0.0; 256], &mut [0; 210]).is_err());
        assert_eq!(
            quantize(GgmlType::Q8_0, &[0.0; 31], &mut b),
            Err(DequantizeError::Size { kind: GgmlType::Q8_0, values: 31, bytes: 34 })
        );
    }
}
