//! CUDA C for the ops that are not fused kernels: `gather`, `scatter`/`scatter_add`,
//! `assign`, `unview` (without overlaps), `cumsum`, `argmax`/`argmin`, and random fills.
//!
//! Each source is specialized to its shapes (as fused kernels are) and computes exactly what
//! the reference executor computes:
//! - Index ops check every index; the smallest position holding an out-of-range index is
//!   recorded with `atomicMin` in `err[0]` (initialized by the caller to [`NO_BAD_INDEX`]), so
//!   the error names the same index the reference executor reports; [`bad_index`] then copies
//!   that index into `err[1]`, so one read of `err` tells the whole error.
//! - `scatter` gives one thread to each line of the index along the axis: positions on
//!   different lines have different targets, and a thread walks its line in row-major order,
//!   so "the last write wins" and sums are formed in the reference executor's order, without
//!   atomics. Float sums accumulate in an `f64` scratch copy of the base and are rounded once.
//! - `cumsum` (lines of 1,024 or more) and the arg-reductions spread their lines as
//!   [`lines_of`] says: a thread per
//!   line for many strided lines, a block per line for lines along the last axis (or few),
//!   and blocks per chunk of a line, merged by a second pass, for few long lines (a
//!   `cumsum` or `argmax` over a whole tensor would otherwise run on one thread or one
//!   multiprocessor). Floats accumulate in `f64` and round once per position, integers
//!   wrap; NaN is the largest and smallest element, the first one wins, and so does the
//!   first of equal elements, however the candidates are combined.
//! - Random fills read the counter-based stream of [`kiln_ir::random`] at each element's
//!   index: uniform floats and integers are bit-identical to the CPU's; normal values go
//!   through CUDA's `log` and `cos` in f64 (within 2 ULP of the host's), so after rounding to
//!   `f32` they agree except, rarely, in the last bit.

use std::fmt::Write as _;

use kiln_ir::{DType, RandomDist, ReduceOp, Shape, View};

use super::{Combine, PRELUDE, block_combine, load, storage_type, store_f64};

/// The CUDA C of one library op and the entry points it defines, in launch order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LibraryKernel {
    /// The source, with kiln's prelude.
    pub source: String,
    /// The entry points.
    pub entries: Vec<String>,
}

/// Opens `kernel`'s grid-stride loop over `i < n` (`n` is the kernel's last argument).
fn grid_loop(src: &mut String, var: &str) {
    let _ = writeln!(
        src,
        "  for (long long {var} = (long long)blockIdx.x * blockDim.x + threadIdx.x; {var} < n; {var} += (long long)gridDim.x * blockDim.x) {{"
    );
}

/// Statements splitting `index` (a row-major position over `dims`) into coordinates, adding
/// `coordinate * weights[k][d]` to the variable `names[k]` for each weight set; the dimension
/// `skip` adds nothing (its coordinate is found or walked separately).
fn split(
    src: &mut String,
    index: &str,
    dims: &[usize],
    skip: Option<usize>,
    weights: &[(&str, Vec<i64>)],
) {
    let _ = writeln!(src, "    long long r = {index};");
    for d in (0..dims.len()).rev() {
        if dims[d] == 1 {
            continue;
        }
        if Some(d) == skip {
            // Its coordinate adds nothing, but the ones before it are above it.
            let _ = writeln!(src, "    r /= {}LL;", dims[d]);
            continue;
        }
        let _ = writeln!(src, "    {{ long long c = r % {}LL; r /= {}LL;", dims[d], dims[d]);
        for (name, w) in weights {
            if w[d] != 0 {
                let _ = writeln!(src, "      {name} += c * {}LL;", w[d]);
            }
        }
        src.push_str("    }\n");
    }
}

/// Opens the grid-stride loop over the lines of a dense `shape` along `axis` (one thread per
/// line, numbered row-major over the other dimensions), with `at0` the offset of the line's
/// first element.
fn line_loop(src: &mut String, shape: &Shape, axis: usize) {
    let mut line_dims = shape.dims().to_vec();
    line_dims[axis] = 1;
    grid_loop(src, "line");
    src.push_str("    long long at0 = 0;\n");
    split(src, "line", &line_dims, Some(axis), &[("at0", strides(shape))]);
}

fn strides(shape: &Shape) -> Vec<i64> {
    shape.contiguous_strides().iter().map(|&s| s as i64).collect()
}

