//! Size-generic kernels: one compiled kernel for every size of a kernel's *form*.
//!
//! A kernel's code depends on its expressions, its dtypes, the shape of its coalesced walks
//! (how many dimensions, which strides are 0, 1 or other) and a few choices each target
//! makes from its sizes (on the CPU, whether a reduction is vectorized across its outputs
//! and whether its rows are long enough for the batch functions; on a GPU, whether a
//! reduction gives each output a thread or a block and whether it is split): that is its
//! [`KernelForm`] ([`cpu::form`](crate::cpu::form), [`cuda::form`](crate::cuda::form)). The
//! rest are numbers: the walks' dimensions, strides and offsets ([`numbers`]). A kernel
//! specialised to its sizes has every number in its code; a size-generic one reads those
//! that vary from size arguments after its parameters, so that one compile serves a batch
//! of 48 and a batch of 17 alike. Sizes of 1 and 0 stay specialised: a dimension of 1 drops
//! out of the walk and an empty one is part of the form, so both change it.
//!
//! Both back ends build a generic kernel's size arguments the same way
//! (`Layout::with` over the kernel's walks with the kernel's marks), so
//! the compiler and the launch agree on what each slot holds.

use kiln_ir::DType;
use kiln_ir::kernel::{Expr, Kernel, KernelReduce};

use crate::walk::{Layout, Walk, coalesce};

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
    /// The target's choices made from the kernel's sizes.
    choices: Vec<bool>,
    /// An empty dimension: such kernels stay specialised (a generic kernel divides by its
    /// dimensions, so none of them may be 0).
    empty: bool,
}

impl KernelForm {
    /// The form of `kernel` with a target's size-dependent `choices`.
    pub(crate) fn new(kernel: &Kernel, choices: &[bool]) -> KernelForm {
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
            choices: choices.to_vec(),
            empty: kernel.shape.dims().contains(&0),
        }
    }
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

/// Whether a generic kernel marked `dynamic` reads any number from its size arguments
/// (marks of a kernel specialised to its sizes are empty or all `false`).
pub fn is_generic(marks: &[bool]) -> bool {
    marks.iter().any(|&m| m)
}

/// `kernel`'s two walks as a kernel marked `dynamic` sees them, and the values of its size
/// arguments, in slot order: the code generators and the launches build both this way.
pub(crate) fn layouts(kernel: &Kernel, dynamic: &[bool]) -> ([Layout; 2], Vec<i64>) {
    let (outer, walk) = walks(kernel);
    let mut marks = dynamic.iter().copied();
    let mut values = Vec::new();
    let outer = Layout::with(&outer, &mut marks, &mut values);
    let walk = Layout::with(&walk, &mut marks, &mut values);
    ([outer, walk], values)
}
