//! Parameter groups and the optimizer state that checkpoints carry.

use std::collections::BTreeMap;

use crate::{Error, Result, Tensor};

/// Parameters that share hyperparameters, as an entry of PyTorch's `param_groups`: a field
/// left `None` takes the optimizer's config. The usual use is AdamW without weight decay on
/// norms and biases:
///
/// ```
/// use kiln::nn::{Linear, Parameters};
/// use kiln::optim::{AdamConfig, AdamW, Optimizer, ParamGroup};
///
/// let model = Linear::new(4, 2);
/// let (matrices, vectors): (Vec<_>, Vec<_>) =
///     model.parameters().into_iter().partition(|p| p.ndim() >= 2);
/// let opt = AdamW::with_groups(
///     vec![ParamGroup::new(matrices), ParamGroup::new(vectors).weight_decay(0.0)],
///     AdamConfig { weight_decay: 0.1, ..AdamConfig::adamw() },
/// )
/// .unwrap();
/// assert_eq!(opt.param_groups()[0].weight_decay, 0.1);
/// assert_eq!(opt.param_groups()[1].weight_decay, 0.0);
/// ```
#[derive(Clone, Debug)]
pub struct ParamGroup {
    /// The group's parameters.
    pub(super) params: Vec<Tensor>,
    /// The group's learning rate (`None`: the config's).
    pub lr: Option<f64>,
    /// The group's weight decay (`None`: the config's).
    pub weight_decay: Option<f64>,
}

impl ParamGroup {
    /// A group taking every hyperparameter from the optimizer's config.
    #[must_use]
    pub fn new(params: Vec<Tensor>) -> ParamGroup {
        ParamGroup { params, lr: None, weight_decay: None }
    }

    /// Sets the group's learning rate.
    #[must_use]
    pub fn lr(mut self, lr: f64) -> ParamGroup {
        self.lr = Some(lr);
        self
    }

    /// Sets the group's weight decay.
    #[must_use]
    pub fn weight_decay(mut self, weight_decay: f64) -> ParamGroup {
        self.weight_decay = Some(weight_decay);
        self
    }
}

/// The hyperparameters of one parameter group as an optimizer holds them; schedules set
/// `lr`, and either may be changed between steps.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupConfig {
    /// The learning rate.
    pub lr: f64,
    /// The weight decay.
    pub weight_decay: f64,
    len: usize,
}

impl GroupConfig {
    /// How many parameters the group holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the group holds no parameter.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// An optimizer's state, as PyTorch's `optimizer.state_dict()`: the per-parameter tensors
/// (moments, momentum buffers), named `state.<index>.<name>` by the parameter's position in
/// the optimizer, and the scalars (step count, every group's hyperparameters).
/// [`crate::checkpoint::Checkpoint`] writes it to a file.
#[derive(Clone, Debug, Default)]
pub struct StateDict {
    /// Per-parameter state tensors.
    pub tensors: Vec<(String, Tensor)>,
    /// Step counts and hyperparameters, exactly.
    pub scalars: BTreeMap<String, f64>,
}

impl StateDict {
    pub(super) fn scalar(&self, op: &'static str, name: &str) -> Result<f64> {
        self.scalars.get(name).copied().ok_or_else(|| {
            Error::value(op, format!("the state has no {name:?}; was it saved by this optimizer?"))
        })
    }

    /// The tensor named `name`, checked against the parameter it belongs to and moved to
    /// its device.
    pub(super) fn tensor(
        &self,
        op: &'static str,
        name: &str,
        p: &Tensor,
    ) -> Result<Option<Tensor>> {
        let Some((_, t)) = self.tensors.iter().find(|(n, _)| n == name) else {
            return Ok(None);
        };
        if t.shape() != p.shape() || t.dtype() != p.dtype() {
            return Err(Error::shape(
                op,
                format!(
                    "the state's {name} is {} {}, but its parameter is {} {}; the state belongs to another model",
                    t.dtype(),
                    t.shape(),
                    p.dtype(),
                    p.shape()
                ),
            ));
        }
        Ok(Some(t.try_to(p.device())?.detach()))
    }
}

/// The parameters of an optimizer, flattened, with their groups.
#[derive(Debug)]
pub(super) struct Groups {
    pub(super) params: Vec<Tensor>,
    pub(super) configs: Vec<GroupConfig>,
}

impl Groups {
    /// Resolves `groups` against the config's defaults, checking every hyperparameter.
    pub(super) fn new(
        op: &'static str,
        groups: Vec<ParamGroup>,
        lr: f64,
        weight_decay: f64,
    ) -> Result<Groups> {
        if groups.is_empty() {
            return Err(Error::value(op, "needs at least one parameter group"));
        }
        let mut params = Vec::new();
        let mut configs = Vec::new();
        for g in groups {
            let config = GroupConfig {
                lr: g.lr.unwrap_or(lr),
                weight_decay: g.weight_decay.unwrap_or(weight_decay),
                len: g.params.len(),
            };
            super::check(op, "lr", config.lr, 0.0)?;
            super::check(op, "weight_decay", config.weight_decay, 0.0)?;
            configs.push(config);
            params.extend(g.params);
        }
        super::sgd::check_params(op, &params)?;
        Ok(Groups { params, configs })
    }

    /// Every parameter with its index and its group's config.
    pub(super) fn each(&self) -> impl Iterator<Item = (usize, &Tensor, &GroupConfig)> {
        self.configs
            .iter()
            .flat_map(|c| std::iter::repeat_n(c, c.len))
            .zip(&self.params)
            .enumerate()
            .map(|(i, (c, p))| (i, p, c))
    }

    /// The scalars every optimizer saves: each group's hyperparameters and size.
    pub(super) fn save(&self, state: &mut StateDict) {
        for (g, c) in self.configs.iter().enumerate() {
            state.scalars.insert(format!("group.{g}.lr"), c.lr);
            state.scalars.insert(format!("group.{g}.weight_decay"), c.weight_decay);
            state.scalars.insert(format!("group.{g}.len"), c.len as f64);
        }
    }

    /// Checks that `state` has this optimizer's groups and returns their configs.
    pub(super) fn load(&self, op: &'static str, state: &StateDict) -> Result<Vec<GroupConfig>> {
        let saved = state.scalars.keys().filter(|k| k.ends_with(".len")).count();
        if saved != self.configs.len() {
            return Err(Error::value(
                op,
                format!(
                    "the state has {saved} parameter groups, this optimizer {}; build the optimizer as it was when saved",
                    self.configs.len()
                ),
            ));
        }
        let mut configs = Vec::new();
        for (g, c) in self.configs.iter().enumerate() {
            let len = state.scalar(op, &format!("group.{g}.len"))?;
            if len != c.len as f64 {
                return Err(Error::value(
                    op,
                    format!("group {g} had {len} parameters when saved and has {} now", c.len),
                ));
            }
            configs.push(GroupConfig {
                lr: state.scalar(op, &format!("group.{g}.lr"))?,
                weight_decay: state.scalar(op, &format!("group.{g}.weight_decay"))?,
                len: c.len,
            });
        }
        Ok(configs)
    }
}
