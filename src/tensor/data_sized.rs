//! Ops whose result's size depends on the values: `nonzero`, `argwhere`, `unique`. They read
//! what they need (a realization, which the profile counts) and build the result from it;
//! `index_put` writes values at index tuples.

use super::Tensor;
use crate::error::ok;
use crate::{Error, Result};

/// What [`Tensor::unique`] returns.
#[derive(Clone, Debug)]
pub struct Unique {
    /// The distinct values, ascending (NaNs last, each one distinct, as PyTorch's).
    pub values: Tensor,
    /// For each element of the input, the position of its value in `values` (the input's
    /// shape, i64).
    pub inverse: Tensor,
    /// How many times each value occurs (i64).
    pub counts: Tensor,
}

impl Tensor {
    /// The coordinates of the nonzero (true) elements, `[count, ndim]` (i64), in row-major
    /// order (PyTorch's `nonzero`). The count depends on the data: the tensor is read.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![0.0f32, 2.0, 0.0, -1.0], [2, 2]);
    /// assert_eq!(x.nonzero().to_vec::<i64>(), [0, 1, 1, 1]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn nonzero(&self) -> Tensor {
        ok(self.try_nonzero())
    }

    /// [`Tensor::nonzero`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Runtime`] when computing the tensor fails.
    #[track_caller]
    pub fn try_nonzero(&self) -> Result<Tensor> {
        let flags: Vec<bool> = self.ne(0.0).try_to_vec()?;
        let dims = self.dims().to_vec();
        let mut coords = Vec::new();
        for (flat, _) in flags.iter().enumerate().filter(|(_, f)| **f) {
            let mut rest = flat;
            let mut c = vec![0i64; dims.len()];
            for (k, &d) in dims.iter().enumerate().rev() {
                c[k] = (rest % d) as i64;
                rest /= d;
            }
            coords.extend(c);
        }
        let n = coords.len() / dims.len().max(1);
        let rows = if dims.is_empty() { flags.iter().filter(|f| **f).count() } else { n };
        Tensor::try_from_vec(coords, [rows, dims.len()])?.try_to(self.device())
    }

    /// [`Tensor::nonzero`] (PyTorch's `argwhere`).
    #[must_use]
    #[track_caller]
    pub fn argwhere(&self) -> Tensor {
        self.nonzero()
    }

    /// The distinct values of the whole tensor, ascending, with each element's position
    /// among them and each value's count (PyTorch's `unique(sorted=True,
    /// return_inverse=True, return_counts=True)`). Reads the tensor.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![3i64, 1, 3, 2, 1, 3], [2, 3]);
    /// let u = x.unique();
    /// assert_eq!(u.values.to_vec::<i64>(), [1, 2, 3]);
    /// assert_eq!(u.inverse.to_vec::<i64>(), [2, 0, 2, 1, 0, 2]);
    /// assert_eq!(u.counts.to_vec::<i64>(), [2, 1, 3]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn unique(&self) -> Unique {
        ok(self.try_unique())
    }

    /// [`Tensor::unique`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Runtime`] when computing the tensor fails.
    #[track_caller]
    pub fn try_unique(&self) -> Result<Unique> {
        // Every dtype's values are exact in f64 (i64 beyond 2^53 aside: compared as i64).
        let keys: Vec<Key> = if self.dtype().is_float() || self.dtype() == crate::DType::Bool {
            self.try_to_vec::<f64>()?.into_iter().map(Key::Float).collect()
        } else {
            self.try_to_vec::<i64>()?.into_iter().map(Key::Int).collect()
        };
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_by(|&a, &b| keys[a].cmp(&keys[b]));
        let (mut firsts, mut counts) = (Vec::new(), Vec::<i64>::new());
        let mut inverse = vec![0i64; keys.len()];
        for &i in &order {
            let same = firsts.last().is_some_and(|&f: &usize| keys[f].same(&keys[i]));
            if !same {
                firsts.push(i);
                counts.push(0);
            }
            *counts.last_mut().expect("a value was pushed") += 1;
            inverse[i] = (firsts.len() - 1) as i64;
        }
        let n = firsts.len();
        let device = self.device();
        let picks = Tensor::try_from_vec(firsts.iter().map(|&i| i as i64).collect(), [n])?;
        let values = self.detach().try_reshape(&[-1])?.try_gather(0, &picks.try_to(device)?)?;
        Ok(Unique {
            values,
            inverse: Tensor::try_from_vec(inverse, self.shape().clone())?.try_to(device)?,
            counts: Tensor::try_from_vec(counts, [n])?.try_to(device)?,
        })
    }

    /// A copy with `values` written at the index tuples `indices` (one i64 tensor per
    /// leading dimension, broadcast together; PyTorch's `index_put`), or added there with
    /// `accumulate` (repeated positions summing). Gradients flow to this tensor (where not
    /// overwritten) and to `values`.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let x = Tensor::zeros([2, 3]);
    /// let rows = Tensor::from_vec(vec![0i64, 1, 1], [3]);
    /// let cols = Tensor::from_vec(vec![2i64, 0, 0], [3]);
    /// let y = x.index_put(&[&rows, &cols], &Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]), true);
    /// assert_eq!(y.to_vec::<f32>(), [0.0, 0.0, 1.0, 5.0, 0.0, 0.0]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_index_put`] fails.
    #[must_use]
    #[track_caller]
    pub fn index_put(&self, indices: &[&Tensor], values: &Tensor, accumulate: bool) -> Tensor {
        ok(self.try_index_put(indices, values, accumulate))
    }

    /// [`Tensor::index_put`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] for no index tensors, more than this tensor's rank, index tensors
    /// that do not broadcast, or values that do not broadcast to the indexed slices.
    #[track_caller]
    pub fn try_index_put(
        &self,
        indices: &[&Tensor],
        values: &Tensor,
        accumulate: bool,
    ) -> Result<Tensor> {
        let k = indices.len();
        if k == 0 || k > self.ndim() {
            return Err(Error::shape(
                "index_put",
                format!("takes 1 to {} index tensors, got {k}", self.ndim()),
            ));
        }
        let mut shape = indices[0].shape().clone();
        for i in &indices[1..] {
            shape = shape.broadcast(i.shape(), "index_put")?;
        }
        // Each index tuple as one position among the first k dimensions, negatives wrapped.
        let mut flat = Tensor::zeros(shape.clone()).long().to(self.device());
        for (d, idx) in indices.iter().enumerate() {
            // An integer scalar keeps the positions integers.
            let size = self.dims()[d] as i64;
            let idx = idx.long().broadcast_to(&shape);
            let wrapped = Tensor::try_where_(&idx.lt(0), &(&idx + size), &idx)?;
            flat = flat * size + wrapped;
        }
        let lead: usize = self.dims()[..k].iter().product();
        let rest: Vec<usize> = self.dims()[k..].to_vec();
        let rows: Vec<i64> =
            std::iter::once(lead as i64).chain(rest.iter().map(|&d| d as i64)).collect();
        let base = self.try_reshape(&rows)?;
        let n = shape.numel();
        let mut slice: Vec<usize> = vec![n];
        slice.extend(&rest);
        let values = values.to_dtype(self.dtype()).try_broadcast_to_dims(&slice)?;
        let at = flat.try_reshape(&[n as i64])?;
        let out = if accumulate {
            base.try_index_add(0, &at, &values, 1.0)?
        } else {
            // Scatter whole slices: the index repeated across the slice's other dimensions.
            let mut spread: Vec<i64> = vec![n as i64];
            spread.extend(std::iter::repeat_n(1, rest.len()));
            let full: Vec<i64> = slice.iter().map(|&d| d as i64).collect();
            let at = at.try_reshape(&spread)?.try_expand(&full)?;
            base.try_scatter(0, &at, &values)?
        };
        out.try_reshape(&self.dims().iter().map(|&d| d as i64).collect::<Vec<_>>())
    }

    /// `self` broadcast to `dims`, or an error naming both.
    fn try_broadcast_to_dims(&self, dims: &[usize]) -> Result<Tensor> {
        let target = crate::Shape::from(dims.to_vec());
        let joint = self.shape().broadcast(&target, "index_put")?;
        if joint != target {
            return Err(Error::shape(
                "index_put",
                format!(
                    "values of shape {} do not broadcast to the indexed {target}",
                    self.shape()
                ),
            ));
        }
        Ok(self.broadcast_to(&target))
    }
}

/// A value compared as PyTorch's `unique` orders: numbers ascending, NaNs after them, each
/// NaN distinct.
#[derive(Clone, Copy)]
enum Key {
    Float(f64),
    Int(i64),
}

impl Key {
    fn cmp(&self, other: &Key) -> std::cmp::Ordering {
        match (self, other) {
            (Key::Float(a), Key::Float(b)) => match (a.is_nan(), b.is_nan()) {
                (false, false) => a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal),
                (a_nan, b_nan) => a_nan.cmp(&b_nan),
            },
            (Key::Int(a), Key::Int(b)) => a.cmp(b),
            _ => std::cmp::Ordering::Equal,
        }
    }

    fn same(&self, other: &Key) -> bool {
        match (self, other) {
            (Key::Float(a), Key::Float(b)) => a == b,
            (Key::Int(a), Key::Int(b)) => a == b,
            _ => false,
        }
    }
}
