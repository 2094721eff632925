//! bf16 products on AVX512-BF16's dot-product instruction (`vdpbf16ps`): each 32-bit lane
//! multiplies two pairs of bf16 values exactly and adds both products to an f32 accumulator,
//! 32 multiply-adds per instruction against 16 for an f32 FMA, so a bf16 product runs at
//! about twice f32's rate instead of paying to widen its operands for `gemm`.
//!
//! Numerics (what PyTorch's oneDNN kernels on the same instruction give): products are exact,
//! sums are f32 rounded to nearest even, each result is rounded once to bf16; the instruction
//! treats subnormal inputs and sums as zero. Used where the CPU has the instruction
//! ([`available`]); elsewhere bf16 products widen to f32 for `gemm` (`super`).
//!
//! Layout: the right operand is packed into panels of [`NR`] columns, the left into tiles of
//! [`MR`] rows, both as 32-bit pairs of consecutive `k` (the instruction's operand shape),
//! zero-padded at the edges; one tile times one panel is 24 accumulator registers.

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::LazyLock;

use half::bf16;

use super::Problem;

/// Output rows per tile: 12 rows of two vectors is 24 of the 32 vector registers.
const MR: usize = 12;
/// Output columns per tile: two vectors of 16 f32 lanes.
const NR: usize = 32;
/// Bytes of packed left operand per block, so that a block stays in L2 while every panel of
/// the right operand passes over it.
const A_BLOCK_BYTES: usize = 256 * 1024;

/// Whether bf16 products run here: the CPU has AVX512-BF16 (with AVX512-F/BW/VL for the
/// stores) and `KILN_NO_BF16_DOT` is unset or `0` (`1` selects the widening path, for
/// comparison).
pub(crate) fn available() -> bool {
    static AVAILABLE: LazyLock<bool> = LazyLock::new(|| {
        !kiln_ir::settings::Setting::NoBf16Dot.on()
            && is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512bf16")
    });
    *AVAILABLE
}

/// What computes a tile: the instruction, or a portable loop with its numerics (products
/// exact, each added to the f32 sum in turn, the odd element of a pair first, rounded to
/// nearest even, subnormal inputs and sums read as zero) that tests run on hosts without it,
/// so the packing, tiling and masked stores around the instruction are tested everywhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DotPath {
    /// `vdpbf16ps` (the CPU has AVX512-BF16: [`available`]).
    Instructions,
    /// [`tile_portable`].
    Portable,
}

/// Left operands of fewer rows than this, read along `k` in place, with a right operand
/// whose columns lie along `k` too (`x @ wᵀ` with `w` row-major: every `Linear`, a decode
/// step's products), take dot products row by column ([`gemv`]) instead of packing: each
/// weight row is read once, where it is.
const GEMV_ROWS: usize = 4;

/// The most bytes of packing a thread keeps between products; a larger product's packing
/// (about the size of its bf16 operands) is freed when it ends.
const KEEP_BYTES: usize = 8 << 20;

