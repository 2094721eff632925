//! Trains a small MLP on the bundled handwritten-digits set (1,797 8x8 images), reports its
//! test accuracy, compares one training step fused and unfused, and saves the weights.
//!
//! Run with `cargo run --release --example train_digits`.

#[path = "common/digits.rs"]
mod digits;

use std::path::Path;

use kiln::nn::{Module, functional as F};
use kiln::optim::{Optimizer, Sgd, SgdConfig};
use kiln::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let data = digits::load(&root.join("data/digits.csv.gz"))?;
    println!("digits: {} images of 8x8 pixels, 10 classes", data.labels.numel());

    let config = digits::Config::default();
    let report = digits::train(&data, &config)?;
    println!(
        "trained {} steps ({} epochs, batch {}) in {:.2} s: final loss {:.4}, test accuracy {:.1}%",
        report.steps,
        config.epochs,
        config.batch_size,
        report.train_time.as_secs_f64(),
        report.final_loss,
        100.0 * report.test_accuracy
    );
    // CI runs this example: a model that does not learn fails it.
    if report.test_accuracy < 0.95 {
        let at = 100.0 * report.test_accuracy;
        return Err(format!("test accuracy {at:.1}% is below 95%").into());
    }

    // One training step (forward, loss, backward, SGD update), profiled fused (the default)
    // and unfused (one kernel per op), on the same batch, after a warm-up that compiles.
    let (x, y) = &report.sample;
    let step = |mode: kiln::Execution| {
        kiln::with_execution(mode, || {
            let mut opt =
                Sgd::new(report.model.parameters(), SgdConfig { lr: 0.0, ..Default::default() });
            let mut run = || {
                opt.zero_grad();
                let loss = F::cross_entropy(&report.model.forward(x), y);
                loss.backward();
                opt.step();
            };
            run();
            kiln::profile(run).1
        })
    };
    let (fused, unfused) = (step(kiln::Execution::Fused), step(kiln::Execution::Unfused));
    println!("\none training step, fused:\n{fused}\n");
    println!("{}", kiln::Profile::compare(&fused, &unfused));
    // Outputs go to `target/` (created if the build used another target directory).
    let out_dir = root.join("target");
    std::fs::create_dir_all(&out_dir)?;
    let trace = out_dir.join("train_digits_step.json");
    fused.to_chrome_trace(&trace)?;
    println!(
        "Chrome trace of the fused step: {} (open it in https://ui.perfetto.dev)",
        trace.display()
    );

    let path = out_dir.join("digits_mlp.safetensors");
    report.model.save(&path)?;
    let mut reloaded = digits::Mlp::new(config.hidden);
    reloaded.load(&path)?;
    reloaded.eval();
    println!("saved the weights to {}", path.display());
    assert_eq!(reloaded.forward(x).to_vec::<f32>(), report.model.forward(x).to_vec::<f32>());
    Ok(())
}
