//! The CPU back end: a [`Kernel`] lowered to Cranelift IR and compiled to machine code.
//!
//! The generated function has the signature
//! `extern "C" fn(bufs: *const *mut u8, params: *const u64, start: u64, end: u64)` and computes
//! the flat output positions `start..end` of the kernel's domain, so the runtime can split a
//! kernel across threads. `bufs` holds the input pointers, then the output pointers.
//!
//! The domain is first *coalesced*: dimensions of size 1 are dropped and neighbours that every
//! input walks contiguously are merged, so that a dense tensor is one long row. Each row
//! computes its inputs' base addresses once (a division per row, not per element), then runs
//! an inner loop: four `f32` (or two `f64`) lanes at a time when every value of the kernel is
//! of one float type and every input is contiguous or broadcast along the row, followed by a
//! scalar tail (and the scalar loop alone otherwise).
//!
//! Values compute in registers of their dtype's width: `f32` and `f64` as such, `f16` and
//! `bf16` as `f32` rounded back after every op (so results equal the reference executor's),
//! integers as `i64` wrapped to their width after every op, bools as `i8`. Functions without
//! a Cranelift instruction (`exp`, `log`, `tanh`, `sin`, `cos`, `pow`, `erf`, `sigmoid`) call
//! the f64 functions of Rust's standard library, correctly rounded to the dtype afterwards.

mod helpers;
mod math;

use std::collections::HashMap;

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    AbiParam, BlockArg, InstBuilder, MemFlagsData, StackSlotData, StackSlotKind, Type,
    UserFuncName, Value, types,
};
use cranelift_codegen::isa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{Linkage, Module, default_libcall_names};
use kiln_ir::kernel::{ExprKind, Kernel, KernelReduce};
use kiln_ir::{BinaryOp, DType, ReduceOp, UnaryOp};

use crate::CodegenError;

/// The entry point of a compiled kernel.
pub type Entry = unsafe extern "C" fn(*const *mut u8, *const u64, u64, u64);

/// A compiled kernel: its machine code (owned by its own JIT module, so that the cache can
/// drop kernels one by one) and its text.
pub struct CpuKernel {
    module: Option<JITModule>,
    entry: Entry,
    clif: String,
    vectorized: bool,
    min_chunk: usize,
}

/// Outputs per block of a reduction vectorized across its outputs (a sum over rows, whose
/// neighbouring outputs read neighbouring elements): the block's f64 accumulators live in an
/// 8 KiB stack slot, in L1, while the kernel streams the input one row segment of the block
/// (4 KiB of f32, a page) at a time.
pub const COLUMN_BLOCK: usize = 1024;

// SAFETY: the module's code is immutable once finalized and the entry point is a plain
// function pointer; sharing them across threads is what running a kernel in parallel does.
unsafe impl Send for CpuKernel {}
// SAFETY: as above.
unsafe impl Sync for CpuKernel {}

impl CpuKernel {
    /// The fewest output positions a parallel task should take: a reduction vectorized
    /// across its outputs works in blocks of [`COLUMN_BLOCK`] of them, and smaller tasks
    /// would waste its vector lanes and cache lines.
    pub fn min_chunk(&self) -> usize {
        self.min_chunk
    }

    /// The entry point; see the module docs for its contract.
    pub fn entry(&self) -> Entry {
        self.entry
    }

    /// The Cranelift IR of the kernel, as text.
    pub fn clif(&self) -> &str {
        &self.clif
    }

    /// Whether the inner loop runs on SIMD vectors.
    pub fn vectorized(&self) -> bool {
        self.vectorized
    }
}

impl Drop for CpuKernel {
    fn drop(&mut self) {
        if let Some(module) = self.module.take() {
            // SAFETY: the only pointer into this module's code is `entry`, which dies with
            // `self`; no call can be running since callers borrow `self` while calling.
            unsafe { module.free_memory() };
        }
    }
}

/// The layout the generated loops walk: coalesced dimensions (row-major, the last is the
/// row) and each input's strides over them, in elements.
#[derive(Debug)]
pub(crate) struct Walk {
    pub(crate) dims: Vec<usize>,
    pub(crate) strides: Vec<Vec<i64>>,
    pub(crate) offsets: Vec<i64>,
}

pub(crate) fn coalesce(kernel: &Kernel, range: std::ops::Range<usize>) -> Walk {
    let mut dims: Vec<usize> = Vec::new();
    let mut strides: Vec<Vec<i64>> = vec![Vec::new(); kernel.inputs.len()];
    for d in range {
        let size = kernel.shape.dims()[d];
        if size == 1 {
            continue;
        }
        let mergeable = !dims.is_empty()
            && kernel.inputs.iter().zip(&strides).all(|(input, s)| {
                let inner = input.view.strides()[d] as i64;
                *s.last().expect("dims is not empty") == inner * size as i64
            });
        if mergeable {
            *dims.last_mut().expect("dims is not empty") *= size;
            for (input, s) in kernel.inputs.iter().zip(strides.iter_mut()) {
                *s.last_mut().expect("dims is not empty") = input.view.strides()[d] as i64;
            }
        } else {
            dims.push(size);
            for (input, s) in kernel.inputs.iter().zip(strides.iter_mut()) {
                s.push(input.view.strides()[d] as i64);
            }
        }
    }
    if dims.is_empty() {
        dims.push(1);
        strides.iter_mut().for_each(|s| s.push(0));
    }
    let offsets = kernel.inputs.iter().map(|i| i.view.offset() as i64).collect();
    Walk { dims, strides, offsets }
}

/// How a kernel's values are held in registers.
fn scalar_type(dtype: DType) -> Type {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => types::F32,
        DType::F64 => types::F64,
        DType::I64 | DType::I32 | DType::U8 => types::I64,
        DType::Bool => types::I8,
    }
}

/// The lane type when the whole kernel can run on vectors of one float type along its row
/// (every input contiguous or broadcast along the walk's innermost dimension).
fn vector_type(kernel: &Kernel, walk: &Walk) -> Option<(DType, Type)> {
    let inner_ok = walk.strides.iter().all(|s| matches!(s.last(), Some(0 | 1)));
    lane_type(kernel).filter(|_| inner_ok)
}

/// The lanes of a reduction that vectorizes across its outputs instead: its reduced walk
/// is strided (a sum over rows, `x.sum_dim(0)`), but neighbouring outputs read neighbouring
/// elements of every input.
fn column_type(kernel: &Kernel, walk: &Walk, outer: &Walk) -> Option<(DType, Type)> {
    if kernel.reduce.is_none() || kernel.outputs.len() != 1 || vector_type(kernel, walk).is_some() {
        return None;
    }
    let (float, lanes) = lane_type(kernel)?;
    let across_ok = outer.strides.iter().all(|s| matches!(s.last(), Some(0 | 1)));
    let wide = *outer.dims.last().expect("a dimension") >= lanes.lane_count() as usize;
    (across_ok && wide).then_some((float, lanes))
}

/// Rows a task of a strip-walking kernel should cover: a cache line of an input read across
/// rows serves this many of them.
pub const STRIP_ROWS: usize = 16;

/// The strip width for an elementwise kernel that reads an input across its rows (a
/// transposed view: innermost stride neither 0 nor 1, but 1 along another dimension) over
/// rows long enough to strip; `None` for kernels that walk rows in order.
fn strip_width(kernel: &Kernel, walk: &Walk) -> Option<usize> {
    const STRIP: usize = 64;
    let inner = *walk.dims.last()?;
    let crosses = walk.strides.iter().any(|s| {
        let last = *s.last().expect("a dimension");
        last != 0 && last != 1 && s[..s.len() - 1].contains(&1)
    });
    (walk.dims.len() >= 2 && inner > STRIP && crosses && kernel.reduce.is_none()).then_some(STRIP)
}

/// The lane type when every value of the kernel is of one float type that vectorizes.
fn lane_type(kernel: &Kernel) -> Option<(DType, Type)> {
    let float =
        kernel.inputs.first().map(|i| i.dtype).or_else(|| kernel.exprs.first().map(|e| e.dtype))?;
    let lanes = match float {
        DType::F32 => types::F32X4,
        DType::F64 => types::F64X2,
        _ => return None,
    };
    let inputs_ok = kernel.inputs.iter().all(|i| i.dtype == float);
    let exprs_ok = kernel.exprs.iter().all(|e| match e.kind {
        ExprKind::Load(_) | ExprKind::Param(_) => e.dtype == float,
        ExprKind::Unary(op, _) => match op {
            UnaryOp::Not => e.dtype == DType::Bool,
            UnaryOp::Neg
            | UnaryOp::Abs
            | UnaryOp::Sqrt
            | UnaryOp::Relu
            | UnaryOp::Recip
            | UnaryOp::Floor
            | UnaryOp::Ceil
            | UnaryOp::Round => e.dtype == float,
            UnaryOp::Exp
            | UnaryOp::Tanh
            | UnaryOp::Sigmoid
            | UnaryOp::Erf
            | UnaryOp::Log
            | UnaryOp::Sin
            | UnaryOp::Cos => e.dtype == DType::F32 && float == DType::F32,
        },
        ExprKind::Binary(op, a, _) => {
            let arg = kernel.exprs[a].dtype;
            match op {
                BinaryOp::Add
                | BinaryOp::Sub
                | BinaryOp::Mul
                | BinaryOp::Div
                | BinaryOp::Maximum
                | BinaryOp::Minimum => e.dtype == float,
                BinaryOp::And | BinaryOp::Or => arg == DType::Bool,
                BinaryOp::Pow => e.dtype == DType::F32,
                _ => arg == float,
            }
        }
        ExprKind::Where(_, a, _) => kernel.exprs[a].dtype == float,
        ExprKind::Cast(_) => false,
    });
    let outputs_ok = kernel.outputs.iter().all(|&o| kernel.exprs[o].dtype == float);
    (inputs_ok && exprs_ok && outputs_ok).then_some((float, lanes))
}

fn flags() -> MemFlagsData {
    MemFlagsData::trusted()
}

