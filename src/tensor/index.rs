//! Indexing with `i(..)`: integers, ranges, `..`, `Ellipsis` and new axes, all as views.

use std::ops::{Range, RangeFrom, RangeFull, RangeInclusive, RangeTo, RangeToInclusive};

use super::Tensor;
use crate::error::ok;
use crate::{Error, Result};

/// Stands for as many full dimensions as needed, as `...` does in PyTorch:
/// `x.i((Ellipsis, 0))` selects index 0 of the last dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ellipsis;

/// Inserts a dimension of size 1, as `None` does in PyTorch indexing: `x.i((.., NewAxis))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewAxis;

/// One entry of an index: what `i(..)` takes, alone or in a tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorIndex {
    /// One position (negative counts from the end); the dimension is removed.
    Select(i64),
    /// A half-open range of positions; bounds may be negative and are clamped to the
    /// dimension, as in Python slicing.
    Slice {
        /// First position (default 0).
        start: Option<i64>,
        /// One past the last position (default: the end).
        end: Option<i64>,
    },
    /// `...`: as many full dimensions as the other entries leave.
    Ellipsis,
    /// A new dimension of size 1.
    NewAxis,
}

macro_rules! index_from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for TensorIndex {
            fn from(i: $t) -> TensorIndex {
                TensorIndex::Select(i as i64)
            }
        }
        impl From<Range<$t>> for TensorIndex {
            fn from(r: Range<$t>) -> TensorIndex {
                TensorIndex::Slice { start: Some(r.start as i64), end: Some(r.end as i64) }
            }
        }
        impl From<RangeFrom<$t>> for TensorIndex {
            fn from(r: RangeFrom<$t>) -> TensorIndex {
                TensorIndex::Slice { start: Some(r.start as i64), end: None }
            }
        }
        impl From<RangeTo<$t>> for TensorIndex {
            fn from(r: RangeTo<$t>) -> TensorIndex {
                TensorIndex::Slice { start: None, end: Some(r.end as i64) }
            }
        }
        impl From<RangeInclusive<$t>> for TensorIndex {
            fn from(r: RangeInclusive<$t>) -> TensorIndex {
                let end = *r.end() as i64;
                // An inclusive range ending at -1 runs to the end.
                TensorIndex::Slice { start: Some(*r.start() as i64), end: if end == -1 { None } else { Some(end + 1) } }
            }
        }
        impl From<RangeToInclusive<$t>> for TensorIndex {
            fn from(r: RangeToInclusive<$t>) -> TensorIndex {
                let end = r.end as i64;
                TensorIndex::Slice { start: None, end: if end == -1 { None } else { Some(end + 1) } }
            }
        }
    )*};
}
index_from_int!(i64, i32, usize);

impl From<RangeFull> for TensorIndex {
    fn from(_: RangeFull) -> TensorIndex {
        TensorIndex::Slice { start: None, end: None }
    }
}

impl From<Ellipsis> for TensorIndex {
    fn from(_: Ellipsis) -> TensorIndex {
        TensorIndex::Ellipsis
    }
}

impl From<NewAxis> for TensorIndex {
    fn from(_: NewAxis) -> TensorIndex {
        TensorIndex::NewAxis
    }
}

/// Indexing: `x.i(0)`, `x.i((.., 1))`, `x.i((0, 1..3))`, `x.i((Ellipsis, -1))`. The result
/// is a view sharing the tensor's storage, so writing into it writes into the tensor.
///
/// ```
/// use kiln::prelude::*;
/// let x = Tensor::arange(0i64, 24, 1).view(&[2, 3, 4]);
/// assert_eq!(x.i(1).dims(), &[3, 4]);
/// assert_eq!(x.i((0, 1..3, -1)).to_vec::<i64>(), vec![7, 11]);
/// assert_eq!(x.i((Ellipsis, 0)).dims(), &[2, 3]);
/// assert_eq!(x.i((.., NewAxis, 0)).dims(), &[2, 1, 4]);
/// assert!(x.try_i(5).is_err());
/// ```
pub trait IndexOp<T> {
    /// The view that `index` selects.
    ///
    /// # Panics
    /// On an index out of range or too many indices; `try_i` returns the error.
    fn i(&self, index: T) -> Tensor;

    /// The view that `index` selects, or an error.
    ///
    /// # Errors
    /// [`Error::Index`] for an integer index out of range, more indices than dimensions, or
    /// more than one `Ellipsis`.
    fn try_i(&self, index: T) -> Result<Tensor>;
}

