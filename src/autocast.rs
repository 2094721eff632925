//! Mixed precision: [`autocast`] runs matrix products and attention in a 16-bit float type
//! while precision-sensitive ops (softmax, log-softmax and the losses built on them, the
//! norms, the regression losses) run in f32, as PyTorch's `torch.autocast`. Parameters stay
//! in f32 (*master weights*): the casts are ordinary differentiable ops, so gradients come
//! back in f32. [`GradScaler`](crate::optim::GradScaler) keeps f16 gradients from
//! underflowing.

use std::cell::Cell;

use crate::error::ok;
use crate::{DType, Error, Result};

thread_local! {
    static AUTOCAST: Cell<Option<DType>> = const { Cell::new(None) };
}

/// Runs `f` with this thread's autocast set to `dtype` (`DType::BF16` or `DType::F16`):
/// inside it, `matmul` (and `Linear`, `einsum`, the convolutions' products) and
/// `scaled_dot_product_attention` cast f32/f64 operands to `dtype` and return `dtype`;
/// `softmax`, `log_softmax`, `cross_entropy`, `nll_loss`, `mse_loss`, `layer_norm`,
/// `rms_norm`, `group_norm` and `batch_norm` compute 16-bit inputs in f32 and return f32.
/// Other ops follow the usual type promotion (a bf16 product plus an f32 bias is f32).
/// Autocast nests; the previous setting returns when `f` does (or panics).
///
/// ```
/// use kiln::nn::{Linear, Module, functional as F};
/// use kiln::prelude::*;
/// let layer = Linear::new(8, 4);
/// let x = Tensor::randn([2, 8]);
/// let (h, loss) = kiln::autocast(DType::BF16, || {
///     let h = x.matmul(&layer.weight.t());
///     let loss = F::cross_entropy(&h, &Tensor::from_vec(vec![1i64, 3], [2]));
///     (h, loss)
/// });
/// assert_eq!(h.dtype(), DType::BF16);       // the product ran in bf16
/// assert_eq!(loss.dtype(), DType::F32);     // the loss in f32
/// loss.backward();
/// assert_eq!(layer.weight.grad().unwrap().dtype(), DType::F32); // master weights stay f32
/// ```
///
/// # Panics
/// For a `dtype` other than `BF16` or `F16`; [`try_autocast`] returns the error.
#[track_caller]
pub fn autocast<T>(dtype: DType, f: impl FnOnce() -> T) -> T {
    ok(try_autocast(dtype, f))
}

/// [`autocast`], returning an error for a dtype it does not take.
///
/// # Errors
/// [`Error::DType`] for a `dtype` other than `BF16` or `F16`.
pub fn try_autocast<T>(dtype: DType, f: impl FnOnce() -> T) -> Result<T> {
    if !matches!(dtype, DType::BF16 | DType::F16) {
        return Err(Error::dtype(
            "autocast",
            format!("runs in a 16-bit float type (bf16 or f16), got {dtype}"),
        ));
    }
    struct Restore(Option<DType>);
    impl Drop for Restore {
        fn drop(&mut self) {
            AUTOCAST.with(|a| a.set(self.0));
        }
    }
    let _restore = Restore(AUTOCAST.with(|a| a.replace(Some(dtype))));
    Ok(f())
}

/// The 16-bit type this thread's autocast runs products in, if it is on.
pub fn autocast_dtype() -> Option<DType> {
    AUTOCAST.with(Cell::get)
}
