//! Trains a character-level GPT on seven Shakespeare plays (`data/shakespeare.txt.gz`):
//! model W7 (4 pre-norm layers, d_model 128, 4 heads, context 64, batch 32), AdamW with
//! weight decay on the matrices only, linear warmup then cosine decay, one compiled step.
//! Prints `step N train loss X val loss Y` at each evaluation, saves a checkpoint (model,
//! optimizer, schedule, random state), and ends by sampling text from a prompt with a
//! temperature and top-k. The last line is `final val loss X`.
//!
//! ```text
//! cargo run --release --example train_gpt                 # train from scratch
//! cargo run --release --example train_gpt -- --resume    # continue from the checkpoint
//!                                                         # (with the same --steps)
//! cargo run --release --example train_gpt -- --steps 300  # a shorter run
//! cargo run --release --example train_gpt -- --bf16       # under autocast(BF16)
//! cargo run --release --example train_gpt -- --random-context  # lengths 16..=64
//! ```
//!
//! `--bf16` runs the forward pass and loss under `kiln::autocast(DType::BF16, ..)`: products
//! and attention in bf16 (on AVX512-BF16 dot products where the CPU has them), norms, softmax
//! and the loss in f32, weights and optimizer state in f32.
//!
//! `--random-context` draws each batch's context length from 16 to 64 (a variable-length
//! workload): the compiled step sees a new size on most calls, with the length dimension
//! marked dynamic (`Tensor::mark_dynamic`), and its statistics at the end say how many
//! plans it built. It trains for 1,440 steps unless `--steps` says otherwise: about the
//! tokens of 900 steps at length 64.

#[path = "common/gpt.rs"]
mod gpt;

use std::cell::RefCell;
use std::io::Read;
use std::path::Path;
use std::time::Instant;

use gpt::{Gpt, GptConfig};
use indicatif::{ProgressBar, ProgressStyle};
use kiln::checkpoint::Checkpoint;
use kiln::nn::{Module, Parameters};
use kiln::optim::{
    AdamConfig, AdamW, CosineAnnealingLr, LinearWarmup, LrScheduler, Optimizer, SequentialLr,
};
use kiln::prelude::*;

const BATCH: usize = 32;
const LR: f64 = 2e-3;
const WARMUP: usize = 60;
const EVAL_EVERY: usize = 150;
const EVAL_BATCHES: usize = 8;
/// The loss the default run promises (nats per character); CI runs it.
const TARGET_VAL_LOSS: f32 = 2.0;

/// The text as token ids, and the characters they stand for.
struct Corpus {
    ids: Vec<i64>,
    chars: Vec<char>,
}

impl Corpus {
    fn load(path: &Path) -> Result<Corpus, Box<dyn std::error::Error>> {
        let mut text = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open(path)?).read_to_string(&mut text)?;
        let mut chars: Vec<char> = text.chars().collect();
        chars.sort_unstable();
        chars.dedup();
        let ids = text.chars().map(|c| chars.binary_search(&c).map_or(0, |i| i as i64)).collect();
        Ok(Corpus { ids, chars })
    }

    fn encode(&self, s: &str) -> Vec<i64> {
        s.chars().filter_map(|c| self.chars.binary_search(&c).ok().map(|i| i as i64)).collect()
    }
}

/// `BATCH` windows of `context + 1` characters at offsets drawn from kiln's generator (so a
/// checkpoint's random state resumes the same batches): inputs and next-character targets.
fn batch(ids: &[i64], context: usize) -> (Tensor, Tensor) {
    let starts = Tensor::randint(0, (ids.len() - context - 1) as i64, [BATCH]).to_vec::<i64>();
    let window = |shift: usize| -> Vec<i64> {
        starts
            .iter()
            .flat_map(|&s| ids[s as usize + shift..s as usize + shift + context].to_vec())
            .collect()
    };
    (Tensor::from_vec(window(0), [BATCH, context]), Tensor::from_vec(window(1), [BATCH, context]))
}

