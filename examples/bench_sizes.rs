//! What a new size costs: a compiled MLP training step (256 → 512 → 10, Adam) called with
//! batches of 64, 64, 48, 64, 17, 33, 64, 5, 64, 29, each call's time, planning time and
//! kernels compiled, then the totals. Run it as it is (size-generic kernels, `KILN_SIZES`
//! unset) and with `KILN_SIZES=specialize` (every size compiles its own kernels) to compare.
//!
//! `cargo run --release --example bench_sizes [-- --cuda]` (`--cuda`: the model and batches on
//! the first CUDA device, where each new kernel is an NVRTC compile).

use std::time::Instant;

use kiln::nn::functional as F;
use kiln::nn::{Linear, Module};
use kiln::optim::{Adam, AdamConfig, Optimizer};
use kiln::prelude::*;

fn main() {
    kiln::manual_seed(1);
    let device =
        if std::env::args().any(|a| a == "--cuda") { Device::Cuda(0) } else { Device::Cpu };
    let (mut fc1, mut fc2) = (Linear::new(256, 512), Linear::new(512, 10));
    for layer in [&mut fc1, &mut fc2] {
        layer.to(device).expect("the model on the device");
    }
    let mut params = fc1.parameters();
    params.extend(fc2.parameters());
    let mut opt = Adam::new(params, AdamConfig::default());
    let mut step = kiln::compile(|(x, y): (&Tensor, &Tensor)| {
        opt.zero_grad();
        let loss = F::cross_entropy(&fc2.forward(&fc1.forward(x).relu()), y);
        loss.backward();
        opt.step();
        loss
    });
    println!("KILN_SIZES: {:?}, {device:?}", kiln::debug::size_policy());
    println!(
        "{:>5} {:>9} {:>12} {:>9} {:>8}",
        "batch", "call ms", "planning ms", "compiled", "loss"
    );
    let (mut total, mut compiled) = (0.0, 0);
    for b in [64usize, 64, 48, 64, 17, 33, 64, 5, 64, 29] {
        let x = Tensor::randn([b, 256]).to(device);
        let y = Tensor::randint(0, 10, [b]).to(device);
        Tensor::try_realize_all(&[&x, &y]).expect("inputs");
        let started = Instant::now();
        let (loss, profile) = kiln::profile(|| step.call((&x, &y)).item::<f32>());
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let new = profile.kernels().iter().filter(|k| !k.compile.is_zero()).count();
        let planning = profile.planning_time().as_secs_f64() * 1e3;
        println!("{b:>5} {ms:>9.2} {planning:>12.2} {new:>9} {loss:>8.4}");
        total += ms;
        compiled += new;
    }
    println!("total {total:.1} ms, {compiled} kernels compiled; {}", step.stats());
}
