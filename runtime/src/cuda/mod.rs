//! NVIDIA GPUs through the CUDA driver, loaded at run time: kiln builds and runs everywhere,
//! and without a driver every CUDA entry point returns an error saying what was looked for.
//!
//! - [`device_count`] and [`unavailable_reason`] probe for devices once per process.
//! - Each device gets one context (the primary one), one stream that all of kiln's work on
//!   it is ordered on, a caching allocator ([`memory_allocated`], [`memory_reserved`],
//!   [`empty_cache`]), a cache of compiled kernels keyed by the kernel's structure (the
//!   architecture is the device's own), and a cuBLAS handle for matrix products.
//! - NCCL groups ([`nccl_group`]) run collectives on device memory, on the same stream.
//! - Because everything on a device runs on its one stream, a buffer returned to the
//!   allocator's cache can be handed out again at once: the next kernel that writes it is
//!   ordered after every kernel that read it. (A CUDA graph is captured on a stream of its own,
//!   which runs nothing, and launched on the device's: `graph.rs`.)

mod blas;
mod custom;
mod deferred;
mod graph;
mod kernels;
mod library;
mod memory;
mod nccl;
mod nvrtc;
mod probe;
mod rows;

use std::sync::{Arc, LazyLock, Mutex, OnceLock, PoisonError};

use cudarc::driver::{CudaContext, CudaStream};

use crate::{Device, RuntimeError};

pub(crate) use blas::matmul;
pub(crate) use graph::{
    Arena, Captured, StepOutput, capture as capture_graph, capturing as graph_capturing,
    skip_steps as skip_graph_steps, step_left as graph_step_left, step_starts as graph_step_starts,
    update as update_graph,
};
pub(crate) use kernels::{KernelLaunch, precompile, run_kernel};
pub(crate) use library::eval as eval_node;
pub(crate) use library::{copies, load_copies};
pub use memory::copy_bandwidth;
pub(crate) use memory::{DeviceMemory, Home};
pub(crate) use nccl::{Nccl, Queued};
pub use nccl::{nccl_group, nccl_unique_id, nccl_version};
pub use nvrtc::compile_user_source;
pub use probe::{device_count, unavailable_reason};
pub(crate) use rows::{GroupKernel, run_group as run_row_group};

/// One device's state, created on first use and kept for the life of the process.
pub(crate) struct Gpu {
    ordinal: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Compute capability (major, minor): kernels are compiled for it, or for the newest
    /// architecture NVRTC knows below it (see `nvrtc.rs`).
    arch: (i32, i32),
    /// Streaming multiprocessors: launch sizes are multiples of it.
    sms: u32,
    pool: Mutex<memory::Pool>,
    /// Pinned buffers for large transfers, created by the first.
    staging: Mutex<Option<memory::Staging>>,
    kernels: Mutex<kernels::Cache>,
    blas: OnceLock<Result<blas::Handle, String>>,
}

static GPUS: LazyLock<Vec<OnceLock<Result<&'static Gpu, RuntimeError>>>> =
    LazyLock::new(|| (0..device_count()).map(|_| OnceLock::new()).collect());

/// The state of CUDA device `ordinal`, initializing it on first use.
pub(crate) fn gpu(ordinal: usize) -> Result<&'static Gpu, RuntimeError> {
    let device = Device::Cuda(ordinal);
    let Some(slot) = GPUS.get(ordinal) else {
        let reason = match unavailable_reason() {
            Some(why) => why.to_string(),
            None => format!("there are only {} CUDA devices", device_count()),
        };
        return Err(RuntimeError::BackendUnavailable { device, reason });
    };
    slot.get_or_init(|| Gpu::new(ordinal).map(|g| &*Box::leak(Box::new(g)))).clone()
}

