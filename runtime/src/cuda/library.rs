//! The ops that are not fused kernels, on a GPU: `gather`, `scatter`/`scatter_add`, `assign`,
//! `unview` (of a view without overlaps), `cumsum`, `argmax`/`argmin` and random fills, each
//! a kernel from [`kiln_codegen::cuda::library`] with the reference executor's semantics, and
//! fused attention and its gradients in every float dtype (`kiln_codegen::cuda::attention`). The
//! others (integer products, overlapping `unview`s) return `None` and run on host copies.

use cudarc::driver::result;
use kiln_codegen::cuda::attention::AttentionShape;
use kiln_codegen::cuda::library::{self as source, LibraryKernel, Lines};
use kiln_ir::{DType, Graph, NodeId, Op, RandomDist, ReduceOp, Shape};

use super::Gpu;
use super::graph::IndexCheck;
use super::kernels::{Arg, block_config, grid_config, launch, library_functions, split_chunks};
use crate::{Buffer, RunError, RuntimeError};

/// The op's value computed on `gpu`, or `None` when it has no device kernel.
pub(crate) fn eval(
    gpu: &'static Gpu,
    graph: &Graph,
    id: NodeId,
    args: &[&Buffer],
) -> Option<Result<Buffer, RunError>> {
    let node = graph.node(id);
    let at =
        |error: RuntimeError| RunError { error, op: Some(node.op.name()), origin: node.origin };
    let ids = graph.args(id);
    let shape_of = |i: usize| &graph.node(ids[i]).shape;
    let result = match &node.op {
        Op::Gather { axis } => gather(gpu, args[0], shape_of(0), args[1], shape_of(1), *axis),
        Op::Scatter { axis, accumulate } => {
            let shapes = [shape_of(0), shape_of(1), shape_of(2)];
            scatter(gpu, [args[0], args[1], args[2]], shapes, *axis, *accumulate)
        }
        Op::Assign(view) => copy(gpu, args[0]).and_then(|out| {
            write_view(gpu, &out, view, args[1])?;
            Ok(out)
        }),
        Op::Unview { view, .. } if view.is_non_overlapping() => {
            zeros(gpu, node.dtype, node.shape.numel()).and_then(|out| {
                write_view(gpu, &out, view, args[0])?;
                Ok(out)
            })
        }
        Op::CumSum { axis } => cumsum(gpu, args[0], &node.shape, *axis),
        // `None`: the CPU implementation on host copies (the caller's fallback).
        Op::Custom(c) => super::custom::run(gpu, c, args)?,
        Op::Attention { mask, scale } | Op::AttentionGrad { mask, scale } => {
            let kiln_ir::AttentionDims { n, l, e, s, ev } =
                kiln_ir::AttentionDims::of(shape_of(0), shape_of(1), shape_of(2));
            let shape =
                AttentionShape { n, l, e, s, ev, mask: *mask, scale: f64::from_bits(*scale) };
            attention(gpu, args, &shape, matches!(node.op, Op::AttentionGrad { .. }))
        }
        Op::Collective(c) => match crate::collective::engine(c.group) {
            Ok(crate::collective::Engine::Nccl(nccl)) => nccl.run(c, args[0]),
            // A host engine (MPI) moves host copies, as the executor makes them.
            _ => return None,
        },
        Op::Random { dist, key } => random(gpu, *dist, node.dtype, *key, node.shape.numel()),
        Op::Reduce { op: op @ (ReduceOp::ArgMax | ReduceOp::ArgMin), axes } if axes.len() == 1 => {
            arg_extreme(gpu, *op, args[0], shape_of(0), axes[0])
        }
        _ => return None,
    };
    Some(result.map_err(at))
}

/// Runs entry point `entry` of `kernel` over `n` items with `args`.
///
/// # Safety
/// As [`launch`]: `args` match the entry point and the buffers they address hold what it
/// reads and writes.
unsafe fn run(
    gpu: &'static Gpu,
    kernel: &LibraryKernel,
    entry: usize,
    args: &[Arg],
    n: usize,
) -> Result<(), RuntimeError> {
    if n == 0 {
        return Ok(());
    }
    let functions = library_functions(gpu, kernel)?;
    // SAFETY: the caller's contract.
    unsafe { launch(gpu, &functions[entry], args, grid_config(gpu, n)) }
}

