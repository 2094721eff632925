//! Realization: capture the pending ancestors of some nodes as a graph, run it, and store the
//! results back into the nodes.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Weak};

use kiln_ir::pipeline::Constants;
use kiln_ir::{Graph, NodeId};
use kiln_runtime::exec::{self, Execution, GraphRun, Prepared};
use kiln_runtime::{Buffer, Device};

use super::lazy::{LazyNode, State};
use super::storage::Storage;
use crate::Result;

/// Computes `targets`, and every captured node that something outside the captured graph
/// still refers to (a user's tensor, a pending consumer), so nothing is computed twice.
/// Everything else computed on the way is freed when this returns.
pub(crate) fn realize(targets: &[Arc<LazyNode>]) -> Result<()> {
    if super::session::defer(targets) {
        return Ok(());
    }
    let riders = take_riders(targets.first().map_or(Device::Cpu, |t| t.device));
    if !riders.is_empty() {
        let mut all = targets.to_vec();
        all.extend(riders);
        return realize_now(&all);
    }
    realize_now(targets)
}

thread_local! {
    /// Storages whose pending writes join this thread's next realization on their device.
    static RIDERS: RefCell<Vec<Weak<Storage>>> = const { RefCell::new(Vec::new()) };
}

/// Makes `storage`'s pending value part of the next realization on its device, as a write in
/// eager PyTorch would have happened by then. Batch norm's running statistics use it: their
/// update reads the batch statistics the forward pass computes anyway, so it rides along
/// with that realization instead of growing a chain of pending updates step after step.
/// Inside a compiled call the write is an output of the call already.
pub(crate) fn ride_along(storage: &Arc<Storage>) {
    RIDERS.with(|r| {
        let mut r = r.borrow_mut();
        if !r.iter().any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(storage))) {
            r.push(Arc::downgrade(storage));
        }
    });
}

/// The pending riders on `device`, removed from the list (with every dead or realized one).
fn take_riders(device: Device) -> Vec<Arc<LazyNode>> {
    RIDERS.with(|r| {
        let mut taken = Vec::new();
        r.borrow_mut().retain(|w| {
            let Some(storage) = w.upgrade() else { return false };
            let node = storage.node();
            if node.buffer().is_some() {
                return false;
            }
            if node.device != device {
                return true;
            }
            taken.push(node);
            false
        });
        taken
    })
}

fn realize_now(targets: &[Arc<LazyNode>]) -> Result<()> {
    let device = targets.first().map_or(Device::Cpu, |t| t.device);
    if targets.iter().any(|t| t.device != device) {
        // One graph per device: ops never mix devices, so the groups share no pending work.
        let mut devices: Vec<Device> = targets.iter().map(|t| t.device).collect();
        devices.dedup();
        devices.sort_by_key(ToString::to_string);
        devices.dedup();
        for d in devices {
            let group: Vec<Arc<LazyNode>> =
                targets.iter().filter(|t| t.device == d).cloned().collect();
            realize_now(&group)?;
        }
        return Ok(());
    }
    let mut captured = capture(targets);
    captured.check_whole()?;
    if captured.pending == 0 {
        return Ok(());
    }
    match super::execution::plan_options(Constants::Fold, device) {
        Some(options) => super::plans::realize(&mut captured, targets, options, device),
        None => {
            let built = build_graph(&captured, targets)?;
            let check = super::execution::check_scale();
            let results =
                exec::run(&built.graph, &built.buffers, Execution::Reference, check, device)?;
            write_back(&captured, &built.outputs, results);
            Ok(())
        }
    }
}

/// Runs `prepared` (a plan of the graph built from `captured`) on the captured input buffers
/// and stores the results into their nodes: how a realization and a compiled call both run.
pub(crate) fn run_captured(
    prepared: &mut Prepared,
    captured: &mut Captured,
    outputs: &[usize],
) -> Result<()> {
    let buffers = handed_over(prepared, captured);
    let results = prepared.run_owned(buffers, super::execution::check_scale())?;
    write_back(captured, outputs, results);
    Ok(())
}

