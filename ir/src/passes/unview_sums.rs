//! Sums of gradients of disjoint slices. The gradient of a tensor read through several
//! slices (`q`, `k` and `v` narrowed out of one projection) is the sum of each slice's
//! gradient scattered into zeros (`Unview`); when the slices do not overlap, that sum is the
//! first scatter with the others written into it (`Assign`), which the executor does in
//! place: one zero-filled buffer and one write per slice, instead of a zero-filled buffer
//! per slice and an add over all of them.

use rustc_hash::FxHashMap as HashMap;

use crate::{BinaryOp, Graph, NodeId, Op, Shape, View};

/// Nodes that are zero outside the listed views of their (dense) shape: scattered slice
/// gradients, and sums of them.
pub(super) type Regions = HashMap<NodeId, Vec<View>>;

/// A node rewritten: its op and arguments.
type Rewritten = (Op, Vec<NodeId>);

/// Visits `id` (with its resolved `args`) in topological order: an `Unview` is noted as zero
/// outside its view; `add(x, unview(g))` (either order), when `x` is zero outside regions
/// that do not meet `g`'s view, is rewritten as `assign(x, g)`, zero outside both. Either
/// writes a reshape of a node as that node through its view reshaped
/// ([`through_reshape`]). `rewritten` gives a node's op and arguments where another rule
/// rewrote it.
pub(super) fn visit(
    graph: &Graph,
    id: NodeId,
    args: &[NodeId],
    regions: &mut Regions,
    resolve: impl Fn(NodeId) -> NodeId,
    rewritten: impl Fn(NodeId) -> Option<Rewritten>,
) -> Option<Rewritten> {
    if let Op::Unview { view, shape } = &graph.node(id).op {
        regions.insert(id, vec![view.clone()]);
        let (view, values) = through_reshape(graph, view, args[0], &resolve, &rewritten)?;
        return Some((Op::Unview { view, shape: shape.clone() }, vec![values]));
    }
    let (rewrite, covered) = sum(graph, id, args, regions, &resolve, &rewritten)?;
    regions.insert(id, covered);
    Some(rewrite)
}

/// Values written through `view` (by an `Unview` or an `Assign`) that are a reshape of
/// another node (a view reading it in order): that node, written through `view` reshaped
/// to its shape. A permuted node reshaped (attention's heads merged back into features) is
/// not a view, so otherwise the reshape is a stored copy. `None` when that does not apply.
fn through_reshape(
    graph: &Graph,
    view: &View,
    values: NodeId,
    resolve: impl Fn(NodeId) -> NodeId,
    rewritten: impl Fn(NodeId) -> Option<Rewritten>,
) -> Option<(View, NodeId)> {
    let (op, args) = rewritten(values).unwrap_or_else(|| {
        (graph.node(values).op.clone(), graph.args(values).iter().map(|&a| resolve(a)).collect())
    });
    let Op::View(reshape) = op else { return None };
    let shape = &graph.node(args[0]).shape;
    if !super::simplify::reads_in_order(&reshape, shape) {
        return None;
    }
    Some((view.reshape(shape)?, args[0]))
}

fn sum(
    graph: &Graph,
    id: NodeId,
    args: &[NodeId],
    regions: &Regions,
    resolve: impl Fn(NodeId) -> NodeId,
    rewritten: impl Fn(NodeId) -> Option<Rewritten>,
) -> Option<(Rewritten, Vec<View>)> {
    let node = graph.node(id);
    if !matches!(node.op, Op::Binary(BinaryOp::Add)) {
        return None;
    }
    for (x, u) in [(args[0], args[1]), (args[1], args[0])] {
        let (Some(covered), Some(slice)) = (regions.get(&x), regions.get(&u)) else { continue };
        let Op::Unview { view, shape } = &graph.node(u).op else { continue };
        let values = resolve(graph.args(u)[0]);
        let same_type = [x, u, values].iter().all(|&n| graph.node(n).dtype == node.dtype);
        if slice.len() != 1
            || !same_type
            || graph.node(x).shape != node.shape
            || *shape != node.shape
            || !covered.iter().all(|r| disjoint(r, view, shape))
        {
            continue;
        }
        let mut now = covered.clone();
        now.push(view.clone());
        let (view, values) = through_reshape(graph, view, values, &resolve, &rewritten)
            .unwrap_or_else(|| (view.clone(), values));
        return Some(((Op::Assign(view), vec![x, values]), now));
    }
    None
}

/// Whether two views of a dense buffer of `base` never read the same element: their
/// bounding boxes, in the buffer's coordinates, are apart along some dimension.
fn disjoint(a: &View, b: &View, base: &Shape) -> bool {
    match (bounds(a, base), bounds(b, base)) {
        (Some(a), Some(b)) => a.iter().zip(&b).any(|(&(lo, hi), &(lo2, hi2))| hi < lo2 || hi2 < lo),
        _ => false,
    }
}

/// For each dimension of `base`, the least and greatest coordinate `view` reads; `None`
/// when a dimension of the view does not stay within one dimension of the buffer (negative
/// or zero strides, a step that carries into the next dimension).
fn bounds(view: &View, base: &Shape) -> Option<Vec<(usize, usize)>> {
    let dims = base.dims();
    let strides = base.contiguous_strides();
    let mut rest = view.offset();
    let mut boxes: Vec<(usize, usize)> = Vec::with_capacity(dims.len());
    for &s in &strides {
        let s = usize::try_from(s).ok()?.max(1);
        boxes.push((rest / s, rest / s));
        rest %= s;
    }
    for (&size, &step) in view.shape().dims().iter().zip(view.strides()) {
        if size <= 1 {
            continue;
        }
        let step = usize::try_from(step).ok().filter(|&s| s > 0)?;
        // The dimension whose coordinate this step moves: its stride divides the step and
        // the step stays below the next outer dimension's stride.
        let k = (0..dims.len()).rev().find(|&k| {
            let inner = strides[k].unsigned_abs();
            let outer = if k == 0 { usize::MAX } else { strides[k - 1].unsigned_abs() };
            dims[k] > 1 && inner <= step && step < outer
        })?;
        let inner = strides[k].unsigned_abs();
        if step % inner != 0 {
            return None;
        }
        boxes[k].1 += (size - 1) * (step / inner);
    }
    boxes.iter().zip(dims).all(|(&(_, hi), &d)| hi < d).then_some(boxes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_of_one_dimension_are_apart_and_overlaps_are_not() {
        let base = Shape::from([2, 5, 12]);
        let third = |i: usize| View::contiguous(base.clone()).narrow(2, 4 * i, 4);
        assert!(disjoint(&third(0), &third(1), &base));
        assert!(disjoint(&third(2), &third(0), &base));
        assert!(!disjoint(&third(1), &third(1), &base));
        let wide = View::contiguous(base.clone()).narrow(2, 3, 6);
        assert!(!disjoint(&wide, &third(0), &base) && !disjoint(&wide, &third(2), &base));
        // Heads: a third split as [2, 5, 2, 2] and transposed, as attention reads q, k, v.
        let heads = |i: usize| {
            third(i).reshape(&Shape::from([2, 5, 2, 2])).expect("a split").permute(&[0, 2, 1, 3])
        };
        assert!(disjoint(&heads(0), &heads(1), &base));
        assert!(!disjoint(&heads(1), &heads(1), &base));
        // Rows apart along the first dimension.
        let rows = |s: usize| View::contiguous(base.clone()).narrow(1, s, 2);
        assert!(disjoint(&rows(0), &rows(3), &base) && !disjoint(&rows(0), &rows(1), &base));
    }
}
