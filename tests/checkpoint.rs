//! Parameter groups, the new schedules, optimizer state and checkpoints: resuming is bit
//! for bit the same as never stopping.

use std::cell::RefCell;

use kiln::checkpoint::Checkpoint;
use kiln::nn::{Dropout, Linear, Module, Parameters, Sequential, functional as F};
use kiln::optim::{
    Adam, AdamConfig, AdamW, CosineAnnealingLr, LambdaLr, LinearWarmup, LrScheduler, Optimizer,
    ParamGroup, SequentialLr, Sgd, SgdConfig, StateDict,
};
use kiln::prelude::*;

use crate::common::{Rng, values};

fn param(rng: &mut Rng, dims: &[usize]) -> Tensor {
    let n = dims.iter().product();
    Tensor::from_vec(values(rng, n, DType::F64), dims.to_vec()).requires_grad_(true)
}

fn copy(p: &Tensor) -> Tensor {
    Tensor::from_vec(p.to_vec::<f64>(), p.dims().to_vec()).requires_grad_(true)
}

/// A nonlinear loss over several parameters, so each update depends on all of them.
fn loss(params: &[Tensor], c: &Tensor) -> Tensor {
    params
        .iter()
        .map(|p| (p.pow(3.0) * c.narrow(0, 0, 1) + p.sin()).sum())
        .reduce(|a, b| a + b)
        .expect("at least one parameter")
}

fn steps(opt: &mut dyn Optimizer, params: &[Tensor], c: &Tensor, n: usize) {
    for _ in 0..n {
        opt.zero_grad();
        loss(params, c).backward();
        opt.step();
    }
}

type Make = fn(Vec<ParamGroup>) -> Box<dyn Optimizer>;

fn optimizers() -> Vec<(&'static str, Make)> {
    vec![
        ("sgd", |g| {
            let c = SgdConfig {
                lr: 0.05,
                momentum: 0.9,
                weight_decay: 0.01,
                nesterov: true,
                ..Default::default()
            };
            Box::new(Sgd::with_groups(g, c).expect("valid config"))
        }),
        ("adam", |g| {
            Box::new(
                Adam::with_groups(
                    g,
                    AdamConfig { lr: 0.01, weight_decay: 0.02, ..Default::default() },
                )
                .expect("valid config"),
            )
        }),
        ("adamw", |g| {
            Box::new(
                AdamW::with_groups(g, AdamConfig { lr: 0.01, ..AdamConfig::adamw() })
                    .expect("valid config"),
            )
        }),
    ]
}

#[test]
fn each_group_updates_as_its_own_optimizer_would() {
    for (name, make) in optimizers() {
        let mut rng = Rng::new(3);
        let (a, b) = (param(&mut rng, &[3, 4]), param(&mut rng, &[5]));
        let c = Tensor::from_vec(vec![0.3f64], [1]);
        // One optimizer, two groups: the second with its own rate and no weight decay.
        let (a1, b1) = (copy(&a), copy(&b));
        let mut grouped = make(vec![
            ParamGroup::new(vec![a1.clone()]),
            ParamGroup::new(vec![b1.clone()]).lr(0.003).weight_decay(0.0),
        ]);
        steps(&mut *grouped, &[a1.clone(), b1.clone()], &c, 4);
        // Two optimizers, one group each.
        let (a2, b2) = (copy(&a), copy(&b));
        let mut first = make(vec![ParamGroup::new(vec![a2.clone()])]);
        let mut second = make(vec![ParamGroup::new(vec![b2.clone()]).lr(0.003).weight_decay(0.0)]);
        for _ in 0..4 {
            first.zero_grad();
            second.zero_grad();
            loss(&[a2.clone(), b2.clone()], &c).backward();
            first.step();
            second.step();
        }
        assert_eq!(a1.to_vec::<f64>(), a2.to_vec::<f64>(), "{name}: group 0");
        assert_eq!(b1.to_vec::<f64>(), b2.to_vec::<f64>(), "{name}: group 1");
        assert_ne!(b1.to_vec::<f64>(), b.to_vec::<f64>(), "{name}: group 1 moved");
        assert_eq!(grouped.param_groups().len(), 2);
        assert_eq!(grouped.param_groups()[1].lr, 0.003);
        assert_eq!(grouped.param_groups()[1].len(), 1);
    }
}