/// A short structural name: the op and a hash of its source.
fn named(op: &str, body: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in body.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    format!("kiln_{op}_{h:016x}")
}

/// Finishes a source whose entry points were written with the placeholder `ENTRY{k}`.
pub(super) fn finish(op: &str, body: String, count: usize) -> LibraryKernel {
    let base = named(op, &body);
    let entries: Vec<String> = (0..count).map(|k| format!("{base}_{k}")).collect();
    let mut body = body;
    for (k, e) in entries.iter().enumerate() {
        body = body.replace(&format!("ENTRY{k}("), &format!("{e}("));
    }
    LibraryKernel { source: format!("{PRELUDE}{body}"), entries }
}

/// `err[0]` when no index was out of range: every byte `0x7f` (a byte fill on the device sets
/// it), above every position.
pub const NO_BAD_INDEX: i64 = i64::from_ne_bytes([0x7f; 8]);

/// After an index kernel: `err[1] = index[err[0]]` when `err[0]` names a position (one
/// thread). Arguments: `err`, `index`.
pub fn bad_index() -> LibraryKernel {
    let body = format!(
        "extern \"C\" __global__ void ENTRY0(long long* err, const long long* __restrict__ index) {{
  if (blockIdx.x == 0 && threadIdx.x == 0 && err[0] != {NO_BAD_INDEX}LL) err[1] = index[err[0]];
}}
"
    );
    finish("bad_index", body, 1)
}

/// Records position `p` as holding a bad index (the smallest such position wins).
const BAD_INDEX: &str = "atomicMin(err, p); continue;";

/// `out[p] = x[p with p[axis] = index[p]]` over the index's shape. Arguments: `x`, `index`,
/// `out`, `err`, `n` (the index's element count).
pub fn gather(dtype: DType, x: &Shape, index: &Shape, axis: usize) -> LibraryKernel {
    let t = storage_type(dtype);
    let xs = strides(x);
    let mut body = String::new();
    let _ = writeln!(
        body,
        "extern \"C\" __global__ void ENTRY0(const {t}* __restrict__ x, const long long* __restrict__ index, {t}* __restrict__ out, long long* err, long long n) {{"
    );
    grid_loop(&mut body, "p");
    body.push_str("    long long t = 0;\n");
    split(&mut body, "p", index.dims(), Some(axis), &[("t", xs.clone())]);
    let _ = writeln!(body, "    long long v = index[p];");
    let _ = writeln!(body, "    if (v < 0 || v >= {}LL) {{ {BAD_INDEX} }}", x.dims()[axis]);
    let _ = writeln!(body, "    out[p] = x[t + v * {}LL];", xs[axis]);
    body.push_str("  }\n}\n");
    finish("gather", body, 1)
}

