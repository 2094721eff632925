//! Ordering along a dimension: `argsort`, `sort`, `topk`; running products; `roll`.

use kiln_ir::{DType, Op, normalize_axis};

use super::Tensor;
use crate::error::ok;
use crate::{Error, Result};

impl Tensor {
    /// The positions that sort each line along `dim` (`i64`), ascending or `descending`.
    /// The sort is stable (equal elements keep their order, PyTorch's `stable=True`) and
    /// NaN sorts above every number. It runs as one library step (a parallel sort per line
    /// on the CPU; on a GPU, over a host copy, which the profile shows as host work).
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![3.0f32, 1.0, 2.0, 1.0], [4]);
    /// assert_eq!(x.argsort(0, false).to_vec::<i64>(), [1, 3, 2, 0]);
    /// assert_eq!(x.argsort(0, true).to_vec::<i64>(), [0, 2, 1, 3]);
    /// ```
    ///
    /// # Panics
    /// If `dim` is out of range.
    #[must_use]
    #[track_caller]
    pub fn argsort(&self, dim: i64, descending: bool) -> Tensor {
        ok(self.try_argsort(dim, descending))
    }

    /// [`Tensor::argsort`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] when `dim` is out of range.
    #[track_caller]
    pub fn try_argsort(&self, dim: i64, descending: bool) -> Result<Tensor> {
        let axis = normalize_axis("argsort", dim, self.ndim())?;
        Tensor::from_op(Op::ArgSort { axis, descending }, &[&self.detach()])
    }

    /// The sorted values along `dim` and the positions they came from (see
    /// [`Tensor::argsort`]). Gradients flow to the values' original positions.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![2.0f32, -1.0, 5.0, 0.0], [2, 2]);
    /// let (values, indices) = x.sort(1, true);
    /// assert_eq!(values.to_vec::<f32>(), [2.0, -1.0, 5.0, 0.0]);
    /// assert_eq!(indices.to_vec::<i64>(), [0, 1, 0, 1]);
    /// ```
    ///
    /// # Panics
    /// If `dim` is out of range.
    #[must_use]
    #[track_caller]
    pub fn sort(&self, dim: i64, descending: bool) -> (Tensor, Tensor) {
        ok(self.try_sort(dim, descending))
    }

    /// [`Tensor::sort`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] when `dim` is out of range.
    #[track_caller]
    pub fn try_sort(&self, dim: i64, descending: bool) -> Result<(Tensor, Tensor)> {
        let indices = self.try_argsort(dim, descending)?;
        Ok((self.try_gather(dim, &indices)?, indices))
    }

    /// The `k` largest (or, with `largest == false`, smallest) elements along `dim`, in
    /// order, and their positions (PyTorch's `topk` with `sorted=True`). Ties keep their
    /// order; NaN counts as the largest value.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let logits = Tensor::from_vec(vec![0.1f32, 2.0, -1.0, 0.7], [4]);
    /// let (values, indices) = logits.topk(2, -1, true);
    /// assert_eq!(values.to_vec::<f32>(), [2.0, 0.7]);
    /// assert_eq!(indices.to_vec::<i64>(), [1, 3]);
    /// ```
    ///
    /// # Panics
    /// If `dim` is out of range or `k` exceeds its size.
    #[must_use]
    #[track_caller]
    pub fn topk(&self, k: usize, dim: i64, largest: bool) -> (Tensor, Tensor) {
        ok(self.try_topk(k, dim, largest))
    }

    /// [`Tensor::topk`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] when `dim` is out of range; [`Error::Value`] when `k` exceeds the
    /// dimension's size.
    #[track_caller]
    pub fn try_topk(&self, k: usize, dim: i64, largest: bool) -> Result<(Tensor, Tensor)> {
        let axis = normalize_axis("topk", dim, self.ndim())?;
        let size = self.dims()[axis];
        if k > size {
            return Err(Error::value(
                "topk",
                format!(
                    "k = {k} is more than the {size} elements of dimension {dim} of shape {}",
                    self.shape()
                ),
            ));
        }
        let indices = self.try_argsort(dim, largest)?.try_narrow(dim, 0, k)?;
        Ok((self.try_gather(dim, &indices)?, indices))
    }

    /// The running product along `dim` (integers and bools multiply as `i64`), with exact
    /// gradients also where elements are zero. It is `⌈log2 n⌉` elementwise products of the
    /// tensor with shifted copies of itself (a Hillis–Steele scan), so it fuses and runs on
    /// every device as generated code.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [4]);
    /// assert_eq!(x.cumprod(0).to_vec::<f32>(), [1.0, 2.0, 6.0, 24.0]);
    /// ```
    ///
    /// # Panics
    /// If `dim` is out of range.
    #[must_use]
    #[track_caller]
    pub fn cumprod(&self, dim: i64) -> Tensor {
        ok(self.try_cumprod(dim))
    }

    /// [`Tensor::cumprod`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Index`] when `dim` is out of range.
    #[track_caller]
    pub fn try_cumprod(&self, dim: i64) -> Result<Tensor> {
        let axis = normalize_axis("cumprod", dim, self.ndim())?;
        let mut y = if self.dtype().is_float() { self.clone() } else { self.to_dtype(DType::I64) };
        let n = self.dims()[axis];
        let mut shift = 1;
        while shift < n {
            // y[k] *= y[k - shift], with ones in front.
            let ones = y.try_narrow(dim, 0, shift)?.full_like(1);
            let shifted = Tensor::try_cat(&[&ones, &y.try_narrow(dim, 0, n - shift)?], dim)?;
            y = y * shifted;
            shift *= 2;
        }
        Ok(y)
    }

    /// Rotates elements along each of `dims` by the matching shift (PyTorch's `roll`):
    /// element `i` moves to `(i + shift) mod n`. With no `dims`, the flattened tensor
    /// rolls and keeps its shape.
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let x = Tensor::arange(0.0f32, 6.0, 1.0).reshape(&[2, 3]);
    /// assert_eq!(x.roll(&[1], &[1]).to_vec::<f32>(), [2.0, 0.0, 1.0, 5.0, 3.0, 4.0]);
    /// assert_eq!(x.roll(&[-1], &[]).to_vec::<f32>(), [1.0, 2.0, 3.0, 4.0, 5.0, 0.0]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_roll`] fails.
    #[must_use]
    #[track_caller]
    pub fn roll(&self, shifts: &[i64], dims: &[i64]) -> Tensor {
        ok(self.try_roll(shifts, dims))
    }

    /// [`Tensor::roll`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when `shifts` and `dims` differ in length (or, without `dims`,
    /// there is not exactly one shift); [`Error::Index`] when a dimension is out of range.
    #[track_caller]
    pub fn try_roll(&self, shifts: &[i64], dims: &[i64]) -> Result<Tensor> {
        if dims.is_empty() {
            let &[shift] = shifts else {
                return Err(Error::shape(
                    "roll",
                    format!("without dims, roll takes one shift, got {shifts:?}"),
                ));
            };
            let dims: Vec<i64> = self.dims().iter().map(|&d| d as i64).collect();
            let flat = self.try_reshape(&[-1])?;
            return flat.try_roll(&[shift], &[0])?.try_reshape(&dims);
        }
        if shifts.len() != dims.len() {
            return Err(Error::shape(
                "roll",
                format!(
                    "got {} shifts for {} dims; give one shift per dim",
                    shifts.len(),
                    dims.len()
                ),
            ));
        }
        let mut out = self.clone();
        for (&shift, &dim) in shifts.iter().zip(dims) {
            let axis = normalize_axis("roll", dim, self.ndim())?;
            let n = self.dims()[axis] as i64;
            if n == 0 {
                continue;
            }
            let s = shift.rem_euclid(n) as usize;
            if s == 0 {
                continue;
            }
            let n = n as usize;
            let tail = out.try_narrow(dim, n - s, s)?;
            let head = out.try_narrow(dim, 0, n - s)?;
            out = Tensor::try_cat(&[&tail, &head], dim)?;
        }
        Ok(out)
    }
}
