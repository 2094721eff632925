//! Sentence-embedding speed of a local BERT folder, as `benches/peers/encoder_anchor.py`
//! measures PyTorch's: a batch of `--batch` sequences of `--len` tokens (no padding), the
//! encoder, mean pooling over the attention mask and L2 normalisation; sentences/s from the
//! median of `--reps` batches after a warm-up, and the first call's time.
//!
//! ```text
//! cargo run --release -p kiln-models --example bench_encode -- --model DIR [--autocast bf16] [--dtype bf16] [--batch 32] [--len 128] [--reps 7] [--json FILE] [--profile]
//! ```
//!
//! `--autocast bf16` runs the f32 model under `kiln::autocast(BF16)` (products and attention
//! in bf16, norms and reductions in f32); `--dtype bf16` loads the weights in bf16.
//! `--profile` prints kiln's profile of one batch instead.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[path = "common/args.rs"]
mod args;

use kiln::nn::functional as F;
use kiln::{DType, Device, Tensor};
use kiln_models::bert::Bert;
use kiln_models::{LoadOptions, Pooling, sentence::pool};

/// One batch's embeddings, computed.
fn encode(model: &Bert, ids: &Tensor, mask: &Tensor, autocast: Option<DType>) -> kiln::Result<()> {
    let run = || -> kiln::Result<Tensor> {
        let h = model.forward(ids, None, Some(mask))?.last_hidden_state;
        F::try_normalize(&pool(&h, mask, Pooling::Mean)?, 2.0, 1, 1e-12)
    };
    let e = match autocast {
        Some(dtype) => kiln::autocast(dtype, run)?,
        None => run()?,
    };
    e.try_realize()
}

fn main() -> kiln::Result<()> {
    let (mut dir, mut dtype, mut autocast, mut json) = (None, DType::F32, None, None::<PathBuf>);
    let (mut batch, mut len, mut reps, mut profiling) = (32usize, 128usize, 7usize, false);
    let usage = "usage: bench_encode --model DIR [--autocast bf16] [--dtype bf16] [--batch 32] \
                 [--len 128] [--reps 7] [--json FILE] [--profile]";
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        args::help(&flag, usage);
        if flag == "--profile" {
            profiling = true;
            continue;
        }
        let value = it.next().unwrap_or_default();
        let bf16 = || match value.as_str() {
            "f32" => DType::F32,
            "bf16" => DType::BF16,
            other => args::fail(&format!("{flag} {other}: f32 or bf16"), usage),
        };
        match flag.as_str() {
            "--model" => dir = Some(PathBuf::from(&value)),
            "--dtype" => dtype = bf16(),
            "--autocast" => autocast = Some(bf16()),
            "--batch" => batch = args::number(&flag, &value, usage),
            "--len" => len = args::number(&flag, &value, usage),
            "--reps" => reps = args::number::<usize>(&flag, &value, usage).max(1),
            "--json" => json = Some(PathBuf::from(&value)),
            other => args::fail(&format!("unknown argument {other}"), usage),
        }
    }
    let Some(dir) = dir else {
        args::fail(
            "bench_encode needs --model (benches/peers/make_checkpoints.py writes one)",
            usage,
        )
    };
    let model = Bert::from_pretrained(
        &dir,
        LoadOptions { dtype, device: Device::Cpu, ..LoadOptions::default() },
    )?;
    let vocab = model.config().vocab_size as i64;
    let ids: Vec<i64> = (0..(batch * len) as i64).map(|i| (i * 7919 + 13) % vocab).collect();
    let ids = Tensor::from_vec(ids, [batch, len]);
    let mask = Tensor::ones([batch, len]).bool();
    if profiling {
        encode(&model, &ids, &mask, autocast)?;
        let (result, profile) = kiln::profile(|| encode(&model, &ids, &mask, autocast));
        result?;
        println!("one batch of {batch} x {len} tokens:\n{profile}");
        return Ok(());
    }
    let start = Instant::now();
    encode(&model, &ids, &mask, autocast)?;
    let first = start.elapsed().as_secs_f64();
    encode(&model, &ids, &mask, autocast)?;
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let start = Instant::now();
            encode(&model, &ids, &mask, autocast).map(|()| start.elapsed().as_secs_f64())
        })
        .collect::<kiln::Result<_>>()?;
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    let mode = match (autocast, dtype) {
        (Some(_), _) => "autocast bf16",
        (None, DType::BF16) => "bf16 weights",
        _ => "f32",
    };
    let line = format!(
        "{{\"workload\": \"BERT encode b{batch}x{len}\", \"peer\": \"kiln\", \"mode\": \"{mode}\", \
         \"median_ms\": {:.1}, \"sentences_s\": {:.1}, \"first_s\": {first:.2}}}",
        median * 1e3,
        batch as f64 / median
    );
    println!("{line}");
    if let Some(path) = json {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| kiln::Error::Io { op: "bench_encode", detail: e.to_string() })?;
        writeln!(f, "{line}")
            .map_err(|e| kiln::Error::Io { op: "bench_encode", detail: e.to_string() })?;
    }
    Ok(())
}
