//! Dot products of quantized rows with f32 vectors, reading the blocks where they lie: a
//! matrix-vector product (a decode step's projection) reads each weight's bytes once, a
//! quarter of f32's for Q8_0 and an eighth for Q4_0.
//!
//! Q8_0, Q4_0, Q4_K and Q6_K have loops of their own (eight f32 lanes per block, each block's or
//! sub-block's sum scaled once); the other types dequantize one block at a time into a
//! buffer on the stack and take its dot product. On x86-64 with AVX2 and FMA the same loops are compiled for
//! those instructions and chosen at run time, Q8_0's and Q4_0's written in intrinsics with
//! the same order of operations (the same bits); elsewhere the portable build runs (tests run
//! both where the CPU allows).

use std::sync::LazyLock;

use super::{DequantizeError, GgmlType, half_at, reader};

/// Lanes each block's partial sums are kept in (one AVX2 vector of f32).
const LANES: usize = 8;

/// Which build of the loops runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DotPath {
    /// Compiled for AVX2, FMA and F16C (chosen when the CPU has all three).
    Avx2,
    /// The portable build.
    Portable,
}

/// The build the host runs: [`DotPath::Avx2`] where the CPU has AVX2, FMA and F16C (every
/// CPU with AVX2 has the other two).
pub fn host_path() -> DotPath {
    static PATH: LazyLock<DotPath> = LazyLock::new(|| {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            return DotPath::Avx2;
        }
        DotPath::Portable
    });
    *PATH
}

/// `out[i] = row_i · x` for the `out.len()` rows of `kind` stored back to back in `rows`
/// (each `x.len()` values), on the host's path.
///
/// # Errors
/// As [`dot_rows_on`].
pub fn dot_rows(
    kind: GgmlType,
    rows: &[u8],
    x: &[f32],
    out: &mut [f32],
) -> Result<(), DequantizeError> {
    dot_rows_on(host_path(), kind, rows, x, out)
}

