//! Learning-rate schedules.

use super::Optimizer;

/// A learning-rate schedule: a function of the period count and each group's base rate.
/// Call [`LrScheduler::step`] once per period (an epoch or a step, as you define it), after
/// the optimizer's step, as in PyTorch. A schedule sets the optimizer's rates for period 0
/// when it is built, and records every group's rate at that moment as its base rate.
pub trait LrScheduler {
    /// The rate at period `epoch` of a group whose base rate is `base_lr`.
    fn lr_at(&self, epoch: usize, base_lr: f64) -> f64;

    /// The schedule's position and base rates (what a checkpoint saves).
    fn state(&self) -> &SchedulerState;

    /// Mutable access to the position (what resuming from a checkpoint restores).
    fn state_mut(&mut self) -> &mut SchedulerState;

    /// Advances the schedule by one period and sets every group's learning rate.
    fn step(&mut self, optimizer: &mut dyn Optimizer) {
        self.state_mut().epoch += 1;
        apply(self, optimizer);
    }

    /// The first group's rate at the current period.
    fn last_lr(&self) -> f64 {
        let state = self.state();
        self.lr_at(state.epoch, state.base_lrs.first().copied().unwrap_or(0.0))
    }
}

/// Where a schedule stands: the number of periods stepped and every group's base rate.
#[derive(Clone, Debug, PartialEq)]
pub struct SchedulerState {
    /// Periods stepped so far.
    pub epoch: usize,
    /// Every parameter group's base learning rate.
    pub base_lrs: Vec<f64>,
}

impl SchedulerState {
    fn new(optimizer: &dyn Optimizer) -> SchedulerState {
        SchedulerState {
            epoch: 0,
            base_lrs: optimizer.param_groups().iter().map(|g| g.lr).collect(),
        }
    }
}

/// Sets every group's rate for the schedule's current period.
fn apply<S: LrScheduler + ?Sized>(schedule: &S, optimizer: &mut dyn Optimizer) {
    let state = schedule.state();
    for (group, base) in optimizer.param_groups_mut().iter_mut().zip(&state.base_lrs) {
        group.lr = schedule.lr_at(state.epoch, *base);
    }
}

/// Builds a schedule over `optimizer` and sets the rates of its period 0.
fn start<S: LrScheduler>(
    optimizer: &mut dyn Optimizer,
    make: impl FnOnce(SchedulerState) -> S,
) -> S {
    let schedule = make(SchedulerState::new(optimizer));
    apply(&schedule, optimizer);
    schedule
}

/// The `state`/`state_mut` pair every schedule stores in a `state` field.
macro_rules! holds_state {
    () => {
        fn state(&self) -> &SchedulerState {
            &self.state
        }

        fn state_mut(&mut self) -> &mut SchedulerState {
            &mut self.state
        }
    };
}

/// Multiplies the learning rate by `gamma` every `step_size` periods (PyTorch's `StepLR`).
///
/// ```
/// use kiln::optim::{LrScheduler, Optimizer, Sgd, SgdConfig, StepLr};
/// use kiln::prelude::*;
///
/// let p = Tensor::zeros([1]).requires_grad_(true);
/// let mut opt = Sgd::new(vec![p], SgdConfig { lr: 1.0, ..Default::default() });
/// let mut sched = StepLr::new(&mut opt, 2, 0.5);
/// let lrs: Vec<f64> = (0..5).map(|_| { sched.step(&mut opt); opt.lr() }).collect();
/// assert_eq!(lrs, [1.0, 0.5, 0.5, 0.25, 0.25]);
/// ```
#[derive(Clone, Debug)]
pub struct StepLr {
    state: SchedulerState,
    step_size: usize,
    gamma: f64,
}

impl StepLr {
    /// A schedule starting from the optimizer's current rates. A `step_size` of 0 is
    /// treated as 1.
    pub fn new(optimizer: &mut dyn Optimizer, step_size: usize, gamma: f64) -> StepLr {
        start(optimizer, |state| StepLr { state, step_size: step_size.max(1), gamma })
    }
}

