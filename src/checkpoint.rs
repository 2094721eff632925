//! Training checkpoints: model, optimizer, schedule and random state in one safetensors
//! file, so that training that stops and resumes computes exactly what training that never
//! stopped computes.
//!
//! ```
//! use kiln::checkpoint::Checkpoint;
//! use kiln::nn::{Linear, Module, Parameters};
//! use kiln::optim::{AdamConfig, AdamW, CosineAnnealingLr, LrScheduler, Optimizer};
//! use kiln::prelude::*;
//!
//! fn train(model: &Linear, opt: &mut AdamW, sched: &mut CosineAnnealingLr, steps: usize) {
//!     for _ in 0..steps {
//!         let x = Tensor::randn([8, 3]); // drawn from the generator the checkpoint saves
//!         opt.zero_grad();
//!         model.forward(&x).square().mean().backward();
//!         opt.step();
//!         sched.step(opt);
//!     }
//! }
//! let setup = || {
//!     kiln::manual_seed(0);
//!     let model = Linear::new(3, 2);
//!     let mut opt = AdamW::new(model.parameters(), AdamConfig::adamw());
//!     let sched = CosineAnnealingLr::new(&mut opt, 10, 0.0);
//!     (model, opt, sched)
//! };
//! let path = std::env::temp_dir().join(format!("kiln-ckpt-doc-{}.safetensors", std::process::id()));
//!
//! // Train 6 steps straight through.
//! let (model, mut opt, mut sched) = setup();
//! train(&model, &mut opt, &mut sched, 6);
//! let straight = model.weight.to_vec::<f32>();
//!
//! // Train 3, save, rebuild everything from scratch, restore, train 3 more.
//! let (model, mut opt, mut sched) = setup();
//! train(&model, &mut opt, &mut sched, 3);
//! Checkpoint::new().with_model(&model).with_optimizer(&opt).with_scheduler(&sched).with_rng().save(&path).unwrap();
//! let (mut model, mut opt, mut sched) = setup();
//! let ckpt = Checkpoint::load(&path).unwrap();
//! ckpt.restore_model(&mut model).unwrap();
//! ckpt.restore_optimizer(&mut opt).unwrap();
//! ckpt.restore_scheduler(&mut sched).unwrap();
//! ckpt.restore_rng().unwrap();
//! train(&model, &mut opt, &mut sched, 3);
//! assert_eq!(model.weight.to_vec::<f32>(), straight); // bit for bit
//! # std::fs::remove_file(&path).unwrap();
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use crate::nn::Parameters;
use crate::optim::{LrScheduler, Optimizer, StateDict};
use crate::{Error, Result, RngState, Tensor};

const MODEL: &str = "model.";
const OPTIMIZER: &str = "optimizer.";
const SCHEDULER_EPOCH: &str = "scheduler.epoch";
const SCHEDULER_BASE: &str = "scheduler.base_lr.";
const RNG_SEED: &str = "rng.seed";
const RNG_COUNT: &str = "rng.count";
const USER: &str = "user.";

/// What a checkpoint file holds: tensors under `model.` and `optimizer.`, and exact scalars
/// (optimizer steps and hyperparameters, the schedule's position, the generator's state,
/// your own values) in the safetensors header's metadata. Build one with the `with_`
/// methods and [`Checkpoint::save`]; read one with [`Checkpoint::load`] and apply its parts
/// with the `restore_` methods.
#[derive(Clone, Debug, Default)]
pub struct Checkpoint {
    tensors: Vec<(String, Tensor)>,
    metadata: BTreeMap<String, String>,
}

impl Checkpoint {
    /// An empty checkpoint.
    #[must_use]
    pub fn new() -> Checkpoint {
        Checkpoint::default()
    }

    /// Adds the model's parameters and buffers ([`Parameters::state_dict`]).
    #[must_use]
    pub fn with_model<M: Parameters + ?Sized>(mut self, model: &M) -> Checkpoint {
        let state = model.state_dict();
        self.tensors.extend(state.into_iter().map(|(n, t)| (format!("{MODEL}{n}"), t)));
        self
    }

    /// Adds the optimizer's state ([`Optimizer::state_dict`]): moments, step count, groups.
    #[must_use]
    pub fn with_optimizer(mut self, optimizer: &dyn Optimizer) -> Checkpoint {
        let state = optimizer.state_dict();
        self.tensors.extend(state.tensors.into_iter().map(|(n, t)| (format!("{OPTIMIZER}{n}"), t)));
        for (k, v) in state.scalars {
            self.metadata.insert(format!("{OPTIMIZER}{k}"), float(v));
        }
        self
    }

    /// Adds the schedule's position and base rates.
    #[must_use]
    pub fn with_scheduler(mut self, scheduler: &dyn LrScheduler) -> Checkpoint {
        let state = scheduler.state();
        self.metadata.insert(SCHEDULER_EPOCH.into(), state.epoch.to_string());
        for (g, lr) in state.base_lrs.iter().enumerate() {
            self.metadata.insert(format!("{SCHEDULER_BASE}{g}"), float(*lr));
        }
        self
    }

    /// Adds this thread's random generator state ([`crate::get_rng_state`]), so that dropout
    /// masks, shuffles and sampled batches continue as they would have.
    #[must_use]
    pub fn with_rng(mut self) -> Checkpoint {
        let state = crate::get_rng_state();
        self.metadata.insert(RNG_SEED.into(), state.seed.to_string());
        self.metadata.insert(RNG_COUNT.into(), state.count.to_string());
        self
    }

