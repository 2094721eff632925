//! NVIDIA GPUs: whether there are any, and their memory.
//!
//! kiln loads the CUDA driver at run time, so it builds and runs on machines without one;
//! these functions never fail or panic. Move tensors with [`crate::Tensor::to`] (or
//! `.cuda()`); ops then run on the device: fused kernels as CUDA C compiled by NVRTC for the
//! device's architecture (cached per kernel structure, and on disk under `KILN_CUDA_CACHE`
//! when set), matrix products in cuBLAS, index ops (`gather`, `scatter`, in-place writes
//! through views), `cumsum`, arg-reductions and random fills in kernels of their own, on one
//! stream per device (integer products are computed on the host and copied over). Reading
//! values (`to_vec`, `item`, printing) copies to the host and waits for the device.
//!
//! NVRTC and cuBLAS are found by `dlopen` (`libnvrtc.so`, `libcublas.so`): with the CUDA
//! toolkit or the `nvidia-cuda-nvrtc`/`nvidia-cublas` wheels, put their `lib` directory on
//! `LD_LIBRARY_PATH` before the program starts.
//!
//! Without a GPU, `emulator/` in kiln's repository builds stand-ins for these three libraries
//! that run kiln's generated CUDA C on the CPU (a C++ compiler builds each kernel; a block's
//! threads run as fibers, so barriers and warp shuffles behave); CI runs the CUDA tests on it.
//!
//! ```
//! let n = kiln::cuda::device_count();
//! assert_eq!(kiln::cuda::is_available(), n > 0);
//! let device = kiln::Device::cuda_if_available(0);
//! println!("{n} CUDA devices; using {device}");
//! // Nothing allocated yet on a device that was never used (or does not exist).
//! assert_eq!(kiln::cuda::memory_allocated(7), 0);
//! ```

/// Whether at least one CUDA device can be used.
pub fn is_available() -> bool {
    device_count() > 0
}

/// The number of CUDA devices the driver reports: 0 without a driver.
pub fn device_count() -> usize {
    kiln_runtime::cuda::device_count()
}

/// Why there is no CUDA device ("no CUDA driver was found (libcuda.so could not be loaded
/// ...)", "the CUDA driver reports no devices", ...), or `None` when there is one.
///
/// ```
/// assert_eq!(kiln::cuda::unavailable_reason().is_none(), kiln::cuda::is_available());
/// ```
pub fn unavailable_reason() -> Option<&'static str> {
    kiln_runtime::cuda::unavailable_reason()
}

/// Bytes of device `ordinal`'s memory held by live tensors (0 for a device never used).
pub fn memory_allocated(ordinal: usize) -> usize {
    kiln_runtime::cuda::memory_allocated(ordinal)
}

/// Bytes of device `ordinal`'s memory kiln holds: live tensors plus blocks its caching
/// allocator keeps for reuse ([`empty_cache`] returns those to the driver).
pub fn memory_reserved(ordinal: usize) -> usize {
    kiln_runtime::cuda::memory_reserved(ordinal)
}

/// The counters of device `ordinal`'s cache of fused kernels: `misses` and `compiled` count
/// NVRTC compiles, `generic` the size-generic ones, `served` the kernels of new sizes a
/// generic kernel ran with no compile (all zero for a device never used). Like the CPU's
/// ([`crate::debug::cache_stats`]), a program that runs again at other sizes compiles its
/// kernels whose sizes changed once more, size-generic, and those serve every later size.
///
/// ```
/// let stats = kiln::cuda::kernel_cache_stats(7);
/// assert_eq!(stats.compiled, 0);
/// ```
pub fn kernel_cache_stats(ordinal: usize) -> kiln_runtime::cache::CacheStats {
    kiln_runtime::cuda::kernel_cache_stats(ordinal)
}

/// Returns every cached, unused block of device memory to the driver (live tensors keep
/// theirs).
///
/// # Errors
/// [`crate::Error::Runtime`] when the driver fails to free a block.
pub fn empty_cache() -> crate::Result<()> {
    kiln_runtime::cuda::empty_cache().map_err(|e| kiln_runtime::RunError::from(e).into())
}

/// Waits until the work queued on device `ordinal` has finished; kiln waits by itself
/// whenever values reach the host, so this is only needed for timing.
///
/// # Errors
/// [`crate::Error::Runtime`] when the device cannot be used or its work failed.
pub fn synchronize(ordinal: usize) -> crate::Result<()> {
    kiln_runtime::cuda::synchronize(ordinal).map_err(|e| kiln_runtime::RunError::from(e).into())
}

/// The device's name, architecture and multiprocessor count, for reports.
///
/// # Errors
/// [`crate::Error::Runtime`] when the device cannot be used.
pub fn describe(ordinal: usize) -> crate::Result<String> {
    kiln_runtime::cuda::describe(ordinal).map_err(|e| kiln_runtime::RunError::from(e).into())
}

/// The device-to-device copy bandwidth of device `ordinal` in GB/s (bytes read plus bytes
/// written, the median of `reps` copies of `bytes` bytes): the ceiling for memory-bound
/// kernels.
///
/// # Errors
/// [`crate::Error::Runtime`] when the device cannot be used or runs out of memory.
pub fn copy_bandwidth(ordinal: usize, bytes: usize, reps: usize) -> crate::Result<f64> {
    kiln_runtime::cuda::copy_bandwidth(ordinal, bytes, reps)
        .map_err(|e| kiln_runtime::RunError::from(e).into())
}

/// Compiles a user-defined op's CUDA C ([`crate::ops::OpaqueBuilder::cuda`]) with NVRTC for
/// `arch` (`"sm_90"`), with the helpers and options kiln runs it with, and returns the PTX:
/// no device is needed, so a test can check an op's source on a machine with NVRTC (the
/// `nvidia-cuda-nvrtc` wheel) and no GPU.
///
/// # Errors
/// [`crate::Error::Runtime`] naming the op, with NVRTC's log, when the source does not
/// compile, or when NVRTC is not found.
pub fn compile_source(op: &'static str, source: &str, arch: &str) -> crate::Result<String> {
    kiln_runtime::cuda::compile_user_source(op, source, arch)
        .map_err(|e| kiln_runtime::RunError::from(e).into())
}