impl LrScheduler for StepLr {
    fn lr_at(&self, epoch: usize, base_lr: f64) -> f64 {
        let decays = i32::try_from(epoch / self.step_size).unwrap_or(i32::MAX);
        base_lr * self.gamma.powi(decays)
    }

    holds_state!();
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
/// let mut sched = CosineAnnealingLr::new(&mut opt, 4, 0.0);
/// for _ in 0..2 { sched.step(&mut opt); }
/// assert!((opt.lr() - 0.5).abs() < 1e-12);
/// for _ in 0..2 { sched.step(&mut opt); }
/// assert!(opt.lr().abs() < 1e-12);
/// ```
#[derive(Clone, Debug)]
pub struct CosineAnnealingLr {
    state: SchedulerState,
    t_max: usize,
    eta_min: f64,
}

impl CosineAnnealingLr {
    /// A schedule from the optimizer's current rates down to `eta_min` at period `t_max`
    /// (0 is treated as 1).
    pub fn new(optimizer: &mut dyn Optimizer, t_max: usize, eta_min: f64) -> CosineAnnealingLr {
        start(optimizer, |state| CosineAnnealingLr { state, t_max: t_max.max(1), eta_min })
    }
}

impl LrScheduler for CosineAnnealingLr {
    fn lr_at(&self, epoch: usize, base_lr: f64) -> f64 {
        let phase = std::f64::consts::PI * epoch as f64 / self.t_max as f64;
        self.eta_min + (base_lr - self.eta_min) * (1.0 + phase.cos()) / 2.0
    }

    holds_state!();
}

/// A linear ramp of the rate's factor from `start_factor` to 1 over `total` periods, then
/// 1 (PyTorch's `LinearLR` with `end_factor = 1`): the usual warmup.
///
/// ```
/// use kiln::optim::{LinearWarmup, LrScheduler, Optimizer, Sgd, SgdConfig};
/// use kiln::prelude::*;
///
/// let p = Tensor::zeros([1]).requires_grad_(true);
/// let mut opt = Sgd::new(vec![p], SgdConfig { lr: 1.0, ..Default::default() });
/// let mut warmup = LinearWarmup::new(&mut opt, 0.25, 3);
/// let mut lrs = vec![opt.lr()];
/// for _ in 0..4 { warmup.step(&mut opt); lrs.push(opt.lr()); }
/// assert_eq!(lrs, [0.25, 0.5, 0.75, 1.0, 1.0]);
/// ```
#[derive(Clone, Debug)]
pub struct LinearWarmup {
    state: SchedulerState,
    start_factor: f64,
    total: usize,
}

impl LinearWarmup {
    /// A warmup from `start_factor` times the optimizer's current rates to the full rates
    /// at period `total` (0 is treated as 1).
    pub fn new(optimizer: &mut dyn Optimizer, start_factor: f64, total: usize) -> LinearWarmup {
        start(optimizer, |state| LinearWarmup { state, start_factor, total: total.max(1) })
    }
}

impl LrScheduler for LinearWarmup {
    fn lr_at(&self, epoch: usize, base_lr: f64) -> f64 {
        let progress = epoch.min(self.total) as f64 / self.total as f64;
        base_lr * (self.start_factor + (1.0 - self.start_factor) * progress)
    }

    holds_state!();
}

/// The base rate times a function of the period (PyTorch's `LambdaLR`).
///
/// ```
/// use kiln::optim::{LambdaLr, LrScheduler, Optimizer, Sgd, SgdConfig};
/// use kiln::prelude::*;
///
/// let p = Tensor::zeros([1]).requires_grad_(true);
/// let mut opt = Sgd::new(vec![p], SgdConfig { lr: 0.5, ..Default::default() });
/// let mut sched = LambdaLr::new(&mut opt, |epoch| 1.0 / (epoch + 1) as f64);
/// sched.step(&mut opt);
/// assert_eq!(opt.lr(), 0.25);
/// ```
pub struct LambdaLr {
    state: SchedulerState,
    factor: Box<dyn Fn(usize) -> f64>,
}

impl std::fmt::Debug for LambdaLr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LambdaLr").field("state", &self.state).finish_non_exhaustive()
    }
}

