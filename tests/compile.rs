//! `kiln::compile`: same values as uncompiled, planned once, replanned with a reason, guards
//! on scalars and random state, graph breaks, and a compiled training step.

use std::cell::Cell;

use kiln::nn::{Dropout, Linear, Module, Parameters, functional as F};
use kiln::optim::{Adam, AdamConfig, Optimizer, Sgd, SgdConfig};
use kiln::prelude::*;

use crate::common::{assert_close_tol, device_test};

fn program(x: &Tensor, w: &Tensor) -> (Tensor, Tensor) {
    let h = (x.matmul(w) + 0.5).tanh();
    (h.softmax(1), (&h * &h).sum_dim(0, false))
}

#[test]
fn compiled_values_match_uncompiled_and_replay() {
    kiln::manual_seed(1);
    let w = Tensor::randn([7, 5]);
    let mut f = kiln::compile(|(x, w): (&Tensor, &Tensor)| program(x, w));
    for call in 0..5 {
        let x = Tensor::randn([9, 7]);
        let (a, b) = f.call((&x, &w));
        let (ea, eb) = program(&x, &w);
        assert_eq!(a.to_vec::<f32>(), ea.to_vec::<f32>(), "call {call}");
        assert_eq!(b.to_vec::<f32>(), eb.to_vec::<f32>(), "call {call}");
    }
    let x = Tensor::randn([9, 7]);
    x.realize();
    let (_, profile) = kiln::profile(|| f.call((&x, &w)));
    assert_eq!((profile.realizations(), profile.plans()), (1, 0), "a replay plans nothing");
    let stats = f.stats();
    assert_eq!((stats.calls, stats.plans, stats.replays), (6, 1, 5), "{stats}");
    assert!(stats.recompiles.is_empty());
    assert!(stats.steps_per_call >= 2);
}

#[test]
fn a_new_shape_replans_and_says_why() {
    let w = Tensor::randn([3, 2]);
    let mut f = kiln::compile(|x: &Tensor| x.matmul(&w).relu());
    let _ = f.call(&Tensor::randn([4, 3]));
    let y = f.call(&Tensor::ones([6, 3]));
    assert_eq!(y.dims(), &[6, 2]);
    let _ = f.call(&Tensor::randn([4, 3])); // the first plan is still cached
    let stats = f.stats();
    assert_eq!((stats.plans, stats.replays), (2, 1), "{stats}");
    assert_eq!(stats.recompiles.len(), 1);
    assert_eq!(stats.recompiles[0].call, 2);
    assert_eq!(
        stats.recompiles[0].reason,
        "argument 0's dimension 0 is 6 (was 4) ([6, 3] f32 on cpu); the same program at other \
         sizes: its kernels whose sizes changed are compiled size-generic, for every size"
    );
    assert!(stats.to_string().contains("call 2 planned again"), "{stats}");
}

#[test]
fn a_different_branch_replans_naming_the_line() {
    let pos = Tensor::ones([3]);
    let neg = Tensor::full([3], -1.0);
    // Control flow on an argument's value (realized, so reading it is no graph break) is
    // re-evaluated on every call.
    let mut g = kiln::compile(
        |(x, flag): (&Tensor, &Tensor)| {
            if flag.item::<f32>() > 0.0 { x.exp() } else { x.neg() }
        },
    );
    let one = Tensor::ones([1]);
    let zero = Tensor::zeros([1]);
    one.realize();
    zero.realize();
    assert_eq!(g.call((&pos, &one)).to_vec::<f32>(), vec![1f32.exp(); 3]);
    assert_eq!(g.call((&neg, &zero)).to_vec::<f32>(), vec![1.0; 3]);
    let stats = g.stats();
    assert_eq!(stats.plans, 2, "{stats}");
    let reason = &stats.recompiles[0].reason;
    assert!(reason.contains("neg recorded at tests/compile.rs"), "{reason}");
}