/// [`dot_rows`] on `path` ([`DotPath::Avx2`] falls back to the portable build where the CPU
/// lacks AVX2 or FMA).
///
/// # Errors
/// [`DequantizeError::Unsupported`] for a type [`super::dequantize`] does not read;
/// [`DequantizeError::Size`] when `rows` is not `out.len()` rows of `x.len()` values.
pub fn dot_rows_on(
    path: DotPath,
    kind: GgmlType,
    rows: &[u8],
    x: &[f32],
    out: &mut [f32],
) -> Result<(), DequantizeError> {
    if !super::dequantized().any(|t| t == kind) {
        return Err(DequantizeError::Unsupported(kind));
    }
    let row_bytes = kind.bytes_of(x.len());
    let values = out.len().checked_mul(x.len());
    if row_bytes.and_then(|r| r.checked_mul(out.len())) != Some(rows.len()) || values.is_none() {
        return Err(DequantizeError::Size {
            kind,
            values: values.unwrap_or(usize::MAX),
            bytes: rows.len(),
        });
    }
    let row_bytes = row_bytes.expect("checked above");
    #[cfg(target_arch = "x86_64")]
    if path == DotPath::Avx2 && host_path() == DotPath::Avx2 {
        // SAFETY: the CPU has AVX2 and FMA (`host_path`).
        unsafe { rows_avx2(kind, rows, row_bytes, x, out) };
        return Ok(());
    }
    let _ = path;
    rows_with::<false>(kind, rows, row_bytes, x, out);
    Ok(())
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_avx2(kind: GgmlType, rows: &[u8], row_bytes: usize, x: &[f32], out: &mut [f32]) {
    let row: unsafe fn(&[u8], &[f32]) -> f32 = match kind {
        GgmlType::Q8_0 => avx2::q8_0_row,
        GgmlType::Q4_0 => avx2::q4_0_row,
        _ => return rows_with::<true>(kind, rows, row_bytes, x, out),
    };
    for (w, o) in rows.chunks_exact(row_bytes).zip(out.iter_mut()) {
        // SAFETY: the CPU has AVX2, FMA and F16C (`host_path`); `w` is whole blocks of the
        // values `x` holds (checked by the caller).
        *o = unsafe { row(w, x) };
    }
}

/// Q8_0's and Q4_0's rows in AVX2 intrinsics. The portable loops compiled for AVX2 (which
/// still serve the other types) left a call per block for the `f16` scale and spilled their
/// lanes. These keep those loops' order of operations lane for lane (value `8c + l` of a
/// block in lane `l`, the same fused multiply-adds in the same order, the lanes summed in
/// order at the end), so they give the bits the loops they replace gave (a test checks).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::int8::avx2::half;

    /// The eight lanes summed as the portable loops sum them (`super::finish`).
    #[target_feature(enable = "avx")]
    fn finish(total: __m256) -> f32 {
        let mut lanes = [0f32; super::LANES];
        // SAFETY: `lanes` holds eight floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), total) };
        super::finish(lanes)
    }

    /// Q8_0: per block `d * Σ q·x`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q8_0_row(row: &[u8], x: &[f32]) -> f32 {
        let mut total = _mm256_setzero_ps();
        for (b, xs) in row.chunks_exact(34).zip(x.chunks_exact(32)) {
            let (q, xs) = (&b[2..34], &xs[..32]);
            let mut acc = _mm256_setzero_ps();
            for c in 0..4 {
                // SAFETY: bytes and floats 8c..8c + 8 lie in the block's 32 (sliced above).
                unsafe {
                    let bytes = _mm_loadl_epi64(q.as_ptr().add(8 * c).cast());
                    let q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
                    acc = _mm256_fmadd_ps(q, _mm256_loadu_ps(xs.as_ptr().add(8 * c)), acc);
                }
            }
            // SAFETY: the CPU has F16C; the scale is the block's first two bytes.
            let d = _mm256_set1_ps(unsafe { half(b, 0) });
            total = _mm256_fmadd_ps(d, acc, total);
        }
        finish(total)
    }

    /// Q4_0: byte `j` holds value `j` (low nibble) and `16 + j` (high), each less 8.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn q4_0_row(row: &[u8], x: &[f32]) -> f32 {
        let (nibble, eight) = (_mm_set1_epi8(15), _mm_set1_epi8(8));
        let mut total = _mm256_setzero_ps();
        for (b, xs) in row.chunks_exact(18).zip(x.chunks_exact(32)) {
            let (q, xs) = (&b[2..18], &xs[..32]);
            // SAFETY: 16 bytes from the block's third lie in it (sliced above).
            let bytes = unsafe { _mm_loadu_si128(q.as_ptr().cast()) };
            let low = _mm_sub_epi8(_mm_and_si128(bytes, nibble), eight);
            let high = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), nibble), eight);
            let widen = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
            let mut acc = _mm256_setzero_ps();
            for (c, (low, high)) in [(low, high), (_mm_srli_si128(low, 8), _mm_srli_si128(high, 8))]
                .into_iter()
                .enumerate()
            {
                // SAFETY: floats 8c.. and 16 + 8c.. (c < 2), eight each, lie in the 32.
                unsafe {
                    acc = _mm256_fmadd_ps(widen(low), _mm256_loadu_ps(xs.as_ptr().add(8 * c)), acc);
                    let at = xs.as_ptr().add(16 + 8 * c);
                    acc = _mm256_fmadd_ps(widen(high), _mm256_loadu_ps(at), acc);
                }
            }
            // SAFETY: the CPU has F16C; the scale is the block's first two bytes.
            let d = _mm256_set1_ps(unsafe { half(b, 0) });
            total = _mm256_fmadd_ps(d, acc, total);
        }
        finish(total)
    }
}

/// `a * b + c`, fused where the build has FMA (a fused multiply-add without the instruction
/// is a slow library call).
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