thread_local! {
    /// Each thread's packed operands, kept between products: fresh pages cost more than
    /// the packing.
    static PACKED: RefCell<(Vec<u32>, Vec<u32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `dst = lhs @ rhs` in bf16 on the calling thread, `dst` row-major with row stride `dst_rs`;
/// each operand is `(pointer, column stride, row stride)`.
///
/// # Safety
/// [`available`] is true for [`DotPath::Instructions`], `k > 0`, `dst` has room for the
/// `m x n` block at row stride `dst_rs`, no other thread writes it, and the operands address
/// `m x k` and `k x n` elements that lie inside their buffers.
pub(super) unsafe fn product(
    pr: Problem,
    dst: *mut bf16,
    dst_rs: usize,
    (a, a_cs, a_rs): (*const bf16, isize, isize),
    (b, b_cs, b_rs): (*const bf16, isize, isize),
    path: DotPath,
) {
    let Problem { m, n, k } = pr;
    let kp = k.div_ceil(2);
    let (a, b, dst) = (a.cast::<u16>(), b.cast::<u16>(), dst.cast::<u16>());
    if m < GEMV_ROWS && a_cs == 1 && b_rs == 1 {
        for i in 0..m {
            // SAFETY: row `i` of the left operand, every column of the right one and row `i`
            // of `dst` are inside their buffers (the caller's contract).
            unsafe {
                gemv(path, a.offset(i as isize * a_rs), (b, b_cs), n, k, dst.add(i * dst_rs));
            }
        }
        return;
    }
    PACKED.with_borrow_mut(|(pa, pb)| {
        // SAFETY: the caller's contract: column `j < n` of the right operand, element `kk <
        // k`, is at `b + j * b_cs + kk * b_rs`.
        unsafe { pack(pb, NR, b, b_cs, b_rs, n, k) };
        // Blocks of equal numbers of tiles, each at most `A_BLOCK_BYTES` where a tile fits.
        let (tiles, fit) = (m.div_ceil(MR), (A_BLOCK_BYTES / (kp * 4 * MR)).max(1));
        let block = tiles.div_ceil(tiles.div_ceil(fit)) * MR;
        for i0 in (0..m).step_by(block) {
            let rows = block.min(m - i0);
            // SAFETY: as above, for rows `i0..i0 + rows` of the left operand.
            unsafe { pack(pa, MR, a.offset(i0 as isize * a_rs), a_rs, a_cs, rows, k) };
            for (p, j0) in (0..n).step_by(NR).enumerate() {
                for (t, r0) in (0..rows).step_by(MR).enumerate() {
                    let (ta, tb) = (&pa[t * kp * MR..][..kp * MR], &pb[p * kp * NR..][..kp * NR]);
                    let (rows, cols) = ((rows - r0).min(MR), (n - j0).min(NR));
                    // SAFETY: the block written lies inside `dst` (the caller's contract); the
                    // instructions are there for `DotPath::Instructions` (likewise).
                    unsafe {
                        let out = dst.add((i0 + r0) * dst_rs + j0);
                        match path {
                            DotPath::Instructions => {
                                tile(kp, ta.as_ptr(), tb.as_ptr(), out, dst_rs, rows, cols);
                            }
                            DotPath::Portable => tile_portable(kp, ta, tb, out, dst_rs, rows, cols),
                        }
                    }
                }
            }
        }
        for packed in [pa, pb] {
            if packed.capacity() * 4 > KEEP_BYTES {
                *packed = Vec::new();
            }
        }
    });
}

/// Packs `lines` lines of `k` values (line `l`'s element `kk` at `src + l * line_stride +
/// kk * k_stride`) into groups of `width` lines: group `g`, pair `q`, line `l` is the `u32` at
/// `(g * kp + q) * width + l` holding elements `2q` (low half) and `2q + 1` (high half).
/// Lines past `lines` and the high half past an odd `k` are zero.
///
/// # Safety
/// Every addressed element lies inside `src`'s buffer.
unsafe fn pack(
    dst: &mut Vec<u32>,
    width: usize,
    src: *const u16,
    line_stride: isize,
    k_stride: isize,
    lines: usize,
    k: usize,
) {
    let (kp, full) = (k.div_ceil(2), k / 2);
    let groups = lines.div_ceil(width);
    dst.clear();
    dst.reserve(groups * kp * width);
    let out = dst.as_mut_ptr();
    let at = |l: usize, kk: usize| l as isize * line_stride + kk as isize * k_stride;
    for g in 0..groups {
        let (first, count) = (g * width, width.min(lines - g * width));
        // SAFETY: the group's `kp * width` slots are inside the reserved capacity; elements
        // `at(l, kk)` for `l < lines`, `kk < k` are in range (the caller's contract).
        unsafe {
            let out = out.add(g * kp * width);
            if k_stride == 1 {
                // Pairs adjacent in memory: one unaligned 32-bit read each, line by line.
                for l in 0..count {
                    let line = src.offset(at(first + l, 0));
                    for q in 0..full {
                        *out.add(q * width + l) = line.add(2 * q).cast::<u32>().read_unaligned();
                    }
                }
            } else {
                // Pair by pair across lines (contiguous when the lines are adjacent).
                for q in 0..full {
                    let (lo, hi) = (src.offset(at(first, 2 * q)), src.offset(at(first, 2 * q + 1)));
                    for l in 0..count {
                        let step = l as isize * line_stride;
                        *out.add(q * width + l) =
                            u32::from(*lo.offset(step)) | u32::from(*hi.offset(step)) << 16;
                    }
                }
            }
            if k % 2 == 1 {
                for l in 0..count {
                    *out.add(full * width + l) = u32::from(*src.offset(at(first + l, k - 1)));
                }
            }
            for q in 0..kp {
                for l in count..width {
                    *out.add(q * width + l) = 0;
                }
            }
        }
    }
    // SAFETY: all `groups * kp * width` slots were written above.
    unsafe { dst.set_len(groups * kp * width) };
}

/// One `MR x NR` tile: `kp` pairs of the packed left tile `a` against the packed right panel
/// `b`, the first `rows x cols` results rounded to bf16 and stored at `dst` (row stride
/// `dst_rs`), the rest (padding) dropped.
///
/// # Safety
/// The CPU has the features [`available`] checks; `a` holds `kp * MR` and `b` `kp * NR`
/// values; the `rows x cols` block at `dst` is writable.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn tile(
    kp: usize,
    a: *const u32,
    b: *const u32,
    dst: *mut u16,
    dst_rs: usize,
    rows: usize,
    cols: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    for q in 0..kp {
        // SAFETY: pair `q` of the panel and of the tile are in range (the contract).
        let (b0, b1, a) = unsafe {
            let b = b.add(q * NR);
            (
                bh(_mm512_loadu_si512(b.cast())),
                bh(_mm512_loadu_si512(b.add(16).cast())),
                a.add(q * MR),
            )
        };
        for (r, row) in acc.iter_mut().enumerate() {
            // SAFETY: `r < MR`.
            let pair = bh(_mm512_set1_epi32(unsafe { *a.add(r) } as i32));
            row[0] = _mm512_dpbf16_ps(row[0], b0, pair);
            row[1] = _mm512_dpbf16_ps(row[1], b1, pair);
        }
    }
    for (r, row) in acc.iter().enumerate() {
        if r >= rows {
            break;
        }
        for (h, &v) in row.iter().enumerate() {
            let lo = h * 16;
            if lo >= cols {
                break;
            }
            let mask = if cols - lo >= 16 { u16::MAX } else { (1u16 << (cols - lo)) - 1 };
            // SAFETY: 16 bf16 values are 256 plain bits.
            let rounded: __m256i = unsafe { std::mem::transmute(_mm512_cvtneps_pbh(v)) };
            // SAFETY: the masked lanes are columns `lo..cols` of row `r`, inside the block.
            unsafe { _mm256_mask_storeu_epi16(dst.add(r * dst_rs + lo).cast(), mask, rounded) };
        }
    }
}

/// [`tile`] without the instruction, with its numerics ([`DotPath::Portable`]).
///
/// # Safety
/// `a` holds `kp * MR` and `b` `kp * NR` values; the `rows x cols` block at `dst` is
/// writable.
unsafe fn tile_portable(
    kp: usize,
    a: &[u32],
    b: &[u32],
    dst: *mut u16,
    dst_rs: usize,
    rows: usize,
    cols: usize,
) {
    // A bf16 as f32, subnormals as zero (the instruction's DAZ).
    let wide = |bits: u32| {
        let v = f32::from_bits((bits & 0xffff) << 16);
        if v.is_subnormal() { 0.0 } else { v }
    };
    let flush = |v: f32| if v.is_subnormal() { 0.0 } else { v };
    let mut acc = [[0f32; NR]; MR];
    for q in 0..kp {
        for (r, row) in acc.iter_mut().enumerate() {
            let pa = a[q * MR + r];
            for (c, sum) in row.iter_mut().enumerate() {
                let pb = b[q * NR + c];
                *sum = flush(*sum + wide(pa >> 16) * wide(pb >> 16));
                *sum = flush(*sum + wide(pa) * wide(pb));
            }
        }
    }
    for (r, row) in acc.iter().enumerate().take(rows) {
        for (c, &v) in row.iter().enumerate().take(cols) {
            // SAFETY: row `r < rows`, column `c < cols` of the block (the contract).
            unsafe { *dst.add(r * dst_rs + c) = bf16::from_f32(v).to_bits() };
        }
    }
}

/// `dst[j] = row · column j` for `j < n`, each column `k` contiguous values at `b + j * b_cs`,
/// rounded once to bf16. Lane `l` of 16 sums the pairs `l`, `l + 16`, ... of `k` (as one
/// `vdpbf16ps` per 32 values does), then the lanes are added in a fixed tree, so both paths
/// give the same bits.
///
/// # Safety
/// As [`product`], for one row of the left operand.
unsafe fn gemv(
    path: DotPath,
    row: *const u16,
    (b, b_cs): (*const u16, isize),
    n: usize,
    k: usize,
    dst: *mut u16,
) {
    let column = |j: usize| b.wrapping_offset(j as isize * b_cs);
    let mut j = 0;
    while j < n {
        // Four columns at a time on the instruction: four independent sums hide its latency.
        let count = if path == DotPath::Instructions { (n - j).min(4) } else { 1 };
        let mut lanes = [[0f32; 16]; 4];
        // SAFETY: the caller's contract: `k` values from `row` and from columns `j..j + count`.
        unsafe {
            match path {
                DotPath::Instructions => {
                    let cols = [
                        column(j),
                        column(j + 1.min(count - 1)),
                        column(j + 2.min(count - 1)),
                        column(j + 3.min(count - 1)),
                    ];
                    lanes = dot_lanes4(row, cols, k);
                }
                DotPath::Portable => {
                    lanes[0] = dot_lanes_portable(
                        std::slice::from_raw_parts(row, k),
                        std::slice::from_raw_parts(column(j), k),
                    );
                }
            }
        }
        for (c, l) in lanes.into_iter().take(count).enumerate() {
            // SAFETY: `j + c < n` lies in the row of `dst` (the contract).
            unsafe { *dst.add(j + c) = bf16::from_f32(reduce_lanes(l)).to_bits() };
        }
        j += count;
    }
}

/// The 16 lanes' sums, added pairwise at distances 8, 4, 2, 1.
fn reduce_lanes(mut lanes: [f32; 16]) -> f32 {
    for half in [8, 4, 2, 1] {
        for l in 0..half {
            lanes[l] += lanes[l + half];
        }
    }
    lanes[0]
}

/// Four dot products' 16 lane sums on `vdpbf16ps` (`row` against each of `cols`), 32 values
/// per instruction, the tail masked. A column repeated gives the same sums twice.
///
/// # Safety
/// The CPU has the features [`available`] checks; `row` and every column hold `k` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn dot_lanes4(row: *const u16, cols: [*const u16; 4], k: usize) -> [[f32; 16]; 4] {
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i < k {
        let left = k - i;
        let mask: __mmask32 = if left >= 32 { u32::MAX } else { (1u32 << left) - 1 };
        // SAFETY: the masked lanes read only values `i..k` of each operand.
        unsafe {
            let va = bh(_mm512_maskz_loadu_epi16(mask, row.add(i).cast()));
            for (sum, col) in acc.iter_mut().zip(cols) {
                *sum = _mm512_dpbf16_ps(
                    *sum,
                    va,
                    bh(_mm512_maskz_loadu_epi16(mask, col.add(i).cast())),
                );
            }
        }
        i += 32;
    }
    let mut lanes = [[0f32; 16]; 4];
    for (out, sum) in lanes.iter_mut().zip(acc) {
        // SAFETY: 16 f32 lanes into 16 f32s.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), sum) };
    }
    lanes
}

/// One column of [`dot_lanes4`] without the instruction, with its numerics (as
/// [`tile_portable`]).
fn dot_lanes_portable(a: &[u16], b: &[u16]) -> [f32; 16] {
    let wide = |bits: u16| {
        let v = f32::from_bits(u32::from(bits) << 16);
        if v.is_subnormal() { 0.0 } else { v }
    };
    let flush = |v: f32| if v.is_subnormal() { 0.0 } else { v };
    let mut lanes = [0f32; 16];
    for (q, (pa, pb)) in a.chunks(2).zip(b.chunks(2)).enumerate() {
        let sum = &mut lanes[q % 16];
        let (hi_a, hi_b) = (pa.get(1).copied().unwrap_or(0), pb.get(1).copied().unwrap_or(0));
        *sum = flush(*sum + wide(hi_a) * wide(hi_b));
        *sum = flush(*sum + wide(pa[0]) * wide(pb[0]));
    }
    lanes
}

/// The same 512 bits as 32 bf16 values.
#[inline(always)]
fn bh(x: __m512i) -> __m512bh {
    // SAFETY: both are 512-bit plain-data vectors.
    unsafe { std::mem::transmute(x) }
}
