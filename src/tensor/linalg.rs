//! Matrix products.

use kiln_ir::{Op, Shape};

use super::Tensor;
use crate::error::ok;
use crate::{Error, Result};

impl Tensor {
    /// The matrix product with PyTorch's rules: two vectors give their dot product; a vector
    /// on the left (right) is treated as a row (column) and that dimension is removed from
    /// the result; operands of rank 3 and more are batches of matrices whose batch
    /// dimensions broadcast.
    ///
    /// # Panics
    /// If the inner dimensions differ, batch dimensions do not broadcast, or the dtypes
    /// differ; [`Tensor::try_matmul`] returns the error.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
    /// let b = Tensor::ones([3]);
    /// assert_eq!(a.matmul(&b).to_vec::<f32>(), vec![6.0, 15.0]);
    /// let batch = Tensor::ones([5, 3, 4]);
    /// assert_eq!(a.matmul(&batch).dims(), &[5, 2, 4]);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Tensor {
        ok(self.try_matmul(rhs))
    }

    /// [`Tensor::matmul`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] for incompatible shapes (zero-dimensional operands included),
    /// [`Error::DType`] for differing or bool dtypes, [`Error::Device`] for two devices.
    #[track_caller]
    pub fn try_matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        // Under autocast, in its 16-bit type (`crate::autocast`).
        let (lhs, rhs) = (&self.autocast_lowered(), &rhs.autocast_lowered());
        let (ra, rb) = (lhs.ndim(), rhs.ndim());
        if ra == 0 || rb == 0 {
            return Err(Error::shape(
                "matmul",
                format!(
                    "both operands need at least one dimension, got shapes {} and {}; use * to multiply by a scalar",
                    lhs.shape(),
                    rhs.shape()
                ),
            ));
        }
        // Promote vectors to matrices, remembering which dimensions to drop again.
        let a = if ra == 1 { lhs.unsqueeze(0) } else { lhs.clone() };
        let b = if rb == 1 { rhs.unsqueeze(1) } else { rhs.clone() };
        let (ar, br) = (a.ndim(), b.ndim());
        let (m, k) = (a.dims()[ar - 2], a.dims()[ar - 1]);
        let (k2, n) = (b.dims()[br - 2], b.dims()[br - 1]);
        if k != k2 {
            return Err(Error::shape(
                "matmul",
                format!(
                    "shapes {} and {} are not compatible: {k} != {k2}",
                    lhs.shape(),
                    rhs.shape()
                ),
            ));
        }
        if ar >= 3 && br == 2 {
            return fold_batch(&a, &b, rb == 1);
        }
        let batch_a = Shape::from(&a.dims()[..ar - 2]);
        let batch_b = Shape::from(&b.dims()[..br - 2]);
        let batch = batch_a.broadcast(&batch_b, "matmul").map_err(|_| {
            Error::shape(
                "matmul",
                format!(
                    "batch dimensions {batch_a} and {batch_b} of shapes {} and {} cannot be broadcast together",
                    lhs.shape(),
                    rhs.shape()
                ),
            )
        })?;
        let with = |rows: usize, cols: usize| {
            let mut d = batch.dims().to_vec();
            d.extend([rows, cols]);
            Shape::new(d)
        };
        let a = a.broadcast_to(&with(m, k));
        let b = b.broadcast_to(&with(k, n));
        let out = Tensor::from_op(Op::MatMul, &[&a, &b])?;
        let rank = out.ndim() as i64;
        Ok(match (ra, rb) {
            (1, 1) => out.squeeze(-1).squeeze(-1),
            (1, _) => out.squeeze(rank - 2),
            (_, 1) => out.squeeze(rank - 1),
            _ => out,
        })
    }

    /// The product of two matrices (both of rank 2).
    ///
    /// # Panics
    /// If either operand is not a matrix or the shapes do not fit; [`Tensor::try_mm`]
    /// returns the error.
    #[must_use]
    #[track_caller]
    pub fn mm(&self, rhs: &Tensor) -> Tensor {
        ok(self.try_mm(rhs))
    }

    /// [`Tensor::mm`], returning an error instead of panicking.
    ///
    /// # Errors
    /// As [`Tensor::try_matmul`], and [`Error::Shape`] unless both operands have rank 2.
    #[track_caller]
    pub fn try_mm(&self, rhs: &Tensor) -> Result<Tensor> {
        self.expect_ranks("mm", rhs, 2)?;
        self.try_matmul(rhs).map_err(|e| e.reported_as("mm"))
    }

    /// The batched product of `[b, n, m]` and `[b, m, p]` tensors.
    ///
    /// # Panics
    /// If either operand is not of rank 3 or the shapes do not fit; [`Tensor::try_bmm`]
    /// returns the error.
    #[must_use]
    #[track_caller]
    pub fn bmm(&self, rhs: &Tensor) -> Tensor {
        ok(self.try_bmm(rhs))
    }

    /// [`Tensor::bmm`], returning an error instead of panicking.
    ///
    /// # Errors
    /// As [`Tensor::try_matmul`], and [`Error::Shape`] unless both operands have rank 3 and
    /// the same batch size.
    #[track_caller]
    pub fn try_bmm(&self, rhs: &Tensor) -> Result<Tensor> {
        self.expect_ranks("bmm", rhs, 3)?;
        if self.dims()[0] != rhs.dims()[0] {
            return Err(Error::shape(
                "bmm",
                format!(
                    "batch sizes differ: shapes {} and {}; bmm does not broadcast (matmul does)",
                    self.shape(),
                    rhs.shape()
                ),
            ));
        }
        self.try_matmul(rhs).map_err(|e| e.reported_as("bmm"))
    }

    /// The dot product of two vectors of one length, as a zero-dimensional tensor.
    ///
    /// # Panics
    /// If either operand is not a vector or the lengths differ; [`Tensor::try_dot`] returns
    /// the error.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let a = Tensor::from_vec(vec![1i64, 2, 3], [3]);
    /// assert_eq!(a.dot(&a).item::<i64>(), 14);
    /// ```
    #[must_use]
    #[track_caller]
    pub fn dot(&self, rhs: &Tensor) -> Tensor {
        ok(self.try_dot(rhs))
    }

    /// [`Tensor::dot`], returning an error instead of panicking.
    ///
    /// # Errors
    /// As [`Tensor::try_matmul`], and [`Error::Shape`] unless both operands are vectors.
    #[track_caller]
    pub fn try_dot(&self, rhs: &Tensor) -> Result<Tensor> {
        self.expect_ranks("dot", rhs, 1)?;
        self.try_matmul(rhs).map_err(|e| e.reported_as("dot"))
    }
}

