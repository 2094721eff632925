//! The eager plan cache: a realization whose program this thread has planned before runs
//! that plan again.
//!
//! An eager training loop records the same program every step: the same ops on the same
//! shapes, recorded at the same lines, with the same tensors kept. Planning it (graph passes,
//! fusion, scheduling, looking kernels up) took about a third of a small step's time (W4:
//! 150 µs of 730). A realization's captured program is compared, node by node, with the
//! programs planned on this thread (the most recent [`CAPACITY`] of them); on a match the plan
//! runs on the new inputs.
//!
//! Constants are folded into the first plan of a program, which gives the leanest kernels.
//! When the program comes back with other constant values or random keys (a learning-rate
//! schedule, Adam's bias correction, dropout), it is planned once more with them as kernel
//! parameters, as `compile()` plans, and later realizations bind their values into that plan.
//!
//! A plan depends on the thread's planning settings as well as on the program (the execution
//! mode, row group sizes, failing compiles in tests): those are part of the match.

use std::cell::RefCell;
use std::hash::{Hash, Hasher};
use std::panic::Location;
use std::sync::Arc;

use kiln_ir::pipeline::{Constants, PlanOptions};
use kiln_runtime::Device;
use kiln_runtime::exec::{Prepared, Sizes};
use kiln_runtime::rows::RowGroupSizes;

use super::lazy::LazyNode;
use super::realize::{Captured, build_graph, output_slots, run_captured};
use super::replay::Recorded;
use crate::Result;

/// Programs kept per thread, most recently run first to go last.
pub(crate) const CAPACITY: usize = 32;

/// What a plan depends on besides the program.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Settings {
    options: PlanOptions,
    device: Device,
    rows: RowGroupSizes,
}

struct CachedPlan {
    hash: u64,
    /// [`structure_hash`] without sizes: the same program at other sizes has the same.
    sizeless: u64,
    settings: Settings,
    origins: Vec<(&'static Location<'static>, Option<kiln_ir::Label>)>,
    recorded: Recorded,
    /// Whether the plan takes its constants as parameters (else they are folded in).
    rebindable: bool,
    prepared: Prepared,
}

thread_local! {
    static CACHE: RefCell<Vec<CachedPlan>> = const { RefCell::new(Vec::new()) };
}

/// Runs the captured program (planned with `options`, whose constants fold) on `device`,
/// reusing this thread's plan of the same program if there is one.
pub(crate) fn realize(
    captured: &mut Captured,
    targets: &[Arc<LazyNode>],
    options: PlanOptions,
    device: Device,
) -> Result<()> {
    let outputs = output_slots(captured, targets);
    let settings = Settings { options, device, rows: kiln_runtime::rows::row_group_sizes() };
    if kiln_runtime::exec::compiles_fail() {
        // A test of the fallback: its plans must compile (and fail) afresh.
        let built = build_graph(captured, targets)?;
        return run_captured(&mut Prepared::new(&built.graph, options, device), captured, &outputs);
    }
    let hash = structure_hash(captured, &outputs, true);
    let found = CACHE.with(|c| {
        let mut cache = c.borrow_mut();
        let at = cache.iter().rposition(|e| {
            e.hash == hash
                && e.settings == settings
                && e.origins
                    .iter()
                    .zip(&captured.nodes)
                    .all(|(&(a, l), n)| *a == *n.origin && l == n.label)
                && e.recorded.mismatch(captured, &outputs).is_none()
        });
        at.map(|i| cache.remove(i))
    });
    let mut entry = match found {
        Some(mut e) if e.rebindable => {
            e.recorded.rebind(&mut e.prepared, captured);
            e
        }
        Some(e) if e.recorded.same_values(captured) => e,
        // The same program with other constants: plan it once more, constants rebindable.
        Some(e) => plan(captured, targets, &outputs, e.settings, hash, true, Sizes::First)?,
        None => {
            // The same program at other sizes (the next sequence length): its kernels whose
            // sizes changed are compiled size-generic, to serve the lengths still to come.
            let sizeless = structure_hash(captured, &outputs, false);
            let resized = CACHE.with(|c| {
                c.borrow().iter().any(|e| e.sizeless == sizeless && e.settings == settings)
            });
            let sizes = if resized { Sizes::Changed } else { Sizes::First };
            plan(captured, targets, &outputs, settings, hash, false, sizes)?
        }
    };
    let result = run_captured(&mut entry.prepared, captured, &outputs);
    CACHE.with(|c| {
        let mut cache = c.borrow_mut();
        if cache.len() == CAPACITY {
            cache.remove(0);
        }
        cache.push(entry);
    });
    result
}

fn plan(
    captured: &Captured,
    targets: &[Arc<LazyNode>],
    outputs: &[usize],
    settings: Settings,
    hash: u64,
    rebindable: bool,
    sizes: Sizes,
) -> Result<CachedPlan> {
    let built = build_graph(captured, targets)?;
    let constants = if rebindable { Constants::Rebindable } else { Constants::Fold };
    let options = PlanOptions { constants, ..settings.options };
    Ok(CachedPlan {
        hash,
        sizeless: structure_hash(captured, outputs, false),
        settings,
        origins: captured.nodes.iter().map(|n| (n.origin, n.label)).collect(),
        recorded: Recorded::new(captured, outputs, &built.ids),
        rebindable,
        prepared: Prepared::with_sizes(&built.graph, options, settings.device, sizes),
    })
}

/// A hash of the program's structure: what [`Recorded::mismatch`] compares, constants' and
/// random keys' values left out; `sized: false` leaves sizes out as well (ranks and the
/// kinds of ops, with the lines that recorded them, stay in).
fn structure_hash(captured: &Captured, outputs: &[usize], sized: bool) -> u64 {
    let mut h = rustc_hash::FxHasher::default();
    captured.nodes.len().hash(&mut h);
    outputs.hash(&mut h);
    for (slot, node) in captured.nodes.iter().enumerate() {
        node.dtype.hash(&mut h);
        if sized {
            node.shape.hash(&mut h);
        } else {
            node.shape.rank().hash(&mut h);
            node.origin.hash(&mut h);
        }
        if captured.buffers[slot].is_some() {
            0u8.hash(&mut h);
        } else if node.op.is_rebindable() {
            std::mem::discriminant(&node.op).hash(&mut h);
        } else {
            if sized {
                node.op.hash(&mut h);
            } else {
                node.op.name().hash(&mut h);
            }
            captured.args(slot).hash(&mut h);
        }
    }
    h.finish()
}
