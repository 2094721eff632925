//! The W4 workload of `benches/peers/bench.py`: a 784-256-10 ReLU MLP trained by SGD (lr 0.1) with
//! cross-entropy on batches of 128, shared by the benchmark example and the criterion bench.

use kiln::nn::{Linear, Module, Parameters, ReLU, Sequential, functional as F};
use kiln::optim::{Optimizer, Sgd, SgdConfig};
use kiln::prelude::*;

/// A fresh model and its optimizer.
pub(crate) fn model() -> (Sequential, Sgd) {
    let model = Sequential::new().with(Linear::new(784, 256)).with(ReLU).with(Linear::new(256, 10));
    let opt = Sgd::new(model.parameters(), SgdConfig { lr: 0.1, ..Default::default() });
    (model, opt)
}

/// One training step; returns the loss.
pub(crate) fn step(model: &Sequential, opt: &mut Sgd, x: &Tensor, y: &Tensor) -> Tensor {
    opt.zero_grad();
    let loss = F::cross_entropy(&model.forward(x), y);
    loss.backward();
    opt.step();
    loss
}
