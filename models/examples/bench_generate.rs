//! Decode and prefill speed of a local model folder, batch 1, as the peers' script measures
//! them (`benches/peers/generate.py`): a 32-token prompt then `--new` greedy tokens (decode
//! tokens/s over the steps after the first), and a 512-token prompt's prefill (tokens/s),
//! each the median of `--reps` runs after a warm-up.
//!
//! ```text
//! cargo run --release -p kiln-models --example bench_generate -- --model DIR [--dtype bf16] [--new 32] [--reps 3] [--json FILE] [--profile]
//! cargo run --release -p kiln-models --example bench_generate -- --model FILE.gguf [--keep-quantized [--int8-activations]]
//! cargo run --release -p kiln-models --example bench_generate -- --model DIR --quantize q8_0|q4_0|q4_k|int8 [--int8-activations]
//! cargo run --release -p kiln-models --example bench_generate -- --model benches/configs/llama-125m --random [--cuda]
//! ```
//!
//! `--random` takes only the folder's `config.json` and gives the model random weights
//! (`Llama::new`, `Gpt2::new`: timing needs no checkpoint; `benches/configs/` holds the
//! benchmark models' configs); `--cuda` runs on the first CUDA device.
//!
//! A GGUF file (`benches/peers/make_gguf_bench.py` writes the 125M Llama's) loads dequantized,
//! or with `--keep-quantized` its quantized projections read their blocks (and with
//! `--int8-activations` take integer products with activations quantized per block). A
//! folder's weights are quantized after loading with `--quantize` (`quantize_`).
//!
//! `--profile` prints kiln's profile of a generation (after a warm-up) instead: a 32-token
//! prompt's prefill and 16 decode steps, so that the decode step's kernels lead.

use std::io::Write;
use std::path::PathBuf;

#[path = "common/args.rs"]
mod args;

use kiln::{DType, Device};
use kiln_models::gpt2::Gpt2;
use kiln_models::llama::Llama;
use kiln_models::quantize::{QuantConfig, QuantKind};
use kiln_models::{Activations, CausalLm, Config, GenerateOptions, LoadOptions, generate};
use kiln_runtime::quant::GgmlType;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Decode tokens/s and prefill tokens/s, medians over `reps`.
fn measure(model: &impl CausalLm, new: usize, reps: usize) -> kiln::Result<(f64, f64)> {
    let vocab = model.vocab_size() as i64;
    let prompt =
        |len: usize| vec![(0..len as i64).map(|i| (i * 7919 + 13) % vocab).collect::<Vec<_>>()];
    let decode = GenerateOptions { max_new_tokens: new, ..GenerateOptions::default() };
    let prefill = GenerateOptions { max_new_tokens: 1, ..GenerateOptions::default() };
    generate(model, &prompt(32), &decode, |_, _| {})?;
    generate(model, &prompt(512), &prefill, |_, _| {})?;
    let (mut d, mut p) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        d.push(generate(model, &prompt(32), &decode, |_, _| {})?.decode_tokens_per_second());
        p.push(generate(model, &prompt(512), &prefill, |_, _| {})?.prefill_tokens_per_second());
    }
    Ok((median(d), median(p)))
}

/// kiln's profile of a 32-token prompt's prefill and 16 decode steps.
fn profile(model: &impl CausalLm) -> kiln::Result<()> {
    let prompt =
        vec![(0..32i64).map(|i| (i * 7919 + 13) % model.vocab_size() as i64).collect::<Vec<_>>()];
    let options = GenerateOptions { max_new_tokens: 4, ..GenerateOptions::default() };
    generate(model, &prompt, &options, |_, _| {})?;
    let mut steps = 0;
    let (generation, profile) = kiln::profile(|| {
        generate(model, &prompt, &GenerateOptions { max_new_tokens: 17, ..options }, |_, _| {
            steps += 1;
        })
    });
    generation?;
    println!("a prefill and 16 decode steps ({steps} tokens):\n{profile}");
    Ok(())
}

