//! candle's `llama` model, batch 1, greedy, measured as kiln's `bench_generate`: decode
//! tokens/s over the steps after the first of `--new` from a 32-token prompt (its KV
//! cache), and a 512-token prompt's prefill tokens/s; medians of `--reps` after a warm-up.
//! Prints one JSON line.
//!
//!     cargo run --release --manifest-path benches/peers/candle/Cargo.toml -- --model DIR [--new 32] [--reps 3] [--bf16]

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::llama::{Cache, Llama, LlamaConfig};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> candle_core::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned();
    let dir = std::path::PathBuf::from(arg("--model").expect("--model DIR"));
    let new: usize = arg("--new").map_or(32, |v| v.parse().unwrap());
    let reps: usize = arg("--reps").map_or(3, |v| v.parse().unwrap());
    let dtype = if args.iter().any(|a| a == "--bf16") { DType::BF16 } else { DType::F32 };
    let device = Device::Cpu;
    let config: LlamaConfig = serde_json::from_slice(&std::fs::read(dir.join("config.json"))?).unwrap();
    let config = config.into_config(false);
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&[dir.join("model.safetensors")], dtype, &device)? };
    let model = Llama::load(vb, &config)?;
    let vocab = config.vocab_size as u32;
    let prompt = |len: usize| (0..len as u32).map(|i| (i * 7919 + 13) % vocab).collect::<Vec<_>>();
    // Greedy: returns (prefill seconds, decode seconds for new - 1 steps).
    let run = |prompt: &[u32], new: usize| -> candle_core::Result<(f64, f64)> {
        let mut cache = Cache::new(true, dtype, &config, &device)?;
        let started = Instant::now();
        let input = Tensor::new(prompt, &device)?.unsqueeze(0)?;
        let logits = model.forward(&input, 0, &mut cache)?;
        let mut next = logits.squeeze(0)?.argmax(0)?.to_scalar::<u32>()?;
        let prefill = started.elapsed().as_secs_f64();
        let decoding = Instant::now();
        for step in 1..new {
            let input = Tensor::new(&[next], &device)?.unsqueeze(0)?;
            let logits = model.forward(&input, prompt.len() + step - 1, &mut cache)?;
            next = logits.squeeze(0)?.argmax(0)?.to_scalar::<u32>()?;
        }
        Ok((prefill, decoding.elapsed().as_secs_f64()))
    };
    run(&prompt(32), new)?;
    run(&prompt(512), 1)?;
    let (mut decode, mut prefill) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        decode.push((new - 1) as f64 / run(&prompt(32), new)?.1);
        prefill.push(512.0 / run(&prompt(512), 1)?.0);
    }
    println!(
        "{{\"framework\":\"candle\",\"model\":\"{}\",\"dtype\":\"{}\",\"decode_tokens_per_s\":{:.2},\"prefill_tokens_per_s\":{:.2}}}",
        dir.file_name().unwrap().to_string_lossy(),
        if dtype == DType::BF16 { "bf16" } else { "f32" },
        median(decode),
        median(prefill)
    );
    Ok(())
}
