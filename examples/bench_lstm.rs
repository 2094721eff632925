//! One training step of a one-layer LSTM (PyTorch's `nn.LSTM(256, 256)`) over a 256-step
//! sequence of batch 64: forward through every step, a mean-squared loss against a fixed
//! target, backward, and an SGD update, eagerly and under `compile()`. Prints the median step
//! time of each (after warm-up); `benches/peers/lstm_sitting` runs it beside PyTorch's eager
//! `nn.LSTM` on the same shapes.
//!
//! ```sh
//! cargo run --release --example bench_lstm            # add --quick for a short run
//! ```

use std::time::{Duration, Instant};

use kiln::nn::functional as F;
use kiln::nn::{Lstm, Module, Parameters};
use kiln::optim::{Optimizer, Sgd, SgdConfig};
use kiln::prelude::*;

const SEQ: usize = 256;
const BATCH: usize = 64;
const HIDDEN: usize = 256;

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (seq, runs) = if quick { (16, 3) } else { (SEQ, 7) };
    kiln::manual_seed(0);
    let lstm = Lstm::new(HIDDEN, HIDDEN);
    let mut sgd = Sgd::new(lstm.parameters(), SgdConfig { lr: 1e-3, ..Default::default() });
    let x = Tensor::randn([seq, BATCH, HIDDEN]);
    let target = Tensor::randn([seq, BATCH, HIDDEN]);
    Tensor::try_realize_all(&[&x, &target]).expect("the inputs");
    let mut step = |(x, target): (&Tensor, &Tensor)| {
        sgd.zero_grad();
        let loss = F::mse_loss(&lstm.forward(x), target);
        loss.backward();
        sgd.step();
        loss
    };
    let time = |call: &mut dyn FnMut() -> Tensor| {
        let mut times = Vec::with_capacity(runs);
        for i in 0..runs + 2 {
            let t = Instant::now();
            std::hint::black_box(call().item::<f32>());
            if i >= 2 {
                times.push(t.elapsed());
            }
        }
        median(times)
    };
    if std::env::var("KILN_LSTM_PROFILE").is_ok_and(|v| v == "1") {
        step((&x, &target)).realize();
        let (_, profile) = kiln::profile(|| step((&x, &target)).realize().clone());
        println!("{profile}");
    }
    let eager = time(&mut || step((&x, &target)));
    let mut compiled = kiln::compile(&mut step);
    let compiled_ms = time(&mut || compiled.call((&x, &target)));
    eprintln!("compile(): {}", compiled.stats());
    println!(
        "{{\"seq\": {seq}, \"batch\": {BATCH}, \"hidden\": {HIDDEN}, \"eager_ms\": {:.1}, \"compiled_ms\": {:.1}}}",
        eager.as_secs_f64() * 1e3,
        compiled_ms.as_secs_f64() * 1e3
    );
}