/// A batch of matrices times one matrix, as one product with the batch folded into the rows
/// (PyTorch's rule too): `[.., m, k] @ [k, n]` is `[(..)·m, k] @ [k, n]` reshaped back. The
/// batched form would broadcast the matrix to every batch entry, run many small products,
/// and its gradient would be a product per entry summed over the batch; folded, the
/// weight's gradient is one product over all rows. The reshape is a view whenever the
/// batch's layout allows.
#[track_caller]
fn fold_batch(a: &Tensor, b: &Tensor, drop_col: bool) -> Result<Tensor> {
    let dims = a.dims();
    let (rows, k) = (dims[..dims.len() - 1].iter().product::<usize>(), dims[dims.len() - 1]);
    let flat = a.try_reshape(&[rows as i64, k as i64])?;
    let out = Tensor::from_op(Op::MatMul, &[&flat, b])?;
    let mut shape: Vec<i64> = dims[..dims.len() - 1].iter().map(|&d| d as i64).collect();
    if !drop_col {
        shape.push(b.dims()[1] as i64);
    }
    out.try_reshape(&shape)
}

impl Tensor {
    fn expect_ranks(&self, op: &'static str, rhs: &Tensor, rank: usize) -> Result<()> {
        if self.ndim() == rank && rhs.ndim() == rank {
            return Ok(());
        }
        Err(Error::shape(
            op,
            format!(
                "expects two tensors of rank {rank}, got shapes {} and {}; matmul handles other ranks",
                self.shape(),
                rhs.shape()
            ),
        ))
    }
}

impl Tensor {
    /// The outer product of two vectors, `[n] × [m] -> [n, m]` (PyTorch's `outer`).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let a = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    /// let b = Tensor::from_vec(vec![3.0f32, 4.0, 5.0], [3]);
    /// assert_eq!(a.outer(&b).to_vec::<f32>(), [3.0, 4.0, 5.0, 6.0, 8.0, 10.0]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_outer`] fails.
    #[must_use]
    #[track_caller]
    pub fn outer(&self, rhs: &Tensor) -> Tensor {
        ok(self.try_outer(rhs))
    }

