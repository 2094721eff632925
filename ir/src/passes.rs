//! The graph passes of the planning pipeline (see [`crate::pipeline`]), in the order the
//! standard pipeline runs them. Each is a [`Pass`] value with a name, and each returns a
//! [`Rewrite`] (or nothing when it changes nothing).
//!
//! - [`PreciseLogSoftmax`]: `x - logsumexp(x)` over f32 computed as
//!   `(x - max) - log(sum(exp(x - max)))`, from the one-pass fold's f64 result on the CPU,
//!   so log-softmax and cross-entropy are as precise as their results at any magnitude.
//! - [`ExpandLogSumExp`]: `logsumexp` as max, exp, sum and log where the target cannot fold
//!   it in one pass.
//! - [`TransposeProducts`]: a product used only transposed becomes the product of the
//!   transposed operands, so weight gradients are written in the layout they are read in.
//! - [`GatherFirst`]: a gather of an elementwise expression gathers its operands instead
//!   (cross-entropy picks its log-probabilities without writing them all).
//! - [`CastsBeforeViews`]: a cast of a view becomes a view of one cast of the whole
//!   tensor, when the casts of its views read at least all of it (autocast's heads of a
//!   projection are cast once, by the projection's kernel).
//! - [`Simplify`]: constant folding (a floating-point op of constants becomes a constant,
//!   computed with [`crate::semantics`], as every executor computes it), and algebraic
//!   identities that hold exactly in IEEE arithmetic: `x * 1`, `1 * x`, `x / 1` and `x - 0`
//!   are `x`, `-(-x)` is `x`, and `x^2`, `x^-1` are `x * x`, `1 / x`. (`x + 0` is not: `-0 + 0`
//!   is `+0`; `exp(log x)` is not: it is NaN for negative `x`.) It reads constants, so it does
//!   nothing of this to plans whose constants are [`Constants::Rebindable`]. One rewrite is
//!   not about constants and runs in both: a sum of gradients of slices that do not overlap
//!   (each an `Unview`, zero outside its slice) becomes the first with the others assigned
//!   into it, which the executor does in place; it is exact but for the sign of zero (a `-0`
//!   element stays `-0` where `-0 + 0` would give `+0`).
//! - [`Cse`]: common-subexpression elimination. Two nodes with the same op, dtype, shape and
//!   (already merged) inputs compute the same values, so one of them is dropped and its
//!   consumers read the other. This matters most for autograd: gradient rules recompute
//!   forward values (`tanh(x)` in the rule of `tanh`), and when the forward pass is realized
//!   in the same graph the recomputation merges with it. Random fills are pure functions of
//!   their key, so equal fills merge too (unless constants are rebindable: then every fill
//!   and random leaf stays apart).
//!
//! Dead code needs no pass of its own: a captured graph holds only ancestors of what is
//! wanted, and the passes that replace nodes rebuild only what the outputs still need.

use rustc_hash::FxHashMap as HashMap;

use crate::pipeline::{Constants, Pass, PlanOptions, Rewrite};
use crate::{Graph, NodeId, Op};

mod casts;
mod cse;
mod gather_first;
mod log_softmax;
mod logsumexp;
mod simplify;
mod transpose_products;
mod unview_sums;

pub use casts::casts_before_views;
pub use cse::cse;
pub use gather_first::gather_first;
pub use log_softmax::precise_log_softmax;
pub use logsumexp::expand_logsumexp;
pub use simplify::simplify;
pub use transpose_products::transpose_products;

/// [`precise_log_softmax`] as a pipeline pass.
pub struct PreciseLogSoftmax;

impl Pass for PreciseLogSoftmax {
    fn name(&self) -> &'static str {
        "precise_log_softmax"
    }
    fn run(&self, graph: &Graph, options: &PlanOptions) -> Option<Rewrite> {
        precise_log_softmax(graph, options)
    }
}

