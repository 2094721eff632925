//! The recorded graph, as DOT: a snapshot makes any change to what is recorded visible.

use kiln::prelude::*;

#[test]
fn recorded_graph_snapshot() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
    let b = Tensor::from_vec(vec![0.5f32, -0.5, 1.0], [3]);
    let y = (x.t().matmul(&x) + 1.0).relu();
    let z = (&x + &b).exp().sum_dim(1, true) / 3.0;
    insta::assert_snapshot!(kiln::debug::graph_dot(&[&y, &z]));
}

#[test]
fn realized_tensors_become_inputs() {
    let x = Tensor::ones([4]);
    let y = (&x + 1.0).realize().clone();
    let dot = kiln::debug::graph_dot(&[&(&y * 2.0)]);
    assert!(!dot.contains("add"), "the realized add is an input now:\n{dot}");
    assert!(dot.contains("input"), "{dot}");
}

/// The generated code of representative kernels, so that a change to the code generator
/// shows up as a reviewed snapshot diff.
/// The code snapshots are of the Cranelift IR kiln generates for an x86-64 host at level v3
/// (AVX2 and FMA: Horner steps are `fma`, long rows of transcendentals go to the batch
/// functions), whatever this host is: the IR is generated for that level, not compiled, so
/// the snapshots read the same on every host (the kernels that run are this host's).
fn at_v3<T>(f: impl FnOnce() -> T) -> T {
    kiln::debug::with_clif_features(kiln::debug::CpuFeatures::X86_64_V3, f)
}

#[test]
fn generated_code_snapshots() {
    let plan_summary = |t: &[&Tensor]| at_v3(|| kiln::debug::plan_summary(t));
    let x = Tensor::from_vec((0..1000).map(|i| i as f32 / 100.0).collect::<Vec<_>>(), [1000]);
    let a = Tensor::ones([8, 16]);
    let col = Tensor::ones([8, 1]);
    let row = Tensor::ones([16]);
    let m = Tensor::ones([4, 16]);
    Tensor::try_realize_all(&[&x, &a, &col, &row, &m]).unwrap();
    // Each program is bound first: temporaries alive during the capture would count as live
    // results and be stored.
    let y = ((&x * 1.5 + 0.5) * &x + (&x - 0.2).relu()) / (x.square() + 1.0);
    let chain = plan_summary(&[&y]);
    assert_eq!(chain.kernels, 1);
    insta::assert_snapshot!(
        "elementwise_chain",
        format!("{}\n\n{}", chain.kernel_text[0], chain.clif[0])
    );
    let z = (&a * &col + &row).relu() - &a / 2.0;
    let broadcast = plan_summary(&[&z]);
    assert_eq!(broadcast.kernels, 1);
    insta::assert_snapshot!(
        "broadcast",
        format!("{}\n\n{}", broadcast.kernel_text[0], broadcast.clif[0])
    );
    let s = m.softmax(1);
    let softmax = plan_summary(&[&s]);
    let sum =
        softmax.kernel_text.iter().position(|k| k.contains("sum over")).expect("a sum kernel");
    insta::assert_snapshot!(
        "softmax_row_sum",
        format!("{}\n\n{}", softmax.kernel_text[sum], softmax.clif[sum])
    );
}

