use kiln::nn::functional::{self as F, Conv2dOptions};
use kiln::nn::{
    AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Flatten, Linear, Module, Parameters, ReLU, Sequential,
};
use kiln::optim::{Optimizer, Sgd, SgdConfig};
use kiln::prelude::*;
fn cbr(c_in: usize, c_out: usize, stride: usize) -> Sequential {
    let mut conv = Conv2d::new(
        c_in,
        c_out,
        [3, 3],
        Conv2dOptions::default().padding([1, 1]).stride([stride, stride]),
    );
    conv.bias = None;
    Sequential::new().with(conv).with(BatchNorm2d::new(c_out)).with(ReLU)
}
fn main() {
    let model = Sequential::new()
        .with(cbr(1, 16, 1))
        .with(cbr(16, 32, 2))
        .with(cbr(32, 64, 2))
        .with(AdaptiveAvgPool2d([1, 1]))
        .with(Flatten)
        .with(Linear::new(64, 10));
    let mut opt =
        Sgd::new(model.parameters(), SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() });
    let x = Tensor::randn([64, 1, 32, 32]);
    let y = (Tensor::rand([64]) * 10.0).floor().long();
    x.realize();
    y.realize();
    let mut run = || {
        opt.zero_grad();
        let l = F::cross_entropy(&model.forward(&x), &y);
        l.backward();
        opt.step();
    };
    run();
    run();
    println!("{}", kiln::profile(run).1);
}
