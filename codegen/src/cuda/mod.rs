//! CUDA C for kernels, to be compiled with NVRTC for the device's own architecture.
//!
//! The same [`Kernel`] the CPU backend compiles becomes one `extern "C" __global__` function:
//!
//! - **Elementwise kernels** walk their output with a grid-stride loop; each input's offset
//!   comes from the output index through the kernel's coalesced dimensions and strides (a
//!   single coalesced dimension needs no division at all).
//! - **Reduction kernels** give each output element (a row) to one block: the threads stride
//!   over the reduced positions, combine in registers, then across the warp with
//!   `__shfl_down_sync` and across warps through shared memory. Launch them with a multiple
//!   of 32 threads (at most 1024) per block. Reductions over strided positions (a sum over
//!   rows: bias gradients, batch means) with many outputs instead give each output one thread
//!   that walks its positions in order, so that a warp reads 32 neighbouring outputs' values
//!   at once ([`reduces_by_columns`]; launch those like elementwise kernels); with too few
//!   outputs to fill the device, each column is cut into chunks that threads reduce into
//!   partial results, merged by a second entry point ([`splits_columns`]). Few long rows
//!   (a loss's mean over a whole batch) are split: blocks reduce chunks of a row into
//!   partial results that a second entry point merges ([`split_partials`]), so a sum over a
//!   large tensor runs on every multiprocessor, not one. Outputs after the first store the
//!   unreduced value at every domain position.
//! - **16-bit floats** are stored as `unsigned short` and converted with PTX `cvt`
//!   instructions, so no CUDA header is needed; arithmetic on them is done in `float`, as on
//!   the CPU. (The emulated device in `emulator/` defines `KILN_HOST_EMULATION` and supplies
//!   these four conversions itself.)
//!
//! Arguments, in order: one pointer per input, one per output, one value per parameter (of
//! its expression's type, see [`param_types`]), a size-generic kernel's sizes (`long long`
//! each, see [`source_generic`] and [`size_args`]), and the number of output elements.
//! Integer semantics follow the reference executor: a float becomes an `i64` as Rust's `as`
//! does (truncated, saturated, NaN to 0) and narrower integers wrap from there; integer
//! arithmetic wraps. The runtime compiles with
//! `--fmad=false`, so each `+`, `-`, `*` and `/` rounds once, exactly as on the CPU.

use std::fmt::Write as _;

use kiln_ir::kernel::{ExprKind, Kernel};
use kiln_ir::{BinaryOp, DType, ReduceOp, UnaryOp};

use crate::generic::{self, KernelForm};
use crate::walk::{Layout, Sz, coalesce};

pub mod attention;
pub mod library;
pub mod rows;
#[cfg(test)]
mod tests;

/// An NVIDIA GPU as the planner sees it: arithmetic, special functions included, is cheap
/// next to memory traffic, so shared values are recomputed (row softmax reads its input three
/// times, not four) and reductions do not store what they reduce; cuBLAS multiplies bf16 too.
pub const TARGET: kiln_ir::target::Target = kiln_ir::target::Target {
    name: "cuda",
    costs: kiln_ir::target::OpCosts { transcendental: 2, division: 2, arithmetic: 2 },
    gemm_dtypes: &[DType::F32, DType::F64, DType::F16, DType::BF16],
    library_reads_views: false,
    reductions_store_inputs: false,
    fused_logsumexp: false,
    writes_in_place: false,
    custom_ops_read_views: false,
};

/// The options NVRTC compiles kiln's CUDA C with, for `arch` (`sm_90` for a device NVRTC
/// knows, giving PTX and a cubin; `compute_90` for PTX alone). The runtime and the CI test
/// that compiles every kernel kind both use these, so what CI checks is what runs:
/// no contraction of `a * b + c` into one rounding (every operation rounds as on the CPU
/// and in the reference executor, so comparisons and casts of computed values agree), and
/// with `minimal` (NVRTC 12.4 and later) none of the headers kiln's kernels never use.
pub fn nvrtc_options(arch: &str, minimal: bool) -> Vec<String> {
    let mut options = vec![format!("--gpu-architecture={arch}"), "--fmad=false".to_string()];
    if minimal {
        options.push("-minimal".to_string());
    }
    options
}

/// The entry point's name: the kernel's structural name (`k_<hash>`).
pub fn entry_name(kernel: &Kernel) -> String {
    kernel.name()
}

/// The entry points of `kernel` compiled with marks `dynamic` ([`source_generic`]): the
/// kernel, then a split reduction's merge ([`split_partials`]). A specialised kernel's
/// are [`entry_name`] and [`merge_name`]; a generic one's are named for its form, marks and
/// the numbers it keeps, so every kernel it serves has the same source.
pub fn entry_names(kernel: &Kernel, dynamic: &[bool]) -> Vec<String> {
    let name = if generic::is_generic(dynamic) {
        let (layouts, _) = generic::layouts(kernel, dynamic);
        let key = format!("{:?}{layouts:?}", form(kernel));
        format!("g_{:016x}", kiln_ir::kernel::fnv1a(key.as_bytes()))
    } else {
        entry_name(kernel)
    };
    let merge = split_partials(kernel).map(|_| format!("{name}_merge"));
    std::iter::once(name).chain(merge).collect()
}