impl Gpu {
    fn new(ordinal: usize) -> Result<Gpu, RuntimeError> {
        let device = Device::Cuda(ordinal);
        let failed = |what: &str, e: cudarc::driver::DriverError| RuntimeError::Cuda {
            device,
            detail: format!("{what}: {e}"),
        };
        let ctx = CudaContext::new(ordinal).map_err(|e| failed("creating its context", e))?;
        let arch = ctx.compute_capability().map_err(|e| failed("reading its architecture", e))?;
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(|e| failed("reading its multiprocessor count", e))?;
        // A stream of its own: the legacy default stream cannot be captured into a graph.
        let stream = ctx.new_stream().map_err(|e| failed("creating its stream", e))?;
        Ok(Gpu {
            ordinal,
            ctx,
            stream,
            arch,
            sms: u32::try_from(sms).unwrap_or(1).max(1),
            pool: Mutex::new(memory::Pool::default()),
            staging: Mutex::new(None),
            kernels: Mutex::new(kernels::Cache::default()),
            blas: OnceLock::new(),
        })
    }

    pub(crate) fn device(&self) -> Device {
        Device::Cuda(self.ordinal)
    }

    /// Makes this device's context current on the calling thread (kiln's threads move
    /// between devices freely).
    fn bind(&self) -> Result<(), RuntimeError> {
        self.ctx.bind_to_thread().map_err(|e| self.error("binding its context", e))
    }

    /// Waits until all work queued on the device has finished; fails with an index error
    /// that a replayed graph found meanwhile (see `deferred.rs`).
    pub(crate) fn synchronize(&self) -> Result<(), RuntimeError> {
        graph::no_host_work(self, "waiting for the device")?;
        self.bind()?;
        self.stream.synchronize().map_err(|e| self.error("waiting for its work", e))?;
        self.settle_deferred()
    }

    fn error(&self, what: &str, e: impl std::fmt::Display) -> RuntimeError {
        RuntimeError::Cuda { device: self.device(), detail: format!("{what}: {e}") }
    }
}

/// Bytes of device `ordinal`'s memory held by live buffers (0 for a device that was never
/// used or does not exist).
pub fn memory_allocated(ordinal: usize) -> usize {
    used(ordinal).map_or(0, |g| g.pool.lock().unwrap_or_else(PoisonError::into_inner).allocated)
}

/// The counters of device `ordinal`'s cache of fused kernels: each miss is an NVRTC compile
/// (all zero for a device that was never used or does not exist).
pub fn kernel_cache_stats(ordinal: usize) -> crate::cache::CacheStats {
    used(ordinal).map_or_else(Default::default, kernels::cache_stats)
}

/// Bytes of device `ordinal`'s memory held by kiln: live buffers plus blocks cached for
/// reuse (see [`empty_cache`]).
pub fn memory_reserved(ordinal: usize) -> usize {
    used(ordinal).map_or(0, |g| {
        let pool = g.pool.lock().unwrap_or_else(PoisonError::into_inner);
        pool.allocated + pool.cached
    })
}

/// Returns every cached, unused block of every device to the driver. Live buffers are not
/// affected.
///
/// # Errors
/// [`RuntimeError::Cuda`] when the driver fails to free a block.
pub fn empty_cache() -> Result<(), RuntimeError> {
    for ordinal in 0..GPUS.len() {
        if let Some(g) = used(ordinal) {
            g.release_cached()?;
        }
    }
    Ok(())
}

/// The state of device `ordinal` if it was initialized successfully.
fn used(ordinal: usize) -> Option<&'static Gpu> {
    GPUS.get(ordinal)?.get()?.as_ref().ok().copied()
}

/// The device's name and compute capability, for reports ("NVIDIA H100 80GB HBM3, sm_90").
///
/// # Errors
/// When the device cannot be used.
pub fn describe(ordinal: usize) -> Result<String, RuntimeError> {
    let g = gpu(ordinal)?;
    let name = g.ctx.name().map_err(|e| g.error("reading its name", e))?;
    Ok(format!("{name}, sm_{}{}, {} SMs", g.arch.0, g.arch.1, g.sms))
}

/// Waits until all work queued on device `ordinal` has finished (kiln waits by itself
/// whenever values reach the host; this is for timing).
///
/// # Errors
/// When the device cannot be used or its work failed.
pub fn synchronize(ordinal: usize) -> Result<(), RuntimeError> {
    gpu(ordinal)?.synchronize()
}
