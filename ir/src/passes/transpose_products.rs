//! [`super::TransposeProducts`]: a product used only transposed becomes the product of the
//! transposed operands.

use rustc_hash::FxHashMap as HashMap;

use crate::pipeline::Rewrite;
use crate::{Graph, NodeId, Op, View};

use super::rebuild;

/// Whether `view` swaps the last two dimensions of a dense tensor of shape `input`.
fn is_transpose_of(view: &View, input: &crate::Shape) -> bool {
    let r = input.rank();
    if r < 2 || view.offset() != 0 {
        return false;
    }
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 2, r - 1);
    let swapped = View::contiguous(input.clone()).permute(&perm);
    view.shape() == swapped.shape() && view.strides() == swapped.strides()
}

/// `(a @ b)ᵀ` rewritten as `bᵀ @ aᵀ` when the product is used only transposed: the
/// transposes are strides that the matrix library reads for free, so the result is written
/// in the layout it is read in instead of being copied. Autograd makes this pattern for
/// every weight used as `x @ wᵀ` (the gradient of `w` is `(xᵀ g)ᵀ`). Returns the new graph
/// and the new node of every node that is kept, or `None` when there is nothing to rewrite
/// (the graph is not copied then).
pub fn transpose_products(graph: &Graph) -> Option<Rewrite> {
    let order = graph.topo_order();
    let mut fold: HashMap<NodeId, NodeId> = HashMap::default(); // view -> product it transposes
    for &id in &order {
        if let Op::View(view) = &graph.node(id).op {
            let src = graph.args(id)[0];
            let product = graph.node(src);
            if matches!(product.op, Op::MatMul)
                && graph.uses(src) == 1
                && !graph.outputs().contains(&src)
                && is_transpose_of(view, &product.shape)
            {
                fold.insert(id, src);
            }
        }
    }
    if fold.is_empty() {
        return None;
    }
    let folded: std::collections::HashSet<NodeId> = fold.values().copied().collect();
    let kept = order.iter().copied().filter(|id| !folded.contains(id));
    Some(rebuild(graph, kept, |out, id, map| {
        let &product = fold.get(&id)?;
        let [a, b] = [graph.args(product)[0], graph.args(product)[1]];
        // A transpose of a view is that view with two dimensions swapped, over the same
        // source: views never stack up (the matrix library reads one view as strides).
        let transposed = |out: &mut Graph, n: NodeId| {
            let shape = graph.node(n).shape.clone();
            let r = shape.rank();
            let mut perm: Vec<usize> = (0..r).collect();
            perm.swap(r - 2, r - 1);
            // An operand that is itself a folded transpose is a product now: transpose
            // the new product, not the view's old source (which is gone).
            let (view, src) = match &graph.node(n).op {
                Op::View(v) if !fold.contains_key(&n) => (v.permute(&perm), graph.args(n)[0]),
                _ => (View::contiguous(shape).permute(&perm), n),
            };
            if view.is_identity_of(&graph.node(src).shape) {
                return Ok(map[&src]);
            }
            out.push(Op::View(view), &[map[&src]])
        };
        let bt = transposed(out, b);
        let at = transposed(out, a);
        let (bt, at) = (
            bt.expect("a transpose of a matrix operand is a valid view"),
            at.expect("a transpose of a matrix operand is a valid view"),
        );
        Some(out.push(Op::MatMul, &[bt, at]).expect("bᵀ aᵀ has the shape of (a b)ᵀ"))
    }))
}