/// The type of each parameter argument, in order: the dtype of the expression that reads it.
pub fn param_types(kernel: &Kernel) -> Vec<DType> {
    let mut types = vec![DType::F32; kernel.params];
    for e in &kernel.exprs {
        if let ExprKind::Param(i) = e.kind {
            types[i] = e.dtype;
        }
    }
    types
}

/// The CUDA C source of `kernel`, specialised to its sizes.
///
/// # Panics
/// For a `logsumexp` kernel: the CUDA target expands those before fusion
/// ([`kiln_ir::passes::ExpandLogSumExp`]).
pub fn source(kernel: &Kernel) -> String {
    source_generic(kernel, &[])
}

/// The form of `kernel` as this generator writes it (see [`crate::generic`]): besides the
/// target-neutral form, whether a reduction gives each output a thread
/// ([`reduces_by_columns`]), whether it is split ([`split_partials`]) and how
/// ([`splits_columns`]). A kernel of the same form at other sizes is served by a generic
/// kernel that reads the numbers they differ in.
pub fn form(kernel: &Kernel) -> KernelForm {
    let by_columns = reduces_by_columns(kernel);
    KernelForm::new(kernel, &[by_columns, split_partials(kernel).is_some(), splits_columns(kernel)])
}

/// The CUDA C source of `kernel` with the numbers of its walks that `dynamic` marks
/// ([`generic::numbers`]' order; none for a kernel specialised to its sizes) read when it
/// runs, from `long long` arguments after the parameters: [`size_args`] gives their values
/// for any kernel of the same [`form`] whose other numbers are the same. A generic kernel
/// divides by runtime sizes where a specialised one divides by constants (which the
/// compiler turns into multiplications); its loops and launches are the same.
///
/// # Panics
/// As [`source`].
pub fn source_generic(kernel: &Kernel, dynamic: &[bool]) -> String {
    let mut src = String::from(PRELUDE);
    let ([outer, walk], sizes) = generic::layouts(kernel, dynamic);
    let names = entry_names(kernel, dynamic);
    let mut args: Vec<String> = kernel
        .inputs
        .iter()
        .enumerate()
        .map(|(i, input)| format!("const {}* __restrict__ in{i}", storage_type(input.dtype)))
        .collect();
    for (i, &o) in kernel.outputs.iter().enumerate() {
        args.push(format!("{}* __restrict__ out{i}", storage_type(kernel.exprs[o].dtype)));
    }
    for (i, t) in param_types(kernel).into_iter().enumerate() {
        args.push(format!("{} p{i}", compute_type(t)));
    }
    args.extend((0..sizes.len()).map(|i| format!("long long z{i}")));
    let split = split_partials(kernel);
    if let Some(d) = split {
        args.push(format!("{}* __restrict__ part", compute_type(d)));
        args.push("long long chunks".into());
    }
    args.push("long long n".into());
    let _ = writeln!(src, "extern \"C\" __global__ void {}({}) {{", names[0], args.join(", "));
    match kernel.reduce {
        None => elementwise(&mut src, kernel, &walk),
        Some(red) => reduction(&mut src, kernel, red.op, [&outer, &walk]),
    }
    src.push_str("}\n");
    if let (Some(d), Some(red), Some(name)) = (split, kernel.reduce, names.get(1)) {
        merge(&mut src, kernel, red.op, d, name);
    }
    src
}

/// The values of the size arguments of a generic kernel compiled with marks `dynamic`
/// ([`source_generic`]) when it runs `kernel`: empty for a specialised one.
pub fn size_args(kernel: &Kernel, dynamic: &[bool]) -> Vec<i64> {
    if !generic::is_generic(dynamic) {
        return Vec::new();
    }
    generic::layouts(kernel, dynamic).1
}

/// A number of a walk in generated code: a constant, or a generic kernel's size argument.
fn num(n: Sz) -> String {
    match n {
        Sz::Known(v) => format!("{v}LL"),
        Sz::Slot(i) => format!("z{i}"),
    }
}

/// A user's CUDA C source with kiln's helpers before it (`k_b2f`, `k_f2b`, `k_h2f`, `k_f2h`
/// convert bf16 and f16 bits to and from `float`).
pub fn with_prelude(source: &str) -> String {
    format!("{PRELUDE}{source}")
}

