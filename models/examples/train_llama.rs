//! Trains a character-level Llama-architecture model from scratch on six Shakespeare plays
//! (`data/shakespeare.txt.gz` without *The Tempest*, which `finetune` adapts it to) and
//! exports it as a Hugging Face folder: `config.json`, `model.safetensors` and a
//! character-level `tokenizer.json`, which `generate`, `finetune` and transformers load.
//! `data/shakespeare-llama/` is such an export (`data/README.md` says how it was made).
//!
//! ```text
//! cargo run --release -p kiln-models --example train_llama -- [--steps 2000] [--export DIR] [--bf16]
//!     [--hidden 128 --intermediate 352 --layers 4]
//! ```
//!
//! The model: hidden 128, 4 layers, 4 query heads and 2 key/value heads of 32, SwiGLU 352 (the
//! sizes as given; the heads stay 32 wide, hidden / 32 of them, half as many for keys),
//! rotary positions, RMS norms, an untied head; batch 16 of 256 characters (its whole
//! context), AdamW (weight decay on matrices), linear warm-up then cosine decay, one compiled
//! step. `--bf16` exports the weights in bf16 (half the bytes; trained in f32 either way).

#[path = "common/shakespeare.rs"]
mod shakespeare;

use std::cell::RefCell;
use std::path::PathBuf;

use indicatif::{ProgressBar, ProgressStyle};
use kiln::nn::Parameters;
use kiln::optim::{
    AdamConfig, AdamW, CosineAnnealingLr, LinearWarmup, LrScheduler, Optimizer, ParamGroup,
    SequentialLr,
};
use kiln::prelude::*;
use kiln_models::config::{LlamaConfig, Rope, RopeScaling};
use kiln_models::{LoadOptions, llama::Llama};
use shakespeare::{Plays, causal_loss, random_batch};

const BATCH: usize = 16;
const CONTEXT: usize = 256;
const LR: f64 = 3e-3;
const WARMUP: usize = 100;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1));
    let steps: usize = value("--steps").map_or(Ok(2000), |s| s.parse())?;
    let export = value("--export").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/shakespeare-llama"),
        PathBuf::from,
    );
    let bf16 = args.iter().any(|a| a == "--bf16");
    let hidden: usize = value("--hidden").map_or(Ok(128), |s| s.parse())?;
    let intermediate: usize = value("--intermediate").map_or(Ok(352), |s| s.parse())?;
    let layers: usize = value("--layers").map_or(Ok(4), |s| s.parse())?;
    if hidden == 0 || !hidden.is_multiple_of(64) {
        return Err(
            format!("--hidden {hidden}: a multiple of 64 (heads of 32, 2 per key head)").into()
        );
    }
    if steps <= WARMUP {
        return Err(format!("--steps must be more than the {WARMUP} warm-up steps").into());
    }
    let plays = Plays::load()?;
    let ids = plays.encode(&plays.six);
    let (train, val) = ids.split_at(ids.len() * 9 / 10);
    kiln::manual_seed(2024);
    let config = LlamaConfig {
        vocab_size: plays.chars.len(),
        hidden_size: hidden,
        intermediate_size: intermediate,
        num_hidden_layers: layers,
        num_attention_heads: hidden / 32,
        num_key_value_heads: hidden / 64,
        head_dim: 32,
        max_position_embeddings: 256,
        rms_norm_eps: 1e-5,
        rope: Rope { theta: 10_000.0, scaling: RopeScaling::None },
        tie_word_embeddings: false,
        qkv_bias: false,
        o_bias: false,
        mlp_bias: false,
    };
    let model = Llama::new(config, LoadOptions::default())?;
    let (matrices, vectors): (Vec<Tensor>, Vec<Tensor>) =
        model.parameters().into_iter().partition(|p| p.ndim() >= 2);
    let groups = vec![
        ParamGroup::new(matrices).weight_decay(0.1),
        ParamGroup::new(vectors).weight_decay(0.0),
    ];
    let adam = AdamConfig { lr: LR, betas: (0.9, 0.99), ..AdamConfig::adamw() };
    let opt = RefCell::new(AdamW::with_groups(groups, adam)?);
    let warmup = LinearWarmup::new(&mut *opt.borrow_mut(), 0.01, WARMUP);
    let cosine = CosineAnnealingLr::new(&mut *opt.borrow_mut(), steps - WARMUP, LR / 10.0);
    let mut schedule = SequentialLr::new(
        &mut *opt.borrow_mut(),
        vec![Box::new(warmup), Box::new(cosine)],
        &[WARMUP],
    )?;
    println!(
        "six plays: {} characters ({} train, {} validation), vocabulary {}; {} parameters",
        ids.len(),
        train.len(),
        val.len(),
        plays.chars.len(),
        model.num_parameters()
    );
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
        "{bar:32} {pos:>5}/{len} steps  {msg}  [{elapsed}]",
    )?);
    for i in 1..=steps {
        let (x, y) = random_batch(train, BATCH, CONTEXT);
        let loss = step.try_call::<_, Tensor>((&x, &y))?.item::<f32>();
        schedule.step(&mut *opt.borrow_mut());
        bar.set_message(format!("loss {loss:.3}"));
        bar.inc(1);
        if i % 500 == 0 || i == steps {
            let line = format!(
                "step {i} train loss {loss:.4} val loss {:.4}",
                plays.evaluate(&model, val)?
            );
            if bar.is_hidden() { println!("{line}") } else { bar.println(line) }
        }
    }
    bar.finish_and_clear();
    drop(step);
    let val_loss = plays.evaluate(&model, val)?;
    let mut model = model;
    if bf16 {
        model.visit_mut("", &mut |_, t| *t = t.to_dtype(DType::BF16).detach());
    }
    model.save_pretrained(&export)?;
    plays.tokenizer()?.save(&export)?;
    println!("final val loss {val_loss:.4}; exported to {}", export.display());
    Ok(())
}
