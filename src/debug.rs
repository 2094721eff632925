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

/// What running a realization would take: the fused kernels and other ops of its plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanSummary {
    /// Generated kernels.
    pub kernels: usize,
    /// Ops that run on their own (reductions, matmul, gather, ...).
    pub other_ops: usize,
    /// For each kernel: its name, the ops it fuses, and why its result is stored.
    pub kernel_notes: Vec<String>,
    /// The text of each kernel.
    pub kernel_text: Vec<String>,
    /// The Cranelift IR generated for each kernel.
    pub clif: Vec<String>,
}

/// The plan that computing `tensors` would run now under the current execution mode (see
/// [`crate::with_fusion`]), without running it.
///
/// ```
/// use kiln::prelude::*;
/// let x = Tensor::ones([4, 4]);
/// x.realize();
/// let y = ((&x * 2.0).exp() + 1.0).sqrt();
/// assert_eq!(kiln::debug::plan_summary(&[&y]).kernels, 1);
/// assert_eq!(kiln::with_fusion(false, || kiln::debug::plan_summary(&[&y])).kernels, 4);
/// ```
pub fn plan_summary(tensors: &[&Tensor]) -> PlanSummary {
    use kiln_ir::fuse::{FusionPolicy, Step, partition};
    let nodes: Vec<_> = tensors.iter().map(|t| t.storage().node()).collect();
    let Ok(captured) = crate::realize::pending_graph(&nodes) else {
        return PlanSummary::default();
    };
    let (graph, _) = kiln_ir::passes::optimize(&captured);
    let policy = if crate::execution() == crate::Execution::Unfused {
        FusionPolicy::Off
    } else {
        FusionPolicy::On
    };
    let mut summary = PlanSummary::default();
    for step in partition(&graph, policy).steps {
        match step {
            Step::Kernel(k) => {
                summary.kernels += 1;
                let ops: Vec<&str> = k.fused.iter().map(|&n| graph.node(n).op.name()).collect();
                summary.kernel_notes.push(format!(
                    "{}: {} (stored: {})",
                    k.kernel.name(),
                    ops.join(" "),
                    k.cut
                ));
                summary.kernel_text.push(k.kernel.to_string());
                summary
                    .clif
                    .push(kiln_runtime::exec::clif(&k.kernel).unwrap_or_else(|e| format!("; {e}")));
            }
            Step::Node(_) | Step::MatMul { .. } => summary.other_ops += 1,
        }
    }
    summary
}
