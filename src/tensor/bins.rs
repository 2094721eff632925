//! Counting into bins and adding at indices: `bucketize`, `searchsorted`, `histc`,
//! `bincount`, `index_add`. Bins are found by comparing each value with every boundary and
//! counting (one fused reduction kernel, no `[values, boundaries]` tensor stored); counts
//! are `scatter_add`s.

use kiln_ir::{DType, normalize_axis};

use super::Tensor;
use crate::error::ok;
use crate::{Error, Result};

impl Tensor {
    /// The bin of each element among ascending `boundaries` (1-D; PyTorch's `bucketize`):
    /// `i` such that `boundaries[i-1] < x <= boundaries[i]`, or with `right`
    /// `boundaries[i-1] <= x < boundaries[i]`; `0` below all, `len` above (i64, this
    /// tensor's shape).
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let b = Tensor::from_vec(vec![1.0f32, 3.0, 5.0], [3]);
    /// let x = Tensor::from_vec(vec![0.0f32, 1.0, 4.0, 9.0], [4]);
    /// assert_eq!(x.bucketize(&b, false).to_vec::<i64>(), [0, 0, 2, 3]);
    /// assert_eq!(x.bucketize(&b, true).to_vec::<i64>(), [0, 1, 2, 3]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_bucketize`] fails.
    #[must_use]
    #[track_caller]
    pub fn bucketize(&self, boundaries: &Tensor, right: bool) -> Tensor {
        ok(self.try_bucketize(boundaries, right))
    }

    /// [`Tensor::bucketize`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when `boundaries` is not 1-D.
    #[track_caller]
    pub fn try_bucketize(&self, boundaries: &Tensor, right: bool) -> Result<Tensor> {
        if boundaries.ndim() != 1 {
            return Err(Error::shape(
                "bucketize",
                format!("takes 1-D boundaries, got shape {}", boundaries.shape()),
            ));
        }
        let x = self.detach().try_unsqueeze(-1)?;
        count_below(&x, &boundaries.detach(), right)
    }

    /// For each of `values`, where it would go in this ascending sequence (PyTorch's
    /// `torch.searchsorted(self, values, right=..)`): the first position `i` with
    /// `self[i] >= v` (with `right`, `self[i] > v`). A 1-D sequence serves every value; an
    /// N-D one has one sequence per leading index, matching `values`' leading dimensions.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let seq = Tensor::from_vec(vec![1.0f32, 3.0, 5.0, 7.0], [4]);
    /// let v = Tensor::from_vec(vec![3.0f32, 6.0, 9.0], [3]);
    /// assert_eq!(seq.searchsorted(&v, false).to_vec::<i64>(), [1, 3, 4]);
    /// assert_eq!(seq.searchsorted(&v, true).to_vec::<i64>(), [2, 3, 4]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_searchsorted`] fails.
    #[must_use]
    #[track_caller]
    pub fn searchsorted(&self, values: &Tensor, right: bool) -> Tensor {
        ok(self.try_searchsorted(values, right))
    }

    /// [`Tensor::searchsorted`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] for a 0-D sequence, or an N-D one whose leading dimensions are not
    /// `values`'.
    #[track_caller]
    pub fn try_searchsorted(&self, values: &Tensor, right: bool) -> Result<Tensor> {
        let r = self.ndim();
        let fits = r == 1
            || (r >= 1 && values.ndim() == r && self.dims()[..r - 1] == values.dims()[..r - 1]);
        if !fits {
            return Err(Error::shape(
                "searchsorted",
                format!(
                    "takes a 1-D sequence, or one whose leading dimensions are the values'; \
                     got a sequence of shape {} and values of shape {}",
                    self.shape(),
                    values.shape()
                ),
            ));
        }
        // [.., values, 1] against [.., 1, sequence].
        let v = values.detach().try_unsqueeze(-1)?;
        let seq = if r == 1 { self.detach() } else { self.detach().try_unsqueeze(-2)? };
        count_below(&v, &seq, right)
    }

    /// A histogram of the elements in `bins` equal-width bins over `[min, max]` (PyTorch's
    /// `histc`; `min == max == 0` uses the data's own range). Elements outside the range
    /// (and NaNs) are not counted; `max` itself falls in the last bin. A float tensor of
    /// `bins` counts.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 1.0, 4.0, 9.0], [5]);
    /// assert_eq!(x.histc(4, 0.0, 4.0).to_vec::<f32>(), [0.0, 2.0, 1.0, 1.0]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_histc`] fails.
    #[must_use]
    #[track_caller]
    pub fn histc(&self, bins: usize, min: f64, max: f64) -> Tensor {
        ok(self.try_histc(bins, min, max))
    }

    /// [`Tensor::histc`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Value`] for 0 bins or `min > max`; [`Error::DType`] for a non-float tensor.
    #[track_caller]
    pub fn try_histc(&self, bins: usize, min: f64, max: f64) -> Result<Tensor> {
        if !self.dtype().is_float() {
            return Err(Error::dtype(
                "histc",
                format!("takes a float tensor, got {}", self.dtype()),
            ));
        }
        if bins == 0 || min.partial_cmp(&max).is_none_or(|o| o.is_gt()) {
            return Err(Error::value(
                "histc",
                format!("needs bins >= 1 and min <= max, got {bins} bins over [{min}, {max}]"),
            ));
        }
        let x = self.detach().try_reshape(&[-1])?.double();
        let (min, max) = if min == 0.0 && max == 0.0 && x.numel() > 0 {
            // The data's range, read: this realizes the input.
            (x.min().try_item::<f64>()?, x.max().try_item::<f64>()?)
        } else {
            (min, max)
        };
        let (lo, hi) = if min == max { (min - 1.0, max + 1.0) } else { (min, max) };
        let inside = x.ge(lo).logical_and(x.le(hi));
        let bin = ((&x - lo) * (bins as f64 / (hi - lo))).floor().clamp(0.0, (bins - 1) as f64);
        let bin = Tensor::try_where_(&inside, &bin, 0.0)?.long();
        let ones = inside.to_dtype(self.dtype());
        Tensor::zeros([bins])
            .to_dtype(self.dtype())
            .to(self.device())
            .try_scatter_add(0, &bin, &ones)
    }