/// Every kernel of a whole training step (a linear layer with GELU, cross-entropy, backward
/// and an SGD update), as `debug::kernels` reports them: which ops each fuses and why it
/// ends, and the Cranelift IR of the vectorized GELU. A change to fusion or to the code
/// generator shows up here as a reviewed diff.
#[test]
fn training_step_kernel_snapshots() {
    use kiln::nn::{Linear, Module, Parameters, functional as F};
    use kiln::optim::{Optimizer, Sgd, SgdConfig};
    let layer = Linear::from_parts(
        Tensor::from_vec((0..24).map(|i| (i as f32 - 12.0) / 10.0).collect::<Vec<_>>(), [4, 6]),
        Some(Tensor::from_vec(vec![0.1f32, -0.2, 0.3, 0.0], [4])),
    )
    .unwrap();
    let params: Vec<Tensor> = layer.parameters().iter().map(|p| p.requires_grad_(true)).collect();
    let mut opt = Sgd::new(params, SgdConfig { lr: 0.1, ..Default::default() });
    let x = Tensor::from_vec((0..48).map(|i| (i as f32).sin()).collect::<Vec<_>>(), [8, 6]);
    let y = Tensor::from_vec(vec![0i64, 1, 2, 3, 0, 1, 2, 3], [8]);
    Tensor::try_realize_all(&[&x, &y]).unwrap();
    let (_, kernels) = at_v3(|| {
        kiln::debug::kernels(|| {
            let loss = F::cross_entropy(&layer.forward(&x).gelu(), &y);
            loss.backward();
            opt.step();
        })
    });
    let listing: Vec<String> =
        kernels.iter().map(|k| format!("{} {}: {} [{}]", k.name, k.shape, k.ops, k.cut)).collect();
    insta::assert_snapshot!("training_step_kernels", listing.join("\n"));
    let gelu = kernels.iter().find(|k| k.ops.contains("erf")).expect("the GELU kernel");
    // The CLIF of an x86-64 v3 host (`at_v3`): without FMA each Horner step is an `fmul`
    // and an `fadd`.
    insta::assert_snapshot!(
        "gelu_kernel",
        format!("{}\n\n{}", gelu.text, gelu.clif.as_deref().expect("compiled"))
    );
    // The same kernels as CUDA C: the elementwise GELU and a row reduction. The loss's
    // one-pass log-sum-exp is a CPU kernel only (a GPU plan expands it).
    insta::assert_snapshot!("gelu_kernel_cuda", gelu.cuda.as_deref().expect("CUDA C"));
    let lse = kernels.iter().find(|k| k.ops.contains("logsumexp[1]")).expect("the loss");
    assert!(lse.cuda.is_none(), "{:?}", lse.cuda);
    let reduction = kernels.iter().find(|k| k.ops.contains("sum[1]")).expect("a row sum");
    insta::assert_snapshot!("row_sum_kernel_cuda", reduction.cuda.as_deref().expect("CUDA C"));
}

/// The planner's stages, Cranelift-filetest style: for a program that exercises every pass
/// (a transposed product, a gather of an expression, a cast of a view that a product reads,
/// an identity, a duplicate), the graph
/// after each named pass, the partition, and the lowered steps with their Kernel IR. A
/// change to any stage shows up here as a reviewed diff of that stage alone.
#[test]
fn planner_stage_snapshots() {
    let x = Tensor::from_vec((0..12).map(|i| i as f32 / 4.0 - 1.0).collect::<Vec<_>>(), [3, 4]);
    let w = Tensor::from_vec((0..20).map(|i| (i as f32).cos()).collect::<Vec<_>>(), [5, 4]);
    let t = Tensor::from_vec(vec![1i64, 0, 4], [3]);
    Tensor::try_realize_all(&[&x, &w, &t]).unwrap();
    // (x wᵀ)ᵀ is used only transposed; log_softmax is gathered; `* 1.0` is an identity;
    // exp(x) is computed twice; xᵀ is cast for a product (the cast moves before the view).
    let logits = w.matmul(&x.t()).t() * 1.0;
    let picked = logits.log_softmax(1).gather(1, &t.unsqueeze(1));
    let twice = x.exp() + x.exp();
    let gram = x.t().double().matmul(&x.double());
    let stages = kiln::debug::passes(&[&picked, &twice, &gram]);
    let names: Vec<&str> = stages.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "precise_log_softmax",
            "expand_logsumexp",
            "transpose_products",
            "gather_first",
            "casts_before_views",
            "simplify",
            "cse",
            "partition.cuts",
            "partition.shared_values",
            "partition.kept_results",
            "partition.into_reductions",
            "partition.casts_into_producers",
            "partition.shared_into_consumers",
            "lower",
            "reuse_buffers"
        ]
    );
    for (name, text) in &stages {
        insta::assert_snapshot!(format!("stage_{name}"), text);
    }
}

