//! Writes a local Hugging Face model folder back out with `save_pretrained`: converted to
//! another dtype, re-sharded, with its tokenizer. transformers loads the result unchanged.
//! With `--lora ADAPTER` (a Llama-family model), a PEFT adapter is loaded too and written
//! back to `OUT/adapter` with `save_lora` (PEFT loads it), or, with `--merge`, folded into
//! the weights written.
//!
//! ```text
//! cargo run --release -p kiln-models --example convert -- --model DIR --out DIR
//!     [--dtype f32|bf16|f16] [--max-shard-bytes N] [--lora ADAPTER [--merge]]
//! ```

use std::path::PathBuf;

use kiln::DType;
use kiln_models::bert::Bert;
use kiln_models::gpt2::Gpt2;
use kiln_models::llama::Llama;
use kiln_models::lora::LoraModel;
use kiln_models::{Config, LoadOptions, SaveOptions, Tokenizer};

fn main() -> kiln::Result<()> {
    let usage = "usage: convert --model DIR --out DIR [--dtype f32|bf16|f16] [--max-shard-bytes N] \
                 [--lora ADAPTER [--merge]]";
    let (mut model, mut out, mut lora, mut merge) = (None, None, None::<PathBuf>, false);
    let mut load = LoadOptions::default();
    let mut save = SaveOptions::default();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--merge" {
            merge = true;
            continue;
        }
        let value = args.next().unwrap_or_else(|| panic!("{flag} needs a value\n{usage}"));
        match flag.as_str() {
            "--model" => model = Some(PathBuf::from(value)),
            "--out" => out = Some(PathBuf::from(value)),
            "--lora" => lora = Some(PathBuf::from(value)),
            "--dtype" => {
                load.dtype = match value.as_str() {
                    "f32" => DType::F32,
                    "bf16" => DType::BF16,
                    "f16" => DType::F16,
                    other => panic!("--dtype {other}: f32, bf16 or f16\n{usage}"),
                }
            }
            "--max-shard-bytes" => {
                save.max_shard_bytes = value.parse().unwrap_or_else(|_| panic!("{usage}"));
            }
            other => panic!("unknown flag {other}\n{usage}"),
        }
    }
    let (Some(model), Some(out)) = (model, out) else { panic!("{usage}") };
    match Config::from_dir(&model)? {
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
