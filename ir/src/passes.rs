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
use crate::{Graph, NodeId, Op, View};

mod casts;
mod log_softmax;
mod logsumexp;
mod unview_sums;

pub use casts::casts_before_views;
pub use log_softmax::precise_log_softmax;
pub use logsumexp::expand_logsumexp;

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
        Some(simplify_with(graph, options.constants == Constants::Fold))
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
        if let Some(origin) = graph.node(id).origin {
            out.set_origin(new, origin);
        }
        map.insert(id, new);
    }
    for o in graph.outputs() {
        out.mark_output(map[o]);
    }
    Rewrite { graph: out, map }
}

/// How an operand of an elementwise expression reaches a gather pushed below it.
enum Leaf {
    /// Constant along the gathered axis (a view with stride 0 there): read through a view
    /// of the index's shape, no gather.
    Broadcast,
    /// Gathered with the same index.
    Full,
}

/// The leaves of the elementwise expression `n` (through elementwise ops) for a gather
/// along `axis`, in first-seen order.
fn gather_leaves(graph: &Graph, n: NodeId, axis: usize, out: &mut Vec<(NodeId, Leaf)>) {
    if out.iter().any(|(m, _)| *m == n) {
        return;
    }
    let node = graph.node(n);
    match &node.op {
        op if op.is_elementwise() => {
            for a in graph.args(n) {
                gather_leaves(graph, a, axis, out);
            }
        }
        Op::View(v) if v.strides()[axis] == 0 => out.push((n, Leaf::Broadcast)),
        _ => out.push((n, Leaf::Full)),
    }
}

/// Pushes gathers below the elementwise ops they read: `gather(x - m, i)` with `m`
/// broadcast along the gathered axis becomes `gather(x, i) - m'` (`m'` a view of `m` in the
/// index's shape), computed over the index's elements instead of the whole tensor. This is
/// cross-entropy's pattern: `gather(log_softmax(x), target)` no longer writes the full
/// log-probabilities to pick one per row. A rewrite needs at least one operand that is
/// gathered (so the index is still checked), and either a broadcast operand or an
/// expression read by the gather alone (otherwise nothing is saved). Returns the new graph
/// and the new node of every node that is kept, or `None` when nothing changes.
pub fn gather_first(graph: &Graph) -> Option<Rewrite> {
    let order = graph.topo_order();
    let mut chosen: HashMap<NodeId, Vec<(NodeId, Leaf)>> = HashMap::default();
    for &id in &order {
        let Op::Gather { axis } = graph.node(id).op else { continue };
        let e = graph.args(id)[0];
        if !graph.node(e).op.is_elementwise() {
            continue;
        }
        let mut leaves = Vec::new();
        gather_leaves(graph, e, axis, &mut leaves);
        let full = leaves.iter().any(|(_, l)| matches!(l, Leaf::Full));
        let broadcast = leaves.iter().any(|(_, l)| matches!(l, Leaf::Broadcast));
        let alone = graph.uses(e) == 1 && !graph.outputs().contains(&e);
        if full && (broadcast || alone) {
            chosen.insert(id, leaves);
        }
    }
    if chosen.is_empty() {
        return None;
    }
    // The nodes still needed: a rewritten gather reads its leaves (a broadcast view's source)
    // and its index instead of the expression.
    let mut needed: std::collections::HashSet<NodeId> = graph.inputs().iter().copied().collect();
    let mut stack: Vec<NodeId> = graph.outputs().to_vec();
    while let Some(n) = stack.pop() {
        if !needed.insert(n) && !graph.inputs().contains(&n) {
            continue;
        }
        match chosen.get(&n) {
            Some(leaves) => {
                stack.push(graph.args(n)[1]);
                for (m, leaf) in leaves {
                    stack.push(match leaf {
                        Leaf::Broadcast => graph.args(*m)[0],
                        Leaf::Full => *m,
                    });
                }
            }
            None => stack.extend(graph.args(n)),
        }
    }
    let kept = order.iter().copied().filter(|id| needed.contains(id));
    Some(rebuild(graph, kept, |out, id, map| {
        let node = graph.node(id);
        let (Some(leaves), Op::Gather { axis }) = (chosen.get(&id), &node.op) else {
            return None;
        };
        let index = map[&graph.args(id)[1]];
        let shape = node.shape.clone();
        let mut pushed: HashMap<NodeId, NodeId> = HashMap::default();
        for (m, leaf) in leaves {
            let value = match leaf {
                Leaf::Broadcast => {
                    let Op::View(v) = &graph.node(*m).op else { unreachable!("a view") };
                    // The same elements, over the index's shape: outside the axis the
                    // index is no larger than the tensor, along it the stride is 0.
                    let view = View::from_parts(shape.clone(), v.strides().to_vec(), v.offset());
                    out.push(Op::View(view), &[map[&graph.args(*m)[0]]])
                }
                Leaf::Full => out.push(Op::Gather { axis: *axis }, &[map[m], index]),
            };
            let value = value.expect("a gather of an operand of the gathered shape");
            // The pushed gathers check the index: their errors name the gather's line.
            if let Some(origin) = node.origin {
                out.set_origin(value, origin);
            }
            pushed.insert(*m, value);
        }
        Some(push_elementwise(graph, out, graph.args(id)[0], &mut pushed))
    }))
}