/// Runs entry point 0 of a per-line kernel over `lines` lines of `len` elements, a thread
/// or a block per line as `how` says.
///
/// # Safety
/// As [`launch`], for `args`.
unsafe fn run_lines(
    gpu: &'static Gpu,
    kernel: &LibraryKernel,
    how: Lines,
    args: [Arg; 3],
    lines: usize,
    len: usize,
) -> Result<(), RuntimeError> {
    if how == Lines::Blocks {
        let functions = library_functions(gpu, kernel)?;
        // SAFETY: the caller's contract; one block per line.
        return unsafe { launch(gpu, &functions[0], &args, block_config(gpu, lines, len)) };
    }
    // SAFETY: the caller's contract; one thread per line.
    unsafe { run(gpu, kernel, 0, &args, lines) }
}

/// The lines of `shape` along `axis`: the product of the other dimensions (a kernel with one
/// thread per line walks an empty axis zero times).
fn lines(shape: &Shape, axis: usize) -> usize {
    shape.dims().iter().enumerate().filter(|&(d, _)| d != axis).map(|(_, &s)| s).product()
}

fn count(n: usize) -> Arg {
    Arg::I64(i64::try_from(n).unwrap_or(i64::MAX))
}

/// Fused attention or its packed gradients (`kiln_codegen::cuda::attention`): one warp per
/// query row, then (gradients) one per key row.
fn attention(
    gpu: &'static Gpu,
    args: &[&Buffer],
    d: &AttentionShape,
    grad: bool,
) -> Result<Buffer, RuntimeError> {
    use kiln_codegen::cuda::attention::{THREADS_PER_ROW, stats_dtype};
    let dtype = args[0].dtype();
    let kernel = kiln_codegen::cuda::attention::attention(dtype, d, grad);
    let ptr = |b: &Buffer| b.device_ptr(gpu).map(Arg::Ptr);
    let (queries, keys) = (d.n * d.l, d.n * d.s);
    // A given mask is the last operand, and the entry points' last argument.
    let mask = match d.mask {
        kiln_ir::AttentionMask::Given => Some(ptr(args[args.len() - 1])?),
        _ => None,
    };
    if !grad {
        let out = Buffer::on_gpu(gpu, dtype, queries * d.ev)?;
        let mut launch_args =
            vec![ptr(args[0])?, ptr(args[1])?, ptr(args[2])?, ptr(&out)?, count(queries)];
        launch_args.extend(mask);
        // SAFETY: `(q, k, v, out, n[, mask])`: dense q, k, v of the shape's sizes, `out` one
        // row of `ev` per query, `n` queries, a warp each, a dense `[n, l, s]` bool mask.
        unsafe { run(gpu, &kernel, 0, &launch_args, queries * THREADS_PER_ROW) }?;
        return Ok(out);
    }
    let packed = Buffer::on_gpu(gpu, dtype, d.n * (d.l * d.e + d.s * d.e + d.s * d.ev))?;
    let stats = Buffer::on_gpu(gpu, stats_dtype(dtype), 2 * queries)?;
    for (entry, rows) in [(0, queries), (1, keys)] {
        let mut launch_args = vec![
            ptr(args[0])?,
            ptr(args[1])?,
            ptr(args[2])?,
            ptr(args[3])?,
            ptr(&stats)?,
            ptr(&packed)?,
            count(rows),
        ];
        launch_args.extend(mask.clone());
        // SAFETY: `(q, k, v, dout, stats, packed, n[, mask])`: dense operands, `stats` two values
        // per query, `packed` the gradients' `[dq | dk | dv]` per batch entry, `n` query
        // rows (entry 0, which writes the statistics) or key rows (entry 1, which reads them
        // after entry 0 on the same stream), a warp each.
        unsafe { run(gpu, &kernel, entry, &launch_args, rows * THREADS_PER_ROW) }?;
    }
    Ok(packed)
}