/// Helpers every kernel may use; unused ones cost nothing once compiled.
const PRELUDE: &str = r#"// Generated by kiln. 16-bit floats travel as their bits.
#ifndef KILN_HOST_EMULATION
__device__ __forceinline__ float k_h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short k_f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float k_b2f(unsigned short b) { return __uint_as_float(((unsigned int)b) << 16); }
__device__ __forceinline__ unsigned short k_f2b(float f) { unsigned short b; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f)); return b; }
#endif
__device__ __forceinline__ float k_maxf(float a, float b) { return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b); }
__device__ __forceinline__ float k_minf(float a, float b) { return (a != a || b != b) ? __int_as_float(0x7fc00000) : fminf(a, b); }
__device__ __forceinline__ double k_maxd(double a, double b) { return (a != a || b != b) ? __longlong_as_double(0x7ff8000000000000LL) : fmax(a, b); }
__device__ __forceinline__ double k_mind(double a, double b) { return (a != a || b != b) ? __longlong_as_double(0x7ff8000000000000LL) : fmin(a, b); }
__device__ __forceinline__ float k_inff() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ double k_infd() { return __longlong_as_double(0x7ff0000000000000LL); }
__device__ __forceinline__ float k_d2f_odd(double x) { float f = __double2float_rz(x); return ((double)f != x && f == f) ? __int_as_float(__float_as_int(f) | 1) : f; }
__device__ __forceinline__ long long k_idiv(long long a, long long b) { return b == 0 ? 0 : (b == -1 ? (long long)(0ULL - (unsigned long long)a) : a / b); }
__device__ __forceinline__ long long k_irem(long long a, long long b) { return (b == 0 || b == -1) ? 0 : a % b; }
__device__ __forceinline__ long long k_shl(long long a, long long b) { return (b < 0 || b >= 64) ? 0 : (long long)((unsigned long long)a << b); }
__device__ __forceinline__ long long k_shr(long long a, long long b) { return (b < 0 || b >= 64) ? (a >> 63) : (a >> b); }
__device__ __forceinline__ long long k_f2i(double x) { return x != x ? 0 : (x <= -9223372036854775808.0 ? (-9223372036854775807LL - 1) : (x >= 9223372036854775808.0 ? 9223372036854775807LL : (long long)x)); }
"#;

/// How a dtype is stored in memory.
fn storage_type(d: DType) -> &'static str {
    match d {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 | DType::BF16 => "unsigned short",
        DType::I64 => "long long",
        DType::I32 => "int",
        DType::I8 => "signed char",
        DType::U8 | DType::Bool => "unsigned char",
    }
}

/// The type values of a dtype are computed in.
fn compute_type(d: DType) -> &'static str {
    match d {
        DType::F32 | DType::F16 | DType::BF16 => "float",
        DType::F64 => "double",
        DType::I64 => "long long",
        DType::I32 => "int",
        DType::I8 => "signed char",
        DType::U8 => "unsigned char",
        DType::Bool => "bool",
    }
}

/// A stored element as a computed value.
fn load(d: DType, at: &str) -> String {
    match d {
        DType::F16 => format!("k_h2f({at})"),
        DType::BF16 => format!("k_b2f({at})"),
        DType::Bool => format!("({at} != 0)"),
        _ => at.to_string(),
    }
}

/// A computed value as a stored element.
fn store(d: DType, v: &str) -> String {
    match d {
        DType::F16 => format!("k_f2h({v})"),
        DType::BF16 => format!("k_f2b({v})"),
        DType::Bool => format!("(unsigned char)({v})"),
        _ => v.to_string(),
    }
}

/// A `double` value as a stored float element of `d`, rounded once: a 16-bit type goes
/// through `f32` rounded to odd, so that rounding to 16 bits after it is not a second one.
fn store_f64(d: DType, v: &str) -> String {
    match d {
        DType::F64 => v.to_string(),
        DType::F32 => format!("(float)({v})"),
        _ => store(d, &format!("k_d2f_odd({v})")),
    }
}

/// The statements that locate every input for position `index` of `walk`, adding to the
/// offset variables `{var}{i}` (which must exist), innermost dimension first.
fn locate(src: &mut String, walk: &Layout, index: &str, var: char, indent: &str) {
    let n = walk.strides.len();
    if walk.dims.len() == 1 {
        for i in 0..n {
            if walk.strides[i][0] != Sz::Known(0) {
                let _ = writeln!(src, "{indent}{var}{i} += {index} * {};", num(walk.strides[i][0]));
            }
        }
        return;
    }
    let _ = writeln!(src, "{indent}long long r = {index};");
    for (d, &size) in walk.dims.iter().enumerate().rev() {
        let size = num(size);
        let _ = writeln!(src, "{indent}{{ long long c = r % {size}; r /= {size};");
        for i in 0..n {
            if walk.strides[i][d] != Sz::Known(0) {
                let _ = writeln!(src, "{indent}  {var}{i} += c * {};", num(walk.strides[i][d]));
            }
        }
        src.push_str(indent);
        src.push_str("}\n");
    }
}

/// The body's expressions as statements `e{k} = ...;`, reading inputs at offsets `o{i}`.
fn body(src: &mut String, kernel: &Kernel, indent: &str) {
    body_with(src, kernel, indent, &|i| format!("in{i}[o{i}]"));
}

