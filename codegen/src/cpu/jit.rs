//! The JIT driver: one kernel compiled into a JIT module of its own (so the kernel cache can
//! free kernels one by one), for the host ISA, which is detected once per process.

use std::collections::HashMap;

use cranelift_codegen::ir::{AbiParam, InstBuilder, UserFuncName, types};
use cranelift_codegen::isa::{self, CallConv};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{ArenaMemoryProvider, JITBuilder, JITModule};
use cranelift_module::{FuncId, Linkage, Module, default_libcall_names};
use kiln_ir::DType;
use kiln_ir::kernel::{ExprKind, Kernel};

use super::staging::{self, Staging};
use super::strategy::{
    COLUMN_BLOCK, STRIP_ROWS, column_type, loop_lanes, strip_width, vector_type,
};
use super::translate::Translator;
use super::{helpers, logsumexp, wide};
use crate::CodegenError;
use crate::generic;
use crate::walk::Layout;
/// The entry point of a compiled kernel.
type KernelFn = unsafe extern "C" fn(*const *mut u8, *const u64, u64, u64);

/// A compiled kernel: its machine code (owned by its own JIT module, so that the cache can
/// drop kernels one by one) and its text.
pub struct CpuKernel {
    module: Option<JITModule>,
    entry: KernelFn,
    clif: String,
    code_bytes: usize,
    vectorized: bool,
    min_chunk: usize,
    /// A size-generic kernel's marks: which of its walks' numbers it reads at run time
    /// ([`crate::generic`]); empty for a kernel specialised to its sizes.
    dynamic: Vec<bool>,
}

// SAFETY: the module's code is immutable once finalized and the entry point is a plain
// function pointer; sharing them across threads is what running a kernel in parallel does.
unsafe impl Send for CpuKernel {}
// SAFETY: as above.
unsafe impl Sync for CpuKernel {}

impl CpuKernel {
    /// The fewest output positions a parallel task should take: a reduction vectorized
    /// across its outputs works in blocks of [`COLUMN_BLOCK`] of them, and smaller tasks
    /// would waste its vector lanes and cache lines (measured: tasks of 64 or 256 outputs
    /// of a column sum over 2,048 rows ran slower than blocks of 1,024). A reduction with
    /// fewer outputs than that still splits them evenly across the threads when there is
    /// enough work (the runtime's launch): one task would leave the other threads idle.
    pub fn min_chunk(&self) -> usize {
        self.min_chunk
    }

    /// Runs the kernel over output positions `start..end`. The entry point is only reached
    /// through this borrow, never copied out, so the code cannot be called after the
    /// kernel (and its JIT module) is dropped.
    ///
    /// # Safety
    /// The entry point's contract (see the module docs): `ptrs` holds the kernel's input
    /// buffers then its outputs, each large enough for the positions `start..end` address;
    /// `params` its parameter slots ([`param_slots`]); no other call writes the same output
    /// positions meanwhile.
    pub unsafe fn call(&self, ptrs: *const *mut u8, params: *const u64, start: u64, end: u64) {
        // SAFETY: the caller's contract; `self` owns the code for the length of the call.
        unsafe { (self.entry)(ptrs, params, start, end) }
    }

    /// The Cranelift IR of the kernel, as text.
    pub fn clif(&self) -> &str {
        &self.clif
    }

    /// The size of the machine code, in bytes (what the kernel cache counts).
    pub fn code_bytes(&self) -> usize {
        self.code_bytes
    }

    /// Whether the inner loop runs on SIMD vectors.
    pub fn vectorized(&self) -> bool {
        self.vectorized
    }

    /// Whether the kernel reads some of its sizes when it runs (see [`compile_generic`]).
    pub fn is_generic(&self) -> bool {
        self.dynamic.contains(&true)
    }

    /// A generic kernel's marks ([`compile_generic`]); empty for a specialised one.
    pub fn marks(&self) -> &[bool] {
        &self.dynamic
    }