/// [`expand_logsumexp`] as a pipeline pass.
pub struct ExpandLogSumExp;

impl Pass for ExpandLogSumExp {
    fn name(&self) -> &'static str {
        "expand_logsumexp"
    }
    fn run(&self, graph: &Graph, options: &PlanOptions) -> Option<Rewrite> {
        expand_logsumexp(graph, options)
    }
}

/// [`transpose_products`] as a pipeline pass.
pub struct TransposeProducts;

impl Pass for TransposeProducts {
    fn name(&self) -> &'static str {
        "transpose_products"
    }
    fn run(&self, graph: &Graph, _: &PlanOptions) -> Option<Rewrite> {
        transpose_products(graph)
    }
}

/// [`gather_first`] as a pipeline pass.
pub struct GatherFirst;

impl Pass for GatherFirst {
    fn name(&self) -> &'static str {
        "gather_first"
    }
    fn run(&self, graph: &Graph, _: &PlanOptions) -> Option<Rewrite> {
        gather_first(graph)
    }
}

/// [`casts_before_views`] as a pipeline pass.
pub struct CastsBeforeViews;

impl Pass for CastsBeforeViews {
    fn name(&self) -> &'static str {
        "casts_before_views"
    }
    fn run(&self, graph: &Graph, _: &PlanOptions) -> Option<Rewrite> {
        casts_before_views(graph)
    }
}

/// [`simplify`] as a pipeline pass; when constants are rebindable only the rewrites that
/// read no constant run (views, double negation).
pub struct Simplify;

impl Pass for Simplify {
    fn name(&self) -> &'static str {
        "simplify"
    }
    fn run(&self, graph: &Graph, options: &PlanOptions) -> Option<Rewrite> {
        Some(simplify::simplify_with(graph, options.constants == Constants::Fold))
    }
}

/// [`cse`] as a pipeline pass.
pub struct Cse;

impl Pass for Cse {
    fn name(&self) -> &'static str {
        "cse"
    }
    fn run(&self, graph: &Graph, options: &PlanOptions) -> Option<Rewrite> {
        Some(cse(graph, options.constants))
    }
}

/// Node `id` of `graph` recorded again in `out`, over the new nodes of its inputs.
fn copy_node(graph: &Graph, out: &mut Graph, id: NodeId, map: &HashMap<NodeId, NodeId>) -> NodeId {
    let node = graph.node(id);
    match &node.op {
        Op::Input => out.input(node.shape.clone(), node.dtype),
        op if op.is_leaf() => {
            out.leaf(op.clone(), node.shape.clone(), node.dtype).expect("a valid leaf stays valid")
        }
        op => {
            let args: Vec<NodeId> = graph.args(id).iter().map(|a| map[a]).collect();
            out.push(op.clone(), &args).expect("a node's inputs are unchanged")
        }
    }
}

/// `graph` rebuilt over `nodes` (in topological order): each node becomes what `rewrite`
/// makes of it in the new graph (given the map of the nodes before it), or a copy where it
/// returns `None`. Origins carry over to what replaces a node, and outputs to their new
/// nodes.
fn rebuild(
    graph: &Graph,
    nodes: impl IntoIterator<Item = NodeId>,
    mut rewrite: impl FnMut(&mut Graph, NodeId, &HashMap<NodeId, NodeId>) -> Option<NodeId>,
) -> Rewrite {
    let mut out = Graph::new();
    let mut map: HashMap<NodeId, NodeId> = HashMap::default();
    for id in nodes {
        let new = match rewrite(&mut out, id, &map) {
            Some(new) => new,
            None => copy_node(graph, &mut out, id, &map),
        };
        out.copy_provenance(new, graph.node(id));
        map.insert(id, new);
    }
    for o in graph.outputs() {
        out.mark_output(map[o]);
    }
    Rewrite { graph: out, map }
}

#[cfg(test)]
mod tests;
