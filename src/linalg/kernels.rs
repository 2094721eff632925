//! The linear algebra ops: faer on each matrix of a batch, and PyTorch's gradients written
//! with kiln ops (and with these ops: the gradient of a solve is a solve).

use std::sync::LazyLock;

use faer::linalg::solvers::{DenseSolveCore, Solve};
use std::borrow::Cow;

use faer::{MatMut, MatRef, Par, Side};
use kiln_ir::{DType, Shape};

use super::{last_two, mt, solve_triangular};
use crate::Element;
use crate::Tensor;
use crate::error::Result;
use crate::ops::{CpuInput, CpuOutput, Opaque, Split};

/// The float types faer factorizes.
trait Real: Element + faer::traits::RealField + Copy {}
impl Real for f32 {}
impl Real for f64 {}

/// Matrix `b` of the batch `x` (`[.., rows, cols]`), row-major: borrowed from a dense
/// input, else gathered through its strides.
fn rows_of<'a, T: Real>(x: &CpuInput<'a>, b: usize) -> Result<Cow<'a, [T]>, String> {
    let (d, s) = (x.shape(), x.strides());
    let (rows, cols) = last_two(d);
    let per = rows * cols;
    if let Some(all) = x.contiguous::<T>()? {
        return Ok(Cow::Borrowed(&all[b * per..(b + 1) * per]));
    }
    let data = x.data::<T>()?;
    let (row_stride, col_stride) = (s[s.len() - 2], s[s.len() - 1]);
    let first = x.position_of(b * per);
    let mut out = Vec::with_capacity(per);
    for i in 0..rows {
        let row = first.wrapping_add_signed(i as isize * row_stride);
        out.extend((0..cols).map(|j| data[row.wrapping_add_signed(j as isize * col_stride)]));
    }
    Ok(Cow::Owned(out))
}

/// `rows` (a matrix of `x`, from [`rows_of`]) as faer reads it.
fn view<'m, T: Real>(x: &CpuInput<'_>, rows: &'m [T]) -> MatRef<'m, T> {
    let d = x.shape();
    let (r, c) = last_two(d);
    MatRef::from_row_major_slice(rows, r, c)
}

/// `rows` read as a column-major matrix: the transpose of the matrix, for free. A
/// factorization of `Aᵀ` gives what kiln needs of `A` (`det Aᵀ = det A`, `(Aᵀ)⁻¹ = (A⁻¹)ᵀ`,
/// and a column-major result of it is the row-major result for `A`) without faer copying a
/// row-major matrix into its column-major storage across the cache.
fn view_t<'m, T: Real>(x: &CpuInput<'_>, rows: &'m [T]) -> MatRef<'m, T> {
    let d = x.shape();
    MatRef::from_column_major_slice(rows, d[d.len() - 1], d[d.len() - 2])
}

/// Writes `m` row-major into `out`.
fn store<T: Real>(out: &mut [T], m: MatRef<'_, T>) {
    MatMut::from_row_major_slice_mut(out, m.nrows(), m.ncols()).copy_from(m);
}

/// Writes the entries of the diagonal `d` into `out`.
fn store_diagonal<T: Real>(out: &mut [T], d: faer::diag::DiagRef<'_, T>) {
    for (v, x) in out.iter_mut().zip(d.column_vector().iter()) {
        *v = *x;
    }
}

/// Writes `m` column-major into `out`: `mᵀ` row-major.
fn store_t<T: Real>(out: &mut [T], m: MatRef<'_, T>) {
    MatMut::from_column_major_slice_mut(out, m.nrows(), m.ncols()).copy_from(m);
}

/// Calls `f` with each matrix of the output chunk (whole matrices: [`Split::Matrices`]) and
/// its batch index.
fn each_matrix<T: Real>(
    out: &mut CpuOutput<'_>,
    per: usize,
    mut f: impl FnMut(usize, &mut [T]) -> Result<(), String>,
) -> Result<(), String> {
    let first = out.start() / per.max(1);
    for (k, chunk) in out.values::<T>()?.chunks_mut(per.max(1)).enumerate() {
        f(first + k, chunk)?;
    }
    Ok(())
}

