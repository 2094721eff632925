//! f32 products of a few rows against a right operand whose columns lie along `k` (`x @ wᵀ`
//! with `w` row-major: every `Linear`, and so every projection of a decode step), as dot
//! products of rows with columns read where they are: each weight row streams through once,
//! and the loop is bound by memory bandwidth rather than by packing.
//!
//! `gemm` 0.19 packs and tiles these like any product: a decode step's `[1, 768] @ [768,
//! 2048]` read its weights at 26 GB/s and `[1, 768] @ [768, 256]` at 14 GB/s, on a machine
//! whose copies run at 35 GB/s (`bench_generate --profile`, the 125M Llama). Sums are f32 in
//! eight lanes (one row: four accumulators; two to four rows: one each), added across lanes
//! at the end; PyTorch's oneDNN and `gemm` sum in other orders, equally within f32.

use std::cell::Cell;

/// Products of at most this many left rows take the dot-product loop; more rows reuse each
/// weight column enough for packing to pay.
pub(super) const ROWS: usize = 4;

thread_local! {
    /// Whether this thread's products run the portable loop (a test hook).
    static PORTABLE: Cell<bool> = const { Cell::new(false) };
}

/// Makes this thread's products run the portable loop (`true`) or the vector one where the
/// CPU has it (`false`); returns the previous setting.
#[cfg(test)]
fn portable(on: bool) -> bool {
    PORTABLE.replace(on)
}

/// Whether [`product`] takes a product of `m` rows: the left operand's rows and the right
/// operand's columns both lie along `k` (column stride 1, row stride 1).
pub(super) fn takes(m: usize, a_cs: isize, b_rs: isize) -> bool {
    m <= ROWS && a_cs == 1 && b_rs == 1
}

/// `dst = lhs @ rhs` for `m <= ROWS` rows on the calling thread: `dst` row-major with row
/// stride `dst_rs`, row `i` of `lhs` at `a + i * a_rs` and column `j` of `rhs` at
/// `b + j * b_cs`, each `k` contiguous values.
///
/// # Safety
/// `dst` has room for the `m x n` block at row stride `dst_rs`, no other thread writes it,
/// and the `m` rows and `n` columns of `k` values lie inside their buffers.
pub(super) unsafe fn product(
    (m, n, k): (usize, usize, usize),
    dst: *mut f32,
    dst_rs: usize,
    (a, a_rs): (*const f32, isize),
    (b, b_cs): (*const f32, isize),
) {
    debug_assert!(m <= ROWS);
    if m == 0 {
        return;
    }
    let rows: [*const f32; ROWS] =
        std::array::from_fn(|i| a.wrapping_offset(i.min(m - 1) as isize * a_rs));
    let column = |j: usize| b.wrapping_offset(j as isize * b_cs);
    #[cfg(target_arch = "x86_64")]
    if avx2::available() && !PORTABLE.get() {
        // SAFETY: the CPU has AVX2 and FMA; the caller's contract covers the reads and writes.
        unsafe { avx2::product((m, n, k), dst, dst_rs, &rows, (b, b_cs)) };
        return;
    }
    for (i, &row) in rows.iter().take(m).enumerate() {
        for j in 0..n {
            // SAFETY: the caller's contract: row `i` and column `j` hold `k` values each, and
            // `(i, j)` lies in `dst`'s block.
            unsafe {
                let (x, w) =
                    (std::slice::from_raw_parts(row, k), std::slice::from_raw_parts(column(j), k));
                *dst.add(i * dst_rs + j) = dot_portable(x, w);
            }
        }
    }
}

