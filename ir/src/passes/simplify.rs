//! [`super::Simplify`]: constant folding and exact algebraic identities.

use rustc_hash::FxHashMap as HashMap;

use crate::pipeline::Rewrite;
use crate::{Graph, NodeId, Op};

use super::unview_sums;

/// The constant a node holds everywhere, looking through views of a fill and through nodes
/// already folded.
fn constant(graph: &Graph, id: NodeId, folded: &HashMap<NodeId, f64>) -> Option<f64> {
    if let Some(&v) = folded.get(&id) {
        return Some(v);
    }
    match &graph.node(id).op {
        Op::Full(v) => Some(v.to_f64()),
        Op::View(_) => constant(graph, graph.args(id)[0], folded),
        _ => None,
    }
}

/// Constant folding: the value of a floating-point elementwise op whose inputs are all
/// constants, computed as the reference executor computes it (in f64, rounded to the
/// node's dtype after the op).
fn fold(graph: &Graph, id: NodeId, args: &[NodeId], folded: &HashMap<NodeId, f64>) -> Option<f64> {
    use crate::semantics::{binary, cast, round, unary};
    let node = graph.node(id);
    if !node.dtype.is_float() {
        return None;
    }
    let float_arg = |a: NodeId| {
        let n = graph.node(a);
        if n.dtype.is_float() { constant(graph, a, folded) } else { None }
    };
    let v = match &node.op {
        Op::Unary(op) => unary(*op, float_arg(args[0])?),
        Op::Binary(op) => binary(*op, float_arg(args[0])?, float_arg(args[1])?),
        Op::Cast(_) => {
            let from = graph.node(args[0]).dtype;
            cast(constant(graph, args[0], folded)?, from, node.dtype)
        }
        _ => return None,
    };
    Some(round(node.dtype, v))
}

/// Whether `view` reads every element of a dense buffer of `shape` once, in order: a
/// reshape (strides of size-1 dimensions do not matter).
pub(super) fn reads_in_order(view: &crate::View, shape: &crate::Shape) -> bool {
    let dense = crate::View::contiguous(view.shape().clone());
    view.offset() == 0
        && view.shape().numel() == shape.numel()
        && view
            .shape()
            .dims()
            .iter()
            .zip(view.strides().iter().zip(dense.strides()))
            .all(|(&d, (s, c))| d == 1 || s == c)
}

/// Views that need no scatter or no copy: the adjoint of a reshape (a view reading a dense
/// buffer in order) is the reverse reshape, a view; and a view of a view reads the inner
/// view's input directly where the two compose ([`crate::View::compose`]: a transpose of a
/// slice, say), so the inner view is not stored for the outer one's sake.
fn view_rewrite(
    graph: &Graph,
    id: NodeId,
    args: &[NodeId],
    same_as: &HashMap<NodeId, NodeId>,
    rewritten: &HashMap<NodeId, (Op, Vec<NodeId>)>,
) -> Option<(Op, Vec<NodeId>)> {
    match &graph.node(id).op {
        Op::Unview { view, shape } if reads_in_order(view, shape) => {
            Some((Op::View(crate::View::contiguous(shape.clone())), vec![args[0]]))
        }
        Op::View(outer) if !rewritten.contains_key(&args[0]) => {
            let Op::View(inner) = &graph.node(args[0]).op else { return None };
            let source = graph.args(args[0])[0];
            let source = *same_as.get(&source).unwrap_or(&source);
            if reads_in_order(inner, &graph.node(source).shape) {
                return Some((Op::View(outer.clone()), vec![source]));
            }
            outer.compose(inner).map(|view| (Op::View(view), vec![source]))
        }
        _ => None,
    }
}

/// [`view_rewrite`], or else the sums of slice gradients ([`unview_sums::visit`]).
fn rewrite_views(
    graph: &Graph,
    id: NodeId,
    args: &[NodeId],
    same_as: &HashMap<NodeId, NodeId>,
    rewritten: &HashMap<NodeId, (Op, Vec<NodeId>)>,
    regions: &mut unview_sums::Regions,
) -> Option<(Op, Vec<NodeId>)> {
    view_rewrite(graph, id, args, same_as, rewritten).or_else(|| {
        let resolve = |n: NodeId| *same_as.get(&n).unwrap_or(&n);
        unview_sums::visit(graph, id, args, regions, resolve, |n| rewritten.get(&n).cloned())
    })
}

/// The graph with constants folded and exact algebraic identities applied (see the
/// [module documentation](super)).
pub fn simplify(graph: &Graph) -> Rewrite {
    simplify_with(graph, true)
}

