//! Model-level benchmarks. W7: one training step of the character-level GPT of
//! `benches/peers/models.py w7` (vocabulary 96, 4 layers, d_model 128, 4 heads, context 64, batch
//! 32, AdamW), in tokens per second. W8: one training step of the CNN of
//! `benches/peers/models.py w8` (1×32×32
//! inputs, batch 64, three conv–batch-norm–ReLU blocks with 16/32/64 channels and strides
//! 1/2/2, adaptive average pooling, a linear head, SGD with momentum 0.9), in images per
//! second: compiled, eager fused and eager unfused (one kernel per op). Also times a 3×3
//! convolution over 64 channels at 32×32, forward and forward + backward.
//!
//! `cargo run --release --example bench_models` prints a table; `-- --json` prints JSON lines,
//! `-- --only w7` (or `w8`) runs one model's rows.

#[path = "common/gpt.rs"]
mod gpt;

use std::cell::RefCell;
use std::time::Instant;

use kiln::nn::functional::{self as F, Conv2dOptions};
use kiln::nn::{
    AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Flatten, Linear, Module, Parameters, ReLU, Sequential,
};
use kiln::optim::{AdamConfig, AdamW, Optimizer, Sgd, SgdConfig};
use kiln::prelude::*;

const BATCH: usize = 64;

fn cbr(c_in: usize, c_out: usize, stride: usize) -> Sequential {
    let options = Conv2dOptions::default().padding([1, 1]).stride([stride, stride]);
    let mut conv = Conv2d::new(c_in, c_out, [3, 3], options);
    conv.bias = None;
    Sequential::new().with(conv).with(BatchNorm2d::new(c_out)).with(ReLU)
}

fn w8_model() -> Sequential {
    Sequential::new()
        .with(cbr(1, 16, 1))
        .with(cbr(16, 32, 2))
        .with(cbr(32, 64, 2))
        .with(AdaptiveAvgPool2d([1, 1]))
        .with(Flatten)
        .with(Linear::new(64, 10))
}

/// Median milliseconds per call of `f` over `reps` blocks of `block` calls, after warm-ups.
fn median_ms(reps: usize, block: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..block {
                f();
            }
            t.elapsed().as_secs_f64() * 1e3 / block as f64
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[reps / 2]
}

