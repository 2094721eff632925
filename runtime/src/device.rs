//! Devices.

use std::fmt;

/// Where a tensor's data lives and its kernels run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// The host CPU.
    #[default]
    Cpu,
    /// The NVIDIA GPU with this ordinal.
    Cuda(usize),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

impl Device {
    /// `Cuda(ordinal)` when that CUDA device exists, the CPU otherwise: the usual first line
    /// of a program that should use a GPU when it has one.
    ///
    /// ```
    /// use kiln_runtime::Device;
    /// let device = Device::cuda_if_available(0);
    /// assert!(device == Device::Cpu || device == Device::Cuda(0));
    /// ```
    pub fn cuda_if_available(ordinal: usize) -> Device {
        if ordinal < crate::cuda::device_count() { Device::Cuda(ordinal) } else { Device::Cpu }
    }

    /// The machine a plan for this device is made for, as its code generator describes it.
    pub fn target(self) -> kiln_ir::target::Target {
        match self {
            Device::Cpu => kiln_codegen::cpu::TARGET,
            Device::Cuda(_) => kiln_codegen::cuda::TARGET,
        }
    }
}
