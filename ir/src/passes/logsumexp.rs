//! `logsumexp` for targets that do not compute it in one pass: the same values from max,
//! exp, sum and log.

use super::rebuild;
use crate::pipeline::{PlanOptions, Rewrite};
use crate::{BinaryOp, DType, Graph, IrError, NodeId, Op, ReduceOp, Scalar, UnaryOp, View};

/// Whether `node` is a `logsumexp` the plan's target cannot run as one reduction.
fn needs_expanding(graph: &Graph, id: NodeId, options: &PlanOptions) -> bool {
    let Op::Reduce { op: ReduceOp::LogSumExp, .. } = graph.node(id).op else { return false };
    !options.target.fused_logsumexp || !folds_f32(graph, graph.arg_slice(id)[0])
}

/// Whether a one-pass `logsumexp` kernel folds `x`: f32 values, or f32 values widened to
/// f64 (the kernel folds them as f32 and keeps the result in f64: see
/// [`super::precise_log_softmax`]).
fn folds_f32(graph: &Graph, x: NodeId) -> bool {
    match (graph.node(x).dtype, &graph.node(x).op) {
        (DType::F32, _) => true,
        (DType::F64, Op::Cast(_)) => graph.node(graph.arg_slice(x)[0]).dtype == DType::F32,
        _ => false,
    }
}

/// Every `logsumexp` the target cannot run as one reduction (on any target but the CPU, or
/// of other values than f32 ones) written as `log(sum(exp(x - s))) + s`, with `s` the maximum
/// over the axes (0 where that is infinite, so that rows of -inf give -inf and a +inf gives
/// +inf).
pub fn expand_logsumexp(graph: &Graph, options: &PlanOptions) -> Option<Rewrite> {
    let order = graph.topo_order();
    if !order.iter().any(|&id| needs_expanding(graph, id, options)) {
        return None;
    }
    Some(rebuild(graph, order, |out, id, map| {
        let Op::Reduce { axes, .. } = &graph.node(id).op else { return None };
        if !needs_expanding(graph, id, options) {
            return None;
        }
        let x = map[&graph.arg_slice(id)[0]];
        Some(expand(out, x, axes).expect("the parts of a valid logsumexp are valid"))
    }))
}

fn expand(out: &mut Graph, x: NodeId, axes: &[usize]) -> Result<NodeId, IrError> {
    let (shape, dtype) = (out.node(x).shape.clone(), out.node(x).dtype);
    let m = out.push(Op::Reduce { op: ReduceOp::Max, axes: axes.to_vec() }, &[x])?;
    let kept = out.node(m).shape.clone();
    let abs = out.push(Op::Unary(UnaryOp::Abs), &[m])?;
    let inf = out.leaf(Op::Full(Scalar::F64(f64::INFINITY)), kept.clone(), dtype)?;
    let finite = out.push(Op::Binary(BinaryOp::Lt), &[abs, inf])?;
    let zero = out.leaf(Op::Full(Scalar::F64(0.0)), kept.clone(), dtype)?;
    let shift = out.push(Op::Where, &[finite, m, zero])?;
    let wide = out.push(Op::View(View::contiguous(kept).expand(&shape)), &[shift])?;
    let shifted = out.push(Op::Binary(BinaryOp::Sub), &[x, wide])?;
    let e = out.push(Op::Unary(UnaryOp::Exp), &[shifted])?;
    let s = out.push(Op::Reduce { op: ReduceOp::Sum, axes: axes.to_vec() }, &[e])?;
    let log = out.push(Op::Unary(UnaryOp::Log), &[s])?;
    out.push(Op::Binary(BinaryOp::Add), &[log, shift])
}
