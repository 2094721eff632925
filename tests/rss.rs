//! Resident memory stays flat over long loops. This binary holds only these checks, run one
//! after another in one test: resident memory is per process, so other tests running
//! alongside would blur the measurement.

use kiln::prelude::*;

/// The resident set size of this process, in bytes, where the system reports it
/// (`VmRSS` of `/proc/self/status`, in kB whatever the page size: Linux).
fn try_rss_bytes() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// [`try_rss_bytes`], which [`memory_stays_flat`] checked is there.
fn rss_bytes() -> usize {
    try_rss_bytes().expect("VmRSS was readable when the test started")
}

#[test]
fn memory_stays_flat() {
    if try_rss_bytes().is_none() {
        let why = "this system has no /proc/self/status to read resident memory from (Linux only)";
        kiln_ir::testing::skip("memory_stays_flat", why, &["KILN_REQUIRE_RSS"]);
        return;
    }
    realizing_a_graph_many_times_keeps_memory_flat();
    long_in_place_loops_realize_once_and_stay_flat();
    training_loops_keep_memory_flat_and_deep_graphs_backprop();
    compiled_training_steps_keep_memory_flat();
}

/// How many times longer than CI's run to soak: `KILN_SOAK=10` (as `scripts/soak` sets)
/// makes the record/realize loop one million cycles and the compiled training loop 10,000
/// steps.
fn soak() -> usize {
    std::env::var("KILN_SOAK").ok().and_then(|v| v.parse().ok()).unwrap_or(1)
}

fn realizing_a_graph_many_times_keeps_memory_flat() {
    let step = || {
        let x = Tensor::arange(0.0f32, 64.0, 1.0).view(&[8, 8]);
        let mut y = &x * 0.5;
        for _ in 0..18 {
            y = (&y + 1.0).relu();
        }
        y.t().sum().item::<f32>()
    };
    let expected = step();
    for _ in 0..5_000 {
        step();
    }
    let before = rss_bytes();
    for _ in 0..100_000 * soak() {
        assert_eq!(step(), expected);
    }
    let after = rss_bytes();
    // Allow for allocator noise, but not for growth proportional to the iterations (each
    // iteration touches over 5 KiB, so a leak would add hundreds of MiB).
    assert!(
        after < before + 8 * 1024 * 1024,
        "resident memory grew from {before} to {after} bytes"
    );
}

fn long_in_place_loops_realize_once_and_stay_flat() {
    let x = Tensor::zeros([8]);
    for _ in 0..20_000 {
        x.add_(1.0);
    }
    assert_eq!(x.to_vec::<f32>(), vec![20_000.0; 8]);
    let before = rss_bytes();
    for _ in 0..20_000 {
        x.i(3).add_(1.0);
        x.realize();
    }
    assert!(rss_bytes() < before + 8 * 1024 * 1024);
    assert_eq!(x.to_vec::<f32>()[3], 40_000.0);
}

fn training_loops_keep_memory_flat_and_deep_graphs_backprop() {
    let worker = std::thread::Builder::new().stack_size(512 * 1024).spawn(|| {
        // A 20,000-op chain differentiates and drops without recursion.
        let x = Tensor::scalar(0.5f64).requires_grad_(true);
        let mut y = x.clone();
        for _ in 0..20_000 {
            y = &y * 1.0 + 0.0;
        }
        y.backward();
        assert_eq!(x.grad().expect("backward filled the gradient").item::<f64>(), 1.0);
    });
    worker.expect("spawn").join().expect("deep backward on a 512 KiB stack");

    let w = Tensor::from_vec(vec![0.1f32; 16], [4, 4]).requires_grad_(true);
    let data = Tensor::from_vec((0..32).map(|v| v as f32 / 32.0).collect::<Vec<_>>(), [8, 4]);
    let step = |w: &Tensor| {
        let loss = data.matmul(w).tanh().square().mean();
        loss.backward();
        let g = w.grad().expect("backward filled the gradient");
        w.zero_grad();
        kiln::no_grad(|| (w - &g * 0.01).detach().requires_grad_(true))
    };
    let mut w = step(&w);
    for _ in 0..500 {
        w = step(&w);
    }
    let before = rss_bytes();
    for _ in 0..10_000 * soak() {
        w = step(&w);
    }
    let after = rss_bytes();
    assert!(
        after < before + 8 * 1024 * 1024,
        "resident memory grew from {before} to {after} bytes"
    );
}

/// A compiled MLP training step (forward, cross-entropy, backward, SGD with momentum)
/// replayed many times: the plan, the optimizer's state and the kernels are reused, so
/// resident memory stays flat.
fn compiled_training_steps_keep_memory_flat() {
    use kiln::nn::{Linear, Module, Parameters, ReLU, Sequential, functional as F};
    use kiln::optim::{Optimizer, Sgd, SgdConfig};
    kiln::manual_seed(3);
    let model = Sequential::new().with(Linear::new(32, 64)).with(ReLU).with(Linear::new(64, 10));
    let mut opt =
        Sgd::new(model.parameters(), SgdConfig { lr: 0.01, momentum: 0.9, ..Default::default() });
    let x = Tensor::randn([16, 32]);
    let y = Tensor::randint(0, 10, [16]);
    Tensor::try_realize_all(&[&x, &y]).expect("inputs");
    let mut step = |(x, y): (&Tensor, &Tensor)| {
        opt.zero_grad();
        let loss = F::cross_entropy(&model.forward(x), y);
        loss.backward();
        opt.step();
        loss
    };
    let mut f = kiln::compile(&mut step);
    let first = f.call((&x, &y)).item::<f32>();
    for _ in 0..100 {
        f.call((&x, &y)).item::<f32>();
    }
    let before = rss_bytes();
    let mut last = first;
    for _ in 0..1_000 * soak() {
        last = f.call((&x, &y)).item::<f32>();
    }
    let after = rss_bytes();
    assert!(last < first, "training lowered the loss: {first} -> {last}");
    assert!(
        after < before + 8 * 1024 * 1024,
        "resident memory grew from {before} to {after} bytes over compiled steps"
    );
}
