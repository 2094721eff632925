//! Lookup tables.

use super::Module;
use crate::error::ok;
use crate::{Error, Result, Tensor};

/// A table of `num_embeddings` vectors of size `embedding_dim`, indexed by integer tensors of
/// any shape: the output has the index's shape plus `[embedding_dim]`. Initialized from
/// `N(0, 1)`, as PyTorch's `nn.Embedding`.
///
/// ```
/// use kiln::nn::{Embedding, Module};
/// use kiln::prelude::*;
///
/// let emb = Embedding::new(10, 4);
/// let ids = Tensor::from_vec(vec![1i64, 7, 7, 0, 3, 9], [2, 3]);
/// assert_eq!(emb.forward(&ids).dims(), &[2, 3, 4]);
/// ```
#[derive(Clone, Debug)]
pub struct Embedding {
    /// `[num_embeddings, embedding_dim]`.
    pub weight: Tensor,
}

impl Embedding {
    /// A table of `f32` vectors drawn from the standard normal distribution.
    ///
    /// # Panics
    /// As [`Embedding::try_new`] fails.
    #[must_use]
    #[track_caller]
    pub fn new(num_embeddings: usize, embedding_dim: usize) -> Embedding {
        ok(Embedding::try_new(num_embeddings, embedding_dim))
    }

    /// [`Embedding::new`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] for a table no memory can hold; [`Error::Runtime`] when it cannot be
    /// allocated.
    #[track_caller]
    pub fn try_new(num_embeddings: usize, embedding_dim: usize) -> Result<Embedding> {
        let weight = Tensor::try_randn([num_embeddings, embedding_dim])?;
        weight.try_realize()?;
        Ok(Embedding { weight: weight.requires_grad_(true) })
    }
}

crate::parameters!(Embedding { weight });

impl Module for Embedding {
    #[track_caller]
    fn try_forward(&self, indices: &Tensor) -> Result<Tensor> {
        let _at = crate::origin::enter();
        if !indices.dtype().is_int() {
            return Err(Error::dtype(
                "Embedding",
                format!(
                    "indices must be integers, got {}; convert them with .long()",
                    indices.dtype()
                ),
            ));
        }
        let mut shape = indices.dims().to_vec();
        shape.push(self.weight.dims()[1]);
        let rows = self.weight.try_index_select(0, &indices.try_reshape(&[-1])?)?;
        rows.try_reshape(&shape.iter().map(|&d| d as i64).collect::<Vec<_>>())
    }
}