    /// [`Tensor::outer`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] unless both are 1-D.
    #[track_caller]
    pub fn try_outer(&self, rhs: &Tensor) -> Result<Tensor> {
        self.expect_ranks("outer", rhs, 1)?;
        self.try_unsqueeze(1)?.try_mul(&rhs.try_unsqueeze(0)?)
    }

    /// `beta · self + alpha · (m1 @ m2)` for matrices `m1 [n, k]`, `m2 [k, m]` and `self`
    /// broadcast to `[n, m]` (PyTorch's `addmm`; with `beta` 0, `self` is not read, so its
    /// NaN do not propagate).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let bias = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0], [1, 2]);
    /// let w = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 1.0], [2, 2]);
    /// assert_eq!(bias.addmm(&x, &w, 1.0, 2.0).to_vec::<f32>(), [3.0, 6.0]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_addmm`] fails.
    #[must_use]
    #[track_caller]
    pub fn addmm(&self, m1: &Tensor, m2: &Tensor, beta: f64, alpha: f64) -> Tensor {
        ok(self.try_addmm(m1, m2, beta, alpha))
    }

    /// [`Tensor::addmm`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] unless `m1` and `m2` are matrices whose inner sizes agree and `self`
    /// broadcasts to their product's shape.
    #[track_caller]
    pub fn try_addmm(&self, m1: &Tensor, m2: &Tensor, beta: f64, alpha: f64) -> Result<Tensor> {
        m1.expect_ranks("addmm", m2, 2)?;
        self.try_addmm_like("addmm", m1.try_matmul(m2)?, beta, alpha)
    }

    /// `beta · self + alpha · product`, `self` broadcast to the product's shape (and not
    /// read when `beta` is 0), for `addmm` and `baddbmm`.
    fn try_addmm_like(
        &self,
        op: &'static str,
        product: Tensor,
        beta: f64,
        alpha: f64,
    ) -> Result<Tensor> {
        let scaled = if alpha == 1.0 { product } else { product * alpha };
        if beta == 0.0 {
            self.shape().broadcast(scaled.shape(), op)?;
            return Ok(scaled);
        }
        let base = if beta == 1.0 { self.clone() } else { self * beta };
        let out = scaled.try_add(&base)?;
        if out.shape() != scaled.shape() {
            return Err(Error::shape(
                op,
                format!(
                    "self of shape {} does not broadcast to the product's shape {}",
                    self.shape(),
                    scaled.shape()
                ),
            ));
        }
        Ok(out)
    }

    /// `beta · self + alpha · (batch1 @ batch2)` for batches of matrices `[b, n, m]` and
    /// `[b, m, p]` (PyTorch's `baddbmm`), `self` broadcast to `[b, n, p]`; with `beta` 0,
    /// `self` is not read (NaNs in it do not propagate).
    ///
    /// ```
    /// use kiln::prelude::*;
    /// let b1 = Tensor::ones([2, 1, 3]);
    /// let b2 = Tensor::ones([2, 3, 1]);
    /// let y = Tensor::ones([1]).baddbmm(&b1, &b2, 0.5, 2.0);
    /// assert_eq!(y.to_vec::<f32>(), [6.5, 6.5]);
    /// ```
    ///
    /// # Panics
    /// As [`Tensor::try_baddbmm`] fails.
    #[must_use]
    #[track_caller]
    pub fn baddbmm(&self, batch1: &Tensor, batch2: &Tensor, beta: f64, alpha: f64) -> Tensor {
        ok(self.try_baddbmm(batch1, batch2, beta, alpha))
    }

    /// [`Tensor::baddbmm`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] unless the batches are 3-D with equal batch and inner sizes and
    /// `self` broadcasts to their product's shape.
    #[track_caller]
    pub fn try_baddbmm(
        &self,
        batch1: &Tensor,
        batch2: &Tensor,
        beta: f64,
        alpha: f64,
    ) -> Result<Tensor> {
        batch1.expect_ranks("baddbmm", batch2, 3)?;
        if batch1.dims()[0] != batch2.dims()[0] {
            return Err(Error::shape(
                "baddbmm",
                format!("the batches hold {} and {} matrices", batch1.dims()[0], batch2.dims()[0]),
            ));
        }
        self.try_addmm_like("baddbmm", batch1.try_matmul(batch2)?, beta, alpha)
    }
}