#[test]
fn optimizer_state_resumes_bit_for_bit() {
    for (name, make) in optimizers() {
        let mut rng = Rng::new(11);
        let params = [param(&mut rng, &[4, 3]), param(&mut rng, &[7])];
        let c = Tensor::from_vec(vec![0.2f64], [1]);
        let groups = |ps: &[Tensor]| {
            vec![
                ParamGroup::new(vec![ps[0].clone()]),
                ParamGroup::new(vec![ps[1].clone()]).weight_decay(0.0),
            ]
        };

        let first: Vec<Tensor> = params.iter().map(copy).collect();
        let mut opt = make(groups(&first));
        steps(&mut *opt, &first, &c, 3);
        opt.param_groups_mut()[0].lr *= 0.5; // a changed rate is part of the state
        let state = opt.state_dict();
        assert!(!state.tensors.is_empty(), "{name}");
        // A fresh optimizer over fresh parameters with the saved values.
        let resumed: Vec<Tensor> = first.iter().map(copy).collect();
        let mut opt2 = make(groups(&resumed));
        opt2.load_state_dict(&state).unwrap();
        assert_eq!(opt2.param_groups(), opt.param_groups(), "{name}");
        steps(&mut *opt2, &resumed, &c, 3);

        for (p, q) in first.iter().zip(&resumed) {
            assert_ne!(p.to_vec::<f64>(), q.to_vec::<f64>(), "{name}: resumed training moved");
        }
        // The same six steps without stopping, with the rate halved at the same point.
        let again: Vec<Tensor> = params.iter().map(copy).collect();
        let mut opt = make(groups(&again));
        steps(&mut *opt, &again, &c, 3);
        opt.param_groups_mut()[0].lr *= 0.5;
        steps(&mut *opt, &again, &c, 3);
        for (p, q) in again.iter().zip(&resumed) {
            assert_eq!(p.to_vec::<f64>(), q.to_vec::<f64>(), "{name}: resumed != straight");
        }
    }
}

#[test]
fn loading_a_foreign_state_is_an_error_that_changes_nothing() {
    let mut rng = Rng::new(5);
    let (a, b) = (param(&mut rng, &[2, 2]), param(&mut rng, &[3]));
    let c = Tensor::from_vec(vec![0.1f64], [1]);
    let mut one = Adam::new(vec![a.clone(), b.clone()], AdamConfig::default());
    steps(&mut one, &[a.clone(), b.clone()], &c, 1);
    let state = one.state_dict();

    let mut two_groups = Adam::with_groups(
        vec![ParamGroup::new(vec![a.clone()]), ParamGroup::new(vec![b.clone()])],
        AdamConfig::default(),
    )
    .unwrap();
    let err = two_groups.load_state_dict(&state).unwrap_err().to_string();
    assert!(err.contains("parameter groups"), "{err}");
    assert!(two_groups.state_dict().tensors.is_empty());

    let other = param(&mut rng, &[4]);
    let mut wrong_shape = Adam::new(vec![a.clone(), other], AdamConfig::default());
    let err = wrong_shape.load_state_dict(&state).unwrap_err().to_string();
    assert!(err.contains("another model"), "{err}");

    let mut sgd = Sgd::new(vec![a.clone(), b.clone()], SgdConfig::default());
    let err = sgd.load_state_dict(&StateDict::default()).unwrap_err().to_string();
    assert!(err.contains("parameter groups"), "{err}");
    assert!(Adam::with_groups(vec![], AdamConfig::default()).is_err());
    let err = Sgd::with_groups(vec![ParamGroup::new(vec![a]).lr(-1.0)], SgdConfig::default())
        .unwrap_err();
    assert!(err.to_string().contains("lr"), "{err}");
}

