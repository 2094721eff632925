//! Integer products of many rows (a prefill's projections), as fbgemm and llama.cpp take
//! them: the input quantized to Q8_0 blocks, the weight (Q8_0 or Q4_0 blocks, or per-channel
//! int8 rows) repacked once per product into groups of [`GEMM_GROUP`] outputs, and
//! AVX512-VNNI's `vpdpbusd` adding 64 byte products per instruction (four for each of 16
//! outputs) where an f32 FMA adds 16.
//!
//! `vpdpbusd` multiplies unsigned bytes by signed ones. The input's bytes are offset by 128
//! (`q ^ 0x80`), and each block's sums start from `-128 · Σ w` (stored with the packed
//! weight), so a block's `i32` sum is exactly `Σ q_x · q_w`, -128 included on both sides.
//! Each block's sum is then scaled once: `acc += f32(sum) · (d_w · d_x)` in one fused
//! multiply-add. The portable loop does the same integer sums and the same rounding in the
//! same order, so both paths give the same bits; they differ from the f32 product by the
//! input's rounding to its blocks (at most half a step of each block's scale per value).
//!
//! Packed layout, group `g` (outputs `16g..16g + 16`), block `b` of 32 values: 16 `i32`
//! corrections, 16 `f32` scales, then the values as 8 steps of 16 outputs × 4 consecutive
//! values (the instruction's operand), [`PACKED_BLOCK`] bytes in all; outputs past the
//! weight's rows are zero.

use std::cell::RefCell;
use std::sync::LazyLock;

use super::{DequantizeError, GgmlType, half_at};

/// Outputs per packed group: one vector of 16 `i32` lanes.
pub const GEMM_GROUP: usize = 16;
/// Values per block: Q8_0's, the input's blocks.
const BLOCK: usize = 32;
/// Bytes of a Q8_0 block: an `f16` scale and 32 `i8` values.
const ACT_BYTES: usize = 34;
/// Bytes of one block of a packed group.
const PACKED_BLOCK: usize = GEMM_GROUP * 4 + GEMM_GROUP * 4 + BLOCK * GEMM_GROUP;
/// Rows of the input per tile: 4 rows × 2 groups is 8 `i32` and 8 `f32` accumulators.
const MR: usize = 4;
/// Bytes of offset input a thread converts at a time, so that they stay in L2 while every
/// group of the weight passes over them.
const X_BLOCK_BYTES: usize = 128 * 1024;

/// What computes the products: the instruction, or a portable loop with the same sums and
/// roundings (tests run it on every host, so the packing and tiling are tested everywhere).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmPath {
    /// `vpdpbusd` (the CPU has AVX512-F/BW/VL, AVX512-VNNI and F16C: [`gemm_available`]).
    Vnni,
    /// Plain integer and float arithmetic.
    Portable,
}

impl GemmPath {
    /// The path this CPU runs: [`GemmPath::Vnni`] where [`gemm_available`].
    pub fn host() -> GemmPath {
        if gemm_available() { GemmPath::Vnni } else { GemmPath::Portable }
    }
}

/// Whether the integer products run on the instruction here. Elsewhere a prefill
/// dequantizes its weights for a dense f32 product (the portable loop is for tests).
pub fn gemm_available() -> bool {
    static AVAILABLE: LazyLock<bool> = LazyLock::new(|| {
        #[cfg(target_arch = "x86_64")]
        return is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512vnni")
            && is_x86_feature_detected!("f16c");
        #[cfg(not(target_arch = "x86_64"))]
        false
    });
    *AVAILABLE
}

/// A weight to pack: `rows` back to back, each of the same number of values.
#[derive(Clone, Copy)]
pub enum GemmWeights<'a> {
    /// Q8_0 or Q4_0 blocks.
    Blocks(GgmlType, &'a [u8]),
    /// Per-channel int8: `i8` rows and one `f32` scale per row.
    Int8 {
        /// The values, row-major.
        rows: &'a [i8],
        /// One per row.
        scales: &'a [f32],
    },
}

impl std::fmt::Debug for GemmWeights<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GemmWeights::Blocks(kind, bytes) => write!(f, "{kind} blocks ({} bytes)", bytes.len()),
            GemmWeights::Int8 { scales, .. } => write!(f, "int8 rows ({} rows)", scales.len()),
        }
    }
}

