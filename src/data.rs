//! Datasets and batching.
//!
//! A [`Dataset`] is anything with a length and an item per index; a [`DataLoader`] walks it
//! in batches, shuffled under a seed, collating items into batched tensors.
//!
//! ```
//! use kiln::data::{DataLoader, TensorDataset};
//! use kiln::prelude::*;
//!
//! let x = Tensor::arange(0.0f32, 10.0, 1.0).reshape(&[5, 2]);
//! let y = Tensor::from_vec(vec![0i64, 1, 0, 1, 1], [5]);
//! let data = TensorDataset::new(vec![x, y]).unwrap();
//! let loader = DataLoader::new(&data, 2).shuffle(7).drop_last(true);
//! assert_eq!(loader.len(), 2);
//! for batch in loader.iter() {
//!     let batch = batch.unwrap();
//!     assert_eq!(batch[0].dims(), &[2, 2]);
//!     assert_eq!(batch[1].dims(), &[2]);
//! }
//! ```

use std::cell::Cell;

use crate::distributed::DistributedSampler;
use crate::{Error, Result, Tensor};

/// Something indexable that yields training examples.
pub trait Dataset {
    /// What one example (and, after [`Collate`], one batch) is.
    type Item: Collate;

    /// The number of examples.
    fn len(&self) -> usize;

    /// Whether there are no examples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The example at `index` (`< len()`).
    ///
    /// # Errors
    /// [`Error::Index`] for an index out of range; whatever loading the example reports.
    fn get(&self, index: usize) -> Result<Self::Item>;

    /// The examples at `indices`, collated into one batch. The default gets each example and
    /// collates them; datasets held in tensors override it with one gather per tensor.
    ///
    /// # Errors
    /// As [`Dataset::get`], and [`Collate::collate`].
    fn get_batch(&self, indices: &[usize]) -> Result<Self::Item> {
        let items = indices.iter().map(|&i| self.get(i)).collect::<Result<Vec<_>>>()?;
        Self::Item::collate(items)
    }
}

/// Turns a list of examples into one batch.
pub trait Collate: Sized {
    /// Stacks `items` along a new leading dimension.
    ///
    /// # Errors
    /// [`Error::Shape`] when the examples' shapes differ; [`Error::Value`] for no items.
    fn collate(items: Vec<Self>) -> Result<Self>;
}

impl Collate for Tensor {
    fn collate(items: Vec<Tensor>) -> Result<Tensor> {
        if items.is_empty() {
            return Err(Error::value("collate", "cannot make a batch of no examples"));
        }
        Tensor::try_stack(&items.iter().collect::<Vec<_>>(), 0)
    }
}

/// Field by field: a `Vec` of tensors collates position by position.
impl Collate for Vec<Tensor> {
    fn collate(items: Vec<Vec<Tensor>>) -> Result<Vec<Tensor>> {
        let Some(fields) = items.first().map(Vec::len) else {
            return Err(Error::value("collate", "cannot make a batch of no examples"));
        };
        if let Some(bad) = items.iter().find(|it| it.len() != fields) {
            return Err(Error::shape(
                "collate",
                format!(
                    "examples have {fields} and {} fields; every example needs the same fields",
                    bad.len()
                ),
            ));
        }
        (0..fields)
            .map(|f| Tensor::try_stack(&items.iter().map(|it| &it[f]).collect::<Vec<_>>(), 0))
            .collect()
    }
}

impl<A: Collate, B: Collate> Collate for (A, B) {
    fn collate(items: Vec<(A, B)>) -> Result<(A, B)> {
        let (a, b): (Vec<A>, Vec<B>) = items.into_iter().unzip();
        Ok((A::collate(a)?, B::collate(b)?))
    }
}

/// Examples held in tensors that share their first dimension: example `i` is row `i` of
/// each tensor. Batches are gathered with one `index_select` per tensor.
#[derive(Clone, Debug)]
pub struct TensorDataset {
    tensors: Vec<Tensor>,
}