#[test]
fn warmup_then_cosine_follows_pytorch_per_group() {
    let p = Tensor::zeros([1]).requires_grad_(true);
    let q = Tensor::zeros([1]).requires_grad_(true);
    let mut opt = AdamW::with_groups(
        vec![ParamGroup::new(vec![p]), ParamGroup::new(vec![q]).lr(0.1)],
        AdamConfig { lr: 1.0, ..AdamConfig::adamw() },
    )
    .unwrap();
    let warmup = LinearWarmup::new(&mut opt, 0.1, 4);
    let cosine = CosineAnnealingLr::new(&mut opt, 6, 0.0);
    let mut sched =
        SequentialLr::new(&mut opt, vec![Box::new(warmup), Box::new(cosine)], &[4]).unwrap();
    let mut got = vec![opt.param_groups().iter().map(|g| g.lr).collect::<Vec<_>>()];
    for _ in 0..12 {
        sched.step(&mut opt);
        got.push(opt.param_groups().iter().map(|g| g.lr).collect());
    }
    // PyTorch: LinearLR(start_factor=0.1, total_iters=4), CosineAnnealingLR(T_max=6),
    // SequentialLR(milestones=[4]), in closed form.
    for (epoch, lrs) in got.iter().enumerate() {
        let factor = if epoch < 4 {
            0.1 + 0.9 * epoch as f64 / 4.0
        } else {
            (1.0 + (std::f64::consts::PI * (epoch - 4) as f64 / 6.0).cos()) / 2.0
        };
        for (lr, base) in lrs.iter().zip([1.0, 0.1]) {
            assert!((lr - base * factor).abs() < 1e-12, "epoch {epoch}: {lr} vs {}", base * factor);
        }
    }
    assert_eq!(sched.last_lr(), opt.lr());
    assert!(SequentialLr::new(&mut opt, vec![], &[]).is_err());
    let a = LinearWarmup::new(&mut opt, 0.5, 2);
    let b = LinearWarmup::new(&mut opt, 0.5, 2);
    let err = SequentialLr::new(&mut opt, vec![Box::new(a), Box::new(b)], &[3, 5]).unwrap_err();
    assert!(err.to_string().contains("milestone"), "{err}");

    let mut lambda = LambdaLr::new(&mut opt, |e| 0.9f64.powi(e as i32));
    lambda.step(&mut opt);
    lambda.step(&mut opt);
    assert!((opt.param_groups()[1].lr - lambda.state().base_lrs[1] * 0.81).abs() < 1e-15);
}

fn mlp() -> Sequential {
    Sequential::new()
        .with(Linear::new(6, 16))
        .with(kiln::nn::GELUTanh)
        .with(Dropout::new(0.2))
        .with(Linear::new(16, 3))
}

struct Run {
    model: Sequential,
    opt: RefCell<AdamW>,
    sched: SequentialLr,
}

fn setup() -> Run {
    kiln::manual_seed(1);
    let model = mlp();
    let (matrices, vectors): (Vec<_>, Vec<_>) =
        model.parameters().into_iter().partition(|p| p.ndim() >= 2);
    let mut opt = AdamW::with_groups(
        vec![ParamGroup::new(matrices), ParamGroup::new(vectors).weight_decay(0.0)],
        AdamConfig { lr: 3e-3, weight_decay: 0.1, ..AdamConfig::adamw() },
    )
    .expect("valid config");
    let warmup = LinearWarmup::new(&mut opt, 0.2, 3);
    let cosine = CosineAnnealingLr::new(&mut opt, 10, 1e-4);
    let sched = SequentialLr::new(&mut opt, vec![Box::new(warmup), Box::new(cosine)], &[3])
        .expect("one milestone");
    Run { model, opt: RefCell::new(opt), sched }
}

