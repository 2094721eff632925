//! The correctness oracle (`KILN_CHECK`): each kernel's result against the reference
//! executor's evaluation of its ops on the same input buffers, so that a difference belongs
//! to that kernel alone and not to rounding carried from earlier steps.

use std::sync::atomic::{AtomicU64, Ordering};

use kiln_ir::fuse::KernelStep;
use kiln_ir::{Graph, NodeId};
use rustc_hash::FxHashMap as HashMap;

/// Kernel runs the oracle could not check (see [`note_unchecked`]).
static UNCHECKED: AtomicU64 = AtomicU64::new(0);

/// Counts a kernel run that the oracle leaves unchecked because no generated code ran (its
/// compile failed and its ops ran on the reference executor, which the compile failure's
/// warning already says): [`unchecked_runs`] tells a checked run that passed how much of it
/// was not compared.
pub(super) fn note_unchecked(kernel: &kiln_ir::kernel::Kernel) {
    if UNCHECKED.fetch_add(1, Ordering::Relaxed) == 0 {
        eprintln!(
            "kiln: KILN_CHECK: kernel {} ran on the reference executor (it could not be \
             compiled) and is not checked; kiln::debug::unchecked_kernel_runs() counts such runs",
            kernel.name()
        );
    }
}

/// How many kernel runs under the oracle (`KILN_CHECK`) were not checked because the kernel
/// could not be compiled and ran on the reference executor instead.
pub fn unchecked_runs() -> u64 {
    UNCHECKED.load(Ordering::Relaxed)
}

use super::execute::Bufs;
use crate::{Buffer, CheckReport, Device, RunError, RuntimeError, reference};

/// How far a generated result of `dtype` may be from the reference's, relative to its
/// magnitude: a few ULP (0 for integers and bools, which must be equal).
pub(crate) fn tolerance(dtype: kiln_ir::DType) -> f64 {
    use kiln_ir::DType;
    match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        DType::F16 => 4e-3,
        DType::BF16 => 3e-2,
        DType::I64 | DType::I32 | DType::I8 | DType::U8 | DType::Bool => 0.0,
    }
}

