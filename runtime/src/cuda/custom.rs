//! User-defined opaque ops on a GPU: the user's CUDA C, compiled once per source with kiln's
//! helpers and options, launched with kiln's convention (see [`crate::custom::CudaKernel`]).

use std::sync::{Arc, PoisonError};

use cudarc::driver::CudaFunction;
use kiln_ir::Custom;

use super::Gpu;
use super::kernels::{Arg, grid_config, launch};
use crate::{Buffer, RuntimeError};

/// `op`'s result computed by its CUDA implementation over `args` (dense device buffers), or
/// `None` for an op whose CPU implementation runs on host copies instead.
///
/// # Errors
/// [`RuntimeError::Custom`] when the op has neither; NVRTC's log when its source does not
/// compile; a failed launch.
pub(crate) fn run(
    gpu: &'static Gpu,
    op: &Custom,
    args: &[&Buffer],
) -> Option<Result<Buffer, RuntimeError>> {
    match crate::custom::lookup(op) {
        Ok(imp) if imp.cuda.is_none() && imp.host_on_gpu => None,
        Ok(imp) => Some(launch_user(gpu, op, &imp, args)),
        Err(e) => Some(Err(e)),
    }
}

fn launch_user(
    gpu: &'static Gpu,
    op: &Custom,
    imp: &crate::custom::Implementation,
    args: &[&Buffer],
) -> Result<Buffer, RuntimeError> {
    let Some(kernel) = &imp.cuda else {
        return Err(RuntimeError::Custom {
            op: op.name,
            detail: "it has no CUDA implementation, and its inputs are on a GPU: give it one \
                     (`OpaqueBuilder::cuda`), let it run on host copies \
                     (`OpaqueBuilder::host_on_gpu`), or move its inputs to the CPU"
                .into(),
        });
    };
    let function = function(gpu, op, &kernel.source, &kernel.entry)?;
    let n = op.shape.numel();
    let out = Buffer::on_gpu(gpu, op.dtype, n)?;
    if n == 0 {
        return Ok(out);
    }
    let mut launch_args = vec![Arg::Ptr(out.device_ptr(gpu)?)];
    for b in args {
        launch_args.push(Arg::Ptr(b.device_ptr(gpu)?));
    }
    let inner = op.shape.dims().last().copied().unwrap_or(1);
    launch_args.push(Arg::I64(i64::try_from(n).unwrap_or(i64::MAX)));
    launch_args.push(Arg::I64(i64::try_from(inner).unwrap_or(i64::MAX)));
    let threads = if kernel.warp_per_element { n.saturating_mul(32) } else { n };
    // SAFETY: the arguments follow the documented convention, which the user's entry point
    // declares; `out` holds `n` elements and each input its dense shape's.
    unsafe { launch(gpu, &function, &launch_args, grid_config(gpu, threads)) }?;
    Ok(out)
}

/// The compiled entry point, from the device's library cache (keyed by source).
fn function(
    gpu: &'static Gpu,
    op: &Custom,
    source: &str,
    entry: &str,
) -> Result<Arc<CudaFunction>, RuntimeError> {
    let source = kiln_codegen::cuda::with_prelude(source);
    let cached = gpu.kernels.lock().unwrap_or_else(PoisonError::into_inner).library.get(&source);
    if let Some(f) = cached {
        return Ok(Arc::clone(&f[0]));
    }
    let blame = format!("the CUDA source of the user-defined op `{}`", op.name);
    let module = super::nvrtc::load_blaming(gpu, entry, &source, &blame)?;
    let function = module.load_function(entry).map_err(|e| RuntimeError::Custom {
        op: op.name,
        detail: format!("its CUDA source has no entry point `{entry}` (declare it `extern \"C\" __global__`): {e}"),
    })?;
    let len = source.len();
    let mut cache = gpu.kernels.lock().unwrap_or_else(PoisonError::into_inner);
    Ok(Arc::clone(&cache.library.insert(source, vec![Arc::new(function)], len)[0]))
}