/// `n` compiled training steps on batches drawn from the generator; the losses' bits.
fn train(run: &mut Run, n: usize) -> Vec<u32> {
    let Run { model, opt, sched } = run;
    let mut step = kiln::compile(|(x, y): (&Tensor, &Tensor)| {
        let mut opt = opt.borrow_mut();
        opt.zero_grad();
        let loss = F::cross_entropy(&model.forward(x), y);
        loss.backward();
        opt.step();
        loss
    });
    (0..n)
        .map(|_| {
            let x = Tensor::randn([8, 6]);
            let y = Tensor::randint(0, 3, [8]);
            let loss = step.call((&x, &y)).item::<f32>();
            sched.step(&mut *opt.borrow_mut());
            loss.to_bits()
        })
        .collect()
}

#[test]
fn a_checkpointed_compiled_run_with_dropout_resumes_bit_for_bit() {
    let path =
        std::env::temp_dir().join(format!("kiln-test-ckpt-{}.safetensors", std::process::id()));
    let mut straight = setup();
    let straight_losses = train(&mut straight, 8);

    let mut first = setup();
    let mut losses = train(&mut first, 4);
    Checkpoint::new()
        .with_model(&first.model)
        .with_optimizer(&*first.opt.borrow())
        .with_scheduler(&first.sched)
        .with_rng()
        .with_value("step", 4)
        .save(&path)
        .unwrap();
    drop(first);
    kiln::manual_seed(999); // whatever happens between the runs

    let lr_after_4 = straight_lr_after(4);
    let mut resumed = setup();
    let ckpt = Checkpoint::load(&path).unwrap();
    ckpt.restore_model(&mut resumed.model).unwrap();
    ckpt.restore_optimizer(&mut *resumed.opt.borrow_mut()).unwrap();
    ckpt.restore_scheduler(&mut resumed.sched).unwrap();
    ckpt.restore_rng().unwrap();
    assert_eq!(ckpt.value("step"), Some("4"));
    assert_eq!(resumed.opt.borrow().lr(), lr_after_4);
    losses.extend(train(&mut resumed, 4));

    assert_eq!(losses, straight_losses);
    for ((name, a), (_, b)) in straight.model.state_dict().iter().zip(resumed.model.state_dict()) {
        assert_eq!(a.to_vec::<f32>(), b.to_vec::<f32>(), "{name}");
    }
    std::fs::remove_file(&path).unwrap();
}

fn straight_lr_after(epochs: usize) -> f64 {
    let mut run = setup();
    for _ in 0..epochs {
        run.sched.step(&mut *run.opt.borrow_mut());
    }
    run.opt.borrow().lr()
}

#[test]
fn restoring_what_a_checkpoint_lacks_is_an_error() {
    let path = std::env::temp_dir()
        .join(format!("kiln-test-ckpt-empty-{}.safetensors", std::process::id()));
    let model = Linear::new(2, 2);
    Checkpoint::new().with_model(&model).save(&path).unwrap();
    let ckpt = Checkpoint::load(&path).unwrap();
    let mut opt = Sgd::new(model.parameters(), SgdConfig::default());
    assert!(ckpt.restore_optimizer(&mut opt).unwrap_err().to_string().contains("no optimizer"));
    let mut sched = CosineAnnealingLr::new(&mut opt, 3, 0.0);
    assert!(ckpt.restore_scheduler(&mut sched).unwrap_err().to_string().contains("no schedule"));
    assert!(ckpt.restore_rng().unwrap_err().to_string().contains("no random state"));
    let mut other = Linear::new(3, 2);
    let err = ckpt.restore_model(&mut other).unwrap_err().to_string();
    assert!(err.contains("weight"), "{err}");
    std::fs::remove_file(&path).unwrap();
}
