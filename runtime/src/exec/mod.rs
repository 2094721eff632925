//! The executor: plans a graph (through [`kiln_ir::pipeline`]), compiles its kernels through
//! the kernel cache, and runs the plan.
//!
//! - `prepare`: [`Prepared::new`], a plan made ready to run: planned, compiled, scheduled
//!   (row groups).
//! - `execute`: [`Prepared::run`], the step loop: buffers, frees after the last reader,
//!   traces.
//! - `graph`: [`Prepared::run_graphed`], a GPU plan captured once as a CUDA graph and
//!   replayed with one launch.
//! - `cpu`: CPU kernels, compiled through the kernel cache and launched on the thread pool.
//! - `check`: the correctness oracle (`KILN_CHECK`), each kernel against the reference
//!   executor.
//! - `dispatch`: the steps that are not generated kernels, on the plan's device (library
//!   kernels, native loops, host copies, matrix products).

mod check;
pub(crate) mod cpu;
mod dispatch;
mod execute;
mod graph;
mod prepare;

use std::borrow::Cow;

use kiln_ir::Graph;
use kiln_ir::pipeline::{Constants, Fusion, PlanOptions};

pub use crate::sizes::{Marked, SizePolicy, Sizes, set_size_policy, size_policy};
pub(crate) use check::tolerance as check_tolerance;
pub use check::unchecked_runs;
pub use cpu::{cache_stats, clif, compile_failures, compiles_fail, fail_compiles, generic_clif};
pub use dispatch::host_products;
pub(crate) use execute::Bufs;
pub use graph::GraphRun;
pub use prepare::Prepared;
pub(crate) use prepare::PreparedStep;

use crate::{Buffer, Device, RunError, reference};

/// How a graph is executed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Execution {
    /// Elementwise chains fused into generated kernels (the default).
    #[default]
    Fused,
    /// One generated kernel per op: the unfused baseline.
    Unfused,
    /// The reference executor: one plain loop per op, in f64. The correctness oracle.
    Reference,
}

impl Execution {
    /// The options of a plan in this mode for `device`, or `None` for the reference executor
    /// (which runs the graph as it is, unplanned). The one place that reads the fusion
    /// setting: everything after it reads [`PlanOptions::fusion`].
    pub fn plan_options(self, constants: Constants, device: Device) -> Option<PlanOptions> {
        let fusion = match self {
            Execution::Fused => Fusion::Fused,
            Execution::Unfused => Fusion::Unfused,
            Execution::Reference => return None,
        };
        Some(PlanOptions { fusion, constants, target: device.target() })
    }
}

/// Runs `graph` on `device` with `inputs` bound to its `Input` nodes and returns its outputs'
/// buffers (on `device`; inputs elsewhere are copied there first).
///
/// With `check` (a tolerance scale, 1.0 for the default tolerances), every fused kernel's
/// result is compared with the reference executor's value of the same node; the first
/// kernel that differs is reported as [`crate::RuntimeError::CheckFailed`].
///
/// # Errors
/// A [`RunError`] naming the op that failed: out of memory, an index out of range, or a
/// failed check.
pub fn run(
    graph: &Graph,
    inputs: &[Buffer],
    mode: Execution,
    check: Option<f64>,
    device: Device,
) -> Result<Vec<Buffer>, RunError> {
    match mode.plan_options(Constants::Fold, device) {
        Some(options) => Prepared::new(graph, options, device).run(inputs, check),
        None => {
            let host = on_device(inputs, Device::Cpu)?;
            on_device(&reference::run(graph, &host)?, device)
        }
    }
}

/// `buffers` on `device` (copies of those elsewhere).
fn on_device(buffers: &[Buffer], device: Device) -> Result<Vec<Buffer>, RunError> {
    buffers.iter().map(|b| b.to_device(device).map_err(RunError::from)).collect()
}

/// `buffers` themselves when they are all on `device`, else [`on_device`]'s copies.
fn all_on_device(buffers: &[Buffer], device: Device) -> Result<Cow<'_, [Buffer]>, RunError> {
    if buffers.iter().all(|b| b.device() == device) {
        Ok(Cow::Borrowed(buffers))
    } else {
        on_device(buffers, device).map(Cow::Owned)
    }
}