#[test]
fn reading_a_computed_value_inside_is_a_graph_break() {
    let mut f = kiln::compile(|x: &Tensor| {
        let y = x * 2.0;
        let _ = y.try_item::<f32>().map_err(|e| e.to_string()).expect_err("a graph break");
        y
    });
    let _ = f.call(&Tensor::ones([1]));
    let seen = std::cell::RefCell::new(None);
    let mut g = kiln::compile(|x: &Tensor| {
        let s = x.exp().sum();
        *seen.borrow_mut() = s.try_to_vec::<f32>().err();
        s
    });
    let total = g.call(&Tensor::ones([2]));
    assert!((total.item::<f32>() - 2.0 * 1f32.exp()).abs() < 1e-6);
    let e = seen.take().expect("reading inside must fail");
    assert!(matches!(e, kiln::Error::Compile { op: "compile", .. }), "{e}");
    assert!(e.to_string().contains("graph break"), "{e}");
    assert!(e.to_string().contains("return the tensor from the closure"), "{e}");
    // Outside a compiled call, reads work again.
    assert_eq!(Tensor::ones([2]).sum().item::<f32>(), 2.0);
}

#[test]
fn scalars_are_read_afresh_without_replanning() {
    let scale = Cell::new(2.0);
    let mut f = kiln::compile(|x: &Tensor| x * scale.get() + 1.0);
    let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    assert_eq!(f.call(&x).to_vec::<f32>(), vec![3.0, 5.0]);
    scale.set(10.0);
    assert_eq!(f.call(&x).to_vec::<f32>(), vec![11.0, 21.0]);
    scale.set(1.0); // x * 1: an identity the uncompiled path simplifies away; here it is bound
    assert_eq!(f.call(&x).to_vec::<f32>(), vec![2.0, 3.0]);
    assert_eq!(f.stats().plans, 1, "{}", f.stats());
}

/// A scatter into a constant nobody else holds (as a gather's gradient scatters into zeros).
fn scatter_onto(value: f64, dtype: DType, index: &Tensor, src: &Tensor) -> Tensor {
    Tensor::full([6], value).to_dtype(dtype).scatter_add(0, index, &src.to_dtype(dtype))
}

#[test]
fn a_scatter_onto_a_constant_reads_the_constant_afresh() {
    // The plan fills the scatter's output with the constant instead of storing the constant
    // first; the constant is still a parameter that each call rebinds.
    let base = Cell::new(0.5);
    let index = Tensor::from_vec(vec![0i64, 2, 2, 4], [4]);
    let src = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [4]);
    Tensor::try_realize_all(&[&index, &src]).unwrap();
    let mut f = kiln::compile(|src: &Tensor| scatter_onto(base.get(), DType::F32, &index, src));
    let cases =
        [(0.5, [1.5f32, 0.5, 5.5, 0.5, 4.5, 0.5]), (-1.0, [0.0, -1.0, 4.0, -1.0, 3.0, -1.0])];
    for (b, want) in cases {
        base.set(b);
        assert_eq!(f.call(&src).to_vec::<f32>(), want, "base {b}");
    }
    assert_eq!(f.stats().plans, 1, "{}", f.stats());
    // Uncompiled, in several dtypes: no kernel stores the constant, and the values are one
    // kernel per op's.
    for dtype in [DType::F32, DType::F64, DType::I64, DType::F16] {
        let (got, kernels) =
            kiln::debug::kernels(|| scatter_onto(3.0, dtype, &index, &src).to_vec::<f64>());
        let ops: Vec<&str> = kernels.iter().map(|k| k.ops.as_str()).collect();
        assert!(ops.iter().all(|o| !o.trim().is_empty()), "{dtype:?}: {ops:?}");
        let want = kiln::with_execution(kiln::Execution::Unfused, || {
            scatter_onto(3.0, dtype, &index, &src).to_vec::<f64>()
        });
        assert_eq!(got, want, "{dtype:?}");
        assert_eq!(got, [4.0, 3.0, 8.0, 3.0, 7.0, 3.0], "{dtype:?}");
    }
}