/// A copy of `base` (made by the caller in `out`) with `src` written, or added, at
/// `p with p[axis] = index[p]` for every position `p` of the index. One thread per line of
/// the index along `axis`. Arguments: `out`, `index`, `src`, `err`, `scratch` (an `f64` copy
/// of the base, for float sums; unused otherwise), `n` (the number of lines).
///
/// Float sums run three entry points: the base into `scratch`, the sums, `scratch` rounded
/// into `out`; the others run the second alone.
pub fn scatter(
    dtype: DType,
    base: &Shape,
    index: &Shape,
    src: &Shape,
    axis: usize,
    accumulate: bool,
) -> LibraryKernel {
    let t = storage_type(dtype);
    let (bs, ss) = (strides(base), strides(src));
    // Bools do not add: `scatter_add` replaces them, as in the reference executor.
    let accumulate = accumulate && dtype != DType::Bool;
    // Float sums of several values per position go through an f64 scratch copy of the base;
    // with one index per line (a gather's gradient with one label per row) no position is
    // added to twice, so each is `base + src` in f64, rounded once, in place.
    let float_sum = accumulate && dtype.is_float() && index.dims()[axis] > 1;
    let single_add = accumulate && dtype.is_float() && !float_sum;
    let mut body = String::new();
    let args = format!(
        "{t}* __restrict__ out, const long long* __restrict__ index, const {t}* __restrict__ src, long long* err, double* __restrict__ scratch, long long n"
    );
    if float_sum {
        let _ = writeln!(body, "extern \"C\" __global__ void ENTRY0({args}) {{");
        grid_loop(&mut body, "i");
        let _ = writeln!(body, "    scratch[i] = (double){};", load(dtype, "out[i]"));
        body.push_str("  }\n}\n");
    }
    if float_sum && scatter_adds_atomically(dtype) {
        // A thread per index position, adding into the f64 scratch with atomics.
        let _ = writeln!(body, "extern \"C\" __global__ void ENTRY1({args}) {{");
        grid_loop(&mut body, "i");
        body.push_str("    long long t0 = 0, s0 = 0;\n");
        let mut off_axis = bs.clone();
        off_axis[axis] = 0;
        split(&mut body, "i", index.dims(), None, &[("t0", off_axis), ("s0", ss.clone())]);
        body.push_str("    long long v = index[i];\n");
        let _ = writeln!(
            body,
            "    if (v < 0 || v >= {}LL) {{ atomicMin(err, i); continue; }}",
            base.dims()[axis]
        );
        let _ = writeln!(
            body,
            "    atomicAdd(&scratch[t0 + v * {}LL], (double){});",
            bs[axis],
            load(dtype, "src[s0]")
        );
        body.push_str("  }\n}\n");
        return finish_scatter(body, dtype, accumulate, float_sum);
    }
    let _ =
        writeln!(body, "extern \"C\" __global__ void ENTRY{}({args}) {{", usize::from(float_sum));
    // Lines: the index's positions with the axis coordinate 0, numbered row-major over the
    // other dimensions.
    let mut line_dims = index.dims().to_vec();
    line_dims[axis] = 1;
    let index_strides = strides(index);
    grid_loop(&mut body, "line");
    body.push_str("    long long t0 = 0, s0 = 0, q0 = 0;\n");
    split(
        &mut body,
        "line",
        &line_dims,
        Some(axis),
        &[("t0", bs.clone()), ("s0", ss.clone()), ("q0", index_strides.clone())],
    );
    let _ = writeln!(body, "    for (long long k = 0; k < {}LL; k++) {{", index.dims()[axis]);
    let _ = writeln!(body, "      long long p = q0 + k * {}LL;", index_strides[axis]);
    let _ = writeln!(body, "      long long v = index[p];");
    let _ = writeln!(
        body,
        "      if (v < 0 || v >= {}LL) {{ atomicMin(err, p); break; }}",
        base.dims()[axis]
    );
    let _ = writeln!(body, "      long long at = t0 + v * {}LL;", bs[axis]);
    let _ = writeln!(body, "      long long from = s0 + k * {}LL;", ss[axis]);
    let line = if float_sum {
        format!("scratch[at] += (double){};", load(dtype, "src[from]"))
    } else if single_add {
        let sum =
            format!("(double){} + (double){}", load(dtype, "out[at]"), load(dtype, "src[from]"));
        format!("out[at] = {};", store_f64(dtype, &sum))
    } else if accumulate {
        // Integers wrap, as in Rust: add as unsigned.
        format!(
            "out[at] = ({t})((unsigned long long)(long long)out[at] + (unsigned long long)(long long)src[from]);"
        )
    } else {
        "out[at] = src[from];".to_string()
    };
    let _ = writeln!(body, "      {line}");
    body.push_str("    }\n  }\n}\n");
    finish_scatter(body, dtype, accumulate, float_sum)
}

/// Whether a float `scatter_add` of `dtype` adds with one thread per index position and
/// `f64` atomics (its entry point 1 runs over the index's elements) rather than one thread
/// per line walking the line's positions in order (over the index's lines). For `f32` and
/// 16-bit values the `f64` sums are exact unless the terms added at one position span more
/// than about 2^29 in magnitude, so the order of the atomics does not show; `f64` values keep
/// the serial order of the reference executor.
pub fn scatter_adds_atomically(dtype: DType) -> bool {
    dtype.is_float() && dtype != DType::F64
}

/// A scatter's last entry point (for float sums through the scratch: the f64 scratch rounded
/// into `out`) and its name.
fn finish_scatter(
    mut body: String,
    dtype: DType,
    accumulate: bool,
    float_sum: bool,
) -> LibraryKernel {
    let args = format!(
        "{t}* __restrict__ out, const long long* __restrict__ index, const {t}* __restrict__ src, long long* err, double* __restrict__ scratch, long long n",
        t = storage_type(dtype)
    );
    if float_sum {
        let _ = writeln!(body, "extern \"C\" __global__ void ENTRY2({args}) {{");
        grid_loop(&mut body, "i");
        // One rounding from the f64 sum, as the reference's conversion does.
        let sum = store_f64(dtype, "scratch[i]");
        let _ = writeln!(body, "    out[i] = {sum};");
        body.push_str("  }\n}\n");
    }
    let name = if accumulate { "scatter_add" } else { "scatter" };
    finish(name, body, if float_sum { 3 } else { 1 })
}

