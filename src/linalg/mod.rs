//! Dense linear algebra, PyTorch's `torch.linalg`: `cholesky`, `solve`, `solve_triangular`,
//! `inv`, `det`, `slogdet`, `eigh`, `qr`, `svd`, `svdvals` and `lstsq`, batched over leading
//! dimensions, with PyTorch's gradients; and the compositions of `derived.rs` (norms,
//! `cross`, `vecdot`, `multi_dot`, `matrix_power`, `pinv`, `matrix_rank`, `cond`,
//! `eigvalsh`, `vander`).
//!
//! Each is an [`crate::ops::Opaque`] op whose CPU implementation calls
//! [`faer`](https://docs.rs/faer) on each matrix of the batch (matrices split across
//! threads; a transposed or sliced input is read through its strides), and whose backward is
//! written with kiln ops, so gradients of gradients work too. f32 and f64; 16-bit inputs are
//! computed in f32 under autocast. A CUDA tensor is factorized on the host: its matrices are
//! copied there and the result back, both shown as copies in profiles.
//!
//! ```
//! use kiln::linalg;
//! use kiln::prelude::*;
//! let a = Tensor::from_vec(vec![4.0f64, 2.0, 2.0, 3.0], [2, 2]);
//! let b = Tensor::from_vec(vec![2.0f64, 1.0], [2]);
//! let x = linalg::solve(&a, &b);
//! assert_eq!(a.matmul(&x).to_vec::<f64>(), vec![2.0, 1.0]);
//! assert_eq!(linalg::det(&a).item::<f64>(), 8.0);
//! let l = linalg::cholesky(&a, false);
//! let back = l.matmul(&l.transpose(-2, -1)).to_vec::<f64>();
//! assert!(back.iter().zip([4.0, 2.0, 2.0, 3.0]).all(|(x, y)| (x - y).abs() < 1e-12));
//! ```

mod derived;
mod kernels;

pub use derived::{
    MatrixOrd, cond, cross, eigvalsh, matrix_norm, matrix_power, matrix_rank, multi_dot, pinv,
    try_cross, try_matrix_norm, try_multi_dot, try_vector_norm, vander, vecdot, vector_norm,
};

use kiln_ir::{DType, Shape};

use crate::error::{Error, Result, ok};
use crate::tensor::Tensor;

/// The batch dimensions of `a` (`[.., n, n]`) and `b` (`[.., n, k]`) broadcast together, and
/// both expanded to them: `(a, b)`.
fn broadcast_batches(op: &'static str, a: &Tensor, b: &Tensor) -> Result<(Tensor, Tensor)> {
    let (ra, rb) = (a.ndim(), b.ndim());
    let batch_a = Shape::from(&a.dims()[..ra - 2]);
    let batch_b = Shape::from(&b.dims()[..rb - 2]);
    let batch = batch_a.broadcast(&batch_b, op).map_err(|_| Error::Shape {
        op,
        detail: format!(
            "the batch dimensions of A (shape {}) and B (shape {}) do not broadcast",
            a.shape(),
            b.shape()
        ),
    })?;
    let to = |t: &Tensor, tail: &[usize]| -> Result<Tensor> {
        let dims: Vec<i64> = batch.dims().iter().chain(tail).map(|&d| d as i64).collect();
        t.try_expand(&dims)
    };
    Ok((to(a, &a.dims()[ra - 2..])?, to(b, &b.dims()[rb - 2..])?))
}

/// Checks that `a` is a batch of square matrices of a float dtype.
fn square(op: &'static str, a: &Tensor) -> Result<usize> {
    let d = a.dims();
    if d.len() < 2 || d[d.len() - 1] != d[d.len() - 2] {
        return Err(Error::Shape {
            op,
            detail: format!(
                "A must be a batch of square matrices, of shape [.., n, n]; got {}",
                a.shape()
            ),
        });
    }
    if !a.dtype().is_float() {
        return Err(Error::DType {
            op,
            detail: format!(
                "A must be a float tensor, got {}; convert it with .float()",
                a.dtype()
            ),
        });
    }
    Ok(d[d.len() - 1])
}

