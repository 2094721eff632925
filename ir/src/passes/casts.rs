//! Casts of views moved before the views. Under autocast, attention casts each head it
//! reads (`narrow`, `reshape` and `transpose` of one projection) to a 16-bit type: three
//! kernels that each read a strided third of the projection and write a dense copy. Cast
//! first, the projection's own kernel writes it once in the 16-bit type, and the heads are
//! views of that, which attention reads in place.

use rustc_hash::FxHashMap as HashMap;

use crate::pipeline::Rewrite;
use crate::{DType, Graph, NodeId, Op};

/// `cast(view(x))` becomes `view(cast(x))`, one cast of `x` per dtype, when each such cast
/// is stored anyway (only ops that do not fuse it read it: attention, a product, a view)
/// and the casts of views of `x` to that dtype read together at least as many elements as
/// `x` has (so the whole cast costs no more than the casts of the views did). A cast read
/// by an elementwise op stays: it fuses into that op's kernel as it is. A cast is
/// elementwise and a view only moves elements, so the values are the same. Returns `None`
/// when nothing changes.
pub fn casts_before_views(graph: &Graph) -> Option<Rewrite> {
    let order = graph.topo_order();
    let mut fused_by_a_reader: HashMap<NodeId, bool> = HashMap::default();
    for &id in &order {
        let op = &graph.node(id).op;
        let fuses = op.is_elementwise() || op.is_kernel_reduce();
        for a in graph.args(id) {
            *fused_by_a_reader.entry(a).or_default() |= fuses;
        }
    }
    // (x, dtype) -> the casts of views of x to dtype, and the elements they read.
    let mut groups: HashMap<(NodeId, DType), (Vec<NodeId>, usize)> = HashMap::default();
    for &id in &order {
        let Op::Cast(dtype) = graph.node(id).op else { continue };
        let view = graph.args(id)[0];
        if !matches!(graph.node(view).op, Op::View(_))
            || fused_by_a_reader.get(&id).copied().unwrap_or(true)
        {
            continue;
        }
        let x = graph.args(view)[0];
        let group = groups.entry((x, dtype)).or_default();
        group.0.push(id);
        group.1 += graph.node(view).shape.numel();
    }
    let moved: HashMap<NodeId, (NodeId, DType)> = groups
        .into_iter()
        .filter(|((x, _), (_, read))| *read >= graph.node(*x).shape.numel())
        .flat_map(|(key, (casts, _))| casts.into_iter().map(move |c| (c, key)))
        .collect();
    if moved.is_empty() {
        return None;
    }
    // Views read only by moved casts are not needed any more.
    let mut moved_reads: HashMap<NodeId, usize> = HashMap::default();
    for &c in moved.keys() {
        *moved_reads.entry(graph.args(c)[0]).or_default() += 1;
    }
    let dropped = |id: &NodeId| {
        moved_reads.get(id).is_some_and(|&n| n == graph.uses(*id)) && !graph.outputs().contains(id)
    };
    let kept: Vec<NodeId> = order.iter().copied().filter(|id| !dropped(id)).collect();
    let mut casts: HashMap<(NodeId, DType), NodeId> = HashMap::default();
    Some(super::rebuild(graph, kept, |out, id, map| {
        let &(x, dtype) = moved.get(&id)?;
        let cast = match casts.get(&(x, dtype)) {
            Some(&c) => c,
            None => {
                let c = out.push(Op::Cast(dtype), &[map[&x]]).expect("a cast of a valid node");
                out.copy_provenance(c, graph.node(id));
                casts.insert((x, dtype), c);
                c
            }
        };
        let Op::View(view) = &graph.node(graph.args(id)[0]).op else {
            unreachable!("moved casts read views")
        };
        Some(out.push(Op::View(view.clone()), &[cast]).expect("the view fits the cast"))
    }))
}