/// `out[view(p)] = values[p]` over the view's shape, into a copy of the base that the caller
/// made in `out` (or zeros, for an `unview` whose view does not overlap). Arguments: `out`,
/// `values`, `n` (the view's element count).
pub fn assign(dtype: DType, view: &View) -> LibraryKernel {
    let t = storage_type(dtype);
    let mut body = String::new();
    let _ = writeln!(
        body,
        "extern \"C\" __global__ void ENTRY0({t}* __restrict__ out, const {t}* __restrict__ values, long long n) {{"
    );
    grid_loop(&mut body, "p");
    let _ = writeln!(body, "    long long at = {}LL;", view.offset());
    let vs: Vec<i64> = view.strides().iter().map(|&s| s as i64).collect();
    split(&mut body, "p", view.shape().dims(), None, &[("at", vs)]);
    body.push_str("    out[at] = values[p];\n  }\n}\n");
    finish("assign", body, 1)
}

/// Running sums along `axis`, launched as [`cumsum_lines`] says: floats accumulate in `f64`
/// and round once per position, integers wrap. One thread per line adds in the reference
/// executor's order; the parallel scans of long lines add in a tree order, so an `f64`
/// result may differ from the reference's in its last bit (narrower floats, rounded from
/// the `f64` sum, practically never do). Arguments: `x`, `out`, `n` (the number of
/// lines) for [`Lines::Threads`] and [`Lines::Blocks`]. [`Lines::Chunks`] runs three entry
/// points: each chunk's total into `totals` (`f64` for floats, `i64` otherwise; arguments
/// `x`, `totals`, `chunks`, `n` = lines times chunks), the totals turned into each chunk's
/// starting sum, one thread per line (`totals`, `chunks`, `n` = lines), and the chunks'
/// running sums from there (`x`, `out`, `totals`, `chunks`, `n` = lines times chunks).
///
/// Blocks scan a line in tiles of `blockDim.x` positions: a warp scan with `__shfl_up_sync`,
/// the warps' totals scanned by the first warp, and a carry from tile to tile.
pub fn cumsum(dtype: DType, shape: &Shape, axis: usize) -> LibraryKernel {
    let t = storage_type(dtype);
    let st = strides(shape);
    let float = dtype.is_float();
    let acc = if float { "double" } else { "unsigned long long" };
    let value = if float {
        format!("(double){}", load(dtype, "x[at]"))
    } else if dtype == DType::Bool {
        "(unsigned long long)(x[at] != 0)".to_string()
    } else {
        "(unsigned long long)(long long)x[at]".to_string()
    };
    let stored = |v: &str| {
        if float {
            store_f64(dtype, v)
        } else if dtype == DType::Bool {
            format!("(unsigned char)(({v}) != 0)")
        } else {
            format!("({t})(long long)({v})")
        }
    };
    let len = shape.dims()[axis];
    let mut body = String::new();
    let how = cumsum_lines(shape, axis);
    if how == Lines::Threads {
        let _ = writeln!(
            body,
            "extern \"C\" __global__ void ENTRY0(const {t}* __restrict__ x, {t}* __restrict__ out, long long n) {{"
        );
        line_loop(&mut body, shape, axis);
        let _ = writeln!(body, "    {acc} acc = 0;");
        let _ = writeln!(body, "    for (long long k = 0; k < {len}LL; k++) {{");
        let _ = writeln!(body, "      long long at = at0 + k * {}LL;", st[axis]);
        let _ = writeln!(body, "      acc += {value};");
        let _ = writeln!(body, "      out[at] = {};", stored("acc"));
        body.push_str("    }\n  }\n}\n");
        return finish("cumsum", body, 1);
    }
    // The running sums of positions `lo..hi` from `carry` on, a tile of the block at a time.
    let scan = |body: &mut String| {
        let _ = writeln!(
            body,
            "    for (long long base = lo; base < hi; base += blockDim.x) {{\n      long long k = base + threadIdx.x, at = at0 + k * {}LL;",
            st[axis]
        );
        let _ = writeln!(body, "      {acc} v = k < hi ? {value} : 0;");
        let _ = writeln!(
            body,
            "      for (int s = 1; s < 32; s <<= 1) {{ {acc} u = __shfl_up_sync(0xffffffffu, v, s); if ((int)(threadIdx.x & 31) >= s) v += u; }}"
        );
        body.push_str("      if ((threadIdx.x & 31) == 31) warps[threadIdx.x >> 5] = v;\n      __syncthreads();\n");
        body.push_str("      if (threadIdx.x < 32) {\n");
        let _ = writeln!(
            body,
            "        {acc} w = threadIdx.x < (blockDim.x >> 5) ? warps[threadIdx.x] : 0;\n        for (int s = 1; s < 32; s <<= 1) {{ {acc} u = __shfl_up_sync(0xffffffffu, w, s); if ((int)threadIdx.x >= s) w += u; }}\n        warps[threadIdx.x] = w;\n      }}\n      __syncthreads();"
        );
        let _ = writeln!(
            body,
            "      {acc} before = carry + (threadIdx.x >= 32 ? warps[(threadIdx.x >> 5) - 1] : 0);"
        );
        let _ = writeln!(body, "      if (k < hi) out[at] = {};", stored("before + v"));
        body.push_str(
            "      carry += warps[(blockDim.x >> 5) - 1];\n      __syncthreads();\n    }\n",
        );
    };
    let shared = format!("  __shared__ {acc} warps[32];\n");
    if how == Lines::Blocks {
        let _ = writeln!(
            body,
            "extern \"C\" __global__ void ENTRY0(const {t}* __restrict__ x, {t}* __restrict__ out, long long n) {{"
        );
        body.push_str(&shared);
        block_line_loop(&mut body, shape, axis, false);
        let _ = writeln!(body, "    {acc} carry = 0;");
        scan(&mut body);
        body.push_str("  }\n}\n");
        return finish("cumsum", body, 1);
    }
    // Chunks: totals, their running sums per line, then each chunk's scan.
    let _ = writeln!(
        body,
        "extern \"C\" __global__ void ENTRY0(const {t}* __restrict__ x, {acc}* __restrict__ totals, long long chunks, long long n) {{"
    );
    // Each chunk's total: a block sum, as fused reductions combine theirs.
    let sum = Combine { acc, identity: "0".into(), combine: "a + b".into(), stored: String::new() };
    let _ = writeln!(body, "  __shared__ {acc} partial[32];");
    block_line_loop(&mut body, shape, axis, true);
    let _ = writeln!(body, "    {acc} acc = 0;");
    body.push_str("    for (long long k = lo + threadIdx.x; k < hi; k += blockDim.x) {\n");
    let _ = writeln!(
        body,
        "      long long at = at0 + k * {}LL;\n      acc += {value};\n    }}",
        st[axis]
    );
    block_combine(&mut body, &sum, "totals[blk] = acc;");
    body.push_str("  }\n}\n");
    let _ = writeln!(
        body,
        "extern \"C\" __global__ void ENTRY1({acc}* __restrict__ totals, long long chunks, long long n) {{"
    );
    grid_loop(&mut body, "line");
    let _ = writeln!(
        body,
        "    {acc} sum = 0;\n    for (long long c = 0; c < chunks; c++) {{ {acc} t = totals[line * chunks + c]; totals[line * chunks + c] = sum; sum += t; }}\n  }}\n}}"
    );
    let _ = writeln!(
        body,
        "extern \"C\" __global__ void ENTRY2(const {t}* __restrict__ x, {t}* __restrict__ out, const {acc}* __restrict__ totals, long long chunks, long long n) {{"
    );
    body.push_str(&shared);
    block_line_loop(&mut body, shape, axis, true);
    let _ = writeln!(body, "    {acc} carry = totals[blk];");
    scan(&mut body);
    body.push_str("  }\n}\n");
    finish("cumsum", body, 3)
}

