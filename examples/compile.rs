//! A training step compiled with `kiln::compile`: forward, loss, backward and the SGD update
//! become one fused plan, planned on the first calls and replayed afterwards.
//!
//! Run with `cargo run --release --example compile`.

use std::time::Instant;

use kiln::nn::{Linear, Module, Parameters, ReLU, Sequential, functional as F};
use kiln::optim::{Optimizer, Sgd, SgdConfig};
use kiln::prelude::*;

fn main() {
    kiln::manual_seed(0);
    let (batch, steps) = (128, 30);
    let x = Tensor::randn([batch, 784]);
    let y = Tensor::randint(0, 10, [batch]);
    Tensor::try_realize_all(&[&x, &y]).expect("inputs");

    let run = |compiled: bool| {
        kiln::manual_seed(1);
        let model =
            Sequential::new().with(Linear::new(784, 256)).with(ReLU).with(Linear::new(256, 10));
        let mut opt = Sgd::new(
            model.parameters(),
            SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() },
        );
        let mut step = |(x, y): (&Tensor, &Tensor)| {
            opt.zero_grad();
            let loss = F::cross_entropy(&model.forward(x), y);
            loss.backward();
            opt.step();
            loss
        };
        let mut losses = Vec::new();
        let mut times = Vec::new();
        let stats = if compiled {
            let mut f = kiln::compile(&mut step);
            for _ in 0..steps {
                let start = Instant::now();
                let loss = f.call((&x, &y));
                times.push(start.elapsed().as_secs_f64() * 1e3);
                losses.push(loss.item::<f32>());
            }
            Some(f.stats().clone())
        } else {
            for _ in 0..steps {
                let start = Instant::now();
                let loss = step((&x, &y));
                times.push(start.elapsed().as_secs_f64() * 1e3);
                losses.push(loss.item::<f32>());
            }
            None
        };
        let mut later = times[2..].to_vec();
        later.sort_by(f64::total_cmp);
        (losses, later[later.len() / 2], times[0], stats)
    };

    let (eager_loss, eager_ms, eager_first, _) = run(false);
    let (compiled_loss, compiled_ms, compiled_first, stats) = run(true);
    println!("MLP 784-256-10, batch {batch}, SGD with momentum, {steps} steps");
    println!("  eager:    first step {eager_first:7.2} ms, then median {eager_ms:.3} ms per step");
    println!(
        "  compiled: first step {compiled_first:7.2} ms, then median {compiled_ms:.3} ms per step"
    );
    println!(
        "  loss after {steps} steps: eager {:.5}, compiled {:.5}",
        eager_loss[steps - 1],
        compiled_loss[steps - 1]
    );
    let worst =
        eager_loss.iter().zip(&compiled_loss).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    println!("  largest difference in loss over the run: {worst:.2e}");
    if let Some(stats) = stats {
        println!("compile stats: {stats}");
    }
}
