//! Adam and AdamW.

use super::groups::Groups;
use super::{GroupConfig, Optimizer, ParamGroup, StateDict, check, grad_of, realize, write};
use crate::error::ok;
use crate::{Error, Result, Tensor};

/// Hyperparameters of [`Adam`] and [`AdamW`]; the defaults are PyTorch's Adam defaults
/// ([`AdamConfig::adamw`] gives AdamW's, with `weight_decay = 0.01`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    /// The learning rate.
    pub lr: f64,
    /// Decay rates of the first and second moment estimates.
    pub betas: (f64, f64),
    /// Added to the denominator for stability.
    pub eps: f64,
    /// Adam: L2 penalty added to the gradient. AdamW: decoupled decay `p·(1 - lr·wd)`.
    pub weight_decay: f64,
}

impl Default for AdamConfig {
    fn default() -> AdamConfig {
        AdamConfig { lr: 1e-3, betas: (0.9, 0.999), eps: 1e-8, weight_decay: 0.0 }
    }
}

impl AdamConfig {
    /// PyTorch's AdamW defaults: Adam's, with `weight_decay = 0.01`.
    #[must_use]
    pub fn adamw() -> AdamConfig {
        AdamConfig { weight_decay: 0.01, ..AdamConfig::default() }
    }
}

/// Adam (Kingma & Ba), as PyTorch's `optim.Adam`:
///
/// ```text
/// g = grad + weight_decay·p
/// m = β1·m + (1-β1)·g        v = β2·v + (1-β2)·g²
/// p = p - lr/(1-β1ᵗ) · m / (√v/√(1-β2ᵗ) + eps)
/// ```
///
/// ```
/// use kiln::optim::{Adam, AdamConfig, Optimizer};
/// use kiln::prelude::*;
///
/// let p = Tensor::from_vec(vec![1.0f32], [1]).requires_grad_(true);
/// let mut opt = Adam::new(vec![p.clone()], AdamConfig { lr: 0.1, ..Default::default() });
/// (&p * 3.0).sum().backward();
/// opt.step(); // the first Adam step moves by lr·sign(g)
/// assert!((p.to_vec::<f32>()[0] - 0.9).abs() < 1e-6);
/// ```
#[derive(Debug)]
pub struct Adam {
    inner: AdamState,
}

/// AdamW (Loshchilov & Hutter): Adam with decoupled weight decay, `p = p·(1 - lr·wd)`
/// before the Adam update, as PyTorch's `optim.AdamW`.
#[derive(Debug)]
pub struct AdamW {
    inner: AdamState,
}

#[derive(Debug)]
struct AdamState {
    groups: Groups,
    config: AdamConfig,
    step: u64,
    moments: Vec<Option<(Tensor, Tensor)>>,
    decoupled: bool,
}

macro_rules! adam_like {
    ($name:ident, $decoupled:expr, $op:literal) => {
        impl $name {
            /// An optimizer over `params`.
            ///
            /// # Panics
            #[doc = concat!("As [`", stringify!($name), "::try_new`] fails.")]
            #[track_caller]
            #[must_use]
            pub fn new(params: Vec<Tensor>, config: AdamConfig) -> $name {
                ok($name::try_new(params, config))
            }

            #[doc = concat!("[`", stringify!($name), "::new`], returning an error instead of panicking.")]
            ///
            /// # Errors
            /// [`Error::Value`] for a negative learning rate, eps or weight decay, or betas
            /// outside `[0, 1)`; [`Error::Autograd`] for a parameter that does not require grad.
            pub fn try_new(params: Vec<Tensor>, config: AdamConfig) -> Result<$name> {
                $name::with_groups(vec![ParamGroup::new(params)], config)
            }

            /// An optimizer over parameter groups, each taking the `lr` and `weight_decay`
            /// it leaves unset from `config` (PyTorch's `param_groups`).
            ///
            /// # Errors
            #[doc = concat!("As [`", stringify!($name), "::try_new`], and [`Error::Value`] for an empty list of groups.")]
            pub fn with_groups(groups: Vec<ParamGroup>, config: AdamConfig) -> Result<$name> {
                AdamState::new($op, groups, config, $decoupled).map(|inner| $name { inner })
            }

            /// The hyperparameters given at construction (each group's `lr` and
            /// `weight_decay` are in [`Optimizer::param_groups`]).
            pub fn config(&self) -> &AdamConfig {
                &self.inner.config
            }

            /// The number of steps taken.
            pub fn steps(&self) -> u64 {
                self.inner.step
            }
        }

        impl Optimizer for $name {
            #[track_caller]
            fn try_step(&mut self) -> Result<()> {
                let _at = crate::engine::origin::enter();
                self.inner.step(None)
            }

            #[track_caller]
            fn try_step_unless(&mut self, skip: &Tensor) -> Result<bool> {
                let _at = crate::engine::origin::enter();
                let saved = (self.inner.moments.clone(), self.inner.step);
                self.inner.step(Some(skip))?;
                if skip.try_item::<bool>()? {
                    (self.inner.moments, self.inner.step) = saved;
                    return Ok(false);
                }
                Ok(true)
            }

            fn parameters(&self) -> &[Tensor] {
                &self.inner.groups.params
            }

            fn param_groups(&self) -> &[GroupConfig] {
                &self.inner.groups.configs
            }

            fn param_groups_mut(&mut self) -> &mut [GroupConfig] {
                &mut self.inner.groups.configs
            }

            fn state_dict(&self) -> StateDict {
                self.inner.state_dict()
            }

            fn load_state_dict(&mut self, state: &StateDict) -> Result<()> {
                self.inner.load_state_dict(concat!(stringify!($name), "::load_state_dict"), state)
            }
        }
    };
}

