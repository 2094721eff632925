//! kiln on an NVIDIA GPU: the benchmark workloads on the device, against the device's own
//! copy bandwidth measured in the same run, plus NVRTC compile and cached-launch latency.
//!
//! Also cross-entropy (with and without its gradient) and two training steps on the device,
//! eager and compiled: W4 (the MLP of `common/mlp_step.rs`) and W7 (the GPT of
//! `common/gpt.rs`, also under `autocast(BF16)`).
//!
//! `cargo run --release --example gpu` prints a table (with `KILN_GPU_PROFILE=1`, also the
//! profiles of an eager W4 and W7 step on stderr); `-- --json` prints one JSON object per
//! line as each row is measured (`workload`, `variant`, `median_ms`, and `gbps` or
//! `gflops`); `-- --quick` runs every workload at a small size, to check that the whole
//! benchmark runs (CI does so on the emulated device); `-- --only w3,ce` runs some sections
//! (`w1` with the whole-tensor reductions, `w3` the softmax rows, `ce`, `w5`, `compile`,
//! `train`). Without a CUDA device it says why and
//! exits successfully.

use std::time::Instant;

#[path = "common/gpt.rs"]
mod gpt;
#[path = "common/report.rs"]
mod report;

use std::cell::RefCell;

use kiln::Execution;
use kiln::nn::functional as F;
use kiln::nn::{Linear, Module, Parameters, ReLU, Sequential};
use kiln::optim::{AdamConfig, AdamW, Optimizer, Sgd, SgdConfig};
use kiln::prelude::*;
use report::Row;

/// Workload sizes: the benchmark's, or small ones for `--quick`.
struct Sizes {
    reps: usize,
    /// Elements of the elementwise chains and whole-tensor reductions.
    n: usize,
    /// Sides of the softmax matrices.
    softmax: [usize; 2],
    /// Side of the square matrix products.
    matmul: usize,
    /// Training steps per timed block (the loss is read once per block).
    steps: usize,
    /// W4's batch.
    mlp_batch: usize,
    /// W7's model (`GptConfig::w7`) and batch.
    gpt: gpt::GptConfig,
    gpt_batch: usize,
}

const FULL: Sizes = Sizes {
    reps: 9,
    n: 1 << 26,
    softmax: [4096, 16384],
    matmul: 4096,
    steps: 20,
    mlp_batch: 128,
    gpt: gpt::GptConfig::w7(96),
    gpt_batch: 32,
};
const QUICK: Sizes = Sizes {
    reps: 1,
    n: 1 << 16,
    softmax: [64, 300],
    matmul: 96,
    steps: 2,
    mlp_batch: 8,
    gpt: gpt::GptConfig { vocab: 96, layers: 1, d_model: 16, heads: 2, context: 8 },
    gpt_batch: 2,
};

/// The rows measured so far; with `--json` each is printed as soon as it is measured, so a
/// run cut short still reports what it got.
struct Rows {
    rows: Vec<Row>,
    json: Option<String>,
}

impl Rows {
    fn push(&mut self, row: Row) {
        if let Some(extra) = &self.json {
            report::print(std::slice::from_ref(&row), true, extra);
        }
        self.rows.push(row);
    }
}

/// Median wall time of `f` in ms over `reps` runs, each ended by waiting for the device.
fn median_ms(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut run = || {
        let t = Instant::now();
        f();
        kiln::cuda::synchronize(0).expect("the device's work failed");
        t.elapsed().as_secs_f64() * 1e3
    };
    run(); // compile kernels, fill the allocator's cache
    let mut times: Vec<f64> = (0..reps).map(|_| run()).collect();
    times.sort_by(f64::total_cmp);
    times[reps / 2]
}

