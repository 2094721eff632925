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
        let _at = crate::engine::origin::enter();
        lookup("Embedding", indices, &self.weight)
    }
}

/// The rows of `weight` (`[num_embeddings, dim]`) picked by integer `indices` of any
/// shape, giving `indices.shape + [dim]` (PyTorch's `functional.embedding`). The gradient
/// adds into the picked rows.
///
/// ```
/// use kiln::nn::functional as F;
/// use kiln::prelude::*;
/// let weight = Tensor::from_vec(vec![0.0f32, 0.5, 1.0, 1.5, 2.0, 2.5], [3, 2]);
/// let ids = Tensor::from_vec(vec![2i64, 0, 2], [1, 3]);
/// let rows = F::embedding(&ids, &weight);
/// assert_eq!(rows.dims(), [1, 3, 2]);
/// assert_eq!(rows.to_vec::<f32>(), [2.0, 2.5, 0.0, 0.5, 2.0, 2.5]);
/// ```
///
/// # Panics
/// As [`try_embedding`] fails.
#[must_use]
#[track_caller]
pub fn embedding(indices: &Tensor, weight: &Tensor) -> Tensor {
    ok(try_embedding(indices, weight))
}

/// [`embedding`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::DType`] for non-integer indices; [`Error::Shape`] for a weight that is not
/// 2-D; an index out of range fails when the rows are computed.
#[track_caller]
pub fn try_embedding(indices: &Tensor, weight: &Tensor) -> Result<Tensor> {
    // An index out of range surfaces when the rows are computed: name the caller's line.
    let _at = crate::engine::origin::enter();
    lookup("embedding", indices, weight)
}

fn lookup(op: &'static str, indices: &Tensor, weight: &Tensor) -> Result<Tensor> {
    if !indices.dtype().is_int() {
        return Err(Error::dtype(
            op,
            format!("indices must be integers, got {}; convert them with .long()", indices.dtype()),
        ));
    }
    if weight.ndim() != 2 {
        return Err(Error::shape(
            op,
            format!("the weight must be [num_embeddings, dim], got {}", weight.shape()),
        ));
    }
    let mut shape: Vec<i64> = indices.dims().iter().map(|&d| d as i64).collect();
    shape.push(weight.dims()[1] as i64);
    let rows = weight.try_index_select(0, &indices.try_reshape(&[-1])?)?;
    rows.try_reshape(&shape)
}