/// The plan's buffer reuses, decided by the `reuse_buffers` stage (the executor only
/// obeys): a scatter onto zeros that nothing else reads fills its own output (the zeros'
/// kernel is no step), and an assignment whose base nothing after it reads writes into the
/// base's buffer. (A reshape of a whole stored buffer is an `alias` step from `lower` on:
/// `stage_lower.snap`.)
#[test]
fn buffer_reuse_stage_snapshot() {
    let x = Tensor::from_vec((0..12).map(|i| i as f32).collect::<Vec<_>>(), [3, 4]);
    let index = Tensor::from_vec(vec![2i64, 0, 1, 3, 3, 0], [3, 2]);
    Tensor::try_realize_all(&[&x, &index]).unwrap();
    let build = || {
        let alias = x.exp().reshape(&[4, 3]);
        let scattered = Tensor::zeros([3, 4]).scatter_add(1, &index, &x.narrow(1, 0, 2));
        let assigned = Tensor::cat(&[&x.exp(), &x.sin()], 0);
        (alias, scattered, assigned)
    };
    let (alias, scattered, assigned) = build();
    let stages = kiln::debug::passes(&[&alias, &scattered, &assigned]);
    let (_, lowered) = stages.iter().find(|(n, _)| n == "lower").unwrap();
    let (_, reused) = stages.iter().find(|(n, _)| n == "reuse_buffers").unwrap();
    assert!(reused.contains("scatter onto fill %"), "{reused}");
    assert!(reused.contains("assign in place %"), "{reused}");
    assert!(reused.matches("kernel ").count() < lowered.matches("kernel ").count());
    insta::assert_snapshot!("buffer_reuse", reused);
    // The values are the reference executor's, which runs every op as written.
    let values = |(a, s, c): (Tensor, Tensor, Tensor)| {
        Tensor::try_realize_all(&[&a, &s, &c]).unwrap();
        (a.to_vec::<f32>(), s.to_vec::<f32>(), c.to_vec::<f32>())
    };
    let want = kiln::with_execution(kiln::Execution::Reference, || values(build()));
    let mut want_scatter = vec![0.0f32; 12];
    for (k, &i) in [2usize, 0, 1, 3, 3, 0].iter().enumerate() {
        want_scatter[k / 2 * 4 + i] += (k / 2 * 4 + k % 2) as f32;
    }
    assert_eq!(want.1, want_scatter);
    let got = values((alias, scattered, assigned));
    assert_eq!(got.1, want_scatter);
    // exp and sin are generated polynomials, a few ULP from the reference's.
    let close = |a: &[f32], b: &[f32]| {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-6 * y.abs().max(1.0))
    };
    assert!(close(&got.0, &want.0) && close(&got.2, &want.2), "{got:?} against {want:?}");
}

