//! Stochastic gradient descent.

use super::groups::Groups;
use super::{GroupConfig, Optimizer, ParamGroup, StateDict, check, grad_of, realize, write};
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
    groups: Groups,
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
        Sgd::with_groups(vec![ParamGroup::new(params)], config)
    }

    /// An optimizer over parameter groups, each taking the hyperparameters it leaves unset
    /// from `config` (PyTorch's `SGD([{"params": ...}, ...])`).
    ///
    /// # Errors
    /// As [`Sgd::try_new`], and [`Error::Value`] for an empty list of groups.
    pub fn with_groups(groups: Vec<ParamGroup>, config: SgdConfig) -> Result<Sgd> {
        const OP: &str = "Sgd::new";
        check(OP, "momentum", config.momentum, 0.0)?;
        check(OP, "dampening", config.dampening, 0.0)?;
        if config.nesterov && (config.momentum <= 0.0 || config.dampening != 0.0) {
            return Err(Error::value(
                OP,
                "Nesterov momentum requires momentum > 0 and dampening == 0",
            ));
        }
        let groups = Groups::new(OP, groups, config.lr, config.weight_decay)?;
        let momentum_buffers = vec![None; groups.params.len()];
        Ok(Sgd { groups, config, momentum_buffers })
    }

    /// The hyperparameters given at construction (each group's `lr` and `weight_decay`
    /// are in [`Optimizer::param_groups`]).
    pub fn config(&self) -> &SgdConfig {
        &self.config
    }
}

impl Sgd {
    /// One update, left undone where `skip` (a 0-d bool) is true; `skip` is realized with it.
    fn update(&mut self, skip: Option<&Tensor>) -> Result<()> {
        let c = self.config;
        crate::no_grad(|| {
            let mut touched = Vec::new();
            for ((_, p, group), buf) in self.groups.each().zip(&mut self.momentum_buffers) {
                let Some(mut g) = grad_of("Sgd::step", p)? else { continue };
                if group.weight_decay != 0.0 {
                    g = g + p * group.weight_decay;
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
                write(p, &(p - g * group.lr), skip)?;
                touched.push(p.clone());
            }
            touched.extend(skip.cloned());
            realize(&touched.iter().collect::<Vec<_>>())
        })
    }
}

impl Optimizer for Sgd {
    #[track_caller]
    fn try_step(&mut self) -> Result<()> {
        let _at = crate::engine::origin::enter();
        self.update(None)
    }

    #[track_caller]
    fn try_step_unless(&mut self, skip: &Tensor) -> Result<bool> {
        let _at = crate::engine::origin::enter();
        let saved = self.momentum_buffers.clone();
        self.update(Some(skip))?;
        if skip.try_item::<bool>()? {
            self.momentum_buffers = saved;
            return Ok(false);
        }
        Ok(true)
    }

    fn parameters(&self) -> &[Tensor] {
        &self.groups.params
    }

    fn param_groups(&self) -> &[GroupConfig] {
        &self.groups.configs
    }

    fn param_groups_mut(&mut self) -> &mut [GroupConfig] {
        &mut self.groups.configs
    }

    fn state_dict(&self) -> StateDict {
        let mut state = StateDict::default();
        self.groups.save(&mut state);
        for (i, b) in self.momentum_buffers.iter().enumerate() {
            if let Some(b) = b {
                state.tensors.push((format!("state.{i}.momentum_buffer"), b.clone()));
            }
        }
        state
    }

    fn load_state_dict(&mut self, state: &StateDict) -> Result<()> {
        const OP: &str = "Sgd::load_state_dict";
        let configs = self.groups.load(OP, state)?;
        let buffers = self
            .groups
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| state.tensor(OP, &format!("state.{i}.momentum_buffer"), p))
            .collect::<Result<Vec<_>>>()?;
        self.groups.configs = configs;
        self.momentum_buffers = buffers;
        Ok(())
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
