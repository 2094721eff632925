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

/// How [`embedding_bag`] reduces each bag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BagMode {
    /// The sum of the bag's rows (times their weights, if given).
    Sum,
    /// Their mean (PyTorch's default).
    #[default]
    Mean,
    /// Their elementwise maximum.
    Max,
}

/// Sums, means or maxima of bags of rows of `weight` (PyTorch's `embedding_bag`): `input`
/// `[bags, len]` holds one bag per row, or a 1-D `input` is cut into bags at `offsets`
/// (each bag's first position). `per_sample_weights` (`input`'s shape) weigh the rows of a
/// `Sum`. An empty bag gives zeros. `[bags, dim]`.
///
/// ```
/// use kiln::nn::BagMode;
/// use kiln::nn::functional::embedding_bag;
/// use kiln::prelude::*;
/// let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [3, 2]);
/// let ids = Tensor::from_vec(vec![0i64, 2, 1], [3]);
/// let offsets = Tensor::from_vec(vec![0i64, 2], [2]);
/// let y = embedding_bag(&ids, &w, Some(&offsets), BagMode::Sum, None);
/// assert_eq!(y.to_vec::<f32>(), [6.0, 8.0, 3.0, 4.0]);
/// ```
#[track_caller]
pub fn embedding_bag(
    input: &Tensor,
    weight: &Tensor,
    offsets: Option<&Tensor>,
    mode: BagMode,
    per_sample_weights: Option<&Tensor>,
) -> Tensor {
    ok(try_embedding_bag(input, weight, offsets, mode, per_sample_weights))
}

/// [`embedding_bag`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] for a 2-D input with offsets, a 1-D input without them, offsets that are
/// not ascending from 0, or weights of another shape; [`Error::Value`] for weights with a
/// mode other than `Sum`.
#[track_caller]
pub fn try_embedding_bag(
    input: &Tensor,
    weight: &Tensor,
    offsets: Option<&Tensor>,
    mode: BagMode,
    per_sample_weights: Option<&Tensor>,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    const OP: &str = "embedding_bag";
    if per_sample_weights.is_some() && mode != BagMode::Sum {
        return Err(Error::value(OP, "per_sample_weights go with BagMode::Sum only"));
    }
    if let Some(w) = per_sample_weights
        && w.shape() != input.shape()
    {
        return Err(Error::shape(
            OP,
            format!(
                "per_sample_weights {} should have the input's shape {}",
                w.shape(),
                input.shape()
            ),
        ));
    }
    let rows = lookup(OP, &input.try_reshape(&[-1])?, weight)?;
    let rows = match per_sample_weights {
        Some(w) => rows * w.try_reshape(&[-1, 1])?,
        None => rows,
    };
    let dim = weight.dims()[1];
    match (input.ndim(), offsets) {
        (2, None) => {
            let (bags, len) = (input.dims()[0], input.dims()[1]);
            let rows = rows.try_reshape(&[bags as i64, len as i64, dim as i64])?;
            match mode {
                BagMode::Sum => rows.try_sum_dim(1, false),
                BagMode::Mean => rows.try_mean_dim(1, false),
                BagMode::Max => rows.try_amax(1, false),
            }
        }
        (1, Some(offsets)) => {
            let starts: Vec<i64> = offsets.try_to_vec()?;
            let n = input.numel() as i64;
            if starts.first().is_some_and(|&s| s != 0)
                || starts.windows(2).any(|w| w[0] > w[1])
                || starts.iter().any(|&s| s > n)
            {
                return Err(Error::shape(
                    OP,
                    format!("offsets {starts:?} should ascend from 0 within the input's {n} ids"),
                ));
            }
            let bags = starts.len();
            // Each position's bag, as an index for index_add.
            let mut bag_of = vec![0i64; n as usize];
            for (b, w) in starts.iter().enumerate() {
                let end = starts.get(b + 1).copied().unwrap_or(n);
                bag_of[*w as usize..end as usize].fill(b as i64);
            }
            let counts: Vec<f64> = (0..bags)
                .map(|b| (starts.get(b + 1).copied().unwrap_or(n) - starts[b]) as f64)
                .collect();
            let bag_of = Tensor::try_from_vec(bag_of, [n as usize])?.try_to(input.device())?;
            let zeros =
                Tensor::zeros([bags, dim]).to_dtype(weight.dtype()).try_to(weight.device())?;
            match mode {
                BagMode::Sum => zeros.try_index_add(0, &bag_of, &rows, 1.0),
                BagMode::Mean => {
                    let sums = zeros.try_index_add(0, &bag_of, &rows, 1.0)?;
                    let counts = Tensor::try_from_vec(
                        counts.iter().map(|c| c.max(1.0)).collect(),
                        [bags, 1],
                    )?;
                    sums.try_div(&counts.to_dtype(weight.dtype()).try_to(weight.device())?)
                }
                BagMode::Max => {
                    // Each bag's maximum through a mask over every position, padding -inf.
                    let member = Tensor::try_from_vec(
                        (0..bags)
                            .flat_map(|b| {
                                let (start, end) =
                                    (starts[b], starts.get(b + 1).copied().unwrap_or(n));
                                (0..n).map(move |i| i >= start && i < end)
                            })
                            .collect::<Vec<bool>>(),
                        [bags, n as usize, 1],
                    )?
                    .try_to(input.device())?;
                    let spread =
                        Tensor::try_where_(&member, &rows.try_unsqueeze(0)?, f64::NEG_INFINITY)?;
                    let max = spread.try_amax(1, false)?;
                    let empty = Tensor::try_from_vec(
                        counts.iter().map(|&c| c == 0.0).collect::<Vec<bool>>(),
                        [bags, 1],
                    )?
                    .try_to(input.device())?;
                    Tensor::try_where_(&empty, 0.0, &max)
                }
            }
        }
        _ => Err(Error::shape(
            OP,
            format!(
                "takes input [bags, len] without offsets, or 1-D input with offsets; got {}{}",
                input.shape(),
                if offsets.is_some() { " with offsets" } else { " without offsets" }
            ),
        )),
    }
}

/// Bags of embeddings (PyTorch's `nn.EmbeddingBag`): a table drawn from `N(0, 1)` and a
/// reduction mode.
#[derive(Clone, Debug)]
pub struct EmbeddingBag {
    /// `[num_embeddings, embedding_dim]`.
    pub weight: Tensor,
    /// How each bag is reduced.
    pub mode: BagMode,
}

crate::parameters!(EmbeddingBag { weight });

impl EmbeddingBag {
    /// A table of `f32` vectors drawn from the standard normal distribution.
    #[must_use]
    #[track_caller]
    pub fn new(num_embeddings: usize, embedding_dim: usize, mode: BagMode) -> EmbeddingBag {
        let weight = ok(Tensor::try_randn([num_embeddings, embedding_dim]));
        weight.realize();
        EmbeddingBag { weight: weight.requires_grad_(true), mode }
    }

    /// The bags of `input` cut at `offsets` (see [`embedding_bag`]).
    ///
    /// # Errors
    /// As [`try_embedding_bag`].
    #[track_caller]
    pub fn try_forward_bags(&self, input: &Tensor, offsets: Option<&Tensor>) -> Result<Tensor> {
        try_embedding_bag(input, &self.weight, offsets, self.mode, None)
    }
}

impl Module for EmbeddingBag {
    /// One bag per row of a 2-D input.
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        try_embedding_bag(input, &self.weight, None, self.mode, None)
    }
}
