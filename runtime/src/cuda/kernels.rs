//! Fused kernels on a GPU: CUDA C from `kiln-codegen`, compiled by NVRTC for the device's own
//! architecture, cached by the kernel's structure (in memory, and on disk under
//! `KILN_CUDA_CACHE` when it is set), and launched on the device's stream.

use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::{CompileOptions, Ptx};
use kiln_codegen::cuda as codegen;
use kiln_ir::fuse::KernelStep;
use kiln_ir::kernel::Kernel;
use kiln_ir::{DType, Element, Scalar};
use rustc_hash::FxHashMap as HashMap;

use super::Gpu;
use crate::{Buffer, RuntimeError};

/// Compiled kernels of one device, keyed by the kernel itself (its structural hash picks the
/// bucket, equality confirms).
#[derive(Default)]
pub(crate) struct Cache {
    functions: HashMap<Kernel, Arc<CudaFunction>>,
    /// Library kernels' entry points, by source text.
    library: HashMap<String, Vec<Arc<CudaFunction>>>,
}

/// The entry points of a library kernel on `gpu`, compiled on first use.
pub(crate) fn library_functions(
    gpu: &'static Gpu,
    kernel: &codegen::library::LibraryKernel,
) -> Result<Vec<Arc<CudaFunction>>, RuntimeError> {
    if let Some(f) =
        gpu.kernels.lock().unwrap_or_else(PoisonError::into_inner).library.get(&kernel.source)
    {
        return Ok(f.clone());
    }
    let ptx = ptx_for(gpu, &kernel.entries[0], &kernel.source)?;
    gpu.bind()?;
    let module = gpu.ctx.load_module(ptx).map_err(|e| gpu.error("loading a compiled kernel", e))?;
    let functions = kernel
        .entries
        .iter()
        .map(|e| module.load_function(e).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| gpu.error("finding a compiled kernel", e))?;
    let mut cache = gpu.kernels.lock().unwrap_or_else(PoisonError::into_inner);
    Ok(cache.library.entry(kernel.source.clone()).or_insert(functions).clone())
}

/// The compiled function for `kernel` on `gpu`, and the time compiling took when it was
/// compiled by this call.
///
/// # Errors
/// [`RuntimeError::BackendUnavailable`] without NVRTC; [`RuntimeError::Cuda`] with NVRTC's
/// log when the source does not compile (a bug in kiln's code generator).
pub(crate) fn compile_kernel(
    gpu: &'static Gpu,
    kernel: &Kernel,
) -> Result<(Arc<CudaFunction>, Option<Duration>), RuntimeError> {
    if let Some(f) =
        gpu.kernels.lock().unwrap_or_else(PoisonError::into_inner).functions.get(kernel)
    {
        return Ok((f.clone(), None));
    }
    let started = Instant::now();
    let source = codegen::source(kernel);
    let name = codegen::entry_name(kernel);
    let ptx = ptx_for(gpu, &name, &source)?;
    gpu.bind()?;
    let module = gpu.ctx.load_module(ptx).map_err(|e| gpu.error("loading a compiled kernel", e))?;
    let function = Arc::new(
        module.load_function(&name).map_err(|e| gpu.error("finding a compiled kernel", e))?,
    );
    let took = started.elapsed();
    let mut cache = gpu.kernels.lock().unwrap_or_else(PoisonError::into_inner);
    Ok((cache.functions.entry(kernel.clone()).or_insert(function).clone(), Some(took)))
}

/// The PTX of `source`: from the disk cache when `KILN_CUDA_CACHE` names a directory holding
/// it (the source is stored beside it and must match), else compiled now (and stored).
fn ptx_for(gpu: &Gpu, name: &str, source: &str) -> Result<Ptx, RuntimeError> {
    let arch = format!("sm_{}{}", gpu.arch.0, gpu.arch.1);
    let dir = std::env::var_os("KILN_CUDA_CACHE").map(std::path::PathBuf::from);
    let paths = dir
        .as_ref()
        .map(|d| (d.join(format!("{name}_{arch}.cu")), d.join(format!("{name}_{arch}.ptx"))));
    if let Some((cu, ptx)) = &paths
        && std::fs::read_to_string(cu).is_ok_and(|stored| stored == source)
        && let Ok(text) = std::fs::read_to_string(ptx)
    {
        return Ok(Ptx::from_src(text));
    }
    // SAFETY: only looks the library up; cudarc's NVRTC calls panic when it is missing.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(RuntimeError::BackendUnavailable {
            device: gpu.device(),
            reason: "NVRTC (libnvrtc.so) was not found: it compiles kiln's CUDA kernels; install \
                     the CUDA toolkit or the nvidia-cuda-nvrtc wheel and put its lib directory \
                     on LD_LIBRARY_PATH"
                .into(),
        });
    }
    // No contraction of `a * b + c` into one rounding: every operation rounds as on the CPU and
    // in the reference executor, so comparisons and casts of computed values agree exactly.
    // IEEE division and square root, and denormals, are NVRTC's defaults.
    let opts =
        CompileOptions { arch: Some(gpu.arch_flag), fmad: Some(false), ..Default::default() };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, opts).map_err(|e| {
        gpu.error(&format!("compiling kernel {name} with NVRTC (a bug in kiln)"), format!("{e:?}"))
    })?;
    if let Some((cu, path)) = &paths {
        // The disk cache is an optimization: failing to write it is not an error.
        let _ = std::fs::create_dir_all(dir.as_deref().unwrap_or(std::path::Path::new(".")));
        let _ = std::fs::write(path, ptx.to_src()).and_then(|()| std::fs::write(cu, source));
    }
    Ok(ptx)
}