/// A device copy of `b`.
fn copy(gpu: &'static Gpu, b: &Buffer) -> Result<Buffer, RuntimeError> {
    let out = Buffer::on_gpu(gpu, b.dtype(), b.len())?;
    let bytes = b.len() * b.dtype().size_in_bytes();
    // A graph being updated holds this copy, between these blocks.
    if bytes > 0 && !super::graph::replaying(gpu) {
        gpu.bind()?;
        // SAFETY: both blocks hold `bytes` bytes; the copy is ordered on the device's stream.
        unsafe {
            result::memcpy_dtod_async(
                out.device_ptr(gpu)?,
                b.device_ptr(gpu)?,
                bytes,
                super::graph::stream(gpu).cu_stream(),
            )
        }
        .map_err(|e| gpu.error("copying on the device", e))?;
    }
    Ok(out)
}

/// `len` zeros of `dtype` on the device.
fn zeros(gpu: &'static Gpu, dtype: DType, len: usize) -> Result<Buffer, RuntimeError> {
    let out = Buffer::on_gpu(gpu, dtype, len)?;
    // All-zero bytes are zero in every dtype.
    fill_bytes(gpu, &out, 0)?;
    Ok(out)
}

/// Sets every byte of `out` to `value`, on the device's stream.
fn fill_bytes(gpu: &'static Gpu, out: &Buffer, value: u8) -> Result<(), RuntimeError> {
    let bytes = out.len() * out.dtype().size_in_bytes();
    // A graph being updated holds this fill, of this block.
    if bytes > 0 && !super::graph::replaying(gpu) {
        gpu.bind()?;
        let stream = super::graph::stream(gpu);
        // SAFETY: the block holds `bytes` bytes.
        unsafe { result::memset_d8_async(out.device_ptr(gpu)?, value, bytes, stream.cu_stream()) }
            .map_err(|e| gpu.error("filling device memory", e))?;
    }
    Ok(())
}

/// A device flag of two `i64`s that index kernels record their first out-of-range position
/// in (`err[0]`, from [`source::NO_BAD_INDEX`]) and [`source::bad_index`] that index in
/// (`err[1]`). Filled on the device: no copy from the host, which a CUDA graph cannot hold.
fn error_flag(gpu: &'static Gpu) -> Result<Buffer, RuntimeError> {
    let flag = Buffer::on_gpu(gpu, DType::I64, 2)?;
    fill_bytes(gpu, &flag, 0x7f)?;
    Ok(flag)
}

/// After the index kernel of `op` wrote `flag`: copies the bad index in, then fails with the
/// reference executor's error if there is one. In a plan being captured in a CUDA graph,
/// the check is made after each launch of the graph instead (`graph::defer_check`).
fn check_flag(
    gpu: &'static Gpu,
    op: &'static str,
    flag: &Buffer,
    index: &Buffer,
    axis: usize,
    size: usize,
) -> Result<(), RuntimeError> {
    let functions = library_functions(gpu, &source::bad_index())?;
    let args = [Arg::Ptr(flag.device_ptr(gpu)?), Arg::Ptr(index.device_ptr(gpu)?)];
    // SAFETY: `bad_index(err, index)`: the flag holds two i64s, and `err[0]` is a position of
    // `index` (the index kernel checked it) or `NO_BAD_INDEX`, when nothing is read.
    unsafe { launch(gpu, &functions[0], &args, grid_config(gpu, 1)) }?;
    let check = IndexCheck { op, flag: flag.clone(), axis, size };
    if super::graph::defer_check(gpu, check) {
        return Ok(());
    }
    let mut read = [0u8; 16];
    gpu.download(flag.device_ptr(gpu)?, &mut read)?;
    flag_error(op, read, axis, size)
}