/// [`body`] with input `i`'s stored element read by the expression `element(i)`.
fn body_with(src: &mut String, kernel: &Kernel, indent: &str, element: &dyn Fn(usize) -> String) {
    body_named(src, kernel, indent, element, &|i| format!("p{i}"));
}

/// [`body_with`] with parameter `i` named `param(i)` (a row group numbers each member's).
fn body_named(
    src: &mut String,
    kernel: &Kernel,
    indent: &str,
    element: &dyn Fn(usize) -> String,
    param: &dyn Fn(usize) -> String,
) {
    for (k, e) in kernel.exprs.iter().enumerate() {
        let t = compute_type(e.dtype);
        let float = |d: DType| matches!(d, DType::F32 | DType::F16 | DType::BF16);
        let v = match e.kind {
            ExprKind::Load(i) => load(kernel.inputs[i].dtype, &element(i)),
            ExprKind::Param(i) => param(i),
            ExprKind::Unary(op, a) => unary(op, e.dtype, &format!("e{a}"), float(e.dtype)),
            ExprKind::Binary(op, a, b) => {
                let arg = kernel.exprs[a].dtype;
                binary(op, arg, &format!("e{a}"), &format!("e{b}"))
            }
            ExprKind::Where(c, a, b) => format!("(e{c} ? e{a} : e{b})"),
            ExprKind::Cast(a) => cast(kernel.exprs[a].dtype, e.dtype, &format!("e{a}")),
        };
        // 16-bit float results are rounded to their precision after every op, as the CPU
        // backend and the reference executor do (stored values are exact already).
        let v = match (e.dtype, e.kind) {
            (_, ExprKind::Load(_) | ExprKind::Where(..)) => v,
            (DType::F16, _) => format!("k_h2f(k_f2h({v}))"),
            (DType::BF16, _) => format!("k_b2f(k_f2b({v}))"),
            _ => v,
        };
        let _ = writeln!(src, "{indent}{t} e{k} = ({t})({v});");
    }
}

fn unary(op: UnaryOp, d: DType, x: &str, single: bool) -> String {
    let f = |name: &str| if single { format!("{name}f({x})") } else { format!("{name}({x})") };
    match op {
        UnaryOp::Neg => format!("-{x}"),
        UnaryOp::Abs if d.is_float() => f("fabs"),
        UnaryOp::Abs => format!("({x} < 0 ? -{x} : {x})"),
        UnaryOp::Sqrt => f("sqrt"),
        UnaryOp::Exp => f("exp"),
        UnaryOp::Log => f("log"),
        UnaryOp::Sin => f("sin"),
        UnaryOp::Cos => f("cos"),
        UnaryOp::Tan => f("tan"),
        UnaryOp::Tanh => f("tanh"),
        UnaryOp::Erf => f("erf"),
        UnaryOp::Erfc => f("erfc"),
        UnaryOp::Floor => f("floor"),
        UnaryOp::Ceil => f("ceil"),
        UnaryOp::Round => f("rint"),
        UnaryOp::Sigmoid if single => format!("1.0f / (1.0f + expf(-{x}))"),
        UnaryOp::Sigmoid => format!("1.0 / (1.0 + exp(-{x}))"),
        UnaryOp::Recip if single => format!("1.0f / {x}"),
        UnaryOp::Recip => format!("1.0 / {x}"),
        // NaN stays NaN: it is not below zero.
        UnaryOp::Relu => format!("({x} < 0 ? 0 : {x})"),
        UnaryOp::Not => format!("!{x}"),
    }
}

fn binary(op: BinaryOp, arg: DType, a: &str, b: &str) -> String {
    let single = matches!(arg, DType::F32 | DType::F16 | DType::BF16);
    match op {
        BinaryOp::Add => format!("{a} + {b}"),
        BinaryOp::Sub => format!("{a} - {b}"),
        BinaryOp::Mul => format!("{a} * {b}"),
        BinaryOp::Div if !arg.is_float() => format!("k_idiv((long long){a}, (long long){b})"),
        BinaryOp::Div => format!("{a} / {b}"),
        BinaryOp::Pow if single => format!("powf({a}, {b})"),
        BinaryOp::Pow => format!("pow((double){a}, (double){b})"),
        BinaryOp::Maximum if single => format!("k_maxf({a}, {b})"),
        BinaryOp::Maximum if arg == DType::F64 => format!("k_maxd({a}, {b})"),
        BinaryOp::Maximum => format!("({a} > {b} ? {a} : {b})"),
        BinaryOp::Minimum if single => format!("k_minf({a}, {b})"),
        BinaryOp::Minimum if arg == DType::F64 => format!("k_mind({a}, {b})"),
        BinaryOp::Minimum => format!("({a} < {b} ? {a} : {b})"),
        BinaryOp::Eq => format!("{a} == {b}"),
        BinaryOp::Ne => format!("{a} != {b}"),
        BinaryOp::Lt => format!("{a} < {b}"),
        BinaryOp::Le => format!("{a} <= {b}"),
        BinaryOp::Gt => format!("{a} > {b}"),
        BinaryOp::Ge => format!("{a} >= {b}"),
        BinaryOp::And => format!("({a} != 0) && ({b} != 0)"),
        BinaryOp::Or => format!("({a} != 0) || ({b} != 0)"),
        BinaryOp::Rem if single => format!("fmodf({a}, {b})"),
        BinaryOp::Rem if arg == DType::F64 => format!("fmod({a}, {b})"),
        BinaryOp::Rem => format!("k_irem((long long){a}, (long long){b})"),
        BinaryOp::BitAnd => format!("{a} & {b}"),
        BinaryOp::BitOr => format!("{a} | {b}"),
        BinaryOp::BitXor => format!("{a} ^ {b}"),
        BinaryOp::Shl => format!("k_shl((long long){a}, (long long){b})"),
        BinaryOp::Shr => format!("k_shr((long long){a}, (long long){b})"),
    }
}