impl GemmWeights<'_> {
    /// The number of rows of `k` values, or `None` when the data is not whole rows of them
    /// (or the type has no packing).
    fn rows(&self, k: usize) -> Option<usize> {
        match *self {
            GemmWeights::Blocks(kind @ (GgmlType::Q8_0 | GgmlType::Q4_0), bytes) => {
                let row = kind.bytes_of(k).filter(|&r| r > 0)?;
                bytes.len().is_multiple_of(row).then(|| bytes.len() / row)
            }
            GemmWeights::Blocks(..) => None,
            GemmWeights::Int8 { rows, scales } => {
                (k > 0 && rows.len() == scales.len() * k).then_some(scales.len())
            }
        }
    }

    /// Row `n`'s block `b`: its scale and its 32 values.
    fn block(&self, k: usize, n: usize, b: usize) -> (f32, [i8; BLOCK]) {
        let mut v = [0i8; BLOCK];
        match *self {
            GemmWeights::Blocks(GgmlType::Q8_0, bytes) => {
                let at = (n * (k / BLOCK) + b) * ACT_BYTES;
                let blk = &bytes[at..at + ACT_BYTES];
                for (v, &q) in v.iter_mut().zip(&blk[2..]) {
                    *v = q as i8;
                }
                (half_at(blk, 0), v)
            }
            GemmWeights::Blocks(_, bytes) => {
                // Q4_0: the low nibbles are values 0..16, the high ones 16..32, each `q - 8`.
                let at = (n * (k / BLOCK) + b) * 18;
                let blk = &bytes[at..at + 18];
                for (j, &q) in blk[2..].iter().enumerate() {
                    v[j] = (q & 15) as i8 - 8;
                    v[j + 16] = (q >> 4) as i8 - 8;
                }
                (half_at(blk, 0), v)
            }
            GemmWeights::Int8 { rows, scales } => {
                let at = n * k + b * BLOCK;
                v.copy_from_slice(&rows[at..at + BLOCK]);
                (scales[n], v)
            }
        }
    }
}

/// The bytes of one packed group of rows of `k` values, or `None` when `k` is not a
/// positive multiple of 32.
pub fn packed_group_bytes(k: usize) -> Option<usize> {
    (k > 0 && k.is_multiple_of(BLOCK)).then(|| k / BLOCK * PACKED_BLOCK)
}

/// Packs the groups of `weights` (rows of `k` values) from `first` on into `out` (whole
/// groups: as many as it holds).
///
/// # Errors
/// [`DequantizeError::Unsupported`] for a block type without a packing (Q8_0 and Q4_0 have
/// one); [`DequantizeError::Size`] when `k` is not a multiple of 32, the weight is not whole
/// rows of `k` values, or `out` is not whole groups within the weight's.
pub fn pack_gemm(
    weights: GemmWeights<'_>,
    k: usize,
    first: usize,
    out: &mut [u8],
) -> Result<(), DequantizeError> {
    pack_gemm_on(GemmPath::host(), weights, k, first, out)
}

