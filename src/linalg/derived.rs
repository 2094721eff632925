//! The `torch.linalg` functions that are compositions: norms, `cross`, `vecdot`,
//! `multi_dot`, `matrix_power`, and what the SVD and the eigendecomposition give (`pinv`,
//! `matrix_rank`, `cond`, `eigvalsh`), and `vander`. They record ordinary ops (and the
//! factorizations), so they fuse and differentiate like any other code.

use kiln_ir::DType;

use super::{eigh, inv, mt, svd};
use crate::error::{Error, Result, ok};
use crate::tensor::Tensor;

/// `sqrt(s)` for `s ≥ 0` whose gradient at `s = 0` is 0 (PyTorch's subgradient of a norm
/// at the origin) rather than `0 · ∞`.
fn safe_sqrt(s: &Tensor) -> Tensor {
    let positive = s.gt(0.0);
    let ones = Tensor::ones_like(s);
    Tensor::where_(&positive, Tensor::where_(&positive, s, &ones).sqrt(), 0.0)
}

/// The `ord`-norm of `x` over `dims` (all dimensions when empty), PyTorch's
/// `torch.linalg.vector_norm(x, ord, dim, keepdim)`: `ord = 2.0` the Euclidean norm,
/// `f64::INFINITY` the largest magnitude, `f64::NEG_INFINITY` the smallest, `0.0` the number
/// of non-zeros, any other `p` `(Σ |x|^p)^(1/p)`. Its gradient at the zero vector is 0.
///
/// # Panics
/// As [`try_vector_norm`] fails.
#[track_caller]
pub fn vector_norm(x: &Tensor, ord: f64, dims: &[i64], keepdim: bool) -> Tensor {
    ok(try_vector_norm(x, ord, dims, keepdim))
}

/// [`vector_norm`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::DType`] for a non-float `x`; the errors of the reduction for bad `dims`.
#[track_caller]
pub fn try_vector_norm(x: &Tensor, ord: f64, dims: &[i64], keepdim: bool) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    if !x.dtype().is_float() {
        return Err(Error::DType {
            op: "linalg.vector_norm",
            detail: format!(
                "x must be a float tensor, got {}; convert it with .float()",
                x.dtype()
            ),
        });
    }
    let all: Vec<i64> = (0..x.ndim() as i64).collect();
    let dims = if dims.is_empty() { &all[..] } else { dims };
    let a = x.abs();
    Ok(if ord == 2.0 {
        safe_sqrt(&x.square().try_sum_dim(dims, keepdim)?)
    } else if ord == f64::INFINITY {
        a.try_amax(dims, keepdim)?
    } else if ord == f64::NEG_INFINITY {
        a.try_amin(dims, keepdim)?
    } else if ord == 0.0 {
        a.gt(0.0).to_dtype(x.dtype()).try_sum_dim(dims, keepdim)?
    } else if ord == 1.0 {
        a.try_sum_dim(dims, keepdim)?
    } else {
        a.pow(ord).try_sum_dim(dims, keepdim)?.pow(1.0 / ord)
    })
}

/// Which matrix norm [`matrix_norm`] computes (PyTorch's `ord` of `torch.linalg.matrix_norm`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MatrixOrd {
    /// Frobenius: the Euclidean norm of the entries (`'fro'`, the default).
    Frobenius,
    /// Nuclear: the sum of the singular values (`'nuc'`).
    Nuclear,
    /// The largest (`2`) or smallest (`-2`) singular value.
    Spectral(i8),
    /// The largest (`1`) or smallest (`-1`) column sum of magnitudes.
    Columns(i8),
    /// The largest (`inf`) or smallest (`-inf`) row sum of magnitudes.
    Rows(i8),
}