/// The 64-bit parameter slots a kernel's entry point reads: for each parameter, the bits of
/// an f64 when the kernel uses it as a float, of an i64 otherwise.
pub fn param_slots(kernel: &Kernel, values: &[kiln_ir::Scalar]) -> Vec<u64> {
    values
        .iter()
        .enumerate()
        .map(|(p, v)| {
            let float =
                kernel.exprs.iter().any(|e| e.kind == ExprKind::Param(p) && e.dtype.is_float());
            if float { v.to_f64().to_bits() } else { v.to_i64() as u64 }
        })
        .collect()
}

/// Compiles `kernel` for the host CPU.
///
/// # Errors
/// [`CodegenError::Cranelift`] if Cranelift rejects the generated function (a bug in this
/// module) or the host is not supported.
pub fn compile(kernel: &Kernel) -> Result<CpuKernel, CodegenError> {
    let isa = host_isa()?;
    let fma = has_fma(&*isa);
    let mut builder = JITBuilder::with_isa(isa, default_libcall_names());
    for (name, ptr) in helpers::symbols() {
        builder.symbol(name, ptr);
    }
    let mut module = JITModule::new(builder);
    let mut ctx = module.make_context();
    let mut fctx = FunctionBuilderContext::new();

    let ptr = module.target_config().pointer_type();
    let mut sig = module.make_signature();
    sig.params.extend([
        AbiParam::new(ptr),
        AbiParam::new(ptr),
        AbiParam::new(types::I64),
        AbiParam::new(types::I64),
    ]);
    let id = module
        .declare_function(&kernel.name(), Linkage::Export, &sig)
        .map_err(|e| CodegenError::Cranelift(e.to_string()))?;
    ctx.func.signature = sig;
    ctx.func.name = UserFuncName::testcase(kernel.name());

    // A reduction walks its kept dimensions per output and its reduced ones in rows.
    let rank = kernel.shape.rank();
    let kept = kernel.reduce.map_or(0, |r| r.kept);
    let outer = coalesce(kernel, 0..kept);
    let walk = coalesce(kernel, kept..rank);
    let vector = vector_type(kernel, &walk);
    let columns = column_type(kernel, &walk, &outer);
    let strip = if kernel.reduce.is_none() { strip_width(kernel, &walk) } else { None };
    // A strip-walking kernel vectorizes too, gathering its transposed reads.
    let vector = vector.or_else(|| strip.and_then(|_| lane_type(kernel)));
    // A Vec, not a map: declaration order shows in the CLIF text, which must be deterministic.
    let mut helper_ids = Vec::new();
    for (name, sig) in helpers::signatures(&module) {
        let hid = module
            .declare_function(name, Linkage::Import, &sig)
            .map_err(|e| CodegenError::Cranelift(e.to_string()))?;
        helper_ids.push((name, hid));
    }
    let target = module.target_config();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let mut helper_refs = HashMap::new();
        for (name, hid) in &helper_ids {
            helper_refs.insert(*name, module.declare_func_in_func(*hid, b.func));
        }
        // A column reduction's lanes run across its outputs; its parameters splat the same.
        let lanes = vector.or(columns);
        let mut t = Translator {
            kernel,
            walk: &walk,
            vector: lanes,
            strip,
            fma,
            helpers: helper_refs,
            b: &mut b,
        };
        match (kernel.reduce, columns) {
            (Some(red), Some((_, lanes))) => t.body_reduce_columns(red, &outer, lanes),
            (Some(red), None) => t.body_reduce(red, &outer),
            (None, _) => t.body(),
        }
        b.seal_all_blocks();
        b.finalize(target);
    }
    let clif = ctx.func.display().to_string();
    ctx.set_disasm(std::env::var_os("KILN_DISASM").is_some());
    module
        .define_function(id, &mut ctx)
        .map_err(|e| CodegenError::Cranelift(format!("{e:?}\n{clif}")))?;
    if let Some(code) = ctx.compiled_code().and_then(|c| c.vcode.clone()) {
        eprintln!("{code}");
    }
    module.clear_context(&mut ctx);
    module.finalize_definitions().map_err(|e| CodegenError::Cranelift(e.to_string()))?;
    let code = module.get_finalized_function(id);
    // SAFETY: `code` is the finalized function declared above with exactly this signature.
    let entry = unsafe { std::mem::transmute::<*const u8, Entry>(code) };
    Ok(CpuKernel {
        module: Some(module),
        entry,
        clif,
        vectorized: vector.is_some() || columns.is_some(),
        min_chunk: match (columns, strip) {
            (Some(_), _) => COLUMN_BLOCK,
            (None, Some(_)) => STRIP_ROWS * walk.dims.last().copied().unwrap_or(1),
            (None, None) => 1,
        },
    })
}

fn host_isa() -> Result<isa::OwnedTargetIsa, CodegenError> {
    let mut flags = settings::builder();
    let set = |f: &mut settings::Builder, k: &str, v: &str| {
        f.set(k, v).map_err(|e| CodegenError::Cranelift(e.to_string()))
    };
    set(&mut flags, "opt_level", "speed")?;
    set(&mut flags, "is_pic", "false")?;
    set(&mut flags, "use_colocated_libcalls", "false")?;
    let isa = cranelift_native::builder()
        .map_err(|e| CodegenError::Cranelift(format!("unsupported host: {e}")))?;
    isa.finish(settings::Flags::new(flags)).map_err(|e| CodegenError::Cranelift(e.to_string()))
}

/// Whether vector `fma` lowers to one instruction on this host.
fn has_fma(isa: &dyn isa::TargetIsa) -> bool {
    match isa.name() {
        "x64" => isa.isa_flags().iter().any(|f| f.name == "has_fma" && f.as_bool() == Some(true)),
        "aarch64" => true,
        _ => false,
    }
}

/// Where one vector iteration finds an input.
#[derive(Clone, Copy)]
enum VecSrc {
    /// Constant along the row: the splatted value.
    Splat(Value),
    /// The address of the iteration's first element, the others following it.
    At(Value),
    /// The address of the iteration's first element and the bytes between elements.
    Gather(Value, i64),
}

/// What every kernel function loads in its entry block.
struct Prologue {
    start: Value,
    end: Value,
    ins: Vec<Value>,
    outs: Vec<Value>,
    param_scalar: HashMap<usize, Value>,
    param_vector: HashMap<usize, Value>,
}

struct Translator<'a, 'b> {
    kernel: &'a Kernel,
    walk: &'a Walk,
    vector: Option<(DType, Type)>,
    /// Columns per strip when an elementwise kernel walks in strips (see [`strip_width`]).
    strip: Option<usize>,
    fma: bool,
    helpers: HashMap<&'static str, cranelift_codegen::ir::FuncRef>,
    b: &'a mut FunctionBuilder<'b>,
}