/// The error a flag's two `i64`s (as bytes) name, if any.
pub(crate) fn flag_error(
    op: &'static str,
    flag: [u8; 16],
    axis: usize,
    size: usize,
) -> Result<(), RuntimeError> {
    let position = i64::from_ne_bytes(flag[..8].try_into().expect("8 bytes"));
    if position == source::NO_BAD_INDEX {
        return Ok(());
    }
    let index = i64::from_ne_bytes(flag[8..].try_into().expect("8 bytes"));
    Err(RuntimeError::IndexOutOfRange { op, index, axis, size })
}

fn gather(
    gpu: &'static Gpu,
    x: &Buffer,
    x_shape: &Shape,
    index: &Buffer,
    index_shape: &Shape,
    axis: usize,
) -> Result<Buffer, RuntimeError> {
    let out = Buffer::on_gpu(gpu, x.dtype(), index.len())?;
    let flag = error_flag(gpu)?;
    let kernel = source::gather(x.dtype(), x_shape, index_shape, axis);
    let args = [
        Arg::Ptr(x.device_ptr(gpu)?),
        Arg::Ptr(index.device_ptr(gpu)?),
        Arg::Ptr(out.device_ptr(gpu)?),
        Arg::Ptr(flag.device_ptr(gpu)?),
        count(index.len()),
    ];
    // SAFETY: `gather(x, index, out, err, n)`: x holds the dense `x_shape`, the index and the
    // output `n` elements, the flag one i64; every read of x is bounds-checked by the kernel.
    unsafe { run(gpu, &kernel, 0, &args, index.len()) }?;
    check_flag(gpu, "gather", &flag, index, axis, x_shape.dims()[axis])?;
    Ok(out)
}

fn scatter(
    gpu: &'static Gpu,
    [base, index, src]: [&Buffer; 3],
    [base_shape, index_shape, src_shape]: [&Shape; 3],
    axis: usize,
    accumulate: bool,
) -> Result<Buffer, RuntimeError> {
    let dtype = base.dtype();
    let out = copy(gpu, base)?;
    let flag = error_flag(gpu)?;
    let kernel = source::scatter(dtype, base_shape, index_shape, src_shape, axis, accumulate);
    let float_sum = kernel.entries.len() == 3;
    let scratch = if float_sum { Some(Buffer::on_gpu(gpu, DType::F64, base.len())?) } else { None };
    let lines = lines(index_shape, axis);
    let args = |n: usize| -> Result<[Arg; 6], RuntimeError> {
        Ok([
            Arg::Ptr(out.device_ptr(gpu)?),
            Arg::Ptr(index.device_ptr(gpu)?),
            Arg::Ptr(src.device_ptr(gpu)?),
            Arg::Ptr(flag.device_ptr(gpu)?),
            Arg::Ptr(scratch.as_ref().map_or(Ok(0), |s| s.device_ptr(gpu))?),
            count(n),
        ])
    };
    // SAFETY: `(out, index, src, err, scratch, n)`: out and scratch hold the base's elements,
    // the index and src their dense shapes (src no smaller than the index), the flag one i64;
    // the first and last entry points walk the base (`n` = its length), the middle one the
    // index's elements or lines, checking every index before it writes.
    unsafe {
        if float_sum {
            run(gpu, &kernel, 0, &args(base.len())?, base.len())?;
            // One thread per index position (atomic f64 adds) or per line.
            let n =
                if source::scatter_adds_atomically(dtype) { index_shape.numel() } else { lines };
            run(gpu, &kernel, 1, &args(n)?, n)?;
        } else {
            run(gpu, &kernel, 0, &args(lines)?, lines)?;
        }
    }
    let name = if accumulate { "scatter_add" } else { "scatter" };
    check_flag(gpu, name, &flag, index, axis, base_shape.dims()[axis])?;
    if float_sum {
        // SAFETY: as above.
        unsafe { run(gpu, &kernel, 2, &args(base.len())?, base.len()) }?;
    }
    Ok(out)
}