/// `Σ x·w` in eight interleaved lanes, added across lanes at the end (the vector loop's
/// shape, with fewer accumulators).
fn dot_portable(x: &[f32], w: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let whole = x.len() / 8 * 8;
    for (xs, ws) in x[..whole].chunks_exact(8).zip(w[..whole].chunks_exact(8)) {
        for l in 0..8 {
            lanes[l] += xs[l] * ws[l];
        }
    }
    let tail: f32 = x[whole..].iter().zip(&w[whole..]).map(|(a, b)| a * b).sum();
    lanes.iter().sum::<f32>() + tail
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;
    use std::sync::LazyLock;

    use super::ROWS;
    use crate::quant::hsum;

    /// Whether the CPU has AVX2 and FMA.
    pub(super) fn available() -> bool {
        static AVAILABLE: LazyLock<bool> =
            LazyLock::new(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"));
        *AVAILABLE
    }

    /// [`super::product`] on AVX2: one row against each column in turn (four accumulators
    /// hide the multiply-add's latency), or two to four rows against each column.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA, and [`super::product`]'s contract holds.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn product(
        (m, n, k): (usize, usize, usize),
        dst: *mut f32,
        dst_rs: usize,
        rows: &[*const f32; ROWS],
        (b, b_cs): (*const f32, isize),
    ) {
        // Columns one after another: the weights stream through in memory order.
        for j in 0..n {
            let column = b.wrapping_offset(j as isize * b_cs);
            let out = dst.wrapping_add(j);
            // SAFETY: the contract: `k` values in each of the `m` rows and in column `j`, and
            // `(i, j)` in the block for every row `i`.
            unsafe {
                match m {
                    1 => *out = dot(rows[0], column, k),
                    2 => dots::<2>(&[rows[0], rows[1]], column, k, out, dst_rs),
                    3 => dots::<3>(&[rows[0], rows[1], rows[2]], column, k, out, dst_rs),
                    _ => dots::<4>(rows, column, k, out, dst_rs),
                }
            }
        }
    }

    /// `Σ x·w` over `k` values: four accumulators of eight lanes (32 values a pass), then
    /// eight lanes, then one value at a time.
    ///
    /// # Safety
    /// AVX2 and FMA; `x` and `w` hold `k` readable values.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn dot(x: *const f32, w: *const f32, k: usize) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut kk = 0;
        // SAFETY: every load reads 8 values below `k` (the contract).
        unsafe {
            while kk + 32 <= k {
                for (u, a) in acc.iter_mut().enumerate() {
                    let at = kk + 8 * u;
                    *a =
                        _mm256_fmadd_ps(_mm256_loadu_ps(x.add(at)), _mm256_loadu_ps(w.add(at)), *a);
                }
                kk += 32;
            }
            while kk + 8 <= k {
                acc[0] =
                    _mm256_fmadd_ps(_mm256_loadu_ps(x.add(kk)), _mm256_loadu_ps(w.add(kk)), acc[0]);
                kk += 8;
            }
            let mut tail = 0f32;
            for t in kk..k {
                tail += *x.add(t) * *w.add(t);
            }
            let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            hsum(sum) + tail
        }
    }

    /// The dot products of `R` rows with one column, `k` values each, written to `out` and
    /// every `out_rs` after it.
    ///
    /// # Safety
    /// AVX2 and FMA; every row and the column hold `k` readable values, and the `R` outputs
    /// are writable.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn dots<const R: usize>(
        rows: &[*const f32; R],
        column: *const f32,
        k: usize,
        out: *mut f32,
        out_rs: usize,
    ) {
        let mut acc = [_mm256_setzero_ps(); R];
        let mut kk = 0;
        // SAFETY: every load reads 8 values below `k`, every tail read is below `k`, and the
        // writes are the `R` outputs (the contract).
        unsafe {
            while kk + 8 <= k {
                let w = _mm256_loadu_ps(column.add(kk));
                for (a, row) in acc.iter_mut().zip(rows) {
                    *a = _mm256_fmadd_ps(_mm256_loadu_ps(row.add(kk)), w, *a);
                }
                kk += 8;
            }
            for (r, (a, row)) in acc.iter().zip(rows).enumerate() {
                let tail: f32 = (kk..k).map(|t| *row.add(t) * *column.add(t)).sum();
                *out.add(r * out_rs) = hsum(*a) + tail;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::product;

    /// Both paths against the f64 sum on odd sizes, padded strides and every row count,
    /// within f32's rounding of a sum of `k` products.
    #[test]
    fn dot_products_match_the_f64_sum_on_both_paths() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        for portable in [false, true] {
            let before = super::portable(portable);
            for &(m, n, k) in
                &[(1, 1, 1), (1, 5, 7), (1, 9, 8), (2, 3, 9), (3, 7, 33), (4, 6, 773), (1, 13, 768)]
            {
                let (a_rs, b_cs, dst_rs) = (k + 3, k + 5, n + 2);
                let a: Vec<f32> = (0..m * a_rs).map(|_| next()).collect();
                let b: Vec<f32> = (0..n * b_cs).map(|_| next()).collect();
                let mut dst = vec![f32::NAN; m * dst_rs];
                // SAFETY: the rows, columns and output block lie inside the vectors.
                unsafe {
                    product(
                        (m, n, k),
                        dst.as_mut_ptr(),
                        dst_rs,
                        (a.as_ptr(), a_rs as isize),
                        (b.as_ptr(), b_cs as isize),
                    );
                }
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = (0..k)
                            .map(|t| f64::from(a[i * a_rs + t]) * f64::from(b[j * b_cs + t]))
                            .sum();
                        let scale: f64 = (0..k)
                            .map(|t| f64::from((a[i * a_rs + t] * b[j * b_cs + t]).abs()))
                            .sum();
                        let got = f64::from(dst[i * dst_rs + j]);
                        assert!(
                            (got - want).abs() <= 1e-6 * scale.max(1e-30) * (k as f64).sqrt(),
                            "{m}x{k} by {k}x{n} ({}) at ({i}, {j}): {got} vs {want}",
                            if portable { "portable" } else { "vector" }
                        );
                    }
                    assert!(dst[i * dst_rs + n..(i + 1) * dst_rs].iter().all(|v| v.is_nan()));
                }
            }
            super::portable(before);
        }
    }
}
