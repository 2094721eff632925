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
//!
//! A long row that three members or more read (softmax's `x`: the maximum, the sum and the
//! division) is read from memory once: the first member keeps each thread's 16-byte pieces
//! of it in registers and the later ones take them from there (`RowCache`). Without that,
//! a row of 64 KB (16384 `f32`) has left the multiprocessor's cache by its third use, and
//! that member streams it from device memory again.

use std::fmt::Write as _;

use kiln_ir::DType;
use kiln_ir::kernel::Kernel;

use super::{block_combine, body_named, combine, compute_type, locate, storage_type, store};
use crate::walk::{Layout, Walk, coalesce};

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

/// One buffer of a group.
#[derive(Clone, Copy, Debug)]
pub struct GroupBuffer {
    /// Its elements' type.
    pub dtype: DType,
    /// Whether a member writes it (otherwise the group only reads it: an input from outside).
    pub written: bool,
}

/// A group's kernels over `rows` rows and the buffers they share.
pub struct RowProgram<'a> {
    /// The kernels, in the order they run on each row.
    pub members: Vec<RowMember<'a>>,
    /// The buffers, in argument order.
    pub buffers: Vec<GroupBuffer>,
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

/// The entry point's name in a group's [`source`]: `rows_` and a hash of the rest of the
/// source. Named for the code rather than the members (whose names hold their sizes), so
/// that groups that generate the same code at other sizes are one compile: a layer norm or
/// softmax over 17 rows or 48 reads the row count as an argument, and its source, when
/// the rows are one coalesced dimension, holds no size that depends on it.
pub fn entry_name(source: &str) -> Option<&str> {
    let start = source.find(" rows_")? + 1;
    let len = source[start..].find('(')?;
    Some(&source[start..start + len])
}

/// Stands for the entry point's name until the rest of the source is written.
const NAME: &str = "rows_@";