/// [`simplify`]; without `fold_constants`, nothing that reads a constant's value is
/// rewritten (a compiled plan rebinds them on every call).
pub(super) fn simplify_with(graph: &Graph, fold_constants: bool) -> Rewrite {
    use crate::{BinaryOp, UnaryOp};
    // First decide, for each node, which node of the same graph it can be replaced by.
    let order = graph.topo_order();
    let mut same_as: HashMap<NodeId, NodeId> = HashMap::default();
    let mut folded: HashMap<NodeId, f64> = HashMap::default();
    // Nodes computed by another op over other arguments (`x^2` as `x * x`).
    let mut rewritten: HashMap<NodeId, (Op, Vec<NodeId>)> = HashMap::default();
    let mut regions = unview_sums::Regions::default();
    let resolve = |same_as: &HashMap<NodeId, NodeId>, n: NodeId| *same_as.get(&n).unwrap_or(&n);
    for &id in &order {
        let args: Vec<NodeId> = graph.args(id).iter().map(|&a| resolve(&same_as, a)).collect();
        if fold_constants && let Some(v) = fold(graph, id, &args, &folded) {
            folded.insert(id, v);
            continue;
        }
        let c = |n: NodeId| if fold_constants { constant(graph, n, &folded) } else { None };
        // Integer powers that are exact as products: `pow` rounds the exact power once, and
        // so do `x * x` and `1 / x`; `x^1` is `x`.
        if let Op::Binary(BinaryOp::Pow) = graph.node(id).op
            && graph.node(args[0]).dtype == graph.node(id).dtype
        {
            let x = args[0];
            match c(args[1]) {
                Some(1.0) => {
                    same_as.insert(id, x);
                    continue;
                }
                Some(2.0) => {
                    rewritten.insert(id, (Op::Binary(BinaryOp::Mul), vec![x, x]));
                    continue;
                }
                Some(-1.0) => {
                    rewritten.insert(id, (Op::Unary(UnaryOp::Recip), vec![x]));
                    continue;
                }
                _ => {}
            }
        }
        let r = rewrite_views(graph, id, &args, &same_as, &rewritten, &mut regions);
        if let Some(r) = r {
            rewritten.insert(id, r);
            continue;
        }
        let replacement = match graph.node(id).op {
            Op::Binary(BinaryOp::Mul) if c(args[1]) == Some(1.0) => Some(args[0]),
            Op::Binary(BinaryOp::Mul) if c(args[0]) == Some(1.0) => Some(args[1]),
            Op::Binary(BinaryOp::Div) if c(args[1]) == Some(1.0) => Some(args[0]),
            Op::Binary(BinaryOp::Sub) if c(args[1]) == Some(0.0) => Some(args[0]),
            Op::Unary(UnaryOp::Neg)
                if matches!(graph.node(args[0]).op, Op::Unary(UnaryOp::Neg)) =>
            {
                Some(resolve(&same_as, graph.args(args[0])[0]))
            }
            _ => None,
        };
        if let Some(r) = replacement {
            same_as.insert(id, r);
        }
    }
    // Then rebuild, skipping replaced nodes and anything only they used.
    let mut out = Graph::new();
    let mut map: HashMap<NodeId, NodeId> = HashMap::default();
    let mut needed = vec![false; order.iter().map(|n| n.index() + 1).max().unwrap_or(0)];
    let mut stack: Vec<NodeId> = graph.outputs().iter().map(|&o| resolve(&same_as, o)).collect();
    stack.extend(graph.inputs().iter().copied()); // inputs keep their binding order
    while let Some(n) = stack.pop() {
        if std::mem::replace(&mut needed[n.index()], true) || folded.contains_key(&n) {
            continue;
        }
        match rewritten.get(&n) {
            Some((_, args)) => stack.extend(args.iter().copied()),
            None => stack.extend(graph.args(n).iter().map(|&a| resolve(&same_as, a))),
        }
    }
    for &id in &order {
        if !needed[id.index()] || same_as.contains_key(&id) {
            continue;
        }
        let node = graph.node(id);
        let new = match &node.op {
            _ if folded.contains_key(&id) => out
                .leaf(Op::Full(crate::Scalar::F64(folded[&id])), node.shape.clone(), node.dtype)
                .expect("a float fill of a float node's shape is valid"),
            Op::Input => out.input(node.shape.clone(), node.dtype),
            op if op.is_leaf() => out
                .leaf(op.clone(), node.shape.clone(), node.dtype)
                .expect("a valid leaf stays valid"),
            _ if rewritten.contains_key(&id) => {
                let (op, args) = &rewritten[&id];
                let args: Vec<NodeId> = args.iter().map(|&a| map[&a]).collect();
                out.push(op.clone(), &args).expect("a rewrite keeps the shape and dtype")
            }
            op => {
                let args: Vec<NodeId> =
                    graph.args(id).iter().map(|&a| map[&resolve(&same_as, a)]).collect();
                out.push(op.clone(), &args)
                    .expect("replacements have the shape and dtype of what they replace")
            }
        };
        out.copy_provenance(new, node);
        map.insert(id, new);
    }
    for &o in graph.outputs() {
        out.mark_output(map[&resolve(&same_as, o)]);
    }
    // A replaced node lives on as what replaced it.
    for (&id, _) in same_as.iter() {
        if let Some(&new) = map.get(&resolve(&same_as, id)) {
            map.insert(id, new);
        }
    }
    Rewrite { graph: out, map }
}
