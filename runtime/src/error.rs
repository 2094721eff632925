//! Run-time failures: memory, missing backends, and where in the user's program they struck.

use std::fmt;
use std::panic::Location;

use kiln_ir::IrError;
use thiserror::Error;

use crate::Device;

/// Something that went wrong while running a graph, for reasons outside the program's
/// shapes and dtypes (those are caught when ops are recorded).
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// An allocation failed even after the allocator released its cached buffers.
    #[error(
        "out of memory on {device}: could not allocate {bytes} bytes; free tensors you no longer need, or work on smaller pieces"
    )]
    OutOfMemory {
        /// The device.
        device: Device,
        /// The size asked for.
        bytes: usize,
    },
    /// The device's backend is not available on this machine.
    #[error("{device} is not available: {reason}")]
    BackendUnavailable {
        /// The device.
        device: Device,
        /// What was looked for and not found.
        reason: String,
    },
    /// A CUDA call failed: the driver, NVRTC or cuBLAS reported an error.
    #[error("CUDA failed on {device} while {detail}")]
    Cuda {
        /// The device.
        device: Device,
        /// What kiln was doing and the library's message.
        detail: String,
    },
    /// An index tensor holds a value outside the dimension it indexes (found when computing,
    /// since indices are data).
    #[error("{op}: index {index} is out of bounds for dimension {axis} with size {size}")]
    IndexOutOfRange {
        /// The op that read the index.
        op: &'static str,
        /// The offending index.
        index: i64,
        /// The dimension it indexes.
        axis: usize,
        /// The dimension's size.
        size: usize,
    },
    /// Data that fails a check only running the graph can make (`multinomial`'s weights that
    /// are not a distribution): the op, the row and the fix.
    #[error("{op}: {detail}")]
    Check {
        /// The user's call the check belongs to.
        op: &'static str,
        /// What is wrong, where, and the fix.
        detail: String,
    },
    /// A collective failed: the group is unknown, its engine reported an error, or the
    /// tensor is not where the engine works.
    #[error("{op}: {detail}")]
    Collective {
        /// The collective.
        op: &'static str,
        /// What went wrong, with the engine's message.
        detail: String,
    },
    /// A user-defined op's implementation failed, or broke its contract (an element of its
    /// result not written, a GPU result that differs from its CPU implementation's).
    #[error("{op}: {detail}")]
    Custom {
        /// The op's name.
        op: &'static str,
        /// What went wrong, and where.
        detail: String,
    },
    /// The correctness check (`KILN_CHECK=1`) found a fused kernel whose result differs from
    /// the reference executor's. This is a bug in kiln's code generation: the report holds
    /// what is needed to reproduce it.
    #[error("{0}")]
    CheckFailed(Box<CheckReport>),
    /// A buffer bound to a graph input does not match it: a bug in the caller.
    #[error("input {index} of the graph expects {expected}, the buffer bound to it holds {got}")]
    Binding {
        /// The input's position.
        index: usize,
        /// What the graph expects.
        expected: String,
        /// What the buffer holds.
        got: String,
    },
    /// The graph breaks an invariant: a bug in kiln.
    #[error(transparent)]
    Graph(#[from] IrError),
}

/// What the correctness check found wrong with a fused kernel.
#[derive(Debug, Clone, PartialEq, Error)]
#[error(
    "check: fused kernel {kernel} ({ops}) disagrees with the reference executor: {detail}; its ops were recorded at {sources}\n{text}"
)]
pub struct CheckReport {
    /// The kernel's name.
    pub kernel: String,
    /// The ops it fused.
    pub ops: String,
    /// The first differing element, both values and the tolerance.
    pub detail: String,
    /// The user source lines that recorded the fused ops.
    pub sources: String,
    /// The kernel's text.
    pub text: String,
}

/// A [`RuntimeError`] together with the node that was running and the user's source line that
/// recorded it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunError {
    /// What went wrong.
    pub error: RuntimeError,
    /// The op that was running, if the failure belongs to one.
    pub op: Option<&'static str>,
    /// Where that op was recorded.
    pub origin: Option<&'static Location<'static>>,
}

impl From<RuntimeError> for RunError {
    fn from(error: RuntimeError) -> RunError {
        RunError { error, op: None, origin: None }
    }
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.error)?;
        match (self.op, self.origin) {
            (Some(op), Some(at)) => write!(f, " (while computing `{op}`, recorded at {at})"),
            (Some(op), None) => write!(f, " (while computing `{op}`)"),
            _ => Ok(()),
        }
    }
}

impl std::error::Error for RunError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}