/// How a per-line library kernel (`cumsum`, `argmax`/`argmin`) spreads its lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lines {
    /// One thread per line, walking it in order: for many lines whose elements are strided
    /// (the axis is not the last), where neighbouring lines are adjacent in memory and a
    /// warp's loads coalesce. Launch over the lines like an elementwise kernel.
    Threads,
    /// One block per line: for lines along the last axis, or few lines. Launch one block per
    /// line with a multiple of 32 threads.
    Blocks,
    /// Few long lines, each cut into `chunks` (a launch argument) that one block each
    /// handles; a second entry point combines each line's chunks. Launch the first entry
    /// point with one block per chunk, the second with one block per line.
    Chunks,
}

/// Lines below which a per-line kernel does not give each line a thread: fewer would leave
/// most of the device idle.
const THREAD_LINES: usize = 128;

/// The fewest elements per line for which few lines are cut into chunks.
pub const CHUNK_MIN_LEN: usize = 1 << 14;

/// Lines shorter than this are summed in order by one thread each: a parallel scan adds in
/// another order, which can change an `f64` running sum in its last bit, and short lines
/// gain nothing from it.
pub const SCAN_MIN_LEN: usize = 1 << 10;

/// How `cumsum` over `shape` along `axis` runs: [`lines_of`] for lines of at least
/// [`SCAN_MIN_LEN`] elements, else [`Lines::Threads`].
pub fn cumsum_lines(shape: &Shape, axis: usize) -> Lines {
    if shape.dims()[axis] < SCAN_MIN_LEN { Lines::Threads } else { lines_of(shape, axis) }
}

