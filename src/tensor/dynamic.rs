//! Dimensions a user marks dynamic for `compile()` (PyTorch's `torch._dynamo.mark_dynamic`).

use std::sync::atomic::Ordering;

use super::Tensor;
use crate::{Error, Result};

impl Tensor {
    /// Marks dimension `dim` of this tensor as one whose size changes between calls of a
    /// compiled function (PyTorch's `torch._dynamo.mark_dynamic(t, dim)`): a
    /// [`compile()`](crate::compile()) call that takes this tensor as an argument compiles
    /// the kernels that run over that dimension size-generic from its first call, so that
    /// later sizes compile nothing for them. Without a mark, a compiled function does the
    /// same from the second size it sees ([`Dynamic::Auto`](crate::compile::Dynamic::Auto)).
    ///
    /// The mark belongs to this handle (and its clones), not to tensors computed from it;
    /// sizes 0 and 1 stay specialised (broadcasting depends on them). Marking changes which
    /// code runs, never the values computed.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let w = Tensor::randn([16]);
    /// let mut f = kiln::compile(|x: &Tensor| (x * &w).tanh().sum_dim(1, false));
    /// for batch in [64, 48, 17] {
    ///     let x = Tensor::randn([batch, 16]);
    ///     x.mark_dynamic(0);
    ///     assert_eq!(f.call(&x).dims(), &[batch]);
    /// }
    /// assert_eq!(kiln::Tensor::randn([3, 4]).dynamic_dims(), Vec::<usize>::new());
    /// ```
    ///
    /// # Panics
    /// If `dim` is not a dimension of the tensor (see [`Tensor::try_mark_dynamic`]).
    #[track_caller]
    pub fn mark_dynamic(&self, dim: usize) {
        crate::error::ok(self.try_mark_dynamic(dim));
    }

    /// [`Tensor::mark_dynamic`], returning an error for a dimension the tensor does not have.
    pub fn try_mark_dynamic(&self, dim: usize) -> Result<()> {
        if dim >= self.ndim() {
            return Err(Error::Index {
                op: "mark_dynamic",
                detail: format!(
                    "dimension {dim} is out of range for a tensor of shape {} ({} dimensions); \
                     mark one of 0..{}",
                    self.shape(),
                    self.ndim(),
                    self.ndim()
                ),
            });
        }
        self.0.dynamic.fetch_or(1 << dim, Ordering::Relaxed);
        Ok(())
    }

    /// The dimensions marked dynamic ([`Tensor::mark_dynamic`]), in order.
    pub fn dynamic_dims(&self) -> Vec<usize> {
        let bits = self.0.dynamic.load(Ordering::Relaxed);
        (0..self.ndim()).filter(|d| bits & (1 << d) != 0).collect()
    }
}
