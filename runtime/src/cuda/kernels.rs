//! Fused kernels on a GPU: CUDA C from `kiln-codegen`, compiled by NVRTC (`nvrtc.rs`: a
//! cubin for the device's architecture, PTX as the fallback), cached by the kernel's
//! structure (in memory, and on disk under `KILN_CUDA_CACHE` when it is set), and launched
//! on the device's stream.

use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use std::ffi::c_void;

use cudarc::driver::{CudaFunction, DeviceRepr, LaunchConfig, PushKernelArg};
use kiln_codegen::cuda as codegen;
use kiln_codegen::cuda::library::COPIES_PER_LAUNCH;
use kiln_ir::fuse::KernelStep;
use kiln_ir::kernel::Kernel;
use kiln_ir::{DType, Element, Scalar};

use super::Gpu;
use crate::cache::KernelCache;
use crate::sizes::{Decision, Forms, Sizes, reuses};
use crate::{Buffer, RuntimeError};

/// Compiled kernels of one device, in the bounded kernel caches (see [`crate::cache`]);
/// a module evicted from both is unloaded once the last plan holding its functions drops.
#[derive(Default)]
pub(crate) struct Cache {
    /// Each kernel's compiled code (a size-generic kernel under every kernel it serves).
    pub(crate) functions: KernelCache<Kernel, Arc<CudaKernel>>,
    /// The kernel forms compiled, with their size-generic kernels (see [`crate::sizes`]).
    forms: Forms<Arc<CudaKernel>>,
    /// Library kernels' entry points, by source text.
    pub(crate) library: KernelCache<String, Vec<Arc<CudaFunction>>>,
}

/// Whether `gpu` holds `kernel` compiled already.
pub(crate) fn library_cached(gpu: &Gpu, kernel: &codegen::library::LibraryKernel) -> bool {
    gpu.kernels.lock().unwrap_or_else(PoisonError::into_inner).library.contains(&kernel.source)
}

/// The entry points of a library kernel on `gpu`, compiled on first use.
pub(crate) fn library_functions(
    gpu: &'static Gpu,
    kernel: &codegen::library::LibraryKernel,
) -> Result<Vec<Arc<CudaFunction>>, RuntimeError> {
    if let Some(f) =
        gpu.kernels.lock().unwrap_or_else(PoisonError::into_inner).library.get(&kernel.source)
    {
        return Ok(f);
    }
    let ptx_len = kernel.source.len();
    let module = super::nvrtc::load(gpu, &kernel.entries[0], &kernel.source)?;
    let functions = kernel
        .entries
        .iter()
        .map(|e| module.load_function(e).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| gpu.error("finding a compiled kernel", e))?;
    let mut cache = gpu.kernels.lock().unwrap_or_else(PoisonError::into_inner);
    Ok(cache.library.insert(kernel.source.clone(), functions, ptx_len))
}

/// A fused kernel compiled for a device.
pub(crate) struct CudaKernel {
    /// Its entry points: the kernel, then a split reduction's merge.
    functions: Vec<CudaFunction>,
    /// A size-generic kernel's marks ([`codegen::source_generic`]); empty for a kernel
    /// specialised to its sizes.
    marks: Vec<bool>,
}

impl CudaKernel {
    /// Whether it reads some of its sizes when it runs.
    fn is_generic(&self) -> bool {
        kiln_codegen::generic::is_generic(&self.marks)
    }
}

