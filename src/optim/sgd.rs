//! Stochastic gradient descent.

use super::{Optimizer, check, grad_of, realize};
use crate::error::ok;
use crate::{Error, Result, Tensor};

/// Hyperparameters of [`Sgd`]; the defaults are PyTorch's (with `lr = 0.01`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SgdConfig {
    /// The learning rate.
    pub lr: f64,
    /// The momentum factor (0: plain SGD).
    pub momentum: f64,
    /// Dampening of the gradient's share of the momentum.
    pub dampening: f64,
    /// L2 penalty added to the gradient: `g + weight_decay·p`.
    pub weight_decay: f64,
    /// Nesterov momentum (needs `momentum > 0` and `dampening == 0`).
    pub nesterov: bool,
}

impl Default for SgdConfig {
    fn default() -> SgdConfig {
        SgdConfig { lr: 0.01, momentum: 0.0, dampening: 0.0, weight_decay: 0.0, nesterov: false }
    }
}

/// SGD with optional momentum, Nesterov momentum and weight decay, as PyTorch's `optim.SGD`:
///
/// ```text
/// g = grad + weight_decay·p
/// b = g                                 (first step)
/// b = momentum·b + (1 - dampening)·g    (later steps)
/// g = g + momentum·b  if nesterov, else b
/// p = p - lr·g
/// ```
///
/// ```
/// use kiln::optim::{Optimizer, Sgd, SgdConfig};
/// use kiln::prelude::*;
///
/// let p = Tensor::from_vec(vec![1.0f32], [1]).requires_grad_(true);
/// let mut opt = Sgd::new(vec![p.clone()], SgdConfig { lr: 0.1, ..Default::default() });
/// (&p * 2.0).sum().backward();
/// opt.step();
/// assert_eq!(p.to_vec::<f32>(), vec![0.8]);
/// ```
#[derive(Debug)]
pub struct Sgd {
    params: Vec<Tensor>,
    config: SgdConfig,
    momentum_buffers: Vec<Option<Tensor>>,
}

impl Sgd {
    /// An optimizer over `params`.
    ///
    /// # Panics
    /// As [`Sgd::try_new`] fails.
    #[track_caller]
    #[must_use]
    pub fn new(params: Vec<Tensor>, config: SgdConfig) -> Sgd {
        ok(Sgd::try_new(params, config))
    }

    /// [`Sgd::new`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Value`] for a negative learning rate, momentum or weight decay, or Nesterov
    /// momentum without momentum or with dampening; [`Error::Autograd`] for a parameter that
    /// does not require grad.
    pub fn try_new(params: Vec<Tensor>, config: SgdConfig) -> Result<Sgd> {
        const OP: &str = "Sgd::new";
        check(OP, "lr", config.lr, 0.0)?;
        check(OP, "momentum", config.momentum, 0.0)?;
        check(OP, "dampening", config.dampening, 0.0)?;
        check(OP, "weight_decay", config.weight_decay, 0.0)?;
        if config.nesterov && (config.momentum <= 0.0 || config.dampening != 0.0) {
            return Err(Error::value(
                OP,
                "Nesterov momentum requires momentum > 0 and dampening == 0",
            ));
        }
        check_params(OP, &params)?;
        let momentum_buffers = vec![None; params.len()];
        Ok(Sgd { params, config, momentum_buffers })
    }

    /// The hyperparameters.
    pub fn config(&self) -> &SgdConfig {
        &self.config
    }
}

impl Optimizer for Sgd {
    #[track_caller]
    fn try_step(&mut self) -> Result<()> {
        let _at = crate::origin::enter();
        let c = self.config;
        crate::no_grad(|| {
            let mut touched = Vec::new();
            for (p, buf) in self.params.iter().zip(&mut self.momentum_buffers) {
                let Some(mut g) = grad_of("Sgd::step", p)? else { continue };
                if c.weight_decay != 0.0 {
                    g = g + p * c.weight_decay;
                }
                if c.momentum != 0.0 {
                    let b = match buf.take() {
                        None => g.clone(),
                        Some(b) => b * c.momentum + &g * (1.0 - c.dampening),
                    };
                    g = if c.nesterov { g + &b * c.momentum } else { b.clone() };
                    touched.push(b.clone());
                    *buf = Some(b);
                }
                p.try_sub_(&(g * c.lr))?;
                touched.push(p.clone());
            }
            realize(&touched.iter().collect::<Vec<_>>())
        })
    }

    fn parameters(&self) -> &[Tensor] {
        &self.params
    }

    fn lr(&self) -> f64 {
        self.config.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.config.lr = lr;
    }
}

/// Every parameter must be a float leaf that requires grad, or its update would be lost.
pub(super) fn check_params(op: &'static str, params: &[Tensor]) -> Result<()> {
    for (i, p) in params.iter().enumerate() {
        if !p.requires_grad() || !p.is_leaf() {
            return Err(Error::Autograd {
                op,
                detail: format!(
                    "parameter {i} (shape {}) is not a leaf that requires grad, so it would never get a gradient; call .requires_grad_(true) on it, or leave it out",
                    p.shape()
                ),
            });
        }
    }
    Ok(())
}
