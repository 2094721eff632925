//! The cost of recording ops: what a user pays per op before anything is computed.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use kiln::prelude::*;

fn record(c: &mut Criterion) {
    let x = Tensor::randn([64, 64]);
    let y = Tensor::randn([64, 64]);
    x.realize();
    y.realize();
    let mut g = c.benchmark_group("record");
    // One binary op on two tensors of one shape and dtype: shape inference, a node, a handle.
    g.bench_function("add", |b| b.iter(|| black_box(&x + &y)));
    // A unary op.
    g.bench_function("exp", |b| b.iter(|| black_box(x.exp())));
    // A binary op with a scalar literal: a fill node of the result's shape as well.
    g.bench_function("mul_scalar", |b| b.iter(|| black_box(&x * 2.0)));
    // A broadcasting op with type promotion (a cast, a view and the op).
    let row = Tensor::randn([64]).to_dtype(DType::F16);
    row.realize();
    g.bench_function("add_broadcast_promote", |b| b.iter(|| black_box(&x + &row)));
    // A view: no node, only a new handle.
    g.bench_function("transpose", |b| b.iter(|| black_box(x.t())));
    // A 10-op chain, recorded and dropped, per op.
    g.bench_function("chain_of_10", |b| {
        b.iter(|| {
            let mut t = x.clone();
            for _ in 0..10 {
                t = t.exp();
            }
            black_box(t)
        });
    });
    g.finish();
}

fn realize(c: &mut Criterion) {
    let mut g = c.benchmark_group("realize");
    let x = Tensor::randn([16]);
    x.realize();
    // Capture, graph building and the reference executor on a tiny 20-op graph.
    g.bench_function("20_ops_16_elements", |b| {
        b.iter(|| {
            let mut t = x.clone();
            for _ in 0..20 {
                t = &t + 1.0;
            }
            black_box(t.realize().clone())
        });
    });
    g.finish();
}

criterion_group!(benches, record, realize);
criterion_main!(benches);