/// The compiled code of `kernel` on `gpu`, and the time compiling took when it was compiled
/// by this call. `planned`: the sizes of the plan being made (`None` at a launch, which
/// takes whatever the plan compiled). In a plan of a program that ran before at other sizes
/// ([`Sizes::Changed`]), a kernel of a form compiled before is compiled size-generic and
/// serves every later kernel of its form ([`crate::sizes`]): one NVRTC compile for every
/// batch size or sequence length; a plan that runs specialised kernels only does not take a
/// generic one from the cache ([`reuses`]).
///
/// # Errors
/// [`RuntimeError::BackendUnavailable`] without NVRTC; [`RuntimeError::Cuda`] with NVRTC's
/// log when the source does not compile (a bug in kiln's code generator).
pub(crate) fn compile_kernel(
    gpu: &'static Gpu,
    kernel: &Kernel,
    planned: Option<Sizes>,
) -> Result<(Arc<CudaKernel>, Option<Duration>), RuntimeError> {
    let ask = {
        let mut cache = gpu.kernels.lock().unwrap_or_else(PoisonError::into_inner);
        let takes =
            |f: &Arc<CudaKernel>| planned.is_none_or(|sizes| reuses(f.is_generic(), sizes, kernel));
        if let Some(f) = cache.functions.get_if(kernel, takes) {
            return Ok((f, None));
        }
        match cache.forms.decide(kernel, codegen::form, planned.unwrap_or(Sizes::First)) {
            Decision::Serve(k) => return Ok((cache.functions.link(kernel.clone(), k), None)),
            Decision::Compile(ask) => ask,
        }
    };
    let started = Instant::now();
    let source = codegen::source_generic(kernel, &ask.marks);
    let names = codegen::entry_names(kernel, &ask.marks);
    let ptx_len = source.len();
    let module = super::nvrtc::load(gpu, &names[0], &source)?;
    let functions = names
        .iter()
        .map(|n| module.load_function(n))
        .collect::<Result<_, _>>()
        .map_err(|e| gpu.error("finding a compiled kernel", e))?;
    let generic = kiln_codegen::generic::is_generic(&ask.marks);
    let compiled = Arc::new(CudaKernel { functions, marks: ask.marks.clone() });
    let took = started.elapsed();
    let mut cache = gpu.kernels.lock().unwrap_or_else(PoisonError::into_inner);
    cache.forms.record(ask, compiled.clone());
    if generic {
        cache.functions.note_generic();
    }
    Ok((cache.functions.insert(kernel.clone(), compiled, ptx_len), Some(took)))
}

/// The counters of `gpu`'s cache of fused kernels (NVRTC compiles, hits, size-generic
/// kernels and the sizes they served).
pub(crate) fn cache_stats(gpu: &Gpu) -> crate::cache::CacheStats {
    gpu.kernels.lock().unwrap_or_else(PoisonError::into_inner).functions.stats()
}

/// Compiles the kernels of `kernels` and the library kernels of `library` (a plan's row
/// groups) that `gpu` has not compiled yet, all at once on the thread pool (NVRTC is
/// thread-safe, and a plan's first run would otherwise compile its new kernels one after
/// another), returning the time each of `kernels` took when this call compiled it.
/// Failures are left for the kernel's run to report.
pub(crate) fn precompile(
    gpu: &'static Gpu,
    kernels: &[&Kernel],
    library: &[codegen::library::LibraryKernel],
    sizes: Sizes,
) -> Vec<Option<Duration>> {
    use rayon::prelude::*;
    enum Job {
        Kernel(usize),
        Library(usize),
    }
    let mut todo: Vec<Job> = Vec::new();
    {
        let cache = gpu.kernels.lock().unwrap_or_else(PoisonError::into_inner);
        let mut seen = std::collections::HashSet::new();
        for (i, k) in kernels.iter().enumerate() {
            let usable = cache.functions.peek(*k).is_some_and(|f| reuses(f.is_generic(), sizes, k));
            if !usable && seen.insert(*k) {
                todo.push(Job::Kernel(i));
            }
        }
        let mut seen = std::collections::HashSet::new();
        for (i, k) in library.iter().enumerate() {
            if !cache.library.contains(&k.source) && seen.insert(&k.source) {
                todo.push(Job::Library(i));
            }
        }
    }
    let mut took = vec![None; kernels.len()];
    let done: Vec<(usize, Option<Duration>)> = todo
        .par_iter()
        .filter_map(|job| match *job {
            Job::Kernel(i) => {
                let compiled = compile_kernel(gpu, kernels[i], Some(sizes));
                Some((i, compiled.ok().and_then(|(_, t)| t)))
            }
            Job::Library(i) => {
                let _ = library_functions(gpu, &library[i]);
                None
            }
        })
        .collect();
    for (i, t) in done {
        took[i] = t;
    }
    took
}