    /// Adds a value of your own (a step count, a best loss) under `key`.
    #[must_use]
    pub fn with_value(mut self, key: &str, value: impl ToString) -> Checkpoint {
        self.metadata.insert(format!("{USER}{key}"), value.to_string());
        self
    }

    /// The value stored under `key` by [`Checkpoint::with_value`].
    pub fn value(&self, key: &str) -> Option<&str> {
        self.metadata.get(&format!("{USER}{key}")).map(String::as_str)
    }

    /// Writes the checkpoint to a safetensors file (computing pending tensors first).
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be written; [`Error::Runtime`] when computing a
    /// pending tensor fails.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<()> {
        crate::serialize::save_with_metadata(path, &self.tensors, &self.metadata)
    }

    /// Reads a checkpoint written by [`Checkpoint::save`].
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be read or is not valid safetensors.
    pub fn load(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let (tensors, metadata) = crate::serialize::load_with_metadata(path)?;
        Ok(Checkpoint { tensors, metadata })
    }

    /// Copies the saved parameters and buffers into `model` in place (see
    /// [`Parameters::load_state_dict`]).
    ///
    /// # Errors
    /// [`Error::Load`] listing every missing, unexpected or mismatched tensor.
    pub fn restore_model<M: Parameters + ?Sized>(&self, model: &mut M) -> Result<()> {
        let state = self
            .tensors
            .iter()
            .filter_map(|(n, t)| n.strip_prefix(MODEL).map(|n| (n.to_string(), t.clone())))
            .collect();
        model.load_state_dict(state)
    }

    /// Restores the optimizer's state (see [`Optimizer::load_state_dict`]).
    ///
    /// # Errors
    /// [`Error::Value`] when the checkpoint holds no optimizer or one with other groups;
    /// [`Error::Shape`] when a state tensor does not fit its parameter.
    pub fn restore_optimizer(&self, optimizer: &mut dyn Optimizer) -> Result<()> {
        const OP: &str = "Checkpoint::restore_optimizer";
        let mut state = StateDict::default();
        for (k, v) in &self.metadata {
            if let Some(k) = k.strip_prefix(OPTIMIZER) {
                state.scalars.insert(k.to_string(), parse(OP, k, v)?);
            }
        }
        if state.scalars.is_empty() {
            return Err(Error::value(OP, "the checkpoint holds no optimizer state"));
        }
        state.tensors = self
            .tensors
            .iter()
            .filter_map(|(n, t)| n.strip_prefix(OPTIMIZER).map(|n| (n.to_string(), t.clone())))
            .collect();
        optimizer.load_state_dict(&state)
    }

    /// Restores the schedule's position and base rates.
    ///
    /// # Errors
    /// [`Error::Value`] when the checkpoint holds no schedule, or one over a different
    /// number of parameter groups.
    pub fn restore_scheduler(&self, scheduler: &mut dyn LrScheduler) -> Result<()> {
        const OP: &str = "Checkpoint::restore_scheduler";
        let epoch = self
            .metadata
            .get(SCHEDULER_EPOCH)
            .ok_or_else(|| Error::value(OP, "the checkpoint holds no schedule"))?;
        let epoch = parse(OP, SCHEDULER_EPOCH, epoch)?;
        let base_lrs = self
            .metadata
            .iter()
            .filter(|(k, _)| k.starts_with(SCHEDULER_BASE))
            .map(|(k, v)| {
                let g: usize = k[SCHEDULER_BASE.len()..].parse().unwrap_or(usize::MAX);
                Ok((g, parse(OP, k, v)?))
            })
            .collect::<Result<BTreeMap<usize, f64>>>()?;
        let state = scheduler.state_mut();
        if base_lrs.len() != state.base_lrs.len() || base_lrs.keys().any(|&g| g >= base_lrs.len()) {
            return Err(Error::value(
                OP,
                format!(
                    "the checkpoint's schedule has {} parameter groups, this one {}",
                    base_lrs.len(),
                    state.base_lrs.len()
                ),
            ));
        }
        state.epoch = epoch as usize;
        state.base_lrs = base_lrs.into_values().collect();
        Ok(())
    }

    /// Restores this thread's random generator.
    ///
    /// # Errors
    /// [`Error::Value`] when the checkpoint holds no generator state.
    pub fn restore_rng(&self) -> Result<()> {
        const OP: &str = "Checkpoint::restore_rng";
        let read = |key: &str| -> Result<u64> {
            let v = self
                .metadata
                .get(key)
                .ok_or_else(|| Error::value(OP, "the checkpoint holds no random state"))?;
            v.parse().map_err(|_| Error::value(OP, format!("{key} = {v:?} is not an integer")))
        };
        crate::set_rng_state(RngState { seed: read(RNG_SEED)?, count: read(RNG_COUNT)? });
        Ok(())
    }
}

/// An f64 as text that parses back to the same bits (Rust's shortest round-trip form).
fn float(v: f64) -> String {
    format!("{v:?}")
}

fn parse(op: &'static str, key: &str, v: &str) -> Result<f64> {
    v.parse().map_err(|_| Error::value(op, format!("{key} = {v:?} is not a number")))
}
