//! Optimizers, learning-rate schedules and gradient clipping.
//!
//! An optimizer holds handles to the parameters (sharing their storage with the model) and
//! its own state. [`Optimizer::step`] records the update of every parameter without
//! autograd history, writes it in place, and realizes parameters and state together: the
//! pending forward pass, backward pass and update run as one fused graph.
//!
//! ```
//! use kiln::nn::{Linear, Module, Parameters, functional as F};
//! use kiln::optim::{Adam, AdamConfig, Optimizer};
//! use kiln::prelude::*;
//!
//! kiln::manual_seed(0);
//! let model = Linear::new(3, 1);
//! let mut opt = Adam::new(model.parameters(), AdamConfig { lr: 0.1, ..Default::default() });
//! let x = Tensor::randn([64, 3]);
//! let y = x.matmul(&Tensor::from_vec(vec![1.0f32, -2.0, 0.5], [3, 1])) + 0.3;
//! let mut loss = f32::INFINITY;
//! for _ in 0..200 {
//!     opt.zero_grad();
//!     let l = F::mse_loss(&model.forward(&x), &y);
//!     l.backward();
//!     opt.step();
//!     loss = l.item();
//! }
//! assert!(loss < 1e-3, "{loss}");
//! ```

mod adam;
mod groups;
mod scaler;
mod schedule;
mod sgd;

pub use adam::{Adam, AdamConfig, AdamW};
pub use groups::{GroupConfig, ParamGroup, StateDict};
pub use scaler::{GradScaler, GradScalerConfig};
pub use schedule::{
    CosineAnnealingLr, LambdaLr, LinearWarmup, LrScheduler, SchedulerState, SequentialLr, StepLr,
};
pub use sgd::{Sgd, SgdConfig};

use crate::error::ok;
use crate::{Error, Result, Tensor};

/// An optimizer over a fixed list of parameters, in one or more [`ParamGroup`]s.
pub trait Optimizer {
    /// Applies one update from the parameters' current `.grad()`s (parameters without a
    /// gradient are skipped, as in PyTorch), then realizes the parameters and the state.
    ///
    /// # Errors
    /// [`Error::Runtime`] when computing the update fails; [`Error::Shape`] when a gradient's
    /// shape differs from its parameter's (after [`Tensor::set_grad`] with a wrong tensor).
    fn try_step(&mut self) -> Result<()>;

    /// [`Optimizer::try_step`], panicking on failure.
    ///
    /// # Panics
    /// As [`Optimizer::try_step`] fails.
    #[track_caller]
    fn step(&mut self) {
        ok(self.try_step());
    }

    /// [`Optimizer::try_step`], left undone when `skip` (a 0-d bool tensor, usually "a
    /// gradient is not finite") is true: the parameters keep their values, the state and the
    /// step count stay as they were. `skip` is computed in the same graph as the update (the
    /// check fuses into the step); then its value is read. Returns whether the step was
    /// taken. [`GradScaler`] uses it.
    ///
    /// # Errors
    /// As [`Optimizer::try_step`]; [`Error::Value`] for an optimizer that cannot skip (the
    /// default for optimizers defined outside kiln).
    fn try_step_unless(&mut self, skip: &Tensor) -> Result<bool> {
        let _ = skip;
        Err(Error::value(
            "try_step_unless",
            "this optimizer cannot skip a step; implement try_step_unless",
        ))
    }

    /// The parameters this optimizer updates.
    fn parameters(&self) -> &[Tensor];

    /// Clears every parameter's gradient (PyTorch's `set_to_none=True`).
    fn zero_grad(&self) {
        for p in self.parameters() {
            p.zero_grad();
        }
    }

    /// The hyperparameters of every parameter group, in the order they were given.
    fn param_groups(&self) -> &[GroupConfig];

    /// Mutable access to every group's hyperparameters (schedules set each `lr`).
    fn param_groups_mut(&mut self) -> &mut [GroupConfig];

    /// The first group's learning rate.
    fn lr(&self) -> f64 {
        self.param_groups().first().map_or(0.0, |g| g.lr)
    }

    /// Sets every group's learning rate.
    fn set_lr(&mut self, lr: f64) {
        for g in self.param_groups_mut() {
            g.lr = lr;
        }
    }

