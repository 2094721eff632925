//! Activation functions as modules, for [`super::Sequential`].

use super::{Module, Parameters};
use crate::{Result, Tensor};

macro_rules! activation {
    ($($(#[$doc:meta])* $name:ident => |$x:ident| $body:expr;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name;

        impl Parameters for $name {
            fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Tensor)) {}
            fn visit_mut(&mut self, _: &str, _: &mut dyn FnMut(&str, &mut Tensor)) {}
        }

        impl Module for $name {
            #[track_caller]
            fn try_forward(&self, $x: &Tensor) -> Result<Tensor> {
                let _at = crate::origin::enter();
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
        let _at = crate::origin::enter();
        Ok(x.gelu())
    }
}
