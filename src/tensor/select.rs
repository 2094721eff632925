//! Selection and assembly: gather/scatter, masks, concatenation, splitting, repetition,
//! flipping and triangles.

use kiln_ir::{DType, Op, Scalar, Shape, View, normalize_axis};

use super::{Operand, Tensor};
use crate::error::ok;
use crate::{Error, Result};

impl Tensor {
    /// Converts an index tensor to `i64` (from any integer dtype) or explains what is wrong.
    fn as_index(&self, op: &'static str) -> Result<Tensor> {
        if self.dtype().is_int() {
            Ok(self.to_dtype(DType::I64))
        } else {
            Err(Error::dtype(
                op,
                format!(
                    "indices must be an integer tensor, got {}; convert with .long()",
                    self.dtype()
                ),
            ))
        }
    }

    /// Picks elements along `dim` by `index` (same rank as `self`; no larger outside `dim`):
    /// `out[i][j] = self[i][index[i][j]]` for `dim = 1`. Indices out of range are reported
    /// when the result is computed.
    ///
    /// # Panics
    /// As [`Tensor::try_gather`] fails.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    /// let idx = Tensor::from_vec(vec![0i64, 0, 1, 0], [2, 2]);
    /// assert_eq!(x.gather(1, &idx).to_vec::<f32>(), vec![1.0, 1.0, 4.0, 3.0]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn gather(&self, dim: i64, index: &Tensor) -> Tensor {
        ok(self.try_gather(dim, index))
    }

    /// [`Tensor::gather`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] for a bad `dim`, [`Error::DType`] for a non-integer index,
    /// [`Error::Shape`] when the index's rank differs or it is larger outside `dim`.
    #[track_caller]
    pub fn try_gather(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        let axis = normalize_axis("gather", dim, self.ndim())?;
        Tensor::from_op(Op::Gather { axis }, &[self, &index.as_index("gather")?])
    }

    /// The slices of dimension `dim` at the positions in the 1-D `index`, in that order.
    ///
    /// # Panics
    /// As [`Tensor::try_index_select`] fails.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::arange(0i64, 6, 1).view(&[3, 2]);
    /// let rows = x.index_select(0, &Tensor::from_vec(vec![2i64, 0, 2], [3]));
    /// assert_eq!(rows.to_vec::<i64>(), vec![4, 5, 0, 1, 4, 5]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn index_select(&self, dim: i64, index: &Tensor) -> Tensor {
        ok(self.try_index_select(dim, index))
    }

    /// [`Tensor::index_select`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] for a bad `dim`, [`Error::DType`] for a non-integer index,
    /// [`Error::Shape`] for an index that is not 1-D.
    #[track_caller]
    pub fn try_index_select(&self, dim: i64, index: &Tensor) -> Result<Tensor> {
        let axis = normalize_axis("index_select", dim, self.ndim())?;
        if index.ndim() != 1 {
            return Err(Error::shape(
                "index_select",
                format!("the index must be 1-D, got shape {}", index.shape()),
            ));
        }
        let index = index.as_index("index_select")?;
        let mut at_axis = vec![1i64; self.ndim()];
        at_axis[axis] = index.numel() as i64;
        let mut target: Vec<i64> = self.dims().iter().map(|&d| d as i64).collect();
        target[axis] = index.numel() as i64;
        let spread = index.try_reshape(&at_axis)?.try_expand(&target)?;
        Tensor::from_op(Op::Gather { axis }, &[self, &spread])
    }

    /// A copy where, for every position `p` of `index`, the element at `p` with coordinate
    /// `dim` replaced by `index[p]` is set to `src[p]` (a tensor at least as large as the
    /// index, or a scalar). Where several positions hit one element the last (row-major) wins.
    ///
    /// # Panics
    /// As [`Tensor::try_scatter`] fails.
    #[must_use]
    #[track_caller]
    pub fn scatter<'a>(&self, dim: i64, index: &Tensor, src: impl Into<Operand<'a>>) -> Tensor {
        ok(self.try_scatter(dim, index, src))
    }

    /// [`Tensor::scatter`], returning an error instead of panicking.
    ///
    /// # Errors
    /// As [`Tensor::try_gather`], and [`Error::Shape`] when `src` is smaller than the index.
    #[track_caller]
    pub fn try_scatter<'a>(
        &self,
        dim: i64,
        index: &Tensor,
        src: impl Into<Operand<'a>>,
    ) -> Result<Tensor> {
        self.scatter_impl("scatter", false, dim, index, src.into())
    }

    /// A copy where `src[p]` is added at each position `index` selects (see
    /// [`Tensor::scatter`]); repeated positions accumulate.
    ///
    /// # Panics
    /// As [`Tensor::try_scatter_add`] fails.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let counts = Tensor::zeros([3]).scatter_add(0, &Tensor::from_vec(vec![0i64, 2, 2], [3]), &Tensor::ones([3]));
    /// assert_eq!(counts.to_vec::<f32>(), vec![1.0, 0.0, 2.0]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn scatter_add(&self, dim: i64, index: &Tensor, src: &Tensor) -> Tensor {
        ok(self.try_scatter_add(dim, index, src))
    }

    /// [`Tensor::scatter_add`], returning an error instead of panicking.
    ///
    /// # Errors
    /// As [`Tensor::try_scatter`].
    #[track_caller]
    pub fn try_scatter_add(&self, dim: i64, index: &Tensor, src: &Tensor) -> Result<Tensor> {
        self.scatter_impl("scatter_add", true, dim, index, Operand::from(src))
    }

    #[track_caller]
    fn scatter_impl(
        &self,
        op: &'static str,
        accumulate: bool,
        dim: i64,
        index: &Tensor,
        src: Operand<'_>,
    ) -> Result<Tensor> {
        let axis = normalize_axis(op, dim, self.ndim())?;
        let index = index.as_index(op)?;
        let src = match src {
            Operand::Tensor(t) => t.into_owned().to_dtype(self.dtype()),
            Operand::Scalar(s) => Tensor::full_dtype(index.shape(), s, self.dtype()),
        };
        Tensor::from_op(Op::Scatter { axis, accumulate }, &[self, &index, &src])
    }

    /// The elements where `mask` (broadcast to this tensor's shape) is true, as a 1-D
    /// tensor in row-major order.
    ///
    /// The result's length depends on the mask's values, so the mask is computed here (a
    /// realization, like `item()`); the selection itself stays lazy and differentiable.
    ///
    /// # Panics
    /// As [`Tensor::try_masked_select`] fails.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0, -4.0], [2, 2]);
    /// assert_eq!(x.masked_select(&x.gt(0.0)).to_vec::<f32>(), vec![1.0, 3.0]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn masked_select(&self, mask: &Tensor) -> Tensor {
        ok(self.try_masked_select(mask))
    }

    /// [`Tensor::masked_select`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::DType`] for a non-bool mask, [`Error::Shape`] when the shapes do not
    /// broadcast, [`Error::Runtime`] when computing the mask fails.
    #[track_caller]
    pub fn try_masked_select(&self, mask: &Tensor) -> Result<Tensor> {
        check_mask("masked_select", mask)?;
        let shape = self.shape().broadcast(mask.shape(), "masked_select")?;
        let flags: Vec<bool> = mask.broadcast_to(&shape).try_to_vec()?;
        let picks: Vec<i64> =
            flags.iter().enumerate().filter(|(_, f)| **f).map(|(i, _)| i as i64).collect();
        let n = picks.len();
        let flat = self.broadcast_to(&shape).try_reshape(&[-1])?;
        flat.try_gather(0, &Tensor::try_from_vec(picks, [n])?.try_to(self.device())?)
    }

    /// A copy with `value` where `mask` (broadcast) is true.
    ///
    /// # Panics
    /// As [`Tensor::try_masked_fill`] fails.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], [3]);
    /// assert_eq!(x.masked_fill(&x.lt(0.0), 0.0).to_vec::<f32>(), vec![1.0, 0.0, 3.0]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Tensor {
        ok(self.try_masked_fill(mask, value))
    }

    /// [`Tensor::masked_fill`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::DType`] for a non-bool mask; [`Error::Shape`] when the mask does not
    /// broadcast to this tensor's shape.
    #[track_caller]
    pub fn try_masked_fill(&self, mask: &Tensor, value: impl Into<Scalar>) -> Result<Tensor> {
        check_mask("masked_fill", mask)?;
        let shape = self.shape().broadcast(mask.shape(), "masked_fill")?;
        if &shape != self.shape() {
            return Err(Error::shape(
                "masked_fill",
                format!(
                    "a mask of shape {} does not broadcast to the tensor's shape {}",
                    mask.shape(),
                    self.shape()
                ),
            ));
        }
        let value = Tensor::full_dtype((), value.into(), self.dtype());
        Tensor::try_where_(mask, &value, self)
    }

    /// Joins tensors along `dim`; all other dimensions must agree. Dtypes are promoted.
    ///
    /// # Panics
    /// As [`Tensor::try_cat`] fails.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let a = Tensor::zeros([2, 1]);
    /// let b = Tensor::ones([2, 2]);
    /// let c = Tensor::cat(&[&a, &b], 1);
    /// assert_eq!(c.to_vec::<f32>(), vec![0.0, 1.0, 1.0, 0.0, 1.0, 1.0]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn cat(tensors: &[&Tensor], dim: i64) -> Tensor {
        ok(Tensor::try_cat(tensors, dim))
    }

    /// [`Tensor::cat`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] for an empty list, differing ranks, or differing sizes outside
    /// `dim`; [`Error::Index`] for a bad `dim`.
    #[track_caller]
    pub fn try_cat(tensors: &[&Tensor], dim: i64) -> Result<Tensor> {
        let Some(first) = tensors.first() else {
            return Err(Error::shape("cat", "needs at least one tensor"));
        };
        let axis = normalize_axis("cat", dim, first.ndim())?;
        for (i, t) in tensors.iter().enumerate() {
            let same_rank = t.ndim() == first.ndim();
            let same_dims =
                same_rank && (0..t.ndim()).all(|d| d == axis || t.dims()[d] == first.dims()[d]);
            if !same_dims {
                return Err(Error::shape(
                    "cat",
                    format!(
                        "tensor {i} has shape {} but tensor 0 has shape {}; all dimensions except {axis} must match",
                        t.shape(),
                        first.shape()
                    ),
                ));
            }
        }
        let dtype = tensors
            .iter()
            .map(|t| t.dtype())
            .reduce(DType::promote)
            .expect("the list is not empty");
        let mut dims = first.dims().to_vec();
        dims[axis] = tensors.iter().map(|t| t.dims()[axis]).sum();
        let shape = Shape::new(dims);
        let pieces: Vec<Tensor> = tensors.iter().map(|t| t.to_dtype(dtype)).collect();
        // The gradient of each piece is a view of the result's: recorded as one node, not
        // as the chain of writes below, whose gradient would copy the whole result once
        // per piece (masking the later pieces' slots), quadratic in their number.
        let differentiable =
            super::grad_mode::is_grad_enabled() && pieces.iter().any(Tensor::requires_grad);
        // Each piece is written into its slot of the result, starting from zeros on the
        // pieces' device.
        let zeros = Op::Full(kiln_ir::Scalar::I64(0));
        let mut out = Tensor::from_leaf_on(zeros, shape.clone(), dtype, first.device())?;
        let mut slots = Vec::with_capacity(pieces.len());
        let mut offset = 0;
        for t in &pieces {
            let len = t.dims()[axis];
            slots.push((offset, len));
            if len > 0 {
                let slot = View::contiguous(shape.clone()).narrow(axis, offset, len);
                let piece = if differentiable { t.detach() } else { t.clone() };
                out = Tensor::from_op(Op::Assign(slot), &[&out, &piece])?;
            }
            offset += len;
        }
        if differentiable {
            let op = Op::Assign(View::contiguous(shape));
            let refs: Vec<&Tensor> = pieces.iter().collect();
            let backward = move |_: &[Tensor], g: &Tensor| -> Result<Vec<Option<Tensor>>> {
                slots
                    .iter()
                    .map(|&(at, len)| g.try_narrow(axis as i64, at, len).map(Some))
                    .collect()
            };
            super::history::attach_composite(&out, op, &refs, std::sync::Arc::new(backward));
        }
        Ok(out)
    }

    /// Joins tensors of one shape along a new dimension `dim`.
    ///
    /// # Panics
    /// As [`Tensor::try_stack`] fails.
    #[must_use]
    #[track_caller]
    pub fn stack(tensors: &[&Tensor], dim: i64) -> Tensor {
        ok(Tensor::try_stack(tensors, dim))
    }

    /// [`Tensor::stack`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] for an empty list or differing shapes; [`Error::Index`] for a bad
    /// `dim`.
    #[track_caller]
    pub fn try_stack(tensors: &[&Tensor], dim: i64) -> Result<Tensor> {
        let Some(first) = tensors.first() else {
            return Err(Error::shape("stack", "needs at least one tensor"));
        };
        if let Some((i, t)) = tensors.iter().enumerate().find(|(_, t)| t.shape() != first.shape()) {
            return Err(Error::shape(
                "stack",
                format!(
                    "tensor {i} has shape {} but tensor 0 has shape {}; stacked tensors must match",
                    t.shape(),
                    first.shape()
                ),
            ));
        }
        let axis = normalize_axis("stack", dim, first.ndim() + 1)?;
        let parts: Vec<Tensor> =
            tensors.iter().map(|t| t.try_unsqueeze(axis as i64)).collect::<Result<_>>()?;
        Tensor::try_cat(&parts.iter().collect::<Vec<_>>(), axis as i64)
    }

    /// Views of consecutive pieces of `size` elements along `dim` (the last may be smaller).
    ///
    /// # Panics
    /// If `size` is 0 or `dim` is out of range.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let parts = Tensor::arange(0i64, 5, 1).split(2, 0);
    /// assert_eq!(parts.iter().map(|p| p.to_vec::<i64>()).collect::<Vec<_>>(), vec![vec![0, 1], vec![2, 3], vec![4]]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn split(&self, size: usize, dim: i64) -> Vec<Tensor> {
        ok(self.try_split(size, dim))
    }

    /// [`Tensor::split`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when `size` is 0; [`Error::Index`] for a bad `dim`.
    #[track_caller]
    pub fn try_split(&self, size: usize, dim: i64) -> Result<Vec<Tensor>> {
        let axis = normalize_axis("split", dim, self.ndim())?;
        if size == 0 {
            return Err(Error::shape("split", "the piece size must be positive"));
        }
        let total = self.dims()[axis];
        (0..total.div_ceil(size))
            .map(|k| self.try_narrow(axis as i64, k * size, size.min(total - k * size)))
            .collect()
    }

    /// `chunks` views of (nearly) equal size along `dim`, as PyTorch's `chunk`: pieces of
    /// `ceil(n / chunks)` elements, so there may be fewer than `chunks`.
    ///
    /// # Panics
    /// If `chunks` is 0 or `dim` is out of range.
    #[must_use]
    #[track_caller]
    pub fn chunk(&self, chunks: usize, dim: i64) -> Vec<Tensor> {
        ok(self.try_chunk(chunks, dim))
    }

    /// [`Tensor::chunk`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when `chunks` is 0; [`Error::Index`] for a bad `dim`.
    #[track_caller]
    pub fn try_chunk(&self, chunks: usize, dim: i64) -> Result<Vec<Tensor>> {
        let axis = normalize_axis("chunk", dim, self.ndim())?;
        if chunks == 0 {
            return Err(Error::shape("chunk", "the number of chunks must be positive"));
        }
        self.try_split(self.dims()[axis].div_ceil(chunks).max(1), axis as i64)
    }

    /// Tiles the tensor: dimension `i` repeated `repeats[i]` times (extra leading repeats add
    /// dimensions), as PyTorch's `repeat`.
    ///
    /// # Panics
    /// As [`Tensor::try_repeat`] fails.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1i64, 2], [2]);
    /// assert_eq!(x.repeat(&[2, 2]).to_vec::<i64>(), vec![1, 2, 1, 2, 1, 2, 1, 2]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn repeat(&self, repeats: &[usize]) -> Tensor {
        ok(self.try_repeat(repeats))
    }

    /// [`Tensor::repeat`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when `repeats` has fewer entries than the tensor has dimensions.
    #[track_caller]
    pub fn try_repeat(&self, repeats: &[usize]) -> Result<Tensor> {
        if repeats.len() < self.ndim() {
            return Err(Error::shape(
                "repeat",
                format!(
                    "got {} repeats for a tensor of rank {}; give one per dimension",
                    repeats.len(),
                    self.ndim()
                ),
            ));
        }
        let extra = repeats.len() - self.ndim();
        let mut dims: Vec<usize> = vec![1; extra];
        dims.extend_from_slice(self.dims());
        // [d0, d1, ..] -> [1, d0, 1, d1, ..] -> expand [r0, d0, r1, d1, ..] -> [r0*d0, r1*d1, ..]
        let interleaved: Vec<i64> = dims.iter().flat_map(|&d| [1, d as i64]).collect();
        let expanded: Vec<i64> =
            dims.iter().zip(repeats).flat_map(|(&d, &r)| [r as i64, d as i64]).collect();
        let result: Vec<i64> = dims.iter().zip(repeats).map(|(&d, &r)| (d * r) as i64).collect();
        self.try_reshape(&interleaved)?.try_expand(&expanded)?.try_reshape(&result)
    }

    /// A copy with the order of elements reversed along each of `dims`.
    ///
    /// # Panics
    /// If a dimension is out of range.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let x = Tensor::arange(0i64, 6, 1).view(&[2, 3]);
    /// assert_eq!(x.flip(&[1]).to_vec::<i64>(), vec![2, 1, 0, 5, 4, 3]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn flip(&self, dims: &[i64]) -> Tensor {
        ok(self.try_flip(dims))
    }

    /// [`Tensor::flip`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] when a dimension is out of range.
    #[track_caller]
    pub fn try_flip(&self, dims: &[i64]) -> Result<Tensor> {
        let axes: Vec<usize> = dims
            .iter()
            .map(|&d| normalize_axis("flip", d, self.ndim()))
            .collect::<Result<_, _>>()?;
        // Flipping is a view with negative strides; PyTorch's flip copies, so this does too.
        Ok(self.restrided(|v| axes.iter().fold(v.clone(), |v, &a| v.flip(a))).copy())
    }

    /// The lower triangle of the last two dimensions (elements with `col - row <= diagonal`),
    /// zeros elsewhere.
    ///
    /// # Panics
    /// On a tensor of rank below 2.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// assert_eq!(Tensor::ones([2, 2]).tril(0).to_vec::<f32>(), vec![1.0, 0.0, 1.0, 1.0]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn tril(&self, diagonal: i64) -> Tensor {
        ok(self.triangle("tril", diagonal, true))
    }

    /// The upper triangle of the last two dimensions (elements with `col - row >= diagonal`),
    /// zeros elsewhere.
    ///
    /// # Panics
    /// On a tensor of rank below 2.
    #[must_use]
    #[track_caller]
    pub fn triu(&self, diagonal: i64) -> Tensor {
        ok(self.triangle("triu", diagonal, false))
    }

    #[track_caller]
    fn triangle(&self, op: &'static str, diagonal: i64, lower: bool) -> Result<Tensor> {
        let r = self.ndim();
        if r < 2 {
            return Err(Error::shape(
                op,
                format!("needs a tensor of rank 2 or more, got shape {}", self.shape()),
            ));
        }
        let (rows, cols) = (self.dims()[r - 2] as i64, self.dims()[r - 1] as i64);
        let row = Tensor::arange(0i64, rows, 1).try_to(self.device())?.try_unsqueeze(1)?;
        let col = Tensor::arange(0i64, cols, 1).try_to(self.device())?.try_unsqueeze(0)?;
        let offset = col.try_sub(&row)?;
        let keep = if lower { offset.try_le(diagonal)? } else { offset.try_ge(diagonal)? };
        Tensor::try_where_(&keep, self, Tensor::full_dtype((), 0, self.dtype()))
    }
}

fn check_mask(op: &'static str, mask: &Tensor) -> Result<()> {
    if mask.dtype() == DType::Bool {
        Ok(())
    } else {
        Err(Error::dtype(
            op,
            format!(
                "the mask must be a bool tensor, got {}; compare first (e.g. x.gt(0.0))",
                mask.dtype()
            ),
        ))
    }
}