    /// The optimizer's whole state (moments or momentum buffers, step count, every group's
    /// hyperparameters), sharing storage with the optimizer. Restoring it with
    /// [`Optimizer::load_state_dict`] into an optimizer built over the same parameters makes
    /// the following steps bit-identical to those of the optimizer that saved it.
    fn state_dict(&self) -> StateDict;

    /// Restores a [`StateDict`] from [`Optimizer::state_dict`] (possibly read back from a
    /// checkpoint), moving its tensors to the parameters' devices.
    ///
    /// # Errors
    /// [`Error::Value`] when the state's groups or entries do not match this optimizer's;
    /// [`Error::Shape`] when a state tensor's shape or dtype is not its parameter's. On an
    /// error nothing is changed.
    fn load_state_dict(&mut self, state: &StateDict) -> Result<()>;
}

/// Scales the gradients of `parameters` so that their global L2 norm is at most `max_norm`,
/// and returns the norm before clipping (lazily, as a 0-d tensor), as PyTorch's
/// `clip_grad_norm_`. Parameters without gradients are skipped.
///
/// # Errors
/// [`Error::Value`] when `max_norm` is negative or NaN.
///
/// ```
/// use kiln::prelude::*;
/// let p = Tensor::zeros([2]).requires_grad_(true);
/// p.set_grad(Some(Tensor::from_vec(vec![3.0f32, 4.0], [2])));
/// let norm = kiln::optim::clip_grad_norm(&[p.clone()], 1.0).unwrap();
/// assert_eq!(norm.item::<f32>(), 5.0);
/// let g = p.grad().unwrap().to_vec::<f32>();
/// assert!((g[0] - 0.6).abs() < 1e-6 && (g[1] - 0.8).abs() < 1e-6);
/// ```
#[track_caller]
pub fn clip_grad_norm(parameters: &[Tensor], max_norm: f64) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    if max_norm.is_nan() || max_norm < 0.0 {
        return Err(Error::value(
            "clip_grad_norm",
            format!("max_norm must be non-negative, got {max_norm}"),
        ));
    }
    crate::no_grad(|| {
        let grads: Vec<(Tensor, Tensor)> =
            parameters.iter().filter_map(|p| p.grad().map(|g| (p.clone(), g))).collect();
        let Some(mut total) =
            grads.iter().map(|(_, g)| g.double().square().sum()).reduce(|a, b| a + b)
        else {
            return Ok(Tensor::scalar(0.0f32));
        };
        total = total.sqrt();
        let coef = (max_norm / (&total + 1e-6)).clamp_max(1.0);
        for (p, g) in &grads {
            p.set_grad(Some(g * &coef.to_dtype(g.dtype())));
        }
        Ok(total.to_dtype(grads[0].1.dtype()))
    })
}

/// The gradient of `p` for an update: `None` when it has none, an error when its shape is
/// not the parameter's.
fn grad_of(op: &'static str, p: &Tensor) -> Result<Option<Tensor>> {
    let Some(g) = p.grad() else { return Ok(None) };
    if g.shape() != p.shape() {
        return Err(Error::shape(
            op,
            format!(
                "a parameter of shape {} has a gradient of shape {}; set_grad must keep the parameter's shape",
                p.shape(),
                g.shape()
            ),
        ));
    }
    Ok(Some(g.to_dtype(p.dtype())))
}

/// Writes `new` into `p` in place, or leaves `p` as it is where `skip` (a 0-d bool) is true.
fn write(p: &Tensor, new: &Tensor, skip: Option<&Tensor>) -> Result<()> {
    let new = match skip {
        Some(skip) => Tensor::try_where_(skip, p, new)?,
        None => new.clone(),
    };
    p.try_copy_(&new).map(|_| ())
}

/// Realizes every updated parameter and state tensor together (one graph).
fn realize(tensors: &[&Tensor]) -> Result<()> {
    Tensor::try_realize_all(tensors)
}

/// Checks a hyperparameter: finite and at least `min`.
fn check(op: &'static str, name: &str, value: f64, min: f64) -> Result<()> {
    if value.is_finite() && value >= min {
        return Ok(());
    }
    Err(Error::value(op, format!("{name} must be a finite number >= {min}, got {value}")))
}
