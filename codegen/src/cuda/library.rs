//! CUDA C for the ops that are not fused kernels: `gather`, `scatter`/`scatter_add`,
//! `assign`, `unview` (without overlaps), `cumsum`, `argmax`/`argmin`, and random fills.
//!
//! Each source is specialized to its shapes (as fused kernels are) and computes exactly what
//! the reference executor computes:
//! - Index ops check every index; the smallest position holding an out-of-range index is
//!   recorded with `atomicMin` in `err[0]` (initialized by the caller to `LLONG_MAX`), so the
//!   error names the same index the reference executor reports.
//! - `scatter` gives one thread to each line of the index along the axis: positions on
//!   different lines have different targets, and a thread walks its line in row-major order,
//!   so "the last write wins" and sums are formed in the reference executor's order, without
//!   atomics. Float sums accumulate in an `f64` scratch copy of the base and are rounded once.
//! - `cumsum` and the arg-reductions give one thread to each line: floats accumulate in `f64`,
//!   integers wrap; NaN is the largest and smallest element, the first one wins, and so does
//!   the first of equal elements.
//! - Random fills read the counter-based stream of [`kiln_ir::random`] at each element's
//!   index: uniform floats and integers are bit-identical to the CPU's; normal values go
//!   through CUDA's `log` and `cos` in f64 (within 2 ULP of the host's), so after rounding to
//!   `f32` they agree except, rarely, in the last bit.

use std::fmt::Write as _;

use kiln_ir::{DType, RandomDist, ReduceOp, Shape, View};

use super::{PRELUDE, load, storage_type, store};

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
fn finish(op: &str, body: String, count: usize) -> LibraryKernel {
    let base = named(op, &body);
    let entries: Vec<String> = (0..count).map(|k| format!("{base}_{k}")).collect();
    let mut body = body;
    for (k, e) in entries.iter().enumerate() {
        body = body.replace(&format!("ENTRY{k}("), &format!("{e}("));
    }
    LibraryKernel { source: format!("{PRELUDE}{body}"), entries }
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
    let float_sum = accumulate && dtype.is_float();
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
    if float_sum {
        let _ = writeln!(body, "extern \"C\" __global__ void ENTRY2({args}) {{");
        grid_loop(&mut body, "i");
        // One rounding from the f64 sum, as the reference's conversion does: to f32 with
        // round-to-odd first, so the 16-bit rounding after it is not a second one.
        let sum = match dtype {
            DType::F64 => "scratch[i]".to_string(),
            DType::F32 => "(float)scratch[i]".to_string(),
            _ => store(dtype, "k_d2f_odd(scratch[i])"),
        };
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

/// Running sums along `axis`, one thread per line. Arguments: `x`, `out`, `n` (the number of
/// lines).
pub fn cumsum(dtype: DType, shape: &Shape, axis: usize) -> LibraryKernel {
    let t = storage_type(dtype);
    let st = strides(shape);
    let mut body = String::new();
    let _ = writeln!(
        body,
        "extern \"C\" __global__ void ENTRY0(const {t}* __restrict__ x, {t}* __restrict__ out, long long n) {{"
    );
    line_loop(&mut body, shape, axis);
    let float = dtype.is_float();
    body.push_str(if float {
        "    double acc = 0.0;\n"
    } else {
        "    unsigned long long acc = 0;\n"
    });
    let _ = writeln!(body, "    for (long long k = 0; k < {}LL; k++) {{", shape.dims()[axis]);
    let _ = writeln!(body, "      long long at = at0 + k * {}LL;", st[axis]);
    if float {
        let _ = writeln!(body, "      acc += (double){};", load(dtype, "x[at]"));
        let value =
            if dtype == DType::F64 { "acc".to_string() } else { store(dtype, "(float)acc") };
        let _ = writeln!(body, "      out[at] = {value};");
    } else if dtype == DType::Bool {
        body.push_str("      acc += (unsigned long long)(x[at] != 0);\n      out[at] = (unsigned char)(acc != 0);\n");
    } else {
        let _ = writeln!(body, "      acc += (unsigned long long)(long long)x[at];");
        let _ = writeln!(body, "      out[at] = ({t})(long long)acc;");
    }
    body.push_str("    }\n  }\n}\n");
    finish("cumsum", body, 1)
}

/// The index of each line's largest (`ArgMax`) or smallest element along `axis`, as `i64`:
/// the first NaN if there is one, else the first of equal extremes. One thread per line.
/// Arguments: `x`, `out`, `n` (the number of lines).
pub fn arg_extreme(op: ReduceOp, dtype: DType, shape: &Shape, axis: usize) -> LibraryKernel {
    let t = storage_type(dtype);
    let st = strides(shape);
    let better = if op == ReduceOp::ArgMax { ">" } else { "<" };
    let (ty, value) = if dtype.is_float() {
        ("double", format!("(double){}", load(dtype, "x[at]")))
    } else {
        ("long long", "(long long)x[at]".to_string())
    };
    let mut body = String::new();
    let _ = writeln!(
        body,
        "extern \"C\" __global__ void ENTRY0(const {t}* __restrict__ x, long long* __restrict__ out, long long n) {{"
    );
    line_loop(&mut body, shape, axis);
    let len = shape.dims()[axis];
    if len == 0 {
        // An empty line has no element to point at: 0, as in the reference executor.
        body.push_str("    (void)at0; out[line] = 0;\n  }\n}\n");
        let name = if op == ReduceOp::ArgMax { "argmax" } else { "argmin" };
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
    let name = if op == ReduceOp::ArgMax { "argmax" } else { "argmin" };
    finish(name, body, 1)
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
            let stored =
                if dtype == DType::F64 { "v".to_string() } else { store(dtype, "(float)v") };
            format!("double v = {value};\n    out[i] = {stored};")
        }
    };
    let _ = writeln!(body, "    {line}");
    body.push_str("  }\n}\n");
    finish("random", body, 1)
}