    /// How many times each value `0..=max` occurs in this 1-D tensor of non-negative
    /// integers (PyTorch's `bincount`), or the sum of `weights` at each; at least
    /// `minlength` bins. The length depends on the data: the tensor's maximum is read (a
    /// realization).
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1i64, 1, 3, 0], [4]);
    /// assert_eq!(x.bincount(None, 0).to_vec::<i64>(), [1, 2, 0, 1]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_bincount`] fails.
    #[must_use]
    #[track_caller]
    pub fn bincount(&self, weights: Option<&Tensor>, minlength: usize) -> Tensor {
        ok(self.try_bincount(weights, minlength))
    }

    /// [`Tensor::bincount`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] unless this is 1-D (and `weights` its shape); [`Error::DType`] for a
    /// non-integer tensor; [`Error::Value`] for a negative value.
    #[track_caller]
    pub fn try_bincount(&self, weights: Option<&Tensor>, minlength: usize) -> Result<Tensor> {
        if self.ndim() != 1 || weights.is_some_and(|w| w.shape() != self.shape()) {
            return Err(Error::shape(
                "bincount",
                format!(
                    "takes a 1-D tensor and weights of its shape, got {}{}",
                    self.shape(),
                    weights.map(|w| format!(" and weights {}", w.shape())).unwrap_or_default()
                ),
            ));
        }
        if self.dtype().is_float() || self.dtype() == DType::Bool {
            return Err(Error::dtype("bincount", format!("counts integers, got {}", self.dtype())));
        }
        let (lowest, highest) = match self.numel() {
            0 => (0, -1),
            _ => (self.min().try_item::<i64>()?, self.max().try_item::<i64>()?),
        };
        if lowest < 0 {
            return Err(Error::value(
                "bincount",
                format!("counts non-negative values, got {lowest}"),
            ));
        }
        let len = ((highest + 1) as usize).max(minlength);
        let (src, dtype) = match weights {
            Some(w) => (w.clone(), if w.dtype().is_float() { w.dtype() } else { DType::F64 }),
            None => (Tensor::ones(self.shape().clone()).long().to(self.device()), DType::I64),
        };
        Tensor::zeros([len]).to_dtype(dtype).to(self.device()).try_scatter_add(
            0,
            &self.long(),
            &src.to_dtype(dtype),
        )
    }

    /// This tensor with `alpha · source` added at `index` along `dim` (PyTorch's
    /// `index_add`, out of place): slice `index[i]` of the result gets slice `i` of
    /// `source`, repeated indices accumulating. Gradients flow to both.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let x = Tensor::zeros([3, 2]);
    /// let src = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    /// let y = x.index_add(0, &Tensor::from_vec(vec![2i64, 2], [2]), &src, 1.0);
    /// assert_eq!(y.to_vec::<f32>(), [0.0, 0.0, 0.0, 0.0, 4.0, 6.0]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_index_add`] fails.
    #[must_use]
    #[track_caller]
    pub fn index_add(&self, dim: i64, index: &Tensor, source: &Tensor, alpha: f64) -> Tensor {
        ok(self.try_index_add(dim, index, source, alpha))
    }

    /// [`Tensor::index_add`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] unless `index` is 1-D and `source` is this tensor's shape with
    /// `index.len()` along `dim`; [`Error::Index`] for a `dim` out of range (an index out of
    /// range is reported when computed).
    #[track_caller]
    pub fn try_index_add(
        &self,
        dim: i64,
        index: &Tensor,
        source: &Tensor,
        alpha: f64,
    ) -> Result<Tensor> {
        let axis = normalize_axis("index_add", dim, self.ndim().max(1))?;
        let mut want = self.dims().to_vec();
        if let Some(d) = want.get_mut(axis) {
            *d = index.numel();
        }
        if index.ndim() != 1 || source.dims() != want.as_slice() {
            return Err(Error::shape(
                "index_add",
                format!(
                    "takes a 1-D index and a source of shape {want:?} (this tensor's shape with \
                     the index's length along dim {dim}); got index {} and source {}",
                    index.shape(),
                    source.shape()
                ),
            ));
        }
        // The index along `axis`, broadcast over the other dimensions of the source.
        let mut shape = vec![1i64; source.ndim()];
        shape[axis] = index.numel() as i64;
        let full: Vec<i64> = source.dims().iter().map(|&d| d as i64).collect();
        let spread = index.long().try_reshape(&shape)?.try_expand(&full)?;
        let source = if alpha == 1.0 { source.clone() } else { source * alpha };
        self.try_scatter_add(dim, &spread, &source)
    }
}

/// How many of `edges` (broadcast against `x` over a trailing dimension) lie below each of
/// `x` (`< x`, or `<= x` with `right`): the insertion positions, as i64.
fn count_below(x: &Tensor, edges: &Tensor, right: bool) -> Result<Tensor> {
    let below = if right { edges.try_le(x)? } else { edges.try_lt(x)? };
    below.long().try_sum_dim(-1, false)
}