impl TensorDataset {
    /// A dataset over `tensors` (features, labels, ...).
    ///
    /// # Errors
    /// [`Error::Shape`] when there are no tensors, one is 0-d, or their first dimensions
    /// differ.
    pub fn new(tensors: Vec<Tensor>) -> Result<TensorDataset> {
        let Some(first) = tensors.first() else {
            return Err(Error::shape("TensorDataset::new", "needs at least one tensor"));
        };
        let n = first.dims().first().copied();
        for t in &tensors {
            if t.ndim() == 0 || t.dims().first().copied() != n {
                return Err(Error::shape(
                    "TensorDataset::new",
                    format!(
                        "every tensor needs the same first dimension (the example index); got shapes {}",
                        tensors
                            .iter()
                            .map(|t| t.shape().to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
        Ok(TensorDataset { tensors })
    }

    /// The tensors.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }
}

impl Dataset for TensorDataset {
    type Item = Vec<Tensor>;

    fn len(&self) -> usize {
        self.tensors[0].dims()[0]
    }

    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        if index >= self.len() {
            return Err(Error::index(
                "TensorDataset::get",
                format!("index {index} is out of range for a dataset of {} examples", self.len()),
            ));
        }
        self.tensors.iter().map(|t| t.try_select(0, index as i64)).collect()
    }

    fn get_batch(&self, indices: &[usize]) -> Result<Vec<Tensor>> {
        if let Some(&bad) = indices.iter().find(|&&i| i >= self.len()) {
            return Err(Error::index(
                "TensorDataset::get_batch",
                format!("index {bad} is out of range for a dataset of {} examples", self.len()),
            ));
        }
        if indices.is_empty() {
            return Err(Error::value(
                "TensorDataset::get_batch",
                "cannot make a batch of no examples",
            ));
        }
        let index = Tensor::from_vec(
            indices.iter().map(|&i| i as i64).collect::<Vec<_>>(),
            [indices.len()],
        );
        self.tensors.iter().map(|t| t.try_index_select(0, &index)).collect()
    }
}

/// Walks a dataset in batches. With [`DataLoader::shuffle`], every epoch (every call of
/// [`DataLoader::iter`]) visits the examples in a new order drawn from the seed and the
/// epoch number, so runs repeat exactly.
#[derive(Debug)]
pub struct DataLoader<'a, D: Dataset> {
    dataset: &'a D,
    batch_size: usize,
    seed: Option<u64>,
    drop_last: bool,
    epoch: Cell<u64>,
    sampler: Option<DistributedSampler>,
}

impl<'a, D: Dataset> DataLoader<'a, D> {
    /// Batches of `batch_size` examples in order, the last one possibly smaller.
    ///
    /// # Panics
    /// For a batch size of 0; [`DataLoader::try_new`] returns the error.
    #[must_use]
    #[track_caller]
    pub fn new(dataset: &'a D, batch_size: usize) -> DataLoader<'a, D> {
        crate::error::ok(DataLoader::try_new(dataset, batch_size))
    }

    /// [`DataLoader::new`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Value`] for a batch size of 0 (as PyTorch's `DataLoader` raises; a batch size
    /// computed as `64 / world_size` is 0 past 64 ranks).
    pub fn try_new(dataset: &'a D, batch_size: usize) -> Result<DataLoader<'a, D>> {
        if batch_size == 0 {
            return Err(Error::value("DataLoader", "batch_size must be at least 1, got 0"));
        }
        Ok(DataLoader {
            dataset,
            batch_size,
            seed: None,
            drop_last: false,
            epoch: Cell::new(0),
            sampler: None,
        })
    }

    /// Shuffles the examples every epoch, deterministically from `seed`.
    #[must_use]
    pub fn shuffle(mut self, seed: u64) -> DataLoader<'a, D> {
        self.seed = Some(seed);
        self
    }

    /// Whether to skip the last batch when it is smaller than the batch size.
    #[must_use]
    pub fn drop_last(mut self, drop_last: bool) -> DataLoader<'a, D> {
        self.drop_last = drop_last;
        self
    }

    /// Visits only this rank's share of the dataset ([`DistributedSampler`]): the sampler
    /// decides the order and the shuffling (the loader's own [`DataLoader::shuffle`] is then
    /// unused), and the loader's epoch counter reshuffles it every epoch.
    #[must_use]
    pub fn sampler(mut self, sampler: DistributedSampler) -> DataLoader<'a, D> {
        self.sampler = Some(sampler);
        self
    }

    /// Sets the epoch number the next [`DataLoader::iter`] uses (it counts up by itself):
    /// for resuming a run, as PyTorch's `sampler.set_epoch`.
    pub fn set_epoch(&self, epoch: u64) {
        self.epoch.set(epoch);
    }

    /// The number of batches per epoch.
    pub fn len(&self) -> usize {
        let n = self.sampler.map_or(self.dataset.len(), |s| s.len(self.dataset.len()));
        if self.drop_last { n / self.batch_size } else { n.div_ceil(self.batch_size) }
    }

    /// Whether an epoch has no batches.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The example order of the next epoch, without starting it.
    pub fn next_order(&self) -> Vec<usize> {
        if let Some(sampler) = self.sampler {
            return sampler.indices(self.dataset.len(), self.epoch.get());
        }
        let mut order: Vec<usize> = (0..self.dataset.len()).collect();
        if let Some(seed) = self.seed {
            crate::random::shuffle(&mut order, seed, self.epoch.get());
        }
        order
    }

    /// One epoch: the batches, each collated by the dataset.
    pub fn iter(&self) -> Batches<'a, D> {
        let order = self.next_order();
        self.epoch.set(self.epoch.get() + 1);
        Batches {
            dataset: self.dataset,
            order,
            batch_size: self.batch_size,
            next: 0,
            batches: self.len(),
        }
    }
}

impl<'a, D: Dataset> IntoIterator for &DataLoader<'a, D> {
    type Item = Result<D::Item>;
    type IntoIter = Batches<'a, D>;

    fn into_iter(self) -> Batches<'a, D> {
        self.iter()
    }
}

/// The batches of one epoch of a [`DataLoader`].
#[derive(Debug)]
pub struct Batches<'a, D: Dataset> {
    dataset: &'a D,
    order: Vec<usize>,
    batch_size: usize,
    next: usize,
    batches: usize,
}

impl<D: Dataset> Iterator for Batches<'_, D> {
    type Item = Result<D::Item>;

    fn next(&mut self) -> Option<Result<D::Item>> {
        if self.next >= self.batches {
            return None;
        }
        let start = self.next * self.batch_size;
        let end = (start + self.batch_size).min(self.order.len());
        self.next += 1;
        Some(self.dataset.get_batch(&self.order[start..end]))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.batches - self.next;
        (left, Some(left))
    }
}

impl<D: Dataset> ExactSizeIterator for Batches<'_, D> {}
