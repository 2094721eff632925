//! A LoRA training step's speed on a local Llama-family folder, as
//! `benches/peers/lora_anchor.py` measures PEFT + PyTorch's: rank 8, alpha 16 on `q_proj` and
//! `v_proj`, AdamW (lr 1e-4) on the adapters only, the causal LM loss of a `--batch` x
//! `--len` batch of token ids as their own labels; one compiled step (forward, backward,
//! update), the median of `--reps` steps after two warm-up steps, and the first step's time.
//!
//! ```text
//! cargo run --release -p kiln-models --example bench_lora -- --model DIR [--batch 4] [--len 128] [--reps 5] [--autocast bf16] [--json FILE]
//! ```

use std::cell::RefCell;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[path = "common/args.rs"]
mod args;

use kiln::nn::functional as F;
use kiln::optim::{AdamConfig, AdamW, Optimizer};
use kiln::{DType, Tensor};
use kiln_models::lora::{LoraConfig, LoraModel};
use kiln_models::{LoadOptions, llama::Llama};

fn main() -> kiln::Result<()> {
    let (mut dir, mut batch, mut len, mut reps) = (None, 4usize, 128usize, 5usize);
    let (mut autocast, mut json) = (false, None::<PathBuf>);
    let usage = "usage: bench_lora --model DIR [--batch 4] [--len 128] [--reps 5] \
                 [--autocast bf16] [--json FILE]";
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        args::help(&flag, usage);
        let value = it.next().unwrap_or_default();
        match flag.as_str() {
            "--model" => dir = Some(PathBuf::from(&value)),
            "--batch" => batch = args::number(&flag, &value, usage),
            "--len" => len = args::number(&flag, &value, usage),
            "--reps" => reps = args::number::<usize>(&flag, &value, usage).max(1),
            "--autocast" => {
                autocast = match value.as_str() {
                    "bf16" => true,
                    other => args::fail(&format!("--autocast {other}: bf16"), usage),
                }
            }
            "--json" => json = Some(PathBuf::from(&value)),
            other => args::fail(&format!("unknown argument {other}"), usage),
        }
    }
    let Some(dir) = dir else {
        args::fail("bench_lora needs --model (benches/peers/make_checkpoints.py writes one)", usage)
    };
    kiln::manual_seed(0);
    let mut model = Llama::from_pretrained(&dir, LoadOptions::default())?;
    model.add_lora(&LoraConfig::new(8, 16.0, &["q_proj", "v_proj"]))?;
    let params: Vec<Tensor> = model.lora_parameters().into_iter().map(|(_, t)| t).collect();
    let config = AdamConfig { lr: 1e-4, ..AdamConfig::adamw() };
    let opt = RefCell::new(AdamW::try_new(params, config)?);
    let vocab = model.config().vocab_size as i64;
    let ids: Vec<i64> = (0..(batch * len) as i64).map(|i| (i * 7919 + 13) % vocab).collect();
    let ids = Tensor::from_vec(ids, [batch, len]);
    // The causal LM loss: each position predicts the next id.
    let loss_of = |ids: &Tensor| -> Tensor {
        let logits = model.forward(ids).expect("the batch fits the model");
        let v = logits.dims()[2] as i64;
        let pred = logits.narrow(1, 0, len - 1).reshape(&[-1, v]);
        let next = ids.narrow(1, 1, len - 1).reshape(&[-1]);
        F::cross_entropy(&pred, &next)
    };
    let mut step = kiln::compile(|ids: &Tensor| -> Tensor {
        let mut opt = opt.borrow_mut();
        opt.zero_grad();
        let loss =
            if autocast { kiln::autocast(DType::BF16, || loss_of(ids)) } else { loss_of(ids) };
        loss.backward();
        opt.step();
        loss
    });
    let start = Instant::now();
    step.try_call::<_, Tensor>(&ids)?.item::<f32>();
    let first = start.elapsed().as_secs_f64();
    step.try_call::<_, Tensor>(&ids)?.item::<f32>();
    let mut times = Vec::new();
    for _ in 0..reps {
        let start = Instant::now();
        step.try_call::<_, Tensor>(&ids)?.item::<f32>();
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let mode = if autocast { "autocast bf16" } else { "f32" };
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let line = format!(
        "{{\"workload\": \"LoRA step {name} b{batch}x{len}\", \"peer\": \"kiln\", \"mode\": \"{mode}\", \
         \"median_ms\": {:.1}, \"first_s\": {first:.2}}}",
        median * 1e3
    );
    println!("{line}");
    if let Some(path) = json {
        let io = |e: std::io::Error| kiln::Error::Io { op: "bench_lora", detail: e.to_string() };
        let mut f =
            std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(io)?;
        writeln!(f, "{line}").map_err(io)?;
    }
    Ok(())
}
