//! Matrix products through the `gemm` crate (AVX-512 kernels picked at run time) for `f32`,
//! `f64` and `f16`, and for `bf16` on AVX512-BF16's dot products where the CPU has them
//! ([`bf16_dot`]; elsewhere widened to f32 for `gemm`). Operands are read through views: a transposed or sliced operand is
//! passed as strides, never copied.
//!
//! Threads: kiln splits every product of at least [`SPLIT_FROM`] multiply-adds itself, on
//! the team (`crate::team`), into one band of output columns (or rows) per thread, each a
//! single-threaded `gemm` call; batched products run their batches in parallel. `gemm` 0.19's
//! own parallelism does not split a product whose right operand is column-major (`x @ w.t()`,
//! every `Linear` forward), and it runs on rayon's pool, whose workers wake up for each call.
//! Measured on a 2-core machine, bands on the team against `gemm`'s parallelism: 1024³
//! 387 against 355 GFLOP/s, 2048³ 399 against 366, 512x768 by 768x3072 414 against 366.

#[cfg(target_arch = "x86_64")]
mod bf16_dot;
mod gemv;

use gemm::{Parallelism, gemm};
use half::{bf16, f16};
use kiln_ir::{DType, Element, View};

use crate::{Buffer, RuntimeError};

/// `a @ b` for operands viewed as `[.., m, k]` and `[.., k, n]` with equal batch
/// dimensions (any strides, broadcast batches included); the result is dense row-major.
///
/// # Panics
/// If the dtype is not `f32`, `f64` or `f16` (the planner sends only those here).
pub(crate) fn matmul(a: &Buffer, va: &View, b: &Buffer, vb: &View) -> Result<Buffer, RuntimeError> {
    match a.dtype() {
        DType::F32 => batched::<f32>(a, va, b, vb, 0.0, (&f32_band, Split::Gemm)),
        DType::F64 => batched::<f64>(a, va, b, vb, 0.0, (&with_gemm(1.0), Split::Gemm)),
        DType::F16 => batched::<f16>(a, va, b, vb, f16::ZERO, (&with_gemm(f16::ONE), Split::Gemm)),
        #[cfg(target_arch = "x86_64")]
        DType::BF16 if let Some(path) = bf16_dot_path() => batched::<bf16>(
            a,
            va,
            b,
            vb,
            bf16::ZERO,
            (
                // SAFETY: the CPU has the instructions where `path` uses them (`bf16_dot_path`).
                &|pr, dst, dst_rs, lhs, rhs| unsafe {
                    bf16_dot::product(pr, dst, dst_rs, lhs, rhs, path);
                },
                Split::Longer,
            ),
        ),
        DType::BF16 => bf16_through_f32(a, va, b, vb),
        DType::I64 | DType::I32 | DType::I8 | DType::U8 => integer(a, va, b, vb),
        other => unreachable!("matmul of {other}: the op's dtype check refuses it"),
    }
}