/// The elementwise expression `n` rebuilt over the gathered leaves in `pushed` (which it
/// fills with the nodes it makes).
fn push_elementwise(
    graph: &Graph,
    out: &mut Graph,
    n: NodeId,
    pushed: &mut HashMap<NodeId, NodeId>,
) -> NodeId {
    if let Some(&p) = pushed.get(&n) {
        return p;
    }
    let args: Vec<NodeId> =
        graph.args(n).into_iter().map(|a| push_elementwise(graph, out, a, pushed)).collect();
    let node = graph.node(n);
    let new = out
        .push(node.op.clone(), &args)
        .expect("an elementwise op over operands of one (gathered) shape");
    if let Some(origin) = node.origin {
        out.set_origin(new, origin);
    }
    pushed.insert(n, new);
    new
}

/// What makes two nodes compute the same values, for [`cse`].
#[derive(PartialEq, Eq, Hash)]
enum CseKey {
    /// A constant or random leaf that stays distinct (its value is rebound on every run).
    Leaf(usize),
    /// The op with its parameters, the result's type, and the inputs.
    Node(Op, crate::DType, crate::Shape, Vec<NodeId>),
}

/// The graph with common subexpressions merged. Inputs keep their order, so the same
/// buffers bind to the new graph. With [`Constants::Rebindable`], every `Full` and `Random`
/// leaf is kept apart, so the result stays valid whatever values they take.
///
/// ```
/// use kiln_ir::{DType, Graph, Op, Shape, UnaryOp, passes, pipeline::Constants};
/// let mut g = Graph::new();
/// let x = g.input(Shape::from([3]), DType::F32);
/// let a = g.push(Op::Unary(UnaryOp::Exp), &[x])?;
/// let b = g.push(Op::Unary(UnaryOp::Exp), &[x])?;
/// let s = g.push(Op::Binary(kiln_ir::BinaryOp::Add), &[a, b])?;
/// g.mark_output(s);
/// let merged = passes::cse(&g, Constants::Fold);
/// assert_eq!(merged.graph.len(), 3); // x, exp, add
/// assert_eq!(merged.map[&a], merged.map[&b]);
/// # Ok::<(), kiln_ir::IrError>(())
/// ```
pub fn cse(graph: &Graph, constants: Constants) -> Rewrite {
    let mut out = Graph::new();
    let mut map: HashMap<NodeId, NodeId> = HashMap::default();
    let mut seen: HashMap<CseKey, NodeId> = HashMap::default();
    for id in graph.topo_order() {
        let node = graph.node(id);
        let args: Vec<NodeId> = graph.arg_slice(id).iter().map(|a| map[a]).collect();
        if matches!(node.op, Op::Input) {
            let new = out.input(node.shape.clone(), node.dtype);
            map.insert(id, new);
            continue;
        }
        let key = if constants == Constants::Rebindable && node.op.is_rebindable() {
            CseKey::Leaf(id.index())
        } else {
            CseKey::Node(node.op.clone(), node.dtype, node.shape.clone(), args.clone())
        };
        if let Some(&existing) = seen.get(&key) {
            map.insert(id, existing);
            continue;
        }
        let new = if node.op.is_leaf() {
            out.leaf(node.op.clone(), node.shape.clone(), node.dtype)
        } else {
            out.push(node.op.clone(), &args)
        }
        .expect("a node that was valid in the graph is valid with merged inputs of the same types");
        if let Some(origin) = node.origin {
            out.set_origin(new, origin);
        }
        seen.insert(key, new);
        map.insert(id, new);
    }
    for o in graph.outputs() {
        out.mark_output(map[o]);
    }
    Rewrite { graph: out, map }
}

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
fn reads_in_order(view: &crate::View, shape: &crate::Shape) -> bool {
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
/// [module documentation](self)).
pub fn simplify(graph: &Graph) -> Rewrite {
    simplify_with(graph, true)
}

/// [`simplify`]; without `fold_constants`, nothing that reads a constant's value is
/// rewritten (a compiled plan rebinds them on every call).
fn simplify_with(graph: &Graph, fold_constants: bool) -> Rewrite {
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
        if let Some(origin) = node.origin {
            out.set_origin(new, origin);
        }
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

#[cfg(test)]
mod tests;