/// The CUDA C source of a group's kernel, to be launched with `threads` threads per block
/// (see [`threads`]; the register cache's loops are unrolled for that many), keeping shared
/// rows in at most `cache_registers` registers per thread (see [`CACHE_REGISTERS`]). Arguments, in
/// order: one pointer per buffer, member `m`'s parameters as `p{m}_{i}` (types from
/// [`super::param_types`]), then the number of rows. Launch a block per row (a grid-stride
/// loop covers the rest).
///
/// # Panics
/// When a member is [`unsupported`] over the program's rows, or `threads` is not a
/// multiple of 32 from 32 to 1024.
pub fn source(program: &RowProgram<'_>, threads: u32, cache_registers: usize) -> String {
    assert!(
        (32..=1024).contains(&threads) && threads.is_multiple_of(32),
        "a row group's block is a multiple of 32 threads up to 1024, not {threads}"
    );
    for member in &program.members {
        if let Some(why) = unsupported(member.kernel, program.rows) {
            panic!("kernel {} cannot join a row group: {why}", member.kernel.name());
        }
    }
    let cache = RowCache::plan(program, threads, cache_registers);
    let mut src = String::from(super::PRELUDE);
    let mut args: Vec<String> = program
        .buffers
        .iter()
        .enumerate()
        .map(|(b, buffer)| {
            let c = if buffer.written { "" } else { "const " };
            format!("{c}{}* __restrict__ g{b}", storage_type(buffer.dtype))
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
        "extern \"C\" __global__ void __launch_bounds__({}) {}({}) {{",
        cache.launch_bounds(),
        NAME,
        args.join(", ")
    );
    src.push_str("  for (long long row = blockIdx.x; row < n; row += gridDim.x) {\n");
    cache.emit_prologue(&mut src, program);
    let last = program.members.len().saturating_sub(1);
    for (m, member) in program.members.iter().enumerate() {
        let _ = writeln!(src, "    // member {m}");
        src.push_str("    {\n");
        emit_member(&mut src, program, m, &cache);
        src.push_str("    }\n");
        // A reduction ends at a barrier already; an elementwise member's values are read
        // by later members at other threads' positions.
        if member.kernel.reduce.is_none() && m < last {
            src.push_str("    __syncthreads();\n");
        }
    }
    src.push_str("  }\n}\n");
    let name = format!("rows_{:016x}", kiln_ir::kernel::fnv1a(src.as_bytes()));
    src.replacen(NAME, &name, 1)
}

/// Member `m`'s loop over row `row`'s positions `j`.
fn emit_member(src: &mut String, program: &RowProgram<'_>, m: usize, cache: &RowCache) {
    let member = &program.members[m];
    let kernel = member.kernel;
    let per_row = kernel.shape.numel() / program.rows;
    let (outer, inner) = walks(program, m);
    let ind = "      ";
    for (i, off) in outer.offsets.iter().enumerate() {
        let _ = writeln!(src, "{ind}long long b{i} = {off}LL;");
    }
    locate(src, &Layout::known(&outer), "row", 'b', ind);
    let reduced = kernel.reduce.map(|red| {
        let out = kernel.outputs[0];
        let c = combine(red.op, kernel.exprs[out].dtype);
        let _ = writeln!(src, "{ind}__shared__ {} partial[32];", c.acc);
        let _ = writeln!(src, "{ind}{} acc = ({})({});", c.acc, c.acc, c.identity);
        (out, c)
    });
    let stored = stored_outputs(kernel);
    let vector = vector_loop(kernel, &inner, per_row, &stored);
    if let Some(dense) = &vector {
        emit_vector_loop(src, program, m, dense, &stored, reduced.as_ref(), cache);
        let _ = writeln!(src, "{ind}}} else {{");
    }
    let _ =
        writeln!(src, "{ind}for (long long j = threadIdx.x; j < {per_row}LL; j += blockDim.x) {{");
    let body_ind = "        ";
    for i in 0..kernel.inputs.len() {
        let _ = writeln!(src, "{body_ind}long long o{i} = b{i};");
    }
    locate(src, &Layout::known(&inner), "j", 'o', body_ind);
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
/// condition, and the caller's scalar loop is its `else`. A member that takes part in the
/// register cache runs a loop unrolled to the cache's slots instead, under the group's
/// alignment flag (so that no member finds a slot its loader left empty).
fn emit_vector_loop(
    src: &mut String,
    program: &RowProgram<'_>,
    m: usize,
    dense: &[bool],
    stored: &[usize],
    reduced: Option<&(usize, super::Combine)>,
    cache: &RowCache,
) {
    let member = &program.members[m];
    let kernel = member.kernel;
    let per_row = kernel.shape.numel() / program.rows;
    let ind = "      ";
    let q_end = per_row / 4;
    let slots = cache.member_slots(m);
    let body_ind = match slots {
        Some(slots) => {
            let _ = writeln!(src, "{ind}if ({CACHE_FLAG}) {{");
            let _ = writeln!(src, "{ind}#pragma unroll");
            let _ = writeln!(src, "{ind}for (int k = 0; k < {slots}; ++k) {{");
            let _ =
                writeln!(src, "{ind}  const long long q = threadIdx.x + k * {}LL;", cache.threads);
            let _ = writeln!(src, "{ind}  if (q < {q_end}LL) {{");
            "          "
        }
        None => {
            let test = alignment_test(program, m, dense, stored);
            let _ = writeln!(src, "{ind}if ({test}) {{");
            let _ = writeln!(
                src,
                "{ind}for (long long q = threadIdx.x; q < {q_end}LL; q += blockDim.x) {{"
            );
            "        "
        }
    };
    for (i, input) in kernel.inputs.iter().enumerate().filter(|(i, _)| dense[*i]) {
        let vt = super::vector4_type(input.dtype).expect("checked by vector_loop");
        let g = member.inputs[i];
        let read = format!("*(const {vt}*)(g{g} + b{i} + 4 * q)");
        let _ = match cache.slot(m, Port::Input(i)) {
            Some((e, true)) => writeln!(src, "{body_ind}const {vt} v{i} = c{e}[k] = {read};"),
            Some((e, false)) => writeln!(src, "{body_ind}const {vt} v{i} = c{e}[k];"),
            None => writeln!(src, "{body_ind}const {vt} v{i} = {read};"),
        };
    }
    for &k in stored {
        let vt = super::vector4_type(kernel.exprs[kernel.outputs[k]].dtype).expect("checked");
        let _ = writeln!(src, "{body_ind}{vt} r{k};");
    }
    let lane_ind = format!("{body_ind}  ");
    for lane in ["x", "y", "z", "w"] {
        let _ = writeln!(src, "{body_ind}{{");
        let element = |i: usize| {
            let g = member.inputs[i];
            if dense[i] { format!("v{i}.{lane}") } else { format!("g{g}[b{i}]") }
        };
        let param = |i: usize| format!("p{m}_{i}");
        body_named(src, kernel, &lane_ind, &element, &param);
        for &k in stored {
            let o = kernel.outputs[k];
            let value = store(kernel.exprs[o].dtype, &format!("e{o}"));
            let _ = writeln!(src, "{lane_ind}r{k}.{lane} = {value};");
        }
        if let Some((out, c)) = reduced {
            let _ = writeln!(src, "{lane_ind}{} a = acc, b = ({})e{out};", c.acc, c.acc);
            let _ = writeln!(src, "{lane_ind}acc = {};", c.combine);
        }
        let _ = writeln!(src, "{body_ind}}}");
    }
    for &k in stored {
        let vt = super::vector4_type(kernel.exprs[kernel.outputs[k]].dtype).expect("checked");
        let g = member.outputs[k];
        let _ = writeln!(src, "{body_ind}*({vt}*)(g{g} + row * {per_row}LL + 4 * q) = r{k};");
        if let Some((e, _)) = cache.slot(m, Port::Output(k)) {
            let _ = writeln!(src, "{body_ind}c{e}[k] = r{k};");
        }
    }
    if slots.is_some() {
        let _ = writeln!(src, "{ind}  }}");
    }
    let _ = writeln!(src, "{ind}}}");
}

/// The condition under which member `m`'s 16-byte loads and stores are aligned on this row
/// (its offsets `b{i}` in scope).
fn alignment_test(program: &RowProgram<'_>, m: usize, dense: &[bool], stored: &[usize]) -> String {
    let member = &program.members[m];
    let kernel = member.kernel;
    let per_row = kernel.shape.numel() / program.rows;
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
    if aligned.is_empty() { "true".to_string() } else { aligned.join(" && ") }
}

/// A kernel's outputs stored at every position of the row: all but a reduction's first
/// (which is stored once per row).
fn stored_outputs(kernel: &Kernel) -> Vec<usize> {
    (usize::from(kernel.reduce.is_some())..kernel.outputs.len()).collect()
}

/// Member `m`'s walks: over the rows (the leading dimensions that multiply to the group's
/// rows, a reduction's kept ones) and along a row.
fn walks(program: &RowProgram<'_>, m: usize) -> (Walk, Walk) {
    let kernel = program.members[m].kernel;
    let row_dims = match kernel.reduce {
        Some(red) => red.kept,
        None => kernel.shape.leading_dims(program.rows).expect("checked by `unsupported`"),
    };
    (coalesce(kernel, 0..row_dims), coalesce(kernel, row_dims..kernel.shape.rank()))
}

/// The name of the flag that says every cache member's pointers are aligned on this row.
const CACHE_FLAG: &str = "cached_rows";

/// Registers per thread the cache takes by default: one row of 16384 `f32` with 512 threads
/// (eight 16-byte pieces per thread), which leaves room under the 64 that
/// `RowCache::launch_bounds` allows. On an H200, 64 was no faster than 32 on any row
/// (`benches/results/gpu-2026-11-27-cache/sweep.txt`).
pub const CACHE_REGISTERS: usize = 32;

/// One dense read or store of a buffer by a member's vector loop: two with the same key see
/// the same positions of every row in the same order. A row-major walk (each row the
/// `per_row` positions after the last) has one key whatever its dimensions coalesced to.
#[derive(Clone, PartialEq)]
struct Read {
    buffer: usize,
    dims: Vec<usize>,
    strides: Vec<i64>,
    offset: i64,
    per_row: usize,
}

impl Read {
    fn new(buffer: usize, outer: &Walk, i: usize, per_row: usize) -> Read {
        let (dims, strides, offset) =
            (outer.dims.clone(), outer.strides[i].clone(), outer.offsets[i]);
        let row_major = offset == 0
            && (dims.iter().product::<usize>() <= 1
                || (dims.len() == 1 && strides[0] == per_row as i64));
        if row_major {
            return Read::row_major(buffer, per_row);
        }
        Read { buffer, dims, strides, offset, per_row }
    }

    /// Where a member's stored output puts row `row`'s positions.
    fn row_major(buffer: usize, per_row: usize) -> Read {
        Read { buffer, dims: Vec::new(), strides: Vec::new(), offset: 0, per_row }
    }
}

/// The shortest row (in bytes) a buffer's third use is worth registers for. An H200 keeps about 528
/// rows in flight (132 multiprocessors, four blocks of 512 threads each); 64 KiB rows
/// (16384 `f32`) add up to 34 MB between a row's uses, which its 50 MB cache does not hold
/// once the other members' traffic is added, and the cache took log-softmax from 0.88 to
/// 0.73 ms; 32 KiB rows (16384 `bf16`) are found in the cache, and keeping them in
/// registers made softmax slower (0.62 to 0.81 ms). The bound lies between the two.
const CACHE_MIN_ROW_BYTES: usize = 48 * 1024;

/// A cached buffer.
struct Entry {
    read: Read,
    /// The vector type of its pieces.
    vt: &'static str,
    /// Pieces per thread.
    slots: usize,
}

/// A member's input or output.
#[derive(Clone, Copy, PartialEq)]
enum Port {
    Input(usize),
    Output(usize),
}

/// The group's register cache: buffers of long rows that three members or more read densely
/// (or one stores and later ones read), each thread keeping its vector pieces of the row
/// (`slots` of them) in an array the unrolled loops index by constants. The first member
/// that touches a cached buffer fills the array (loading it, or as it stores it); the others
/// read the array.
struct RowCache {
    threads: u32,
    entries: Vec<Entry>,
    /// (member, port, entry, whether this use fills it).
    uses: Vec<(usize, Port, usize, bool)>,
}

impl RowCache {
    fn plan(program: &RowProgram<'_>, threads: u32, budget: usize) -> RowCache {
        // A buffer the group writes is read only by members after its writer: its first
        // use is the store when that is a candidate, a load from memory otherwise.
        let mut candidates: Vec<(usize, Port, Read, DType)> = Vec::new();
        for (m, member) in program.members.iter().enumerate() {
            let kernel = member.kernel;
            let per_row = kernel.shape.numel() / program.rows;
            let (outer, inner) = walks(program, m);
            let stored = stored_outputs(kernel);
            let Some(dense) = vector_loop(kernel, &inner, per_row, &stored) else { continue };
            for (i, &g) in member.inputs.iter().enumerate().filter(|(i, _)| dense[*i]) {
                let read = Read::new(g, &outer, i, per_row);
                candidates.push((m, Port::Input(i), read, kernel.inputs[i].dtype));
            }
            for &k in &stored {
                let read = Read::row_major(member.outputs[k], per_row);
                let dtype = kernel.exprs[kernel.outputs[k]].dtype;
                candidates.push((m, Port::Output(k), read, dtype));
            }
        }
        let mut cache = RowCache { threads, entries: Vec::new(), uses: Vec::new() };
        // Worth registers: a buffer used by three members or more, when its rows are long
        // (by the third use, a long row has left the multiprocessor's cache; a second use
        // right after the first finds it there, and the registers would cost occupancy).
        let mut registers = 0;
        for (_, _, read, dtype) in &candidates {
            if cache.entries.iter().any(|e| e.read == *read) {
                continue;
            }
            let mut users: Vec<usize> =
                candidates.iter().filter(|c| c.2 == *read).map(|c| c.0).collect();
            users.dedup();
            let row_bytes = read.per_row * dtype.size_in_bytes();
            let slots = (read.per_row / 4).div_ceil(threads as usize);
            // A piece is four elements: 4 bytes of registers per byte of the dtype.
            let cost = slots * dtype.size_in_bytes();
            if users.len() >= 3 && row_bytes >= CACHE_MIN_ROW_BYTES && registers + cost <= budget {
                registers += cost;
                let vt = super::vector4_type(*dtype).expect("a vector loop's buffer");
                cache.entries.push(Entry { read: read.clone(), vt, slots });
            }
        }
        for (m, port, read, _) in candidates {
            if let Some(e) = cache.entries.iter().position(|entry| entry.read == read) {
                let fills = !cache.uses.iter().any(|&(_, _, f, _)| f == e);
                cache.uses.push((m, port, e, fills));
            }
        }
        cache
    }

    /// The kernel's `__launch_bounds__`: its threads per block and, with a cache, at least
    /// 1024 threads resident per multiprocessor, so that the compiler keeps each thread to
    /// 64 registers. Without that bound an H200 ran a softmax group with its input in
    /// registers once per multiprocessor, and slower than with no cache (1.16 against 0.89
    /// ms at 16384²; 0.77 with the bound).
    fn launch_bounds(&self) -> String {
        match self.entries.is_empty() {
            true => self.threads.to_string(),
            false => format!("{}, {}", self.threads, (1024 / self.threads).max(1)),
        }
    }

    /// Member `m`'s unrolled slots when it uses a cached buffer.
    fn member_slots(&self, m: usize) -> Option<usize> {
        let &(_, _, e, _) = self.uses.iter().find(|u| u.0 == m)?;
        Some(self.entries[e].slots)
    }

    /// The entry member `m`'s `port` uses, and whether it fills it.
    fn slot(&self, m: usize, port: Port) -> Option<(usize, bool)> {
        self.uses.iter().find(|u| u.0 == m && u.1 == port).map(|&(_, _, e, fills)| (e, fills))
    }

    /// The row's cache arrays and the flag that every member taking part may use its vector
    /// loop on this row (each computes its own offsets, in a scope of its own).
    fn emit_prologue(&self, src: &mut String, program: &RowProgram<'_>) {
        if self.entries.is_empty() {
            return;
        }
        for (e, Entry { vt, slots, .. }) in self.entries.iter().enumerate() {
            let _ = writeln!(src, "    {vt} c{e}[{slots}];");
        }
        let _ = writeln!(src, "    bool {CACHE_FLAG} = true;");
        let mut members: Vec<usize> = self.uses.iter().map(|u| u.0).collect();
        members.dedup();
        for m in members {
            let kernel = program.members[m].kernel;
            let per_row = kernel.shape.numel() / program.rows;
            let (outer, inner) = walks(program, m);
            let stored = stored_outputs(kernel);
            let dense = vector_loop(kernel, &inner, per_row, &stored).expect("a cache member");
            src.push_str("    {\n");
            for (i, off) in outer.offsets.iter().enumerate() {
                let _ = writeln!(src, "      long long b{i} = {off}LL;");
            }
            locate(src, &Layout::known(&outer), "row", 'b', "      ");
            let test = alignment_test(program, m, &dense, &stored);
            let _ = writeln!(src, "      {CACHE_FLAG} = {CACHE_FLAG} && {test};");
            src.push_str("    }\n");
        }
    }
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