/// [`pack_gemm`] on `path` (both write the same bytes; [`GemmPath::Vnni`] moves each
/// block's 32 values with one load and one scatter, and falls back to the portable loop on
/// a CPU without the instructions).
///
/// # Errors
/// As [`pack_gemm`].
pub fn pack_gemm_on(
    path: GemmPath,
    weights: GemmWeights<'_>,
    k: usize,
    first: usize,
    out: &mut [u8],
) -> Result<(), DequantizeError> {
    if let GemmWeights::Blocks(kind, _) = weights
        && !matches!(kind, GgmlType::Q8_0 | GgmlType::Q4_0)
    {
        return Err(DequantizeError::Unsupported(kind));
    }
    let (kind, bytes) = match weights {
        GemmWeights::Blocks(kind, bytes) => (kind, bytes.len()),
        GemmWeights::Int8 { rows, .. } => (GgmlType::I8, rows.len()),
    };
    let size = DequantizeError::Size { kind, values: k, bytes };
    let (Some(group), Some(n)) = (packed_group_bytes(k), weights.rows(k)) else {
        return Err(size);
    };
    let count = out.len() / group;
    if !out.len().is_multiple_of(group) || first + count > n.div_ceil(GEMM_GROUP) {
        return Err(size);
    }
    for (g, out) in out.chunks_exact_mut(group).enumerate() {
        let rows = n.saturating_sub((first + g) * GEMM_GROUP).min(GEMM_GROUP);
        #[cfg(target_arch = "x86_64")]
        if path == GemmPath::Vnni && gemm_available() {
            let row0 = (first + g) * GEMM_GROUP;
            let row_bytes = kind.bytes_of(k).expect("whole rows (checked above)");
            let (source, src) = match weights {
                GemmWeights::Blocks(GgmlType::Q8_0, bytes) => (vnni::Source::Q8_0, bytes),
                GemmWeights::Blocks(_, bytes) => (vnni::Source::Q4_0, bytes),
                GemmWeights::Int8 { rows: values, scales } => {
                    // SAFETY: `i8` and `u8` have one layout.
                    let bytes = unsafe { &*(std::ptr::from_ref(values) as *const [u8]) };
                    (vnni::Source::Int8(&scales[row0..row0 + rows]), bytes)
                }
            };
            let src = &src[row0 * row_bytes..];
            // SAFETY: the CPU has the instructions (`gemm_available`); `src` (the
            // weight's bytes from row `row0` on) holds `rows` rows of `row_bytes`; `out` is
            // one group of `k / 32` packed blocks.
            unsafe { vnni::pack_group(source, src, row_bytes, rows, k / BLOCK, out) };
            continue;
        }
        let _ = path;
        if rows < GEMM_GROUP {
            out.fill(0);
        }
        for (b, out) in out.chunks_exact_mut(PACKED_BLOCK).enumerate() {
            let (heads, values) = out.split_at_mut(GEMM_GROUP * 8);
            for l in 0..rows {
                let (d, v) = weights.block(k, (first + g) * GEMM_GROUP + l, b);
                let correction = -128 * v.iter().map(|&q| i32::from(q)).sum::<i32>();
                heads[l * 4..][..4].copy_from_slice(&correction.to_le_bytes());
                heads[(GEMM_GROUP + l) * 4..][..4].copy_from_slice(&d.to_le_bytes());
                for (t, four) in v.chunks_exact(4).enumerate() {
                    let four = [four[0] as u8, four[1] as u8, four[2] as u8, four[3] as u8];
                    values[(t * GEMM_GROUP + l) * 4..][..4].copy_from_slice(&four);
                }
            }
        }
    }
    Ok(())
}

/// The values of packed groups as `f32` (`d · q`; [`GEMM_GROUP`] rows of `k` per group,
/// zero past the weight's rows), read back from the layout [`pack_gemm`] writes: what
/// `KILN_CHECK`'s references of the products multiply.
///
/// # Errors
/// [`DequantizeError::Size`] when `packed` is not whole groups of rows of `k` values or
/// `out` not their values.
pub fn unpack_gemm(packed: &[u8], k: usize, out: &mut [f32]) -> Result<(), DequantizeError> {
    let size = DequantizeError::Size { kind: GgmlType::I8, values: out.len(), bytes: packed.len() };
    let group = packed_group_bytes(k).ok_or(size.clone())?;
    let groups = packed.len() / group;
    if !packed.len().is_multiple_of(group) || out.len() != groups * GEMM_GROUP * k {
        return Err(size);
    }
    for (g, blocks) in packed.chunks_exact(group).enumerate() {
        for (b, blk) in blocks.chunks_exact(PACKED_BLOCK).enumerate() {
            for l in 0..GEMM_GROUP {
                let at = (GEMM_GROUP + l) * 4;
                let d = f32::from_le_bytes([blk[at], blk[at + 1], blk[at + 2], blk[at + 3]]);
                for t in 0..BLOCK {
                    let q = blk[GEMM_GROUP * 8 + ((t / 4) * GEMM_GROUP + l) * 4 + t % 4] as i8;
                    out[(g * GEMM_GROUP + l) * k + b * BLOCK + t] = d * f32::from(q);
                }
            }
        }
    }
    Ok(())
}