/// The reference executor's conversion from `from` to `to`: a float becomes an `i64` as Rust's
/// `as` does (truncated, saturated, NaN to 0), and a narrower integer wraps from there, as do
/// integer-to-integer casts (C's conversions to `int` and `unsigned char` wrap).
fn cast(from: DType, to: DType, x: &str) -> String {
    match (from.is_float(), to) {
        (_, DType::Bool) => format!("{x} != 0"),
        // One rounding to 16 bits, not two (the result is rounded to `to` after the cast).
        (_, DType::F16 | DType::BF16) if from == DType::F64 => format!("k_d2f_odd({x})"),
        (true, t) if !t.is_float() => {
            format!("k_f2i((double){x})")
        }
        _ => x.to_string(),
    }
}

/// The CUDA type of four consecutive stored elements (16 bytes for 4-byte types), for the
/// dtypes the vector path handles.
fn vector4_type(d: DType) -> Option<&'static str> {
    match d {
        DType::F32 => Some("float4"),
        DType::I32 => Some("int4"),
        DType::F16 | DType::BF16 => Some("ushort4"),
        DType::U8 | DType::Bool => Some("uchar4"),
        DType::I8 => Some("char4"),
        DType::F64 | DType::I64 => None,
    }
}

/// Elementwise kernels walk their output with a grid-stride loop. When the whole domain is
/// one coalesced dimension and every input is read densely (stride 1) or as one value
/// (stride 0), the loop moves four elements per thread with vector loads and stores (16
/// bytes for `f32`) whenever every pointer is aligned for them at run time; the scalar loop
/// does the rest (or everything, for misaligned views).
fn elementwise(src: &mut String, kernel: &Kernel, walk: &Layout) {
    let (zero, one) = (Sz::Known(0), Sz::Known(1));
    let dense: Vec<bool> = walk.strides.iter().map(|s| s[0] == one).collect();
    let outputs: Vec<DType> = kernel.outputs.iter().map(|&o| kernel.exprs[o].dtype).collect();
    let vectorizable = walk.dims.len() == 1
        && walk.strides.iter().all(|s| s[0] == zero || s[0] == one)
        && kernel.inputs.iter().zip(&dense).all(|(x, &d)| !d || vector4_type(x.dtype).is_some())
        && outputs.iter().all(|&d| vector4_type(d).is_some());
    src.push_str("  long long start = 0;\n");
    if vectorizable {
        let mut aligned: Vec<String> = Vec::new();
        for (i, input) in kernel.inputs.iter().enumerate() {
            if dense[i] {
                let bytes = 4 * input.dtype.size_in_bytes();
                aligned.push(format!(
                    "((unsigned long long)(in{i} + {}) % {bytes}ULL == 0)",
                    num(walk.offsets[i])
                ));
            }
        }
        for (j, &d) in outputs.iter().enumerate() {
            aligned
                .push(format!("((unsigned long long)out{j} % {}ULL == 0)", 4 * d.size_in_bytes()));
        }
        let _ = writeln!(src, "  if ({}) {{", aligned.join(" && "));
        src.push_str("    long long n4 = n / 4;\n");
        src.push_str(
            "    for (long long q = (long long)blockIdx.x * blockDim.x + threadIdx.x; q < n4; q += (long long)gridDim.x * blockDim.x) {\n",
        );
        for (i, input) in kernel.inputs.iter().enumerate() {
            if dense[i] {
                let vt = vector4_type(input.dtype).expect("checked above");
                let _ = writeln!(
                    src,
                    "      const {vt} v{i} = *(const {vt}*)(in{i} + {} + 4 * q);",
                    num(walk.offsets[i])
                );
            }
        }
        for (j, &d) in outputs.iter().enumerate() {
            let _ = writeln!(src, "      {} r{j};", vector4_type(d).expect("checked above"));
        }
        for lane in ["x", "y", "z", "w"] {
            src.push_str("      {\n");
            let element = |i: usize| {
                if dense[i] {
                    format!("v{i}.{lane}")
                } else {
                    format!("in{i}[{}]", num(walk.offsets[i]))
                }
            };
            body_with(src, kernel, "        ", &element);
            for (j, &o) in kernel.outputs.iter().enumerate() {
                let _ = writeln!(
                    src,
                    "        r{j}.{lane} = {};",
                    store(kernel.exprs[o].dtype, &format!("e{o}"))
                );
            }
            src.push_str("      }\n");
        }
        for (j, &d) in outputs.iter().enumerate() {
            let vt = vector4_type(d).expect("checked above");
            let _ = writeln!(src, "      *({vt}*)(out{j} + 4 * q) = r{j};");
        }
        src.push_str("    }\n    start = n4 * 4;\n  }\n");
    }
    src.push_str(
        "  for (long long i = start + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {\n",
    );
    for (i, &off) in walk.offsets.iter().enumerate() {
        let _ = writeln!(src, "    long long o{i} = {};", num(off));
    }
    locate(src, walk, "i", 'o', "    ");
    body(src, kernel, "    ");
    for (i, &o) in kernel.outputs.iter().enumerate() {
        let _ =
            writeln!(src, "    out{i}[i] = {};", store(kernel.exprs[o].dtype, &format!("e{o}")));
    }
    src.push_str("  }\n");
}

