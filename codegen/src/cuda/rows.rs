//! Row groups on a GPU: consecutive kernels that each work on the same rows, as one kernel.
//!
//! A row softmax is three kernels over a `[rows, n]` tensor (the row maxima, the sum of
//! `exp(x - max)`, the division); launched one after another, each streams the whole tensor
//! from device memory, and each launch costs its own few microseconds. But row `r` of each
//! kernel reads only row `r` of what the kernels before it wrote, so one block can run the
//! three on its row in turn: the row is read from memory once and found in the
//! multiprocessor's cache by the members after the first, a reduction's result reaches the
//! members after it through a barrier, and the group is one launch. Log-softmax,
//! cross-entropy and its gradient, and layer norm and its gradients have the same shape.
//!
//! Which kernels form a group is the runtime's decision (it knows which buffers only the
//! group reads); this module writes the kernel. Every member loops over its row's positions
//! with the block's threads; a reduction member combines across the block as a lone
//! reduction kernel does and ends at a barrier, an elementwise member that a later member
//! reads ends at one. Each buffer of the group is one argument, so a buffer one member
//! writes and another reads is never seen through two `__restrict__` pointers.

use std::fmt::Write as _;

use kiln_ir::DType;
use kiln_ir::kernel::Kernel;

use super::{block_combine, body_named, combine, compute_type, locate, storage_type, store};
use crate::walk::coalesce;

/// One kernel of a group, with the group buffer each of its inputs reads and each of its
/// outputs writes (indices into [`RowProgram::buffers`]).
pub struct RowMember<'a> {
    /// The member's kernel.
    pub kernel: &'a Kernel,
    /// The buffer each of the kernel's inputs reads.
    pub inputs: Vec<usize>,
    /// The buffer each of the kernel's outputs writes.
    pub outputs: Vec<usize>,
}

/// A group's kernels over `rows` rows and the buffers they share.
pub struct RowProgram<'a> {
    /// The kernels, in the order they run on each row.
    pub members: Vec<RowMember<'a>>,
    /// Each buffer's dtype, and whether a member writes it (otherwise the group only reads
    /// it: an input from outside).
    pub buffers: Vec<(DType, bool)>,
    /// How many rows every member's domain is cut into.
    pub rows: usize,
}

/// Why kernels cannot be a row group's members, or `None` when they can: every reduction
/// has one output per row, reduces positions adjacent in memory (not columns) and is not
/// split; every member's domain is `rows` rows.
pub fn unsupported(kernel: &Kernel, rows: usize) -> Option<&'static str> {
    let numel = kernel.shape.numel();
    if rows == 0 || numel == 0 || !numel.is_multiple_of(rows) {
        return Some("its domain is not whole rows");
    }
    let Some(red) = kernel.reduce else {
        return kernel
            .shape
            .leading_dims(rows)
            .is_none()
            .then_some("its leading dimensions do not multiply to the rows");
    };
    let outputs: usize = kernel.shape.dims()[..red.kept].iter().product();
    if outputs != rows {
        Some("a reduction with more than one output per row")
    } else if super::reduces_by_columns(kernel) || super::split_partials(kernel).is_some() {
        Some("a reduction by columns or split across blocks")
    } else {
        None
    }
}

/// Threads per block of a group's kernel: one per four positions of its longest row (the
/// vector loops move four at a time), a multiple of 32, up to `most` (a multiple of 32, at
/// most 1024). A row of 128 gets one warp, so that short rows (a small model's layer norm)
/// do not leave three quarters of a block idle.
pub fn threads(program: &RowProgram<'_>, most: u32) -> u32 {
    let longest = program
        .members
        .iter()
        .map(|m| m.kernel.shape.numel() / program.rows.max(1))
        .max()
        .unwrap_or(1);
    (longest.div_ceil(4).div_ceil(32) * 32).clamp(32, most.clamp(32, 1024) as usize) as u32
}

/// The entry point's name: its members' names, in order.
pub fn entry_name(program: &RowProgram<'_>) -> String {
    let names: Vec<String> = program.members.iter().map(|m| m.kernel.name()).collect();
    format!("rows_{}", names.join("_"))
}