/// The plan's input buffers, in order. An input the plan writes into
/// ([`Prepared::writes_into_inputs`]) whose node nothing outside the capture holds (no
/// tensor, no pending op elsewhere: its value is dead once its readers here have run) is
/// handed over, taken from its node and from the capture, so that the plan writes into its
/// buffer in place: a static key/value cache's step writes its new keys into the buffer that
/// held the old ones.
fn handed_over(prepared: &Prepared, captured: &mut Captured) -> Vec<Buffer> {
    let writes = prepared.writes_into_inputs();
    let mut inputs = Vec::with_capacity(writes.len());
    let Captured { nodes, buffers, uses, .. } = captured;
    for (slot, held) in buffers.iter_mut().enumerate().filter(|(_, b)| b.is_some()) {
        let node = &nodes[slot];
        let dead = Arc::strong_count(node) == 1 + uses[slot] as usize;
        let taken = match writes.get(inputs.len()) {
            Some(true) if dead => node.hand_over().and_then(|_| held.take()),
            _ => None,
        };
        inputs.extend(taken.or_else(|| held.clone()));
    }
    inputs
}

/// [`run_captured`] through a CUDA graph on a GPU ([`Prepared::run_graphed`]); a checked
/// run goes step by step, since the oracle compares every kernel.
pub(crate) fn run_captured_graphed(
    prepared: &mut Prepared,
    captured: &mut Captured,
    outputs: &[usize],
) -> Result<GraphRun> {
    if super::execution::check_scale().is_some() {
        run_captured(prepared, captured, outputs)?;
        return Ok(GraphRun::Stepwise("KILN_CHECK compares every kernel".into()));
    }
    let buffers: Vec<Buffer> = captured.buffers.iter().flatten().cloned().collect();
    let (results, run) = prepared.run_graphed(&buffers)?;
    write_back(captured, outputs, results);
    Ok(run)
}

/// Stores each output's buffer into its captured node.
fn write_back(captured: &Captured, outputs: &[usize], results: Vec<Buffer>) {
    for (&slot, buffer) in outputs.iter().zip(results) {
        captured.nodes[slot].set_realized(buffer);
    }
}

/// The graph that realizing `targets` would run, without running it.
pub(crate) fn pending_graph(targets: &[Arc<LazyNode>]) -> Result<Graph> {
    let captured = capture(targets);
    Ok(build_graph(&captured, targets)?.graph)
}

pub(crate) struct Captured {
    /// The nodes in topological order (inputs first).
    pub(crate) nodes: Vec<Arc<LazyNode>>,
    /// For each node, its buffer if it was realized when captured (an input of the graph).
    pub(crate) buffers: Vec<Option<Buffer>>,
    /// For each pending node, the positions of its inputs in `nodes`
    /// (`args[arg_start[i]..arg_start[i + 1]]`).
    pub(crate) args: Vec<u32>,
    pub(crate) arg_start: Vec<u32>,
    /// How many captured nodes read each node.
    pub(crate) uses: Vec<u32>,
    /// Position of each node in `nodes`, by address.
    pub(crate) index: HashMap<*const LazyNode, usize, PtrHash>,
    /// How many pending nodes there are.
    pub(crate) pending: usize,
    /// How many nodes gave their buffers to a plan that failed (see [`Captured::check_whole`]).
    pub(crate) handed_over: usize,
}

impl Captured {
    /// An error when a value the capture needs was handed to a plan that wrote into it in
    /// place and then failed: it no longer exists.
    pub(crate) fn check_whole(&self) -> Result<()> {
        if self.handed_over == 0 {
            return Ok(());
        }
        Err(crate::Error::Value {
            op: "realize",
            detail: "a value this needs was being overwritten in place by a computation that \
                     failed (its error was returned then); recompute it from its inputs"
                .into(),
        })
    }

    /// The positions of node `slot`'s inputs.
    pub(crate) fn args(&self, slot: usize) -> &[u32] {
        &self.args[self.arg_start[slot] as usize..self.arg_start[slot + 1] as usize]
    }
}

/// Hashes node addresses with one multiplication: they are distinct and well spread, and
/// capture hashes every node of every realization.
#[derive(Clone, Copy, Default)]
pub(crate) struct PtrHash;

impl std::hash::BuildHasher for PtrHash {
    type Hasher = PtrHasher;
    fn build_hasher(&self) -> PtrHasher {
        PtrHasher(0)
    }
}

pub(crate) struct PtrHasher(u64);

