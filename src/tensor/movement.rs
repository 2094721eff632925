//! Movement ops: new views of the same storage, and copies where a view is impossible.

use kiln_ir::{Op, Shape, View, normalize_axis};

use super::Tensor;
use crate::error::ok;
use crate::{Error, Result};

impl Tensor {
    /// A new view of the same storage, with layout `f(layout)`. No data op is recorded; for
    /// autograd the view is the `View` op that `f` makes of a dense tensor of this shape.
    #[track_caller]
    pub(crate) fn restrided(&self, f: impl Fn(&View) -> View) -> Tensor {
        let out = self.with_view(f(self.layout()));
        super::history::record(
            &out,
            || Op::View(f(&View::contiguous(self.shape().clone()))),
            &[self],
        );
        out
    }

    /// Broadcasts to `shape`, which the caller has checked.
    pub(crate) fn broadcast_to(&self, shape: &Shape) -> Tensor {
        if self.shape() == shape {
            return self.clone();
        }
        self.restrided(|v| v.expand(shape))
    }

    /// A dense copy in a new storage, or this tensor itself when it is already contiguous
    /// (as in PyTorch, the result then shares storage).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::arange(0i64, 6, 1).view(&[2, 3]).t();
    /// assert!(!x.is_contiguous());
    /// let c = x.contiguous();
    /// assert!(c.is_contiguous());
    /// assert_eq!(c.stride(), vec![2, 1]);
    /// assert_eq!(c.to_vec::<i64>(), vec![0, 3, 1, 4, 2, 5]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn contiguous(&self) -> Tensor {
        if self.is_contiguous() {
            return self.clone();
        }
        let out = Tensor::from_node(self.node());
        super::history::record(&out, || Op::View(View::contiguous(self.shape().clone())), &[self]);
        out
    }

    /// The same elements with a new shape, sharing storage; one dimension may be `-1` and is
    /// inferred. Like PyTorch's `view`, it fails when the layout cannot be expressed as
    /// strides (a transposed tensor flattened, say): use [`Tensor::reshape`] then.
    ///
    /// # Panics
    /// On a bad shape or an incompatible layout; [`Tensor::try_view`] returns the error.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::arange(0i64, 12, 1);
    /// let v = x.view(&[3, -1]);
    /// assert_eq!(v.dims(), &[3, 4]);
    /// assert!(v.shares_storage_with(&x));
    /// assert!(v.t().try_view(&[12]).is_err());
    /// ```
    #[must_use]
    #[track_caller]
    pub fn view(&self, shape: &[i64]) -> Tensor {
        ok(self.try_view(shape))
    }

    /// [`Tensor::view`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when the shape has the wrong element count, or the layout cannot be
    /// viewed with it.
    #[track_caller]
    pub fn try_view(&self, shape: &[i64]) -> Result<Tensor> {
        let shape = infer_shape("view", self.shape(), shape)?;
        match self.layout().reshape(&shape) {
            Some(_) => Ok(self.restrided(|v| v.reshape(&shape).expect("checked just above"))),
            None => Err(Error::shape(
                "view",
                format!(
                    "a tensor of shape {} with strides {:?} cannot be viewed as {shape} without copying; use .reshape(..), which copies when it must, or call .contiguous() first",
                    self.shape(),
                    self.stride()
                ),
            )),
        }
    }

    /// The same elements with a new shape (one dimension may be `-1`): a view sharing storage
    /// when the layout allows, a copy otherwise.
    ///
    /// # Panics
    /// When the shape's element count differs; [`Tensor::try_reshape`] returns the error.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::arange(0i64, 6, 1).view(&[2, 3]);
    /// assert_eq!(x.t().reshape(&[-1]).to_vec::<i64>(), vec![0, 3, 1, 4, 2, 5]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn reshape(&self, shape: &[i64]) -> Tensor {
        ok(self.try_reshape(shape))
    }

    /// [`Tensor::reshape`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when the shape's element count differs or it has several `-1`s.
    #[track_caller]
    pub fn try_reshape(&self, shape: &[i64]) -> Result<Tensor> {
        let shape = infer_shape("reshape", self.shape(), shape)?;
        let reshape = |v: &View| v.reshape(&shape).expect("checked, or contiguous, so it reshapes");
        Ok(match self.layout().reshape(&shape) {
            Some(_) => self.restrided(reshape),
            None => self.contiguous().restrided(reshape),
        })
    }

    /// All elements in one dimension (a view when the layout allows).
    #[must_use]
    #[track_caller]
    pub fn flatten(&self) -> Tensor {
        self.reshape(&[-1])
    }

    /// Reorders the dimensions: dimension `i` of the result is dimension `dims[i]` of
    /// `self` (negative counts from the end). Shares storage.
    ///
    /// # Panics
    /// If `dims` is not a permutation of the dimensions; [`Tensor::try_permute`] returns the
    /// error.
    #[must_use]
    #[track_caller]
    pub fn permute(&self, dims: &[i64]) -> Tensor {
        ok(self.try_permute(dims))
    }

    /// [`Tensor::permute`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] or [`Error::Index`] when `dims` is not a permutation.
    #[track_caller]
    pub fn try_permute(&self, dims: &[i64]) -> Result<Tensor> {
        let rank = self.ndim();
        if dims.len() != rank {
            return Err(Error::shape(
                "permute",
                format!(
                    "got {} dimensions {dims:?} for a tensor of rank {rank} (shape {})",
                    dims.len(),
                    self.shape()
                ),
            ));
        }
        let mut perm = Vec::with_capacity(rank);
        let mut seen = vec![false; rank];
        for &d in dims {
            let d = normalize_axis("permute", d, rank)?;
            if std::mem::replace(&mut seen[d], true) {
                return Err(Error::index(
                    "permute",
                    format!("dimension {d} appears twice in {dims:?}"),
                ));
            }
            perm.push(d);
        }
        Ok(self.restrided(|v| v.permute(&perm)))
    }

    /// Moves dimension `source` to position `destination`, the others keeping their order
    /// (PyTorch's `movedim`, also `moveaxis`; negative counts from the end). Shares storage.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::zeros([2, 3, 4]);
    /// assert_eq!(x.movedim(0, -1).dims(), &[3, 4, 2]);
    /// assert_eq!(x.movedim(2, 0).dims(), &[4, 2, 3]);
    /// ```
    ///
    /// # Panics
    /// If a dimension is out of range; [`Tensor::try_movedim`] returns the error.
    #[must_use]
    #[track_caller]
    pub fn movedim(&self, source: i64, destination: i64) -> Tensor {
        ok(self.try_movedim(source, destination))
    }

    /// [`Tensor::movedim`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] when a dimension is out of range.
    #[track_caller]
    pub fn try_movedim(&self, source: i64, destination: i64) -> Result<Tensor> {
        let rank = self.ndim();
        let from = normalize_axis("movedim", source, rank)?;
        let to = normalize_axis("movedim", destination, rank)?;
        let mut perm: Vec<usize> = (0..rank).filter(|&d| d != from).collect();
        perm.insert(to, from);
        Ok(self.restrided(|v| v.permute(&perm)))
    }

    /// [`Tensor::movedim`] under NumPy's name.
    #[must_use]
    #[track_caller]
    pub fn moveaxis(&self, source: i64, destination: i64) -> Tensor {
        self.movedim(source, destination)
    }

    /// Swaps two dimensions (negative counts from the end). Shares storage.
    ///
    /// # Panics
    /// If a dimension is out of range; [`Tensor::try_transpose`] returns the error.
    #[must_use]
    #[track_caller]
    pub fn transpose(&self, dim0: i64, dim1: i64) -> Tensor {
        ok(self.try_transpose(dim0, dim1))
    }

    /// [`Tensor::transpose`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] when a dimension is out of range.
    #[track_caller]
    pub fn try_transpose(&self, dim0: i64, dim1: i64) -> Result<Tensor> {
        let rank = self.ndim();
        let a = normalize_axis("transpose", dim0, rank)?;
        let b = normalize_axis("transpose", dim1, rank)?;
        let mut perm: Vec<usize> = (0..rank).collect();
        perm.swap(a, b);
        Ok(self.restrided(|v| v.permute(&perm)))
    }

    /// The transpose of a matrix (tensors of rank 0 and 1 are returned as they are).
    ///
    /// # Panics
    /// On a tensor of rank above 2 (use [`Tensor::transpose`]); [`Tensor::try_t`] returns
    /// the error.
    #[must_use]
    #[track_caller]
    pub fn t(&self) -> Tensor {
        ok(self.try_t())
    }

    /// [`Tensor::t`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] on a tensor of rank above 2.
    #[track_caller]
    pub fn try_t(&self) -> Result<Tensor> {
        match self.ndim() {
            0 | 1 => Ok(self.clone()),
            2 => self.try_transpose(0, 1),
            _ => Err(Error::shape(
                "t",
                format!(
                    "expects a tensor of rank 2 or less, got shape {}; use .transpose(d0, d1)",
                    self.shape()
                ),
            )),
        }
    }

    /// Inserts a dimension of size 1 at `dim` (in `-rank-1..=rank`). Shares storage.
    ///
    /// # Panics
    /// If `dim` is out of range; [`Tensor::try_unsqueeze`] returns the error.
    #[must_use]
    #[track_caller]
    pub fn unsqueeze(&self, dim: i64) -> Tensor {
        ok(self.try_unsqueeze(dim))
    }

    /// [`Tensor::unsqueeze`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] when `dim` is out of range.
    #[track_caller]
    pub fn try_unsqueeze(&self, dim: i64) -> Result<Tensor> {
        let d = normalize_axis("unsqueeze", dim, self.ndim() + 1)?;
        Ok(self.restrided(|v| v.unsqueeze(d)))
    }

    /// Removes dimension `dim` if its size is 1 (otherwise returns the tensor unchanged, as
    /// PyTorch does). Shares storage.
    ///
    /// # Panics
    /// If `dim` is out of range; [`Tensor::try_squeeze`] returns the error.
    #[must_use]
    #[track_caller]
    pub fn squeeze(&self, dim: i64) -> Tensor {
        ok(self.try_squeeze(dim))
    }

    /// [`Tensor::squeeze`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] when `dim` is out of range.
    #[track_caller]
    pub fn try_squeeze(&self, dim: i64) -> Result<Tensor> {
        let d = normalize_axis("squeeze", dim, self.ndim())?;
        Ok(if self.dims()[d] == 1 { self.restrided(|v| v.squeeze(d)) } else { self.clone() })
    }

    /// Removes every dimension of size 1. Shares storage.
    #[must_use]
    #[track_caller]
    pub fn squeeze_all(&self) -> Tensor {
        let ones: Vec<usize> = (0..self.ndim()).filter(|&d| self.dims()[d] == 1).collect();
        self.restrided(|v| ones.iter().rev().fold(v.clone(), |v, &d| v.squeeze(d)))
    }

    /// Broadcasts to `shape` without copying (broadcast dimensions get stride 0); `-1` keeps
    /// a dimension's size. New dimensions are added on the left.
    ///
    /// # Panics
    /// If the shapes are incompatible; [`Tensor::try_expand`] returns the error.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let col = Tensor::from_vec(vec![1i64, 2], [2, 1]);
    /// assert_eq!(col.expand(&[2, 3]).to_vec::<i64>(), vec![1, 1, 1, 2, 2, 2]);
    /// assert_eq!(col.expand(&[4, -1, 3]).dims(), &[4, 2, 3]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn expand(&self, shape: &[i64]) -> Tensor {
        ok(self.try_expand(shape))
    }

    /// [`Tensor::expand`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when a dimension of size other than 1 would change, or the target has
    /// fewer dimensions.
    #[track_caller]
    pub fn try_expand(&self, shape: &[i64]) -> Result<Tensor> {
        let rank = self.ndim();
        let bad = |why: String| {
            Error::shape(
                "expand",
                format!("cannot expand shape {} to {shape:?}: {why}", self.shape()),
            )
        };
        if shape.len() < rank {
            return Err(bad(format!("the target needs at least {rank} dimensions")));
        }
        let extra = shape.len() - rank;
        let mut dims = Vec::with_capacity(shape.len());
        for (i, &s) in shape.iter().enumerate() {
            let old = if i >= extra { Some(self.dims()[i - extra]) } else { None };
            let new = match (s, old) {
                (-1, Some(o)) => o,
                (-1, None) => {
                    return Err(bad(format!(
                        "-1 is not allowed for the new leading dimension {i}"
                    )));
                }
                (s, _) if s < 0 => return Err(bad(format!("size {s} is negative"))),
                (s, Some(o)) if o != 1 && s as usize != o => {
                    return Err(bad(format!(
                        "dimension {i} has size {o}, which is not 1 and differs from {s}; only size-1 dimensions expand"
                    )));
                }
                (s, _) => s as usize,
            };
            dims.push(new);
        }
        let shape = Shape::new(dims);
        shape.check_size("expand", self.dtype())?;
        Ok(self.broadcast_to(&shape))
    }

    /// Keeps `len` elements of dimension `dim` starting at `start`. Shares storage.
    ///
    /// # Panics
    /// If the range does not fit; [`Tensor::try_narrow`] returns the error.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::arange(0i64, 6, 1).view(&[2, 3]);
    /// assert_eq!(x.narrow(1, 1, 2).to_vec::<i64>(), vec![1, 2, 4, 5]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn narrow(&self, dim: i64, start: usize, len: usize) -> Tensor {
        ok(self.try_narrow(dim, start, len))
    }

    /// [`Tensor::narrow`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] when `dim` is out of range or `start + len` exceeds its size.
    #[track_caller]
    pub fn try_narrow(&self, dim: i64, start: usize, len: usize) -> Result<Tensor> {
        let d = normalize_axis("narrow", dim, self.ndim())?;
        let size = self.dims()[d];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::index(
                "narrow",
                format!(
                    "elements {start}..{} of dimension {d} are out of range for size {size} (shape {})",
                    start.saturating_add(len),
                    self.shape()
                ),
            ));
        }
        Ok(self.restrided(|v| v.narrow(d, start, len)))
    }
}

