//! Looking at what kiln records: the graph a realization would run.

use crate::Tensor;

/// The graph that computing `tensors` would run now, in Graphviz DOT: one box per op with
/// its shape and dtype, realized inputs as `input` nodes, and the results kiln would keep
/// drawn bold. Nothing is computed.
///
/// ```
/// use kiln::prelude::*;
/// let x = Tensor::ones([2, 3]);
/// let y = (&x * 2.0).exp().sum_dim(1, false);
/// let dot = kiln::debug::graph_dot(&[&y]);
/// assert!(dot.starts_with("digraph"));
/// assert!(dot.contains("exp") && dot.contains("sum[1]"));
/// ```
pub fn graph_dot(tensors: &[&Tensor]) -> String {
    let nodes: Vec<_> = tensors.iter().map(|t| t.storage().node()).collect();
    match crate::realize::pending_graph(&nodes) {
        Ok(g) => g.to_dot(),
        Err(e) => format!(
            "digraph kiln {{\n    error [label=\"{}\"];\n}}\n",
            e.to_string().replace('"', "\\\"")
        ),
    }
}
