//! NVIDIA GPUs: whether there are any.
//!
//! kiln loads the CUDA driver at run time, so it builds and runs on machines without one;
//! these functions never fail or panic. Generated kernels already have a CUDA C form
//! ([`crate::debug::kernels`] shows it, and CI compiles it with NVRTC), but this build runs
//! tensors on the CPU only: moving a tensor to a CUDA device is an error that says so.
//!
//! ```
//! let n = kiln::cuda::device_count();
//! assert_eq!(kiln::cuda::is_available(), n > 0);
//! let device = kiln::Device::cuda_if_available(0);
//! println!("{n} CUDA devices; using {device}");
//! ```

/// Whether at least one CUDA device can be used.
pub fn is_available() -> bool {
    device_count() > 0
}

/// The number of CUDA devices the driver reports: 0 without a driver.
pub fn device_count() -> usize {
    kiln_runtime::cuda::device_count()
}
