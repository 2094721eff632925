//! The correctness oracle (`KILN_CHECK`): each kernel's result against the reference
//! executor's evaluation of its ops on the same input buffers, so that a difference belongs
//! to that kernel alone and not to rounding carried from earlier steps.

use kiln_ir::fuse::KernelStep;
use kiln_ir::{Graph, NodeId};
use rustc_hash::FxHashMap as HashMap;

use super::execute::Bufs;
use crate::{Buffer, CheckReport, Device, RunError, RuntimeError, reference};

/// Compares a kernel's output with the reference value, within a tolerance for its dtype
/// (scaled by `scale`): generated math is a few ULP from the reference's f64 math.
pub(super) fn compare(
    graph: &Graph,
    step: &KernelStep,
    got: &Buffer,
    want: &Buffer,
    scale: f64,
) -> Result<(), RunError> {
    use kiln_ir::DType;
    let tolerance = |d: DType| match d {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        DType::F16 => 4e-3,
        DType::BF16 => 3e-2,
        _ => 0.0,
    };
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
    let (g, w) = (got.gather::<f64>(&all), want.gather::<f64>(&all));
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
