//! What a cached plan was built from, and whether a new capture is the same program: shared
//! by `compile()` and the eager plan cache (`engine::plans`).

use kiln_ir::{DType, NodeId, Op, Shape};
use kiln_runtime::exec::Prepared;

use super::realize::Captured;

/// One captured node as the plan expects it.
#[derive(Clone, Debug)]
struct SlotKey {
    /// `None` for a realized value (an input of the plan).
    op: Option<Op>,
    shape: Shape,
    dtype: DType,
    args: Vec<u32>,
}

/// Whether `recorded` is `planned` up to the values a plan rebinds (constants, random keys).
fn same_op(planned: &Op, recorded: &Op) -> bool {
    match (planned, recorded) {
        (Op::Full(a), Op::Full(b)) => a.category() == b.category(),
        (Op::Random { dist: a, .. }, Op::Random { dist: b, .. }) => a == b,
        (a, b) => a == b,
    }
}

/// The captured program a plan computes: every node's op (up to rebindable values), shape,
/// dtype and inputs, which nodes were realized inputs, and which are kept.
pub(crate) struct Recorded {
    keys: Vec<SlotKey>,
    outputs: Vec<usize>,
    /// Slots of the constants and random leaves, with their node in the plan's graph.
    rebind: Vec<(usize, NodeId)>,
}

impl Recorded {
    /// The program of `captured` with `outputs` kept; `ids` are the graph nodes of its slots.
    pub(crate) fn new(captured: &Captured, outputs: &[usize], ids: &[NodeId]) -> Recorded {
        let mut rebind = Vec::new();
        for (slot, node) in captured.nodes.iter().enumerate() {
            if node.op.is_rebindable() && captured.buffers[slot].is_none() {
                rebind.push((slot, ids[slot]));
            }
        }
        let keys = captured
            .nodes
            .iter()
            .enumerate()
            .map(|(slot, n)| SlotKey {
                op: captured.buffers[slot].is_none().then(|| n.op.clone()),
                shape: n.shape.clone(),
                dtype: n.dtype,
                args: captured.args(slot).to_vec(),
            })
            .collect();
        Recorded { keys, outputs: outputs.to_vec(), rebind }
    }

    /// How many nodes the program has.
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// `None` when `captured` (with `outputs` kept) is this program up to the values of its
    /// constants and random keys; otherwise why not.
    pub(crate) fn mismatch(&self, captured: &Captured, outputs: &[usize]) -> Option<String> {
        if captured.nodes.len() != self.keys.len() {
            return Some(format!(
                "the closure recorded {} ops and values this time, {} when it was planned",
                captured.nodes.len(),
                self.keys.len()
            ));
        }
        for (slot, (node, key)) in captured.nodes.iter().zip(&self.keys).enumerate() {
            let differs = || {
                let planned =
                    key.op.as_ref().map_or("a realized value".to_string(), ToString::to_string);
                let recorded = if captured.buffers[slot].is_some() {
                    "a realized value".to_string()
                } else {
                    node.op.to_string()
                };
                Some(format!(
                    "the {} recorded at {} ({} {}) differs from the plan's {} ({} {}) at position {slot}",
                    recorded, node.origin, node.shape, node.dtype, planned, key.shape, key.dtype
                ))
            };
            // An op's shape and dtype follow from its inputs', checked at earlier positions:
            // only leaves and realized values need theirs compared.
            let derived = key.op.as_ref().is_some_and(|op| !op.is_leaf());
            if !derived && (node.shape != key.shape || node.dtype != key.dtype) {
                return differs();
            }
            let same = match (&captured.buffers[slot], &key.op) {
                (Some(_), None) => true,
                (None, Some(op)) => {
                    same_op(op, &node.op) && captured.args(slot) == key.args.as_slice()
                }
                _ => false,
            };
            if !same {
                return differs();
            }
        }
        (outputs != self.outputs.as_slice()).then(|| {
            "a different set of recorded values is kept after the call (a tensor of the closure is now held elsewhere, or no longer)".to_string()
        })
    }

    /// Whether `captured` (with `outputs` kept) is this program at other sizes: the same
    /// kinds of ops on the same inputs, the same dtypes and ranks, the same kept values, and
    /// some shape that differs. A plan of
    /// such a program compiles its kernels whose sizes changed size-generic
    /// ([`kiln_runtime::exec::Sizes`]).
    pub(crate) fn same_up_to_sizes(&self, captured: &Captured, outputs: &[usize]) -> bool {
        let resized = captured.nodes.iter().zip(&self.keys).any(|(n, k)| n.shape != k.shape);
        resized
            && captured.nodes.len() == self.keys.len()
            && outputs == self.outputs.as_slice()
            && (captured.nodes.iter().zip(&self.keys).enumerate()).all(|(slot, (node, key))| {
                node.dtype == key.dtype
                    && node.shape.rank() == key.shape.rank()
                    && match (&captured.buffers[slot], &key.op) {
                        (Some(_), None) => true,
                        (None, Some(op)) => {
                            op.name() == node.op.name()
                                && captured.args(slot) == key.args.as_slice()
                        }
                        _ => false,
                    }
            })
    }

    /// Whether `captured`'s constants and random keys are the values this program was
    /// recorded with (for a plan that folded them).
    pub(crate) fn same_values(&self, captured: &Captured) -> bool {
        self.rebind
            .iter()
            .all(|&(slot, _)| self.keys[slot].op.as_ref() == Some(&captured.nodes[slot].op))
    }

    /// Binds `captured`'s constants and random keys into `prepared`, a plan of this program
    /// made with rebindable constants.
    pub(crate) fn rebind(&self, prepared: &mut Prepared, captured: &Captured) {
        for &(slot, node) in &self.rebind {
            prepared.rebind(node, &captured.nodes[slot].op);
        }
    }
}