impl std::hash::Hasher for PtrHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_usize(&mut self, n: usize) {
        // Addresses are 8-aligned: drop the zero bits, then spread with a Fibonacci multiply.
        self.0 = ((n as u64) >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(26);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Iterative post-order walk from `targets` over pending nodes; realized nodes are leaves.
pub(crate) fn capture(targets: &[Arc<LazyNode>]) -> Captured {
    capture_sized(targets, 64)
}

/// [`capture`], with room for about `hint` nodes (a replayed plan's size).
pub(crate) fn capture_sized(targets: &[Arc<LazyNode>], hint: usize) -> Captured {
    let mut c = Captured {
        nodes: Vec::with_capacity(hint),
        buffers: Vec::with_capacity(hint),
        args: Vec::with_capacity(2 * hint),
        arg_start: Vec::with_capacity(hint + 1),
        uses: Vec::with_capacity(hint),
        index: HashMap::with_capacity_and_hasher(hint, PtrHash),
        pending: 0,
        handed_over: 0,
    };
    c.arg_start.push(0);
    // (node, whether its inputs have been pushed)
    let mut stack: Vec<(Arc<LazyNode>, bool)> =
        targets.iter().rev().map(|t| (t.clone(), false)).collect();
    while let Some((node, expanded)) = stack.pop() {
        let key = Arc::as_ptr(&node);
        if c.index.contains_key(&key) {
            continue;
        }
        // Read under the node's lock each time: a node realized meanwhile (by another
        // thread) is a leaf, whichever visit sees it.
        let state = node.state();
        match &*state {
            State::Realized(b) => {
                let buffer = b.clone();
                drop(state);
                c.push(key, node, Some(buffer));
            }
            State::HandedOver => {
                drop(state);
                c.handed_over += 1;
                c.push(key, node, None);
            }
            State::Pending(inputs) if expanded => {
                for input in inputs {
                    let slot = c.index[&Arc::as_ptr(input)];
                    c.args.push(slot as u32);
                    c.uses[slot] += 1;
                }
                drop(state);
                c.pending += 1;
                c.push(key, node.clone(), None);
            }
            State::Pending(inputs) => {
                // The node goes below its inputs, so that they are all placed before it.
                stack.push((node.clone(), true));
                for input in inputs.iter().rev() {
                    if !c.index.contains_key(&Arc::as_ptr(input)) {
                        stack.push((input.clone(), false));
                    }
                }
            }
        }
    }
    c
}

impl Captured {
    fn push(&mut self, key: *const LazyNode, node: Arc<LazyNode>, buffer: Option<Buffer>) {
        self.index.insert(key, self.nodes.len());
        self.nodes.push(node);
        self.buffers.push(buffer);
        self.uses.push(0);
        self.arg_start.push(self.args.len() as u32);
    }
}

/// The graph of the captured nodes, the buffers bound to its inputs, and for each output the
/// position of its node in `captured.nodes`.
pub(crate) fn build_graph(captured: &Captured, targets: &[Arc<LazyNode>]) -> Result<Built> {
    let mut graph = Graph::new();
    let mut ids: Vec<NodeId> = Vec::with_capacity(captured.nodes.len());
    let mut buffers = Vec::new();
    for (slot, node) in captured.nodes.iter().enumerate() {
        let id = match &captured.buffers[slot] {
            Some(b) => {
                buffers.push(b.clone());
                graph.input(node.shape.clone(), node.dtype)
            }
            None if node.op.is_leaf() => {
                graph.leaf(node.op.clone(), node.shape.clone(), node.dtype)?
            }
            None => {
                let arg_ids: Vec<NodeId> =
                    captured.args(slot).iter().map(|&a| ids[a as usize]).collect();
                graph.push(node.op.clone(), &arg_ids)?
            }
        };
        graph.set_origin(id, node.origin);
        graph.set_label(id, node.label);
        ids.push(id);
    }
    let outputs = output_slots(captured, targets);
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

/// The captured nodes a realization must keep: the targets, then every pending node
/// referenced from outside the graph. A node's handles are `captured.nodes` (one), its
/// consumers' input lists in the graph (`uses`), and anything else: a live tensor, a pending
/// consumer outside this capture.
pub(crate) fn output_slots(captured: &Captured, targets: &[Arc<LazyNode>]) -> Vec<usize> {
    let mut outputs = Vec::new();
    let mut is_output = vec![false; captured.nodes.len()];
    for t in targets {
        let slot = captured.index[&Arc::as_ptr(t)];
        if captured.buffers[slot].is_none() && !is_output[slot] {
            is_output[slot] = true;
            outputs.push(slot);
        }
    }
    for (slot, node) in captured.nodes.iter().enumerate() {
        let pending = captured.buffers[slot].is_none();
        if pending && !is_output[slot] && Arc::strong_count(node) > 1 + captured.uses[slot] as usize
        {
            is_output[slot] = true;
            outputs.push(slot);
        }
    }
    outputs
}