/// `a` in the dtype the factorization runs in (f32 for 16-bit floats).
#[track_caller]
fn computable(a: &Tensor) -> Tensor {
    if matches!(a.dtype(), DType::F16 | DType::BF16) { a.to_dtype(DType::F32) } else { a.clone() }
}

/// `t` in `dtype`.
#[track_caller]
fn returned(t: Tensor, dtype: DType) -> Tensor {
    if t.dtype() == dtype { t } else { t.to_dtype(dtype) }
}

/// The last two dimensions swapped.
#[track_caller]
fn mt(t: &Tensor) -> Tensor {
    t.transpose(-2, -1)
}

/// The lower Cholesky factor `L` of each symmetric positive-definite matrix of `a`
/// (`A = L Lᵀ`), or the upper one (`A = Uᵀ U`) with `upper` (PyTorch's
/// `torch.linalg.cholesky`). Only the lower triangle of `a` is read.
///
/// # Panics
/// As [`try_cholesky`] fails.
#[track_caller]
pub fn cholesky(a: &Tensor, upper: bool) -> Tensor {
    ok(try_cholesky(a, upper))
}

/// [`cholesky`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] unless `a` is `[.., n, n]`; [`Error::DType`] for a non-float `a`. A
/// matrix that is not positive-definite fails when the result is computed, naming the
/// matrix and the leading minor that is not.
#[track_caller]
pub fn try_cholesky(a: &Tensor, upper: bool) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    square("linalg.cholesky", a)?;
    let u = returned(kernels::CHOLESKY.try_call(&[&computable(a)])?, a.dtype());
    Ok(if upper { u } else { mt(&u) })
}

/// `X` with `A X = B` for each triangular matrix `A` of `a` (its lower triangle, or with
/// `upper` its upper one; the other is not read) and each `B` of `b` (`[.., n, k]`; batch
/// dimensions broadcast), as PyTorch's `torch.linalg.solve_triangular(A, B, upper=upper)`.
///
/// # Panics
/// As [`try_solve_triangular`] fails.
#[track_caller]
pub fn solve_triangular(a: &Tensor, b: &Tensor, upper: bool) -> Tensor {
    ok(try_solve_triangular(a, b, upper))
}

/// [`solve_triangular`], returning an error instead of panicking.
///
/// # Errors
/// As [`try_solve`].
#[track_caller]
pub fn try_solve_triangular(a: &Tensor, b: &Tensor, upper: bool) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    let op = "linalg.solve_triangular";
    let n = square(op, a)?;
    matrix_rhs(op, b, n)?;
    same_dtype(op, a, b)?;
    let (a2, b2) = broadcast_batches(op, &computable(a), &computable(b))?;
    let def = if upper { &*kernels::SOLVE_UPPER } else { &*kernels::SOLVE_LOWER };
    Ok(returned(def.try_call(&[&a2, &b2])?, a.dtype()))
}

/// Checks that `a` and `b` have one dtype, as PyTorch requires.
fn same_dtype(op: &'static str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.dtype() != b.dtype() {
        return Err(Error::DType {
            op,
            detail: format!(
                "A ({}) and B ({}) must have the same dtype; convert one with .to_dtype()",
                a.dtype(),
                b.dtype()
            ),
        });
    }
    Ok(())
}

/// Checks that `b` is `[.., n, k]` for an `A` of size `n`.
fn matrix_rhs(op: &'static str, b: &Tensor, n: usize) -> Result<()> {
    let d = b.dims();
    if d.len() < 2 || d[d.len() - 2] != n {
        return Err(Error::Shape {
            op,
            detail: format!(
                "B must be [.., {n}, k] for an A of shape [.., {n}, {n}]; got {}",
                b.shape()
            ),
        });
    }
    Ok(())
}