/// How a per-line kernel over `shape` along `axis` runs.
pub fn lines_of(shape: &Shape, axis: usize) -> Lines {
    let len = shape.dims()[axis];
    let lines: usize =
        shape.dims().iter().enumerate().filter(|&(d, _)| d != axis).map(|(_, &s)| s).product();
    let last = shape.dims()[axis + 1..].iter().product::<usize>() == 1;
    if !last && lines >= THREAD_LINES {
        Lines::Threads
    } else if lines < THREAD_LINES && len >= CHUNK_MIN_LEN {
        Lines::Chunks
    } else {
        Lines::Blocks
    }
}

/// Opens a loop giving each block the lines `line` of `shape` along `axis` (numbered
/// row-major over the other dimensions), with `at0` the offset of the line's first element;
/// with `chunked`, block `blk` takes chunk `blk % chunks` of line `blk / chunks`, positions
/// `lo..hi`.
fn block_line_loop(src: &mut String, shape: &Shape, axis: usize, chunked: bool) {
    let len = shape.dims()[axis];
    let mut line_dims = shape.dims().to_vec();
    line_dims[axis] = 1;
    if chunked {
        let _ = writeln!(src, "  const long long per = ({len}LL + chunks - 1) / chunks;");
        src.push_str("  for (long long blk = blockIdx.x; blk < n; blk += gridDim.x) {\n");
        let _ = writeln!(
            src,
            "    long long line = blk / chunks, lo = (blk % chunks) * per, hi = lo + per < {len}LL ? lo + per : {len}LL;"
        );
    } else {
        src.push_str("  for (long long line = blockIdx.x; line < n; line += gridDim.x) {\n");
        let _ = writeln!(src, "    const long long lo = 0, hi = {len}LL;");
    }
    src.push_str("    long long at0 = 0;\n");
    split(src, "line", &line_dims, Some(axis), &[("at0", strides(shape))]);
}

/// No position yet: loses to every candidate.
const NONE: &str = "9223372036854775807LL";