/// Compares a kernel's output number `output` with the reference value, within a tolerance
/// for its dtype (scaled by `scale`): generated math is a few ULP from the reference's f64
/// math. An output that passes a jump of approximated math (see [`after_a_jump`]) is not
/// compared.
pub(super) fn compare(
    graph: &Graph,
    step: &KernelStep,
    output: usize,
    got: &Buffer,
    want: &Buffer,
    scale: f64,
) -> Result<(), RunError> {
    if after_a_jump(&step.kernel)[output] {
        return Ok(());
    }
    // A float result is as precise as the least precise float the kernel computes with (an
    // f64 result of f32 math carries f32 rounding).
    let dtype = got.dtype();
    let tol = scale
        * if dtype.is_float() {
            step.kernel
                .exprs
                .iter()
                .map(|e| e.dtype)
                .filter(|d| d.is_float())
                .map(tolerance)
                .fold(tolerance(dtype), f64::max)
        } else {
            0.0
        };
    let all = kiln_ir::View::contiguous(kiln_ir::Shape::from([got.len()]));
    // A device result comes to the host first, its failure an error (gather would panic).
    let on_host = |b: &Buffer| {
        b.to_device(Device::Cpu).map_err(|error| RunError {
            error,
            op: Some(graph.node(step.outputs[0]).op.name()),
            origin: graph.node(step.outputs[0]).origin,
        })
    };
    let (g, w) = (on_host(got)?.gather::<f64>(&all), on_host(want)?.gather::<f64>(&all));
    // A length mismatch is a difference too (zip would stop at the shorter one): reported at
    // the first element only one side has.
    let bad = g
        .iter()
        .zip(&w)
        .position(|(a, b)| {
            !((a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= tol * b.abs().max(1.0))
        })
        .or((g.len() != w.len()).then(|| g.len().min(w.len())));
    let Some(i) = bad else { return Ok(()) };
    let root = graph.node(step.outputs[0]);
    let ops: Vec<&str> = step.fused.iter().map(|&n| graph.node(n).op.name()).collect();
    let mut sources: Vec<String> =
        step.fused.iter().filter_map(|&n| graph.node(n).origin).map(|l| l.to_string()).collect();
    sources.dedup();
    Err(RunError {
        error: RuntimeError::CheckFailed(Box::new(CheckReport {
            kernel: step.kernel.name(),
            ops: ops.join(" "),
            detail: match (g.get(i), w.get(i)) {
                (Some(a), Some(b)) => {
                    format!("element {i} is {a}, the reference gives {b} (tolerance {tol:e})")
                }
                _ => format!("the kernel wrote {} elements, the reference {}", g.len(), w.len()),
            },
            sources: sources.join(", "),
            text: step.kernel.to_string(),
        })),
        op: Some(root.op.name()),
        origin: root.origin,
    })
}

/// Which of a kernel's outputs pass a jump — a float cast to an integer or `bool`, a
/// comparison, `floor`, `ceil` or `round` — of a value computed with approximated math (a
/// transcendental or `pow`, a few ULP from the reference): there a one-ULP difference is a
/// legitimate jump (a sigmoid one ULP below 1.0 cast to `u8` is 0, the reference's 1.0 is
/// 1), so the oracle cannot tell it from a bug and leaves those outputs out.
pub(super) fn after_a_jump(kernel: &kiln_ir::kernel::Kernel) -> Vec<bool> {
    use kiln_ir::kernel::ExprKind;
    let mut approximated = vec![false; kernel.exprs.len()];
    let mut jumped = vec![false; kernel.exprs.len()];
    for (i, e) in kernel.exprs.iter().enumerate() {
        let args: &[usize] = match &e.kind {
            ExprKind::Load(_) | ExprKind::Param(_) => &[],
            ExprKind::Unary(_, a) | ExprKind::Cast(a) => std::slice::from_ref(a),
            ExprKind::Binary(_, a, b) => &[*a, *b],
            ExprKind::Where(c, a, b) => &[*c, *a, *b],
        };
        let from_approximated = args.iter().any(|&a| approximated[a]);
        approximated[i] = from_approximated
            || match e.kind {
                ExprKind::Unary(op, _) => op.is_transcendental(),
                ExprKind::Binary(op, ..) => op.is_approximated(),
                ExprKind::Load(_)
                | ExprKind::Param(_)
                | ExprKind::Where(..)
                | ExprKind::Cast(_) => false,
            };
        let jump = match e.kind {
            ExprKind::Cast(a) => kernel.exprs[a].dtype.is_float() && !e.dtype.is_float(),
            ExprKind::Unary(op, _) => op.is_rounding(),
            ExprKind::Binary(op, ..) => op.is_comparison(),
            ExprKind::Load(_) | ExprKind::Param(_) | ExprKind::Where(..) => false,
        };
        jumped[i] = args.iter().any(|&a| jumped[a]) || (jump && from_approximated);
    }
    kernel.outputs.iter().map(|&o| jumped[o]).collect()
}

/// The reference executor's values of a kernel's outputs, computed from the buffers the
/// kernel reads (host copies of device buffers): what the check oracle compares each kernel
/// with, so that a difference is this kernel's alone, not carried from an earlier one.
pub(super) fn kernel_reference(
    graph: &Graph,
    step: &KernelStep,
    bufs: &Bufs,
) -> Result<Vec<Buffer>, RunError> {
    let mut local: HashMap<NodeId, Buffer> = HashMap::default();
    for &n in &step.fused {
        let mut args = Vec::new();
        for a in graph.args(n) {
            let b = match local.get(&a) {
                Some(b) => b.clone(),
                None => bufs[&a].to_device(Device::Cpu)?,
            };
            args.push(b);
        }
        let refs: Vec<&Buffer> = args.iter().collect();
        let out = reference::eval_node(graph, n, &refs)?;
        local.insert(n, out);
    }
    Ok(step.outputs.iter().map(|o| local[o].clone()).collect())
}

#[cfg(test)]
mod tests {
    use kiln_ir::kernel::{Expr, ExprKind, Kernel, KernelInput};
    use kiln_ir::{BinaryOp, DType, Shape, UnaryOp, View};

    use super::after_a_jump;

    fn kernel(exprs: Vec<Expr>, outputs: Vec<usize>) -> Kernel {
        let shape = Shape::from([4]);
        Kernel {
            inputs: vec![KernelInput { dtype: DType::F32, view: View::contiguous(shape.clone()) }],
            shape,
            exprs,
            outputs,
            params: 0,
            reduce: None,
        }
    }

    fn e(kind: ExprKind, dtype: DType) -> Expr {
        Expr { kind, dtype }
    }

    /// Outputs past a jump of approximated math are left out; a jump of exact math, and
    /// approximated math without a jump, are compared.
    #[test]
    fn only_jumps_of_approximated_math_are_left_out() {
        let load = e(ExprKind::Load(0), DType::F32);
        // sigmoid(x) as u8, back to f32 and scaled; sigmoid(x) itself; x as u8.
        let k = kernel(
            vec![
                load,
                e(ExprKind::Unary(UnaryOp::Sigmoid, 0), DType::F32),
                e(ExprKind::Cast(1), DType::U8),
                e(ExprKind::Cast(2), DType::F32),
                e(ExprKind::Binary(BinaryOp::Mul, 3, 0), DType::F32),
                e(ExprKind::Cast(0), DType::U8),
            ],
            vec![4, 1, 5],
        );
        assert_eq!(after_a_jump(&k), vec![true, false, false]);
        // A comparison of an exponential, and one of exact arithmetic.
        let k = kernel(
            vec![
                load,
                e(ExprKind::Unary(UnaryOp::Exp, 0), DType::F32),
                e(ExprKind::Binary(BinaryOp::Gt, 1, 0), DType::Bool),
                e(ExprKind::Binary(BinaryOp::Add, 0, 0), DType::F32),
                e(ExprKind::Binary(BinaryOp::Lt, 3, 0), DType::Bool),
                e(ExprKind::Where(4, 1, 0), DType::F32),
            ],
            vec![2, 4, 5],
        );
        assert_eq!(after_a_jump(&k), vec![true, false, false]);
    }
}
