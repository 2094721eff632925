//! `x - logsumexp(x)` without rounding the log-sum-exp at the logits' magnitude.
//!
//! `log_softmax`, and so cross-entropy, records `x - logsumexp(x)`. Rounded to f32, the
//! log-sum-exp of logits near 1000 is off by up to half an ulp of 1000 (3e-5), and every
//! output inherits that: two logits of 1000 gave -0.69317627 instead of -0.6931472. This
//! pass rewrites each such f32 subtraction (the forward one, and the one the gradient rule
//! of `logsumexp` records for the softmax) as `(x - max) - log(sum(exp(x - max)))`, which
//! is as precise as the result itself:
//! - where the target folds a log-sum-exp in one pass (the CPU), the fold's result is kept
//!   in f64 (`logsumexp(cast_f64(x))`, which the CPU kernel folds from the f32 values in
//!   the same single pass) and split into `hi + lo`, two f32 values per row, so that
//!   `(x - hi) - lo` runs on f32 vectors (`x - hi` is exact for the entries near the row's
//!   maximum, the ones whose precision matters);
//! - elsewhere, with fusion off, or where the one-pass fold is not available, from the
//!   maximum and the sum of exponentials: `y = x - max`, `y - log(sum(exp(y)))`.
//!
//! 16-bit logits are shifted by the tensor layer before their log-sum-exp, and f64 logits
//! lose nothing that matters (half an ulp of 1000 in f64 is 6e-14).

use rustc_hash::FxHashMap as HashMap;
use std::collections::HashSet;

use super::rebuild;
use crate::pipeline::{Fusion, PlanOptions, Rewrite};
use crate::{BinaryOp, DType, Graph, IrError, NodeId, Op, ReduceOp, Scalar, UnaryOp, View};

/// `x` and the reduced axes when `id` is `x - expand(logsumexp(x))` over f32 values.
fn log_softmax_of(graph: &Graph, id: NodeId) -> Option<(NodeId, Vec<usize>)> {
    let node = graph.node(id);
    if node.op != Op::Binary(BinaryOp::Sub) || node.dtype != DType::F32 {
        return None;
    }
    let &[x, wide] = graph.arg_slice(id) else { return None };
    let Op::View(view) = &graph.node(wide).op else { return None };
    let lse = graph.arg_slice(wide)[0];
    let Op::Reduce { op: ReduceOp::LogSumExp, axes } = &graph.node(lse).op else { return None };
    let broadcast = View::contiguous(graph.node(lse).shape.clone()).expand(&node.shape);
    (graph.arg_slice(lse)[0] == x && *view == broadcast).then(|| (x, axes.clone()))
}

/// Every f32 `x - logsumexp(x)` computed as `(x - max) - log(sum(exp(x - max)))` (see the
/// module's documentation). Returns `None` when the graph has none.
pub fn precise_log_softmax(graph: &Graph, options: &PlanOptions) -> Option<Rewrite> {
    let order = graph.topo_order();
    let found: HashMap<NodeId, (NodeId, Vec<usize>)> =
        order.iter().filter_map(|&id| Some((id, log_softmax_of(graph, id)?))).collect();
    if found.is_empty() {
        return None;
    }
    // A rewritten subtraction reads `x` alone: its log-sum-exp may be left unused.
    let mut needed: HashSet<NodeId> = graph.inputs().iter().copied().collect();
    let mut stack: Vec<NodeId> = graph.outputs().to_vec();
    while let Some(n) = stack.pop() {
        if needed.insert(n) {
            match found.get(&n) {
                Some(&(x, _)) => stack.push(x),
                None => stack.extend(graph.args(n)),
            }
        }
    }
    let one_pass = options.target.fused_logsumexp && options.fusion == Fusion::Fused;
    let kept = order.iter().copied().filter(|id| needed.contains(id));
    Some(rebuild(graph, kept, |out, id, map| {
        let (x, axes) = found.get(&id)?;
        let x = map[x];
        let rewritten = if one_pass { split_fold(out, x, axes) } else { shifted(out, x, axes) };
        Some(rewritten.expect("the parts of a valid log-softmax are valid"))
    }))
}

/// `(x - hi) - lo`, where `hi + lo` is the f64 log-sum-exp of the f32 `x` (`lo` is 0 where
/// `hi` is infinite, so such rows give what `x - hi` gives).
fn split_fold(out: &mut Graph, x: NodeId, axes: &[usize]) -> Result<NodeId, IrError> {
    let shape = out.node(x).shape.clone();
    let wide_x = out.push(Op::Cast(DType::F64), &[x])?;
    let lse = out.push(Op::Reduce { op: ReduceOp::LogSumExp, axes: axes.to_vec() }, &[wide_x])?;
    let kept = out.node(lse).shape.clone();
    let hi = out.push(Op::Cast(DType::F32), &[lse])?;
    let wide_hi = out.push(Op::Cast(DType::F64), &[hi])?;
    let rest = out.push(Op::Binary(BinaryOp::Sub), &[lse, wide_hi])?;
    let rest = out.push(Op::Cast(DType::F32), &[rest])?;
    let finite = finite(out, hi)?;
    let zero = out.leaf(Op::Full(Scalar::F64(0.0)), kept.clone(), DType::F32)?;
    let lo = out.push(Op::Where, &[finite, rest, zero])?;
    let broadcast = View::contiguous(kept).expand(&shape);
    let hi = out.push(Op::View(broadcast.clone()), &[hi])?;
    let lo = out.push(Op::View(broadcast), &[lo])?;
    let near = out.push(Op::Binary(BinaryOp::Sub), &[x, hi])?;
    out.push(Op::Binary(BinaryOp::Sub), &[near, lo])
}

/// `y - log(sum(exp(y)))` with `y = x - max(x)` (the maximum replaced by 0 where it is
/// infinite, as `expand_logsumexp` does).
fn shifted(out: &mut Graph, x: NodeId, axes: &[usize]) -> Result<NodeId, IrError> {
    let shape = out.node(x).shape.clone();
    let dtype = out.node(x).dtype;
    let m = out.push(Op::Reduce { op: ReduceOp::Max, axes: axes.to_vec() }, &[x])?;
    let kept = out.node(m).shape.clone();
    let finite = finite(out, m)?;
    let zero = out.leaf(Op::Full(Scalar::F64(0.0)), kept.clone(), dtype)?;
    let shift = out.push(Op::Where, &[finite, m, zero])?;
    let broadcast = View::contiguous(kept).expand(&shape);
    let shift = out.push(Op::View(broadcast.clone()), &[shift])?;
    let y = out.push(Op::Binary(BinaryOp::Sub), &[x, shift])?;
    let e = out.push(Op::Unary(UnaryOp::Exp), &[y])?;
    let s = out.push(Op::Reduce { op: ReduceOp::Sum, axes: axes.to_vec() }, &[e])?;
    let log = out.push(Op::Unary(UnaryOp::Log), &[s])?;
    let log = out.push(Op::View(broadcast), &[log])?;
    out.push(Op::Binary(BinaryOp::Sub), &[y, log])
}

/// `|v| < inf`.
fn finite(out: &mut Graph, v: NodeId) -> Result<NodeId, IrError> {
    let (shape, dtype) = (out.node(v).shape.clone(), out.node(v).dtype);
    let abs = out.push(Op::Unary(UnaryOp::Abs), &[v])?;
    let inf = out.leaf(Op::Full(Scalar::F64(f64::INFINITY)), shape, dtype)?;
    out.push(Op::Binary(BinaryOp::Lt), &[abs, inf])
}
