//! [`super::GatherFirst`]: a gather of an elementwise expression gathers its operands instead.

use rustc_hash::FxHashMap as HashMap;

use crate::pipeline::Rewrite;
use crate::{Graph, NodeId, Op, View};

use super::rebuild;

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
            out.copy_provenance(value, node);
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
    out.copy_provenance(new, node);
    pushed.insert(n, new);
    new
}
