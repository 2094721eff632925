//! Activation functions as modules, for [`super::Sequential`], and the macros that declare
//! such modules (used by `pointwise.rs`, and `arguments!` by `criteria.rs` too).

use super::{Module, Parameters};
use crate::{Result, Tensor};

/// A struct of PyTorch's constructor arguments, each a public field with PyTorch's default.
macro_rules! arguments {
    ($($(#[$doc:meta])* $name:ident { $($field:ident: $t:ty = $default:expr),* $(,)? })*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq)]
        #[allow(clippy::upper_case_acronyms, reason = "PyTorch's names, so users find them")]
        pub struct $name { $(#[doc = "PyTorch's argument of this name."] pub $field: $t),* }

        impl Default for $name {
            fn default() -> $name {
                $name { $($field: $default),* }
            }
        }
    )*};
}

/// Activation modules without arguments: unit structs computing `$body` of the input.
macro_rules! activation {
    ($($(#[$doc:meta])* $name:ident => |$x:ident| $body:expr;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[allow(clippy::upper_case_acronyms, reason = "PyTorch's names, so users find them")]
        pub struct $name;

        impl Parameters for $name {
            fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Tensor)) {}
            fn visit_mut(&mut self, _: &str, _: &mut dyn FnMut(&str, &mut Tensor)) {}
        }

        impl Module for $name {
            #[track_caller]
            fn try_forward(&self, $x: &Tensor) -> Result<Tensor> {
                let _at = crate::engine::origin::enter();
                $body
            }
        }
    )*};
}

activation! {
    /// `max(x, 0)`.
    ReLU => |x| x.try_relu();
    /// The logistic function `1 / (1 + e^-x)`.
    Sigmoid => |x| Ok(x.sigmoid());
    /// The hyperbolic tangent.
    Tanh => |x| Ok(x.tanh());
    /// `x·σ(x)` ([`Tensor::silu`], PyTorch's `nn.SiLU`).
    SiLU => |x| Ok(x.silu());
    /// GELU with the tanh approximation ([`Tensor::gelu_tanh`], PyTorch's
    /// `nn.GELU(approximate="tanh")`).
    GELUTanh => |x| Ok(x.gelu_tanh());
    /// The input itself (PyTorch's `nn.Identity`: a placeholder where a layer is optional).
    Identity => |x| Ok(x.clone());
}

/// `x` where positive, `slope·x` elsewhere (PyTorch's `nn.LeakyReLU`; its default slope
/// is 0.01, [`LeakyReLU::default`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeakyReLU(pub f64);

impl Default for LeakyReLU {
    fn default() -> LeakyReLU {
        LeakyReLU(0.01)
    }
}

/// `x` where positive, `α·(e^x - 1)` elsewhere (PyTorch's `nn.ELU`; default `α = 1`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ELU(pub f64);

impl Default for ELU {
    fn default() -> ELU {
        ELU(1.0)
    }
}

/// `ln(1 + e^(β·x)) / β`, linear above `threshold` (PyTorch's `nn.Softplus`; defaults
/// `β = 1`, `threshold = 20`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Softplus {
    /// The sharpness `β`.
    pub beta: f64,
    /// Above `β·x > threshold` the result is `x`.
    pub threshold: f64,
}

impl Default for Softplus {
    fn default() -> Softplus {
        Softplus { beta: 1.0, threshold: 20.0 }
    }
}

/// `Module` (and empty `Parameters`) for activation structs with arguments: `$body` of the
/// struct and the input.
macro_rules! parameterized_activation {
    ($($name:ident => |$s:ident, $x:ident| $body:expr;)*) => {$(
        impl Parameters for $name {
            fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Tensor)) {}
            fn visit_mut(&mut self, _: &str, _: &mut dyn FnMut(&str, &mut Tensor)) {}
        }

        impl Module for $name {
            #[track_caller]
            fn try_forward(&self, $x: &Tensor) -> Result<Tensor> {
                let _at = crate::engine::origin::enter();
                let $s = self;
                Ok($body)
            }
        }
    )*};
}

parameterized_activation! {
    LeakyReLU => |s, x| x.leaky_relu(s.0);
    ELU => |s, x| x.elu(s.0);
    Softplus => |s, x| x.softplus(s.beta, s.threshold);
}

/// The Gaussian error linear unit `x·Φ(x)`, exact (through `erf`) as PyTorch's default.
#[allow(clippy::upper_case_acronyms)] // PyTorch's name, so users find it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GELU;

impl Parameters for GELU {
    fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Tensor)) {}
    fn visit_mut(&mut self, _: &str, _: &mut dyn FnMut(&str, &mut Tensor)) {}
}

impl Module for GELU {
    #[track_caller]
    fn try_forward(&self, x: &Tensor) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        Ok(x.gelu())
    }
}
