//! Writes a local Hugging Face model folder back out with `save_pretrained`: converted to
//! another dtype, re-sharded, with its tokenizer. transformers loads the result unchanged.
//! With `--lora ADAPTER` (a Llama-family model), a PEFT adapter is loaded too and written
//! back to `OUT/adapter` with `save_lora` (PEFT loads it), or, with `--merge`, folded into
//! the weights written. With `--quantize q8_0|q4_0|q4_k|int8` (a Llama-family model) its
//! projections and head are written as GGML blocks or per-channel int8 rows (`--embeddings`:
//! the table too), which `generate --model OUT --keep-quantized` reads back without
//! quantizing again (transformers does not load such a folder).
//!
//! ```text
//! cargo run --release -p kiln-models --example convert -- --model DIR --out DIR
//!     [--dtype f32|bf16|f16] [--max-shard-bytes N] [--lora ADAPTER [--merge]]
//!     [--quantize q8_0|q4_0|q4_k|int8 [--embeddings]]
//! ```

use std::path::PathBuf;

#[path = "common/args.rs"]
mod args;

use kiln::DType;
use kiln_models::bert::Bert;
use kiln_models::gpt2::Gpt2;
use kiln_models::llama::Llama;
use kiln_models::lora::LoraModel;
use kiln_models::quantize::{QuantConfig, QuantKind};
use kiln_models::{Config, LoadOptions, SaveOptions, Tokenizer};
use kiln_runtime::quant::GgmlType;

fn main() -> kiln::Result<()> {
    let usage = "usage: convert --model DIR --out DIR [--dtype f32|bf16|f16] [--max-shard-bytes N] \
                 [--lora ADAPTER [--merge]] [--quantize q8_0|q4_0|q4_k|int8 [--embeddings]]";
    let (mut model, mut out, mut lora, mut merge) = (None, None, None::<PathBuf>, false);
    let mut quantize: Option<QuantConfig> = None;
    let mut embeddings = false;
    let mut load = LoadOptions::default();
    let mut save = SaveOptions::default();
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        args::help(&flag, usage);
        match flag.as_str() {
            "--merge" => merge = true,
            "--embeddings" => embeddings = true,
            _ => {}
        }
        if flag == "--merge" || flag == "--embeddings" {
            continue;
        }
        let value =
            argv.next().unwrap_or_else(|| args::fail(&format!("{flag} needs a value"), usage));
        match flag.as_str() {
            "--model" => model = Some(PathBuf::from(value)),
            "--out" => out = Some(PathBuf::from(value)),
            "--lora" => lora = Some(PathBuf::from(value)),
            "--dtype" => {
                load.dtype = match value.as_str() {
                    "f32" => DType::F32,
                    "bf16" => DType::BF16,
                    "f16" => DType::F16,
                    other => args::fail(&format!("--dtype {other}: f32, bf16 or f16"), usage),
                }
            }
            "--quantize" => {
                let kind = match value.as_str() {
                    "q8_0" => GgmlType::Q8_0.into(),
                    "q4_0" => GgmlType::Q4_0.into(),
                    "q4_k" => GgmlType::Q4_K.into(),
                    "int8" => QuantKind::Int8,
                    other => {
                        args::fail(&format!("--quantize {other}: q8_0, q4_0, q4_k or int8"), usage)
                    }
                };
                quantize = Some(QuantConfig::new(kind));
            }
            "--max-shard-bytes" => {
                save.max_shard_bytes = args::number(&flag, &value, usage);
            }
            other => args::fail(&format!("unknown flag {other}"), usage),
        }
    }
    let (Some(model), Some(out)) = (model, out) else {
        args::fail("convert needs --model and --out", usage)
    };
    let config = Config::from_dir(&model)?;
    if quantize.is_some() && !matches!(config, Config::Llama(_)) {
        args::fail("--quantize takes a Llama-family model", usage);
    }
    match config {
        Config::Gpt2(_) => Gpt2::from_pretrained(&model, load)?.save_pretrained_with(&out, save)?,
        Config::Llama(_) => {
            let mut llama = Llama::from_pretrained(&model, load)?;
            if let Some(adapter) = &lora {
                llama.load_lora(adapter)?;
                if merge {
                    llama.merge_lora()?;
                } else {
                    llama.save_lora(&out.join("adapter"))?;
                }
            }
            if let Some(config) = quantize {
                let report = llama.quantize_(&QuantConfig { embeddings, ..config })?;
                println!("quantized {} weights to {}", report.quantized.len(), config.kind);
                for (name, why) in &report.kept {
                    println!("kept {name}: {why}");
                }
            }
            llama.save_pretrained_with(&out, save)?;
        }
        Config::Bert(_) => Bert::from_pretrained(&model, load)?.save_pretrained_with(&out, save)?,
    }
    if model.join("tokenizer.json").exists() {
        Tokenizer::from_dir(&model)?.save(&out)?;
    }
    println!("wrote {}", out.display());
    Ok(())
}