/// `X` with `A X = B` for each matrix of `a` (`[.., n, n]`) and `b` (`[.., n, k]`, or `[n]`
/// or `[.., n]` with `a`'s batch: a vector), by LU with partial pivoting (PyTorch's
/// `torch.linalg.solve`).
///
/// # Panics
/// As [`try_solve`] fails.
#[track_caller]
pub fn solve(a: &Tensor, b: &Tensor) -> Tensor {
    ok(try_solve(a, b))
}

/// [`solve`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] for shapes that do not fit; [`Error::DType`] for non-float inputs. A
/// singular matrix fails when the result is computed, naming it.
#[track_caller]
pub fn try_solve(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    let op = "linalg.solve";
    let n = square(op, a)?;
    // PyTorch's rule: B is a vector when it is 1-d, or has A's batch and one dimension less.
    let vector = b.ndim() == 1
        || (b.ndim() == a.ndim() - 1 && b.dims()[..b.ndim() - 1] == a.dims()[..a.ndim() - 2]);
    let bm = if vector { b.try_unsqueeze(-1)? } else { b.clone() };
    matrix_rhs(op, &bm, n)?;
    same_dtype(op, a, b)?;
    let (a2, b2) = broadcast_batches(op, &computable(a), &computable(&bm))?;
    let x = returned(kernels::SOLVE.try_call(&[&a2, &b2])?, a.dtype());
    if vector { x.try_squeeze(-1) } else { Ok(x) }
}

/// The inverse of each matrix of `a` (`[.., n, n]`), by LU with partial pivoting (PyTorch's
/// `torch.linalg.inv`).
///
/// # Panics
/// As [`try_inv`] fails.
#[track_caller]
pub fn inv(a: &Tensor) -> Tensor {
    ok(try_inv(a))
}

/// [`inv`], returning an error instead of panicking.
///
/// # Errors
/// As [`try_solve`].
#[track_caller]
pub fn try_inv(a: &Tensor) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    square("linalg.inv", a)?;
    Ok(returned(kernels::INV.try_call(&[&computable(a)])?, a.dtype()))
}

/// The determinant of each matrix of `a` (`[.., n, n]` gives `[..]`), by LU with partial
/// pivoting (PyTorch's `torch.linalg.det`). Its gradient is `det(A) · A⁻ᵀ`, defined where
/// `A` is invertible (at a singular matrix the backward fails, naming it).
///
/// # Panics
/// As [`try_det`] fails.
#[track_caller]
pub fn det(a: &Tensor) -> Tensor {
    ok(try_det(a))
}

/// [`det`], returning an error instead of panicking.
///
/// # Errors
/// As [`try_cholesky`], for the shape and dtype.
#[track_caller]
pub fn try_det(a: &Tensor) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    square("linalg.det", a)?;
    Ok(returned(kernels::DET.try_call(&[&computable(a)])?, a.dtype()))
}

/// The sign and the natural logarithm of the absolute value of the determinant of each
/// matrix of `a` (PyTorch's `torch.linalg.slogdet`): `(sign, logabsdet)`, each `[..]`. A
/// singular matrix gives sign 0 and `-inf`.
///
/// # Panics
/// As [`try_slogdet`] fails.
#[track_caller]
pub fn slogdet(a: &Tensor) -> (Tensor, Tensor) {
    ok(try_slogdet(a))
}

/// [`slogdet`], returning an error instead of panicking.
///
/// # Errors
/// As [`try_det`].
#[track_caller]
pub fn try_slogdet(a: &Tensor) -> Result<(Tensor, Tensor)> {
    let _at = crate::engine::origin::enter();
    square("linalg.slogdet", a)?;
    let packed = returned(kernels::SLOGDET.try_call(&[&computable(a)])?, a.dtype());
    let sign = packed.try_select(-1, 0)?.detach();
    Ok((sign, packed.try_select(-1, 1)?))
}

