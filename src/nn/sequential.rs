//! A chain of modules.

use super::{Module, Parameters};
use crate::{Result, Tensor};

/// Modules applied in order, each to the previous one's output. Parameters are named by
/// position (`0.weight`, `2.bias`), as in PyTorch.
///
/// ```
/// use kiln::nn::{Linear, Module, Parameters, ReLU, Sequential};
/// use kiln::prelude::*;
///
/// let model = Sequential::new().with(Linear::new(784, 128)).with(ReLU).with(Linear::new(128, 10));
/// assert_eq!(model.num_parameters(), 101_770);
/// assert_eq!(model.named_parameters()[2].0, "2.weight");
/// assert_eq!(model.forward(&Tensor::randn([5, 784])).dims(), &[5, 10]);
/// ```
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module + Send + Sync>>,
}

impl Sequential {
    /// An empty chain (the identity).
    #[must_use]
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// The chain with `layer` appended.
    #[must_use]
    pub fn with(mut self, layer: impl Module + Send + Sync + 'static) -> Sequential {
        self.layers.push(Box::new(layer));
        self
    }

    /// Appends `layer`.
    pub fn push(&mut self, layer: impl Module + Send + Sync + 'static) {
        self.layers.push(Box::new(layer));
    }

    /// The number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether the chain has no layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

impl std::fmt::Debug for Sequential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Sequential({} layers, {} parameters)", self.len(), self.num_parameters())
    }
}

impl Parameters for Sequential {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        for (i, m) in self.layers.iter().enumerate() {
            m.visit(&super::join(prefix, &i.to_string()), f);
        }
    }

    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
        for (i, m) in self.layers.iter_mut().enumerate() {
            m.visit_mut(&super::join(prefix, &i.to_string()), f);
        }
    }

    fn visit_buffers(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        for (i, m) in self.layers.iter().enumerate() {
            m.visit_buffers(&super::join(prefix, &i.to_string()), f);
        }
    }

    fn visit_buffers_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
        for (i, m) in self.layers.iter_mut().enumerate() {
            m.visit_buffers_mut(&super::join(prefix, &i.to_string()), f);
        }
    }

    fn set_training(&mut self, training: bool) {
        for m in &mut self.layers {
            m.set_training(training);
        }
    }
}

impl Module for Sequential {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        let mut x = input.clone();
        for layer in &self.layers {
            x = layer.try_forward(&x)?;
        }
        Ok(x)
    }
}