/// One kernel argument, kept alive until the launch has read it.
#[derive(Clone, PartialEq)]
pub(crate) enum Arg {
    Ptr(u64),
    F32(f32),
    F64(f64),
    I64(i64),
    I32(i32),
    I8(i8),
    U8(u8),
    Bool(bool),
    /// The table of a `copies` kernel (`kiln_codegen::cuda::library::copies`), by value.
    Copies(Box<CopyTable>),
}

/// The `Copies` struct of `kiln_codegen::cuda::library::copies`: source, destination and
/// byte count of each copy; unused entries copy nothing.
#[repr(C)]
#[derive(Clone, PartialEq)]
pub(crate) struct CopyTable {
    pub(crate) src: [u64; COPIES_PER_LAUNCH],
    pub(crate) dst: [u64; COPIES_PER_LAUNCH],
    pub(crate) bytes: [u64; COPIES_PER_LAUNCH],
}

// SAFETY: a plain `repr(C)` struct of integers, laid out as the kernel's `Copies`.
unsafe impl DeviceRepr for CopyTable {}

impl Arg {
    /// The address of the value, as a kernel parameter array holds it.
    pub(crate) fn as_param(&self) -> *mut c_void {
        let p: *const c_void = match self {
            Arg::Ptr(v) => (v as *const u64).cast(),
            Arg::F32(v) => (v as *const f32).cast(),
            Arg::F64(v) => (v as *const f64).cast(),
            Arg::I64(v) => (v as *const i64).cast(),
            Arg::I32(v) => (v as *const i32).cast(),
            Arg::I8(v) => (v as *const i8).cast(),
            Arg::U8(v) => (v as *const u8).cast(),
            Arg::Bool(v) => (v as *const bool).cast(),
            Arg::Copies(t) => (&raw const **t).cast(),
        };
        p.cast_mut()
    }
}

impl Arg {
    /// A parameter value in the type the kernel's signature gives it.
    pub(crate) fn param(dtype: DType, v: Scalar) -> Arg {
        match dtype {
            DType::F32 => Arg::F32(f32::from_scalar(v)),
            // Rounded to 16 bits here, once, and exact in the kernel's `float`.
            DType::F16 => Arg::F32(half::f16::from_scalar(v).to_f32()),
            DType::BF16 => Arg::F32(half::bf16::from_scalar(v).to_f32()),
            DType::F64 => Arg::F64(f64::from_scalar(v)),
            DType::I64 => Arg::I64(i64::from_scalar(v)),
            DType::I32 => Arg::I32(i32::from_scalar(v)),
            DType::I8 => Arg::I8(i8::from_scalar(v)),
            DType::U8 => Arg::U8(u8::from_scalar(v)),
            DType::Bool => Arg::Bool(bool::from_scalar(v)),
        }
    }
}

/// Threads per block of elementwise kernels.
const BLOCK: u32 = 256;

/// What [`run_kernel`] launched.
pub(crate) struct KernelLaunch {
    /// The step's outputs.
    pub(crate) outputs: Vec<Buffer>,
    /// The compile time, when the kernel was compiled for this launch.
    pub(crate) compile: Option<Duration>,
    /// The marks of the kernel that ran, when it was size-generic (empty otherwise).
    pub(crate) marks: Vec<bool>,
}