/// The eigenvalues (ascending, `[.., n]`) and eigenvectors (the columns of `[.., n, n]`) of
/// each symmetric matrix of `a`, reading its lower triangle (PyTorch's
/// `torch.linalg.eigh(A)`). An eigenvector's sign is not unique; the gradient is defined
/// where the eigenvalues are distinct (repeated ones give infinities, as in PyTorch).
///
/// # Panics
/// As [`try_eigh`] fails.
#[track_caller]
pub fn eigh(a: &Tensor) -> (Tensor, Tensor) {
    ok(try_eigh(a))
}

/// [`eigh`], returning an error instead of panicking.
///
/// # Errors
/// As [`try_det`].
#[track_caller]
pub fn try_eigh(a: &Tensor) -> Result<(Tensor, Tensor)> {
    let _at = crate::engine::origin::enter();
    let n = square("linalg.eigh", a)?;
    let packed = returned(kernels::EIGH.try_call(&[&computable(a)])?, a.dtype());
    Ok((packed.try_select(-2, 0)?, packed.try_narrow(-2, 1, n)?))
}

/// The reduced QR factorization of each matrix of `a` (`[.., m, n]`): `Q` (`[.., m, k]`,
/// orthonormal columns) and `R` (`[.., k, n]`, upper triangular), `k = min(m, n)`, by
/// Householder reflections (PyTorch's `torch.linalg.qr(A)`, mode `reduced`). The signs of
/// `R`'s diagonal are the factorization's (as LAPACK's, not made positive). Gradients for
/// `m ≥ n`.
///
/// # Panics
/// As [`try_qr`] fails.
#[track_caller]
pub fn qr(a: &Tensor) -> (Tensor, Tensor) {
    ok(try_qr(a))
}

/// [`qr`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] for fewer than two dimensions; [`Error::DType`] for a non-float `a`.
#[track_caller]
pub fn try_qr(a: &Tensor) -> Result<(Tensor, Tensor)> {
    let _at = crate::engine::origin::enter();
    matrix_dims("linalg.qr", a)?;
    let packed = returned(kernels::QR.try_call(&[&computable(a)])?, a.dtype());
    unpack_qr(&packed, a.dims())
}

/// The least-squares solution `X` minimizing `‖A X - B‖` for each full-rank matrix `A` of
/// `a` with at least as many rows as columns (`[.., m, n]`, `m ≥ n`) and `B` of `b`
/// (`[.., m, k]`), by QR: `X = R⁻¹ Qᵀ B` (PyTorch's `torch.linalg.lstsq(A, B).solution`; the
/// residuals, rank and singular values it also returns are not computed). Differentiable
/// through the QR factorization and the triangular solve.
///
/// # Panics
/// As [`try_lstsq`] fails.
#[track_caller]
pub fn lstsq(a: &Tensor, b: &Tensor) -> Tensor {
    ok(try_lstsq(a, b))
}

/// [`lstsq`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] for a wide `A` or a `B` whose rows do not match; as [`try_qr`].
#[track_caller]
pub fn try_lstsq(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    let op = "linalg.lstsq";
    let (m, n) = matrix_dims(op, a)?;
    if m < n {
        return Err(Error::Shape {
            op,
            detail: format!(
                "A of shape {} has fewer rows than columns; kiln's lstsq solves full-rank \
                 systems with m ≥ n (for a wide A, solve the transposed problem)",
                a.shape()
            ),
        });
    }
    matrix_rhs(op, b, m)?;
    let (q, r) = try_qr(a)?;
    same_dtype(op, a, b)?;
    let qtb = mt(&q).try_matmul(b)?;
    try_solve_triangular(&r, &qtb, true)
}