/// The CUDA C source of a group's kernel. Arguments, in order: one pointer per buffer,
/// member `m`'s parameters as `p{m}_{i}` (types from [`super::param_types`]), then the
/// number of rows. Launch a block per row (a grid-stride loop covers the rest) with any
/// multiple of 32 threads up to 1024 (see [`threads`]).
///
/// # Panics
/// When a member is [`unsupported`] over the program's rows.
pub fn source(program: &RowProgram<'_>) -> String {
    let mut src = String::from(super::PRELUDE);
    let mut args: Vec<String> = program
        .buffers
        .iter()
        .enumerate()
        .map(|(b, &(d, written))| {
            let c = if written { "" } else { "const " };
            format!("{c}{}* __restrict__ g{b}", storage_type(d))
        })
        .collect();
    for (m, member) in program.members.iter().enumerate() {
        for (i, t) in super::param_types(member.kernel).into_iter().enumerate() {
            args.push(format!("{} p{m}_{i}", compute_type(t)));
        }
    }
    args.push("long long n".into());
    let _ = writeln!(
        src,
        "extern \"C\" __global__ void {}({}) {{",
        entry_name(program),
        args.join(", ")
    );
    src.push_str("  for (long long row = blockIdx.x; row < n; row += gridDim.x) {\n");
    let last = program.members.len().saturating_sub(1);
    for (m, member) in program.members.iter().enumerate() {
        if let Some(why) = unsupported(member.kernel, program.rows) {
            panic!("kernel {} cannot join a row group: {why}", member.kernel.name());
        }
        let _ = writeln!(src, "    // {}", member.kernel.name());
        src.push_str("    {\n");
        emit_member(&mut src, program, m);
        src.push_str("    }\n");
        // A reduction ends at a barrier already; an elementwise member's values are read
        // by later members at other threads' positions.
        if member.kernel.reduce.is_none() && m < last {
            src.push_str("    __syncthreads();\n");
        }
    }
    src.push_str("  }\n}\n");
    src
}

/// Member `m`'s loop over row `row`'s positions `j`.
fn emit_member(src: &mut String, program: &RowProgram<'_>, m: usize) {
    let member = &program.members[m];
    let kernel = member.kernel;
    let rank = kernel.shape.rank();
    let per_row = kernel.shape.numel() / program.rows;
    // The row is the leading dimensions that multiply to `rows` (a reduction's kept ones).
    let row_dims = match kernel.reduce {
        Some(red) => red.kept,
        None => kernel.shape.leading_dims(program.rows).expect("checked by the caller"),
    };
    let outer = coalesce(kernel, 0..row_dims);
    let inner = coalesce(kernel, row_dims..rank);
    let ind = "      ";
    for (i, off) in outer.offsets.iter().enumerate() {
        let _ = writeln!(src, "{ind}long long b{i} = {off}LL;");
    }
    locate(src, &outer, "row", 'b', ind);
    let reduced = kernel.reduce.map(|red| {
        let out = kernel.outputs[0];
        let c = combine(red.op, kernel.exprs[out].dtype);
        let _ = writeln!(src, "{ind}__shared__ {} partial[32];", c.acc);
        let _ = writeln!(src, "{ind}{} acc = ({})({});", c.acc, c.acc, c.identity);
        (out, c)
    });
    let stored: Vec<usize> = (usize::from(reduced.is_some())..kernel.outputs.len()).collect();
    let vector = vector_loop(kernel, &inner, per_row, &stored);
    if let Some(dense) = &vector {
        emit_vector_loop(src, program, m, dense, &stored, reduced.as_ref());
        let _ = writeln!(src, "{ind}}} else {{");
    }
    let _ =
        writeln!(src, "{ind}for (long long j = threadIdx.x; j < {per_row}LL; j += blockDim.x) {{");
    let body_ind = "        ";
    for i in 0..kernel.inputs.len() {
        let _ = writeln!(src, "{body_ind}long long o{i} = b{i};");
    }
    locate(src, &inner, "j", 'o', body_ind);
    let element = |i: usize| format!("g{}[o{i}]", member.inputs[i]);
    let param = |i: usize| format!("p{m}_{i}");
    body_named(src, kernel, body_ind, &element, &param);
    // A reduction's outputs after the first, and every elementwise output, are stored at
    // every position of the row.
    for &k in &stored {
        let o = kernel.outputs[k];
        let value = store(kernel.exprs[o].dtype, &format!("e{o}"));
        let _ = writeln!(src, "{body_ind}g{}[row * {per_row}LL + j] = {value};", member.outputs[k]);
    }
    if let Some((out, c)) = &reduced {
        let _ = writeln!(src, "{body_ind}{} a = acc, b = ({})e{out};", c.acc, c.acc);
        let _ = writeln!(src, "{body_ind}acc = {};", c.combine);
    }
    let _ = writeln!(src, "{ind}}}");
    if vector.is_some() {
        let _ = writeln!(src, "{ind}}}");
    }
    if let Some((_, c)) = &reduced {
        let finish = format!("g{}[row] = {};", member.outputs[0], c.stored);
        block_combine(src, c, &finish);
    }
}