/// Runs `step` on `gpu` over `inputs` (device buffers, in the kernel's input order): its
/// outputs (of `dtypes`), and how it ran.
///
/// # Errors
/// As [`compile_kernel`]; [`RuntimeError::OutOfMemory`]; [`RuntimeError::Cuda`] when the
/// launch fails.
pub(crate) fn run_kernel(
    gpu: &'static Gpu,
    step: &KernelStep,
    dtypes: &[DType],
    inputs: &[&Buffer],
) -> Result<KernelLaunch, RuntimeError> {
    let kernel = &step.kernel;
    let n = kernel.output_len();
    let mut outputs = Vec::with_capacity(dtypes.len());
    for (&dtype, len) in dtypes.iter().zip(kernel.output_lens()) {
        outputs.push(Buffer::on_gpu(gpu, dtype, len)?);
    }
    if n == 0 {
        return Ok(KernelLaunch { outputs, compile: None, marks: Vec::new() });
    }
    // Compiled when the plan was made, with what it knew of the program's sizes; compiled
    // for its sizes here otherwise (the cache dropped it since).
    let (compiled, compile) = compile_kernel(gpu, kernel, None)?;
    let functions = &compiled.functions;
    let mut args = Vec::with_capacity(inputs.len() + outputs.len() + step.params.len() + 1);
    for b in inputs.iter().copied().chain(&outputs) {
        args.push(Arg::Ptr(b.device_ptr(gpu)?));
    }
    for (&t, &v) in codegen::param_types(kernel).iter().zip(&step.params) {
        args.push(Arg::param(t, v));
    }
    args.extend(codegen::size_args(kernel, &compiled.marks).into_iter().map(Arg::I64));
    if codegen::splits_columns(kernel) {
        let count = kernel.shape.numel() / n;
        let chunks = column_chunks(gpu, n, count);
        let part = codegen::split_partials(kernel).expect("split columns have partials");
        let partials = Buffer::on_gpu(gpu, part, n * chunks)?;
        args.push(Arg::Ptr(partials.device_ptr(gpu)?));
        args.push(count_arg(chunks));
        args.push(count_arg(n * chunks));
        // SAFETY: as below, with `part` holding one accumulator per (chunk, column), which
        // thread `chunk * n + column` writes.
        unsafe { launch(gpu, &functions[0], &args, grid_config(gpu, n * chunks)) }?;
        let merge = [
            Arg::Ptr(partials.device_ptr(gpu)?),
            Arg::Ptr(outputs[0].device_ptr(gpu)?),
            count_arg(chunks),
            count_arg(n),
        ];
        // SAFETY: the merge's signature `(part, out0, chunks, n)`: `part` holds `n * chunks`
        // accumulators, written by the launch before on the same stream, `out0` `n`
        // elements, a thread each.
        unsafe { launch(gpu, &functions[1], &merge, grid_config(gpu, n)) }?;
        return Ok(KernelLaunch { outputs, compile, marks: compiled.marks.clone() });
    }
    if let Some(part) = codegen::split_partials(kernel) {
        let count = kernel.shape.numel() / n;
        let chunks = split_chunks(gpu, n, count);
        let partials = Buffer::on_gpu(gpu, part, n * chunks)?;
        args.push(Arg::Ptr(partials.device_ptr(gpu)?));
        args.push(count_arg(chunks));
        args.push(count_arg(n * chunks));
        // SAFETY: as below, with `part` holding one accumulator per (row, chunk), which
        // block `row * chunks + chunk` writes.
        unsafe {
            launch(gpu, &functions[0], &args, block_config(gpu, n * chunks, count / chunks))
        }?;
        let merge = [
            Arg::Ptr(partials.device_ptr(gpu)?),
            Arg::Ptr(outputs[0].device_ptr(gpu)?),
            count_arg(chunks),
            count_arg(n),
        ];
        // SAFETY: the merge's signature `(part, out0, chunks, n)`: `part` holds `n * chunks`
        // accumulators, written by the launch before on the same stream, and `out0` `n`
        // elements.
        unsafe { launch(gpu, &functions[1], &merge, block_config(gpu, n, chunks)) }?;
        return Ok(KernelLaunch { outputs, compile, marks: compiled.marks.clone() });
    }
    args.push(count_arg(n));
    let config = launch_config(gpu, kernel, n);
    // SAFETY: the arguments match the generated signature (inputs, outputs, parameters of
    // `param_types`, the count); every output holds `n` elements, which the kernel writes
    // (grid-stride loops bounded by `n`); inputs are read through views the graph checked to
    // lie inside their buffers; all buffers live until the stream has run the kernel, since
    // freed blocks are reused only by later work on the same stream.
    unsafe { launch(gpu, &functions[0], &args, config) }?;
    Ok(KernelLaunch { outputs, compile, marks: compiled.marks.clone() })
}

fn count_arg(n: usize) -> Arg {
    Arg::I64(i64::try_from(n).unwrap_or(i64::MAX))
}