    /// The 64-bit slots the entry point reads for `kernel` (this kernel's form, at its
    /// sizes) with parameter values `values`: [`param_slots`], then for a generic kernel the
    /// sizes it reads at run time.
    pub fn slots(&self, kernel: &Kernel, values: &[kiln_ir::Scalar]) -> Vec<u64> {
        let mut slots = param_slots(kernel, values);
        if self.is_generic() {
            let (_, sizes) = generic::layouts(kernel, &self.dynamic);
            slots.extend(sizes.iter().map(|&v| v as u64));
        }
        slots
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

/// Address space reserved for one kernel's module (its code, constants and helpers; pages
/// are committed only as they are written, so the reservation costs no memory).
const JIT_RESERVATION: usize = 32 << 20;

/// A JIT module for one kernel, with the helpers' addresses.
fn new_module(isa: isa::OwnedTargetIsa) -> Result<JITModule, CodegenError> {
    let mut builder = JITBuilder::with_isa(isa, default_libcall_names());
    // One contiguous reservation per module: the kernel calls the register-preserving helpers
    // defined beside it with 32-bit relative calls, which reach ±2 GiB. The default provider
    // takes each section from the global allocator, which can put them terabytes apart (glibc
    // serves large blocks from fresh mappings and small ones from the heap): seen on a 16-core
    // machine running the random-program test, where the relocation failed.
    let arena = ArenaMemoryProvider::new_with_size(JIT_RESERVATION)
        .map_err(|e| CodegenError::Cranelift(format!("reserving JIT memory: {e}")))?;
    builder.memory_provider(Box::new(arena));
    for (name, ptr) in helpers::symbols() {
        builder.symbol(name, ptr);
    }
    Ok(JITModule::new(builder))
}

/// What of the CPU the generated code relies on beyond the baseline ISA: the choices that
/// make two hosts' kernels differ (their Cranelift IR included).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CpuFeatures {
    /// Vector fused multiply-add lowers to one instruction (x86 FMA3; always on aarch64):
    /// polynomials take Horner steps as `fma`.
    pub fma: bool,
    /// The batch functions run on wide vectors (x86 AVX2 with FMA, or AVX-512): long rows
    /// of transcendentals are staged through them (`staging.rs`, `rows.rs`).
    pub wide: bool,
}

impl CpuFeatures {
    /// An x86-64 host at level v3 or above (AVX2 and FMA; AVX-512 changes only which batch
    /// functions run, not the generated code): the level kiln's code snapshots are taken at.
    pub const X86_64_V3: CpuFeatures = CpuFeatures { fma: true, wide: true };
    /// An x86-64 host below v3 (SSE only, the baseline every x86-64 has).
    pub const X86_64_BASELINE: CpuFeatures = CpuFeatures { fma: false, wide: false };