/// The index of each line's largest (`ArgMax`) or smallest element along `axis`, as `i64`:
/// the first NaN if there is one, else the first of equal extremes (0 for an empty line).
/// Launched as [`lines_of`] says. Arguments: `x`, `out`, `n` (the number of lines) for
/// [`Lines::Threads`] and [`Lines::Blocks`]; for [`Lines::Chunks`], the first entry point
/// takes `x`, `values` and `positions` (a line's chunks' winners: `f64` for floats, `i64`
/// for integers, and `i64`), `chunks`, `n` (lines times chunks), the second `values`,
/// `positions`, `out`, `chunks`, `n` (the lines).
pub fn arg_extreme(op: ReduceOp, dtype: DType, shape: &Shape, axis: usize) -> LibraryKernel {
    let t = storage_type(dtype);
    let st = strides(shape);
    let name = if op == ReduceOp::ArgMax { "argmax" } else { "argmin" };
    let better = if op == ReduceOp::ArgMax { ">" } else { "<" };
    let (ty, value) = if dtype.is_float() {
        ("double", format!("(double){}", load(dtype, "x[at]")))
    } else {
        ("long long", "(long long)x[at]".to_string())
    };
    let len = shape.dims()[axis];
    let mut body = String::new();
    let signature = |body: &mut String| {
        let _ = writeln!(
            body,
            "extern \"C\" __global__ void ENTRY0(const {t}* __restrict__ x, long long* __restrict__ out, long long n) {{"
        );
    };
    let how = lines_of(shape, axis);
    if len == 0 || how == Lines::Threads {
        signature(&mut body);
        line_loop(&mut body, shape, axis);
        if len == 0 {
            // An empty line has no element to point at: 0, as in the reference executor.
            body.push_str("    (void)at0; out[line] = 0;\n  }\n}\n");
            return finish(name, body, 1);
        }
        let _ = writeln!(body, "    long long best = 0;");
        let _ = writeln!(body, "    {{ long long at = at0; {ty} top = {value};");
        let _ = writeln!(body, "    bool nan = top != top;");
        let _ = writeln!(body, "    for (long long k = 1; k < {len}LL && !nan; k++) {{");
        let _ = writeln!(body, "      at = at0 + k * {}LL;", st[axis]);
        let _ = writeln!(body, "      {ty} v = {value};");
        let _ = writeln!(body, "      if (v != v) {{ best = k; nan = true; }}");
        let _ = writeln!(body, "      else if (v {better} top) {{ best = k; top = v; }}");
        body.push_str("    } }\n    out[line] = best;\n  }\n}\n");
        return finish(name, body, 1);
    }
    // Candidates `(v, i)` combine in any order to the reference's answer: a NaN beats every
    // number, a better value beats a worse one, and of equals the smaller position wins.
    let _ = writeln!(
        body,
        "__device__ __forceinline__ void k_pick({ty}& v, long long& i, {ty} v2, long long i2) {{\n  if (i2 == {NONE}) return;\n  if (i != {NONE}) {{\n    bool n1 = v != v, n2 = v2 != v2;\n    if (n1 || n2) {{ if (!n2 || (n1 && i2 > i)) return; }}\n    else if (!(v2 {better} v || (v2 == v && i2 < i))) return;\n  }}\n  v = v2; i = i2;\n}}"
    );
    // Every thread's candidate, then the block's in thread 0, which runs `finish`.
    let combine = |body: &mut String, finish: &str| {
        let shuffle = "for (int s = 16; s > 0; s >>= 1) { ".to_string()
            + &format!("{ty} v2 = __shfl_down_sync(0xffffffffu, v, s); ")
            + "long long i2 = __shfl_down_sync(0xffffffffu, i, s); k_pick(v, i, v2, i2); }";
        let _ = writeln!(body, "    {shuffle}");
        body.push_str("    if ((threadIdx.x & 31) == 0) { sv[threadIdx.x >> 5] = v; si[threadIdx.x >> 5] = i; }\n");
        body.push_str("    __syncthreads();\n    if (threadIdx.x < 32) {\n");
        body.push_str("      bool has = threadIdx.x < ((blockDim.x + 31) >> 5);\n");
        let _ = writeln!(
            body,
            "      v = has ? sv[threadIdx.x] : 0; i = has ? si[threadIdx.x] : {NONE};"
        );
        let _ = writeln!(body, "      {shuffle}");
        let _ = writeln!(body, "      if (threadIdx.x == 0) {{ {finish} }}");
        body.push_str("    }\n    __syncthreads();\n  }\n}\n");
    };
    let shared = format!("  __shared__ {ty} sv[32];\n  __shared__ long long si[32];\n");
    let scan = |body: &mut String| {
        let _ = writeln!(body, "    {ty} v = 0; long long i = {NONE};");
        body.push_str("    for (long long k = lo + threadIdx.x; k < hi; k += blockDim.x) {\n");
        let _ = writeln!(body, "      long long at = at0 + k * {}LL;", st[axis]);
        let _ = writeln!(body, "      k_pick(v, i, {value}, k);\n    }}");
    };
    let result = format!("out[line] = i == {NONE} ? 0 : i;");
    if how == Lines::Blocks {
        signature(&mut body);
        body.push_str(&shared);
        block_line_loop(&mut body, shape, axis, false);
        scan(&mut body);
        combine(&mut body, &result);
        return finish(name, body, 1);
    }
    let _ = writeln!(
        body,
        "extern \"C\" __global__ void ENTRY0(const {t}* __restrict__ x, {ty}* __restrict__ values, long long* __restrict__ positions, long long chunks, long long n) {{"
    );
    body.push_str(&shared);
    block_line_loop(&mut body, shape, axis, true);
    scan(&mut body);
    combine(&mut body, "values[blk] = v; positions[blk] = i;");
    let _ = writeln!(
        body,
        "extern \"C\" __global__ void ENTRY1(const {ty}* __restrict__ values, const long long* __restrict__ positions, long long* __restrict__ out, long long chunks, long long n) {{"
    );
    body.push_str(&shared);
    body.push_str("  for (long long line = blockIdx.x; line < n; line += gridDim.x) {\n");
    let _ = writeln!(body, "    {ty} v = 0; long long i = {NONE};");
    body.push_str("    for (long long j = threadIdx.x; j < chunks; j += blockDim.x) k_pick(v, i, values[line * chunks + j], positions[line * chunks + j]);\n");
    combine(&mut body, &result);
    finish(name, body, 2)
}

