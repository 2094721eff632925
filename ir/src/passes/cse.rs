//! [`super::Cse`]: common-subexpression elimination.

use rustc_hash::FxHashMap as HashMap;

use crate::pipeline::{Constants, Rewrite};
use crate::{Graph, NodeId, Op};

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
        out.copy_provenance(new, node);
        seen.insert(key, new);
        map.insert(id, new);
    }
    for o in graph.outputs() {
        out.mark_output(map[o]);
    }
    Rewrite { graph: out, map }
}