    /// This host's.
    ///
    /// # Errors
    /// [`CodegenError::Cranelift`] if the host is not supported.
    pub fn host() -> Result<CpuFeatures, CodegenError> {
        Ok(CpuFeatures { fma: has_fma(&*host_isa()?), wide: wide::lanes().is_some() })
    }
}

/// Compiles `kernel` for the host CPU.
///
/// # Errors
/// [`CodegenError::Cranelift`] if Cranelift rejects the generated function (a bug in this
/// module), the host is not supported, or no address space is left to reserve.
pub fn compile(kernel: &Kernel) -> Result<CpuKernel, CodegenError> {
    compile_generic(kernel, &[])
}

/// Compiles `kernel` for the host CPU as a size-generic kernel: the numbers of its walks
/// that `dynamic` marks ([`generic::numbers`]' order) are read when it runs, from the slots
/// [`CpuKernel::slots`] appends, so the kernel serves every kernel of its
/// [`KernelForm`](generic::KernelForm) whose other numbers are the same. Its rows are not
/// walked in strips and strided lanes are not gathered into vectors. No marks (or none
/// set) compile the kernel specialised to its sizes, as [`compile`] does.
///
/// # Errors
/// As [`compile`].
pub fn compile_generic(kernel: &Kernel, dynamic: &[bool]) -> Result<CpuKernel, CodegenError> {
    match build(kernel, CpuFeatures::host()?, Output::Machine, dynamic)? {
        Built::Kernel(k) => Ok(*k),
        Built::Text(_) => unreachable!("machine code was asked for"),
    }
}

/// The Cranelift IR kiln generates for `kernel` on a host with `features` (which need not be
/// this one's: nothing is compiled to machine code), for snapshots that read the same on
/// every host.
///
/// # Errors
/// As [`compile`].
pub fn clif_with(kernel: &Kernel, features: CpuFeatures) -> Result<String, CodegenError> {
    clif_generic(kernel, features, &[])
}

/// [`clif_with`] for the size-generic kernel [`compile_generic`] makes with `dynamic`.
///
/// # Errors
/// As [`compile`].
pub fn clif_generic(
    kernel: &Kernel,
    features: CpuFeatures,
    dynamic: &[bool],
) -> Result<String, CodegenError> {
    match build(kernel, features, Output::Text, dynamic)? {
        Built::Text(text) => Ok(text),
        Built::Kernel(k) => Ok(k.clif.clone()),
    }
}

/// What [`build`] goes as far as.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Output {
    /// Machine code, ready to run.
    Machine,
    /// The Cranelift IR only.
    Text,
}

/// What [`build`] made.
enum Built {
    Kernel(Box<CpuKernel>),
    Text(String),
}

fn build(
    kernel: &Kernel,
    features: CpuFeatures,
    output: Output,
    dynamic: &[bool],
) -> Result<Built, CodegenError> {
    // A `logsumexp` of f32 values widened to f64 folds the f32 values and stores the f64
    // result: the kernel compiled is the one without the widening.
    let (narrowed, lse_result) = logsumexp::fold_of(kernel)?;
    let kernel = narrowed.as_ref().unwrap_or(kernel);
    let CpuFeatures { fma, wide } = features;
    let mut module = new_module(host_isa()?)?;
    let mut ctx = module.make_context();
    let mut fctx = FunctionBuilderContext::new();

    let id = declare_entry(&mut module, &mut ctx, kernel)?;

    let Choices {
        outer_layout,
        walk_layout,
        size_slots,
        vector,
        columns,
        strip,
        long_rows,
        inner,
        is_generic,
    } = choose(kernel, dynamic);
    // A Vec, not a map: declaration order shows in the CLIF text, which must be deterministic.
    let mut helper_ids = Vec::new();
    for h in helpers::Helper::ALL {
        let hid = module
            .declare_function(h.name(), Linkage::Import, &h.signature(&module))
            .map_err(|e| CodegenError::Cranelift(e.to_string()))?;
        helper_ids.push((h.name(), hid));
    }
    let staged = if columns.is_none() && strip.is_none() {
        staging::staged_ops(kernel, vector, long_rows, features)
    } else {
        Vec::new()
    };
    let preserving = declare_preserving(&mut module, &staged)?;
    let target = module.target_config();
    {
        let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
        let mut helper_refs = HashMap::new();
        for (name, hid) in helper_ids.iter().chain(&preserving) {
            helper_refs.insert(*name, module.declare_func_in_func(*hid, b.func));
        }
        // A column reduction's lanes run across its outputs; its parameters splat the same.
        let lanes = vector.or(columns);
        let mut t = Translator {
            kernel,
            walk: &walk_layout,
            sizes: Vec::new(),
            size_slots,
            long_rows,
            vector: lanes,
            strip,
            fma,
            wide,
            helpers: helper_refs,
            b: &mut b,
            staging: None,
            stage_mode: Default::default(),
            param_splats: None,
        };
        if !staged.is_empty() {
            t.staging = Some(Staging::new(kernel, staged.clone(), t.b));
        }
        match (kernel.reduce, columns) {
            (Some(red), _) if red.op == kiln_ir::ReduceOp::LogSumExp => {
                t.body_logsumexp(&outer_layout, lse_result);
            }
            (Some(red), Some((_, lanes))) => t.body_reduce_columns(red, &outer_layout, lanes),
            (Some(red), None) => t.body_reduce(red, &outer_layout),
            (None, _) => t.body(),
        }
        b.seal_all_blocks();
        b.finalize(target);
    }
    let clif = ctx.func.display().to_string();
    if output == Output::Text {
        return Ok(Built::Text(clif));
    }
    ctx.set_disasm(kiln_ir::settings::Setting::Disasm.on());
    module
        .define_function(id, &mut ctx)
        .map_err(|e| CodegenError::Cranelift(format!("{e:?}\n{clif}")))?;
    if let Some(code) = ctx.compiled_code().and_then(|c| c.vcode.clone()) {
        eprintln!("{code}");
    }
    let code_bytes = ctx.compiled_code().map_or(0, |c| c.code_buffer().len());
    module.clear_context(&mut ctx);
    define_preserving(&mut module, &mut ctx, &staged, &preserving, &helper_ids)?;
    module.finalize_definitions().map_err(|e| CodegenError::Cranelift(e.to_string()))?;
    let code = module.get_finalized_function(id);
    // SAFETY: `code` is the finalized function declared above with exactly this signature.
    let entry = unsafe { std::mem::transmute::<*const u8, KernelFn>(code) };
    Ok(Built::Kernel(Box::new(CpuKernel {
        module: Some(module),
        entry,
        clif,
        code_bytes,
        vectorized: vector.is_some() || columns.is_some(),
        min_chunk: match (columns, strip) {
            (Some(_), _) => COLUMN_BLOCK,
            (None, Some(_)) => STRIP_ROWS * inner,
            (None, None) => 1,
        },
        dynamic: if is_generic { dynamic.to_vec() } else { Vec::new() },
    })))
}

