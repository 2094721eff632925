//! LoRA fine-tuning of a Llama-family model on *The Tempest*: by default the bundled
//! character-level model (`data/shakespeare-llama`, trained on the six plays before it), or
//! any local folder whose tokenizer covers the text (`--model DIR`). Prints the validation
//! loss on the play before and after, trains rank-8 adapters on every projection with a
//! progress bar, saves them in PEFT's layout, merges them, and samples from the merged model.
//!
//! ```text
//! cargo run --release -p kiln-models --example finetune -- [--model DIR] [--steps 300] [--out DIR]
//! ```

#[path = "common/shakespeare.rs"]
mod shakespeare;

use std::cell::RefCell;
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use kiln::optim::{AdamConfig, AdamW, Optimizer};
use kiln::prelude::*;
use kiln_models::lora::{LoraConfig, LoraModel};
use kiln_models::{GenerateOptions, LoadOptions, Tokenizer, generate, llama::Llama};
use shakespeare::{Plays, causal_loss, random_batch};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1));
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = value("--model").map_or_else(|| root.join("data/shakespeare-llama"), PathBuf::from);
    let out = value("--out").map_or_else(|| root.join("target/tempest-lora"), PathBuf::from);
    let steps: usize = value("--steps").map_or(Ok(300), |s| s.parse())?;

    let mut model = Llama::from_pretrained(&dir, LoadOptions::default())?;
    let tokenizer = Tokenizer::from_dir(&dir)?;
    let plays = Plays::load()?;
    let ids = tokenizer.encode(&plays.tempest, false)?;
    let (train, val) = ids.split_at(ids.len() * 9 / 10);
    let before = plays.evaluate(&model, val)?;
    println!(
        "{}: The Tempest, {} characters ({} train, {} validation); validation loss before: {before:.4}",
        dir.display(),
        ids.len(),
        train.len(),
        val.len()
    );

    kiln::manual_seed(5);
    let config = LoraConfig { dropout: 0.05, ..LoraConfig::new(8, 16.0, &["all-linear"]) };
    let adapted = model.add_lora(&config)?;
    model.train_lora(true);
    let params: Vec<Tensor> = model.lora_parameters().into_iter().map(|(_, t)| t).collect();
    let trainable: usize = params.iter().map(Tensor::numel).sum();
    println!("LoRA rank 8 on {adapted} projections: {trainable} trainable parameters");
    let opt = RefCell::new(AdamW::try_new(params, AdamConfig { lr: 3e-3, ..AdamConfig::adamw() })?);
    let mut step = kiln::compile(|(x, y): (&Tensor, &Tensor)| -> Tensor {
        let mut opt = opt.borrow_mut();
        opt.zero_grad();
        let loss = causal_loss(&model, x, y);
        loss.backward();
        opt.step();
        loss
    });
    let bar = ProgressBar::new(steps as u64);
    bar.set_style(ProgressStyle::with_template(
        "{bar:32} {pos:>4}/{len} steps  {msg}  [{elapsed}]",
    )?);
    for _ in 0..steps {
        let (x, y) = random_batch(train, 16, 128);
        let loss = step.try_call::<_, Tensor>((&x, &y))?.item::<f32>();
        bar.set_message(format!("loss {loss:.3}"));
        bar.inc(1);
    }
    bar.finish_and_clear();
    drop(step);
    model.train_lora(false);
    let after = plays.evaluate(&model, val)?;
    println!("validation loss after {steps} steps: {after:.4} (before {before:.4})");
    model.save_lora(&out)?;
    println!("adapters saved in PEFT's layout: {}", out.display());
    model.merge_lora()?;
    let merged = plays.evaluate(&model, val)?;
    println!("merged into the weights: validation loss {merged:.4}");

    let prompt = tokenizer.encode("PROSPERO.\n", false)?;
    let options = GenerateOptions {
        max_new_tokens: 200,
        temperature: 0.8,
        top_k: Some(10),
        seed: 7,
        ..GenerateOptions::default()
    };
    print!("--- sample ---\nPROSPERO.\n");
    generate(&model, &[prompt], &options, |_, token| {
        print!("{}", tokenizer.decode(&[token], false).unwrap_or_default());
    })?;
    println!("\n---");
    if after >= before {
        return Err(
            format!("fine-tuning did not lower the validation loss ({before} -> {after})").into()
        );
    }
    Ok(())
}