/// How many chunks each of the `rows` rows of a split reduction is cut into: enough blocks
/// for four per multiprocessor, but at least 4096 positions per chunk.
pub(crate) fn split_chunks(gpu: &Gpu, rows: usize, count: usize) -> usize {
    let wanted = (4 * gpu.sms as usize).div_ceil(rows.max(1));
    wanted.clamp(1, (count / 4096).max(1))
}

/// How many chunks each of the `columns` columns of a split column reduction is cut into:
/// about as many chunks as positions per chunk (the merge walks the chunks as a thread walks
/// a chunk), fewer where that would give the device more than about 2048 threads per
/// multiprocessor, and at least 16 positions per chunk.
pub(crate) fn column_chunks(gpu: &Gpu, columns: usize, count: usize) -> usize {
    let balanced = (count as f64).sqrt().ceil() as usize;
    let fill = (2048 * gpu.sms as usize).div_ceil(columns.max(1));
    balanced.min(fill).clamp(1, (count / 16).max(1))
}

/// Queues `function` with `args` on the device's stream.
///
/// # Safety
/// `args` must match the function's parameters in number and type, and every buffer they
/// address must hold what the kernel reads and writes, and stay allocated until the stream
/// has run it (buffers freed later are reused only by later work on the same stream).
pub(crate) unsafe fn launch(
    gpu: &Gpu,
    function: &CudaFunction,
    args: &[Arg],
    config: LaunchConfig,
) -> Result<(), RuntimeError> {
    if let Some(updated) = super::graph::update_launch(gpu, function, args, config) {
        return updated;
    }
    gpu.bind()?;
    let stream = super::graph::stream(gpu);
    let mut launch = stream.launch_builder(function);
    for a in args {
        match a {
            Arg::Ptr(v) => launch.arg(v),
            Arg::F32(v) => launch.arg(v),
            Arg::F64(v) => launch.arg(v),
            Arg::I64(v) => launch.arg(v),
            Arg::I32(v) => launch.arg(v),
            Arg::I8(v) => launch.arg(v),
            Arg::U8(v) => launch.arg(v),
            Arg::Bool(v) => launch.arg(v),
            Arg::Copies(t) => launch.arg(&**t),
        };
    }
    // SAFETY: the caller's contract.
    unsafe { launch.launch(config) }.map_err(|e| gpu.error("launching a kernel", e))?;
    super::graph::note_launch(gpu, function, args, config)
}

/// A grid-stride launch over `n` items: blocks of [`BLOCK`] threads, at most 32 blocks per
/// multiprocessor.
pub(crate) fn grid_config(gpu: &Gpu, n: usize) -> LaunchConfig {
    let max_blocks = u64::from(gpu.sms) * 32;
    let blocks = (n as u64).div_ceil(u64::from(BLOCK)).clamp(1, max_blocks);
    LaunchConfig {
        grid_dim: (u32::try_from(blocks).unwrap_or(1), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Grid and block sizes: elementwise kernels and reductions by columns (one thread per
/// output) use blocks of [`BLOCK`] threads and at most 32 blocks per multiprocessor (the loop
/// strides over the rest); other reductions use one block per row, with up to 1024 threads,
/// as many as the row has elements (a multiple of 32).
fn launch_config(gpu: &Gpu, kernel: &Kernel, n: usize) -> LaunchConfig {
    match kernel.reduce {
        None => grid_config(gpu, n),
        Some(_) if codegen::reduces_by_columns(kernel) => grid_config(gpu, n),
        Some(_) => block_config(gpu, n, kernel.shape.numel() / n.max(1)),
    }
}

/// One block per row for `rows` rows of `len` positions: as many threads as the row has
/// positions (a multiple of 32, at most 1024), at most 32 blocks per multiprocessor (the
/// kernels loop over the rest).
pub(crate) fn block_config(gpu: &Gpu, rows: usize, len: usize) -> LaunchConfig {
    let max_blocks = u64::from(gpu.sms) * 32;
    let threads = (len.div_ceil(32) * 32).clamp(32, 1024) as u32;
    LaunchConfig {
        grid_dim: (u32::try_from((rows as u64).clamp(1, max_blocks)).unwrap_or(1), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}