/// Element `i` of a random fill of `dtype`. Arguments: `out`, `key`, `low`, `range` (the
/// integer bounds, unused by float fills), `n`.
pub fn random(dist: RandomDist, dtype: DType) -> LibraryKernel {
    let t = storage_type(dtype);
    let mut body = String::from(
        "__device__ __forceinline__ unsigned long long k_bits(unsigned long long key, unsigned long long i) {\n  unsigned long long z = key + (i + 1ULL) * 0x9E3779B97F4A7C15ULL;\n  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;\n  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;\n  return z ^ (z >> 31);\n}\n__device__ __forceinline__ double k_uniform(unsigned long long key, unsigned long long i, int p) {\n  return ldexp((double)(k_bits(key, i) >> (64 - p)), -p);\n}\n",
    );
    let _ = writeln!(
        body,
        "extern \"C\" __global__ void ENTRY0({t}* __restrict__ out, unsigned long long key, long long low, unsigned long long range, long long n) {{"
    );
    grid_loop(&mut body, "i");
    let u = "(unsigned long long)i";
    let line = match dist {
        RandomDist::Int { .. } => {
            format!("out[i] = ({t})(low + (long long)__umul64hi(k_bits(key, {u}), range));")
        }
        RandomDist::Uniform | RandomDist::Normal => {
            let value = if dist == RandomDist::Uniform {
                format!("k_uniform(key, {u}, {})", dtype.mantissa_bits().unwrap_or(53))
            } else {
                // 1 - u lies in (0, 1], so the logarithm is finite.
                format!(
                    "sqrt(-2.0 * log(1.0 - k_uniform(key, 2ULL * {u}, 53))) * cos(6.283185307179586 * k_uniform(key, 2ULL * {u} + 1ULL, 53))"
                )
            };
            let stored = store_f64(dtype, "v");
            format!("double v = {value};\n    out[i] = {stored};")
        }
    };
    let _ = writeln!(body, "    {line}");
    body.push_str("  }\n}\n");
    finish("random", body, 1)
}

/// Entries of one [`copies`] launch.
pub const COPIES_PER_LAUNCH: usize = 32;

/// Up to [`COPIES_PER_LAUNCH`] device-to-device copies in one launch: block row `y` copies
/// `bytes[y]` bytes from `src[y]` to `dst[y]` (16 bytes at a time, then the tail), and skips
/// an entry whose source is its destination. The table is the kernel's one argument, passed
/// by value, so a captured CUDA graph's copies change with its node's parameters (the copies
/// into and out of a replayed plan's buffers).
pub fn copies() -> LibraryKernel {
    let n = COPIES_PER_LAUNCH;
    let body = format!(
        "struct Copies {{ unsigned long long src[{n}]; unsigned long long dst[{n}]; unsigned long long bytes[{n}]; }};
extern \"C\" __global__ void ENTRY0(Copies t) {{
  unsigned e = blockIdx.y;
  const char* s = (const char*)t.src[e];
  char* d = (char*)t.dst[e];
  unsigned long long bytes = t.bytes[e];
  if (s == d) return;
  unsigned long long vectors = bytes / 16, stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (unsigned long long i = first; i < vectors; i += stride) ((int4*)d)[i] = ((const int4*)s)[i];
  for (unsigned long long i = vectors * 16 + first; i < bytes; i += stride) d[i] = s[i];
}}
"
    );
    finish("copies", body, 1)
}
