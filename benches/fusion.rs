//! Fused vs unfused execution, and the cost of compiling a kernel.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use kiln::prelude::*;

fn chain(x: &Tensor) -> Tensor {
    ((x * 1.5 + 0.5) * x + (x - 0.2).relu()) / (x.square() + 1.0)
}

fn elementwise(c: &mut Criterion) {
    let x = Tensor::randn([1 << 20]);
    x.realize();
    let mut g = c.benchmark_group("w1b_1m");
    g.bench_function("fused", |b| b.iter(|| black_box(chain(&x).realize().clone())));
    g.bench_function("unfused", |b| {
        b.iter(|| {
            kiln::with_execution(kiln::Execution::Unfused, || {
                black_box(chain(&x).realize().clone())
            })
        });
    });
    g.finish();
}

fn softmax(c: &mut Criterion) {
    let x = Tensor::randn([1024, 1024]);
    x.realize();
    let mut g = c.benchmark_group("softmax_1024x1024");
    g.bench_function("fused", |b| b.iter(|| black_box(x.softmax(1).realize().clone())));
    g.bench_function("unfused", |b| {
        b.iter(|| {
            kiln::with_execution(kiln::Execution::Unfused, || {
                black_box(x.softmax(1).realize().clone())
            })
        });
    });
    g.finish();
}

/// A 10-op kernel on a shape never seen before: the realization compiles it. Each
/// iteration uses a new shape, so every measured call compiles.
fn compile(c: &mut Criterion) {
    let mut n = 1usize;
    c.bench_function("compile_10_op_kernel", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                n += 1;
                let x = Tensor::ones([n]);
                x.realize();
                let start = Instant::now();
                let y = ((((&x * 1.5 + 0.5).relu() - 0.25) * 2.0 + 1.0).sqrt() / 3.0).abs();
                black_box(y.realize());
                total += start.elapsed();
            }
            total
        });
    });
}

criterion_group!(benches, elementwise, softmax, compile);
criterion_main!(benches);