impl LambdaLr {
    /// A schedule setting each group's rate to its base rate times `factor(period)`.
    pub fn new(optimizer: &mut dyn Optimizer, factor: impl Fn(usize) -> f64 + 'static) -> LambdaLr {
        start(optimizer, |state| LambdaLr { state, factor: Box::new(factor) })
    }
}

impl LrScheduler for LambdaLr {
    fn lr_at(&self, epoch: usize, base_lr: f64) -> f64 {
        base_lr * (self.factor)(epoch)
    }

    holds_state!();
}

/// Schedules run one after another: the `i`-th from milestone `i - 1` on, counting its
/// periods from that milestone (PyTorch's `SequentialLR`). Warmup, then cosine decay:
///
/// ```
/// use kiln::optim::{CosineAnnealingLr, LinearWarmup, LrScheduler, Optimizer, SequentialLr, Sgd, SgdConfig};
/// use kiln::prelude::*;
///
/// let p = Tensor::zeros([1]).requires_grad_(true);
/// let mut opt = Sgd::new(vec![p], SgdConfig { lr: 1.0, ..Default::default() });
/// let warmup = LinearWarmup::new(&mut opt, 0.5, 2);
/// let cosine = CosineAnnealingLr::new(&mut opt, 2, 0.0);
/// let mut sched = SequentialLr::new(&mut opt, vec![Box::new(warmup), Box::new(cosine)], &[2]).unwrap();
/// let mut lrs = vec![opt.lr()];
/// for _ in 0..4 { sched.step(&mut opt); lrs.push(opt.lr()); }
/// let want = [0.5, 0.75, 1.0, 0.5, 0.0];
/// assert!(lrs.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-12), "{lrs:?}");
/// ```
pub struct SequentialLr {
    state: SchedulerState,
    schedules: Vec<Box<dyn LrScheduler>>,
    milestones: Vec<usize>,
}

impl std::fmt::Debug for SequentialLr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SequentialLr")
            .field("state", &self.state)
            .field("milestones", &self.milestones)
            .finish_non_exhaustive()
    }
}

impl SequentialLr {
    /// Chains `schedules`, switching at each of the increasing `milestones` (one fewer
    /// than the schedules). The base rates are the first schedule's.
    ///
    /// # Errors
    /// [`crate::Error::Value`] when there is no schedule, the milestone count is not one
    /// fewer than the schedules', or the milestones do not increase.
    pub fn new(
        optimizer: &mut dyn Optimizer,
        schedules: Vec<Box<dyn LrScheduler>>,
        milestones: &[usize],
    ) -> crate::Result<SequentialLr> {
        const OP: &str = "SequentialLr::new";
        if schedules.is_empty() || milestones.len() + 1 != schedules.len() {
            return Err(crate::Error::value(
                OP,
                format!(
                    "needs one milestone fewer than schedules, got {} schedules and {} milestones",
                    schedules.len(),
                    milestones.len()
                ),
            ));
        }
        if milestones.windows(2).any(|w| w[0] >= w[1]) {
            return Err(crate::Error::value(
                OP,
                format!("milestones must increase, got {milestones:?}"),
            ));
        }
        let base_lrs = schedules[0].state().base_lrs.clone();
        let schedule = SequentialLr {
            state: SchedulerState { epoch: 0, base_lrs },
            schedules,
            milestones: milestones.to_vec(),
        };
        apply(&schedule, optimizer);
        Ok(schedule)
    }
}

impl LrScheduler for SequentialLr {
    fn lr_at(&self, epoch: usize, base_lr: f64) -> f64 {
        let part = self.milestones.iter().take_while(|&&m| m <= epoch).count();
        let begin = if part == 0 { 0 } else { self.milestones[part - 1] };
        self.schedules[part].lr_at(epoch - begin, base_lr)
    }

    holds_state!();
}