impl<T: Into<TensorIndex>> IndexOp<T> for Tensor {
    #[track_caller]
    fn i(&self, index: T) -> Tensor {
        ok(self.index(&[index.into()]))
    }

    #[track_caller]
    fn try_i(&self, index: T) -> Result<Tensor> {
        self.index(&[index.into()])
    }
}

macro_rules! index_tuple {
    ($($name:ident),+) => {
        impl<$($name: Into<TensorIndex>),+> IndexOp<($($name,)+)> for Tensor {
            #[track_caller]
            #[allow(non_snake_case, reason = "the tuple's elements are named after their types")]
            fn i(&self, ($($name,)+): ($($name,)+)) -> Tensor {
                ok(self.index(&[$($name.into()),+]))
            }

            #[track_caller]
            #[allow(non_snake_case, reason = "the tuple's elements are named after their types")]
            fn try_i(&self, ($($name,)+): ($($name,)+)) -> Result<Tensor> {
                self.index(&[$($name.into()),+])
            }
        }
    };
}
index_tuple!(A);
index_tuple!(A, B);
index_tuple!(A, B, C);
index_tuple!(A, B, C, D);
index_tuple!(A, B, C, D, E);
index_tuple!(A, B, C, D, E, F);

impl Tensor {
    #[track_caller]
    fn index(&self, entries: &[TensorIndex]) -> Result<Tensor> {
        let consuming = entries
            .iter()
            .filter(|e| matches!(e, TensorIndex::Select(_) | TensorIndex::Slice { .. }))
            .count();
        if entries.iter().filter(|e| matches!(e, TensorIndex::Ellipsis)).count() > 1 {
            return Err(Error::index("i", "an index can contain at most one Ellipsis"));
        }
        if consuming > self.ndim() {
            return Err(Error::index(
                "i",
                format!(
                    "too many indices ({consuming}) for a tensor of rank {} (shape {})",
                    self.ndim(),
                    self.shape()
                ),
            ));
        }
        let mut out = self.clone();
        let mut dim = 0usize; // the next dimension of `out` to index
        for entry in entries {
            match *entry {
                TensorIndex::Select(i) => {
                    let size = out.dims()[dim] as i64;
                    let pos = if i < 0 { i + size } else { i };
                    if !(0..size).contains(&pos) {
                        return Err(Error::index(
                            "i",
                            format!(
                                "index {i} is out of range for dimension {dim} of size {size} (shape {})",
                                self.shape()
                            ),
                        ));
                    }
                    out = out.try_select(dim as i64, pos)?;
                }
                TensorIndex::Slice { start, end } => {
                    let size = out.dims()[dim] as i64;
                    let clamp = |v: i64| (if v < 0 { v + size } else { v }).clamp(0, size);
                    let s = start.map_or(0, clamp);
                    let e = end.map_or(size, clamp).max(s);
                    out = out.try_narrow(dim as i64, s as usize, (e - s) as usize)?;
                    dim += 1;
                }
                TensorIndex::Ellipsis => dim += self.ndim() - consuming,
                TensorIndex::NewAxis => {
                    out = out.try_unsqueeze(dim as i64)?;
                    dim += 1;
                }
            }
        }
        Ok(out)
    }

    /// The slice at position `index` of dimension `dim` (negative counts from the end), with
    /// that dimension removed. Shares storage.
    ///
    /// # Panics
    /// If `dim` or `index` is out of range; [`Tensor::try_select`] returns the error.
    #[must_use]
    #[track_caller]
    pub fn select(&self, dim: i64, index: i64) -> Tensor {
        ok(self.try_select(dim, index))
    }

    /// [`Tensor::select`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] when `dim` or `index` is out of range.
    #[track_caller]
    pub fn try_select(&self, dim: i64, index: i64) -> Result<Tensor> {
        let d = self.shape().normalize_dim("select", dim)?;
        let size = self.dims()[d] as i64;
        let pos = if index < 0 { index + size } else { index };
        if !(0..size).contains(&pos) {
            return Err(Error::index(
                "select",
                format!(
                    "index {index} is out of range for dimension {d} of size {size} (shape {})",
                    self.shape()
                ),
            ));
        }
        self.try_narrow(d as i64, pos as usize, 1)?.try_squeeze(d as i64)
    }
}
