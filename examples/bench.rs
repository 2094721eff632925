//! kiln's benchmark workloads: fused vs unfused (one kernel per op) vs the reference executor
//! vs a plain Rust loop, against the memory bandwidth measured in the same run.
//!
//! `cargo run --release --example bench` prints a table; `-- --json` prints one JSON object
//! per line with `workload`, `variant`, `median_ms` and `gbps` or `gflops`.

use std::hint::black_box;
use std::time::Instant;

#[path = "common/mlp_step.rs"]
mod mlp_step;
#[path = "common/report.rs"]
mod report;

use kiln::Execution;
use kiln::prelude::*;
use rayon::prelude::*;
use report::Row;

const N: usize = 1 << 24; // 16M f32 = 64 MiB
const REPS: usize = 7;

/// The executions compared: kiln's default, and one generated kernel per op (what an eager
/// library does, with kiln's own kernels). The reference executor (one plain f64 loop per
/// op, the correctness oracle) is measured last, apart: its large f64 temporaries would
/// disturb the allocator's state for the measurements after it.
const MODES: [(&str, Execution); 2] =
    [("fused", Execution::Fused), ("unfused", Execution::Unfused)];

fn median_ms(mut f: impl FnMut()) -> f64 {
    f(); // warm up: compile kernels, fault in pages
    let mut times: Vec<f64> = (0..REPS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[REPS / 2]
}

fn main() {
    let json = std::env::args().any(|a| a == "--json");
    let mut rows: Vec<Row> = Vec::new();
    let gb = |bytes: f64, ms: f64| bytes / (ms * 1e-3) / 1e9;

    // The ceiling: a copy and a triad over 64 MiB, on all cores.
    let a = vec![1.0f32; N];
    let mut b = vec![2.0f32; N];
    let c = vec![3.0f32; N];
    let chunk = 1 << 16;
    let ms = median_ms(|| {
        b.par_chunks_mut(chunk).zip(a.par_chunks(chunk)).for_each(|(d, s)| d.copy_from_slice(s));
    });
    rows.push(Row {
        workload: "copy".into(),
        variant: "ceiling",
        ms,
        gbps: Some(gb(8.0 * N as f64, ms)),
        gflops: None,
    });
    let ms = median_ms(|| {
        b.par_chunks_mut(chunk).zip(a.par_chunks(chunk).zip(c.par_chunks(chunk))).for_each(
            |(d, (x, y))| {
                for i in 0..d.len() {
                    d[i] = x[i] + 3.0 * y[i];
                }
            },
        );
    });
    rows.push(Row {
        workload: "triad".into(),
        variant: "ceiling",
        ms,
        gbps: Some(gb(12.0 * N as f64, ms)),
        gflops: None,
    });
    drop((a, b, c));

    kiln::manual_seed(0);
    let x = Tensor::randn([N]);
    x.realize();
    let xs: Vec<f32> = x.to_vec();
    let w1 =
        |x: &Tensor| ((x * 1.5 + 0.5).tanh() * x.sigmoid() + (x - 0.2).relu()) / (x.square() + 1.0);
    let w1b = |x: &Tensor| ((x * 1.5 + 0.5) * x + (x - 0.2).relu()) / (x.square() + 1.0);
    for (name, f, plain) in [
        (
            "W1",
            &w1 as &dyn Fn(&Tensor) -> Tensor,
            (|v: f32| {
                ((v * 1.5 + 0.5).tanh() * (1.0 / (1.0 + (-v).exp())) + (v - 0.2).max(0.0))
                    / (1.0 + v * v)
            }) as fn(f32) -> f32,
        ),
        ("W1b", &w1b, |v: f32| ((v * 1.5 + 0.5) * v + (v - 0.2).max(0.0)) / (1.0 + v * v)),
    ] {
        for (variant, mode) in MODES {
            let ms = median_ms(|| {
                kiln::with_execution(mode, || {
                    black_box(f(&x).realize());
                });
            });
            rows.push(Row {
                workload: name.into(),
                variant,
                ms,
                gbps: Some(gb(8.0 * N as f64, ms)),
                gflops: None,
            });
        }
        let mut out = vec![0.0f32; N];
        let ms = median_ms(|| {
            for (o, &v) in out.iter_mut().zip(&xs) {
                *o = plain(v);
            }
            black_box(&out);
        });
        rows.push(Row {
            workload: name.into(),
            variant: "plain_rust",
            ms,
            gbps: Some(gb(8.0 * N as f64, ms)),
            gflops: None,
        });
    }
    drop((x, xs));

    // W2: relu(A * col + row) - A / 2 on 4096 x 4096.
    let a = Tensor::randn([4096, 4096]);
    let col = Tensor::randn([4096, 1]);
    let row = Tensor::randn([4096]);
    Tensor::try_realize_all(&[&a, &col, &row]).expect("inputs fit in memory");
    // A function, as a model's code would be: its intermediates are gone when the result is
    // realized. (Written as one statement ending in `.realize()`, Rust keeps the temporaries
    // alive across the realization, and kiln stores them as results a user still holds.)
    let w2 = |a: &Tensor, col: &Tensor, row: &Tensor| (a * col + row).relu() - a / 2.0;
    for (variant, mode) in MODES {
        let ms = median_ms(|| {
            kiln::with_execution(mode, || {
                black_box(w2(&a, &col, &row).realize());
            });
        });
        rows.push(Row {
            workload: "W2".into(),
            variant,
            ms,
            gbps: Some(gb(8.0 * (N as f64), ms)),
            gflops: None,
        });
    }
    // W3: row softmax of 4096 x 4096.
    for (variant, mode) in MODES {
        let ms = median_ms(|| {
            kiln::with_execution(mode, || {
                black_box(a.softmax(1).realize());
            });
        });
        rows.push(Row {
            workload: "W3".into(),
            variant,
            ms,
            gbps: Some(gb(8.0 * (N as f64), ms)),
            gflops: None,
        });
    }
    // W3 cross-entropy (log-softmax and NLL with integer labels, as the peers measure it),
    // then with its gradient; and a layer norm's forward and backward. GB/s counts one read
    // of the logits (and for the gradients one write).
    let labels = Tensor::randint(0, 4096, [4096]);
    let (w, b) = (Tensor::randn([4096]), Tensor::randn([4096]));
    Tensor::try_realize_all(&[&labels, &w, &b]).expect("inputs fit in memory");
    let logits = a.detach().requires_grad_(true);
    let ce = || {
        black_box(kiln::nn::functional::cross_entropy(&a, &labels).realize());
    };
    let ce_grad = || {
        kiln::nn::functional::cross_entropy(&logits, &labels).backward();
        black_box(logits.grad().expect("a gradient").realize());
        logits.zero_grad();
    };
    let ln_grad = || {
        let y = kiln::nn::functional::layer_norm(&logits, &[4096], Some(&w), Some(&b), 1e-5);
        (&y * &a).sum().backward();
        black_box(logits.grad().expect("a gradient").realize());
        logits.zero_grad();
    };
    for (name, f, bytes) in [
        ("W3 cross-entropy", &ce as &dyn Fn(), 4.0),
        ("W3 cross-entropy + gradient", &ce_grad, 8.0),
        ("layer norm + gradient", &ln_grad, 8.0),
    ] {
        for (variant, mode) in MODES {
            let ms = median_ms(|| kiln::with_execution(mode, f));
            rows.push(Row {
                workload: name.into(),
                variant,
                ms,
                gbps: Some(gb(bytes * (N as f64), ms)),
                gflops: None,
            });
        }
    }
    drop((a, col, row, logits));

    // W5: 1024^3 matmul, kiln against calling gemm directly.
    let m = 1024;
    let p = Tensor::randn([m, m]);
    let q = Tensor::randn([m, m]);
    Tensor::try_realize_all(&[&p, &q]).expect("inputs fit in memory");
    let flops = 2.0 * (m as f64).powi(3);
    let ms = median_ms(|| {
        black_box(p.matmul(&q).realize());
    });
    rows.push(Row {
        workload: "W5".into(),
        variant: "fused",
        ms,
        gbps: None,
        gflops: Some(flops / (ms * 1e-3) / 1e9),
    });
    // The same product in bf16 (f32 sums, one rounding), on the CPU's bf16 dot products where
    // it has them and widened to f32 for gemm.
    let (pb, qb) = (p.bfloat16(), q.bfloat16());
    Tensor::try_realize_all(&[&pb, &qb]).expect("inputs fit in memory");
    let dot = kiln::debug::bf16_dot_products();
    for (variant, allow) in [("bf16_dot", true), ("bf16_widened", false)] {
        if allow && !dot {
            continue;
        }
        let was = kiln::debug::allow_bf16_dot_products(allow);
        let ms = median_ms(|| {
            black_box(pb.matmul(&qb).realize());
        });
        kiln::debug::allow_bf16_dot_products(was);
        rows.push(Row {
            workload: "W5".into(),
            variant,
            ms,
            gbps: None,
            gflops: Some(flops / (ms * 1e-3) / 1e9),
        });
    }
    let (pv, qv): (Vec<f32>, Vec<f32>) = (p.to_vec(), q.to_vec());
    let mut out = vec![0.0f32; m * m];
    let ms = median_ms(|| {
        // SAFETY: the three buffers are m x m row-major matrices.
        unsafe {
            gemm::gemm(
                m,
                m,
                m,
                out.as_mut_ptr(),
                1,
                m as isize,
                false,
                pv.as_ptr(),
                1,
                m as isize,
                qv.as_ptr(),
                1,
                m as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(rayon::current_num_threads()),
            );
        }
        black_box(&out);
    });
    rows.push(Row {
        workload: "W5".into(),
        variant: "plain_rust",
        ms,
        gbps: None,
        gflops: Some(flops / (ms * 1e-3) / 1e9),
    });

    training_steps(&mut rows);

    // The reference executor, three runs each.
    let reference_ms = |f: &dyn Fn()| {
        let mut t: Vec<f64> = (0..3)
            .map(|_| {
                let start = Instant::now();
                kiln::with_execution(Execution::Reference, f);
                start.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        t.sort_by(f64::total_cmp);
        t[1]
    };
    let x = Tensor::randn([N]);
    x.realize();
    for (name, f) in [("W1", &w1 as &dyn Fn(&Tensor) -> Tensor), ("W1b", &w1b)] {
        let ms = reference_ms(&|| {
            black_box(f(&x).realize());
        });
        rows.push(Row {
            workload: name.into(),
            variant: "reference",
            ms,
            gbps: Some(gb(8.0 * N as f64, ms)),
            gflops: None,
        });
    }
    drop(x);
    let a = Tensor::randn([4096, 4096]);
    let col = Tensor::randn([4096, 1]);
    let row = Tensor::randn([4096]);
    Tensor::try_realize_all(&[&a, &col, &row]).expect("inputs fit in memory");
    let ms = reference_ms(&|| {
        black_box(w2(&a, &col, &row).realize());
    });
    rows.push(Row {
        workload: "W2".into(),
        variant: "reference",
        ms,
        gbps: Some(gb(8.0 * N as f64, ms)),
        gflops: None,
    });
    let ms = reference_ms(&|| {
        black_box(a.softmax(1).realize());
    });
    rows.push(Row {
        workload: "W3".into(),
        variant: "reference",
        ms,
        gbps: Some(gb(8.0 * N as f64, ms)),
        gflops: None,
    });

    report::print(&rows, json, "");
}

/// W4: one SGD step of the MLP of `common/mlp_step.rs`, cycling 8 fixed batches as `benches/peers/bench.py w4` does, eager-lazy and `compile()`d, in
/// blocks of 50 steps (the loss is read at the end of a block); W4s: the scalar example
/// `y = x² + 3x + 1`, its gradient at 2 read with `item()`, per iteration.
fn training_steps(rows: &mut Vec<Row>) {
    const BLOCK: usize = 50;
    kiln::manual_seed(11);
    let xs: Vec<Tensor> = (0..8).map(|_| Tensor::randn([128, 784])).collect();
    let ys: Vec<Tensor> = (0..8).map(|_| Tensor::randint(0, 10, [128])).collect();
    Tensor::try_realize_all(&xs.iter().chain(&ys).collect::<Vec<_>>()).expect("inputs");
    let flops = 3.0 * 2.0 * 128.0 * (784.0 * 256.0 + 256.0 * 10.0);
    for variant in ["eager", "compiled"] {
        let (model, mut opt) = mlp_step::model();
        let mut step = |(x, y): (&Tensor, &Tensor)| mlp_step::step(&model, &mut opt, x, y);
        let block = |call: &mut dyn FnMut(usize) -> Tensor| {
            let loss = (0..BLOCK).map(|i| call(i % 8)).last().expect("a step");
            black_box(loss.item::<f32>());
        };
        let ms = if variant == "compiled" {
            let mut compiled = kiln::compile(&mut step);
            median_ms(|| block(&mut |i| compiled.call((&xs[i], &ys[i]))))
        } else {
            median_ms(|| block(&mut |i| step((&xs[i], &ys[i]))))
        } / BLOCK as f64;
        rows.push(Row {
            workload: format!("W4 MLP step ({:.0} steps/s)", 1e3 / ms),
            variant,
            ms,
            gbps: None,
            gflops: Some(flops / (ms * 1e-3) / 1e9),
        });
    }
    const ITER: usize = 2000;
    let x = Tensor::scalar(2.0f32).requires_grad_(true);
    let scalar = |x: &Tensor| {
        let y = x.square() + x * 3.0 + 1.0;
        kiln::grad(&[&y], &[x], false).remove(0)
    };
    assert_eq!(scalar(&x).item::<f32>(), 7.0);
    let mut compiled = kiln::compile(|x: &Tensor| scalar(x));
    for variant in ["eager", "compiled"] {
        let ms = median_ms(|| {
            for _ in 0..ITER {
                let g = if variant == "compiled" { compiled.call(&x) } else { scalar(&x) };
                black_box(g.item::<f32>());
            }
        }) / ITER as f64;
        rows.push(Row {
            workload: format!("W4s x²+3x+1, grad, item ({:.1} us/iter)", ms * 1e3),
            variant,
            ms,
            gbps: None,
            gflops: None,
        });
    }
}
