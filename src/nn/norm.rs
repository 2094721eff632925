//! Normalization layers.

use super::{Module, functional};
use crate::error::ok;
use crate::{DType, Error, Result, Tensor};

/// Normalizes over the trailing `normalized_shape` dimensions to zero mean and unit
/// (biased) variance, then applies a learned elementwise scale (ones) and shift (zeros),
/// as PyTorch's `nn.LayerNorm`.
///
/// ```
/// use kiln::nn::{LayerNorm, Module};
/// use kiln::prelude::*;
///
/// let ln = LayerNorm::new(&[8]);
/// let y = ln.forward(&(Tensor::randn([4, 8]) * 3.0 + 2.0));
/// let mean = y.mean_dim(-1, false).abs().max().item::<f32>();
/// assert!(mean < 1e-5);
/// ```
#[derive(Clone, Debug)]
pub struct LayerNorm {
    /// The trailing shape normalized over.
    pub normalized_shape: Vec<usize>,
    /// Added to the variance for stability (`1e-5` by default).
    pub eps: f64,
    /// The learned scale, shaped `normalized_shape`.
    pub weight: Option<Tensor>,
    /// The learned shift, shaped `normalized_shape`.
    pub bias: Option<Tensor>,
}

impl LayerNorm {
    /// A layer norm with a learned scale and shift and `eps = 1e-5`.
    ///
    /// # Panics
    /// As [`LayerNorm::try_with_options`] fails.
    #[must_use]
    #[track_caller]
    pub fn new(normalized_shape: &[usize]) -> LayerNorm {
        ok(LayerNorm::try_with_options(normalized_shape, 1e-5, true))
    }

    /// A layer norm with a chosen `eps`, with or without the learned scale and shift.
    ///
    /// # Panics
    /// As [`LayerNorm::try_with_options`] fails.
    #[must_use]
    #[track_caller]
    pub fn with_options(
        normalized_shape: &[usize],
        eps: f64,
        elementwise_affine: bool,
    ) -> LayerNorm {
        ok(LayerNorm::try_with_options(normalized_shape, eps, elementwise_affine))
    }

    /// [`LayerNorm::with_options`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] for a negative or NaN `eps`, or a shape no memory can hold;
    /// [`Error::Runtime`] when the parameters cannot be allocated.
    #[track_caller]
    pub fn try_with_options(
        normalized_shape: &[usize],
        eps: f64,
        elementwise_affine: bool,
    ) -> Result<LayerNorm> {
        if eps.is_nan() || eps < 0.0 {
            return Err(Error::shape("LayerNorm", format!("eps must be >= 0, got {eps}")));
        }
        let param = |value: f64| -> Result<Tensor> {
            let t = Tensor::try_full_dtype(normalized_shape, value, DType::F32)?;
            t.try_realize()?;
            Ok(t.requires_grad_(true))
        };
        let (weight, bias) =
            if elementwise_affine { (Some(param(1.0)?), Some(param(0.0)?)) } else { (None, None) };
        Ok(LayerNorm { normalized_shape: normalized_shape.to_vec(), eps, weight, bias })
    }
}

crate::parameters!(LayerNorm { weight, bias });

impl Module for LayerNorm {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        let _at = crate::origin::enter();
        functional::try_layer_norm(
            input,
            &self.normalized_shape,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )
    }
}
