//! kiln's error type.

use kiln_ir::IrError;
use kiln_runtime::RunError;
use thiserror::Error;

/// `Result<T, kiln::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in kiln.
///
/// Mistakes in a program's shapes, dtypes, devices and indices are found when the op is
/// recorded, so the error (or the panic of the non-`try_` form) points at the line that made
/// them. Failures found while running a graph ([`Error::Runtime`]) name the op that was
/// running and the user's line that recorded it.
///
/// Every message starts with the op, names the values involved, and says the fix:
///
/// ```
/// use kiln::prelude::*;
/// let a = Tensor::zeros([2, 3]);
/// let b = Tensor::zeros([4, 5]);
/// let err = a.try_matmul(&b).unwrap_err();
/// assert_eq!(err.to_string(), "matmul: shapes [2, 3] and [4, 5] are not compatible: 3 != 4");
/// assert!(matches!(err, kiln::Error::Shape { op: "matmul", .. }));
/// ```
#[derive(Debug, Clone, PartialEq, Error)]
#[non_exhaustive]
pub enum Error {
    /// Shapes that do not fit the op.
    #[error("{op}: {detail}")]
    Shape {
        /// The op.
        op: &'static str,
        /// What did not fit, with the shapes and the fix.
        detail: String,
    },
    /// A dtype the op does not accept, or dtypes that disagree.
    #[error("{op}: {detail}")]
    DType {
        /// The op.
        op: &'static str,
        /// What did not fit, with the dtypes and the fix.
        detail: String,
    },
    /// A dimension or index out of range.
    #[error("{op}: {detail}")]
    Index {
        /// The op.
        op: &'static str,
        /// The index and its valid range.
        detail: String,
    },
    /// Tensors on different devices, or a device that cannot be used.
    #[error("{op}: {detail}")]
    Device {
        /// The op.
        op: &'static str,
        /// The devices involved and the fix.
        detail: String,
    },
    /// Misuse of autograd: backward through a freed graph, gradients of a tensor that does
    /// not require them, changing the flag of a non-leaf.
    #[error("{op}: {detail}")]
    Autograd {
        /// The call.
        op: &'static str,
        /// What went wrong and the fix.
        detail: String,
    },
    /// A gradient that does not exist: an input the outputs were not computed from, or an
    /// output computed from nothing that requires grad (PyTorch raises for both). Its own
    /// kind, so that code asking whether a program has a gradient can tell this answer from
    /// every real error.
    #[error("{op}: {detail}")]
    NoGradient {
        /// The call.
        op: &'static str,
        /// Which input or output, its shape, and the fix.
        detail: String,
    },
    /// An argument value outside its valid range: a probability above one, a negative
    /// learning rate, a batch size of zero.
    #[error("{op}: {detail}")]
    Value {
        /// The call.
        op: &'static str,
        /// The value, its valid range and the fix.
        detail: String,
    },
    /// Misuse of [`crate::compile()`]: reading a value inside a compiled function (a graph
    /// break), calling one compiled function from another.
    #[error("{op}: {detail}")]
    Compile {
        /// The call.
        op: &'static str,
        /// What happened, where, and the fix.
        detail: String,
    },
    /// Reading or writing a file failed, or the file is not in the expected format.
    #[error("{op}: {detail}")]
    Io {
        /// The call.
        op: &'static str,
        /// The path and the operating system's or the parser's reason.
        detail: String,
    },
    /// Saved tensors that do not fit the model they are loaded into: every missing,
    /// unexpected and mismatched name is listed.
    #[error("load: the file does not match the model:\n{detail}")]
    Load {
        /// One line per difference.
        detail: String,
    },
    /// A failure while running a graph: out of memory, an unavailable backend.
    #[error(transparent)]
    Runtime(#[from] RunError),
    /// A broken internal invariant: a bug in kiln, which a report should include.
    #[error("internal error (a bug in kiln, please report it): {0}")]
    Internal(String),
}

impl From<IrError> for Error {
    fn from(e: IrError) -> Error {
        match e {
            IrError::Shape { op, detail } => Error::Shape { op, detail },
            IrError::DType { op, detail } => Error::DType { op, detail },
            IrError::Index { op, detail } => Error::Index { op, detail },
            other => Error::Internal(other.to_string()),
        }
    }
}

impl Error {
    /// The same error reported as `op`'s: for a call implemented by another op (`mm` by
    /// `matmul`), so that the message names what the user called.
    pub(crate) fn reported_as(self, op: &'static str) -> Error {
        match self {
            Error::Shape { detail, .. } => Error::Shape { op, detail },
            Error::DType { detail, .. } => Error::DType { op, detail },
            other => other,
        }
    }

    pub(crate) fn shape(op: &'static str, detail: impl Into<String>) -> Error {
        Error::Shape { op, detail: detail.into() }
    }

    pub(crate) fn dtype(op: &'static str, detail: impl Into<String>) -> Error {
        Error::DType { op, detail: detail.into() }
    }

    pub(crate) fn value(op: &'static str, detail: impl Into<String>) -> Error {
        Error::Value { op, detail: detail.into() }
    }

    pub(crate) fn index(op: &'static str, detail: impl Into<String>) -> Error {
        Error::Index { op, detail: detail.into() }
    }
}

/// Unwraps the result of a `try_` form for its panicking twin, so that the panic names the
/// user's line (every caller is `#[track_caller]`).
#[track_caller]
pub(crate) fn ok<T>(r: Result<T>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}
