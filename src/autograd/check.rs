//! Finite-difference gradient checking.

use crate::{Error, Result, Tensor};

/// Checks the gradients that backward computes for `f` against central finite differences,
/// as PyTorch's `gradcheck` does (in its fast mode: the output is projected onto a fixed
/// random direction, which catches any wrong Jacobian entry with probability 1).
///
/// Inputs may live on any device and in any layout: a permuted or sliced input is
/// differentiated through its view (the perturbed copies are made on each input's device,
/// with the same strides over a perturbed storage). Views whose elements share memory (an
/// `expand`) are refused, as PyTorch refuses them.
/// `inputs` should be `f64` tensors (in lower precision the finite differences are too
/// noisy); each is checked element by element with steps of `±eps`. An analytic and a
/// numeric value agree when `|a - n| <= tol * (1 + |n|)`.
///
/// # Errors
/// [`Error::Autograd`] naming the first input and element whose gradients disagree, with
/// both values; or any error `f` or backward reports.
///
/// ```
/// use kiln::prelude::*;
/// let x = Tensor::from_vec(vec![0.3f64, -1.2, 2.0], [3]);
/// kiln::autograd::gradcheck(|xs| (xs[0].tanh() * &xs[0]).sum_dim(0, false), &[x], 1e-6, 1e-6)?;
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn gradcheck(
    f: impl Fn(&[Tensor]) -> Tensor,
    inputs: &[Tensor],
    eps: f64,
    tol: f64,
) -> Result<()> {
    // The inputs keep the caller's layout: a permuted or sliced input is differentiated
    // through its view, and the finite differences perturb the storage under it.
    for (i, t) in inputs.iter().enumerate() {
        if !t.layout().is_non_overlapping() {
            return Err(Error::Autograd {
                op: "gradcheck",
                detail: format!(
                    "input {i} (shape {}, strides {:?}) is a view whose elements share memory (an expand?); a finite difference cannot move one of them alone: pass it .contiguous()",
                    t.shape(),
                    t.layout().strides()
                ),
            });
        }
    }
    let leaves: Vec<Tensor> = inputs.iter().map(|t| t.detach().requires_grad_(true)).collect();
    let out = f(&leaves);
    // A fixed direction with entries in [0.5, 1.5): generic enough to see every column.
    let direction: Vec<f64> =
        (0..out.numel() as u64).map(|i| 0.5 + kiln_ir::random::uniform(0x5eed, i, 53)).collect();
    let direction = Tensor::from_vec(direction, out.shape().clone())
        .to_dtype(out.dtype())
        .try_to(out.device())?;
    let project = |y: &Tensor| -> Result<f64> { y.try_mul(&direction)?.sum().try_item::<f64>() };
    let loss = out.try_mul(&direction)?.sum();
    let wrt: Vec<&Tensor> = leaves.iter().collect();
    let analytic = crate::autograd::try_grad(&[&loss], &wrt, false)?;

    for (i, (input, grad)) in leaves.iter().zip(&analytic).enumerate() {
        // The whole storage under the input's view, and where each element lives in it.
        let storage: Vec<f64> = Tensor::from_node(input.storage().node()).try_to_vec()?;
        let offsets: Vec<usize> = input.layout().offsets().collect();
        let grad: Vec<f64> = grad.try_to_vec()?;
        for (j, &at_storage) in offsets.iter().enumerate() {
            let at = |delta: f64| -> Result<f64> {
                let mut v = storage.clone();
                v[at_storage] += delta;
                let moved: Vec<Tensor> = leaves
                    .iter()
                    .enumerate()
                    .map(|(k, t)| {
                        let moved = if k == i {
                            let len = v.len();
                            Tensor::from_vec(v.clone(), [len])
                                .to_dtype(t.dtype())
                                .try_to(t.device())?
                                .with_view(t.layout().clone())
                        } else {
                            t.detach()
                        };
                        // `f` may differentiate internally (a gradient of a gradient).
                        Ok(moved.requires_grad_(true))
                    })
                    .collect::<Result<_>>()?;
                project(&f(&moved))
            };
            let numeric = (at(eps)? - at(-eps)?) / (2.0 * eps);
            if (grad[j] - numeric).abs() > tol * (1.0 + numeric.abs())
                || grad[j].is_nan() != numeric.is_nan()
            {
                return Err(Error::Autograd {
                    op: "gradcheck",
                    detail: format!(
                        "input {i} (shape {}), element {j}: backward gives {}, finite differences give {numeric}",
                        input.shape(),
                        grad[j]
                    ),
                });
            }
        }
    }
    Ok(())
}
