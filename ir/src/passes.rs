//! Graph passes that run before fusion.
//!
//! - [`cse`]: common-subexpression elimination. Two nodes with the same op, dtype, shape and
//!   (already merged) inputs compute the same values, so one of them is dropped and its
//!   consumers read the other. This matters most for autograd: gradient rules recompute
//!   forward values (`tanh(x)` in the rule of `tanh`), and when the forward pass is realized
//!   in the same graph the recomputation merges with it. Random fills are pure functions of
//!   their key, so equal fills merge too.
//!
//! Dead code needs no pass: a captured graph holds only ancestors of what is wanted.

use std::collections::HashMap;

use crate::{Graph, NodeId, Op};

/// The graph with common subexpressions merged, and for each output of `graph` (in order)
/// the node of the new graph that computes it. Inputs keep their order, so the same buffers
/// bind to the new graph.
///
/// ```
/// use kiln_ir::{DType, Graph, Op, Shape, UnaryOp, passes};
/// let mut g = Graph::new();
/// let x = g.input(Shape::from([3]), DType::F32);
/// let a = g.push(Op::Unary(UnaryOp::Exp), &[x])?;
/// let b = g.push(Op::Unary(UnaryOp::Exp), &[x])?;
/// let s = g.push(Op::Binary(kiln_ir::BinaryOp::Add), &[a, b])?;
/// g.mark_output(s);
/// let (merged, outputs) = passes::cse(&g);
/// assert_eq!(merged.len(), 3); // x, exp, add
/// assert_eq!(merged.args(outputs[0]), vec![merged.args(outputs[0])[0]; 2]);
/// # Ok::<(), kiln_ir::IrError>(())
/// ```
pub fn cse(graph: &Graph) -> (Graph, Vec<NodeId>) {
    let mut out = Graph::new();
    let mut map: HashMap<NodeId, NodeId> = HashMap::new();
    let mut seen: HashMap<String, NodeId> = HashMap::new();
    for id in graph.topo_order() {
        let node = graph.node(id);
        let args: Vec<NodeId> = graph.args(id).iter().map(|a| map[a]).collect();
        if matches!(node.op, Op::Input) {
            let new = out.input(node.shape.clone(), node.dtype);
            map.insert(id, new);
            continue;
        }
        // Everything that determines the values: the op (with its parameters), the result's
        // type, and the inputs.
        let key = format!("{:?}|{}|{}|{:?}", node.op, node.dtype, node.shape, args);
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
    let outputs: Vec<NodeId> = graph.outputs().iter().map(|o| map[o]).collect();
    for &o in &outputs {
        out.mark_output(o);
    }
    (out, outputs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BinaryOp, DType, Scalar, Shape, UnaryOp};

    #[test]
    fn merges_chains_and_keeps_outputs_and_inputs() {
        let mut g = Graph::new();
        let x = g.input(Shape::from([4]), DType::F32);
        let y = g.input(Shape::from([4]), DType::F32);
        let c1 = g.leaf(Op::Full(Scalar::F64(2.0)), Shape::from([4]), DType::F32).unwrap();
        let c2 = g.leaf(Op::Full(Scalar::F64(2.0)), Shape::from([4]), DType::F32).unwrap();
        let a = g.push(Op::Binary(BinaryOp::Mul), &[x, c1]).unwrap();
        let b = g.push(Op::Binary(BinaryOp::Mul), &[x, c2]).unwrap();
        let ta = g.push(Op::Unary(UnaryOp::Tanh), &[a]).unwrap();
        let tb = g.push(Op::Unary(UnaryOp::Tanh), &[b]).unwrap();
        let other = g.push(Op::Binary(BinaryOp::Mul), &[y, c1]).unwrap();
        g.mark_output(ta);
        g.mark_output(tb);
        g.mark_output(other);
        let (m, outs) = cse(&g);
        // x, y, 2.0, x*2, tanh, y*2
        assert_eq!(m.len(), 6);
        assert_eq!(outs[0], outs[1]);
        assert_ne!(outs[0], outs[2]);
        assert_eq!(m.inputs().len(), 2);
        m.verify().unwrap();
    }
}