#[test]
fn random_ops_draw_fresh_values_like_eager() {
    let mut f = kiln::compile(|x: &Tensor| F::dropout(x, 0.5, true) + Tensor::randn([4]));
    let x = Tensor::ones([4]);
    kiln::manual_seed(5);
    let compiled: Vec<Vec<f32>> = (0..4).map(|_| f.call(&x).to_vec::<f32>()).collect();
    kiln::manual_seed(5);
    let eager: Vec<Vec<f32>> =
        (0..4).map(|_| (F::dropout(&x, 0.5, true) + Tensor::randn([4])).to_vec::<f32>()).collect();
    assert_eq!(compiled, eager);
    assert_ne!(compiled[0], compiled[1]);
    assert_eq!(f.stats().plans, 1);
}

#[test]
fn captured_tensors_are_read_afresh_and_outputs_are_new() {
    let w = Tensor::from_vec(vec![1.0f32, 2.0], [2]);
    w.realize();
    let mut f = kiln::compile(|x: &Tensor| x * &w);
    let x = Tensor::ones([2]);
    let first = f.call(&x);
    assert_eq!(first.to_vec::<f32>(), vec![1.0, 2.0]);
    w.mul_(10.0); // pending when the next call starts: computed before the plan runs
    let second = f.call(&x);
    assert_eq!(second.to_vec::<f32>(), vec![10.0, 20.0]);
    assert!(!first.shares_storage_with(&second));
    assert_eq!(first.to_vec::<f32>(), vec![1.0, 2.0], "an earlier output is never overwritten");
    assert_eq!(f.stats().plans, 1, "{}", f.stats());

    // In-place writes inside the function are results of the call.
    let counter = Tensor::zeros([1]);
    counter.realize();
    let mut tick = kiln::compile(|()| {
        counter.add_(1.0);
    });
    for _ in 0..3 {
        tick.call(());
    }
    assert_eq!(counter.item::<f32>(), 3.0);
    assert_eq!(tick.stats().plans, 1, "{}", tick.stats());
}

struct Mlp {
    fc1: Linear,
    fc2: Linear,
    drop: Dropout,
}
kiln::parameters!(Mlp { fc1, fc2, drop });

impl Module for Mlp {
    fn try_forward(&self, x: &Tensor) -> kiln::Result<Tensor> {
        let h = self.drop.try_forward(&self.fc1.try_forward(x)?.try_relu()?)?;
        self.fc2.try_forward(&h)
    }
}

fn mlp() -> Mlp {
    Mlp { fc1: Linear::new(20, 32), fc2: Linear::new(32, 5), drop: Dropout::new(0.2) }
}

#[test]
fn a_compiled_training_step_matches_the_eager_loop() {
    kiln::manual_seed(11);
    let x = Tensor::randn([16, 20]);
    let y = Tensor::randint(0, 5, [16]);
    let run = |compiled: bool, adam: bool| -> (Vec<f32>, Option<kiln::compile::CompileStats>) {
        kiln::manual_seed(3);
        let model = mlp();
        let mut opt: Box<dyn Optimizer> = if adam {
            Box::new(Adam::new(model.parameters(), AdamConfig { lr: 1e-2, ..Default::default() }))
        } else {
            Box::new(Sgd::new(
                model.parameters(),
                SgdConfig { lr: 0.1, momentum: 0.9, ..Default::default() },
            ))
        };
        let mut step = |(x, y): (&Tensor, &Tensor)| {
            opt.zero_grad();
            let loss = F::cross_entropy(&model.forward(x), y);
            loss.backward();
            opt.step();
            loss
        };
        if compiled {
            let mut f = kiln::compile(&mut step);
            let losses = (0..8).map(|_| f.call((&x, &y)).item::<f32>()).collect();
            (losses, Some(f.stats().clone()))
        } else {
            ((0..8).map(|_| step((&x, &y)).item::<f32>()).collect(), None)
        }
    };
    for adam in [false, true] {
        let (eager, _) = run(false, adam);
        let (compiled, stats) = run(true, adam);
        let stats = stats.expect("stats");
        for (step, (a, b)) in eager.iter().zip(&compiled).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5 * a.abs().max(1.0),
                "adam {adam} step {step}: {a} vs {b}"
            );
        }
        assert!(compiled[7] < compiled[0], "it trains: {compiled:?}");
        // The first step creates the optimizer's state, so the second plans once more; every
        // later step replays.
        assert_eq!(stats.plans, 2, "adam {adam}: {stats}");
        assert_eq!(stats.replays, 6, "adam {adam}: {stats}");
    }
}