/// Declares the kernel's entry point `(bufs, params, start, end)` in `module` and gives
/// `ctx`'s function its signature and name.
fn declare_entry(
    module: &mut JITModule,
    ctx: &mut cranelift_codegen::Context,
    kernel: &Kernel,
) -> Result<FuncId, CodegenError> {
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
    Ok(id)
}

/// The loops a kernel gets, and the layouts they walk.
struct Choices {
    outer_layout: Layout,
    walk_layout: Layout,
    /// How many size slots a generic kernel reads (0 for a specialised one).
    size_slots: usize,
    vector: Option<(DType, cranelift_codegen::ir::Type)>,
    columns: Option<(DType, cranelift_codegen::ir::Type)>,
    strip: Option<usize>,
    long_rows: bool,
    /// The row's length.
    inner: usize,
    is_generic: bool,
}

/// The loops of `kernel`, compiled with the numbers `dynamic` marks read at run time.
fn choose(kernel: &Kernel, dynamic: &[bool]) -> Choices {
    // A reduction walks its kept dimensions per output and its reduced ones in rows.
    let (outer, walk) = generic::walks(kernel);
    let is_generic = dynamic.contains(&true);
    // A generic kernel's choices are its form's (`generic.rs`): no gathered lanes, no strips.
    let vector = if is_generic { vector_type(kernel, &walk) } else { loop_lanes(kernel, &walk) };
    let columns = column_type(kernel, &walk, &outer);
    let strip = match kernel.reduce {
        None if !is_generic => strip_width(kernel, &walk),
        _ => None,
    };
    let ([outer_layout, walk_layout], sizes) = generic::layouts(kernel, dynamic);
    let inner = walk.dims.last().copied().unwrap_or(1);
    Choices {
        outer_layout,
        walk_layout,
        size_slots: sizes.len(),
        vector,
        columns,
        strip,
        long_rows: inner >= staging::MIN_ROW,
        inner,
        is_generic,
    }
}