/// The Cranelift IR of each CPU loop strategy: vectorized rows, strips over a transposed
/// read with long rows, gathered lanes for a strided read along short rows, a row
/// reduction, and a reduction vectorized across its outputs (columns).
#[test]
fn loop_strategy_clif_snapshots() {
    let plan_summary = |t: &[&Tensor]| at_v3(|| kiln::debug::plan_summary(t));
    let m = Tensor::from_vec((0..64 * 48).map(|i| (i % 7) as f32).collect::<Vec<_>>(), [64, 48]);
    let wide = Tensor::from_vec((0..96 * 8).map(|i| (i % 7) as f32).collect::<Vec<_>>(), [96, 8]);
    Tensor::try_realize_all(&[&m, &wide]).unwrap();
    let cases = [
        ("vector", (&m * 2.0 + 1.0).exp()),
        ("strip", wide.t().contiguous() * 3.0),
        ("gather", m.t().contiguous() * 3.0),
        ("row_reduction", m.sum_dim(1, false)),
        ("column_reduction", m.sum_dim(0, false)),
    ];
    for (name, y) in cases {
        let plan = plan_summary(&[&y]);
        assert_eq!(plan.kernels, 1, "{name}: {:?}", plan.kernel_notes);
        insta::assert_snapshot!(
            format!("clif_{name}"),
            format!("{}\n\n{}", plan.kernel_text[0], plan.clif[0])
        );
    }
    // Below v3 (no FMA, no wide batch functions) the vector kernel keeps its polynomial
    // inline, as `fmul` and `fadd`.
    let y = (&m * 2.0 + 1.0).exp();
    let baseline =
        kiln::debug::with_clif_features(kiln::debug::CpuFeatures::X86_64_BASELINE, || {
            kiln::debug::plan_summary(&[&y])
        });
    insta::assert_snapshot!("clif_vector_baseline", baseline.clif[0]);
}

/// The Cranelift IR of size-generic kernels, every size read when they run: a broadcast
/// over rows (a division per row), a row reduction and a column reduction.
#[test]
fn size_generic_clif_snapshots() {
    let plan_summary = |t: &[&Tensor]| at_v3(|| kiln::debug::plan_summary(t));
    let m = Tensor::from_vec((0..24 * 40).map(|i| (i % 7) as f32).collect::<Vec<_>>(), [24, 40]);
    let bias = Tensor::from_vec((0..40).map(|i| i as f32).collect::<Vec<_>>(), [40]);
    Tensor::try_realize_all(&[&m, &bias]).unwrap();
    let cases = [
        ("broadcast", (&m + &bias).tanh()),
        ("row_reduction", m.sum_dim(1, false)),
        ("column_reduction", m.sum_dim(0, false)),
    ];
    for (name, y) in cases {
        let plan = plan_summary(&[&y]);
        assert_eq!(plan.kernels, 1, "{name}: {:?}", plan.kernel_notes);
        insta::assert_snapshot!(
            format!("generic_clif_{name}"),
            format!("{}\n\n{}", plan.kernel_text[0], plan.generic_clif[0])
        );
    }
}

/// The CUDA C of each kernel kind the CUDA code generator emits: elementwise, a row
/// reduction, a reduction across its outputs (columns), and a long reduction split into
/// partials (with its merge). The elementwise and row kinds of a training step are in
/// `training_step_kernel_snapshots`; this covers the rest on small, readable programs.
#[test]
fn cuda_kernel_kind_snapshots() {
    let m = Tensor::from_vec((0..64 * 48).map(|i| (i % 7) as f32).collect::<Vec<_>>(), [64, 48]);
    let long =
        Tensor::from_vec((0..1 << 20).map(|i| (i % 5) as f32).collect::<Vec<_>>(), [1 << 20]);
    let tall =
        Tensor::from_vec((0..256 * 144).map(|i| (i % 3) as f32).collect::<Vec<_>>(), [256, 144]);
    Tensor::try_realize_all(&[&m, &long, &tall]).unwrap();
    let cases = [
        ("elementwise", (&m * 2.0 + 1.0).exp()),
        ("row_reduction", m.sum_dim(1, false)),
        ("column_reduction", m.sum_dim(0, false)),
        ("split_column_reduction", tall.sum_dim(0, false)),
        ("split_reduction", (&long * 2.0).sum()),
    ];
    for (name, y) in cases {
        let (_, kernels) = kiln::debug::kernels(|| y.realize());
        assert_eq!(kernels.len(), 1, "{name}: one kernel");
        let cuda = kernels[0].cuda.as_deref().expect("CUDA C");
        insta::assert_snapshot!(format!("cuda_{name}"), format!("{}\n\n{cuda}", kernels[0].text));
    }
}