adam_like!(Adam, false, "Adam::new");
adam_like!(AdamW, true, "AdamW::new");

impl AdamState {
    fn new(
        op: &'static str,
        groups: Vec<ParamGroup>,
        config: AdamConfig,
        decoupled: bool,
    ) -> Result<AdamState> {
        check(op, "eps", config.eps, 0.0)?;
        for (name, beta) in [("betas.0", config.betas.0), ("betas.1", config.betas.1)] {
            if !(0.0..1.0).contains(&beta) {
                return Err(Error::value(op, format!("{name} must be in [0, 1), got {beta}")));
            }
        }
        let groups = Groups::new(op, groups, config.lr, config.weight_decay)?;
        let moments = vec![None; groups.params.len()];
        Ok(AdamState { groups, config, step: 0, moments, decoupled })
    }

    fn state_dict(&self) -> StateDict {
        let mut state = StateDict::default();
        self.groups.save(&mut state);
        state.scalars.insert("step".into(), self.step as f64);
        for (i, m) in self.moments.iter().enumerate() {
            if let Some((m, v)) = m {
                state.tensors.push((format!("state.{i}.exp_avg"), m.clone()));
                state.tensors.push((format!("state.{i}.exp_avg_sq"), v.clone()));
            }
        }
        state
    }

    fn load_state_dict(&mut self, op: &'static str, state: &StateDict) -> Result<()> {
        let configs = self.groups.load(op, state)?;
        let step = state.scalar(op, "step")?;
        let mut moments = Vec::new();
        for (i, p) in self.groups.params.iter().enumerate() {
            let m = state.tensor(op, &format!("state.{i}.exp_avg"), p)?;
            let v = state.tensor(op, &format!("state.{i}.exp_avg_sq"), p)?;
            moments.push(match (m, v) {
                (Some(m), Some(v)) => Some((m, v)),
                (None, None) => None,
                _ => {
                    return Err(Error::value(
                        op,
                        format!("the state has only one of parameter {i}'s two moments"),
                    ));
                }
            });
        }
        self.groups.configs = configs;
        self.step = step as u64;
        self.moments = moments;
        Ok(())
    }

    /// One update, left undone where `skip` (a 0-d bool) is true; `skip` is realized with it.
    fn step(&mut self, skip: Option<&Tensor>) -> Result<()> {
        let c = self.config;
        let (b1, b2) = c.betas;
        self.step += 1;
        let t = i32::try_from(self.step).unwrap_or(i32::MAX);
        let correction1 = 1.0 - b1.powi(t);
        let sqrt_correction2 = (1.0 - b2.powi(t)).sqrt();
        crate::no_grad(|| {
            let mut touched = Vec::new();
            for ((_, p, group), moments) in self.groups.each().zip(&mut self.moments) {
                let Some(mut g) = grad_of("Adam::step", p)? else { continue };
                let step_size = group.lr / correction1;
                let mut decayed = p.clone();
                if group.weight_decay != 0.0 {
                    if self.decoupled {
                        decayed = p * (1.0 - group.lr * group.weight_decay);
                    } else {
                        g = g + p * group.weight_decay;
                    }
                }
                let (m, v) = match moments.take() {
                    None => (&g * (1.0 - b1), g.square() * (1.0 - b2)),
                    Some((m, v)) => (m * b1 + &g * (1.0 - b1), v * b2 + g.square() * (1.0 - b2)),
                };
                let denom = v.sqrt() / sqrt_correction2 + c.eps;
                write(p, &(decayed - &m / &denom * step_size), skip)?;
                touched.extend([p.clone(), m.clone(), v.clone()]);
                *moments = Some((m, v));
            }
            touched.extend(skip.cloned());
            realize(&touched.iter().collect::<Vec<_>>())
        })
    }
}
