//! Realization: capture the pending ancestors of some nodes as a graph, run it, and store the
//! results back into the nodes.

use std::collections::HashMap;
use std::sync::Arc;

use kiln_ir::{Graph, NodeId};
use kiln_runtime::exec;

use crate::Result;
use crate::lazy::{LazyNode, State};

/// Computes `targets`, and every captured node that something outside the captured graph
/// still refers to (a user's tensor, a pending consumer), so nothing is computed twice.
/// Everything else computed on the way is freed when this returns.
pub(crate) fn realize(targets: &[Arc<LazyNode>]) -> Result<()> {
    let captured = capture(targets);
    if captured.pending == 0 {
        return Ok(());
    }
    let (graph, inputs, outputs) = build_graph(&captured, targets)?;
    let buffers = exec::run(&graph, &inputs, crate::execution(), crate::execution::check_scale())?;
    for (slot, buffer) in outputs.into_iter().zip(buffers) {
        captured.nodes[slot].set_realized(buffer);
    }
    Ok(())
}

/// The graph that realizing `targets` would run, without running it.
pub(crate) fn pending_graph(targets: &[Arc<LazyNode>]) -> Result<Graph> {
    let captured = capture(targets);
    Ok(build_graph(&captured, targets)?.0)
}

struct Captured {
    /// The nodes in topological order (inputs first).
    nodes: Vec<Arc<LazyNode>>,
    /// Position of each node in `nodes`, by address.
    index: HashMap<*const LazyNode, usize>,
    /// How many pending nodes there are.
    pending: usize,
}

/// Iterative post-order walk from `targets` over pending nodes; realized nodes are leaves.
fn capture(targets: &[Arc<LazyNode>]) -> Captured {
    let mut nodes = Vec::new();
    let mut index: HashMap<*const LazyNode, usize> = HashMap::new();
    let mut pending = 0;
    // (node, whether its inputs have been pushed already)
    let mut stack: Vec<(Arc<LazyNode>, bool)> =
        targets.iter().rev().map(|t| (t.clone(), false)).collect();
    while let Some((node, expanded)) = stack.pop() {
        let key = Arc::as_ptr(&node);
        if index.contains_key(&key) {
            continue;
        }
        if expanded {
            pending += 1;
            index.insert(key, nodes.len());
            nodes.push(node);
            continue;
        }
        let inputs = match &*node.state() {
            State::Realized(_) => None,
            State::Pending(inputs) => Some(inputs.clone()),
        };
        match inputs {
            None => {
                index.insert(key, nodes.len());
                nodes.push(node);
            }
            Some(inputs) => {
                stack.push((node, true));
                for input in inputs.into_iter().rev() {
                    if !index.contains_key(&Arc::as_ptr(&input)) {
                        stack.push((input, false));
                    }
                }
            }
        }
    }
    Captured { nodes, index, pending }
}

/// The graph of the captured nodes, the buffers bound to its inputs, and for each output the
/// position of its node in `captured.nodes`.
fn build_graph(
    captured: &Captured,
    targets: &[Arc<LazyNode>],
) -> Result<(Graph, Vec<kiln_runtime::Buffer>, Vec<usize>)> {
    let mut graph = Graph::new();
    let mut ids: Vec<NodeId> = Vec::with_capacity(captured.nodes.len());
    let mut buffers = Vec::new();
    let mut uses = vec![0usize; captured.nodes.len()];
    for node in &captured.nodes {
        let args: Option<Vec<usize>> = match &*node.state() {
            State::Realized(b) => {
                buffers.push(b.clone());
                None
            }
            State::Pending(inputs) => {
                Some(inputs.iter().map(|i| captured.index[&Arc::as_ptr(i)]).collect())
            }
        };
        let id = match args {
            None => graph.input(node.shape.clone(), node.dtype),
            Some(args) if node.op.is_leaf() => {
                debug_assert!(args.is_empty());
                graph.leaf(node.op.clone(), node.shape.clone(), node.dtype)?
            }
            Some(args) => {
                for &a in &args {
                    uses[a] += 1;
                }
                let arg_ids: Vec<NodeId> = args.iter().map(|&a| ids[a]).collect();
                graph.push(node.op.clone(), &arg_ids)?
            }
        };
        graph.set_origin(id, node.origin);
        ids.push(id);
    }
    // Outputs: the targets, then every pending node referenced from outside the graph. Its
    // handles are `captured.nodes` (one), its consumers' input lists in the graph (`uses`),
    // and anything else: a live tensor, a pending consumer outside this capture.
    let mut outputs = Vec::new();
    let mut is_output = vec![false; captured.nodes.len()];
    for t in targets {
        let slot = captured.index[&Arc::as_ptr(t)];
        if t.buffer().is_none() && !is_output[slot] {
            is_output[slot] = true;
            outputs.push(slot);
        }
    }
    for (slot, node) in captured.nodes.iter().enumerate() {
        let pending = matches!(&*node.state(), State::Pending(_));
        if pending && !is_output[slot] && Arc::strong_count(node) > 1 + uses[slot] {
            is_output[slot] = true;
            outputs.push(slot);
        }
    }
    for &slot in &outputs {
        graph.mark_output(ids[slot]);
    }
    Ok((graph, buffers, outputs))
}