/// The host CPU as the planner sees it: transcendental functions are polynomials of some
/// thirty instructions on 128-bit vectors, so a shared one is stored rather than computed
/// again, and a reduction stores the values it reduces in the same pass; `gemm` multiplies
/// f32, f64 and f16, bf16 through f32, and integers have a parallel loop of their own;
/// attention reads strided operands.
pub const TARGET: kiln_ir::target::Target = kiln_ir::target::Target {
    name: "cpu",
    costs: kiln_ir::target::OpCosts { transcendental: 32, division: 4, arithmetic: 1 },
    gemm_dtypes: &[
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::U8,
    ],
    library_reads_views: true,
    reductions_store_inputs: true,
    fused_logsumexp: true,
    writes_in_place: true,
    custom_ops_read_views: true,
};

/// The host's ISA, detected and configured once per process (an `Arc`: each kernel's JIT
/// module holds a handle).
fn host_isa() -> Result<isa::OwnedTargetIsa, CodegenError> {
    static HOST: std::sync::LazyLock<Result<isa::OwnedTargetIsa, CodegenError>> =
        std::sync::LazyLock::new(detect_host_isa);
    HOST.clone()
}

fn detect_host_isa() -> Result<isa::OwnedTargetIsa, CodegenError> {
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

/// Declares, for each batch function `staged` calls, the module's register-preserving
/// function that calls it (`helpers::Batch::preserving`).
fn declare_preserving(
    module: &mut JITModule,
    staged: &[(usize, helpers::Batch)],
) -> Result<Vec<(&'static str, FuncId)>, CodegenError> {
    let mut out: Vec<(&'static str, FuncId)> = Vec::new();
    for &(_, h) in staged {
        if out.iter().any(|&(n, _)| n == h.preserving()) {
            continue;
        }
        let mut sig = module.make_signature();
        sig.call_conv = CallConv::PreserveAll;
        sig.params.extend([AbiParam::new(types::I64), AbiParam::new(types::I64)]);
        let id = module
            .declare_function(h.preserving(), Linkage::Local, &sig)
            .map_err(|e| CodegenError::Cranelift(e.to_string()))?;
        out.push((h.preserving(), id));
    }
    Ok(out)
}

/// Defines the functions [`declare_preserving`] declared: each passes its arguments on to
/// the System V batch function and returns, saving every register the call clobbers.
fn define_preserving(
    module: &mut JITModule,
    ctx: &mut cranelift_codegen::Context,
    staged: &[(usize, helpers::Batch)],
    preserving: &[(&'static str, FuncId)],
    helper_ids: &[(&'static str, FuncId)],
) -> Result<(), CodegenError> {
    for &(name, id) in preserving {
        let batch = staged.iter().find(|(_, h)| h.preserving() == name).expect("a staged helper").1;
        let helper = helpers::Helper::Batch(batch).name();
        let target = helper_ids.iter().find(|(n, _)| *n == helper).expect("declared").1;
        let mut sig = module.make_signature();
        sig.call_conv = CallConv::PreserveAll;
        sig.params.extend([AbiParam::new(types::I64), AbiParam::new(types::I64)]);
        ctx.func.signature = sig;
        ctx.func.name = UserFuncName::testcase(name);
        let mut fctx = FunctionBuilderContext::new();
        {
            let mut b = FunctionBuilder::new(&mut ctx.func, &mut fctx);
            let f = module.declare_func_in_func(target, b.func);
            let entry = b.create_block();
            b.append_block_params_for_function_params(entry);
            b.switch_to_block(entry);
            let args = b.block_params(entry).to_vec();
            b.ins().call(f, &args);
            b.ins().return_(&[]);
            b.seal_all_blocks();
            b.finalize(module.target_config());
        }
        ctx.set_disasm(kiln_ir::settings::Setting::Disasm.on());
        module.define_function(id, ctx).map_err(|e| CodegenError::Cranelift(format!("{e:?}")))?;
        if let Some(code) = ctx.compiled_code().and_then(|c| c.vcode.clone()) {
            eprintln!("{code}");
        }
        module.clear_context(ctx);
    }
    Ok(())
}
