//! Profiles one training step of a small MLP fused (the default) and unfused (one kernel per
//! op), prints both tables and the comparison, and writes a Chrome trace.
//!
//! Run with `cargo run --release --example profile`, then open `target/profile_trace.json` in
//! <https://ui.perfetto.dev> or `chrome://tracing`.

use kiln::nn::{GELU, LayerNorm, Linear, Module, Parameters, Sequential, functional as F};
use kiln::optim::{Adam, AdamConfig, Optimizer};
use kiln::prelude::*;

fn main() -> kiln::Result<()> {
    kiln::manual_seed(0);
    let x = Tensor::randn([256, 512]);
    let y = Tensor::randint(0, 10, [256]);
    Tensor::try_realize_all(&[&x, &y])?;
    let model = Sequential::new()
        .with(Linear::new(512, 512))
        .with(LayerNorm::new(&[512]))
        .with(GELU)
        .with(Linear::new(512, 10));
    let mut opt = Adam::new(model.parameters(), AdamConfig::default());
    let mut step = || {
        opt.zero_grad();
        let loss = F::cross_entropy(&model.forward(&x), &y);
        loss.backward();
        opt.step();
        loss
    };
    // Warm up both ways (compiles every kernel), then profile one step each.
    for mode in [kiln::Execution::Fused, kiln::Execution::Unfused] {
        kiln::with_execution(mode, &mut step);
        kiln::with_execution(mode, &mut step);
    }
    let (_, fused) = kiln::profile(&mut step);
    let (_, unfused) = kiln::with_execution(kiln::Execution::Unfused, || kiln::profile(&mut step));

    println!("one Adam step of a 512-512-10 MLP with LayerNorm and GELU, batch 256\n");
    println!("fused:\n{fused}\n");
    println!("unfused:\n{unfused}\n");
    println!("{}", kiln::Profile::compare(&fused, &unfused));
    let out_dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    std::fs::create_dir_all(&out_dir).map_err(|e| kiln::Error::Io {
        op: "create_dir_all",
        detail: format!("cannot create {}: {e}", out_dir.display()),
    })?;
    let path = out_dir.join("profile_trace.json");
    fused.to_chrome_trace(&path)?;
    println!("Chrome trace of the fused step: {}", path.display());
    Ok(())
}
