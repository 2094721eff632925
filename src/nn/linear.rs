//! The fully connected layer.

use super::{Module, check_features};
use crate::error::ok;
use crate::{DType, Error, Result, Tensor};

/// `y = x Wᵀ + b`, PyTorch's `nn.Linear`: weight `[out_features, in_features]`, bias
/// `[out_features]`, both drawn from `U(-1/√in, 1/√in)` (PyTorch's default, Kaiming-uniform
/// with `a = √5`). The input may have any number of leading dimensions.
///
/// ```
/// use kiln::nn::{Linear, Module, Parameters};
/// use kiln::prelude::*;
///
/// let layer = Linear::new(784, 128);
/// assert_eq!(layer.weight.dims(), &[128, 784]);
/// assert_eq!(layer.num_parameters(), 784 * 128 + 128);
/// let y = layer.forward(&Tensor::randn([32, 784]));
/// assert_eq!(y.dims(), &[32, 128]);
/// ```
#[derive(Clone, Debug)]
pub struct Linear {
    /// `[out_features, in_features]`.
    pub weight: Tensor,
    /// `[out_features]`, when the layer has one.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A layer with a bias, in `f32`, initialized as PyTorch does.
    ///
    /// # Panics
    /// As [`Linear::try_new`] fails.
    #[must_use]
    #[track_caller]
    pub fn new(in_features: usize, out_features: usize) -> Linear {
        ok(Linear::try_new(in_features, out_features))
    }

    /// [`Linear::new`], returning an error instead of panicking.
    ///
    /// # Errors
    /// As [`Linear::try_with_options`].
    #[track_caller]
    pub fn try_new(in_features: usize, out_features: usize) -> Result<Linear> {
        Linear::try_with_options(in_features, out_features, true, DType::F32)
    }

    /// A layer with or without a bias, in a floating-point `dtype`.
    ///
    /// # Panics
    /// As [`Linear::try_with_options`] fails.
    #[must_use]
    #[track_caller]
    pub fn with_options(
        in_features: usize,
        out_features: usize,
        bias: bool,
        dtype: DType,
    ) -> Linear {
        ok(Linear::try_with_options(in_features, out_features, bias, dtype))
    }

    /// [`Linear::with_options`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::DType`] for a dtype that is not floating point; [`Error::Shape`] for sizes no
    /// memory can hold; [`Error::Runtime`] when the initial values cannot be computed (out of
    /// memory).
    #[track_caller]
    pub fn try_with_options(
        in_features: usize,
        out_features: usize,
        bias: bool,
        dtype: DType,
    ) -> Result<Linear> {
        if !dtype.is_float() {
            return Err(Error::dtype(
                "Linear",
                format!("parameters must be floating point, got {dtype}; use DType::F32"),
            ));
        }
        // PyTorch: kaiming_uniform_(a=sqrt(5)) gives bound = 1/sqrt(fan_in) for the weight,
        // and the bias uses the same bound; a layer with no inputs uses bound 0.
        let bound = if in_features == 0 { 0.0 } else { 1.0 / (in_features as f64).sqrt() };
        let uniform = |shape: &[usize]| -> Result<Tensor> {
            // Once the shape is known to fit, the arithmetic over it cannot fail.
            let t = (Tensor::try_rand(shape)? * (2.0 * bound) - bound).to_dtype(dtype);
            t.try_realize()?;
            Ok(t.requires_grad_(true))
        };
        let weight = uniform(&[out_features, in_features])?;
        let bias = if bias { Some(uniform(&[out_features])?) } else { None };
        Ok(Linear { weight, bias })
    }

    /// A layer from given tensors (loaded weights, say).
    ///
    /// # Errors
    /// [`Error::Shape`] when the weight is not 2-D or the bias does not have
    /// `out_features` elements; [`Error::DType`] when they are not floating point or differ.
    pub fn from_parts(weight: Tensor, bias: Option<Tensor>) -> Result<Linear> {
        if weight.ndim() != 2 {
            return Err(Error::shape(
                "Linear::from_parts",
                format!(
                    "the weight must be 2-D [out_features, in_features], got shape {}",
                    weight.shape()
                ),
            ));
        }
        if !weight.dtype().is_float() {
            return Err(Error::dtype(
                "Linear::from_parts",
                format!("the weight must be floating point, got {}", weight.dtype()),
            ));
        }
        if let Some(b) = &bias {
            if b.dims() != [weight.dims()[0]] {
                return Err(Error::shape(
                    "Linear::from_parts",
                    format!(
                        "the bias must have shape [{}] to match the weight's shape {}, got {}",
                        weight.dims()[0],
                        weight.shape(),
                        b.shape()
                    ),
                ));
            }
            if b.dtype() != weight.dtype() {
                return Err(Error::dtype(
                    "Linear::from_parts",
                    format!(
                        "the bias is {} but the weight is {}; cast one of them",
                        b.dtype(),
                        weight.dtype()
                    ),
                ));
            }
        }
        Ok(Linear { weight, bias })
    }

    /// The number of input features.
    pub fn in_features(&self) -> usize {
        self.weight.dims()[1]
    }

    /// The number of output features.
    pub fn out_features(&self) -> usize {
        self.weight.dims()[0]
    }
}

crate::parameters!(Linear { weight, bias });

impl Module for Linear {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        check_features("Linear", input, self.in_features())?;
        // The transposed weight is a view: the matmul reads it through strides.
        let y = input.try_matmul(&self.weight.try_t()?)?;
        match &self.bias {
            Some(b) => y.try_add(b),
            None => Ok(y),
        }
    }
}
