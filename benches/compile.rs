//! `compile()` against eager-lazy execution: a small MLP training step, and the per-call
//! overhead of a compiled 10-op plan on tiny tensors.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use kiln::prelude::*;

#[path = "../examples/common/mlp_step.rs"]
mod mlp_step;

fn mlp_step(c: &mut Criterion) {
    kiln::manual_seed(0);
    let x = Tensor::randn([128, 784]);
    let y = Tensor::randint(0, 10, [128]);
    Tensor::try_realize_all(&[&x, &y]).expect("inputs");
    let (model, mut opt) = mlp_step::model();
    let mut step = |(x, y): (&Tensor, &Tensor)| mlp_step::step(&model, &mut opt, x, y);
    let mut g = c.benchmark_group("mlp_784_256_10_sgd_step");
    g.sample_size(30);
    g.bench_function("eager", |b| b.iter(|| black_box(step((&x, &y)))));
    let mut compiled = kiln::compile(&mut step);
    g.bench_function("compiled", |b| b.iter(|| black_box(compiled.call((&x, &y)))));
    g.finish();
}

fn tiny_plan(c: &mut Criterion) {
    let x = Tensor::randn([16]);
    let w = Tensor::randn([16]);
    Tensor::try_realize_all(&[&x, &w]).expect("inputs");
    // Ten ops between tensors: one fused kernel.
    let ten = |x: &Tensor| ((((x + &w).tanh() * &w - x).exp() + x) / &w).relu().sqrt().neg();
    let mut g = c.benchmark_group("ten_op_plan_16_elements");
    g.bench_function("eager_realize", |b| b.iter(|| black_box(ten(&x).realize().clone())));
    let mut f = kiln::compile(|x: &Tensor| ten(x));
    g.bench_function("compiled_call", |b| b.iter(|| black_box(f.call(&x))));
    g.bench_function("record_only", |b| b.iter(|| black_box(ten(&x))));
    g.finish();
}

criterion_group!(benches, mlp_step, tiny_plan);
criterion_main!(benches);