/// Resolves a target shape with at most one `-1` against `from`'s element count.
fn infer_shape(op: &'static str, from: &Shape, target: &[i64]) -> Result<Shape> {
    let numel = from.numel();
    let mut infer_at = None;
    let mut known = 1usize;
    for (i, &d) in target.iter().enumerate() {
        match d {
            -1 if infer_at.is_some() => {
                return Err(Error::shape(
                    op,
                    format!("only one dimension can be -1, got {target:?}"),
                ));
            }
            -1 => infer_at = Some(i),
            d if d < 0 => return Err(Error::shape(op, format!("invalid size {d} in {target:?}"))),
            d => known *= d as usize,
        }
    }
    let mut dims: Vec<usize> = target.iter().map(|&d| d.max(0) as usize).collect();
    if let Some(i) = infer_at {
        if known == 0 || !numel.is_multiple_of(known) {
            return Err(Error::shape(
                op,
                format!(
                    "shape {target:?} is invalid for a tensor of shape {from} ({numel} elements)"
                ),
            ));
        }
        dims[i] = numel / known;
    } else if known != numel {
        return Err(Error::shape(
            op,
            format!(
                "shape {target:?} has {known} elements but the tensor of shape {from} has {numel}"
            ),
        ));
    }
    Ok(Shape::new(dims))
}

