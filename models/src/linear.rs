//! A model's projection: a weight `[out, in]` (applied as `x @ wᵀ`, a product that reads the
//! weight's rows in place), an optional bias, and an optional LoRA adapter
//! ([`crate::lora`]).

use kiln::nn::functional as F;
use kiln::{Result, Tensor};

use crate::checkpoint::Loader;
use crate::lora::Adapter;

/// A projection `y = x Wᵀ + b`, and `+ s·(x Aᵀ) Bᵀ` with a LoRA adapter.
#[derive(Debug)]
pub struct Linear {
    pub(crate) weight: Tensor,
    pub(crate) bias: Option<Tensor>,
    pub(crate) adapter: Option<Adapter>,
}

impl Linear {
    /// `name.weight` (`[out, in]`) and, when `bias`, `name.bias` from the loader.
    pub(crate) fn load(l: &mut Loader<'_>, name: &str, out: usize, inp: usize, bias: bool) -> Self {
        Linear {
            weight: l.take(&format!("{name}.weight"), &[out, inp]),
            bias: bias.then(|| l.take(&format!("{name}.bias"), &[out])),
            adapter: None,
        }
    }

    /// The weight, `[out, in]`.
    pub fn weight(&self) -> &Tensor {
        &self.weight
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
        let mut y = x.try_matmul(&self.weight.t())?;
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