/// Outputs below which a strided reduction still gives each output a block: with fewer, one
/// thread per output would leave most of the device idle.
const COLUMN_OUTPUTS: usize = 128;

/// Whether `kernel` is a reduction that runs one thread per output (see [`source`]'s
/// module docs): its reduced positions are not adjacent in memory in any input, and
/// neighbouring outputs are, in at least one. Launch those like elementwise kernels (a grid
/// over the outputs); the others take one block per output.
pub fn reduces_by_columns(kernel: &Kernel) -> bool {
    let Some(red) = kernel.reduce else { return false };
    let rank = kernel.shape.rank();
    let outputs: usize = kernel.shape.dims()[..red.kept].iter().product();
    let inner = coalesce(kernel, red.kept..rank);
    let outer = coalesce(kernel, 0..red.kept);
    let innermost = |w: &crate::walk::Walk, i: usize| w.strides[i].last().copied().unwrap_or(0);
    outputs >= COLUMN_OUTPUTS
        && (0..kernel.inputs.len()).all(|i| innermost(&inner, i) != 1)
        && (0..kernel.inputs.len()).any(|i| innermost(&outer, i) == 1)
}

/// Reductions whose rows are long and few are split: each row's positions are cut into
/// `chunks` (a launch argument) reduced by one block each into `part`, and a second entry
/// point ([`merge_name`]) combines each row's chunks. With one block per row, a sum over a
/// whole large tensor would run on one multiprocessor. Returns the dtype of `part`'s
/// elements (the accumulator's), or `None` for kernels that are not split.
pub fn split_partials(kernel: &Kernel) -> Option<DType> {
    let red = kernel.reduce?;
    let dims = kernel.shape.dims();
    let outputs: usize = dims[..red.kept].iter().product();
    let count: usize = dims[red.kept..].iter().product();
    let split_rows = outputs < COLUMN_OUTPUTS && count >= SPLIT_MIN_COUNT;
    if !(split_rows && !reduces_by_columns(kernel) || splits_columns(kernel)) {
        return None;
    }
    Some(match kernel.exprs[kernel.outputs[0]].dtype {
        DType::F16 | DType::BF16 => DType::F32,
        DType::Bool => DType::I32,
        d => d,
    })
}

/// The fewest reduced positions per row for which a reduction with few outputs is split.
const SPLIT_MIN_COUNT: usize = 1 << 14;

/// Whether `kernel` reduces by columns ([`reduces_by_columns`]) with too few outputs to fill
/// the device with one thread each, and columns long enough to cut: then a thread reduces
/// chunk `t / outputs` of column `t % outputs` into `part[t]`, and the merge entry point
/// ([`merge_name`]) gives each output a thread that combines its chunks in order. (A bias
/// gradient over 2048 rows of 128 features would otherwise run 128 threads, each walking
/// 2048 positions.)
pub fn splits_columns(kernel: &Kernel) -> bool {
    let Some(red) = kernel.reduce else { return false };
    let dims = kernel.shape.dims();
    let outputs: usize = dims[..red.kept].iter().product();
    let count: usize = dims[red.kept..].iter().product();
    reduces_by_columns(kernel) && outputs < COLUMN_SPLIT_OUTPUTS && count >= COLUMN_SPLIT_COUNT
}

/// Outputs from which a column reduction has enough threads without splitting.
const COLUMN_SPLIT_OUTPUTS: usize = 1 << 15;

/// The fewest positions per column for which a column reduction is split.
const COLUMN_SPLIT_COUNT: usize = 64;

/// The name of a split reduction's second entry point (see [`split_partials`]); its
/// arguments: `part`, the output, `chunks`, and the number of rows.
pub fn merge_name(kernel: &Kernel) -> String {
    format!("{}_merge", entry_name(kernel))
}

