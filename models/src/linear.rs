//! A model's projection: a weight `[out, in]` (applied as `x @ wᵀ`, a product that reads the
//! weight's rows in place), an optional bias, and an optional LoRA adapter
//! ([`crate::lora`]).

use kiln::nn::functional as F;
use kiln::{DType, Result, Tensor};

use crate::checkpoint::Loader;
use crate::lora::Adapter;
use crate::quantize::QuantKind;
use crate::quantized::Quantized;

/// A projection `y = x Wᵀ + b`, and `+ s·(x Aᵀ) Bᵀ` with a LoRA adapter.
#[derive(Debug)]
pub struct Linear {
    /// `[out, in]` floats, or a quantized weight's GGML blocks (u8 `[out, row bytes]`) or
    /// int8 rows (`i8` `[out, in]`, scaled by [`Quantized::scales`]).
    pub(crate) weight: Tensor,
    pub(crate) bias: Option<Tensor>,
    pub(crate) adapter: Option<Adapter>,
    /// The blocks of a weight kept quantized ([`crate::LoadOptions::keep_quantized`]).
    pub(crate) quantized: Option<Quantized>,
}

impl Linear {
    /// `name.weight` (`[out, in]`) and, when `bias`, `name.bias` from the loader.
    pub(crate) fn load(l: &mut Loader<'_>, name: &str, out: usize, inp: usize, bias: bool) -> Self {
        let (weight, quantized) = l.take_projection(&format!("{name}.weight"), out, inp);
        Linear {
            weight,
            bias: bias.then(|| l.take(&format!("{name}.bias"), &[out])),
            adapter: None,
            quantized,
        }
    }

    /// The weight, `[out, in]`; for a weight kept quantized, its GGML blocks (u8
    /// `[out, row bytes]`) or int8 rows (`i8` `[out, in]`), as [`Linear::quantized`] says.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }

    /// How a weight kept quantized is stored.
    pub fn quantized(&self) -> Option<QuantKind> {
        self.quantized.as_ref().map(|q| q.kind)
    }

    /// The scales of a per-channel int8 weight (f32 `[out]`).
    pub fn scales(&self) -> Option<&Tensor> {
        self.quantized.as_ref().and_then(|q| q.scales.as_ref())
    }

    /// `(out, in)`.
    pub fn features(&self) -> (usize, usize) {
        let d = self.weight.dims();
        match self.quantized.as_ref().map(|q| q.kind) {
            Some(QuantKind::Blocks(kind)) => {
                let (values, size) = kind.block().unwrap_or((1, 1));
                (d[0], d[1] / size * values)
            }
            Some(QuantKind::Int8) | None => (d[0], d[1]),
        }
    }

    /// The dtype the projection computes in (f32 for a quantized weight).
    pub fn dtype(&self) -> DType {
        if self.quantized.is_some() { DType::F32 } else { self.weight.dtype() }
    }

    /// The bias, `[out]`.
    pub fn bias(&self) -> Option<&Tensor> {
        self.bias.as_ref()
    }

    /// The LoRA adapter, when one is attached.
    pub fn adapter(&self) -> Option<&Adapter> {
        self.adapter.as_ref()
    }

    /// `x Wᵀ + b` over `x`'s last dimension, plus the adapter's `s·(dropout(x) Aᵀ) Bᵀ`: the
    /// sum, the scale and the bias are elementwise and fuse into one kernel after the
    /// products; `W + s·BA` is never formed.
    ///
    /// # Errors
    /// When `x`'s last dimension is not the weight's `in`.
    pub fn apply(&self, x: &Tensor) -> Result<Tensor> {
        let mut y = match &self.quantized {
            Some(q) => crate::quantized::matmul_t(x, q, &self.weight)?.to_dtype(x.dtype()),
            None => x.try_matmul(&self.weight.t())?,
        };
        if let Some(a) = &self.adapter {
            let x = match a.dropout > 0.0 && a.training {
                true => F::try_dropout(x, a.dropout, true)?,
                false => x.clone(),
            };
            let low = x.try_matmul(&a.a.t())?.try_matmul(&a.b.t())?;
            y = y + low * a.scale;
        }
        Ok(match &self.bias {
            Some(b) => y + b,
            None => y,
        })
    }
}
