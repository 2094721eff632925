//! Size-generic kernels: one compiled kernel for every size of a kernel's *form*.
//!
//! A kernel's code depends on its expressions, its dtypes, the shape of its coalesced walks
//! (how many dimensions, which strides are 0, 1 or other) and a few choices made from its
//! sizes (whether a reduction is vectorized across its outputs, whether its rows are long
//! enough for the batch functions); that is its [`KernelForm`]. The rest are numbers: the
//! walks' dimensions, strides and offsets ([`numbers`]). A kernel specialised to its sizes
//! has every number in its code; a size-generic one reads those that vary from size slots
//! after its parameters ([`CpuKernel::slots`](super::CpuKernel::slots)), so that one compile serves a batch of 48
//! and a batch of 17 alike. Sizes of 1 and 0 stay specialised: a dimension of 1 drops out of
//! the walk and an empty one is part of the form, so both change it.
//!
//! A generic kernel walks its rows with a division per row where a specialised one
//! multiplies by a constant, and it does not gather strided lanes into vectors or walk in
//! strips (see [`compile_generic`](super::compile_generic)); everything else is the same code.

use cranelift_codegen::ir::types;
use kiln_ir::DType;
use kiln_ir::kernel::{Expr, ExprKind, Kernel, KernelReduce};

use super::helpers::Batch;
use super::staging::MIN_ROW;
use super::strategy::{column_type, vector_type};
use crate::walk::{Walk, coalesce};

/// A kernel's two walks: its kept dimensions (one per output of a reduction; a single
/// position for an elementwise kernel) and the dimensions it reduces or walks in rows.
pub(crate) fn walks(kernel: &Kernel) -> (Walk, Walk) {
    let kept = kernel.reduce.map_or(0, |r| r.kept);
    (coalesce(kernel, 0..kept), coalesce(kernel, kept..kernel.shape.rank()))
}

/// Every number of `kernel`'s walks, in the order a generic kernel's dynamic marks follow:
/// the kept walk's dimensions, strides and offsets, then the row walk's.
pub fn numbers(kernel: &Kernel) -> Vec<i64> {
    let (outer, walk) = walks(kernel);
    let mut out = Vec::new();
    outer.numbers(&mut out);
    walk.numbers(&mut out);
    out
}

/// What a kernel's code depends on besides [`numbers`]: two kernels of one form generate the
/// same code up to those numbers, so a generic kernel compiled for one serves the other.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelForm {
    inputs: Vec<DType>,
    exprs: Vec<Expr>,
    outputs: Vec<usize>,
    params: usize,
    reduce: Option<KernelReduce>,
    /// For each walk, each input's stride classes along its dimensions: 0 (a broadcast),
    /// 1 (contiguous) or 2 (any other stride).
    classes: [Vec<Vec<u8>>; 2],
    /// A reduction vectorized across its outputs (`column_type`).
    columns: bool,
    /// Rows long enough for the batch functions (`staging::MIN_ROW`).
    long_rows: bool,
    /// An empty dimension: such kernels stay specialised (a generic kernel divides by its
    /// dimensions, so none of them may be 0).
    empty: bool,
}

impl KernelForm {
    /// The form of `kernel`.
    pub fn of(kernel: &Kernel) -> KernelForm {
        let (outer, walk) = walks(kernel);
        let class = |w: &Walk| -> Vec<Vec<u8>> {
            (w.strides.iter())
                .map(|s| s.iter().map(|&v| if v == 0 || v == 1 { v as u8 } else { 2 }).collect())
                .collect()
        };
        KernelForm {
            inputs: kernel.inputs.iter().map(|i| i.dtype).collect(),
            exprs: kernel.exprs.clone(),
            outputs: kernel.outputs.clone(),
            params: kernel.params,
            reduce: kernel.reduce,
            classes: [class(&outer), class(&walk)],
            columns: column_type(kernel, &walk, &outer).is_some(),
            long_rows: long_rows_matter(kernel, &walk)
                && walk.dims.last().is_some_and(|&d| d >= MIN_ROW),
            empty: kernel.shape.dims().contains(&0),
        }
    }
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

/// Which numbers differ between two kernels of one form (`a` and `b` from [`numbers`]), or
/// were dynamic already (`before`): the marks of a generic kernel serving both.
pub fn dynamic_marks(a: &[i64], b: &[i64], before: &[bool]) -> Vec<bool> {
    (a.iter().zip(b).enumerate())
        .map(|(i, (x, y))| x != y || before.get(i).copied().unwrap_or(false))
        .collect()
}

/// Whether a generic kernel with `marks`, compiled from a kernel whose numbers were
/// `compiled`, serves a kernel whose numbers are `wanted`: every number it has in its code
/// is the same.
pub fn serves(marks: &[bool], compiled: &[i64], wanted: &[i64]) -> bool {
    compiled.len() == wanted.len()
        && (compiled.iter().zip(wanted).zip(marks)).all(|((c, w), &dynamic)| dynamic || c == w)
}

/// Marks for every number of `kernel`'s walks but the strides 0 and 1 (which are part of
/// its form): the most generic kernel of its form (`KILN_SIZES=generic`).
pub fn generic_marks(kernel: &Kernel) -> Vec<bool> {
    let (outer, walk) = walks(kernel);
    let mut marks = Vec::new();
    for w in [&outer, &walk] {
        marks.extend(w.dims.iter().map(|_| true));
        w.strides.iter().for_each(|s| marks.extend(s.iter().map(|&v| v != 0 && v != 1)));
        marks.extend(w.offsets.iter().map(|_| true));
    }
    marks
}