/// W7: a GPT training step (AdamW lr 3e-4, weight decay 0.1 on every parameter, as the
/// anchor), compiled, eager fused and eager unfused.
fn w7(rows: &mut Vec<(String, &'static str, f64, String)>) {
    const B: usize = 32;
    kiln::manual_seed(0);
    let model = gpt::Gpt::new(gpt::GptConfig::w7(96));
    let t = model.config.context;
    let xs: Vec<Tensor> = (0..4).map(|_| Tensor::randint(0, 96, [B, t])).collect();
    let ys: Vec<Tensor> = (0..4).map(|_| Tensor::randint(0, 96, [B, t])).collect();
    for x in xs.iter().chain(&ys) {
        x.realize();
    }
    let config = AdamConfig { lr: 3e-4, weight_decay: 0.1, ..AdamConfig::adamw() };
    let opt = RefCell::new(AdamW::new(model.parameters(), config));
    let step = |x: &Tensor, y: &Tensor| model.train_step(&mut *opt.borrow_mut(), x, y);
    let tokens = (B * t) as f64;
    let mut i = 0;
    let first = Instant::now();
    let mut compiled = kiln::compile(|(x, y): (&Tensor, &Tensor)| step(x, y));
    let l0 = compiled.call((&xs[0], &ys[0])).item::<f32>();
    let first_ms = first.elapsed().as_secs_f64() * 1e3;
    let ms = median_ms(5, 3, || {
        compiled.call((&xs[i % 4], &ys[i % 4])).realize();
        i += 1;
    });
    let l1 = compiled.call((&xs[0], &ys[0])).item::<f32>();
    assert!(l1 < l0, "the W7 step should learn: {l0} -> {l1}");
    let rate = |ms: f64| tokens / ms * 1e3;
    rows.push((
        "W7 GPT step".into(),
        "compiled",
        ms,
        format!("{:.0} tokens/s (first call {first_ms:.0} ms)", rate(ms)),
    ));
    drop(compiled);
    let mut autocast =
        kiln::compile(|(x, y): (&Tensor, &Tensor)| kiln::autocast(DType::BF16, || step(x, y)));
    let ms = median_ms(3, 3, || {
        autocast.call((&xs[i % 4], &ys[i % 4])).realize();
        i += 1;
    });
    rows.push((
        "W7 GPT step".into(),
        "compiled bf16 autocast",
        ms,
        format!("{:.0} tokens/s", rate(ms)),
    ));
    drop(autocast);
    if std::env::var_os("KILN_W7_PROFILE").is_some() {
        // The third of three profiled steps: the first ones also pay for fresh memory.
        let mut profile = None;
        for _ in 0..3 {
            profile = Some(kiln::profile(|| step(&xs[0], &ys[0]).realize().clone()).1);
        }
        eprintln!("{}", profile.expect("three profiled steps"));
        let (_, profile) = kiln::profile(|| {
            kiln::autocast(DType::BF16, || step(&xs[0], &ys[0]).realize().clone())
        });
        eprintln!("bf16 autocast:\n{profile}");
    }
    for (variant, mode) in
        [("fused", kiln::Execution::Fused), ("unfused", kiln::Execution::Unfused)]
    {
        let ms = kiln::with_execution(mode, || {
            median_ms(3, 2, || {
                step(&xs[i % 4], &ys[i % 4]).realize();
                i += 1;
            })
        });
        rows.push(("W7 GPT step".into(), variant, ms, format!("{:.0} tokens/s", rate(ms))));
    }
}

/// Causal attention over a long context, forward + backward: the fused op against the
/// composite path (a zero float mask sends it there), with each one's memory peak.
fn long_attention(rows: &mut Vec<(String, &'static str, f64, String)>) {
    use kiln::nn::functional as F;
    let (b, h, t, e) = (1, 4, 2048, 32);
    kiln::manual_seed(0);
    let qkv: Vec<Tensor> =
        (0..3).map(|_| Tensor::randn([b, h, t, e]).requires_grad_(true)).collect();
    for x in &qkv {
        x.realize();
    }
    let keep: Vec<bool> = (0..t * t).map(|i| i % t <= i / t).collect();
    let causal = Tensor::where_(&Tensor::from_vec(keep, [t, t]), 0.0, f64::NEG_INFINITY);
    causal.realize();
    for (variant, fused) in [("fused", true), ("composite", false)] {
        let run = || {
            let (q, k, v) = (&qkv[0], &qkv[1], &qkv[2]);
            let y = if fused {
                F::scaled_dot_product_attention(q, k, v, None, true)
            } else {
                F::scaled_dot_product_attention(q, k, v, Some(&causal), false)
            };
            let grads = kiln::grad(&[&y.square().sum()], &[q, k, v], false);
            Tensor::try_realize_all(&grads.iter().collect::<Vec<_>>())
                .expect("the gradients compute");
        };
        let ms = median_ms(3, 1, run);
        let peak = kiln::profile(run).1.peak_memory().peak_bytes as f64 / 1e6;
        rows.push((
            format!("attention {h}x{t}x{e} causal fwd+bwd"),
            variant,
            ms,
            format!("peak memory {peak:.0} MB"),
        ));
    }
}

fn main() {
    let json = std::env::args().any(|a| a == "--json");
    // `--only w7` or `--only w8` runs one model's rows.
    let only = std::env::args().skip_while(|a| a != "--only").nth(1);
    let runs = |w: &str| only.as_deref().is_none_or(|o| o.eq_ignore_ascii_case(w));
    let mut rows: Vec<(String, &str, f64, String)> = Vec::new();
    if runs("w7") {
        w7(&mut rows);
        long_attention(&mut rows);
    }
    if runs("w8") {
        w8(&mut rows);
    }
    for (workload, variant, ms, rate) in &rows {
        if json {
            println!(
                "{{\"workload\":\"{workload}\",\"variant\":\"{variant}\",\"median_ms\":{ms:.4},\"rate\":\"{rate}\"}}"
            );
        } else {
            println!("{workload:<24} {variant:<9} {ms:>10.3} ms  {rate}");
        }
    }
}

/// W8's step (compiled, eager fused and unfused) and the 3×3 convolution over 64 channels.
fn w8(rows: &mut Vec<(String, &str, f64, String)>) {
    kiln::manual_seed(0);
    let xs: Vec<Tensor> = (0..4).map(|_| Tensor::randn([BATCH, 1, 32, 32])).collect();
    let ys: Vec<Tensor> =
        (0..4).map(|_| (Tensor::rand([BATCH]) * 10.0).floor().long().clamp(0.0, 9.0)).collect();
    for t in xs.iter().chain(&ys) {
        t.realize();
    }

    let model = w8_model();
    let opt = RefCell::new(Sgd::new(
        model.parameters(),
        SgdConfig { lr: 0.05, momentum: 0.9, ..Default::default() },
    ));
    let step = |x: &Tensor, y: &Tensor| {
        let mut opt = opt.borrow_mut();
        opt.zero_grad();
        let loss = F::cross_entropy(&model.forward(x), y);
        loss.backward();
        opt.step();
        loss
    };
    let mut i = 0;
    let first = Instant::now();
    let mut compiled = kiln::compile(|(x, y): (&Tensor, &Tensor)| step(x, y));
    let l0 = compiled.call((&xs[0], &ys[0])).item::<f32>();
    let first_ms = first.elapsed().as_secs_f64() * 1e3;
    let ms = median_ms(7, 5, || {
        compiled.call((&xs[i % 4], &ys[i % 4])).realize();
        i += 1;
    });
    let l1 = compiled.call((&xs[0], &ys[0])).item::<f32>();
    assert!(l1 < l0, "the W8 step should learn: {l0} -> {l1}");
    rows.push((
        "W8 CNN step".into(),
        "compiled",
        ms,
        format!("{:.0} images/s (first call {first_ms:.0} ms)", BATCH as f64 / ms * 1e3),
    ));
    drop(compiled);
    for (variant, mode) in
        [("fused", kiln::Execution::Fused), ("unfused", kiln::Execution::Unfused)]
    {
        let ms = kiln::with_execution(mode, || {
            median_ms(7, 5, || {
                step(&xs[i % 4], &ys[i % 4]).realize();
                i += 1;
            })
        });
        rows.push((
            "W8 CNN step".into(),
            variant,
            ms,
            format!("{:.0} images/s", BATCH as f64 / ms * 1e3),
        ));
    }

    // conv2d 3x3, 64 -> 64 channels, 32x32, batch 64 (the yardstick).
    let x = Tensor::randn([BATCH, 64, 32, 32]).requires_grad_(true);
    let conv = Conv2d::new(64, 64, [3, 3], Conv2dOptions::default().padding([1, 1]));
    x.realize();
    let macs = (BATCH * 64 * 32 * 32 * 64 * 9) as f64;
    let ms = median_ms(5, 2, || {
        kiln::no_grad(|| conv.forward(&x)).realize();
    });
    rows.push((
        "conv2d 3x3 64ch 32x32".into(),
        "forward",
        ms,
        format!("{:.1} GFLOP/s", 2.0 * macs / ms / 1e6),
    ));
    let ms = median_ms(5, 2, || {
        conv.zero_grad();
        x.zero_grad();
        conv.forward(&x).sum().backward();
        let grads = [x.grad().expect("x.grad"), conv.weight.grad().expect("weight.grad")];
        Tensor::try_realize_all(&[&grads[0], &grads[1]]).expect("the gradients compute");
    });
    rows.push((
        "conv2d 3x3 64ch 32x32".into(),
        "fwd+bwd",
        ms,
        format!("{:.1} GFLOP/s", 6.0 * macs / ms / 1e6),
    ));
}
