//! The host's cost of a `compile()`d training step: W7's GPT (4 layers, 4 heads, AdamW)
//! shrunk to 16 features, a context of 8 and batches of 2, so that computing it costs little
//! beside recording the closure again, capturing and matching the recorded program and
//! running the cached plan. On a GPU with CUDA graphs that host work bounds the step
//! (BENCHMARKS.md, "CUDA graphs"); this measures it on the CPU, where a profiler sees it:
//!
//! ```sh
//! cargo run --release --example compile_overhead          # microseconds per call
//! perf record -g target/release/examples/compile_overhead # where they go
//! ```

#[path = "common/gpt.rs"]
mod gpt;

use std::cell::RefCell;
use std::time::Instant;

use kiln::nn::Parameters;
use kiln::optim::{AdamConfig, AdamW};
use kiln::prelude::*;

fn main() {
    kiln::manual_seed(0);
    let config = gpt::GptConfig { d_model: 16, context: 8, ..gpt::GptConfig::w7(96) };
    let model = gpt::Gpt::new(config);
    let xs: Vec<Tensor> = (0..4).map(|_| Tensor::randint(0, 96, [2, 8])).collect();
    let ys: Vec<Tensor> = (0..4).map(|_| Tensor::randint(0, 96, [2, 8])).collect();
    let adam = AdamConfig { lr: 3e-4, weight_decay: 0.1, ..AdamConfig::adamw() };
    let adamw = RefCell::new(AdamW::new(model.parameters(), adam));
    let mut step = kiln::compile(|(x, y): (&Tensor, &Tensor)| {
        model.train_step(&mut *adamw.borrow_mut(), x, y)
    });
    let calls = 2000;
    let mut started = Instant::now();
    for i in 0..calls + 10 {
        if i == 10 {
            // The first calls plan (twice: AdamW's moments appear at its first step).
            started = Instant::now();
        }
        step.call::<_, Tensor>((&xs[i % 4], &ys[i % 4]));
    }
    let us = started.elapsed().as_secs_f64() * 1e6 / calls as f64;
    println!("{us:.0} µs per compiled call");
    println!("{}", step.stats());
}