/// How a reduction combines: its accumulator's C type, identity and combining expression
/// (of `a` and `b`), and the stored form of the result `acc`.
pub(super) struct Combine {
    pub(super) acc: &'static str,
    pub(super) identity: String,
    pub(super) combine: String,
    pub(super) stored: String,
}

fn combine(op: ReduceOp, dtype: DType) -> Combine {
    // Bools reduce as integers (shuffles move 32 or 64 bits).
    let acc = if dtype == DType::Bool { "int" } else { compute_type(dtype) };
    let float = dtype.is_float();
    let single = matches!(dtype, DType::F32 | DType::F16 | DType::BF16);
    let (identity, combine) = match op {
        ReduceOp::Sum => ("0".to_string(), "a + b".to_string()),
        ReduceOp::Prod => ("1".to_string(), "a * b".to_string()),
        ReduceOp::Max if float => (
            if single { "-k_inff()".into() } else { "-k_infd()".into() },
            if single { "k_maxf(a, b)".into() } else { "k_maxd(a, b)".into() },
        ),
        ReduceOp::Min if float => (
            if single { "k_inff()".into() } else { "k_infd()".into() },
            if single { "k_minf(a, b)".into() } else { "k_mind(a, b)".into() },
        ),
        ReduceOp::Max => (int_bound(dtype, false), "(a > b ? a : b)".to_string()),
        ReduceOp::Min => (int_bound(dtype, true), "(a < b ? a : b)".to_string()),
        ReduceOp::ArgMax | ReduceOp::ArgMin => unreachable!("arg reductions are not kernels"),
        // The target has `fused_logsumexp: false`: the planner expands it.
        ReduceOp::LogSumExp => unreachable!("logsumexp reaches CUDA as max, exp, sum and log"),
    };
    let value = if dtype == DType::Bool { "(acc != 0)".to_string() } else { "acc".to_string() };
    Combine { acc, identity, combine, stored: store(dtype, &value) }
}

/// Combines every thread's `acc` across the block (warp shuffles, then the warps' results
/// through `partial`, a `__shared__` array of 32) and runs `finish` in thread 0 with the
/// block's result in `acc`.
pub(super) fn block_combine(src: &mut String, c: &Combine, finish: &str) {
    let Combine { acc, identity, combine, .. } = c;
    let _ = writeln!(
        src,
        "    for (int s = 16; s > 0; s >>= 1) {{ {acc} a = acc, b = __shfl_down_sync(0xffffffffu, acc, s); acc = {combine}; }}"
    );
    src.push_str("    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = acc;\n");
    src.push_str("    __syncthreads();\n");
    src.push_str("    if (threadIdx.x < 32) {\n");
    let _ = writeln!(
        src,
        "      acc = threadIdx.x < ((blockDim.x + 31) >> 5) ? partial[threadIdx.x] : ({acc})({identity});"
    );
    let _ = writeln!(
        src,
        "      for (int s = 16; s > 0; s >>= 1) {{ {acc} a = acc, b = __shfl_down_sync(0xffffffffu, acc, s); acc = {combine}; }}"
    );
    let _ = writeln!(src, "      if (threadIdx.x == 0) {finish}");
    src.push_str("    }\n    __syncthreads();\n");
}

