//! Steps that reuse a buffer instead of writing a new one, decided where the plan is made so
//! that the executor only obeys: an `Assign` whose base nothing after it reads writes into
//! the base's buffer ([`Step::AssignInPlace`]), and a scatter onto a constant that only it
//! reads fills its own output, the constant's kernel dropped ([`Step::ScatterOntoFill`]; the
//! gradient of a gather scatters into zeros; not in unfused plans, the one-kernel-per-op
//! baseline); any other scatter whose base nothing after it reads writes into the base's
//! buffer ([`Step::ScatterInPlace`]: a static key/value cache's new keys). Only where the
//! target lets the executor overwrite its buffers
//! ([`crate::target::Target::writes_in_place`]).

use rustc_hash::FxHashMap as HashMap;

use super::Step;
use crate::kernel::ExprKind;
use crate::pipeline::{Fusion, PlanOptions};
use crate::{Graph, NodeId, Op, View};

/// `steps` with the buffer reuses above decided; `outputs` are the plan's results (their
/// buffers are read after the last step).
pub fn reuse_buffers(
    graph: &Graph,
    steps: Vec<Step>,
    outputs: &[NodeId],
    options: &PlanOptions,
) -> Vec<Step> {
    if !options.target.writes_in_place {
        return steps;
    }
    let readers = readers(graph, &steps, outputs);
    let read_once = |n: NodeId| readers.get(&n) == Some(&1);
    let constants = constant_kernels(&steps);
    let fills = options.fusion != Fusion::Unfused;
    let mut dropped = vec![false; steps.len()];
    let mut decided = Vec::with_capacity(steps.len());
    for step in steps {
        decided.push(match step {
            Step::Node(n) => {
                let node = graph.node(n);
                let args = graph.arg_slice(n);
                match &node.op {
                    Op::Scatter { .. } if read_once(args[0]) => match constants.get(&args[0]) {
                        Some(&(kernel, fill)) if fills => {
                            dropped[kernel] = true;
                            Step::ScatterOntoFill { node: n, fill }
                        }
                        _ => Step::ScatterInPlace { node: n },
                    },
                    Op::Assign(_) if read_once(args[0]) => Step::AssignInPlace {
                        node: n,
                        base: args[0],
                        values: (args[1], View::contiguous(graph.node(args[1]).shape.clone())),
                    },
                    _ => Step::Node(n),
                }
            }
            Step::Library { node, operands }
                if matches!(graph.node(node).op, Op::Assign(_)) && read_once(operands[0].0) =>
            {
                Step::AssignInPlace { node, base: operands[0].0, values: operands[1].clone() }
            }
            step => step,
        });
    }
    decided.into_iter().zip(dropped).filter(|(_, dropped)| !dropped).map(|(s, _)| s).collect()
}

/// How many steps (and outputs) read each node.
fn readers(graph: &Graph, steps: &[Step], outputs: &[NodeId]) -> HashMap<NodeId, u32> {
    let mut readers: HashMap<NodeId, u32> = HashMap::default();
    for n in steps.iter().flat_map(|s| s.reads(graph)).chain(outputs.iter().copied()) {
        *readers.entry(n).or_default() += 1;
    }
    readers
}

/// The kernels that only fill their one output with a parameter: output node -> (step, the
/// `Full` node the parameter holds).
fn constant_kernels(steps: &[Step]) -> HashMap<NodeId, (usize, NodeId)> {
    let mut constants = HashMap::default();
    for (i, s) in steps.iter().enumerate() {
        if let Step::Kernel(k) = s
            && let [out] = k.outputs[..]
            && k.kernel.inputs.is_empty()
            && k.kernel.reduce.is_none()
            && let ExprKind::Param(p) = k.kernel.exprs[k.kernel.outputs[0]].kind
        {
            constants.insert(out, (i, k.param_nodes[p]));
        }
    }
    constants
}