/// The `ord` norm of each matrix of `a` (`[.., m, n]`), PyTorch's
/// `torch.linalg.matrix_norm(A, ord)` over the last two dimensions.
///
/// # Panics
/// As [`try_matrix_norm`] fails.
#[track_caller]
pub fn matrix_norm(a: &Tensor, ord: MatrixOrd) -> Tensor {
    ok(try_matrix_norm(a, ord))
}

/// [`matrix_norm`], returning an error instead of panicking.
///
/// # Errors
/// As [`super::try_qr`], for the shape and dtype.
#[track_caller]
pub fn try_matrix_norm(a: &Tensor, ord: MatrixOrd) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    super::matrix_dims("linalg.matrix_norm", a)?;
    let extreme = |t: Tensor, sign: i8| -> Result<Tensor> {
        if sign > 0 { t.try_amax(-1, false) } else { t.try_amin(-1, false) }
    };
    match ord {
        MatrixOrd::Frobenius => try_vector_norm(a, 2.0, &[-2, -1], false),
        MatrixOrd::Nuclear => super::try_svd(a)?.1.try_sum_dim(-1, false),
        MatrixOrd::Spectral(sign) => extreme(super::try_svd(a)?.1, sign),
        MatrixOrd::Columns(sign) => extreme(a.abs().try_sum_dim(-2, false)?, sign),
        MatrixOrd::Rows(sign) => extreme(a.abs().try_sum_dim(-1, false)?, sign),
    }
}

/// The cross product of 3-vectors along the last dimension (PyTorch's
/// `torch.linalg.cross(a, b)`; batch dimensions broadcast).
///
/// # Panics
/// As [`try_cross`] fails.
#[track_caller]
pub fn cross(a: &Tensor, b: &Tensor) -> Tensor {
    ok(try_cross(a, b))
}

/// [`cross`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] unless both last dimensions are 3, or for batches that do not broadcast.
#[track_caller]
pub fn try_cross(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    if a.dims().last() != Some(&3) || b.dims().last() != Some(&3) {
        return Err(Error::Shape {
            op: "linalg.cross",
            detail: format!(
                "both inputs need 3 elements in their last dimension; got {} and {}",
                a.shape(),
                b.shape()
            ),
        });
    }
    let c = |t: &Tensor, i: usize| t.try_narrow(-1, i, 1);
    let term = |i: usize, j: usize| -> Result<Tensor> {
        c(a, i)?.try_mul(&c(b, j)?)?.try_sub(&c(a, j)?.try_mul(&c(b, i)?)?)
    };
    Tensor::try_cat(&[&term(1, 2)?, &term(2, 0)?, &term(0, 1)?], -1)
}

/// `Σ x·y` along `dim` (PyTorch's `torch.linalg.vecdot` for real tensors; broadcasting).
///
/// # Panics
/// As the product or the sum fails (shapes that do not broadcast, a bad `dim`).
#[track_caller]
pub fn vecdot(x: &Tensor, y: &Tensor, dim: i64) -> Tensor {
    (x * y).sum_dim(dim, false)
}

/// The product of a chain of matrices, left to right (PyTorch's `torch.linalg.multi_dot`;
/// the first may be a vector `[k]` and the last `[k]`, as there).
///
/// # Panics
/// As [`try_multi_dot`] fails.
#[track_caller]
pub fn multi_dot(tensors: &[&Tensor]) -> Tensor {
    ok(try_multi_dot(tensors))
}

/// [`multi_dot`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Value`] for an empty chain; the products' errors.
#[track_caller]
pub fn try_multi_dot(tensors: &[&Tensor]) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    let Some((first, rest)) = tensors.split_first() else {
        return Err(Error::Value {
            op: "linalg.multi_dot",
            detail: "takes at least one tensor".into(),
        });
    };
    rest.iter().try_fold((*first).clone(), |acc, t| acc.try_matmul(t))
}

