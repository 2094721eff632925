//! Learning-rate schedules.

use super::Optimizer;

/// A learning-rate schedule: call [`LrScheduler::step`] once per epoch (or per step, as you
/// define the period), after the optimizer's steps, as in PyTorch.
pub trait LrScheduler {
    /// Advances the schedule by one period and sets the optimizer's learning rate.
    fn step(&mut self, optimizer: &mut dyn Optimizer);

    /// The learning rate the schedule set last (the base rate before the first step).
    fn last_lr(&self) -> f64;
}

/// Multiplies the learning rate by `gamma` every `step_size` periods (PyTorch's `StepLR`).
///
/// ```
/// use kiln::optim::{LrScheduler, Optimizer, Sgd, SgdConfig, StepLr};
/// use kiln::prelude::*;
///
/// let p = Tensor::zeros([1]).requires_grad_(true);
/// let mut opt = Sgd::new(vec![p], SgdConfig { lr: 1.0, ..Default::default() });
/// let mut sched = StepLr::new(&opt, 2, 0.5);
/// let lrs: Vec<f64> = (0..5).map(|_| { sched.step(&mut opt); opt.lr() }).collect();
/// assert_eq!(lrs, [1.0, 0.5, 0.5, 0.25, 0.25]);
/// ```
#[derive(Clone, Debug)]
pub struct StepLr {
    base_lr: f64,
    step_size: usize,
    gamma: f64,
    epoch: usize,
}

impl StepLr {
    /// A schedule starting from the optimizer's current learning rate. A `step_size` of 0
    /// is treated as 1.
    #[must_use]
    pub fn new(optimizer: &dyn Optimizer, step_size: usize, gamma: f64) -> StepLr {
        StepLr { base_lr: optimizer.lr(), step_size: step_size.max(1), gamma, epoch: 0 }
    }

    fn lr_at(&self, epoch: usize) -> f64 {
        let decays = i32::try_from(epoch / self.step_size).unwrap_or(i32::MAX);
        self.base_lr * self.gamma.powi(decays)
    }
}

impl LrScheduler for StepLr {
    fn step(&mut self, optimizer: &mut dyn Optimizer) {
        self.epoch += 1;
        optimizer.set_lr(self.lr_at(self.epoch));
    }

    fn last_lr(&self) -> f64 {
        self.lr_at(self.epoch)
    }
}

/// Cosine annealing from the base rate to `eta_min` over `t_max` periods (PyTorch's
/// `CosineAnnealingLR`): `eta_min + (base - eta_min)·(1 + cos(π·t/t_max))/2`.
///
/// ```
/// use kiln::optim::{CosineAnnealingLr, LrScheduler, Optimizer, Sgd, SgdConfig};
/// use kiln::prelude::*;
///
/// let p = Tensor::zeros([1]).requires_grad_(true);
/// let mut opt = Sgd::new(vec![p], SgdConfig { lr: 1.0, ..Default::default() });
/// let mut sched = CosineAnnealingLr::new(&opt, 4, 0.0);
/// for _ in 0..2 { sched.step(&mut opt); }
/// assert!((opt.lr() - 0.5).abs() < 1e-12);
/// for _ in 0..2 { sched.step(&mut opt); }
/// assert!(opt.lr().abs() < 1e-12);
/// ```
#[derive(Clone, Debug)]
pub struct CosineAnnealingLr {
    base_lr: f64,
    t_max: usize,
    eta_min: f64,
    epoch: usize,
}

impl CosineAnnealingLr {
    /// A schedule from the optimizer's current rate down to `eta_min` at period `t_max`
    /// (0 is treated as 1).
    #[must_use]
    pub fn new(optimizer: &dyn Optimizer, t_max: usize, eta_min: f64) -> CosineAnnealingLr {
        CosineAnnealingLr { base_lr: optimizer.lr(), t_max: t_max.max(1), eta_min, epoch: 0 }
    }

    fn lr_at(&self, epoch: usize) -> f64 {
        let phase = std::f64::consts::PI * epoch as f64 / self.t_max as f64;
        self.eta_min + (self.base_lr - self.eta_min) * (1.0 + phase.cos()) / 2.0
    }
}

impl LrScheduler for CosineAnnealingLr {
    fn step(&mut self, optimizer: &mut dyn Optimizer) {
        self.epoch += 1;
        optimizer.set_lr(self.lr_at(self.epoch));
    }

    fn last_lr(&self) -> f64 {
        self.lr_at(self.epoch)
    }
}