#[inline(always)]
fn rows_with<const FMA: bool>(
    kind: GgmlType,
    rows: &[u8],
    row_bytes: usize,
    x: &[f32],
    out: &mut [f32],
) {
    for (row, o) in rows.chunks_exact(row_bytes).zip(out.iter_mut()) {
        *o = match kind {
            GgmlType::Q8_0 => q8_0_row::<FMA>(row, x),
            GgmlType::Q4_0 => q4_0_row::<FMA>(row, x),
            GgmlType::Q4_K => q4_k_row::<FMA>(row, x),
            GgmlType::Q6_K => q6_k_row::<FMA>(row, x),
            _ => any_row::<FMA>(kind, row, x),
        };
    }
}

#[inline(always)]
fn finish(total: [f32; LANES]) -> f32 {
    total.iter().sum()
}

/// Q8_0: per block `d * Σ q·x`, the sum in eight lanes.
#[inline(always)]
fn q8_0_row<const FMA: bool>(row: &[u8], x: &[f32]) -> f32 {
    let mut total = [0f32; LANES];
    for (b, xs) in row.chunks_exact(34).zip(x.chunks_exact(32)) {
        let d = half_at(b, 0);
        let mut acc = [0f32; LANES];
        for (qs, xs) in b[2..34].chunks_exact(LANES).zip(xs.chunks_exact(LANES)) {
            for l in 0..LANES {
                acc[l] = madd::<FMA>(f32::from(qs[l] as i8), xs[l], acc[l]);
            }
        }
        for l in 0..LANES {
            total[l] = madd::<FMA>(d, acc[l], total[l]);
        }
    }
    finish(total)
}

/// Q4_0: low nibbles hold values 0-15 of a block, high nibbles 16-31, each less 8.
#[inline(always)]
fn q4_0_row<const FMA: bool>(row: &[u8], x: &[f32]) -> f32 {
    let mut total = [0f32; LANES];
    for (b, xs) in row.chunks_exact(18).zip(x.chunks_exact(32)) {
        let d = half_at(b, 0);
        let (low, high) = xs.split_at(16);
        let mut acc = [0f32; LANES];
        for ((qs, lo), hi) in
            b[2..18].chunks_exact(LANES).zip(low.chunks_exact(LANES)).zip(high.chunks_exact(LANES))
        {
            for l in 0..LANES {
                acc[l] = madd::<FMA>(f32::from((qs[l] & 0x0f) as i8 - 8), lo[l], acc[l]);
                acc[l] = madd::<FMA>(f32::from((qs[l] >> 4) as i8 - 8), hi[l], acc[l]);
            }
        }
        for l in 0..LANES {
            total[l] = madd::<FMA>(d, acc[l], total[l]);
        }
    }
    finish(total)
}

/// Q4_K: runs of 64 values take the low then the high nibbles of 32 bytes; sub-block `j`
/// (32 values) is `d·scale_j · Σ q·x - dmin·min_j · Σ x`, both sums in eight lanes (as
/// llama.cpp takes it), so no value is dequantized.
#[inline(always)]
fn q4_k_row<const FMA: bool>(row: &[u8], x: &[f32]) -> f32 {
    let mut total = [0f32; LANES];
    for (b, xs) in row.chunks_exact(144).zip(x.chunks_exact(256)) {
        let (d, dmin) = (half_at(b, 0), half_at(b, 2));
        let scales = &b[4..16];
        for (run, (qs, xs)) in b[16..144].chunks_exact(32).zip(xs.chunks_exact(64)).enumerate() {
            let (low_x, high_x) = xs.split_at(32);
            let [mut low, mut high, mut low_sum, mut high_sum] = [[0f32; LANES]; 4];
            for ((q, lx), hx) in qs
                .chunks_exact(LANES)
                .zip(low_x.chunks_exact(LANES))
                .zip(high_x.chunks_exact(LANES))
            {
                for l in 0..LANES {
                    low[l] = madd::<FMA>(f32::from(q[l] & 0x0f), lx[l], low[l]);
                    high[l] = madd::<FMA>(f32::from(q[l] >> 4), hx[l], high[l]);
                    low_sum[l] += lx[l];
                    high_sum[l] += hx[l];
                }
            }
            let (sc1, m1) = super::scale_min_k4(2 * run, scales);
            let (sc2, m2) = super::scale_min_k4(2 * run + 1, scales);
            let (d1, min1) = (d * f32::from(sc1), dmin * f32::from(m1));
            let (d2, min2) = (d * f32::from(sc2), dmin * f32::from(m2));
            for l in 0..LANES {
                total[l] = madd::<FMA>(d1, low[l], total[l]);
                total[l] = madd::<FMA>(-min1, low_sum[l], total[l]);
                total[l] = madd::<FMA>(d2, high[l], total[l]);
                total[l] = madd::<FMA>(-min2, high_sum[l], total[l]);
            }
        }
    }
    finish(total)
}