thread_local! {
    /// Each thread's offset input and its blocks' scales, kept between products.
    static SCRATCH: RefCell<(Vec<u8>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `out = a · Wᵀ` for `a` rows of Q8_0 blocks (`k` values each) and `packed` the groups of
/// `W` ([`pack_gemm`]): `out` is row-major, one row per row of `a`, 16 columns per group (the
/// columns past `W`'s rows are zero), on the host's path.
///
/// # Errors
/// As [`gemm_int8_on`].
pub fn gemm_int8(
    a: &[u8],
    packed: &[u8],
    k: usize,
    out: &mut [f32],
) -> Result<(), DequantizeError> {
    gemm_int8_on(GemmPath::host(), a, packed, k, out)
}

/// [`gemm_int8`] on `path` ([`GemmPath::Vnni`] falls back to the portable loop on a CPU
/// without the instruction).
///
/// # Errors
/// [`DequantizeError::Size`] when `k` is not a multiple of 32, `a` is not whole rows of its
/// blocks, `packed` not whole groups, or `out` not one row of the groups' outputs per row.
pub fn gemm_int8_on(
    path: GemmPath,
    a: &[u8],
    packed: &[u8],
    k: usize,
    out: &mut [f32],
) -> Result<(), DequantizeError> {
    let size = || DequantizeError::Size { kind: GgmlType::Q8_0, values: k, bytes: a.len() };
    let group = packed_group_bytes(k).ok_or_else(size)?;
    let row_bytes = k / BLOCK * ACT_BYTES;
    let (m, groups) = (a.len() / row_bytes, packed.len() / group);
    let whole = a.len().is_multiple_of(row_bytes) && packed.len().is_multiple_of(group);
    if !whole || m.checked_mul(groups * GEMM_GROUP) != Some(out.len()) {
        return Err(size());
    }
    let cols = groups * GEMM_GROUP;
    let vnni = path == GemmPath::Vnni && gemm_available();
    // The team's tasks: bands of rows where there are enough (each reads the whole weight
    // once), else bands of groups (each reads the whole input once).
    let threads = crate::team::threads();
    let tiles = m.div_ceil(MR);
    let (row_parts, group_parts) = match tiles >= 4 * threads || groups < 2 * threads {
        true => (threads.min(tiles), 1),
        false => (1, threads),
    };
    let rows_per = tiles.div_ceil(row_parts) * MR;
    let groups_per = groups.div_ceil(group_parts).next_multiple_of(2);
    let dst = Shared(out.as_mut_ptr());
    crate::team::for_each(row_parts * group_parts, &|task| {
        let (r0, g0) = ((task / group_parts) * rows_per, (task % group_parts) * groups_per);
        let (r1, g1) = ((r0 + rows_per).min(m), (g0 + groups_per).min(groups));
        if r0 < r1 && g0 < g1 {
            let a = &a[r0 * row_bytes..r1 * row_bytes];
            let w = &packed[g0 * group..g1 * group];
            let dst = &dst;
            // SAFETY: the block of rows `r0..r1` and columns `16 g0..16 g1` of `out` (row
            // stride `cols`), which no other task writes.
            unsafe { band(vnni, a, w, k, dst.0.add(r0 * cols + g0 * GEMM_GROUP), cols) };
        }
    });
    Ok(())
}

/// The output's memory shared by the team's tasks, each writing its own block.
struct Shared(*mut f32);
// SAFETY: the tasks write disjoint blocks.
unsafe impl Sync for Shared {}

/// `a`'s rows (Q8_0 blocks of `k` values) times the packed groups `w`, written at `dst`
/// (row stride `cols`), on the instruction where `vnni`.
///
/// # Safety
/// `vnni` only where [`gemm_available`]; `dst` has room for `a`'s rows of `cols` values,
/// of which this writes the first `16 · groups`, and no other thread writes them.
unsafe fn band(vnni: bool, a: &[u8], w: &[u8], k: usize, dst: *mut f32, cols: usize) {
    let (row_bytes, nb) = (k / BLOCK * ACT_BYTES, k / BLOCK);
    let group = nb * PACKED_BLOCK;
    let (m, groups) = (a.len() / row_bytes, w.len() / group);
    let rows_per_block = (X_BLOCK_BYTES / k / MR).max(1) * MR;
    SCRATCH.with_borrow_mut(|(x, xs)| {
        for m0 in (0..m).step_by(rows_per_block) {
            let rows = rows_per_block.min(m - m0);
            offset_input(
                &a[m0 * row_bytes..(m0 + rows) * row_bytes],
                nb,
                rows.next_multiple_of(MR),
                x,
                xs,
            );
            for g0 in (0..groups).step_by(2) {
                let ng = (groups - g0).min(2);
                let w = &w[g0 * group..(g0 + ng) * group];
                for r0 in (0..rows).step_by(MR) {
                    let (xt, st) = (&x[r0 * k..(r0 + MR) * k], &xs[r0 * nb..(r0 + MR) * nb]);
                    let tile_rows = MR.min(rows - r0);
                    // SAFETY: rows `m0 + r0..` of the block, columns `16 g0..16 (g0 + ng)`,
                    // inside what the caller gives.
                    let dst = unsafe { dst.add((m0 + r0) * cols + g0 * GEMM_GROUP) };
                    #[cfg(target_arch = "x86_64")]
                    if vnni {
                        // SAFETY: the CPU has the instructions (the contract); `xt` is `MR`
                        // rows of `k` bytes and `st` their `MR · nb` scales; `w` is `ng`
                        // groups of `nb` packed blocks; `dst` has room for `tile_rows` rows
                        // of `ng · 16` at stride `cols`.
                        unsafe {
                            match ng {
                                2 => vnni::tile::<2>(nb, xt, st, w, group, dst, cols, tile_rows),
                                _ => vnni::tile::<1>(nb, xt, st, w, group, dst, cols, tile_rows),
                            }
                        }
                        continue;
                    }
                    let _ = vnni;
                    // SAFETY: as above.
                    unsafe { tile_portable(nb, xt, st, w, group, ng, dst, cols, tile_rows) };
                }
            }
        }
    });
}

/// The input's values offset by 128 (`rows` rows of `k = 32 nb` bytes into `x`, then zero
/// rows up to `padded`, as `0x80`) and its blocks' scales (`xs`, zero for the padding).
fn offset_input(a: &[u8], nb: usize, padded: usize, x: &mut Vec<u8>, xs: &mut Vec<f32>) {
    x.clear();
    xs.clear();
    for blk in a.chunks_exact(ACT_BYTES) {
        xs.push(half_at(blk, 0));
        x.extend(blk[2..].iter().map(|&q| q ^ 0x80));
    }
    x.resize(padded * nb * BLOCK, 0x80);
    xs.resize(padded * nb, 0.0);
}

/// One tile without the instruction: the sums and roundings of [`vnni::tile`].
///
/// # Safety
/// `dst` has room for `rows` rows of `ng · 16` values at stride `cols`.
#[allow(clippy::too_many_arguments)]
unsafe fn tile_portable(
    nb: usize,
    x: &[u8],
    xs: &[f32],
    w: &[u8],
    group: usize,
    ng: usize,
    dst: *mut f32,
    cols: usize,
    rows: usize,
) {
    let k = nb * BLOCK;
    let i32_at = |b: &[u8], at: usize| i32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    for g in 0..ng {
        let mut acc = [[0f32; GEMM_GROUP]; MR];
        for b in 0..nb {
            let blk = &w[g * group + b * PACKED_BLOCK..][..PACKED_BLOCK];
            for (r, acc) in acc.iter_mut().enumerate() {
                let xr = &x[r * k + b * BLOCK..][..BLOCK];
                for (l, acc) in acc.iter_mut().enumerate() {
                    let mut sum = i32_at(blk, l * 4);
                    for t in 0..BLOCK / 4 {
                        for j in 0..4 {
                            let q = blk[GEMM_GROUP * 8 + (t * GEMM_GROUP + l) * 4 + j] as i8;
                            sum += i32::from(xr[t * 4 + j]) * i32::from(q);
                        }
                    }
                    let d = f32::from_bits(i32_at(blk, (GEMM_GROUP + l) * 4) as u32);
                    *acc = (sum as f32).mul_add(d * xs[r * nb + b], *acc);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate().take(rows) {
            // SAFETY: row `r < rows`, columns `16g..16g + 16` (the contract).
            unsafe {
                dst.add(r * cols + g * GEMM_GROUP)
                    .copy_from_nonoverlapping(acc.as_ptr(), GEMM_GROUP);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod vnni {
    use std::arch::x86_64::*;

    use super::{BLOCK, GEMM_GROUP, MR, PACKED_BLOCK};

    /// The layout of the rows a group is packed from.
    #[derive(Clone, Copy)]
    pub(super) enum Source<'a> {
        /// Q8_0 blocks: an `f16` scale, 32 `i8` values.
        Q8_0,
        /// Q4_0 blocks: an `f16` scale, 16 bytes of two 4-bit values (`q - 8`).
        Q4_0,
        /// `i8` rows and their scales (one per row of the group).
        Int8(&'a [f32]),
    }

    /// One packed group ([`super::pack_gemm`]'s layout) from `rows` rows (at most 16) of
    /// `row_bytes` at `src`, `nb` blocks each. Row by row, each block's 32 values are one
    /// load and one scatter of eight four-value steps (reading the rows in memory order:
    /// gathering a step of all 16 rows at once ran up to four times slower from memory);
    /// then each block's corrections are the sums of its steps (`vpdpbusd` by ones).
    ///
    /// # Safety
    /// The CPU has AVX512-F, AVX512-BW, AVX512-VL and AVX512-VNNI; `src` holds `rows` rows
    /// of `row_bytes` bytes, each `nb` blocks of the source's layout; `out` is `nb` packed
    /// blocks; a source of scales holds `rows` of them.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,f16c")]
    pub(super) unsafe fn pack_group(
        source: Source<'_>,
        src: &[u8],
        row_bytes: usize,
        rows: usize,
        nb: usize,
        out: &mut [u8],
    ) {
        debug_assert!(rows <= GEMM_GROUP && src.len() >= rows * row_bytes);
        debug_assert!(out.len() == nb * PACKED_BLOCK);
        if rows < GEMM_GROUP {
            out.fill(0);
        }
        let steps = _mm256_setr_epi32(0, 64, 128, 192, 256, 320, 384, 448);
        let (eights, nibble) = (_mm_set1_epi8(8), _mm_set1_epi8(0x0f));
        let o = out.as_mut_ptr();
        // The `f16` at `p` as f32.
        // SAFETY: `p` points at two readable bytes (the callers' blocks).
        let half = |p: *const u8| unsafe {
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
                p.cast::<u16>().read_unaligned(),
            ))))
        };
        for l in 0..rows {
            let row = src[l * row_bytes..(l + 1) * row_bytes].as_ptr();
            for b in 0..nb {
                // SAFETY: block `b` of row `l` (the contract: `nb` blocks a row).
                let (scale, values) = unsafe {
                    match source {
                        Source::Q8_0 => {
                            let blk = row.add(b * 34);
                            (half(blk), _mm256_loadu_si256(blk.add(2).cast()))
                        }
                        Source::Q4_0 => {
                            let blk = row.add(b * 18);
                            let q = _mm_loadu_si128(blk.add(2).cast());
                            let low = _mm_sub_epi8(_mm_and_si128(q, nibble), eights);
                            let high =
                                _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(q), nibble), eights);
                            (half(blk), _mm256_set_m128i(high, low))
                        }
                        Source::Int8(scales) => {
                            (scales[l], _mm256_loadu_si256(row.add(b * BLOCK).cast()))
                        }
                    }
                };
                // SAFETY: the block's scale `l`, and its eight steps' values `l`, inside
                // `out` (`nb` packed blocks).
                unsafe {
                    let blk = o.add(b * PACKED_BLOCK);
                    blk.add((GEMM_GROUP + l) * 4).cast::<f32>().write_unaligned(scale);
                    let base = blk.add(GEMM_GROUP * 8 + l * 4);
                    _mm256_i32scatter_epi32::<1>(base.cast(), steps, values);
                }
            }
        }
        let (ones, zero) = (_mm512_set1_epi8(1), _mm512_setzero_si512());
        for b in 0..nb {
            // SAFETY: block `b`'s 8 steps of 64 bytes after its corrections and scales.
            unsafe {
                let blk = o.add(b * PACKED_BLOCK);
                let sums = (0..BLOCK / 4).fold(zero, |acc, t| {
                    let step = _mm512_loadu_si512(blk.add(GEMM_GROUP * 8 + 64 * t).cast());
                    _mm512_dpbusd_epi32(acc, ones, step)
                });
                let corrections = _mm512_sub_epi32(zero, _mm512_slli_epi32::<7>(sums));
                _mm512_storeu_si512(blk.cast(), corrections);
            }
        }
    }

    /// `MR` rows of offset input (`x`, `MR · 32 nb` bytes, and their scales `xs`) times `NG`
    /// packed groups (`w`, `group` bytes each), the first `rows` rows of the `NG · 16`
    /// results stored at `dst` (row stride `cols`).
    ///
    /// # Safety
    /// The CPU has AVX512-F, AVX512-BW and AVX512-VNNI; the slices are as described, and
    /// `dst` has room for `rows` rows of `NG · 16` values at stride `cols`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile<const NG: usize>(
        nb: usize,
        x: &[u8],
        xs: &[f32],
        w: &[u8],
        group: usize,
        dst: *mut f32,
        cols: usize,
        rows: usize,
    ) {
        let k = nb * BLOCK;
        debug_assert!(x.len() >= MR * k && xs.len() >= MR * nb && w.len() >= NG * group);
        debug_assert!(rows <= MR);
        let (x, xs, w) = (x.as_ptr(), xs.as_ptr(), w.as_ptr());
        let mut acc = [[_mm512_setzero_ps(); NG]; MR];
        for b in 0..nb {
            let mut sums = [[_mm512_setzero_si512(); NG]; MR];
            let mut blk = [w; NG];
            for (g, blk) in blk.iter_mut().enumerate() {
                // SAFETY: block `b` of group `g` lies inside `w` (the contract).
                *blk = unsafe { w.add(g * group + b * PACKED_BLOCK) };
                // SAFETY: its corrections are its first 64 bytes.
                let start = unsafe { _mm512_loadu_si512(blk.cast()) };
                for sums in &mut sums {
                    sums[g] = start;
                }
            }
            for t in 0..BLOCK / 4 {
                let mut wv = [_mm512_setzero_si512(); NG];
                for (wv, blk) in wv.iter_mut().zip(&blk) {
                    // SAFETY: step `t`'s 64 bytes of values, after the block's 128 bytes of
                    // corrections and scales.
                    *wv = unsafe { _mm512_loadu_si512(blk.add(GEMM_GROUP * 8 + t * 64).cast()) };
                }
                for (r, sums) in sums.iter_mut().enumerate() {
                    // SAFETY: four bytes of row `r < MR`, block `b`, inside `x`.
                    let four =
                        unsafe { x.add(r * k + b * BLOCK + t * 4).cast::<i32>().read_unaligned() };
                    let xv = _mm512_set1_epi32(four);
                    for (sum, &wv) in sums.iter_mut().zip(&wv) {
                        *sum = _mm512_dpbusd_epi32(*sum, xv, wv);
                    }
                }
            }
            for (g, blk) in blk.iter().enumerate() {
                // SAFETY: the block's scales are its second 64 bytes.
                let ws = unsafe { _mm512_loadu_ps(blk.add(GEMM_GROUP * 4).cast()) };
                for (r, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: row `r < MR`'s block `b` scale is inside `xs`.
                    let scale = _mm512_mul_ps(ws, _mm512_set1_ps(unsafe { *xs.add(r * nb + b) }));
                    acc[g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r][g]), scale, acc[g]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate().take(rows) {
            for (g, &v) in acc.iter().enumerate() {
                // SAFETY: row `r < rows`, columns `16g..16g + 16` (the contract).
                unsafe { _mm512_storeu_ps(dst.add(r * cols + g * GEMM_GROUP), v) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use kiln_ir::testing::bytes;

    /// Blocks of `kind` with random values and scales in `[2⁻⁸, 2⁻⁷)` (f16 bits).
    fn blocks(kind: GgmlType, seed: u32, rows: usize, k: usize) -> Vec<u8> {
        let (_, size) = kind.block().expect("a block type");
        let mut out = bytes(rows * k / BLOCK * size, seed);
        for blk in out.chunks_exact_mut(size) {
            let d = half::f16::from_f32(1.0 / 256.0 + f32::from(blk[0]) / 65536.0);
            blk[..2].copy_from_slice(&d.to_le_bytes());
        }
        out
    }

    fn values(kind: GgmlType, data: &[u8]) -> Vec<f64> {
        let (vals, size) = kind.block().expect("a block type");
        let mut out = vec![0f32; data.len() / size * vals];
        super::super::dequantize(kind, data, &mut out).expect("whole blocks");
        out.into_iter().map(f64::from).collect()
    }

    #[test]
    fn products_match_the_f64_product_on_both_paths() {
        if !gemm_available() {
            let why = "this CPU has no AVX512-VNNI: the portable loop runs for both paths";
            kiln_ir::testing::skip("quant::gemm::products_match", why, &["KILN_REQUIRE_VNNI"]);
        }
        // (Bands of rows on a team of two or more: 37 rows; bands of groups: 5 rows of 80.)
        for (m, n, k) in [
            (1, 1, 32),
            (5, 17, 64),
            (9, 40, 96),
            (4, 32, 32),
            (13, 33, 256),
            (37, 20, 64),
            (5, 80, 64),
        ] {
            let a = blocks(GgmlType::Q8_0, 1, m, k);
            let x = values(GgmlType::Q8_0, &a);
            let int8_rows: Vec<i8> = bytes(n * k, 2).into_iter().map(|b| b as i8).collect();
            let int8_scales: Vec<f32> = (0..n).map(|i| 0.01 + i as f32 / 1000.0).collect();
            let q8 = blocks(GgmlType::Q8_0, 3, n, k);
            let q4 = blocks(GgmlType::Q4_0, 4, n, k);
            let int8_values: Vec<f64> = int8_rows
                .iter()
                .enumerate()
                .map(|(i, &q)| f64::from(q) * f64::from(int8_scales[i / k]))
                .collect();
            let cases = [
                (GemmWeights::Int8 { rows: &int8_rows, scales: &int8_scales }, int8_values),
                (GemmWeights::Blocks(GgmlType::Q8_0, &q8), values(GgmlType::Q8_0, &q8)),
                (GemmWeights::Blocks(GgmlType::Q4_0, &q4), values(GgmlType::Q4_0, &q4)),
            ];
            for (weights, w) in cases {
                let groups = n.div_ceil(GEMM_GROUP);
                let group = packed_group_bytes(k).expect("k is whole blocks");
                let mut packed = vec![0u8; groups * group];
                // Packed in two calls, as threads pack their groups; both paths write the
                // same bytes.
                let (head, tail) = packed.split_at_mut(group.min(groups * group));
                pack_gemm_on(GemmPath::Portable, weights, k, 0, head).expect("packs");
                pack_gemm_on(GemmPath::Portable, weights, k, 1, tail).expect("packs");
                let mut vector = vec![0xa5u8; groups * group];
                pack_gemm_on(GemmPath::Vnni, weights, k, 0, &mut vector).expect("packs");
                assert!(packed == vector, "{weights:?}: the paths pack the same bytes");
                let mut unpacked = vec![0f32; groups * GEMM_GROUP * k];
                unpack_gemm(&packed, k, &mut unpacked).expect("whole groups");
                for (i, &u) in unpacked.iter().enumerate() {
                    let want = if i < n * k { w[i] } else { 0.0 };
                    assert!((f64::from(u) - want).abs() <= 1e-6 * want.abs(), "{weights:?} {i}");
                }
                let cols = groups * GEMM_GROUP;
                let mut got = [vec![f32::NAN; m * cols], vec![f32::NAN; m * cols]];
                for (path, out) in [GemmPath::Vnni, GemmPath::Portable].into_iter().zip(&mut got) {
                    gemm_int8_on(path, &a, &packed, k, out).expect("sizes fit");
                }
                assert_eq!(got[0], got[1], "{weights:?}: both paths give the same bits");
                for i in 0..m {
                    for j in 0..cols {
                        let g = f64::from(got[0][i * cols + j]);
                        if j >= n {
                            assert_eq!(g, 0.0, "column {j} past the weight's rows");
                            continue;
                        }
                        let terms = (0..k).map(|t| x[i * k + t] * w[j * k + t]);
                        let (want, scale) =
                            terms.fold((0.0, 0.0), |(s, a), v| (s + v, a + v.abs()));
                        assert!(
                            (g - want).abs() <= 1e-5 * scale.max(1e-3),
                            "{weights:?} m={m} n={n} k={k} [{i}, {j}]: {g} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn extreme_bytes_are_exact() {
        // -128 on both sides, the sums the offset and its correction must cancel exactly.
        let k = 64;
        let mut a = vec![0u8; k / BLOCK * ACT_BYTES];
        for blk in a.chunks_exact_mut(ACT_BYTES) {
            blk[..2].copy_from_slice(&half::f16::ONE.to_le_bytes());
            blk[2..].fill(0x80);
        }
        let rows = vec![-128i8; k];
        let mut packed = vec![0u8; packed_group_bytes(k).expect("whole blocks")];
        pack_gemm(GemmWeights::Int8 { rows: &rows, scales: &[1.0] }, k, 0, &mut packed)
            .expect("packs");
        for path in [GemmPath::Vnni, GemmPath::Portable] {
            let mut out = vec![0f32; GEMM_GROUP];
            gemm_int8_on(path, &a, &packed, k, &mut out).expect("sizes fit");
            assert_eq!(out[0], (128 * 128 * k) as f32, "{path:?}");
            assert!(out[1..].iter().all(|&v| v == 0.0), "{path:?}: padded outputs are zero");
        }
    }

    #[test]
    fn sizes_that_do_not_fit_are_errors() {
        let rows = vec![1i8; 64];
        let weights = GemmWeights::Int8 { rows: &rows, scales: &[1.0] };
        let group = packed_group_bytes(64).expect("whole blocks");
        assert!(pack_gemm(weights, 48, 0, &mut vec![0; group]).is_err(), "k not whole blocks");
        assert!(pack_gemm(weights, 64, 1, &mut vec![0; group]).is_err(), "a group past the rows");
        let q4k = GemmWeights::Blocks(GgmlType::Q4_K, &[]);
        assert!(matches!(pack_gemm(q4k, 256, 0, &mut []), Err(DequantizeError::Unsupported(_))));
        let packed = vec![0u8; group];
        let a = vec![0u8; 2 * ACT_BYTES];
        assert!(gemm_int8(&a, &packed, 64, &mut [0.0; 15]).is_err(), "out one short");
        assert!(gemm_int8(&a[1..], &packed, 64, &mut [0.0; 16]).is_err(), "a partial block");
        gemm_int8(&a, &packed, 64, &mut [0.0; 16]).expect("fits");
    }
}