/// Member `m`'s loop over four positions per thread with 16-byte loads and stores (see
/// [`vector_loop`]), taken when this row's pointers are aligned for them; it opens the
/// condition, and the caller's scalar loop is its `else`.
fn emit_vector_loop(
    src: &mut String,
    program: &RowProgram<'_>,
    m: usize,
    dense: &[bool],
    stored: &[usize],
    reduced: Option<&(usize, super::Combine)>,
) {
    let member = &program.members[m];
    let kernel = member.kernel;
    let per_row = kernel.shape.numel() / program.rows;
    let (ind, body_ind) = ("      ", "        ");
    // Four positions per thread with 16-byte loads and stores, when this row's pointers
    // are aligned for them.
    let mut aligned: Vec<String> = Vec::new();
    for (i, input) in kernel.inputs.iter().enumerate().filter(|(i, _)| dense[*i]) {
        let bytes = 4 * input.dtype.size_in_bytes();
        let g = member.inputs[i];
        aligned.push(format!("((unsigned long long)(g{g} + b{i}) % {bytes}ULL == 0)"));
    }
    for &k in stored {
        let bytes = 4 * kernel.exprs[kernel.outputs[k]].dtype.size_in_bytes();
        let g = member.outputs[k];
        aligned.push(format!("((unsigned long long)(g{g} + row * {per_row}LL) % {bytes}ULL == 0)"));
    }
    let test = if aligned.is_empty() { "true".to_string() } else { aligned.join(" && ") };
    let _ = writeln!(src, "{ind}if ({test}) {{");
    let q_end = per_row / 4;
    let _ =
        writeln!(src, "{ind}for (long long q = threadIdx.x; q < {q_end}LL; q += blockDim.x) {{");
    for (i, input) in kernel.inputs.iter().enumerate().filter(|(i, _)| dense[*i]) {
        let vt = super::vector4_type(input.dtype).expect("checked by vector_loop");
        let g = member.inputs[i];
        let _ = writeln!(src, "{body_ind}const {vt} v{i} = *(const {vt}*)(g{g} + b{i} + 4 * q);");
    }
    for &k in stored {
        let vt = super::vector4_type(kernel.exprs[kernel.outputs[k]].dtype).expect("checked");
        let _ = writeln!(src, "{body_ind}{vt} r{k};");
    }
    for lane in ["x", "y", "z", "w"] {
        let _ = writeln!(src, "{body_ind}{{");
        let element = |i: usize| {
            let g = member.inputs[i];
            if dense[i] { format!("v{i}.{lane}") } else { format!("g{g}[b{i}]") }
        };
        let param = |i: usize| format!("p{m}_{i}");
        body_named(src, kernel, "          ", &element, &param);
        for &k in stored {
            let o = kernel.outputs[k];
            let value = store(kernel.exprs[o].dtype, &format!("e{o}"));
            let _ = writeln!(src, "          r{k}.{lane} = {value};");
        }
        if let Some((out, c)) = reduced {
            let _ = writeln!(src, "          {} a = acc, b = ({})e{out};", c.acc, c.acc);
            let _ = writeln!(src, "          acc = {};", c.combine);
        }
        let _ = writeln!(src, "{body_ind}}}");
    }
    for &k in stored {
        let vt = super::vector4_type(kernel.exprs[kernel.outputs[k]].dtype).expect("checked");
        let g = member.outputs[k];
        let _ = writeln!(src, "{body_ind}*({vt}*)(g{g} + row * {per_row}LL + 4 * q) = r{k};");
    }
    let _ = writeln!(src, "{ind}}}");
}

/// Which inputs a member's loop over a row reads densely (stride 1; the others read one value
/// per row, stride 0), when it can move four positions per thread: the row is one coalesced
/// dimension of a multiple of 4 positions, and every dense input and stored output has a
/// 16-byte vector type. `None` otherwise.
fn vector_loop(
    kernel: &Kernel,
    inner: &crate::walk::Walk,
    per_row: usize,
    stored: &[usize],
) -> Option<Vec<bool>> {
    if inner.dims.len() != 1 || !per_row.is_multiple_of(4) {
        return None;
    }
    let dense: Vec<bool> = inner.strides.iter().map(|s| s[0] == 1).collect();
    let ok = inner.strides.iter().all(|s| s[0] == 0 || s[0] == 1)
        && kernel
            .inputs
            .iter()
            .zip(&dense)
            .all(|(x, &d)| !d || super::vector4_type(x.dtype).is_some())
        && stored
            .iter()
            .all(|&k| super::vector4_type(kernel.exprs[kernel.outputs[k]].dtype).is_some());
    ok.then_some(dense)
}