/// Q6_K: two halves of 128 values; in each, value `l + 32k` takes four low bits from `ql`
/// (byte `l` or `l + 32`, low or high nibble) and two from `qh[l]`, and each 16 values share
/// a signed scale: `d·scale · (Σ q·x - 32 Σ x)`, both sums in eight lanes.
#[inline(always)]
fn q6_k_row<const FMA: bool>(row: &[u8], x: &[f32]) -> f32 {
    let mut total = [0f32; LANES];
    for (b, xs) in row.chunks_exact(210).zip(x.chunks_exact(256)) {
        let d = half_at(b, 208);
        for (half, xs) in xs.chunks_exact(128).enumerate() {
            let (ql, qh) = (&b[64 * half..64 * half + 64], &b[128 + 32 * half..160 + 32 * half]);
            for (k, xs) in xs.chunks_exact(32).enumerate() {
                let (bytes, shift) = (&ql[32 * (k % 2)..32 * (k % 2) + 32], 4 * (k / 2));
                for (g, xs) in xs.chunks_exact(16).enumerate() {
                    let [mut qx, mut sum] = [[0f32; LANES]; 2];
                    for c in 0..2 {
                        let at = 16 * g + LANES * c;
                        for l in 0..LANES {
                            let low = (bytes[at + l] >> shift) & 0x0f;
                            let q = low | (((qh[at + l] >> (2 * k)) & 3) << 4);
                            let x = xs[LANES * c + l];
                            qx[l] = madd::<FMA>(f32::from(q), x, qx[l]);
                            sum[l] += x;
                        }
                    }
                    let scale = d * f32::from(b[192 + 8 * half + 2 * k + g] as i8);
                    for l in 0..LANES {
                        total[l] = madd::<FMA>(scale, qx[l], total[l]);
                        total[l] = madd::<FMA>(-32.0 * scale, sum[l], total[l]);
                    }
                }
            }
        }
    }
    finish(total)
}

