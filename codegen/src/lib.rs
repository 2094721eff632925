//! kiln's code generators: each turns one backend-neutral kernel description from `kiln-ir`
//! into code for a target, together with the code's text.
//!
//! - [`cpu`]: Cranelift machine code for the host CPU.
//! - [`cuda`]: CUDA C source, for NVRTC.
#![warn(missing_docs)]

pub mod cpu;
pub mod cuda;

pub use kiln_ir as ir;

/// A kernel that could not be compiled.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CodegenError {
    /// Cranelift rejected the generated code, or the host is not supported. The former is a
    /// bug in kiln's code generator; the message holds Cranelift's report and the code.
    #[error("code generation failed: {0}")]
    Cranelift(String),
}