fn reduction(src: &mut String, kernel: &Kernel, op: ReduceOp, [outer, inner]: [&Layout; 2]) {
    // Positions per row.
    let count = num(inner.numel);
    let out = kernel.outputs[0];
    let c = combine(op, kernel.exprs[out].dtype);
    let (acc, identity, comb, stored) = (c.acc, &c.identity, &c.combine, &c.stored);
    // Each output's row: its inputs' offsets, then its reduced positions `j` (from `first`,
    // by `step`, below `end`) combined into `acc`.
    let accumulate = |src: &mut String, first: &str, step: &str, end: &str| {
        for (i, &off) in outer.offsets.iter().enumerate() {
            let _ = writeln!(src, "    long long b{i} = {};", num(off));
        }
        locate(src, outer, "row", 'b', "    ");
        let _ = writeln!(src, "    {acc} acc = ({acc})({identity});");
        let _ = writeln!(src, "    for (long long j = {first}; j < {end}; j += {step}) {{");
        for i in 0..outer.offsets.len() {
            let _ = writeln!(src, "      long long o{i} = b{i};");
        }
        locate(src, inner, "j", 'o', "      ");
        body(src, kernel, "      ");
        // Outputs after the first store the reduced value itself at every domain position.
        for (k, &o) in kernel.outputs.iter().enumerate().skip(1) {
            let side = store(kernel.exprs[o].dtype, &format!("e{o}"));
            let _ = writeln!(src, "      out{k}[row * {count} + j] = {side};");
        }
        let _ = writeln!(src, "      {acc} a = acc, b = ({acc})e{out};");
        let _ = writeln!(src, "      acc = {comb};");
        src.push_str("    }\n");
    };
    let all = count.clone();
    if splits_columns(kernel) {
        // Thread `t` reduces chunk `t / outputs` of column `t % outputs` into `part[t]`, in
        // order; `n` is outputs times chunks.
        let outputs = num(outer.numel);
        let _ = writeln!(src, "  const long long per = ({count} + chunks - 1) / chunks;");
        let _ = writeln!(
            src,
            "  for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (long long)gridDim.x * blockDim.x) {{"
        );
        let _ = writeln!(
            src,
            "    long long row = t % {outputs}, lo = (t / {outputs}) * per, hi = lo + per < {count} ? lo + per : {count};"
        );
        accumulate(src, "lo", "1", "hi");
        src.push_str("    part[t] = acc;\n  }\n");
        return;
    }
    if reduces_by_columns(kernel) {
        // One thread per output, walking its reduced positions in order: a warp's loads are
        // neighbouring outputs, adjacent in memory.
        let _ = writeln!(
            src,
            "  for (long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x; row < n; row += (long long)gridDim.x * blockDim.x) {{"
        );
        accumulate(src, "0", "1", &all);
        let _ = writeln!(src, "    out0[row] = {stored};");
        src.push_str("  }\n");
        return;
    }
    let _ = writeln!(src, "  __shared__ {acc} partial[32];");
    if split_partials(kernel).is_some() {
        // Block `blk` reduces chunk `blk % chunks` of row `blk / chunks` into `part[blk]`.
        let _ = writeln!(src, "  const long long per = ({count} + chunks - 1) / chunks;");
        src.push_str("  for (long long blk = blockIdx.x; blk < n; blk += gridDim.x) {\n");
        let _ = writeln!(
            src,
            "    long long row = blk / chunks, lo = (blk % chunks) * per, hi = lo + per < {count} ? lo + per : {count};"
        );
        accumulate(src, "lo + threadIdx.x", "blockDim.x", "hi");
        block_combine(src, &c, "part[blk] = acc;");
    } else {
        let _ = writeln!(src, "  for (long long row = blockIdx.x; row < n; row += gridDim.x) {{");
        accumulate(src, "threadIdx.x", "blockDim.x", &all);
        block_combine(src, &c, &format!("out0[row] = {stored};"));
    }
    src.push_str("  }\n");
}

/// The second entry point of a split reduction: one block per row combines the row's
/// `chunks` partial results, in the same tree shape as a block's threads.
fn merge(src: &mut String, kernel: &Kernel, op: ReduceOp, part: DType, name: &str) {
    let dtype = kernel.exprs[kernel.outputs[0]].dtype;
    let c = combine(op, dtype);
    let (acc, identity, comb) = (c.acc, &c.identity, &c.combine);
    let _ = writeln!(
        src,
        "extern \"C\" __global__ void {name}(const {}* __restrict__ part, {}* __restrict__ out0, long long chunks, long long n) {{",
        compute_type(part),
        storage_type(dtype)
    );
    if splits_columns(kernel) {
        // A thread per output combines its column's chunks in order.
        let _ = writeln!(
            src,
            "  for (long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x; row < n; row += (long long)gridDim.x * blockDim.x) {{"
        );
        let _ = writeln!(src, "    {acc} acc = ({acc})({identity});");
        let _ = writeln!(
            src,
            "    for (long long j = 0; j < chunks; j++) {{ {acc} a = acc, b = ({acc})part[j * n + row]; acc = {comb}; }}"
        );
        let _ = writeln!(src, "    out0[row] = {};\n  }}\n}}", c.stored);
        return;
    }
    let _ = writeln!(src, "  __shared__ {acc} partial[32];");
    src.push_str("  for (long long row = blockIdx.x; row < n; row += gridDim.x) {\n");
    let _ = writeln!(src, "    {acc} acc = ({acc})({identity});");
    src.push_str("    for (long long j = threadIdx.x; j < chunks; j += blockDim.x) {\n");
    let _ = writeln!(src, "      {acc} a = acc, b = ({acc})part[row * chunks + j];");
    let _ = writeln!(src, "      acc = {comb};\n    }}");
    block_combine(src, &c, &format!("out0[row] = {};", c.stored));
    src.push_str("  }\n}\n");
}

/// The identity of an integer max (the type's minimum) or min (its maximum).
fn int_bound(d: DType, max: bool) -> String {
    match (d, max) {
        (DType::I64, false) => "(-9223372036854775807LL - 1)".into(),
        (DType::I64, true) => "9223372036854775807LL".into(),
        (DType::I32, false) => "(-2147483647 - 1)".into(),
        (DType::I32, true) => "2147483647".into(),
        (DType::U8, false) | (DType::Bool, false) => "0".into(),
        (DType::U8, true) => "255".into(),
        (DType::I8, false) => "(-127 - 1)".into(),
        (DType::I8, true) => "127".into(),
        (_, true) => "1".into(),
        _ => "0".into(),
    }
}