fn main() -> kiln::Result<()> {
    let (mut dir, mut dtype, mut new, mut reps, mut json, mut device) =
        (None, DType::F32, 32, 3, None::<PathBuf>, Device::Cpu);
    let (mut profiling, mut keep_quantized, mut int8, mut random) = (false, false, false, false);
    let mut quantize = None;
    let usage = "usage: bench_generate --model DIR|FILE.gguf [--dtype f32|bf16] [--new 32] [--reps 3] \
                 [--json FILE] [--profile] [--keep-quantized] [--int8-activations] \
                 [--quantize q8_0|q4_0|q4_k|int8] [--random] [--cuda]";
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        args::help(&flag, usage);
        let switches =
            ["--profile", "--keep-quantized", "--int8-activations", "--random", "--cuda"];
        if switches.contains(&flag.as_str()) {
            profiling |= flag == "--profile";
            keep_quantized |= flag == "--keep-quantized";
            int8 |= flag == "--int8-activations";
            random |= flag == "--random";
            if flag == "--cuda" {
                device = Device::Cuda(0);
            }
            continue;
        }
        let value = it.next().unwrap_or_default();
        match flag.as_str() {
            "--model" => dir = Some(PathBuf::from(value)),
            "--dtype" => {
                dtype = match value.as_str() {
                    "f32" => DType::F32,
                    "bf16" => DType::BF16,
                    other => args::fail(&format!("--dtype {other}: f32 or bf16"), usage),
                }
            }
            "--new" => new = args::number(&flag, &value, usage),
            "--reps" => reps = args::number::<usize>(&flag, &value, usage).max(1),
            "--json" => json = Some(PathBuf::from(value)),
            "--quantize" => {
                quantize = Some(match value.as_str() {
                    "q8_0" => GgmlType::Q8_0.into(),
                    "q4_0" => GgmlType::Q4_0.into(),
                    "q4_k" => GgmlType::Q4_K.into(),
                    "int8" => QuantKind::Int8,
                    other => {
                        args::fail(&format!("--quantize {other}: q8_0, q4_0, q4_k or int8"), usage)
                    }
                });
            }
            other => args::fail(&format!("unknown argument {other}"), usage),
        }
    }
    let Some(dir) = dir else {
        args::fail(
            "bench_generate needs --model (see examples/generate.rs for how to get one)",
            usage,
        )
    };
    let activations = if int8 { Activations::Int8 } else { Activations::F32 };
    let options = LoadOptions { dtype, device, keep_quantized, activations };
    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    // What the record's "dtype" names: the weights' form and the activations'.
    let form =
        match (quantize, keep_quantized && dir.is_file(), int8) {
            (Some(kind), _, _) => format!("{kind} (quantize_)"),
            (None, true, _) => "blocks kept".to_string(),
            (None, false, _) => dtype.to_string(),
        } + if int8 && (quantize.is_some() || keep_quantized) { ", int8 activations" } else { "" };
    // The folder's model, or with `--random` its config's with random weights.
    let gpt2 =
        |c| if random { Gpt2::new(c, options) } else { Gpt2::from_pretrained(&dir, options) };
    let llama =
        |c| if random { Llama::new(c, options) } else { Llama::from_pretrained(&dir, options) };
    // The model as measured (and profiled): quantized first when `--quantize` asks.
    let quant = quantize.map(|kind| QuantConfig { activations, ..QuantConfig::new(kind) });
    let quantized = |mut model: Llama| -> kiln::Result<Llama> {
        if let Some(config) = &quant {
            model.quantize_(config)?;
        }
        Ok(model)
    };
    let quantized_gpt2 = |mut model: Gpt2| -> kiln::Result<Gpt2> {
        if let Some(config) = &quant {
            model.quantize_(config)?;
        }
        Ok(model)
    };
    if profiling {
        return match (dir.is_file(), Config::from_dir(&dir)) {
            (true, _) => profile(&quantized(Llama::from_gguf(&dir, options)?)?),
            (false, Ok(Config::Gpt2(c))) => profile(&quantized_gpt2(gpt2(c)?)?),
            (false, Ok(Config::Llama(c))) => profile(&quantized(llama(c)?)?),
            (false, Ok(Config::Bert(_))) => Err(not_generative(&dir)),
            (false, Err(e)) => Err(e),
        };
    }
    let (decode, prefill) = match (dir.is_file(), Config::from_dir(&dir)) {
        (true, _) => measure(&quantized(Llama::from_gguf(&dir, options)?)?, new, reps)?,
        (false, Ok(Config::Gpt2(c))) => measure(&quantized_gpt2(gpt2(c)?)?, new, reps)?,
        (false, Ok(Config::Llama(c))) => measure(&quantized(llama(c)?)?, new, reps)?,
        (false, Ok(Config::Bert(_))) => return Err(not_generative(&dir)),
        (false, Err(e)) => return Err(e),
    };
    println!("{name} {form}: decode {decode:.1} tokens/s, prefill (512) {prefill:.1} tokens/s");
    if let Some(path) = json {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .expect("the JSON file");
        writeln!(
            f,
            "{{\"framework\":\"kiln\",\"model\":\"{name}\",\"dtype\":\"{form}\",\"decode_tokens_per_s\":{decode:.2},\"prefill_tokens_per_s\":{prefill:.2}}}"
        )
        .expect("a write");
    }
    Ok(())
}

/// BERT encodes; it does not generate.
fn not_generative(dir: &std::path::Path) -> kiln::Error {
    kiln::Error::Value {
        op: "bench_generate",
        detail: format!("{} holds a BERT encoder, which does not generate text", dir.display()),
    }
}
