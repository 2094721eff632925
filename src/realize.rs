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
    if crate::compile::defer(targets) {
        return Ok(());
    }
    let captured = capture(targets);
    if captured.pending == 0 {
        return Ok(());
    }
    let built = build_graph(&captured, targets)?;
    let buffers =
        exec::run(&built.graph, &built.buffers, crate::execution(), crate::execution::check_scale())?;
    for (slot, buffer) in built.outputs.into_iter().zip(buffers) {
        captured.nodes[slot].set_realized(buffer);
    }
    Ok(())
}

/// The graph that realizing `targets` would run, without running it.
pub(crate) fn pending_graph(targets: &[Arc<LazyNode>]) -> Result<Graph> {
    let captured = capture(targets);
    Ok(build_graph(&captured, targets)?.graph)
}

pub(crate) struct Captured {
    /// The nodes in topological order (inputs first).
    pub(crate) nodes: Vec<Arc<LazyNode>>,
    /// Position of each node in `nodes`, by address.
    pub(crate) index: HashMap<*const LazyNode, usize>,
    /// How many pending nodes there are.
    pub(crate) pending: usize,
}

/// Iterative post-order walk from `targets` over pending nodes; realized nodes are leaves.
pub(crate) fn capture(targets: &[Arc<LazyNode>]) -> Captured {
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
pub(crate) fn build_graph(
    captured: &Captured,
    targets: &[Arc<LazyNode>],
) -> Result<Built> {
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
    let outputs = output_slots(captured, targets, &uses);
    for &slot in &outputs {
        graph.mark_output(ids[slot]);
    }
    Ok(Built { graph, buffers, outputs, ids })
}

/// A captured graph ready to run.
pub(crate) struct Built {
    pub(crate) graph: Graph,
    /// The buffers bound to the graph's inputs, in order.
    pub(crate) buffers: Vec<kiln_runtime::Buffer>,
    /// The slots (positions in `Captured::nodes`) of the graph's outputs, in order.
    pub(crate) outputs: Vec<usize>,
    /// The graph node of each slot.
    pub(crate) ids: Vec<NodeId>,
}

/// How many captured nodes use each captured node as an input.
pub(crate) fn uses(captured: &Captured) -> Vec<usize> {
    let mut uses = vec![0usize; captured.nodes.len()];
    for node in &captured.nodes {
        if let State::Pending(inputs) = &*node.state() {
            for i in inputs {
                uses[captured.index[&Arc::as_ptr(i)]] += 1;
            }
        }
    }
    uses
}

/// The captured nodes a realization must keep: the targets, then every pending node
/// referenced from outside the graph. A node's handles are `captured.nodes` (one), its
/// consumers' input lists in the graph (`uses`), and anything else: a live tensor, a pending
/// consumer outside this capture.
pub(crate) fn output_slots(
    captured: &Captured,
    targets: &[Arc<LazyNode>],
    uses: &[usize],
) -> Vec<usize> {
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
    outputs
}