/// One kernel argument, kept alive until the launch has read it.
pub(crate) enum Arg {
    Ptr(u64),
    F32(f32),
    F64(f64),
    I64(i64),
    I32(i32),
    U8(u8),
    Bool(bool),
}

impl Arg {
    /// A parameter value in the type the kernel's signature gives it.
    fn param(dtype: DType, v: Scalar) -> Arg {
        match dtype {
            DType::F32 | DType::F16 | DType::BF16 => Arg::F32(f32::from_scalar(v)),
            DType::F64 => Arg::F64(f64::from_scalar(v)),
            DType::I64 => Arg::I64(i64::from_scalar(v)),
            DType::I32 => Arg::I32(i32::from_scalar(v)),
            DType::U8 => Arg::U8(u8::from_scalar(v)),
            DType::Bool => Arg::Bool(bool::from_scalar(v)),
        }
    }
}

/// Threads per block of elementwise kernels.
const BLOCK: u32 = 256;

/// Runs `step` on `gpu` over `inputs` (device buffers, in the kernel's input order), returning
/// its outputs (of `dtypes`) and the compile time when the kernel was compiled for this call.
///
/// # Errors
/// As [`compile_kernel`]; [`RuntimeError::OutOfMemory`]; [`RuntimeError::Cuda`] when the
/// launch fails.
pub(crate) fn run_kernel(
    gpu: &'static Gpu,
    step: &KernelStep,
    dtypes: &[DType],
    inputs: &[&Buffer],
) -> Result<(Vec<Buffer>, Option<Duration>), RuntimeError> {
    let kernel = &step.kernel;
    let n = kernel.output_len();
    let mut outputs = Vec::with_capacity(dtypes.len());
    for (&dtype, len) in dtypes.iter().zip(kernel.output_lens()) {
        outputs.push(Buffer::on_gpu(gpu, dtype, len)?);
    }
    if n == 0 {
        return Ok((outputs, None));
    }
    let (function, compile) = compile_kernel(gpu, kernel)?;
    let mut args = Vec::with_capacity(inputs.len() + outputs.len() + step.params.len() + 1);
    for b in inputs.iter().copied().chain(&outputs) {
        args.push(Arg::Ptr(b.device_ptr(gpu)?));
    }
    for (&t, &v) in codegen::param_types(kernel).iter().zip(&step.params) {
        args.push(Arg::param(t, v));
    }
    args.push(Arg::I64(i64::try_from(n).unwrap_or(i64::MAX)));
    let config = launch_config(gpu, kernel, n);
    // SAFETY: the arguments match the generated signature (inputs, outputs, parameters of
    // `param_types`, the count); every output holds `n` elements, which the kernel writes
    // (grid-stride loops bounded by `n`); inputs are read through views the graph checked to
    // lie inside their buffers; all buffers live until the stream has run the kernel, since
    // freed blocks are reused only by later work on the same stream.
    unsafe { launch(gpu, &function, &args, config) }?;
    Ok((outputs, compile))
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
    gpu.bind()?;
    let mut launch = gpu.stream.launch_builder(function);
    for a in args {
        match a {
            Arg::Ptr(v) => launch.arg(v),
            Arg::F32(v) => launch.arg(v),
            Arg::F64(v) => launch.arg(v),
            Arg::I64(v) => launch.arg(v),
            Arg::I32(v) => launch.arg(v),
            Arg::U8(v) => launch.arg(v),
            Arg::Bool(v) => launch.arg(v),
        };
    }
    // SAFETY: the caller's contract.
    unsafe { launch.launch(config) }.map_err(|e| gpu.error("launching a kernel", e))?;
    Ok(())
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
    let max_blocks = u64::from(gpu.sms) * 32;
    let blocks = |wanted: u64| u32::try_from(wanted.clamp(1, max_blocks)).unwrap_or(1);
    match kernel.reduce {
        None => grid_config(gpu, n),
        Some(_) if codegen::reduces_by_columns(kernel) => grid_config(gpu, n),
        Some(_) => {
            let row = kernel.shape.numel() / n.max(1);
            let threads = (row.div_ceil(32) * 32).clamp(32, 1024) as u32;
            LaunchConfig {
                grid_dim: (blocks(n as u64), 1, 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            }
        }
    }
}