impl<'b> Translator<'_, 'b> {
    fn math(&mut self) -> math::Math<'_, 'b> {
        math::Math { b: self.b, fma: self.fma }
    }

    /// `n` pointer-sized parameters of `block`.
    fn carried(&mut self, block: cranelift_codegen::ir::Block, n: usize) -> Vec<Value> {
        (0..n).map(|_| self.b.append_block_param(block, types::I64)).collect()
    }

    fn iconst(&mut self, v: i64) -> Value {
        self.b.ins().iconst(types::I64, v)
    }

    /// The entry block: the function's parameters, the buffer pointers and the kernel's
    /// parameters, loaded once (splatted too when the loop is vectorized).
    fn prologue(&mut self) -> Prologue {
        let k = self.kernel;
        let entry = self.b.create_block();
        self.b.append_block_params_for_function_params(entry);
        self.b.switch_to_block(entry);
        let [bufs, params, start, end] =
            self.b.block_params(entry).try_into().expect("four parameters");
        let n_in = k.inputs.len();
        let ptrs: Vec<Value> = (0..n_in + k.outputs.len())
            .map(|i| self.b.ins().load(types::I64, flags(), bufs, (8 * i) as i32))
            .collect();
        let mut scalar = HashMap::new();
        let mut vector = HashMap::new();
        for (e, expr) in k.exprs.iter().enumerate() {
            if let ExprKind::Param(p) = expr.kind {
                let v = self.param_value(params, p, expr.dtype);
                if let Some((_, lanes)) = self.vector {
                    let v = self.b.ins().splat(lanes, v);
                    vector.insert(e, v);
                }
                scalar.insert(e, v);
            }
        }
        let outs = ptrs[n_in..].to_vec();
        Prologue {
            start,
            end,
            ins: ptrs[..n_in].to_vec(),
            outs,
            param_scalar: scalar,
            param_vector: vector,
        }
    }

    fn body(&mut self) {
        let pro = self.prologue();
        let (start, end) = (pro.start, pro.end);
        let inner = *self.walk.dims.last().expect("at least one dimension") as i64;
        let exit = self.b.create_block();
        match self.strip {
            None => {
                // Positions in order: each row's piece of the range, one after another.
                let head = self.b.create_block();
                let i_var = self.b.append_block_param(head, types::I64);
                let row = self.b.create_block();
                self.b.ins().jump(head, &[BlockArg::Value(start)]);
                self.b.switch_to_block(head);
                let more = self.b.ins().icmp(IntCC::UnsignedLessThan, i_var, end);
                self.b.ins().brif(more, row, &[], exit, &[]);
                self.b.switch_to_block(row);
                let inner_v = self.iconst(inner);
                let j0 = self.b.ins().urem(i_var, inner_v);
                let left = self.b.ins().isub(end, i_var);
                let reach = self.b.ins().iadd(j0, left);
                let jend = self.b.ins().umin(reach, inner_v);
                self.piece(&pro, i_var, j0, jend);
                let done = self.b.ins().isub(jend, j0);
                let i_next = self.b.ins().iadd(i_var, done);
                self.b.ins().jump(head, &[BlockArg::Value(i_next)]);
            }
            Some(strip) => {
                // Strips of columns, each over all the range's rows: an input read across
                // the rows (a transpose) then reuses each cache line for the next rows
                // instead of fetching a line per element.
                let outer_head = self.b.create_block();
                let s = self.b.append_block_param(outer_head, types::I64);
                let strip_body = self.b.create_block();
                let empty = self.b.ins().icmp(IntCC::UnsignedGreaterThanOrEqual, start, end);
                let zero = self.iconst(0);
                let first = self.b.create_block();
                self.b.ins().brif(empty, exit, &[], first, &[]);
                self.b.switch_to_block(first);
                let inner_v = self.iconst(inner);
                let r_first = self.b.ins().udiv(start, inner_v);
                let last = self.b.ins().iadd_imm_s(end, -1);
                let r_last = self.b.ins().udiv(last, inner_v);
                self.b.ins().jump(outer_head, &[BlockArg::Value(zero)]);
                self.b.switch_to_block(outer_head);
                let more = self.b.ins().icmp(IntCC::SignedLessThan, s, inner_v);
                self.b.ins().brif(more, strip_body, &[], exit, &[]);
                self.b.switch_to_block(strip_body);
                let s_end = self.b.ins().iadd_imm_s(s, strip as i64);
                let s_end = self.b.ins().umin(s_end, inner_v);
                let row_head = self.b.create_block();
                let r = self.b.append_block_param(row_head, types::I64);
                let row_body = self.b.create_block();
                let strip_done = self.b.create_block();
                self.b.ins().jump(row_head, &[BlockArg::Value(r_first)]);
                self.b.switch_to_block(row_head);
                let more = self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, r, r_last);
                self.b.ins().brif(more, row_body, &[], strip_done, &[]);
                self.b.switch_to_block(row_body);
                // This row's part of the strip, clipped to the range.
                let row_start = self.b.ins().imul(r, inner_v);
                let lo = self.b.ins().iadd(row_start, s);
                let lo = self.b.ins().umax(lo, start);
                let hi = self.b.ins().iadd(row_start, s_end);
                let hi = self.b.ins().umin(hi, end);
                let nonempty = self.b.ins().icmp(IntCC::UnsignedLessThan, lo, hi);
                let work = self.b.create_block();
                let next_row = self.b.create_block();
                self.b.ins().brif(nonempty, work, &[], next_row, &[]);
                self.b.switch_to_block(work);
                let j0 = self.b.ins().isub(lo, row_start);
                let jend = self.b.ins().isub(hi, row_start);
                self.piece(&pro, lo, j0, jend);
                self.b.ins().jump(next_row, &[]);
                self.b.switch_to_block(next_row);
                let r_next = self.b.ins().iadd_imm_s(r, 1);
                self.b.ins().jump(row_head, &[BlockArg::Value(r_next)]);
                self.b.switch_to_block(strip_done);
                self.b.ins().jump(outer_head, &[BlockArg::Value(s_end)]);
            }
        }
        self.b.switch_to_block(exit);
        self.b.ins().return_(&[]);
    }

    /// Computes positions `i_var..` of one row, from column `j0` to `jend`: locates the row
    /// and every input's base, runs the vector loop and the scalar tail, and leaves the
    /// builder in a block after them.
    fn piece(&mut self, pro: &Prologue, i_var: Value, j0: Value, jend: Value) {
        let k = self.kernel;
        let (ins, outs) = (&pro.ins, &pro.outs);
        let (param_scalar, param_vector) = (&pro.param_scalar, &pro.param_vector);
        let n_in = ins.len();
        let dims = self.walk.dims.clone();
        let inner = *dims.last().expect("at least one dimension") as i64;
        let inner_v = self.iconst(inner);
        let row_index = self.b.ins().udiv(i_var, inner_v);
        // Coordinates of the row in the outer dimensions, innermost first.
        let mut coords = Vec::new();
        let mut rest = row_index;
        for &d in dims[..dims.len() - 1].iter().rev() {
            let dv = self.iconst(d as i64);
            coords.push(self.b.ins().urem(rest, dv));
            rest = self.b.ins().udiv(rest, dv);
        }
        coords.reverse();
        let mut bases = Vec::with_capacity(n_in);
        for (idx, input) in k.inputs.iter().enumerate() {
            let mut off = self.iconst(self.walk.offsets[idx]);
            for (c, &s) in coords.iter().zip(&self.walk.strides[idx]) {
                let scaled = self.b.ins().imul_imm_s(*c, s);
                off = self.b.ins().iadd(off, scaled);
            }
            let bytes = self.b.ins().imul_imm_s(off, input.dtype.size_in_bytes() as i64);
            bases.push(self.b.ins().iadd(ins[idx], bytes));
        }
        let row_start = self.b.ins().isub(i_var, j0);
        let out_bases: Vec<Value> = k
            .outputs
            .iter()
            .zip(outs)
            .map(|(&o, &p)| {
                let bytes =
                    self.b.ins().imul_imm_s(row_start, k.exprs[o].dtype.size_in_bytes() as i64);
                self.b.ins().iadd(p, bytes)
            })
            .collect();

        let scalar_head = self.b.create_block();
        let j_scalar = self.b.append_block_param(scalar_head, types::I64);
        let row_done = self.b.create_block();

        if let Some((_, lanes)) = self.vector {
            let width = i64::from(lanes.lane_count());
            let (splats, mut starts) = self.vector_row(&bases, j0, lanes);
            let n_in_ptrs = starts.len();
            for (&o, &base) in k.outputs.iter().zip(&out_bases) {
                let size = k.exprs[o].dtype.size_in_bytes() as i64;
                let off = self.b.ins().imul_imm_s(j0, size);
                starts.push(self.b.ins().iadd(base, off));
            }
            let vec_head = self.b.create_block();
            let jv = self.b.append_block_param(vec_head, types::I64);
            let ptrs = self.carried(vec_head, starts.len());
            let vec_body = self.b.create_block();
            let mut args = vec![BlockArg::Value(j0)];
            args.extend(starts.iter().map(|&v| BlockArg::Value(v)));
            self.b.ins().jump(vec_head, &args);
            self.b.switch_to_block(vec_head);
            let next = self.b.ins().iadd_imm_s(jv, width);
            let fits = self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, next, jend);
            self.b.ins().brif(fits, vec_body, &[], scalar_head, &[BlockArg::Value(jv)]);
            self.b.switch_to_block(vec_body);
            let srcs = self.vector_srcs(&splats, &ptrs[..n_in_ptrs]);
            let values = self.compute_vector(&srcs, param_vector, lanes);
            for (o, &e) in k.outputs.iter().enumerate() {
                let addr = ptrs[n_in_ptrs + o];
                self.b.ins().store(MemFlagsData::new().with_notrap(), values[e], addr, 0);
            }
            let mut loop_args = vec![BlockArg::Value(next)];
            let mut steps = self.input_steps(&splats, lanes);
            steps.resize(ptrs.len(), i64::from(lanes.bytes()));
            let advanced = self.advance_ptrs(&ptrs, &steps);
            loop_args.extend(advanced.iter().map(|&v| BlockArg::Value(v)));
            self.b.ins().jump(vec_head, &loop_args);
        } else {
            self.b.ins().jump(scalar_head, &[BlockArg::Value(j0)]);
        }

        // scalar_head(j): while j < jend
        self.b.switch_to_block(scalar_head);
        let scalar_body = self.b.create_block();
        let go = self.b.ins().icmp(IntCC::UnsignedLessThan, j_scalar, jend);
        self.b.ins().brif(go, scalar_body, &[], row_done, &[]);
        self.b.switch_to_block(scalar_body);
        let values = self.compute_scalar(j_scalar, &bases, param_scalar);
        for (o, &e) in k.outputs.iter().enumerate() {
            let dtype = k.exprs[e].dtype;
            let off = self.b.ins().imul_imm_s(j_scalar, dtype.size_in_bytes() as i64);
            let addr = self.b.ins().iadd(out_bases[o], off);
            self.store(values[e], dtype, addr);
        }
        let j_next = self.b.ins().iadd_imm_s(j_scalar, 1);
        self.b.ins().jump(scalar_head, &[BlockArg::Value(j_next)]);

        self.b.switch_to_block(row_done);
    }

    /// Byte addresses of each input at coordinates `coords` of `dims` (flat index `index`)
    /// added to `starts`.
    fn advance(
        &mut self,
        starts: &[Value],
        index: Value,
        dims: &[usize],
        strides: &[Vec<i64>],
    ) -> Vec<Value> {
        let mut coords = Vec::new();
        let mut rest = index;
        for &d in dims.iter().rev() {
            let dv = self.iconst(d as i64);
            coords.push(self.b.ins().urem(rest, dv));
            rest = self.b.ins().udiv(rest, dv);
        }
        coords.reverse();
        starts
            .iter()
            .enumerate()
            .map(|(idx, &start)| {
                let size = self.kernel.inputs[idx].dtype.size_in_bytes() as i64;
                let mut addr = start;
                for (c, &s) in coords.iter().zip(&strides[idx]) {
                    let off = self.b.ins().imul_imm_s(*c, s * size);
                    addr = self.b.ins().iadd(addr, off);
                }
                addr
            })
            .collect()
    }

    /// The accumulator type and identity of a reduction over values of `dtype`.
    fn identity(&mut self, op: ReduceOp, dtype: DType) -> Value {
        if dtype == DType::Bool {
            let v = i64::from(op == ReduceOp::Min || op == ReduceOp::Prod);
            return self.b.ins().iconst(types::I8, v);
        }
        if dtype.is_float() {
            let v = match op {
                ReduceOp::Sum => 0.0,
                ReduceOp::Prod => 1.0,
                ReduceOp::Max => f64::NEG_INFINITY,
                _ => f64::INFINITY,
            };
            return self.b.ins().f64const(v);
        }
        let v = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Max => i64::MIN,
            _ => i64::MAX,
        };
        self.iconst(v)
    }

    /// Folds one value (in its register type) into the accumulator.
    fn combine(&mut self, op: ReduceOp, acc: Value, v: Value, dtype: DType) -> Value {
        if dtype == DType::Bool {
            return match op {
                ReduceOp::Max | ReduceOp::Sum => self.b.ins().bor(acc, v),
                _ => self.b.ins().band(acc, v),
            };
        }
        if dtype.is_float() {
            let v = if scalar_type(dtype) == types::F64 {
                v
            } else {
                self.b.ins().fpromote(types::F64, v)
            };
            return match op {
                ReduceOp::Sum => self.b.ins().fadd(acc, v),
                ReduceOp::Prod => self.b.ins().fmul(acc, v),
                ReduceOp::Max => self.b.ins().fmax(acc, v),
                _ => self.b.ins().fmin(acc, v),
            };
        }
        match op {
            ReduceOp::Sum => self.b.ins().iadd(acc, v),
            ReduceOp::Prod => self.b.ins().imul(acc, v),
            ReduceOp::Max => self.b.ins().smax(acc, v),
            _ => self.b.ins().smin(acc, v),
        }
    }

    /// A reduction kernel: for each output position in `start..end`, fold the body's value
    /// over the reduced dimensions (in rows of the last one, vectorized like elementwise
    /// kernels) into an f64 (float), i64 (integer) or i8 (bool) accumulator.
    /// A reduction vectorized across its outputs: for each block of up to [`COLUMN_BLOCK`]
    /// neighbouring outputs, f64 accumulators in a stack slot, and a walk over the reduced
    /// positions that adds each position's row segment of the block to them with vectors.
    /// The input streams one contiguous segment at a time, where a walk per output would
    /// stride across the whole input for every element.
    fn body_reduce_columns(&mut self, red: KernelReduce, outer: &Walk, lanes: Type) {
        let k = self.kernel;
        let out_expr = k.outputs[0];
        let dtype = k.exprs[out_expr].dtype;
        let Prologue { start, end, ins, outs, param_scalar, param_vector } = self.prologue();
        let n_in = ins.len();
        let out_ptr = outs[0];
        let starts = self.input_starts(&ins);
        let width = i64::from(lanes.lane_count());
        let sizes: Vec<i64> = k.inputs.iter().map(|i| i.dtype.size_in_bytes() as i64).collect();
        // Per input: its stride across outputs (0 or 1) and along the innermost reduced dim.
        let across: Vec<i64> = outer.strides.iter().map(|s| *s.last().expect("a dim")).collect();
        let along: Vec<i64> = self.walk.strides.iter().map(|s| *s.last().expect("a dim")).collect();
        let inner_dims = self.walk.dims.clone();
        let len = *inner_dims.last().expect("a dimension") as i64;
        let rows: i64 = inner_dims[..inner_dims.len() - 1].iter().product::<usize>() as i64;
        let row_strides: Vec<Vec<i64>> =
            self.walk.strides.iter().map(|s| s[..s.len() - 1].to_vec()).collect();
        let kept_inner = *outer.dims.last().expect("a dimension") as i64;
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            (COLUMN_BLOCK * 8) as u32,
            4,
        ));
        let slot_addr = self.b.ins().stack_addr(types::I64, slot, 0);
        let ptr_args = |v: &[Value]| v.iter().map(|&x| BlockArg::Value(x)).collect::<Vec<_>>();

        let head = self.b.create_block();
        let o = self.b.append_block_param(head, types::I64);
        let block_start = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(head, &[BlockArg::Value(start)]);
        self.b.switch_to_block(head);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, o, end);
        self.b.ins().brif(more, block_start, &[], exit, &[]);

        // The block: outputs o..o+count, within one run of the innermost kept dimension.
        self.b.switch_to_block(block_start);
        let kept_v = self.iconst(kept_inner);
        let j0 = self.b.ins().urem(o, kept_v);
        let to_row_end = self.b.ins().isub(kept_v, j0);
        let to_end = self.b.ins().isub(end, o);
        let block_v = self.iconst(COLUMN_BLOCK as i64);
        let count = self.b.ins().umin(to_row_end, to_end);
        let count = self.b.ins().umin(count, block_v);
        let bases = self.advance(&starts, o, &outer.dims, &outer.strides);
        let identity = self.identity(red.op, dtype);
        let identities = self.b.ins().splat(types::F64X2, identity);
        let ihead = self.b.create_block();
        let i = self.b.append_block_param(ihead, types::I64);
        let ibody = self.b.create_block();
        let rows_start = self.b.create_block();
        let zero = self.iconst(0);
        self.b.ins().jump(ihead, &[BlockArg::Value(zero)]);
        self.b.switch_to_block(ihead);
        let all = self.iconst((COLUMN_BLOCK * 8) as i64);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, i, all);
        self.b.ins().brif(more, ibody, &[], rows_start, &[]);
        self.b.switch_to_block(ibody);
        let at = self.b.ins().iadd(slot_addr, i);
        self.b.ins().store(MemFlagsData::trusted(), identities, at, 0);
        let i_next = self.b.ins().iadd_imm_s(i, 16);
        self.b.ins().jump(ihead, &[BlockArg::Value(i_next)]);

        // Rows of the reduced walk (all but its innermost dimension).
        self.b.switch_to_block(rows_start);
        let rhead = self.b.create_block();
        let ir = self.b.append_block_param(rhead, types::I64);
        let rbody = self.b.create_block();
        let store = self.b.create_block();
        self.b.ins().jump(rhead, &[BlockArg::Value(zero)]);
        self.b.switch_to_block(rhead);
        let rows_v = self.iconst(rows);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, ir, rows_v);
        self.b.ins().brif(more, rbody, &[], store, &[]);
        self.b.switch_to_block(rbody);
        let rbases = self.advance(&bases, ir, &inner_dims[..inner_dims.len() - 1], &row_strides);
        // The innermost reduced dimension, with the inputs' addresses carried.
        let lhead = self.b.create_block();
        let jl = self.b.append_block_param(lhead, types::I64);
        let ptrs = self.carried(lhead, n_in);
        let lbody = self.b.create_block();
        let rdone = self.b.create_block();
        let mut args = vec![BlockArg::Value(zero)];
        args.extend(ptr_args(&rbases));
        self.b.ins().jump(lhead, &args);
        self.b.switch_to_block(lhead);
        let len_v = self.iconst(len);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, jl, len_v);
        self.b.ins().brif(more, lbody, &[], rdone, &[]);

        // One reduced position: the block's segment, by vectors then one by one.
        self.b.switch_to_block(lbody);
        let chead = self.b.create_block();
        let j = self.b.append_block_param(chead, types::I64);
        let cbody = self.b.create_block();
        let thead = self.b.create_block();
        let tj = self.b.append_block_param(thead, types::I64);
        let tbody = self.b.create_block();
        let lnext = self.b.create_block();
        self.b.ins().jump(chead, &[BlockArg::Value(zero)]);
        self.b.switch_to_block(chead);
        let next = self.b.ins().iadd_imm_s(j, width);
        let fits = self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, next, count);
        self.b.ins().brif(fits, cbody, &[], thead, &[BlockArg::Value(j)]);
        self.b.switch_to_block(cbody);
        let mut srcs = Vec::with_capacity(n_in);
        for idx in 0..n_in {
            if across[idx] == 0 {
                let v = self.b.ins().load(
                    lanes.lane_type(),
                    MemFlagsData::new().with_notrap(),
                    ptrs[idx],
                    0,
                );
                srcs.push(VecSrc::Splat(self.b.ins().splat(lanes, v)));
            } else {
                let off = self.b.ins().imul_imm_s(j, sizes[idx]);
                srcs.push(VecSrc::At(self.b.ins().iadd(ptrs[idx], off)));
            }
        }
        let values = self.compute_vector(&srcs, &param_vector, lanes);
        let v = values[out_expr];
        let wide = if lanes == types::F32X4 {
            let (lo, hi) = math::widen(&mut self.math(), v);
            vec![lo, hi]
        } else {
            vec![v]
        };
        let acc_at = self.b.ins().imul_imm_s(j, 8);
        let acc_at = self.b.ins().iadd(slot_addr, acc_at);
        for (h, w) in wide.into_iter().enumerate() {
            let offset = (h * 16) as i32;
            let acc = self.b.ins().load(types::F64X2, MemFlagsData::trusted(), acc_at, offset);
            let folded = match red.op {
                ReduceOp::Sum => self.b.ins().fadd(acc, w),
                ReduceOp::Prod => self.b.ins().fmul(acc, w),
                ReduceOp::Max => self.b.ins().fmax(acc, w),
                _ => self.b.ins().fmin(acc, w),
            };
            self.b.ins().store(MemFlagsData::trusted(), folded, acc_at, offset);
        }
        self.b.ins().jump(chead, &[BlockArg::Value(next)]);

        self.b.switch_to_block(thead);
        let go = self.b.ins().icmp(IntCC::UnsignedLessThan, tj, count);
        self.b.ins().brif(go, tbody, &[], lnext, &[]);
        self.b.switch_to_block(tbody);
        let addrs: Vec<Value> = (0..n_in)
            .map(|idx| {
                let off = self.b.ins().imul_imm_s(tj, across[idx] * sizes[idx]);
                self.b.ins().iadd(ptrs[idx], off)
            })
            .collect();
        let values = self.compute_scalar(zero, &addrs, &param_scalar);
        let acc_at = self.b.ins().imul_imm_s(tj, 8);
        let acc_at = self.b.ins().iadd(slot_addr, acc_at);
        let acc = self.b.ins().load(types::F64, MemFlagsData::trusted(), acc_at, 0);
        let folded = self.combine(red.op, acc, values[out_expr], dtype);
        self.b.ins().store(MemFlagsData::trusted(), folded, acc_at, 0);
        let tj_next = self.b.ins().iadd_imm_s(tj, 1);
        self.b.ins().jump(thead, &[BlockArg::Value(tj_next)]);

        self.b.switch_to_block(lnext);
        let stepped: Vec<Value> = (0..n_in)
            .map(|idx| self.b.ins().iadd_imm_s(ptrs[idx], along[idx] * sizes[idx]))
            .collect();
        let jl_next = self.b.ins().iadd_imm_s(jl, 1);
        let mut args = vec![BlockArg::Value(jl_next)];
        args.extend(ptr_args(&stepped));
        self.b.ins().jump(lhead, &args);

        self.b.switch_to_block(rdone);
        let ir_next = self.b.ins().iadd_imm_s(ir, 1);
        self.b.ins().jump(rhead, &[BlockArg::Value(ir_next)]);

        // The block's results, rounded to the output dtype.
        self.b.switch_to_block(store);
        let shead = self.b.create_block();
        let sj = self.b.append_block_param(shead, types::I64);
        let sbody = self.b.create_block();
        let block_done = self.b.create_block();
        self.b.ins().jump(shead, &[BlockArg::Value(zero)]);
        self.b.switch_to_block(shead);
        let go = self.b.ins().icmp(IntCC::UnsignedLessThan, sj, count);
        self.b.ins().brif(go, sbody, &[], block_done, &[]);
        self.b.switch_to_block(sbody);
        let acc_at = self.b.ins().imul_imm_s(sj, 8);
        let acc_at = self.b.ins().iadd(slot_addr, acc_at);
        let acc = self.b.ins().load(types::F64, MemFlagsData::trusted(), acc_at, 0);
        let result = self.demote(acc, dtype);
        let pos = self.b.ins().iadd(o, sj);
        let off = self.b.ins().imul_imm_s(pos, dtype.size_in_bytes() as i64);
        let addr = self.b.ins().iadd(out_ptr, off);
        self.store(result, dtype, addr);
        let sj_next = self.b.ins().iadd_imm_s(sj, 1);
        self.b.ins().jump(shead, &[BlockArg::Value(sj_next)]);
        self.b.switch_to_block(block_done);
        let o_next = self.b.ins().iadd(o, count);
        self.b.ins().jump(head, &[BlockArg::Value(o_next)]);

        self.b.switch_to_block(exit);
        self.b.ins().return_(&[]);
    }

    /// Each input's address with its view's offset added.
    fn input_starts(&mut self, ins: &[Value]) -> Vec<Value> {
        (0..ins.len())
            .map(|idx| {
                let bytes = self.walk_offset_bytes(idx);
                self.b.ins().iadd_imm_s(ins[idx], bytes)
            })
            .collect()
    }

    fn body_reduce(&mut self, red: KernelReduce, outer: &Walk) {
        let k = self.kernel;
        let out_expr = k.outputs[0];
        let dtype = k.exprs[out_expr].dtype;
        let Prologue { start, end, ins, outs, param_scalar, param_vector } = self.prologue();
        let out_ptr = outs[0];
        let starts = self.input_starts(&ins);
        let acc_ty = if dtype == DType::Bool {
            types::I8
        } else if dtype.is_float() {
            types::F64
        } else {
            types::I64
        };
        let inner_dims = self.walk.dims.clone();
        let len = *inner_dims.last().expect("at least one dimension") as i64;
        let rows: i64 = inner_dims[..inner_dims.len() - 1].iter().product::<usize>() as i64;
        let inner_strides: Vec<Vec<i64>> =
            self.walk.strides.iter().map(|s| s[..s.len() - 1].to_vec()).collect();

        let head = self.b.create_block();
        let o = self.b.append_block_param(head, types::I64);
        let obody = self.b.create_block();
        let rhead = self.b.create_block();
        let ir = self.b.append_block_param(rhead, types::I64);
        let racc = self.b.append_block_param(rhead, acc_ty);
        let rbody = self.b.create_block();
        let shead = self.b.create_block();
        let js = self.b.append_block_param(shead, types::I64);
        let sacc = self.b.append_block_param(shead, acc_ty);
        let sbody = self.b.create_block();
        let rdone = self.b.create_block();
        let dacc = self.b.append_block_param(rdone, acc_ty);
        let store = self.b.create_block();
        let facc = self.b.append_block_param(store, acc_ty);
        let exit = self.b.create_block();
        self.b.ins().jump(head, &[BlockArg::Value(start)]);

        self.b.switch_to_block(head);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, o, end);
        self.b.ins().brif(more, obody, &[], exit, &[]);

        self.b.switch_to_block(obody);
        let outer_dims = outer.dims.clone();
        let outer_bases = self.advance(&starts, o, &outer_dims, &outer.strides);
        let zero = self.iconst(0);
        let init = self.identity(red.op, dtype);
        self.b.ins().jump(rhead, &[BlockArg::Value(zero), BlockArg::Value(init)]);

        self.b.switch_to_block(rhead);
        let rows_v = self.iconst(rows);
        let more_rows = self.b.ins().icmp(IntCC::UnsignedLessThan, ir, rows_v);
        self.b.ins().brif(more_rows, rbody, &[], store, &[BlockArg::Value(racc)]);

        self.b.switch_to_block(rbody);
        let bases =
            self.advance(&outer_bases, ir, &inner_dims[..inner_dims.len() - 1], &inner_strides);
        let len_v = self.iconst(len);
        // Outputs after the first hold the reduced value itself at every domain position:
        // this row starts at position `o * rows * len + ir * len`.
        let side: Vec<(usize, DType, Value)> = k.outputs[1..]
            .iter()
            .zip(&outs[1..])
            .map(|(&e, &base)| {
                let dtype = k.exprs[e].dtype;
                let size = dtype.size_in_bytes() as i64;
                let a = self.b.ins().imul_imm_s(o, rows * len * size);
                let r = self.b.ins().imul_imm_s(ir, len * size);
                let off = self.b.ins().iadd(a, r);
                (e, dtype, self.b.ins().iadd(base, off))
            })
            .collect();
        if let Some((_, lanes)) = self.vector
            && matches!(red.op, ReduceOp::Max | ReduceOp::Min)
        {
            // Max and min are exact in any order: keep a vector accumulator in the lanes'
            // own type and fold its lanes into the scalar one when the row's vector part ends.
            // The loop compares and selects (two instructions where Cranelift's
            // NaN-propagating `fmax` takes about nine) and remembers NaN lanes apart.
            let width = lanes.lane_count();
            let mask_ty = if lanes == types::F32X4 { types::I32X4 } else { types::I64X2 };
            let (splats, starts) = self.vector_row(&bases, zero, lanes);
            let vhead = self.b.create_block();
            let jv = self.b.append_block_param(vhead, types::I64);
            let vacc = self.b.append_block_param(vhead, lanes);
            let vnan = self.b.append_block_param(vhead, mask_ty);
            let ptrs = self.carried(vhead, starts.len());
            let vbody = self.b.create_block();
            let vdone = self.b.create_block();
            let ident = self.float_const(
                if red.op == ReduceOp::Max { f64::NEG_INFINITY } else { f64::INFINITY },
                lanes.lane_type(),
            );
            let init = self.b.ins().splat(lanes, ident);
            let no_nan = self.b.ins().iconst(mask_ty.lane_type(), 0);
            let no_nan = self.b.ins().splat(mask_ty, no_nan);
            let mut args =
                vec![BlockArg::Value(zero), BlockArg::Value(init), BlockArg::Value(no_nan)];
            args.extend(starts.iter().map(|&v| BlockArg::Value(v)));
            self.b.ins().jump(vhead, &args);
            self.b.switch_to_block(vhead);
            let next = self.b.ins().iadd_imm_s(jv, i64::from(width));
            let fits = self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, next, len_v);
            self.b.ins().brif(fits, vbody, &[], vdone, &[]);
            self.b.switch_to_block(vbody);
            let srcs = self.vector_srcs(&splats, &ptrs);
            let values = self.compute_vector(&srcs, &param_vector, lanes);
            self.store_side_vectors(&side, &values, jv);
            let v = values[out_expr];
            let cc = if red.op == ReduceOp::Max { FloatCC::GreaterThan } else { FloatCC::LessThan };
            let better = self.b.ins().fcmp(cc, v, vacc);
            let better = self.b.ins().bitcast(lanes, MemFlagsData::new(), better);
            let folded = self.b.ins().bitselect(better, v, vacc);
            let is_nan = self.b.ins().fcmp(FloatCC::Unordered, v, v);
            let nans = self.b.ins().bor(vnan, is_nan);
            let mut loop_args =
                vec![BlockArg::Value(next), BlockArg::Value(folded), BlockArg::Value(nans)];
            let steps = self.input_steps(&splats, lanes);
            let advanced = self.advance_ptrs(&ptrs, &steps);
            loop_args.extend(advanced.iter().map(|&v| BlockArg::Value(v)));
            self.b.ins().jump(vhead, &loop_args);
            self.b.switch_to_block(vdone);
            let mut acc = racc;
            for lane in 0..width {
                let v = self.b.ins().extractlane(vacc, lane as u8);
                acc = self.combine(red.op, acc, v, dtype);
            }
            let any_nan = self.b.ins().vany_true(vnan);
            let nan = self.b.ins().f64const(f64::NAN);
            let acc = self.b.ins().select(any_nan, nan, acc);
            self.b.ins().jump(shead, &[BlockArg::Value(jv), BlockArg::Value(acc)]);
        } else if let Some((_, lanes)) = self.vector {
            // Every lane accumulates in f64, in f64x2 vectors (an f32x4 is widened into two),
            // so that the lanes' additions do not wait on each other; the lanes are combined
            // in order when the row's vector part ends.
            let width = lanes.lane_count();
            let n_acc = (width / 2) as usize;
            let (splats, starts) = self.vector_row(&bases, zero, lanes);
            let vhead = self.b.create_block();
            let jv = self.b.append_block_param(vhead, types::I64);
            let vaccs: Vec<Value> =
                (0..n_acc).map(|_| self.b.append_block_param(vhead, types::F64X2)).collect();
            let ptrs = self.carried(vhead, starts.len());
            let vbody = self.b.create_block();
            let vdone = self.b.create_block();
            let identity = self.identity(red.op, dtype);
            let identities = self.b.ins().splat(types::F64X2, identity);
            let first = self.b.ins().insertlane(identities, racc, 0);
            let mut args = vec![BlockArg::Value(zero), BlockArg::Value(first)];
            args.extend((1..n_acc).map(|_| BlockArg::Value(identities)));
            args.extend(starts.iter().map(|&v| BlockArg::Value(v)));
            self.b.ins().jump(vhead, &args);
            self.b.switch_to_block(vhead);
            let next = self.b.ins().iadd_imm_s(jv, i64::from(width));
            let fits = self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, next, len_v);
            self.b.ins().brif(fits, vbody, &[], vdone, &[]);
            self.b.switch_to_block(vbody);
            let srcs = self.vector_srcs(&splats, &ptrs);
            let values = self.compute_vector(&srcs, &param_vector, lanes);
            self.store_side_vectors(&side, &values, jv);
            let v = values[out_expr];
            let wide = if lanes == types::F32X4 {
                let (lo, hi) = math::widen(&mut self.math(), v);
                vec![lo, hi]
            } else {
                vec![v]
            };
            let mut next_args = vec![BlockArg::Value(next)];
            for (&acc, &w) in vaccs.iter().zip(&wide) {
                let folded = match red.op {
                    ReduceOp::Prod => self.b.ins().fmul(acc, w),
                    _ => self.b.ins().fadd(acc, w),
                };
                next_args.push(BlockArg::Value(folded));
            }
            let steps = self.input_steps(&splats, lanes);
            let advanced = self.advance_ptrs(&ptrs, &steps);
            next_args.extend(advanced.iter().map(|&v| BlockArg::Value(v)));
            self.b.ins().jump(vhead, &next_args);
            self.b.switch_to_block(vdone);
            let mut acc = None;
            for &vacc in &vaccs {
                for lane in 0..2u8 {
                    let v = self.b.ins().extractlane(vacc, lane);
                    acc = Some(match acc {
                        None => v,
                        Some(a) => self.combine(red.op, a, v, acc_ty_dtype(dtype)),
                    });
                }
            }
            let acc = acc.expect("at least one accumulator");
            self.b.ins().jump(shead, &[BlockArg::Value(jv), BlockArg::Value(acc)]);
        } else {
            self.b.ins().jump(shead, &[BlockArg::Value(zero), BlockArg::Value(racc)]);
        }

        self.b.switch_to_block(shead);
        let go = self.b.ins().icmp(IntCC::UnsignedLessThan, js, len_v);
        self.b.ins().brif(go, sbody, &[], rdone, &[BlockArg::Value(sacc)]);
        self.b.switch_to_block(sbody);
        let values = self.compute_scalar(js, &bases, &param_scalar);
        for &(e, side_dtype, base) in &side {
            let off = self.b.ins().imul_imm_s(js, side_dtype.size_in_bytes() as i64);
            let addr = self.b.ins().iadd(base, off);
            self.store(values[e], side_dtype, addr);
        }
        let acc = self.combine(red.op, sacc, values[out_expr], dtype);
        let j_next = self.b.ins().iadd_imm_s(js, 1);
        self.b.ins().jump(shead, &[BlockArg::Value(j_next), BlockArg::Value(acc)]);

        self.b.switch_to_block(rdone);
        let ir_next = self.b.ins().iadd_imm_s(ir, 1);
        self.b.ins().jump(rhead, &[BlockArg::Value(ir_next), BlockArg::Value(dacc)]);

        self.b.switch_to_block(store);
        let result = if dtype.is_float() {
            self.demote(facc, dtype)
        } else if dtype == DType::Bool {
            facc
        } else {
            self.narrow(facc, dtype)
        };
        let off = self.b.ins().imul_imm_s(o, dtype.size_in_bytes() as i64);
        let addr = self.b.ins().iadd(out_ptr, off);
        self.store(result, dtype, addr);
        let o_next = self.b.ins().iadd_imm_s(o, 1);
        self.b.ins().jump(head, &[BlockArg::Value(o_next)]);

        self.b.switch_to_block(exit);
        self.b.ins().return_(&[]);
    }

    /// Stores the vector values of a reduction's unreduced outputs at column `j` of the row
    /// whose start each `side` entry holds (their dtype is the lanes' own, as `lane_type`
    /// requires of every output).
    fn store_side_vectors(&mut self, side: &[(usize, DType, Value)], values: &[Value], j: Value) {
        for &(e, dtype, base) in side {
            let off = self.b.ins().imul_imm_s(j, dtype.size_in_bytes() as i64);
            let addr = self.b.ins().iadd(base, off);
            self.b.ins().store(MemFlagsData::new().with_notrap(), values[e], addr, 0);
        }
    }

    fn walk_offset_bytes(&self, idx: usize) -> i64 {
        self.walk.offsets[idx] * self.kernel.inputs[idx].dtype.size_in_bytes() as i64
    }

    /// How the vector loop of a row reads each input: inputs constant along the row are
    /// loaded and splatted once, here (in the row's block); the others are read through
    /// pointers that the loop carries and advances, starting at element `j0`. Returns the
    /// splats (`None` for a moving input) and the moving inputs' first addresses.
    ///
    /// Carrying pointers matters: addresses recomputed from the loop index would be
    /// rematerialized by Cranelift (adds and masks of constants) inside every iteration.
    fn vector_row(
        &mut self,
        bases: &[Value],
        j0: Value,
        lanes: Type,
    ) -> (Vec<Option<Value>>, Vec<Value>) {
        let mut splats = Vec::with_capacity(bases.len());
        let mut starts = Vec::new();
        for idx in 0..bases.len() {
            if *self.walk.strides[idx].last().expect("a row") == 0 {
                let s = self.b.ins().load(
                    lanes.lane_type(),
                    MemFlagsData::new().with_notrap(),
                    bases[idx],
                    0,
                );
                splats.push(Some(self.b.ins().splat(lanes, s)));
            } else {
                splats.push(None);
                starts.push(self.element_addr(idx, j0, bases));
            }
        }
        (splats, starts)
    }

    /// The sources of one vector iteration, from [`Self::vector_row`]'s splats and the
    /// loop's current pointers: contiguous inputs load a vector, inputs strided along the
    /// row (a transposed read in a strip-walking kernel) gather their lanes.
    fn vector_srcs(&self, splats: &[Option<Value>], ptrs: &[Value]) -> Vec<VecSrc> {
        let mut moving = ptrs.iter();
        splats
            .iter()
            .enumerate()
            .map(|(idx, s)| match s {
                Some(v) => VecSrc::Splat(*v),
                None => {
                    let ptr = *moving.next().expect("a pointer per moving input");
                    match self.inner_stride_bytes(idx) {
                        bytes if bytes == self.kernel.inputs[idx].dtype.size_in_bytes() as i64 => {
                            VecSrc::At(ptr)
                        }
                        bytes => VecSrc::Gather(ptr, bytes),
                    }
                }
            })
            .collect()
    }

    /// Bytes between neighbouring elements of input `idx` along the row.
    fn inner_stride_bytes(&self, idx: usize) -> i64 {
        let stride = *self.walk.strides[idx].last().expect("at least one dimension");
        stride * self.kernel.inputs[idx].dtype.size_in_bytes() as i64
    }

    /// How far each moving input's pointer advances per vector of `lanes`, in order.
    fn input_steps(&self, splats: &[Option<Value>], lanes: Type) -> Vec<i64> {
        let width = i64::from(lanes.lane_count());
        (0..splats.len())
            .filter(|&idx| splats[idx].is_none())
            .map(|idx| width * self.inner_stride_bytes(idx))
            .collect()
    }

    /// Pointers advanced by `steps` bytes each.
    fn advance_ptrs(&mut self, ptrs: &[Value], steps: &[i64]) -> Vec<Value> {
        ptrs.iter().zip(steps).map(|(&p, &s)| self.b.ins().iadd_imm_s(p, s)).collect()
    }

    /// The address of element `j` of the row for input `idx`.
    fn element_addr(&mut self, idx: usize, j: Value, bases: &[Value]) -> Value {
        let stride = *self.walk.strides[idx].last().expect("at least one dimension");
        let size = self.kernel.inputs[idx].dtype.size_in_bytes() as i64;
        if stride == 0 {
            return bases[idx];
        }
        let off = self.b.ins().imul_imm_s(j, stride * size);
        self.b.ins().iadd(bases[idx], off)
    }

    fn compute_vector(
        &mut self,
        srcs: &[VecSrc],
        params: &HashMap<usize, Value>,
        lanes: Type,
    ) -> Vec<Value> {
        let k = self.kernel;
        let mask_type = if lanes == types::F32X4 { types::I32X4 } else { types::I64X2 };
        let mut vals: Vec<Value> = Vec::with_capacity(k.exprs.len());
        for (e, expr) in k.exprs.iter().enumerate() {
            let v = match expr.kind {
                ExprKind::Load(idx) => match srcs[idx] {
                    VecSrc::Splat(v) => v,
                    VecSrc::At(addr) => {
                        self.b.ins().load(lanes, MemFlagsData::new().with_notrap(), addr, 0)
                    }
                    VecSrc::Gather(addr, step) => {
                        let flags = MemFlagsData::new().with_notrap();
                        let first = self.b.ins().load(lanes.lane_type(), flags, addr, 0);
                        let mut v = self.b.ins().splat(lanes, first);
                        for lane in 1..lanes.lane_count() {
                            let at = self.b.ins().iadd_imm_s(addr, step * i64::from(lane));
                            let x = self.b.ins().load(lanes.lane_type(), flags, at, 0);
                            v = self.b.ins().insertlane(v, x, lane as u8);
                        }
                        v
                    }
                },
                ExprKind::Param(_) => params[&e],
                ExprKind::Unary(op, a) => {
                    let x = vals[a];
                    match op {
                        UnaryOp::Neg => self.b.ins().fneg(x),
                        UnaryOp::Abs => self.b.ins().fabs(x),
                        UnaryOp::Sqrt => self.b.ins().sqrt(x),
                        UnaryOp::Floor => self.b.ins().floor(x),
                        UnaryOp::Ceil => self.b.ins().ceil(x),
                        UnaryOp::Round => self.b.ins().nearest(x),
                        UnaryOp::Recip => {
                            let one = self.float_const(1.0, lanes.lane_type());
                            let ones = self.b.ins().splat(lanes, one);
                            self.b.ins().fdiv(ones, x)
                        }
                        UnaryOp::Relu => {
                            let zero = self.float_const(0.0, lanes.lane_type());
                            let zeros = self.b.ins().splat(lanes, zero);
                            let neg = self.b.ins().fcmp(FloatCC::LessThan, x, zeros);
                            let mask = self.b.ins().bitcast(lanes, MemFlagsData::new(), neg);
                            self.b.ins().bitselect(mask, zeros, x)
                        }
                        UnaryOp::Not => self.b.ins().bnot(x),
                        UnaryOp::Exp => math::exp(&mut self.math(), x),
                        UnaryOp::Tanh => math::tanh(&mut self.math(), x),
                        UnaryOp::Sigmoid => math::sigmoid(&mut self.math(), x),
                        UnaryOp::Erf => math::erf(&mut self.math(), x),
                        UnaryOp::Log => math::log(&mut self.math(), x),
                        UnaryOp::Sin | UnaryOp::Cos => self.trig_vector(op, x),
                    }
                }
                ExprKind::Binary(op, a, c) => {
                    let (x, y) = (vals[a], vals[c]);
                    match op {
                        BinaryOp::Add => self.b.ins().fadd(x, y),
                        BinaryOp::Sub => self.b.ins().fsub(x, y),
                        BinaryOp::Mul => self.b.ins().fmul(x, y),
                        BinaryOp::Div => self.b.ins().fdiv(x, y),
                        BinaryOp::Pow => self.pow_vector(x, y),
                        BinaryOp::Maximum => self.b.ins().fmax(x, y),
                        BinaryOp::Minimum => self.b.ins().fmin(x, y),
                        BinaryOp::And => self.b.ins().band(x, y),
                        BinaryOp::Or => self.b.ins().bor(x, y),
                        cmp => {
                            let cc = float_cc(cmp);
                            let m = self.b.ins().fcmp(cc, x, y);
                            debug_assert_eq!(self.b.func.dfg.value_type(m), mask_type);
                            m
                        }
                    }
                }
                ExprKind::Where(c, a, d) => {
                    let mask = self.b.ins().bitcast(lanes, MemFlagsData::new(), vals[c]);
                    self.b.ins().bitselect(mask, vals[a], vals[d])
                }
                ExprKind::Cast(_) => unreachable!("casts are not vectorized"),
            };
            vals.push(v);
        }
        vals
    }

    fn compute_scalar(
        &mut self,
        j: Value,
        bases: &[Value],
        params: &HashMap<usize, Value>,
    ) -> Vec<Value> {
        let k = self.kernel;
        let mut vals: Vec<Value> = Vec::with_capacity(k.exprs.len());
        for (e, expr) in k.exprs.iter().enumerate() {
            let dtype = expr.dtype;
            let v = match expr.kind {
                ExprKind::Load(idx) => {
                    let addr = self.element_addr(idx, j, bases);
                    self.load(dtype, addr)
                }
                ExprKind::Param(_) => params[&e],
                ExprKind::Unary(op, a) => self.unary(op, vals[a], dtype),
                ExprKind::Binary(op, a, c) => {
                    self.binary(op, vals[a], vals[c], k.exprs[a].dtype, dtype)
                }
                ExprKind::Where(c, a, d) => self.b.ins().select(vals[c], vals[a], vals[d]),
                ExprKind::Cast(a) => self.cast(vals[a], k.exprs[a].dtype, dtype),
            };
            vals.push(v);
        }
        vals
    }

    /// `x^y` for four f32 lanes: the vector path, and the scalar f64 function for every lane
    /// when one of them needs IEEE's special cases (a zero, infinite or NaN operand, or a
    /// negative base with a fractional exponent).
    fn pow_vector(&mut self, x: Value, y: Value) -> Value {
        let fast = math::pow(&mut self.math(), x, y);
        let ok = math::pow_fast_lanes(&mut self.math(), x, y);
        let special = self.b.ins().bnot(ok);
        let any = self.b.ins().vany_true(special);
        let slow = self.b.create_block();
        let done = self.b.create_block();
        let result = self.b.append_block_param(done, types::F32X4);
        self.b.ins().brif(any, slow, &[], done, &[BlockArg::Value(fast)]);
        self.b.set_cold_block(slow);
        self.b.switch_to_block(slow);
        let mut v = fast;
        for lane in 0..4u8 {
            let xs = self.b.ins().extractlane(x, lane);
            let ys = self.b.ins().extractlane(y, lane);
            let r = self.via_f64("kiln_pow", &[xs, ys], DType::F32);
            v = self.b.ins().insertlane(v, r, lane);
        }
        self.b.ins().jump(done, &[BlockArg::Value(v)]);
        self.b.switch_to_block(done);
        result
    }

    /// `sin` or `cos` of four f32 lanes: the vector path, and the scalar f64 function for
    /// every lane when one of them is beyond its range (huge, infinite or NaN).
    fn trig_vector(&mut self, op: UnaryOp, x: Value) -> Value {
        let (cos, name) = match op {
            UnaryOp::Cos => (true, "kiln_cos"),
            _ => (false, "kiln_sin"),
        };
        let fast = math::sin_cos(&mut self.math(), x, cos);
        let ax = self.b.ins().fabs(x);
        let limit = self.b.ins().f32const(math::TRIG_LIMIT);
        let limit = self.b.ins().splat(types::F32X4, limit);
        let outside = self.b.ins().fcmp(FloatCC::UnorderedOrGreaterThan, ax, limit);
        let any = self.b.ins().vany_true(outside);
        let slow = self.b.create_block();
        let done = self.b.create_block();
        let result = self.b.append_block_param(done, types::F32X4);
        self.b.ins().brif(any, slow, &[], done, &[BlockArg::Value(fast)]);
        self.b.set_cold_block(slow);
        self.b.switch_to_block(slow);
        let v = self.lanes_via_f64(name, x, fast, outside);
        self.b.ins().jump(done, &[BlockArg::Value(v)]);
        self.b.switch_to_block(done);
        result
    }

    /// `fast` with the lanes that `mask` selects replaced by the scalar f64 function `name`
    /// of `x`'s lane (only those: a lane's value never depends on its neighbours).
    fn lanes_via_f64(&mut self, name: &'static str, x: Value, fast: Value, mask: Value) -> Value {
        let mut slow = fast;
        for lane in 0..4u8 {
            let s = self.b.ins().extractlane(x, lane);
            let r = self.via_f64(name, &[s], DType::F32);
            slow = self.b.ins().insertlane(slow, r, lane);
        }
        let mask = self.b.ins().bitcast(types::F32X4, MemFlagsData::new(), mask);
        self.b.ins().bitselect(mask, slow, fast)
    }

    fn float_const(&mut self, v: f64, ty: Type) -> Value {
        if ty == types::F32 { self.b.ins().f32const(v as f32) } else { self.b.ins().f64const(v) }
    }

    fn call(&mut self, name: &'static str, args: &[Value]) -> Value {
        let f = self.helpers[name];
        let call = self.b.ins().call(f, args);
        self.b.inst_results(call)[0]
    }

    /// Rounds a value held in a wider register to its dtype, as the reference does after
    /// every op: f16/bf16 through their precision, narrow integers by wrapping.
    fn narrow(&mut self, v: Value, dtype: DType) -> Value {
        match dtype {
            DType::F16 => self.call("kiln_round_f16", &[v]),
            DType::BF16 => self.call("kiln_round_bf16", &[v]),
            DType::I32 => {
                let r = self.b.ins().ireduce(types::I32, v);
                self.b.ins().sextend(types::I64, r)
            }
            DType::U8 => self.b.ins().band_imm_u(v, 0xff),
            _ => v,
        }
    }

    /// An f64 value rounded once to float `dtype` (held in an f32 register for 16-bit
    /// types). Rounding to f32 first and then to 16 bits would round twice, and a value just
    /// above a 16-bit tie would land on the tie and go to even; rounding to f32 *to odd*
    /// keeps the inexactness in the last bit, so the second rounding is the correct one.
    fn demote(&mut self, v: Value, dtype: DType) -> Value {
        match dtype {
            DType::F64 => v,
            DType::F32 => self.b.ins().fdemote(types::F32, v),
            _ => {
                let f = self.b.ins().fdemote(types::F32, v);
                let back = self.b.ins().fpromote(types::F64, f);
                // Ordered: NaN stays as it is.
                let inexact = self.b.ins().fcmp(FloatCC::OrderedNotEqual, back, v);
                let bits = self.b.ins().bitcast(types::I32, MemFlagsData::new(), f);
                let low = self.b.ins().band_imm_u(bits, 1);
                let even = self.b.ins().icmp_imm_s(IntCC::Equal, low, 0);
                let fix = self.b.ins().band(inexact, even);
                // The odd neighbour lies on the other side of `v` from the nearest value.
                let (ab, av) = (self.b.ins().fabs(back), self.b.ins().fabs(v));
                let above = self.b.ins().fcmp(FloatCC::GreaterThan, ab, av);
                let (down, up) =
                    (self.b.ins().iadd_imm_s(bits, -1), self.b.ins().iadd_imm_s(bits, 1));
                let moved = self.b.ins().select(above, down, up);
                let odd = self.b.ins().select(fix, moved, bits);
                let f = self.b.ins().bitcast(types::F32, MemFlagsData::new(), odd);
                self.narrow(f, dtype)
            }
        }
    }

    /// Parameter `p` as a value of `dtype`. Parameter slots hold an f64 for float
    /// parameters and an i64 for integer and bool ones (see [`param_slots`]), so that large
    /// integers pass exactly.
    fn param_value(&mut self, params: Value, p: usize, dtype: DType) -> Value {
        let at = (8 * p) as i32;
        if !dtype.is_float() {
            let i = self.b.ins().load(types::I64, flags(), params, at);
            return if dtype == DType::Bool {
                self.b.ins().icmp_imm_s(IntCC::NotEqual, i, 0)
            } else {
                self.narrow(i, dtype)
            };
        }
        let raw = self.b.ins().load(types::F64, flags(), params, at);
        self.demote(raw, dtype)
    }

    fn load(&mut self, dtype: DType, addr: Value) -> Value {
        let fl = MemFlagsData::new().with_notrap();
        match dtype {
            DType::F32 => self.b.ins().load(types::F32, fl, addr, 0),
            DType::F64 => self.b.ins().load(types::F64, fl, addr, 0),
            DType::F16 => {
                let bits = self.b.ins().uload16(types::I32, fl, addr, 0);
                self.call("kiln_f16_to_f32", &[bits])
            }
            DType::BF16 => {
                let bits = self.b.ins().uload16(types::I32, fl, addr, 0);
                let wide = self.b.ins().ishl_imm_u(bits, 16);
                self.b.ins().bitcast(types::F32, MemFlagsData::new(), wide)
            }
            DType::I64 => self.b.ins().load(types::I64, fl, addr, 0),
            DType::I32 => self.b.ins().sload32(fl, addr, 0),
            DType::U8 => self.b.ins().uload8(types::I64, fl, addr, 0),
            DType::Bool => self.b.ins().load(types::I8, fl, addr, 0),
        }
    }

    fn store(&mut self, v: Value, dtype: DType, addr: Value) {
        let fl = MemFlagsData::new().with_notrap();
        match dtype {
            DType::F32 | DType::F64 | DType::I64 | DType::Bool => {
                self.b.ins().store(fl, v, addr, 0);
            }
            DType::F16 => {
                let bits = self.call("kiln_f32_to_f16", &[v]);
                self.b.ins().istore16(fl, bits, addr, 0);
            }
            DType::BF16 => {
                let bits = self.call("kiln_f32_to_bf16", &[v]);
                self.b.ins().istore16(fl, bits, addr, 0);
            }
            DType::I32 => {
                self.b.ins().istore32(fl, v, addr, 0);
            }
            DType::U8 => {
                self.b.ins().istore8(fl, v, addr, 0);
            }
        }
    }

    /// A float function computed in f64 by a helper, rounded back to `dtype`.
    fn via_f64(&mut self, name: &'static str, args: &[Value], dtype: DType) -> Value {
        let wide: Vec<Value> = args
            .iter()
            .map(|&a| if dtype == DType::F64 { a } else { self.b.ins().fpromote(types::F64, a) })
            .collect();
        let r = self.call(name, &wide);
        self.demote(r, dtype)
    }

    fn unary(&mut self, op: UnaryOp, x: Value, dtype: DType) -> Value {
        if dtype == DType::Bool {
            // logical_not of a bool (0 or 1).
            return self.b.ins().bxor_imm_u(x, 1);
        }
        if !dtype.is_float() {
            let v = match op {
                UnaryOp::Neg => self.b.ins().ineg(x),
                UnaryOp::Abs => self.b.ins().iabs(x),
                UnaryOp::Relu => {
                    let zero = self.iconst(0);
                    self.b.ins().smax(x, zero)
                }
                other => unreachable!("{} is float-only", other.name()),
            };
            return self.narrow(v, dtype);
        }
        if dtype == DType::F32
            && matches!(
                op,
                UnaryOp::Exp
                    | UnaryOp::Log
                    | UnaryOp::Sin
                    | UnaryOp::Cos
                    | UnaryOp::Tanh
                    | UnaryOp::Sigmoid
                    | UnaryOp::Erf
            )
        {
            // One lane of the vector polynomial: an element gets the same bits whether its
            // kernel reaches it in a vector or in a scalar tail (which depends on the layout,
            // so it differs between plans of one program).
            let v = self.b.ins().splat(types::F32X4, x);
            let r = match op {
                UnaryOp::Exp => math::exp(&mut self.math(), v),
                UnaryOp::Log => math::log(&mut self.math(), v),
                UnaryOp::Tanh => math::tanh(&mut self.math(), v),
                UnaryOp::Sigmoid => math::sigmoid(&mut self.math(), v),
                UnaryOp::Erf => math::erf(&mut self.math(), v),
                _ => self.trig_vector(op, v),
            };
            return self.b.ins().extractlane(r, 0);
        }
        let ty = scalar_type(dtype);
        let v = match op {
            UnaryOp::Neg => self.b.ins().fneg(x),
            UnaryOp::Abs => self.b.ins().fabs(x),
            UnaryOp::Sqrt => self.b.ins().sqrt(x),
            UnaryOp::Floor => self.b.ins().floor(x),
            UnaryOp::Ceil => self.b.ins().ceil(x),
            UnaryOp::Round => self.b.ins().nearest(x),
            UnaryOp::Recip => {
                let one = self.float_const(1.0, ty);
                self.b.ins().fdiv(one, x)
            }
            UnaryOp::Relu => {
                let zero = self.float_const(0.0, ty);
                let neg = self.b.ins().fcmp(FloatCC::LessThan, x, zero);
                self.b.ins().select(neg, zero, x)
            }
            UnaryOp::Exp => return self.via_f64("kiln_exp", &[x], dtype),
            UnaryOp::Log => return self.via_f64("kiln_log", &[x], dtype),
            UnaryOp::Sin => return self.via_f64("kiln_sin", &[x], dtype),
            UnaryOp::Cos => return self.via_f64("kiln_cos", &[x], dtype),
            UnaryOp::Tanh => return self.via_f64("kiln_tanh", &[x], dtype),
            UnaryOp::Sigmoid => return self.via_f64("kiln_sigmoid", &[x], dtype),
            UnaryOp::Erf => return self.via_f64("kiln_erf", &[x], dtype),
            UnaryOp::Not => unreachable!("logical_not takes bools"),
        };
        self.narrow(v, dtype)
    }

    fn binary(&mut self, op: BinaryOp, x: Value, y: Value, arg: DType, dtype: DType) -> Value {
        if op.is_comparison() {
            return if arg.is_float() {
                self.b.ins().fcmp(float_cc(op), x, y)
            } else {
                self.b.ins().icmp(int_cc(op), x, y)
            };
        }
        if arg == DType::Bool {
            return match op {
                BinaryOp::And | BinaryOp::Minimum => self.b.ins().band(x, y),
                BinaryOp::Or | BinaryOp::Maximum => self.b.ins().bor(x, y),
                other => unreachable!("{} does not take bools", other.name()),
            };
        }
        if !arg.is_float() {
            let v = match op {
                BinaryOp::Add => self.b.ins().iadd(x, y),
                BinaryOp::Sub => self.b.ins().isub(x, y),
                BinaryOp::Mul => self.b.ins().imul(x, y),
                BinaryOp::Maximum => self.b.ins().smax(x, y),
                BinaryOp::Minimum => self.b.ins().smin(x, y),
                other => unreachable!("{} does not take integers", other.name()),
            };
            return self.narrow(v, dtype);
        }
        let v = match op {
            BinaryOp::Add => self.b.ins().fadd(x, y),
            BinaryOp::Sub => self.b.ins().fsub(x, y),
            BinaryOp::Mul => self.b.ins().fmul(x, y),
            BinaryOp::Div => self.b.ins().fdiv(x, y),
            BinaryOp::Maximum => self.b.ins().fmax(x, y),
            BinaryOp::Minimum => self.b.ins().fmin(x, y),
            BinaryOp::Pow if dtype == DType::F32 => {
                // One lane of the vector `pow`, as for the transcendental functions above.
                let (xv, yv) =
                    (self.b.ins().splat(types::F32X4, x), self.b.ins().splat(types::F32X4, y));
                let r = self.pow_vector(xv, yv);
                return self.b.ins().extractlane(r, 0);
            }
            BinaryOp::Pow => return self.via_f64("kiln_pow", &[x, y], dtype),
            other => unreachable!("{} does not take floats", other.name()),
        };
        self.narrow(v, dtype)
    }

    fn cast(&mut self, v: Value, from: DType, to: DType) -> Value {
        if from == to {
            return v;
        }
        match (from, to) {
            (_, DType::Bool) => {
                if from.is_float() {
                    let zero = self.float_const(0.0, scalar_type(from));
                    self.b.ins().fcmp(FloatCC::NotEqual, v, zero)
                } else {
                    self.b.ins().icmp_imm_s(IntCC::NotEqual, v, 0)
                }
            }
            (DType::Bool, t) if t.is_float() => {
                let wide = self.b.ins().uextend(types::I64, v);
                let f = self.b.ins().fcvt_from_sint(scalar_type(t), wide);
                self.narrow(f, t)
            }
            (DType::Bool, _) => self.b.ins().uextend(types::I64, v),
            (f, t) if f.is_float() && t.is_float() => {
                let (fty, tty) = (scalar_type(f), scalar_type(t));
                if fty == types::F64 {
                    return self.demote(v, t);
                }
                let w = if tty == types::F64 { self.b.ins().fpromote(types::F64, v) } else { v };
                self.narrow(w, t)
            }
            (f, t) if f.is_float() => {
                let i = self.b.ins().fcvt_to_sint_sat(types::I64, v);
                self.narrow(i, t)
            }
            (_, t) if t.is_float() => {
                let f = self.b.ins().fcvt_from_sint(scalar_type(t), v);
                self.narrow(f, t)
            }
            (_, t) => self.narrow(v, t),
        }
    }
}