fn main() -> kiln::Result<()> {
    let json = std::env::args().any(|a| a == "--json");
    let size = if std::env::args().any(|a| a == "--quick") { QUICK } else { FULL };
    let reps = size.reps;
    // `--only w1,w3,ce,w5,compile,train`: some sections (the copy ceiling always runs).
    let args: Vec<String> = std::env::args().collect();
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .map(|list| list.split(',').map(str::to_string).collect());
    let runs = |section: &str| only.as_ref().is_none_or(|o| o.iter().any(|s| s == section));
    if !kiln::cuda::is_available() {
        let why = kiln::cuda::unavailable_reason().unwrap_or("kiln::cuda::device_count() is 0");
        // A run that was meant to measure a device (CI's on the emulated one) must not pass.
        if std::env::var("KILN_REQUIRE_GPU").is_ok_and(|v| v == "1") {
            eprintln!("KILN_REQUIRE_GPU=1 but there is no CUDA device: {why}");
            std::process::exit(1);
        }
        println!("no CUDA device: nothing to measure ({why})");
        return Ok(());
    }
    let gpu = Device::Cuda(0);
    let name = kiln::cuda::describe(0)?;
    let mut rows = Rows { rows: Vec::new(), json: json.then(|| format!("\"device\":\"{name}\"")) };
    let gb = |bytes: f64, ms: f64| bytes / (ms * 1e-3) / 1e9;

    let copy_bytes = 4 * size.n;
    let copy = kiln::cuda::copy_bandwidth(0, copy_bytes, reps)?;
    rows.push(Row {
        workload: "copy".into(),
        variant: "ceiling",
        ms: 2.0 * copy_bytes as f64 / copy / 1e6,
        gbps: Some(copy),
        gflops: None,
    });

    if runs("w1") {
        // W1 and W1b over 64M f32 (256 MiB in, 256 MiB out).
        let n = size.n;
        kiln::manual_seed(0);
        let x = Tensor::randn([n]).to(gpu);
        let w1 = |x: &Tensor| {
            ((x * 1.5 + 0.5).tanh() * x.sigmoid() + (x - 0.2).relu()) / (x.square() + 1.0)
        };
        let w1b = |x: &Tensor| ((x * 1.5 + 0.5) * x + (x - 0.2).relu()) / (x.square() + 1.0);
        for (workload, f) in [("W1", &w1 as &dyn Fn(&Tensor) -> Tensor), ("W1b", &w1b)] {
            for (variant, mode) in [("fused", Execution::Fused), ("unfused", Execution::Unfused)] {
                let ms = median_ms(reps, || {
                    kiln::with_execution(mode, || f(&x).realize().clone());
                });
                let bytes = 8.0 * n as f64;
                rows.push(Row {
                    workload: workload.into(),
                    variant,
                    ms,
                    gbps: Some(gb(bytes, ms)),
                    gflops: None,
                });
            }
        }

        // Whole-tensor reductions (split across blocks) and scans over the same vector.
        type Op = fn(&Tensor) -> Tensor;
        let whole: [(&str, Op); 4] = [
            ("sum", |x| x.sum()),
            ("mean of squares", |x| x.square().mean()),
            ("argmax", |x| x.argmax(0, false)),
            ("cumsum", |x| x.cumsum(0)),
        ];
        for (workload, f) in whole {
            let ms = median_ms(reps, || {
                f(&x).realize();
            });
            let written = if workload == "cumsum" { 4.0 * n as f64 } else { 0.0 };
            rows.push(Row {
                workload: format!("{workload}, {n} f32"),
                variant: "fused",
                ms,
                gbps: Some(gb(4.0 * n as f64 + written, ms)),
                gflops: None,
            });
        }
        drop(x);
    }

    if runs("w3") {
        // W3: row softmax, 4096² and 16384².
        for side in size.softmax {
            let a = Tensor::randn([side, side]).to(gpu);
            for (variant, mode) in [("fused", Execution::Fused), ("unfused", Execution::Unfused)] {
                let ms = median_ms(reps, || {
                    kiln::with_execution(mode, || a.softmax(1).realize().clone());
                });
                let bytes = 8.0 * (side * side) as f64;
                rows.push(Row {
                    workload: format!("W3 {side}²"),
                    variant,
                    ms,
                    gbps: Some(gb(bytes, ms)),
                    gflops: None,
                });
            }
        }

        // Log-softmax in f32, softmax in bf16 (half the bytes: GB/s counts them as stored).
        for side in size.softmax {
            let a = Tensor::randn([side, side]).to(gpu);
            let h = a.to_dtype(DType::BF16);
            Tensor::try_realize_all(&[&a, &h])?;
            let f32_bytes = 8.0 * (side * side) as f64;
            for (workload, x, bytes, log) in [
                (format!("W3 log-softmax {side}²"), &a, f32_bytes, true),
                (format!("W3 softmax bf16 {side}²"), &h, f32_bytes / 2.0, false),
            ] {
                let ms = median_ms(reps, || {
                    if log { x.log_softmax(1) } else { x.softmax(1) }.realize();
                });
                rows.push(Row {
                    workload,
                    variant: "fused",
                    ms,
                    gbps: Some(gb(bytes, ms)),
                    gflops: None,
                });
            }
        }
    }

    if runs("ce") {
        // W3 cross-entropy (log-softmax and NLL with integer labels), then with its gradient.
        // GB/s counts one read of the logits (and for the gradient one write).
        for side in size.softmax {
            let a = Tensor::randn([side, side]).to(gpu);
            let labels = Tensor::randint(0, side as i64, [side]).to(gpu);
            Tensor::try_realize_all(&[&a, &labels])?;
            let logits = a.detach().requires_grad_(true);
            let ms = median_ms(reps, || {
                F::cross_entropy(&a, &labels).realize();
            });
            let bytes = 4.0 * (side * side) as f64;
            rows.push(Row {
                workload: format!("W3 cross-entropy {side}²"),
                variant: "fused",
                ms,
                gbps: Some(gb(bytes, ms)),
                gflops: None,
            });
            let ms = median_ms(reps, || {
                F::cross_entropy(&logits, &labels).backward();
                logits.grad().expect("a gradient").realize();
                logits.zero_grad();
            });
            rows.push(Row {
                workload: format!("W3 cross-entropy + gradient {side}²"),
                variant: "fused",
                ms,
                gbps: Some(gb(2.0 * bytes, ms)),
                gflops: None,
            });
        }
    }

    if runs("w5") {
        // W5: matmul through cuBLAS, f32, f16 and bf16.
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let side = size.matmul;
            let a = Tensor::randn([side, side]).to_dtype(dtype).to(gpu);
            let b = Tensor::randn([side, side]).to_dtype(dtype).to(gpu);
            a.realize();
            b.realize();
            let ms = median_ms(reps, || {
                a.matmul(&b).realize();
            });
            let flops = 2.0 * (side * side * side) as f64;
            rows.push(Row {
                workload: format!("W5 {side}³ {dtype}"),
                variant: "fused",
                ms,
                gbps: None,
                gflops: Some(flops / (ms * 1e-3) / 1e9),
            });
        }
    }

    if runs("compile") {
        // Compile latency: a kernel structure never seen (a fresh constant count of ops), then
        // the same structure again (a cache hit: planning and launch only).
        let small = Tensor::randn([1000]).to(gpu);
        small.realize();
        let chain =
            |x: &Tensor| (0..9).fold(x.clone(), |acc, i| (acc * 1.01 + f64::from(i)).tanh());
        let (_, first) = kiln::profile(|| chain(&small).realize().clone());
        rows.push(Row {
            workload: "NVRTC compile, 10-op kernel".into(),
            variant: "first call",
            ms: first.compile_time().as_secs_f64() * 1e3,
            gbps: None,
            gflops: None,
        });
        let ms = median_ms(reps, || {
            chain(&small).realize();
        });
        rows.push(Row {
            workload: "10-op kernel, 1000 elements".into(),
            variant: "cached call",
            ms,
            gbps: None,
            gflops: None,
        });
    }

    if runs("train") {
        training_steps(&size, gpu, &mut rows)?;
    }

    if json {
        return Ok(());
    }
    let rows = rows.rows;
    println!("kiln on {name}\n");
    report::print(&rows, false, "");
    let w1 = rows.iter().find(|r| r.workload == "W1" && r.variant == "fused");
    if let Some(w1) = w1.and_then(|r| r.gbps) {
        println!("\nW1 fused reaches {:.0}% of the device's copy bandwidth", 100.0 * w1 / copy);
    }
    Ok(())
}