/// The mean loss over `EVAL_BATCHES` batches of `ids`, without gradients.
fn evaluate(model: &Gpt, ids: &[i64]) -> f32 {
    let total: f32 = (0..EVAL_BATCHES)
        .map(|_| {
            let (x, y) = batch(ids, model.config.context);
            kiln::no_grad(|| model.loss(&x, &y)).item::<f32>()
        })
        .sum();
    total / EVAL_BATCHES as f32
}

/// `n` characters continuing `prompt`, each drawn from the `top_k` most likely at
/// `temperature`.
fn sample(
    model: &Gpt,
    corpus: &Corpus,
    prompt: &str,
    n: usize,
    temperature: f64,
    top_k: usize,
) -> String {
    let mut ids = corpus.encode(prompt);
    kiln::no_grad(|| {
        for _ in 0..n {
            let start = ids.len().saturating_sub(model.config.context);
            let window = Tensor::from_vec(ids[start..].to_vec(), [1, ids.len() - start]);
            let t = window.dims()[1];
            let logits = model.forward(&window).narrow(1, t - 1, 1).reshape(&[-1]) / temperature;
            let (top, positions) = logits.topk(top_k, 0, true);
            let pick = top.softmax(0).multinomial(1, true);
            ids.push(positions.gather(0, &pick).item::<i64>());
        }
    });
    ids.iter().map(|&i| corpus.chars[i as usize]).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let resume = args.iter().any(|a| a == "--resume");
    let bf16 = args.iter().any(|a| a == "--bf16");
    let random_context = args.iter().any(|a| a == "--random-context");
    // Random lengths average 40 of 64 tokens: 1,440 steps hold the tokens of 900 full ones.
    let steps: usize = match args.iter().position(|a| a == "--steps") {
        Some(i) => args.get(i + 1).ok_or("--steps takes a number")?.parse()?,
        None if random_context => 1440,
        None => 900,
    };
    if steps <= WARMUP {
        return Err(
            format!("--steps must be more than the {WARMUP} warm-up steps, got {steps}").into()
        );
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let corpus = Corpus::load(&root.join("data/shakespeare.txt.gz"))?;
    let split = corpus.ids.len() * 9 / 10;
    let (train_ids, val_ids) = corpus.ids.split_at(split);
    println!(
        "shakespeare: {} characters ({} train, {} validation), vocabulary {}",
        corpus.ids.len(),
        train_ids.len(),
        val_ids.len(),
        corpus.chars.len()
    );

    kiln::manual_seed(1337);
    let mut model = Gpt::new(GptConfig::w7(corpus.chars.len()));
    let config = AdamConfig { lr: LR, betas: (0.9, 0.99), ..AdamConfig::adamw() };
    let opt = RefCell::new(AdamW::with_groups(model.param_groups(0.1), config)?);
    let warmup = LinearWarmup::new(&mut *opt.borrow_mut(), 0.01, WARMUP);
    let cosine = CosineAnnealingLr::new(&mut *opt.borrow_mut(), steps - WARMUP, LR / 10.0);
    let mut schedule = SequentialLr::new(
        &mut *opt.borrow_mut(),
        vec![Box::new(warmup), Box::new(cosine)],
        &[WARMUP],
    )?;
    println!(
        "model W7: {} parameters; AdamW lr {LR}, warmup {WARMUP} steps then cosine{}",
        model.num_parameters(),
        if bf16 { "; autocast bf16" } else { "" }
    );

    let out_dir = root.join("target");
    std::fs::create_dir_all(&out_dir)?;
    let ckpt_path = out_dir.join("train_gpt.ckpt.safetensors");
    let mut step = 0;
    if resume {
        let ckpt = Checkpoint::load(&ckpt_path)
            .map_err(|e| format!("--resume needs {}: {e}", ckpt_path.display()))?;
        ckpt.restore_model(&mut model)?;
        ckpt.restore_optimizer(&mut *opt.borrow_mut())?;
        ckpt.restore_scheduler(&mut schedule)?;
        ckpt.restore_rng()?;
        step = ckpt.value("step").ok_or("the checkpoint has no step")?.parse()?;
        let planned: usize =
            ckpt.value("steps").ok_or("the checkpoint has no step count")?.parse()?;
        if planned != steps {
            return Err(format!(
                "the checkpoint is from a run of {planned} steps; resume it with --steps {planned}"
            )
            .into());
        }
        println!("resumed from {} at step {step}", ckpt_path.display());
    }

    let bar = ProgressBar::new(steps as u64);
    bar.set_style(ProgressStyle::with_template(
        "{bar:32.cyan/blue} {pos:>5}/{len} steps  {msg}  [{elapsed_precise}]",
    )?);
    bar.set_position(step as u64);
    let started = Instant::now();
    let first_step = step;
    let mut tokens = 0usize;
    let mut val_loss = f32::NAN;
    {
        let mut train_step = kiln::compile(|(x, y): (&Tensor, &Tensor)| {
            let mut opt = opt.borrow_mut();
            opt.zero_grad();
            let loss = if bf16 {
                kiln::autocast(DType::BF16, || model.loss(x, y))
            } else {
                model.loss(x, y)
            };
            loss.backward();
            opt.step();
            loss
        });
        while step < steps {
            let context = if random_context {
                Tensor::randint(16, model.config.context as i64 + 1, [1]).item::<i64>() as usize
            } else {
                model.config.context
            };
            let (x, y) = batch(train_ids, context);
            if random_context {
                x.mark_dynamic(1);
                y.mark_dynamic(1);
            }
            let loss = train_step.try_call((&x, &y))?.item::<f32>();
            schedule.step(&mut *opt.borrow_mut());
            step += 1;
            tokens += BATCH * context;
            let rate = tokens as f64 / started.elapsed().as_secs_f64();
            bar.set_message(format!("loss {loss:.3}  {rate:>6.0} tokens/s"));
            bar.inc(1);
            if step % EVAL_EVERY == 0 || step == steps {
                val_loss = evaluate(&model, val_ids);
                let line = format!("step {step} train loss {loss:.4} val loss {val_loss:.4}");
                // A hidden bar (output not a terminal) prints nothing, so print directly.
                if bar.is_hidden() {
                    println!("{line}");
                } else {
                    bar.println(line);
                }
                Checkpoint::new()
                    .with_model(&model)
                    .with_optimizer(&*opt.borrow())
                    .with_scheduler(&schedule)
                    .with_rng()
                    .with_value("step", step)
                    .with_value("steps", steps)
                    .save(&ckpt_path)?;
            }
        }
        bar.finish_and_clear();
        // Every new length is a recompile, each with its reason: the summary then.
        if random_context {
            let (stats, kernels) = (train_step.stats(), kiln::debug::cache_stats());
            println!(
                "compiled step: {} calls, {} planned ({} recompiles), {} replayed; kernels \
                 compiled {} ({} size-generic), {} served by a size-generic kernel",
                stats.calls,
                stats.plans,
                stats.recompiles.len(),
                stats.replays,
                kernels.compiled,
                kernels.generic,
                kernels.served
            );
        } else {
            println!("compiled step: {:?}", train_step.stats());
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "trained {} steps in {seconds:.1} s ({:.0} tokens/s); checkpoint in {}",
        step - first_step,
        tokens as f64 / seconds.max(1e-9),
        ckpt_path.display()
    );

    kiln::manual_seed(7);
    let text = sample(&model, &corpus, "\nHam.\n", 400, 0.8, 10);
    println!("--- sample (temperature 0.8, top-k 10) ---{text}\n---");
    if val_loss.is_nan() {
        val_loss = evaluate(&model, val_ids);
    }
    println!("final val loss {val_loss:.4}");
    if steps >= 900 && val_loss > TARGET_VAL_LOSS {
        return Err(format!("validation loss {val_loss:.4} is above {TARGET_VAL_LOSS}").into());
    }
    Ok(())
}
