//! Checks of data that only running a graph can make ([`crate::Op::Check`]).

use crate::op::expect_dtype;
use crate::{DType, IrError, Shape};

/// What an [`crate::Op::Check`] checks, and how its failure reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Check {
    /// Each row of `multinomial`'s weights is a distribution: no weight negative, infinite
    /// or NaN, and a positive total.
    MultinomialWeights,
}

impl Check {
    /// The user's call the check belongs to, as errors name it.
    pub fn op(self) -> &'static str {
        match self {
            Check::MultinomialWeights => "multinomial",
        }
    }

    /// The checked value's shape and dtype: the first input's, with one `Bool` result per
    /// row in the second.
    pub(crate) fn infer(self, inputs: &[(&Shape, DType)]) -> Result<(Shape, DType), IrError> {
        let (ok, ok_dtype) = inputs[1];
        expect_dtype(self.op(), ok_dtype, |d| d == DType::Bool, "a bool check")?;
        let (n, rows) = (inputs[0].0.numel(), ok.numel());
        if rows == 0 || n % rows != 0 {
            let x = inputs[0].0;
            return Err(IrError::InvalidGraph(format!("a check of {x} got {ok} results")));
        }
        Ok((inputs[0].0.clone(), inputs[0].1))
    }

    /// What is wrong when row `row` fails the check, and the fix.
    pub fn failure(self, row: usize) -> String {
        match self {
            Check::MultinomialWeights => format!(
                "row {row} of the weights is not a distribution: a weight is negative, infinite \
                 or NaN, or the weights sum to 0 (clamp them, or add a small positive value)"
            ),
        }
    }
}
