//! Quantization to GGML's blocks, as GGML's reference functions (`quantize_row_*_ref`) do:
//! weights to Q8_0 or Q4_0 (what `quantize_` in `kiln-models` writes), and activations to
//! Q8_0 or Q8_K for the integer dot products of [`super::int8`].

use half::f16;

use super::{DequantizeError, GgmlType};

/// The types [`quantize`] writes.
pub fn quantized() -> impl Iterator<Item = GgmlType> {
    [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q8_K].into_iter()
}

/// Writes `x` as `kind` blocks into `out` (its length the size of `x.len()` values).
///
/// Q8_0: per block of 32, `d = max|x| / 127` (an `f16`), `q = round(x / d)`. Q4_0: `d` is
/// the value of largest magnitude over -8, `q = min(15, trunc(x / d + 8.5))`. Q8_K (256
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
        GgmlType::Q8_K => q8_k,
        _ => return Err(DequantizeError::Unsupported(kind)),
    };
    if kind.bytes_of(x.len()) != Some(out.len()) {
        return Err(DequantizeError::Size { kind, values: x.len(), bytes: out.len() });
    }
    let (values, size) = kind.block().expect("a quantized type is known");
    for (x, b) in x.chunks_exact(values).zip(out.chunks_exact_mut(size)) {
        block(x, b);
    }
    Ok(())
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
        assert!(quantize(GgmlType::Q4_K, &[0.0; 256], &mut [0; 144]).is_err());
        assert_eq!(
            quantize(GgmlType::Q8_0, &[0.0; 31], &mut b),
            Err(DequantizeError::Size { kind: GgmlType::Q8_0, values: 31, bytes: 34 })
        );
    }
}