/// Writes `values` into `out` at the positions `view` selects (distinct, inside `out`).
fn write_view(
    gpu: &'static Gpu,
    out: &Buffer,
    view: &kiln_ir::View,
    values: &Buffer,
) -> Result<(), RuntimeError> {
    let kernel = source::assign(out.dtype(), view);
    let n = view.shape().numel();
    let args = [Arg::Ptr(out.device_ptr(gpu)?), Arg::Ptr(values.device_ptr(gpu)?), count(n)];
    // SAFETY: `(out, values, n)`: the view was checked against `out`'s length when recorded,
    // and `values` holds the view's `n` elements.
    unsafe { run(gpu, &kernel, 0, &args, n) }
}

fn cumsum(
    gpu: &'static Gpu,
    x: &Buffer,
    shape: &Shape,
    axis: usize,
) -> Result<Buffer, RuntimeError> {
    let out = Buffer::on_gpu(gpu, x.dtype(), x.len())?;
    let lines = lines(shape, axis);
    let len = shape.dims()[axis];
    if lines == 0 || len == 0 {
        return Ok(out);
    }
    let kernel = source::cumsum(x.dtype(), shape, axis);
    let (xp, op_) = (Arg::Ptr(x.device_ptr(gpu)?), Arg::Ptr(out.device_ptr(gpu)?));
    let functions = library_functions(gpu, &kernel)?;
    match source::cumsum_lines(shape, axis) {
        // SAFETY: `(x, out, n)`: both hold the dense `shape`.
        how @ (Lines::Threads | Lines::Blocks) => unsafe {
            run_lines(gpu, &kernel, how, [xp, op_, count(lines)], lines, len)
        },
        Lines::Chunks => {
            let chunks = split_chunks(gpu, lines, len);
            let total = if x.dtype().is_float() { DType::F64 } else { DType::I64 };
            let totals = Buffer::on_gpu(gpu, total, lines * chunks)?;
            let tp = || totals.device_ptr(gpu).map(Arg::Ptr);
            let blocks = block_config(gpu, lines * chunks, len / chunks);
            let (n, c) = (count(lines * chunks), count(chunks));
            // SAFETY: `(x, totals, chunks, n)`: one total per block, `n` blocks' worth.
            unsafe { launch(gpu, &functions[0], &[xp, tp()?, c, n], blocks) }?;
            let (n, c) = (count(lines), count(chunks));
            // SAFETY: `(totals, chunks, n)`: `chunks` totals per line, written before on the
            // same stream; one thread per line.
            unsafe { launch(gpu, &functions[1], &[tp()?, c, n], grid_config(gpu, lines)) }?;
            let (xp, n, c) = (Arg::Ptr(x.device_ptr(gpu)?), count(lines * chunks), count(chunks));
            // SAFETY: `(x, out, totals, chunks, n)`: as the first, with `out` of x's length.
            unsafe { launch(gpu, &functions[2], &[xp, op_, tp()?, c, n], blocks) }
        }
    }?;
    Ok(out)
}

fn arg_extreme(
    gpu: &'static Gpu,
    op: ReduceOp,
    x: &Buffer,
    shape: &Shape,
    axis: usize,
) -> Result<Buffer, RuntimeError> {
    let lines = lines(shape, axis);
    let len = shape.dims()[axis];
    let out = Buffer::on_gpu(gpu, DType::I64, lines)?;
    let kernel = source::arg_extreme(op, x.dtype(), shape, axis);
    if lines == 0 {
        return Ok(out);
    }
    let (xp, op_) = (Arg::Ptr(x.device_ptr(gpu)?), Arg::Ptr(out.device_ptr(gpu)?));
    let functions = library_functions(gpu, &kernel)?;
    // Empty lines take the one-thread-per-line kernel, which writes 0 for each.
    let how = if len == 0 { Lines::Threads } else { source::lines_of(shape, axis) };
    match how {
        // SAFETY: `(x, out, n)`: x holds the dense `shape`, out one i64 per line.
        how @ (Lines::Threads | Lines::Blocks) => unsafe {
            run_lines(gpu, &kernel, how, [xp, op_, count(lines)], lines, len)
        },
        Lines::Chunks => {
            let chunks = split_chunks(gpu, lines, len);
            let value = if x.dtype().is_float() { DType::F64 } else { DType::I64 };
            let values = Buffer::on_gpu(gpu, value, lines * chunks)?;
            let positions = Buffer::on_gpu(gpu, DType::I64, lines * chunks)?;
            let (vp, pp) =
                (Arg::Ptr(values.device_ptr(gpu)?), Arg::Ptr(positions.device_ptr(gpu)?));
            let first = [xp, vp, pp, count(chunks), count(lines * chunks)];
            // SAFETY: `(x, values, positions, chunks, n)`: one value and position per block,
            // `n` blocks' worth.
            unsafe {
                launch(gpu, &functions[0], &first, block_config(gpu, lines * chunks, len / chunks))
            }?;
            let (vp, pp) =
                (Arg::Ptr(values.device_ptr(gpu)?), Arg::Ptr(positions.device_ptr(gpu)?));
            let second = [vp, pp, op_, count(chunks), count(lines)];
            // SAFETY: `(values, positions, out, chunks, n)`: written by the launch before on
            // the same stream; one block per line.
            unsafe { launch(gpu, &functions[1], &second, block_config(gpu, lines, chunks)) }
        }
    }?;
    Ok(out)
}

