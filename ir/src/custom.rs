//! User-defined opaque ops ([`crate::Op::Custom`]): what the IR knows of one. Its
//! implementations (a CPU function, CUDA C source) and its gradient are the user's, held
//! above this crate under the op's `id`; a graph only needs its identity and result type.

use crate::{DType, IrError, Shape};

/// A user-defined opaque op applied to inputs of known shapes: its identity, its name, and
/// its result's shape and dtype (the user's shape rule, evaluated when the op was recorded).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Custom {
    /// The definition's identity (unique per definition in a process): the key its
    /// implementations are registered under.
    pub id: u64,
    /// The op's name, as profiles, kernel listings and errors show it.
    pub name: &'static str,
    /// How many inputs it takes.
    pub inputs: usize,
    /// Its result's shape.
    pub shape: Shape,
    /// Its result's dtype.
    pub dtype: DType,
    /// Whether the definition has a gradient.
    pub differentiable: bool,
}

impl Custom {
    /// The result's shape and dtype (the input count is the op's arity, checked before).
    pub(crate) fn infer(&self) -> Result<(Shape, DType), IrError> {
        Ok((self.shape.clone(), self.dtype))
    }
}

impl Custom {
    /// The error of asking the IR for this op's gradient rule: the user's backward, held
    /// above this crate, is its rule.
    pub(crate) fn no_ir_rule(&self) -> IrError {
        IrError::InvalidGraph(format!(
            "the user-defined op `{}` is differentiated by its own backward, not by an IR rule",
            self.name
        ))
    }
}

impl std::fmt::Display for Custom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "custom({}#{})", self.name, self.id)
    }
}
