//! Normalization layers.

use super::{Module, functional};
use crate::{Result, Tensor};

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
    #[must_use]
    pub fn new(normalized_shape: &[usize]) -> LayerNorm {
        LayerNorm::with_options(normalized_shape, 1e-5, true)
    }

    /// A layer norm with a chosen `eps`, with or without the learned scale and shift.
    #[must_use]
    pub fn with_options(
        normalized_shape: &[usize],
        eps: f64,
        elementwise_affine: bool,
    ) -> LayerNorm {
        let param = |t: Tensor| t.realize().requires_grad_(true);
        LayerNorm {
            normalized_shape: normalized_shape.to_vec(),
            eps,
            weight: elementwise_affine.then(|| param(Tensor::ones(normalized_shape))),
            bias: elementwise_affine.then(|| param(Tensor::zeros(normalized_shape))),
        }
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