/// The rows and columns of a batch of matrices of a float dtype.
fn matrix_dims(op: &'static str, a: &Tensor) -> Result<(usize, usize)> {
    let d = a.dims();
    if d.len() < 2 {
        return Err(Error::Shape {
            op,
            detail: format!(
                "A must be a batch of matrices, of shape [.., m, n]; got {}",
                a.shape()
            ),
        });
    }
    if !a.dtype().is_float() {
        return Err(Error::DType {
            op,
            detail: format!(
                "A must be a float tensor, got {}; convert it with .float()",
                a.dtype()
            ),
        });
    }
    Ok(last_two(d))
}

/// The reduced singular value decomposition of each matrix of `a` (`[.., m, n]`): `U`
/// (`[.., m, k]`), the singular values `S` (`[.., k]`, descending) and `Vᵀ` (`[.., k, n]`),
/// `k = min(m, n)` (PyTorch's `torch.linalg.svd(A, full_matrices=False)`). Singular vectors'
/// signs are not unique; the gradient is defined where the singular values are distinct
/// and non-zero (else infinities, as in PyTorch).
///
/// # Panics
/// As [`try_svd`] fails.
#[track_caller]
pub fn svd(a: &Tensor) -> (Tensor, Tensor, Tensor) {
    ok(try_svd(a))
}

/// [`svd`], returning an error instead of panicking.
///
/// # Errors
/// As [`try_qr`].
#[track_caller]
pub fn try_svd(a: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let _at = crate::engine::origin::enter();
    matrix_dims("linalg.svd", a)?;
    let packed = returned(kernels::SVD.try_call(&[&computable(a)])?, a.dtype());
    unpack_svd(&packed, a.dims())
}

/// The singular values of each matrix of `a`, descending (PyTorch's
/// `torch.linalg.svdvals`), differentiable.
///
/// # Panics
/// As [`try_svd`] fails.
#[track_caller]
pub fn svdvals(a: &Tensor) -> Tensor {
    ok(try_svd(a)).1
}

/// `U`, `S` and `Vᵀ` of `packed` (`[.., m·k + k + k·n]`) for an `A` of dimensions `dims`.
fn unpack_svd(packed: &Tensor, dims: &[usize]) -> Result<(Tensor, Tensor, Tensor)> {
    let (m, n) = last_two(dims);
    let k = m.min(n);
    let u = packed_matrix(packed, dims, 0, m, k)?;
    let s = packed.try_narrow(-1, m * k, k)?;
    let vh = packed_matrix(packed, dims, m * k + k, k, n)?;
    Ok((u, s, vh))
}

/// `Q` and `R` of `packed` (`[.., m·k + k·n]`) for an `A` of dimensions `dims`.
fn unpack_qr(packed: &Tensor, dims: &[usize]) -> Result<(Tensor, Tensor)> {
    let (m, n) = last_two(dims);
    let k = m.min(n);
    Ok((packed_matrix(packed, dims, 0, m, k)?, packed_matrix(packed, dims, m * k, k, n)?))
}

/// The `rows × cols` matrices stored from position `start` of each row of `packed`, under
/// the batch dimensions of `dims`.
fn packed_matrix(
    packed: &Tensor,
    dims: &[usize],
    start: usize,
    rows: usize,
    cols: usize,
) -> Result<Tensor> {
    let shape: Vec<i64> =
        dims[..dims.len() - 2].iter().chain(&[rows, cols]).map(|&x| x as i64).collect();
    packed.try_narrow(-1, start, rows * cols)?.try_reshape(&shape)
}

/// The last two dimensions: a matrix's rows and columns.
fn last_two(d: &[usize]) -> (usize, usize) {
    (d[d.len() - 2], d[d.len() - 1])
}

/// The `n × n` identity in `like`'s dtype, on its device.
#[track_caller]
fn eye_like(n: usize, like: &Tensor) -> Tensor {
    Tensor::eye(n).to_dtype(like.dtype()).to(like.device())
}
