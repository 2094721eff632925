//! kiln's code generators: each turns one backend-neutral kernel description from `kiln-ir`
//! into code for a target, together with the code's text.
//!
//! Graphs currently run on the runtime's reference executor; the Cranelift (CPU) and CUDA C
//! generators build on this crate.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub use kiln_ir as ir;