impl Tensor {
    /// This tensor expanded to `other`'s shape (PyTorch's `expand_as`).
    ///
    /// # Panics
    /// As [`Tensor::try_expand`] fails.
    #[must_use]
    #[track_caller]
    pub fn expand_as(&self, other: &Tensor) -> Tensor {
        ok(self.try_expand_as(other))
    }

    /// [`Tensor::expand_as`], returning an error instead of panicking.
    ///
    /// # Errors
    /// As [`Tensor::try_expand`].
    #[track_caller]
    pub fn try_expand_as(&self, other: &Tensor) -> Result<Tensor> {
        let dims: Vec<i64> = other.dims().iter().map(|&d| d as i64).collect();
        self.try_expand(&dims)
    }

    /// The slices along `dim`, each without that dimension (views; PyTorch's `unbind`).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1i64, 2, 3, 4, 5, 6], [2, 3]);
    /// let cols = x.unbind(1);
    /// assert_eq!(cols.len(), 3);
    /// assert_eq!(cols[2].to_vec::<i64>(), [3, 6]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_unbind`] fails.
    #[must_use]
    #[track_caller]
    pub fn unbind(&self, dim: i64) -> Vec<Tensor> {
        ok(self.try_unbind(dim))
    }

    /// [`Tensor::unbind`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] for a dimension out of range.
    #[track_caller]
    pub fn try_unbind(&self, dim: i64) -> Result<Vec<Tensor>> {
        let axis = normalize_axis("unbind", dim, self.ndim())?;
        (0..self.dims()[axis] as i64).map(|i| self.try_select(axis as i64, i)).collect()
    }
}