/// Any other type: each block dequantized on the stack, then its dot product.
#[inline(always)]
fn any_row<const FMA: bool>(kind: GgmlType, row: &[u8], x: &[f32]) -> f32 {
    let (values, size) = kind.block().expect("a dequantized type is known");
    let read = reader(kind).expect("a dequantized type has a reader");
    let mut buffer = [0f32; 256];
    let mut total = [0f32; LANES];
    for (b, xs) in row.chunks_exact(size).zip(x.chunks_exact(values)) {
        let block = &mut buffer[..values];
        read(b, block);
        if values < LANES {
            total[0] = madd::<FMA>(block[0], xs[0], total[0]);
            continue;
        }
        for (ws, xs) in block.chunks_exact(LANES).zip(xs.chunks_exact(LANES)) {
            for l in 0..LANES {
                total[l] = madd::<FMA>(ws[l], xs[l], total[l]);
            }
        }
    }
    finish(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::dequantize;

    /// Pseudo-random blocks of `rows` rows of `cols` values, their f16 scales finite.
    fn blocks(kind: GgmlType, rows: usize, cols: usize, seed: u32) -> Vec<u8> {
        let (values, size) = kind.block().unwrap();
        let mut state = seed;
        let mut bytes: Vec<u8> = (0..rows * cols / values * size)
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 24) as u8
            })
            .collect();
        // Finite scales: the f16 fields (where each layout puts them) of small magnitude.
        let fields: &[usize] = match kind {
            GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => &[0],
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
            GgmlType::Q2_K => &[80, 82],
            GgmlType::Q3_K => &[108],
            GgmlType::Q6_K => &[208],
            _ => &[],
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
    fn every_type_s_dot_products_match_the_f64_product_of_its_values() {
        for kind in super::super::dequantized() {
            let (rows, cols) = (5, 512);
            let bytes = match kind {
                GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => (0..rows * cols)
                    .flat_map(|i| match kind {
                        GgmlType::F32 => ((i % 17) as f32 - 8.0).to_le_bytes().to_vec(),
                        GgmlType::F16 => {
                            half::f16::from_f32((i % 13) as f32 - 6.0).to_le_bytes().to_vec()
                        }
                        _ => half::bf16::from_f32((i % 11) as f32 - 5.0).to_le_bytes().to_vec(),
                    })
                    .collect(),
                _ => blocks(kind, rows, cols, 11),
            };
            let x: Vec<f32> = (0..cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
            let mut w = vec![0f32; rows * cols];
            dequantize(kind, &bytes, &mut w).unwrap();
            for path in [DotPath::Portable, DotPath::Avx2] {
                let mut out = vec![0f32; rows];
                dot_rows_on(path, kind, &bytes, &x, &mut out).unwrap();
                for (r, &got) in out.iter().enumerate() {
                    let row = &w[r * cols..(r + 1) * cols];
                    let want: f64 =
                        row.iter().zip(&x).map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
                    let scale: f64 = row
                        .iter()
                        .zip(&x)
                        .map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs())
                        .sum();
                    assert!(scale > 0.0, "{kind}: a zero row");
                    let error = (f64::from(got) - want).abs() / scale;
                    assert!(
                        error < 1e-6,
                        "{kind} {path:?} row {r}: {got} against {want} ({error:e} of {scale})"
                    );
                }
            }
        }
    }

    /// The intrinsics loops give the bits of the portable loops with fused multiply-adds
    /// (what the AVX2 build ran before them), on 7 rows of 25 blocks.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn q8_0_and_q4_0_intrinsics_give_the_fused_portable_loops_bits() {
        if host_path() != DotPath::Avx2 {
            return;
        }
        let (rows, cols) = (7, 800);
        let x: Vec<f32> = (0..cols).map(|i| ((i * 53 % 97) as f32 - 48.0) / 17.0).collect();
        type Row = fn(&[u8], &[f32]) -> f32;
        type Intrinsics = unsafe fn(&[u8], &[f32]) -> f32;
        let cases: [(GgmlType, Row, Intrinsics); 2] = [
            (GgmlType::Q8_0, q8_0_row::<true>, avx2::q8_0_row),
            (GgmlType::Q4_0, q4_0_row::<true>, avx2::q4_0_row),
        ];
        for (kind, portable, intrinsics) in cases {
            let bytes = blocks(kind, rows, cols, 29);
            let row_bytes = bytes.len() / rows;
            for w in bytes.chunks_exact(row_bytes) {
                // SAFETY: the CPU has AVX2, FMA and F16C (checked above); `w` is 25 blocks.
                let got = unsafe { intrinsics(w, &x) };
                assert_eq!(got.to_bits(), portable(w, &x).to_bits(), "{kind}: {got}");
            }
        }
    }

    #[test]
    fn sizes_that_do_not_fit_are_errors() {
        let mut out = [0f32; 2];
        let err = dot_rows(GgmlType::Q8_0, &[0; 67], &[0.0; 32], &mut out).unwrap_err();
        assert_eq!(err, DequantizeError::Size { kind: GgmlType::Q8_0, values: 64, bytes: 67 });
        assert!(dot_rows(GgmlType::Q8_0, &[0; 68], &[0.0; 31], &mut out).is_err());
        assert!(dot_rows(GgmlType(16), &[0; 132], &[0.0; 256], &mut out).is_err());
    }
}
