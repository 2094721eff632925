//! f32 products of a few rows against a right operand whose columns lie along `k` (`x @ wᵀ`
//! with `w` row-major: every `Linear`, and so every projection of a decode step), as dot
//! products of rows with columns read where they are: each weight row streams through once,
//! and the loop is bound by memory bandwidth rather than by packing.
//!
//! `gemm` 0.19 packs and tiles these like any product: a decode step's `[1, 768] @ [768,
//! 2048]` read its weights at 26 GB/s and `[1, 768] @ [768, 256]` at 14 GB/s, on a machine
//! whose copies run at 35 GB/s (`bench_generate --profile`, the 125M Llama). Sums are f32, in
//! eight lanes (two interleaved accumulators of four columns, or of each row), added across
//! lanes at the end; PyTorch's oneDNN and `gemm` sum in other orders, equally within f32.

/// Products of at most this many left rows take the dot-product loop; more rows reuse each
/// weight column enough for packing to pay.
pub(super) const ROWS: usize = 4;

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
    if avx2::available() {
        // SAFETY: the CPU has AVX2 and FMA; the caller's contract covers the reads and writes.
        unsafe { avx2::product(m, n, k, dst, dst_rs, &rows, &column) };
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

    /// Whether the CPU has AVX2 and FMA.
    pub(super) fn available() -> bool {
        static AVAILABLE: LazyLock<bool> =
            LazyLock::new(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"));
        *AVAILABLE && !super::super::PORTABLE_GEMV.get()
    }

    /// [`super::product`] on AVX2: one row against each column in turn (four accumulators
    /// hide the multiply-add's latency), or two to four rows against each column.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA, and [`super::product`]'s contract holds.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn product(
        m: usize,
        n: usize,
        k: usize,
        dst: *mut f32,
        dst_rs: usize,
        rows: &[*const f32; ROWS],
        column: &dyn Fn(usize) -> *const f32,
    ) {
        let mut j = 0;
        if m == 1 {
            // One column after another: the weights stream through in memory order.
            while j < n {
                // SAFETY: the contract: `k` values in row 0 and in column `j`, and `dst[j]`
                // in the block.
                unsafe { *dst.add(j) = dot(rows[0], column(j), k) };
                j += 1;
            }
            return;
        }
        while j < n {
            let col = [column(j)];
            // SAFETY: as above, for the `m` rows and column `j`.
            unsafe {
                let sums = match m {
                    2 => pad(dots::<2, 1>(&[rows[0], rows[1]], &col, k)),
                    3 => pad(dots::<3, 1>(&[rows[0], rows[1], rows[2]], &col, k)),
                    _ => dots::<4, 1>(rows, &col, k),
                };
                for (i, s) in sums.iter().take(m).enumerate() {
                    *dst.add(i * dst_rs + j) = s[0];
                }
            }
            j += 1;
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

    /// `R` rows' sums padded to [`ROWS`].
    fn pad<const R: usize>(sums: [[f32; 1]; R]) -> [[f32; 1]; ROWS] {
        std::array::from_fn(|i| if i < R { sums[i] } else { [0.0] })
    }

    /// The `R x C` dot products of `rows` with `cols`, `k` values each.
    ///
    /// # Safety
    /// AVX2 and FMA; every row and column holds `k` readable values.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn dots<const R: usize, const C: usize>(
        rows: &[*const f32; R],
        cols: &[*const f32; C],
        k: usize,
    ) -> [[f32; C]; R] {
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        let mut kk = 0;
        // SAFETY: every load reads 8 values at `kk + 8 <= k` (the contract).
        unsafe {
            while kk + 8 <= k {
                let w: [__m256; C] = std::array::from_fn(|c| _mm256_loadu_ps(cols[c].add(kk)));
                for r in 0..R {
                    let x = _mm256_loadu_ps(rows[r].add(kk));
                    for c in 0..C {
                        acc[r][c] = _mm256_fmadd_ps(x, w[c], acc[r][c]);
                    }
                }
                kk += 8;
            }
        }
        let mut out = [[0f32; C]; R];
        for r in 0..R {
            for c in 0..C {
                let mut tail = 0f32;
                for t in kk..k {
                    // SAFETY: `t < k` (the contract).
                    tail += unsafe { *rows[r].add(t) * *cols[c].add(t) };
                }
                out[r][c] = hsum(acc[r][c]) + tail;
            }
        }
        out
    }

    /// The sum of the eight lanes, pairwise.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
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
            let before = super::super::portable_gemv(portable);
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
            super::super::portable_gemv(before);
        }
    }
}