/// Whether bf16 products on the CPU run on its bf16 dot-product instructions (AVX512-BF16)
/// rather than widened to f32 for `gemm`: `kiln::debug::bf16_dot_products` documents it.
pub fn bf16_dot_products() -> bool {
    #[cfg(target_arch = "x86_64")]
    return bf16_dot_path() == Some(bf16_dot::DotPath::Instructions);
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// How this thread's bf16 products run on the dot-product path: on the instructions where
/// the CPU has them (and they are allowed), with the portable tile where a test asks for it
/// ([`portable_bf16_dot_products`]); `None` where they widen to f32.
#[cfg(target_arch = "x86_64")]
fn bf16_dot_path() -> Option<bf16_dot::DotPath> {
    if BF16_DOT_PORTABLE.get() {
        Some(bf16_dot::DotPath::Portable)
    } else if BF16_DOT_ON.get() && bf16_dot::available() {
        Some(bf16_dot::DotPath::Instructions)
    } else {
        None
    }
}

thread_local! {
    /// Whether this thread's bf16 products may use the dot-product instructions.
    static BF16_DOT_ON: std::cell::Cell<bool> = const { std::cell::Cell::new(true) };
    /// Whether this thread's bf16 products run the dot-product path with its portable tile.
    static BF16_DOT_PORTABLE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Makes this thread's bf16 products run the dot-product path (packing, tiles, masked
/// stores) with a portable loop in place of the instruction (`true`), on any x86-64 host, or
/// returns to the default (`false`); returns the previous setting. A test hook: the path is
/// then tested where the CPU lacks AVX512-BF16. Elsewhere than x86-64 it does nothing.
#[doc(hidden)]
pub fn portable_bf16_dot_products(on: bool) -> bool {
    BF16_DOT_PORTABLE.replace(on)
}

/// Lets this thread's bf16 products use the CPU's bf16 dot products where it has them
/// (`true`, the default) or makes them widen to f32 (`false`), returning the previous
/// setting: a hook for testing both paths on one machine.
#[doc(hidden)]
pub fn allow_bf16_dot_products(allow: bool) -> bool {
    BF16_DOT_ON.replace(allow)
}

/// What a CPU product of `dtype` runs on, as the profile's ops column shows it: bf16 names
/// its path, since the widening one is about half as fast.
pub(crate) fn cpu_path(dtype: DType) -> &'static str {
    #[cfg(target_arch = "x86_64")]
    match (dtype, bf16_dot_path()) {
        (DType::BF16, Some(bf16_dot::DotPath::Instructions)) => return "matmul bf16-dot",
        (DType::BF16, Some(bf16_dot::DotPath::Portable)) => return "matmul bf16-dot-portable",
        _ => {}
    }
    match dtype {
        DType::BF16 => "matmul bf16-widened-to-f32",
        _ => "matmul",
    }
}

/// Where the CPU has no bf16 dot products: `gemm` has no bf16, so the operands are widened to f32 (exactly), multiplied
/// with f32 accumulation, and each result rounded once to bf16 (PyTorch's CPU bf16 matmul
/// also accumulates in f32). Every temporary comes from kiln's caching allocator: fresh
/// pages for the widened operands cost more than the conversions.
fn bf16_through_f32(a: &Buffer, va: &View, b: &Buffer, vb: &View) -> Result<Buffer, RuntimeError> {
    // Each operand's storage widened element for element, so its view still addresses it.
    let widen = |x: &Buffer, v: &View| -> Result<Buffer, RuntimeError> {
        let data = x.as_slice::<half::bf16>().expect("a bf16 operand");
        widen_bf16(&data[..v.span().min(data.len())])
    };
    let product = batched::<f32>(
        &widen(a, va)?,
        va,
        &widen(b, vb)?,
        vb,
        0.0,
        (&with_gemm(1.0), Split::Gemm),
    )?;
    narrow_half(product.as_slice::<f32>().expect("an f32 product"), DType::BF16)
}

/// bf16 values as an f32 buffer (exact: a shift), converted in parallel chunks.
fn widen_bf16(x: &[bf16]) -> Result<Buffer, RuntimeError> {
    crate::native::mapped(x, Half::widen)
}

/// `x` rounded to bf16, to nearest with ties to even (NaN stays NaN, quieted), as `half`
/// rounds it, in a form the compiler vectorizes.
fn bf16_of(x: f32) -> bf16 {
    let bits = x.to_bits();
    let rounded = if x.is_nan() {
        (bits >> 16) | 0x40
    } else {
        bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16
    };
    bf16::from_bits(rounded as u16)
}

/// A 16-bit float type and its exact widening to, and rounding from, f32.
pub(crate) trait Half: Element {
    fn widen(self) -> f32;
    /// To nearest, ties to even, as `half` rounds.
    fn narrow(x: f32) -> Self;
}

impl Half for bf16 {
    fn widen(self) -> f32 {
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
    fn narrow(x: f32) -> bf16 {
        bf16_of(x)
    }
}

impl Half for f16 {
    fn widen(self) -> f32 {
        self.to_f32()
    }
    fn narrow(x: f32) -> f16 {
        f16::from_f32(x)
    }
}

/// f32 values rounded to `dtype` (bf16 or f16, to nearest with ties to even) as a buffer.
pub(crate) fn narrow_half(x: &[f32], dtype: DType) -> Result<Buffer, RuntimeError> {
    use half::slice::HalfFloatSliceExt;
    if dtype == DType::BF16 {
        crate::native::mapped(x, bf16_of)
    } else {
        crate::native::converted(x, |src, out: &mut [f16]| out.convert_from_f32_slice(src))
    }
}

/// An integer product, exact with wrapping arithmetic (two's complement, as the reference
/// executor and PyTorch compute it): rows of the output in parallel, each an `i-k-j` loop
/// over i64 accumulators that streams the right operand's rows.
fn integer(a: &Buffer, va: &View, b: &Buffer, vb: &View) -> Result<Buffer, RuntimeError> {
    let dtype = a.dtype();
    let r = va.shape().rank();
    let (m, k, n) = (va.shape().dims()[r - 2], va.shape().dims()[r - 1], vb.shape().dims()[r - 1]);
    let batch = va.shape().dims()[..r - 2].iter().product::<usize>();
    let a: Vec<i64> = a.gather(va);
    let b: Vec<i64> = b.gather(vb);
    let mut out = vec![0i64; batch * m * n];
    crate::team::for_each_part(out.chunks_mut(n.max(1)).collect(), &|row, out| {
        if n == 0 {
            return;
        }
        let (p, i) = (row / m, row % m);
        let a_row = &a[(p * m + i) * k..(p * m + i + 1) * k];
        for (l, &x) in a_row.iter().enumerate() {
            let b_row = &b[(p * k + l) * n..(p * k + l + 1) * n];
            for (o, &y) in out.iter_mut().zip(b_row) {
                *o = o.wrapping_add(x.wrapping_mul(y));
            }
        }
    });
    match dtype {
        DType::I32 => Buffer::from_iter(out.len(), out.iter().map(|&x| x as i32)),
        DType::I8 => Buffer::from_iter(out.len(), out.iter().map(|&x| x as i8)),
        DType::U8 => Buffer::from_iter(out.len(), out.iter().map(|&x| x as u8)),
        DType::I64 => Buffer::from_slice(&out),
        other => unreachable!("an integer product of {other}"),
    }
}

/// One operand of a band's product: `(pointer, column stride, row stride)`.
type Operand<T> = (*const T, isize, isize);

/// What computes one band of a product on the calling thread: `(problem, dst, dst row
/// stride, lhs, rhs)`, with [`product`]'s contract.
type Band<'a, T> = dyn Fn(Problem, *mut T, usize, Operand<T>, Operand<T>) + Sync + 'a;

/// Bands through `gemm` ([`product`]); `one` is the product's scale.
fn with_gemm<T: Element>(one: T) -> impl Fn(Problem, *mut T, usize, Operand<T>, Operand<T>) + Sync {
    move |pr, dst, dst_rs, lhs, rhs| {
        // SAFETY: `batched` calls its band kernel under `product`'s contract.
        unsafe { product(pr, dst, dst_rs, lhs, rhs, T::from_scalar(kiln_ir::Scalar::I64(0)), one) }
    }
}

/// An f32 band: a few rows read in place against columns along `k` as dot products
/// ([`gemv`]), anything else through `gemm`.
fn f32_band(pr: Problem, dst: *mut f32, dst_rs: usize, lhs: Operand<f32>, rhs: Operand<f32>) {
    let ((a, a_cs, a_rs), (b, b_cs, b_rs)) = (lhs, rhs);
    // SAFETY: `batched` calls its band kernel under `product`'s contract, which covers
    // `gemv::product`'s (its operands' rows and columns along `k` where it `takes` them).
    unsafe {
        if gemv::takes(pr.m, a_cs, b_rs) {
            gemv::product((pr.m, pr.n, pr.k), dst, dst_rs, (a, a_rs), (b, b_cs));
        } else {
            product(pr, dst, dst_rs, lhs, rhs, 0.0, 1.0);
        }
    }
}

/// How a product splits into bands across threads.
#[derive(Clone, Copy, PartialEq)]
enum Split {
    /// `gemm`'s rules: the longer side, except that some layouts `gemm` packs slowly split
    /// into rows (see `batched`).
    Gemm,
    /// The longer side: each band packs all of the other operand and its share of this
    /// one, so splitting the longer side packs the least twice (the bf16 dot products).
    Longer,
}

/// The batched product, each band computed by `kernel` and split by `split`; `zero` fills
/// the output when `k == 0`.
fn batched<T: Element>(
    a: &Buffer,
    va: &View,
    b: &Buffer,
    vb: &View,
    zero: T,
    (kernel, split): (&Band<'_, T>, Split),
) -> Result<Buffer, RuntimeError> {
    let r = va.shape().rank();
    let (m, k, n) = (va.shape().dims()[r - 2], va.shape().dims()[r - 1], vb.shape().dims()[r - 1]);
    let batch_shape = kiln_ir::Shape::from(&va.shape().dims()[..r - 2]);
    let batch = batch_shape.numel();
    // Each operand's batch offsets: a view over the batch dimensions with its strides.
    let batch_offsets = |v: &View| -> Vec<usize> {
        kiln_ir::View::from_parts(batch_shape.clone(), v.strides()[..r - 2].to_vec(), v.offset())
            .offsets()
            .collect()
    };
    let (offs_a, offs_b) = (batch_offsets(va), batch_offsets(vb));
    let (sa, sb) = (va.strides(), vb.strides());
    let a = a.as_slice::<T>().expect("matmul operands have the node's dtype");
    let b = b.as_slice::<T>().expect("matmul operands have the node's dtype");
    let (a_cs, a_rs, b_cs, b_rs) = (sa[r - 1], sa[r - 2], sb[r - 1], sb[r - 2]);
    // A few f32 rows read in place against columns along `k` (`gemv`) stream the weights
    // once: memory-bound, so splitting pays from fewer multiply-adds than a packed product.
    // (bf16's dot products of a few rows have the same shape; their split is unmeasured.)
    let streams = T::DTYPE == DType::F32 && gemv::takes(m, a_cs, b_rs);
    let split_from = if streams { STREAM_SPLIT_FROM } else { SPLIT_FROM };
    let threads = if m * n * k >= split_from { crate::team::threads() } else { 1 };
    // One band of the product for batch `p`: the `mb x nb` block of the output at `(i0, j0)`,
    // on the calling thread. The caller guarantees that the band lies inside the output block
    // at `dst` and that no other thread writes it.
    let band = |dst: Ptr<T>, p: usize, i0: usize, j0: usize, mb: usize, nb: usize| {
        // SAFETY: see the caller's comment below; the band's operand rows and columns are
        // in range of the views.
        unsafe {
            kernel(
                Problem { m: mb, n: nb, k },
                dst.0.add(p * m * n + i0 * n + j0),
                n,
                (a.as_ptr().add(offs_a[p]).offset(i0 as isize * a_rs), a_cs, a_rs),
                (b.as_ptr().add(offs_b[p]).offset(j0 as isize * b_cs), b_cs, b_rs),
            );
        }
    };
    // SAFETY: the closure writes all `batch * m * n` output elements: each product fills its
    // whole dense `m x n` block, in disjoint bands when split (with `k == 0` the blocks are
    // zero-filled). The operands are read at `offset + i * row_stride + j * col_stride` for
    // in-range `i, j`, which the views (checked against their buffers when the graph was
    // built) keep inside the slices.
    let filled = unsafe {
        Buffer::from_raw_fill(T::DTYPE, batch * m * n, |out| {
            let out = Ptr(out.cast::<T>());
            if k == 0 {
                for i in 0..batch * m * n {
                    out.0.add(i).write(zero);
                }
                return Ok::<(), RuntimeError>(());
            }
            if threads > 1 && batch >= threads {
                crate::team::for_each(batch, &|p| band(out, p, 0, 0, m, n));
            } else if threads > 1 {
                // Bands of whole output columns (or rows, when there are more of those).
                // A left operand stored column by column (`gᵀ x`, a weight gradient) with a
                // row-major right one splits into row bands unless the output is far wider
                // than tall. Measured against column bands, alternating runs, 2 threads:
                // 256x128 by 128x784 (W4's weight gradient) 153-163 -> 209-211 GFLOP/s,
                // 64x256 by 256x784 169-175 -> 212-214, 128x2048 by 2048x512 160-175 ->
                // 172-190, 1024³ 170-178 -> 182-194, 2048³ 196-204 -> 205-209; far wider
                // outputs lost (32x144 by 144x16384: 203 -> 88-120).
                let rows_first = split == Split::Gemm
                    && a_rs == 1
                    && a_cs != 1
                    && b_cs == 1
                    && n <= 16 * m
                    && m >= 32 * threads;
                let (along_n, len) = if n >= m && !rows_first { (true, n) } else { (false, m) };
                let step = len.div_ceil(threads);
                for p in 0..batch {
                    crate::team::for_each(len.div_ceil(step), &|t| {
                        let (s, e) = (t * step, ((t + 1) * step).min(len));
                        if along_n {
                            band(out, p, 0, s, m, e - s);
                        } else {
                            band(out, p, s, 0, e - s, n);
                        }
                    });
                }
            } else {
                for p in 0..batch {
                    band(out, p, 0, 0, m, n);
                }
            }
            Ok(())
        })
    };
    filled?
}

/// The sizes of one product: `m x k` times `k x n`.
#[derive(Clone, Copy)]
struct Problem {
    m: usize,
    n: usize,
    k: usize,
}

/// `dst = lhs @ rhs` on the calling thread, `dst` row-major with row stride `dst_rs`; each
/// operand is `(pointer, column stride, row stride)`.
///
/// Two layouts `gemm` 0.19 runs slowly are rearranged first (measured on AVX-512, one
/// thread per band, 2 threads):
/// - *Both* operands stored with `k` contiguous (`x @ wᵀ` in every `Linear`, a convolution's
///   weight gradient `g @ colsᵀ`): 64x4096 by 4096x288 ran at 105 GFLOP/s against 198 with
///   one operand copied to a `gemm`-friendly layout first, 128x784 by 784x256 at 149 against
///   195, 1024³ at 186 against 216. The smaller side (`m·k` or `k·n`) is copied; below
///   `k = 256` or with a side under 16 the copy costs more than it saves.
/// - A right operand with `k` contiguous and an output wider than tall runs about three
///   times slower written row-major than column-major (64x1024 by 1024x576: 32 against 83
///   GFLOP/s), so such a product is computed column-major into scratch and transposed into
///   place, `m·n` copies against `m·n·k` multiply-adds.
///
/// # Safety
/// `dst` has room for the `m x n` block at row stride `dst_rs`, no other thread writes it,
/// and the operands address `m x k` and `k x n` elements that lie inside their buffers.
unsafe fn product<T: Element>(
    pr: Problem,
    dst: *mut T,
    dst_rs: usize,
    (a, a_cs, a_rs): (*const T, isize, isize),
    (b, b_cs, b_rs): (*const T, isize, isize),
    zero: T,
    one: T,
) {
    let Problem { m, n, k } = pr;
    let mut packed = Vec::new();
    let ((a, a_cs, a_rs), (b, b_cs, b_rs)) =
        if a_cs == 1 && b_rs == 1 && m.min(n) >= 16 && k >= REORIENT_FROM_K {
            if m < n {
                // SAFETY: the caller's contract: `a + i * a_rs + kk` is in range.
                unsafe { transpose_into(&mut packed, a, a_rs, k, m) };
                ((packed.as_ptr(), m as isize, 1), (b, b_cs, b_rs))
            } else {
                // SAFETY: the caller's contract: `b + kk + j * b_cs` is in range.
                unsafe { transpose_into(&mut packed, b, b_cs, k, n) };
                ((a, a_cs, a_rs), (packed.as_ptr(), 1, n as isize))
            }
        } else {
            ((a, a_cs, a_rs), (b, b_cs, b_rs))
        };
    let reorient = b_rs == 1 && b_cs != 1 && m < n && k >= REORIENT_FROM_K;
    let mut scratch = Vec::new();
    // Where the product lands: `(pointer, column stride, row stride)`.
    let (out, out_cs, out_rs) = if reorient {
        scratch = vec![zero; m * n];
        (scratch.as_mut_ptr(), m as isize, 1)
    } else {
        (dst, 1, dst_rs as isize)
    };
    // SAFETY: the caller's contract, or the scratch's `m x n` column-major elements.
    unsafe {
        gemm(
            m,
            n,
            k,
            out,
            out_cs,
            out_rs,
            false,
            a,
            a_cs,
            a_rs,
            b,
            b_cs,
            b_rs,
            zero,
            one,
            false,
            false,
            false,
            Parallelism::None,
        );
    }
    if !reorient {
        return;
    }
    for i in 0..m {
        // SAFETY: row `i` of the block lies inside `dst` (the caller's contract).
        let row = unsafe { std::slice::from_raw_parts_mut(dst.add(i * dst_rs), n) };
        for (j, slot) in row.iter_mut().enumerate() {
            *slot = scratch[j * m + i];
        }
    }
}

/// Fills `dst` (empty) with the `rows x cols` matrix whose element `(r, c)` is at
/// `src + r + c * src_cs`, row-major: eight source columns at a time, so the reads run along
/// eight contiguous streams and the writes along rows.
///
/// # Safety
/// Every such element lies inside `src`'s buffer.
unsafe fn transpose_into<T: Element>(
    dst: &mut Vec<T>,
    src: *const T,
    src_cs: isize,
    rows: usize,
    cols: usize,
) {
    dst.reserve_exact(rows * cols);
    let out = dst.as_mut_ptr();
    for c0 in (0..cols).step_by(8) {
        for r in 0..rows {
            for c in c0..(c0 + 8).min(cols) {
                // SAFETY: `r * cols + c` is inside the reserved capacity; the source element
                // is in range (the caller's contract).
                unsafe {
                    out.add(r * cols + c).write(*src.offset(r as isize + c as isize * src_cs));
                };
            }
        }
    }
    // SAFETY: all `rows * cols` elements were written above.
    unsafe { dst.set_len(rows * cols) };
}

/// The shortest inner dimension for which [`product`] re-orients an output: below it the
/// transpose costs a visible share of the product (measured: a 256x128 by 128x784 product
/// took 0.41-0.50 ms re-oriented against 0.35-0.40 ms as it was).
const REORIENT_FROM_K: usize = 256;

/// Products with at least this many multiply-adds are split across the team's threads;
/// smaller ones run on the calling thread. Measured on a 2-core machine: a 128x256 by 256x10
/// product took 10.7 µs on one thread and 16 µs split (each half too small to pay for the
/// hand-off), and W4's step ran 0.50-0.53 ms with this at 2²⁰ against 0.54-0.56 at 2¹⁸.
const SPLIT_FROM: usize = 1 << 20;

/// [`SPLIT_FROM`] for products that stream their right operand once (a decode step's
/// projections): split from 2¹⁶ multiply-adds, 256 KB of f32 weights.
const STREAM_SPLIT_FROM: usize = 1 << 16;

/// An output pointer shared by the threads that write disjoint bands of it.
#[derive(Clone, Copy)]
struct Ptr<T>(*mut T);

// SAFETY: each thread writes only its own band of the output (see `batched`).
unsafe impl<T> Send for Ptr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Ptr<T> {}

#[cfg(test)]
mod tests {
    use super::bf16_of;

    /// The vectorizable rounding gives `half`'s bf16 for every kind of f32: random bit
    /// patterns (NaNs of both signs and payloads included), ties, subnormals, the largest
    /// finite values (which round to infinity), infinities.
    #[test]
    fn bf16_rounding_matches_half_bit_for_bit() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut bits: Vec<u32> = (0..200_000)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u32
            })
            .collect();
        bits.extend([0, 0x8000_0000, 0x0000_8000, 0x0001_8000, 0x0000_7fff, 0x7f7f_ffff]);
        bits.extend([0x7f80_0000, 0xff80_0000, 0x7fc0_0000, 0xffc0_0001, 0x7f80_0001, 0x3f80_8000]);
        for b in bits {
            let x = f32::from_bits(b);
            let (got, want) = (bf16_of(x).to_bits(), half::bf16::from_f32(x).to_bits());
            assert_eq!(got, want, "{b:#010x}");
        }
    }
}