fn random(
    gpu: &'static Gpu,
    dist: RandomDist,
    dtype: DType,
    key: u64,
    n: usize,
) -> Result<Buffer, RuntimeError> {
    let out = Buffer::on_gpu(gpu, dtype, n)?;
    let (low, range) = match dist {
        RandomDist::Int { low, high } => (low, high.wrapping_sub(low)),
        _ => (0, 0),
    };
    let kernel = source::random(dist, dtype);
    // The key and the range are unsigned in the kernel: the same 64 bits.
    let args = [
        Arg::Ptr(out.device_ptr(gpu)?),
        Arg::I64(key as i64),
        Arg::I64(low),
        Arg::I64(range),
        count(n),
    ];
    // SAFETY: `(out, key, low, range, n)`: out holds `n` elements of `dtype`.
    unsafe { run(gpu, &kernel, 0, &args, n) }?;
    Ok(out)
}

/// Compiles and loads the [`copies`] kernel on `gpu`.
pub(crate) fn load_copies(gpu: &'static Gpu) -> Result<(), RuntimeError> {
    library_functions(gpu, &source::copies()).map(drop)
}

/// Device-to-device copies of `(source, destination, bytes)`, a [`source::copies`] launch per
/// [`source::COPIES_PER_LAUNCH`] of them (so their count, not their sizes, sets the launches).
///
/// # Safety
/// Every source and destination must address that many bytes, on `gpu`, 16-byte aligned,
/// and stay allocated until the stream has run the copies.
pub(crate) unsafe fn copies(
    gpu: &'static Gpu,
    copies: &[(u64, u64, u64)],
) -> Result<(), RuntimeError> {
    use super::kernels::CopyTable;
    const THREADS: u32 = 256;
    let kernel = source::copies();
    for chunk in copies.chunks(source::COPIES_PER_LAUNCH) {
        let mut table = CopyTable {
            src: [0; source::COPIES_PER_LAUNCH],
            dst: [0; source::COPIES_PER_LAUNCH],
            bytes: [0; source::COPIES_PER_LAUNCH],
        };
        for (k, &(src, dst, bytes)) in chunk.iter().enumerate() {
            (table.src[k], table.dst[k], table.bytes[k]) = (src, dst, bytes);
        }
        let most = chunk.iter().map(|c| c.2).max().unwrap_or(0);
        let blocks = most.div_ceil(16 * u64::from(THREADS)).clamp(1, 4 * u64::from(gpu.sms));
        let config = cudarc::driver::LaunchConfig {
            grid_dim: (u32::try_from(blocks).unwrap_or(1), chunk.len() as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let functions = library_functions(gpu, &kernel)?;
        let args = [Arg::Copies(Box::new(table))];
        // SAFETY: `copies(Copies t)`: block row `y` copies entry `y` of the table, whose
        // addresses the caller vouches for.
        unsafe { launch(gpu, &functions[0], &args, config) }?;
    }
    Ok(())
}
