//! Dropout.

use super::{Module, Parameters, functional};
use crate::error::ok;
use crate::{Error, Result, Tensor};

/// Zeroes each element with probability `p` in training mode and scales the rest by
/// `1/(1-p)`; passes the input through in evaluation mode ([`Parameters::eval`]).
///
/// ```
/// use kiln::nn::{Dropout, Module, Parameters};
/// use kiln::prelude::*;
///
/// let mut drop = Dropout::new(0.5);
/// let x = Tensor::ones([1000]);
/// let kept = drop.forward(&x).gt(0.0).sum().item::<i64>();
/// assert!((400..600).contains(&kept));
/// drop.eval();
/// assert_eq!(drop.forward(&x).sum().item::<f32>(), 1000.0);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    /// The probability of zeroing an element.
    pub p: f64,
    /// Whether the layer is in training mode (the default).
    pub training: bool,
}

impl Dropout {
    /// Dropout with probability `p`, in training mode.
    ///
    /// # Panics
    /// When `p` is not in `[0, 1]`; [`Dropout::try_new`] returns the error.
    #[must_use]
    #[track_caller]
    pub fn new(p: f64) -> Dropout {
        ok(Dropout::try_new(p))
    }

    /// [`Dropout::new`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when `p` is not in `[0, 1]` (or is NaN).
    pub fn try_new(p: f64) -> Result<Dropout> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::shape("Dropout", format!("p must be in [0, 1], got {p}")));
        }
        Ok(Dropout { p, training: true })
    }
}

impl Parameters for Dropout {
    fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Tensor)) {}
    fn visit_mut(&mut self, _: &str, _: &mut dyn FnMut(&str, &mut Tensor)) {}
    fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}

impl Module for Dropout {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        functional::try_dropout(input, self.p, self.training)
    }
}