#[test]
fn compiled_calls_honor_the_execution_mode_and_the_oracle() {
    let w = Tensor::randn([5, 3]);
    w.realize();
    let x = Tensor::randn([4, 5]);
    let want = (x.matmul(&w).tanh() + 1.0).sum_dim(1, false).to_vec::<f32>();
    let mut f = kiln::compile(|x: &Tensor| (x.matmul(&w).tanh() + 1.0).sum_dim(1, false));
    // One kernel per op, the reference executor, and every kernel checked against it.
    let unfused = kiln::with_execution(kiln::Execution::Unfused, || f.call(&x)).to_vec::<f32>();
    let reference = kiln::with_execution(kiln::Execution::Reference, || f.call(&x)).to_vec::<f32>();
    let checked = kiln::with_check(|| f.call(&x)).to_vec::<f32>();
    let fused = f.call(&x).to_vec::<f32>();
    for got in [&unfused, &reference, &checked, &fused] {
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{got:?} vs {want:?}");
        }
    }
    // A plan is made per fusion mode; the reference executor needs none.
    let stats = f.stats();
    assert_eq!((stats.plans, stats.replays), (2, 1), "{stats}");
    assert_eq!(stats.recompiles[0].reason, "fusion is on now and was off when the plan was made");
}

/// A call that runs unplanned is counted, never silent: under the reference executor every
/// call realizes eagerly (and `unplanned` says so).
#[test]
fn calls_that_run_unplanned_are_counted() {
    let w = Tensor::randn([4, 3]);
    let mut f = kiln::compile(|x: &Tensor| x.matmul(&w).tanh());
    let x = Tensor::randn([2, 4]);
    let y = kiln::with_execution(kiln::Execution::Reference, || f.call(&x));
    assert_eq!(y.dims(), &[2, 3]);
    let stats = f.stats();
    assert_eq!((stats.calls, stats.plans, stats.unplanned), (1, 0, 1), "{stats}");
    assert!(stats.to_string().contains("1 ran unplanned"), "{stats}");
}

device_test!(
    a_compiled_training_step_matches_the_reference,
    super::a_compiled_training_step_matches_the_reference_on
);

/// Five compiled Adam steps with the data and the parameter on `device`: the losses and the
/// weights the reference executor computes.
fn a_compiled_training_step_matches_the_reference_on(device: Device) {
    kiln::manual_seed(2);
    let x = Tensor::randn([16, 8]);
    let w0 = Tensor::randn([8, 4]);
    let target = Tensor::randint(0, 4, [16]);
    let train = |device: Device| {
        // Its own storage: `to(Device::Cpu)` of a CPU tensor is the tensor itself, and the
        // optimizer updates the parameter in place.
        let w = w0.to(device).copy().detach().requires_grad_(true);
        let (x, target) = (x.to(device), target.to(device));
        // Adam's state (zeros_like of the parameter) lives on the parameter's device.
        let mut opt = Adam::new(vec![w.clone()], AdamConfig { lr: 1e-2, ..Default::default() });
        let mut step = kiln::compile(|()| {
            opt.zero_grad();
            let loss = F::cross_entropy(&x.matmul(&w), &target);
            loss.backward();
            opt.step();
            loss
        });
        let losses: Vec<f32> = (0..5).map(|_| step.call(()).item::<f32>()).collect();
        assert_eq!(w.device(), device);
        (losses, w.to_vec::<f32>())
    };
    let (want_losses, want_w) =
        kiln::with_execution(kiln::Execution::Reference, || train(Device::Cpu));
    let (losses, w) = train(device);
    let f64s = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    assert_close_tol(&f64s(&losses), &f64s(&want_losses), 1e-5, "losses");
    assert_close_tol(&f64s(&w), &f64s(&want_w), 1e-5, "weights");
}
