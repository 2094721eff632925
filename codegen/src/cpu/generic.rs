//! The CPU's size-dependent code choices, which with the target-neutral parts make a CPU
//! kernel's [`KernelForm`] (see [`crate::generic`]).

use cranelift_codegen::ir::types;
use kiln_ir::DType;
use kiln_ir::kernel::{ExprKind, Kernel};

use super::helpers::Batch;
use super::staging::MIN_ROW;
use super::strategy::{column_type, vector_type};
use crate::generic::{KernelForm, walks};
use crate::walk::Walk;

/// The form of `kernel` as the CPU compiles it: besides the target-neutral form, whether a
/// reduction is vectorized across its outputs (`column_type`) and whether its rows are long
/// enough for the batch functions (`staging::MIN_ROW`).
pub fn form(kernel: &Kernel) -> KernelForm {
    let (outer, walk) = walks(kernel);
    let columns = column_type(kernel, &walk, &outer).is_some();
    let long_rows =
        long_rows_matter(kernel, &walk) && walk.dims.last().is_some_and(|&d| d >= MIN_ROW);
    KernelForm::new(kernel, &[columns, long_rows])
}

/// Whether the length of the rows changes the code: only f32 vector loops with a function
/// that has a batch version stage it (`staging.rs`, `rows.rs`).
fn long_rows_matter(kernel: &Kernel, walk: &Walk) -> bool {
    vector_type(kernel, walk) == Some((DType::F32, types::F32X4))
        && kernel.exprs.iter().any(|e| match e.kind {
            ExprKind::Unary(op, _) => Batch::for_unary(op).is_some(),
            _ => false,
        })
}