/// Milliseconds per step of `step`, timed in blocks of `size.steps` steps that end by
/// reading the last loss (as a training loop that logs would).
fn per_step_ms(size: &Sizes, mut step: impl FnMut() -> Tensor) -> (f64, f64) {
    let steps = size.steps;
    // The host's share: time spent inside the calls (a call returns once its work is queued),
    // over the timed blocks (the first, which compiles, is left out).
    let (mut host, mut calls, mut blocks) = (0.0, 0usize, 0usize);
    let ms = median_ms(size.reps, || {
        let mut loss = None;
        for _ in 0..steps {
            let t = Instant::now();
            loss = Some(step());
            if blocks > 0 {
                host += t.elapsed().as_secs_f64() * 1e3;
                calls += 1;
            }
        }
        blocks += 1;
        loss.expect("at least one step").item::<f32>();
    }) / steps as f64;
    (ms, host / calls.max(1) as f64)
}

/// W4 and W7 training steps on the device: eager (lazy, fused) and `compile()`d.
fn training_steps(size: &Sizes, gpu: Device, rows: &mut Rows) -> kiln::Result<()> {
    // W4: a 784-256-10 ReLU MLP, SGD, cross-entropy, batches of 128 (cycling 8; smaller with
    // `--quick`).
    kiln::manual_seed(0);
    let mut mlp =
        Sequential::new().with(Linear::new(784, 256)).with(ReLU).with(Linear::new(256, 10));
    mlp.to(gpu)?;
    let sgd = RefCell::new(Sgd::new(mlp.parameters(), SgdConfig { lr: 0.1, ..Default::default() }));
    let b = size.mlp_batch;
    let xs4: Vec<Tensor> = (0..8).map(|_| Tensor::randn([b, 784]).to(gpu)).collect();
    let ys4: Vec<Tensor> = (0..8).map(|_| Tensor::randint(0, 10, [b]).to(gpu)).collect();
    Tensor::try_realize_all(&xs4.iter().chain(&ys4).collect::<Vec<_>>())?;
    let w4 = |x: &Tensor, y: &Tensor| {
        let mut opt = sgd.borrow_mut();
        opt.zero_grad();
        let loss = F::cross_entropy(&mlp.forward(x), y);
        loss.backward();
        opt.step();
        loss
    };
    let mut i = 0;
    let (ms, _) = per_step_ms(size, || {
        i += 1;
        w4(&xs4[i % 8], &ys4[i % 8])
    });
    rows.push(step_row("W4 MLP step", "eager", ms, 1e3 / ms, "steps/s"));
    let mut compiled = kiln::compile(|(x, y): (&Tensor, &Tensor)| w4(x, y));
    let (ms, host) = per_step_ms(size, || {
        i += 1;
        compiled.call((&xs4[i % 8], &ys4[i % 8]))
    });
    rows.push(step_row("W4 MLP step", "compiled", ms, 1e3 / ms, "steps/s"));
    eprintln!("W4 compiled: host {host:.3} ms of {ms:.3} ms per step; {}", compiled.stats());
    drop(compiled);

    // W7: the GPT of benches/peers/models.py w7 (batch 32, context 64; a small one with
    // `--quick`), AdamW.
    kiln::manual_seed(0);
    let mut model = gpt::Gpt::new(size.gpt);
    model.to(gpu)?;
    let t = model.config.context;
    let (b, v) = (size.gpt_batch, size.gpt.vocab as i64);
    let xs: Vec<Tensor> = (0..4).map(|_| Tensor::randint(0, v, [b, t]).to(gpu)).collect();
    let ys: Vec<Tensor> = (0..4).map(|_| Tensor::randint(0, v, [b, t]).to(gpu)).collect();
    Tensor::try_realize_all(&xs.iter().chain(&ys).collect::<Vec<_>>())?;
    let config = AdamConfig { lr: 3e-4, weight_decay: 0.1, ..AdamConfig::adamw() };
    let adamw = RefCell::new(AdamW::new(model.parameters(), config));
    let w7 = |x: &Tensor, y: &Tensor| model.train_step(&mut *adamw.borrow_mut(), x, y);
    let tokens = (b * t) as f64;
    let (ms, _) = per_step_ms(size, || {
        i += 1;
        w7(&xs[i % 4], &ys[i % 4])
    });
    rows.push(step_row("W7 GPT step", "eager", ms, tokens / ms * 1e3, "tokens/s"));
    let first = Instant::now();
    let mut compiled = kiln::compile(|(x, y): (&Tensor, &Tensor)| w7(x, y));
    compiled.call((&xs[0], &ys[0])).item::<f32>();
    let first_ms = first.elapsed().as_secs_f64() * 1e3;
    rows.push(step_row("W7 GPT step, first compiled call", "compiled", first_ms, 0.0, ""));
    let (ms, host) = per_step_ms(size, || {
        i += 1;
        compiled.call((&xs[i % 4], &ys[i % 4]))
    });
    rows.push(step_row("W7 GPT step", "compiled", ms, tokens / ms * 1e3, "tokens/s"));
    eprintln!("W7 compiled: host {host:.3} ms of {ms:.3} ms per step; {}", compiled.stats());
    drop(compiled);
    let mut autocast =
        kiln::compile(|(x, y): (&Tensor, &Tensor)| kiln::autocast(DType::BF16, || w7(x, y)));
    let (ms, host) = per_step_ms(size, || {
        i += 1;
        autocast.call((&xs[i % 4], &ys[i % 4]))
    });
    rows.push(step_row("W7 GPT step", "compiled bf16", ms, tokens / ms * 1e3, "tokens/s"));
    eprintln!("W7 compiled bf16: host {host:.3} ms of {ms:.3} ms per step; {}", autocast.stats());
    drop(autocast);
    if std::env::var_os("KILN_GPU_PROFILE").is_some() {
        // Where a step's time goes: the third of three profiled eager steps of each model.
        let steps: [(&str, &dyn Fn() -> Tensor); 3] = [
            ("W4", &|| w4(&xs4[0], &ys4[0])),
            ("W7", &|| w7(&xs[0], &ys[0])),
            ("W7 bf16 autocast", &|| kiln::autocast(DType::BF16, || w7(&xs[0], &ys[0]))),
        ];
        for (name, step) in steps {
            let mut profile = None;
            for _ in 0..3 {
                profile = Some(kiln::profile(|| step().realize().clone()).1);
            }
            eprintln!("{name} step on the GPU:\n{}", profile.expect("three profiled steps"));
        }
    }
    Ok(())
}

/// A training-step row; the rate goes into the workload's name.
fn step_row(workload: &str, variant: &'static str, ms: f64, rate: f64, unit: &str) -> Row {
    let workload =
        if unit.is_empty() { workload.into() } else { format!("{workload} ({rate:.0} {unit})") };
    Row { workload, variant, ms, gbps: None, gflops: None }
}