/// Each square matrix of `a` to the integer power `n` (PyTorch's
/// `torch.linalg.matrix_power`): by repeated squaring; `n = 0` gives the identity, a
/// negative `n` the power of the inverse.
///
/// # Panics
/// As [`super::try_inv`] fails, for the shape.
#[track_caller]
pub fn matrix_power(a: &Tensor, n: i64) -> Tensor {
    let size = ok(super::square("linalg.matrix_power", a));
    let mut base = if n < 0 { inv(a) } else { a.clone() };
    let mut result: Option<Tensor> = None;
    let mut k = n.unsigned_abs();
    while k > 0 {
        if k & 1 == 1 {
            result = Some(match result {
                Some(r) => r.matmul(&base),
                None => base.clone(),
            });
        }
        k >>= 1;
        if k > 0 {
            base = base.matmul(&base);
        }
    }
    result.unwrap_or_else(|| super::eye_like(size, a).expand_as(a).copy())
}

/// The singular values at or below `rtol · σ_max` (PyTorch's default `rtol`: `eps · max(m, n)`
/// of the dtype), as a mask.
fn significant(s: &Tensor, m: usize, n: usize, dtype: DType) -> Tensor {
    let eps = match dtype {
        DType::F64 => f64::EPSILON,
        _ => f64::from(f32::EPSILON),
    };
    let tol = s.amax(-1, true) * (eps * m.max(n) as f64);
    s.gt(&tol)
}

/// The pseudo-inverse of each matrix of `a` (`[.., m, n]` gives `[.., n, m]`), from its SVD,
/// singular values at or below PyTorch's default tolerance treated as zero (PyTorch's
/// `torch.linalg.pinv`). Differentiable through the SVD.
///
/// # Panics
/// As [`super::try_svd`] fails.
#[track_caller]
pub fn pinv(a: &Tensor) -> Tensor {
    let (u, s, vh) = svd(a);
    let (m, n) = super::last_two(a.dims());
    let keep = significant(&s, m, n, a.dtype());
    let ones = Tensor::ones_like(&s);
    let inv_s = Tensor::where_(&keep, &(&ones / &Tensor::where_(&keep, &s, &ones)), 0.0);
    (mt(&vh) * inv_s.unsqueeze(-2)).matmul(&mt(&u))
}

/// The number of singular values of each matrix above PyTorch's default tolerance
/// (PyTorch's `torch.linalg.matrix_rank`), as `i64`.
///
/// # Panics
/// As [`super::try_svd`] fails.
#[track_caller]
pub fn matrix_rank(a: &Tensor) -> Tensor {
    let s = super::svdvals(&a.detach());
    let d = a.dims();
    let (m, n) = super::last_two(d);
    significant(&s, m, n, a.dtype()).to_dtype(DType::I64).sum_dim(-1, false)
}

/// The 2-norm condition number of each matrix, `σ_max / σ_min` (PyTorch's
/// `torch.linalg.cond(A)`).
///
/// # Panics
/// As [`super::try_svd`] fails.
#[track_caller]
pub fn cond(a: &Tensor) -> Tensor {
    let s = super::svdvals(a);
    s.amax(-1, false) / s.amin(-1, false)
}

/// The eigenvalues of each symmetric matrix, ascending (PyTorch's `torch.linalg.eigvalsh`).
///
/// # Panics
/// As [`super::try_eigh`] fails.
#[track_caller]
pub fn eigvalsh(a: &Tensor) -> Tensor {
    eigh(a).0
}

/// The Vandermonde matrix of `x` (`[.., k]` gives `[.., k, n]`): column `j` is `x^j`
/// (PyTorch's `torch.linalg.vander(x, N=n)`).
///
/// # Panics
/// For a 0-dimensional `x`.
#[track_caller]
pub fn vander(x: &Tensor, n: usize) -> Tensor {
    let columns: Vec<Tensor> =
        (0..n).map(|j| if j == 0 { Tensor::ones_like(x) } else { x.pow(j as f64) }).collect();
    let refs: Vec<&Tensor> = columns.iter().collect();
    Tensor::stack(&refs, -1)
}