/// An op over f32 and f64 batches, its CPU function `cpu::<T>`.
macro_rules! float_op {
    ($name:expr, $inputs:expr, $cpu:ident) => {
        Opaque::builder($name, $inputs, |inputs, out| match out.dtype() {
            DType::F32 => $cpu::<f32>(inputs, out),
            DType::F64 => $cpu::<f64>(inputs, out),
            d => Err(format!("computes in f32 or f64, not {d}")),
        })
        .host_on_gpu()
    };
}

fn cholesky_cpu<T: Real>(inputs: &[CpuInput<'_>], out: &mut CpuOutput<'_>) -> Result<(), String> {
    let n = out.shape()[out.shape().len() - 1];
    each_matrix::<T>(out, n * n, |b, chunk| {
        let rows = rows_of::<T>(&inputs[0], b)?;
        // The upper triangle of Aᵀ is A's lower one: L of A, stored column-major, is U = Lᵀ.
        let llt = view_t(&inputs[0], &rows).llt(Side::Upper).map_err(|e| {
            let faer::linalg::cholesky::llt::factor::LltError::NonPositivePivot { index } = e;
            format!(
                "the factorization could not be completed because matrix {b} of the batch is not \
                 positive-definite (the leading minor of order {} is not positive-definite)",
                index + 1
            )
        })?;
        store_t(chunk, llt.L());
        Ok(())
    })
}

/// `U = Lᵀ` for `L = cholesky(A)` (written so because faer's column-major `L` is a
/// row-major `U` as it is): `gA = ½ (S + Sᵀ)` with `S = L⁻ᵀ Φ(Lᵀ gL) L⁻¹` and `Φ` the
/// lower triangle with its diagonal halved (PyTorch's `cholesky_backward`).
pub(super) static CHOLESKY: LazyLock<Opaque> = LazyLock::new(|| {
    float_op!("linalg.cholesky", 1, cholesky_cpu)
        .split(Split::Matrices)
        .backward(|saved, gu| {
            let (u, gl) = (saved.output(), mt(gu));
            let x = u.try_matmul(&gl)?;
            let phi = x.tril(0) - x.tril(0).triu(0) * 0.5;
            let y = solve_triangular(u, &phi, true);
            let s = mt(&solve_triangular(u, &mt(&y), true));
            Ok(vec![Some((&s + &mt(&s)) * 0.5)])
        })
        .build()
});

fn solve_cpu<T: Real>(inputs: &[CpuInput<'_>], out: &mut CpuOutput<'_>) -> Result<(), String> {
    let (n, k) =
        (inputs[0].shape()[inputs[0].shape().len() - 1], out.shape()[out.shape().len() - 1]);
    each_matrix::<T>(out, n * k, |b, chunk| {
        let (rows, rhs) = (rows_of::<T>(&inputs[0], b)?, rows_of::<T>(&inputs[1], b)?);
        let lu = view_t(&inputs[0], &rows).partial_piv_lu();
        singular(lu.U(), b)?;
        store(chunk, lu.solve_transpose(view(&inputs[1], &rhs)).as_ref());
        Ok(())
    })
}

/// Fails for a factor `U` with a zero on its diagonal: a singular matrix.
fn singular<T: Real>(u: MatRef<'_, T>, b: usize) -> Result<(), String> {
    let zero = T::from_scalar(kiln_ir::Scalar::F64(0.0));
    if (0..u.nrows()).any(|i| u[(i, i)] == zero) {
        return Err(format!("matrix {b} of the batch is singular: it has no inverse"));
    }
    Ok(())
}

/// `X = A⁻¹ B`: `gB = A⁻ᵀ gX`, `gA = -gB Xᵀ`.
pub(super) static SOLVE: LazyLock<Opaque> = LazyLock::new(|| {
    float_op!("linalg.solve", 2, solve_cpu)
        .split(Split::Matrices)
        .shape(|inputs| Ok((inputs[1].0.clone(), inputs[1].1)))
        .backward(|saved, g| {
            let (a, x) = (&saved.inputs()[0], saved.output());
            let gb = SOLVE.try_call(&[&mt(a), g])?;
            let ga = -gb.try_matmul(&mt(x))?;
            Ok(vec![Some(ga), Some(gb)])
        })
        .build()
});

fn triangular_cpu<T: Real>(
    inputs: &[CpuInput<'_>],
    out: &mut CpuOutput<'_>,
    upper: bool,
) -> Result<(), String> {
    let (n, k) =
        (inputs[0].shape()[inputs[0].shape().len() - 1], out.shape()[out.shape().len() - 1]);
    each_matrix::<T>(out, n * k, |b, chunk| {
        let (rows, rhs) = (rows_of::<T>(&inputs[0], b)?, rows_of::<T>(&inputs[1], b)?);
        let a = view(&inputs[0], &rows);
        let mut x = view(&inputs[1], &rhs).to_owned();
        if upper {
            faer::linalg::triangular_solve::solve_upper_triangular_in_place(
                a.as_ref(),
                x.as_mut(),
                Par::Seq,
            );
        } else {
            faer::linalg::triangular_solve::solve_lower_triangular_in_place(
                a.as_ref(),
                x.as_mut(),
                Par::Seq,
            );
        }
        store(chunk, x.as_ref());
        Ok(())
    })
}

fn lower_cpu<T: Real>(inputs: &[CpuInput<'_>], out: &mut CpuOutput<'_>) -> Result<(), String> {
    triangular_cpu::<T>(inputs, out, false)
}

fn upper_cpu<T: Real>(inputs: &[CpuInput<'_>], out: &mut CpuOutput<'_>) -> Result<(), String> {
    triangular_cpu::<T>(inputs, out, true)
}

/// `X = A⁻¹ B` for a triangular `A`: `gB = A⁻ᵀ gX`, `gA = -gB Xᵀ` on `A`'s triangle.
fn triangular(name: &'static str, upper: bool) -> Opaque {
    let cpu = if upper { float_op!(name, 2, upper_cpu) } else { float_op!(name, 2, lower_cpu) };
    cpu.split(Split::Matrices)
        .shape(|inputs| Ok((inputs[1].0.clone(), inputs[1].1)))
        .backward(move |saved, g| {
            let (a, x) = (&saved.inputs()[0], saved.output());
            let gb = solve_triangular(&mt(a), g, !upper);
            let full = -gb.try_matmul(&mt(x))?;
            let ga = if upper { full.triu(0) } else { full.tril(0) };
            Ok(vec![Some(ga), Some(gb)])
        })
        .build()
}

pub(super) static SOLVE_LOWER: LazyLock<Opaque> =
    LazyLock::new(|| triangular("linalg.solve_triangular", false));
pub(super) static SOLVE_UPPER: LazyLock<Opaque> =
    LazyLock::new(|| triangular("linalg.solve_triangular", true));

fn inv_cpu<T: Real>(inputs: &[CpuInput<'_>], out: &mut CpuOutput<'_>) -> Result<(), String> {
    let n = out.shape()[out.shape().len() - 1];
    each_matrix::<T>(out, n * n, |b, chunk| {
        let rows = rows_of::<T>(&inputs[0], b)?;
        let lu = view_t(&inputs[0], &rows).partial_piv_lu();
        singular(lu.U(), b)?;
        store_t(chunk, lu.inverse().as_ref());
        Ok(())
    })
}

/// `Y = A⁻¹`: `gA = -Yᵀ gY Yᵀ`.
pub(super) static INV: LazyLock<Opaque> = LazyLock::new(|| {
    float_op!("linalg.inv", 1, inv_cpu)
        .split(Split::Matrices)
        .backward(|saved, g| {
            let yt = mt(saved.output());
            Ok(vec![Some(-yt.try_matmul(g)?.try_matmul(&yt)?)])
        })
        .build()
});

fn det_cpu<T: Real>(inputs: &[CpuInput<'_>], out: &mut CpuOutput<'_>) -> Result<(), String> {
    each_matrix::<T>(out, 1, |b, chunk| {
        chunk[0] = view_t(&inputs[0], &rows_of::<T>(&inputs[0], b)?).determinant();
        Ok(())
    })
}

/// The first input's batch dimensions followed by `extra`, in its dtype: a packed result's
/// type.
fn batch_shape(inputs: &[(Shape, DType)], extra: &[usize]) -> (Shape, DType) {
    let d = inputs[0].0.dims();
    let dims: Vec<usize> = d[..d.len() - 2].iter().chain(extra).copied().collect();
    (Shape::from(dims), inputs[0].1)
}

/// `d = det(A)`: `gA = g d A⁻ᵀ`.
pub(super) static DET: LazyLock<Opaque> = LazyLock::new(|| {
    float_op!("linalg.det", 1, det_cpu)
        .shape(|inputs| Ok(batch_shape(inputs, &[])))
        .backward(|saved, g| {
            let (a, d) = (&saved.inputs()[0], saved.output());
            let scale = (g * d).try_unsqueeze(-1)?.try_unsqueeze(-1)?;
            Ok(vec![Some(scale * mt(&INV.try_call(&[a])?))])
        })
        .build()
});

fn slogdet_cpu<T: Real>(inputs: &[CpuInput<'_>], out: &mut CpuOutput<'_>) -> Result<(), String> {
    each_matrix::<T>(out, 2, |b, chunk| {
        let rows = rows_of::<T>(&inputs[0], b)?;
        let lu = view_t(&inputs[0], &rows).partial_piv_lu();
        let u = lu.U();
        // The permutation's sign: one flip per cycle of even length.
        let perm = lu.P().arrays().0.to_vec();
        let mut seen = vec![false; perm.len()];
        let mut negative = false;
        for start in 0..perm.len() {
            let mut len = 0;
            let mut i = start;
            while !seen[i] {
                seen[i] = true;
                i = perm[i];
                len += 1;
            }
            negative ^= len > 0 && len % 2 == 0;
        }
        let mut log = 0.0f64;
        for i in 0..u.nrows() {
            let v = u[(i, i)].to_scalar().to_f64();
            negative ^= v < 0.0;
            log += v.abs().ln();
        }
        let sign = if log == f64::NEG_INFINITY {
            0.0
        } else if negative {
            -1.0
        } else {
            1.0
        };
        chunk[0] = T::from_scalar(kiln_ir::Scalar::F64(sign));
        chunk[1] = T::from_scalar(kiln_ir::Scalar::F64(log));
        Ok(())
    })
}

/// `(sign, log |det A|)` packed as `[.., 2]`: `gA = g_log A⁻ᵀ` (the sign has none).
pub(super) static SLOGDET: LazyLock<Opaque> = LazyLock::new(|| {
    float_op!("linalg.slogdet", 1, slogdet_cpu)
        .split(Split::Rows)
        .shape(|inputs| Ok(batch_shape(inputs, &[2])))
        .backward(|saved, g| {
            let a = &saved.inputs()[0];
            let scale = g.try_select(-1, 1)?.try_unsqueeze(-1)?.try_unsqueeze(-1)?;
            Ok(vec![Some(scale * mt(&INV.try_call(&[a])?))])
        })
        .build()
});

fn eigh_cpu<T: Real>(inputs: &[CpuInput<'_>], out: &mut CpuOutput<'_>) -> Result<(), String> {
    let n = out.shape()[out.shape().len() - 1];
    each_matrix::<T>(out, (n + 1) * n, |b, chunk| {
        let rows = rows_of::<T>(&inputs[0], b)?;
        // The upper triangle of Aᵀ is A's lower one, as PyTorch's UPLO='L' reads.
        let evd = view_t(&inputs[0], &rows).self_adjoint_eigen(Side::Upper).map_err(|e| {
            format!("the eigendecomposition of matrix {b} of the batch did not converge ({e:?})")
        })?;
        let (values, vectors) = chunk.split_at_mut(n);
        store_diagonal(values, evd.S());
        store(vectors, evd.U());
        Ok(())
    })
}

/// Eigenvalues (ascending; row 0) and eigenvectors (columns; rows 1 to n) packed as
/// `[.., n + 1, n]`: `gA = V (diag(gλ) + skew(Vᵀ gV) / E) Vᵀ` with `E_ij = λ_j - λ_i`
/// (PyTorch's `linalg_eig_backward` for a symmetric matrix), symmetrized as the input's
/// one triangle is read for both.
pub(super) static EIGH: LazyLock<Opaque> = LazyLock::new(|| {
    float_op!("linalg.eigh", 1, eigh_cpu)
        .split(Split::Matrices)
        .shape(|inputs| {
            let n = inputs[0].0.dims()[inputs[0].0.rank() - 1];
            Ok(batch_shape(inputs, &[n + 1, n]))
        })
        .backward(|saved, g| {
            let packed = saved.output();
            let n = packed.dims()[packed.ndim() - 1];
            let (l, v) = (packed.try_select(-2, 0)?, packed.try_narrow(-2, 1, n)?);
            let (gl, gv) = (g.try_select(-2, 0)?, g.try_narrow(-2, 1, n)?);
            let vtgv = mt(&v).try_matmul(&gv)?;
            let skew = (&vtgv - &mt(&vtgv)) * 0.5;
            let e = l.try_unsqueeze(-2)? - l.try_unsqueeze(-1)?;
            let eye = super::eye_like(n, &l);
            // Off the diagonal skew / E; on it gλ (E's diagonal is 0: shifted to 1 there).
            let inner = &skew / &(&e + &eye) + gl.try_unsqueeze(-1)? * &eye;
            let ga = v.try_matmul(&inner)?.try_matmul(&mt(&v))?;
            Ok(vec![Some((&ga + &mt(&ga)) * 0.5)])
        })
        .build()
});

fn qr_cpu<T: Real>(inputs: &[CpuInput<'_>], out: &mut CpuOutput<'_>) -> Result<(), String> {
    let d = inputs[0].shape();
    let (m, n) = last_two(d);
    let k = m.min(n);
    each_matrix::<T>(out, m * k + k * n, |b, chunk| {
        let rows = rows_of::<T>(&inputs[0], b)?;
        let qr = view(&inputs[0], &rows).qr();
        let (q, r) = chunk.split_at_mut(m * k);
        store(q, qr.compute_thin_Q().as_ref());
        store(r, qr.thin_R());
        Ok(())
    })
}

/// PyTorch's QR gradient for a wide `A = Q [R₁ | R₂]` (`m < n`, `Q` square): with `X = Qᵀ gQ
/// - gR Rᵀ` (`-Mᵀ`), `gA = [Q tril(X - Xᵀ) R₁⁻ᵀ | 0] + Q gR`.
fn wide_qr_gradient(q: &Tensor, r: &Tensor, gr: &Tensor, mm: &Tensor) -> Result<Tensor> {
    let (m, n) = last_two(r.dims());
    let x = -mt(mm);
    let y = q.try_matmul(&(&x - &mt(&x)).tril(0))?;
    let r1 = r.try_narrow(-1, 0, m)?;
    // Y R₁⁻ᵀ = (R₁⁻¹ Yᵀ)ᵀ.
    let left = mt(&solve_triangular(&r1, &mt(&y), true));
    let mut pad = left.dims().to_vec();
    let last = pad.len() - 1;
    pad[last] = n - m;
    let zeros = Tensor::try_full_dtype(pad, 0.0, left.dtype())?.try_to(left.device())?;
    Tensor::try_cat(&[&left, &zeros], -1)?.try_add(&q.try_matmul(gr)?)
}

/// The reduced `Q` (`m × k`) and `R` (`k × n`), `k = min(m, n)`, packed as `[.., m·k + k·n]`:
/// for `m ≥ n`, `gA = (gQ + Q copyltu(M)) R⁻ᵀ` with `M = R gRᵀ - gQᵀ Q` and `copyltu` the
/// lower triangle mirrored onto the upper one; for `m < n`, [`wide_qr_gradient`].
pub(super) static QR: LazyLock<Opaque> = LazyLock::new(|| {
    float_op!("linalg.qr", 1, qr_cpu)
        .split(Split::Rows)
        .shape(|inputs| {
            let (m, n) = last_two(inputs[0].0.dims());
            let k = m.min(n);
            Ok(batch_shape(inputs, &[m * k + k * n]))
        })
        .backward(|saved, g| {
            let a = &saved.inputs()[0];
            let d = a.dims();
            let (m, n) = last_two(d);
            let ((q, r), (gq, gr)) =
                (super::unpack_qr(saved.output(), d)?, super::unpack_qr(g, d)?);
            let mm = r.try_matmul(&mt(&gr))? - mt(&gq).try_matmul(&q)?;
            if m < n {
                return Ok(vec![Some(wide_qr_gradient(&q, &r, &gr, &mm)?)]);
            }
            let copyltu = mm.tril(0) + mt(&mm.tril(-1));
            let y = gq + q.try_matmul(&copyltu)?;
            // Y R⁻ᵀ = (R⁻¹ Yᵀ)ᵀ.
            Ok(vec![Some(mt(&solve_triangular(&r, &mt(&y), true)))])
        })
        .build()
});

fn svd_cpu<T: Real>(inputs: &[CpuInput<'_>], out: &mut CpuOutput<'_>) -> Result<(), String> {
    let d = inputs[0].shape();
    let (m, n) = last_two(d);
    let k = m.min(n);
    each_matrix::<T>(out, m * k + k + k * n, |b, chunk| {
        let rows = rows_of::<T>(&inputs[0], b)?;
        let svd = view(&inputs[0], &rows).thin_svd().map_err(|e| {
            format!("the singular value decomposition of matrix {b} of the batch did not converge ({e:?})")
        })?;
        let (u, rest) = chunk.split_at_mut(m * k);
        let (s, vh) = rest.split_at_mut(k);
        store(u, svd.U());
        store_diagonal(s, svd.S());
        // Vᵀ row-major is V column-major.
        store_t(vh, svd.V());
        Ok(())
    })
}

/// The reduced `U` (`m × k`), `S` (`k`) and `Vᵀ` (`k × n`) packed as
/// `[.., m·k + k + k·n]`: Townsend's gradient, with `F_ij = 1 / (s_j² - s_i²)` off the
/// diagonal, `gA = U [(F ∘ (UᵀgU - gUᵀU)) S + diag(gS) + S (F ∘ (VᵀgV - gVᵀV))] Vᵀ
/// + (I - UUᵀ) gU S⁻¹ Vᵀ + U S⁻¹ gVᵀ (I - VVᵀ)`.
pub(super) static SVD: LazyLock<Opaque> = LazyLock::new(|| {
    float_op!("linalg.svd", 1, svd_cpu)
        .split(Split::Rows)
        .shape(|inputs| {
            let (m, n) = last_two(inputs[0].0.dims());
            let k = m.min(n);
            Ok(batch_shape(inputs, &[m * k + k + k * n]))
        })
        .backward(|saved, g| {
            let a = &saved.inputs()[0];
            let (u, s, vh) = super::unpack_svd(saved.output(), a.dims())?;
            let (gu, gs, gvh) = super::unpack_svd(g, a.dims())?;
            let (v, gv) = (mt(&vh), mt(&gvh));
            let k = s.dims()[s.ndim() - 1];
            let eye = super::eye_like(k, &s);
            let s2 = s.square();
            // F: 1 / (s_j² - s_i²) off the diagonal, 0 on it.
            let diff = s2.try_unsqueeze(-2)? - s2.try_unsqueeze(-1)?;
            let f = (&eye * -1.0 + 1.0) / (&diff + &eye);
            let (sr, sc) = (s.try_unsqueeze(-2)?, s.try_unsqueeze(-1)?);
            let utgu = mt(&u).try_matmul(&gu)?;
            let vtgv = mt(&v).try_matmul(&gv)?;
            let inner = (&f * &(&utgu - &mt(&utgu))) * &sr
                + gs.try_unsqueeze(-1)? * &eye
                + &sc * &(&f * &(&vtgv - &mt(&vtgv)));
            let mut ga = u.try_matmul(&inner)?.try_matmul(&vh)?;
            let d = a.dims();
            let (m, n) = last_two(d);
            if m > k {
                let proj = super::eye_like(m, &s) - u.try_matmul(&mt(&u))?;
                ga = ga + proj.try_matmul(&(&gu / &sr))?.try_matmul(&vh)?;
            }
            if n > k {
                let proj = super::eye_like(n, &s) - v.try_matmul(&vh)?;
                ga = ga + (&u / &sr).try_matmul(&mt(&gv))?.try_matmul(&proj)?;
            }
            Ok(vec![Some(ga)])
        })
        .build()
});
