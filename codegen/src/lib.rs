//! kiln's code generators: each turns one backend-neutral kernel description from `kiln-ir`
//! into code for a target, together with the code's text.
//!
//! - [`cpu`]: Cranelift machine code for the host CPU.
//! - [`cuda`]: CUDA C source, for NVRTC.
#![warn(missing_docs)]

pub mod cpu;
pub mod cuda;
pub mod generic;
mod walk;

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

/// The steps of a fused CPU plan of `graph` (no graph passes), for the generators' tests.
#[cfg(test)]
pub(crate) fn plan_steps(graph: &kiln_ir::Graph) -> Vec<kiln_ir::fuse::Step> {
    use kiln_ir::pipeline::{Constants, Fusion, PlanOptions};
    let options =
        PlanOptions { fusion: Fusion::Fused, constants: Constants::Fold, target: cpu::TARGET };
    kiln_ir::fuse::lower(graph, &kiln_ir::fuse::partition(graph, &options), &options)
}