/// The dtype whose register type is a reduction's accumulator: combining two accumulators
/// must not convert either (an f32 lane is promoted when it is folded in, an f64
/// accumulator is not).
fn acc_ty_dtype(dtype: DType) -> DType {
    if dtype.is_float() { DType::F64 } else { dtype }
}

fn float_cc(op: BinaryOp) -> FloatCC {
    match op {
        BinaryOp::Eq => FloatCC::Equal,
        BinaryOp::Ne => FloatCC::NotEqual,
        BinaryOp::Lt => FloatCC::LessThan,
        BinaryOp::Le => FloatCC::LessThanOrEqual,
        BinaryOp::Gt => FloatCC::GreaterThan,
        BinaryOp::Ge => FloatCC::GreaterThanOrEqual,
        other => unreachable!("{} is not a comparison", other.name()),
    }
}

fn int_cc(op: BinaryOp) -> IntCC {
    match op {
        BinaryOp::Eq => IntCC::Equal,
        BinaryOp::Ne => IntCC::NotEqual,
        BinaryOp::Lt => IntCC::SignedLessThan,
        BinaryOp::Le => IntCC::SignedLessThanOrEqual,
        BinaryOp::Gt => IntCC::SignedGreaterThan,
        BinaryOp::Ge => IntCC::SignedGreaterThanOrEqual,
        other => unreachable!("{} is not a comparison", other.name()),
    }
}

#[cfg(test)]
mod tests;
