//! The errors that shape and dtype inference and graph construction report.

use thiserror::Error;

/// A mistake found while building a graph: the op's inputs do not fit together.
///
/// Every variant names the op; the message says what was wrong and, where there is one, the fix.
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum IrError {
    /// Shapes that do not fit the op.
    #[error("{op}: {detail}")]
    Shape {
        /// The op that was recorded.
        op: &'static str,
        /// What did not fit, with the shapes.
        detail: String,
    },
    /// Dtypes that the op does not accept.
    #[error("{op}: {detail}")]
    DType {
        /// The op that was recorded.
        op: &'static str,
        /// What did not fit, with the dtypes.
        detail: String,
    },
    /// A dimension or index outside its range.
    #[error("{op}: {detail}")]
    Index {
        /// The op that was recorded.
        op: &'static str,
        /// The index and its valid range.
        detail: String,
    },
    /// A graph that breaks an invariant: always a bug in kiln, never in user code.
    #[error("invalid graph: {0}")]
    InvalidGraph(String),
}

impl IrError {
    /// A shape error for `op`.
    pub fn shape(op: &'static str, detail: impl Into<String>) -> IrError {
        IrError::Shape { op, detail: detail.into() }
    }

    /// A dtype error for `op`.
    pub fn dtype(op: &'static str, detail: impl Into<String>) -> IrError {
        IrError::DType { op, detail: detail.into() }
    }

    /// An index error for `op`.
    pub fn index(op: &'static str, detail: impl Into<String>) -> IrError {
        IrError::Index { op, detail: detail.into() }
    }
}
