//! `kiln::optim`: updates against the textbook formulas in f64, schedules, clipping, errors.

use kiln::optim::{
    Adam, AdamConfig, AdamW, CosineAnnealingLr, LrScheduler, Optimizer, Sgd, SgdConfig, StepLr,
    clip_grad_norm,
};
use kiln::prelude::*;

use crate::common::{Rng, assert_close_tol, values};

/// The loss `Σ c·p³/3 + Σ p` has gradient `c·p² + 1`: nonlinear, so an update computed from a
/// stale parameter would show.
fn loss(p: &Tensor, c: &Tensor) -> Tensor {
    (c * &p.pow(3.0) / 3.0 + p).sum()
}

fn grad(p: &[f64], c: &[f64]) -> Vec<f64> {
    p.iter().zip(c).map(|(p, c)| c * p * p + 1.0).collect()
}

fn setup(seed: u64, n: usize) -> (Vec<f64>, Vec<f64>, Tensor, Tensor) {
    let mut rng = Rng::new(seed);
    let p0 = values(&mut rng, n, DType::F64);
    let c: Vec<f64> = values(&mut rng, n, DType::F64).iter().map(|v| v.abs() + 0.5).collect();
    let pt = Tensor::from_vec(p0.clone(), [n]).requires_grad_(true);
    let ct = Tensor::from_vec(c.clone(), [n]);
    (p0, c, pt, ct)
}

fn run(opt: &mut dyn Optimizer, p: &Tensor, c: &Tensor, steps: usize) -> Vec<Vec<f64>> {
    (0..steps)
        .map(|_| {
            opt.zero_grad();
            loss(p, c).backward();
            opt.step();
            p.to_vec::<f64>()
        })
        .collect()
}

#[test]
fn sgd_matches_the_textbook_formula() {
    for (momentum, dampening, weight_decay, nesterov) in [
        (0.0, 0.0, 0.0, false),
        (0.9, 0.0, 0.0, false),
        (0.9, 0.1, 0.01, false),
        (0.8, 0.0, 0.05, true),
    ] {
        let (mut p, c, pt, ct) = setup(7, 9);
        let config = SgdConfig { lr: 0.05, momentum, dampening, weight_decay, nesterov };
        let mut opt = Sgd::new(vec![pt.clone()], config);
        let got = run(&mut opt, &pt, &ct, 5);
        let mut buf: Option<Vec<f64>> = None;
        for (step, got) in got.iter().enumerate() {
            let mut g: Vec<f64> =
                grad(&p, &c).iter().zip(&p).map(|(g, p)| g + weight_decay * p).collect();
            if momentum != 0.0 {
                let b: Vec<f64> = match &buf {
                    None => g.clone(),
                    Some(b) => b
                        .iter()
                        .zip(&g)
                        .map(|(b, g)| momentum * b + (1.0 - dampening) * g)
                        .collect(),
                };
                g = if nesterov {
                    g.iter().zip(&b).map(|(g, b)| g + momentum * b).collect()
                } else {
                    b.clone()
                };
                buf = Some(b);
            }
            p = p.iter().zip(&g).map(|(p, g)| p - config.lr * g).collect();
            assert_close_tol(got, &p, 1e-12, &format!("{config:?} step {step}"));
        }
        assert!(pt.is_leaf() && pt.requires_grad(), "updates record no history");
    }
}

#[test]
fn adam_and_adamw_match_the_textbook_formula() {
    for (decoupled, weight_decay) in [(false, 0.0), (false, 0.1), (true, 0.1)] {
        let (mut p, c, pt, ct) = setup(8, 11);
        let config = AdamConfig { lr: 0.01, betas: (0.8, 0.95), eps: 1e-6, weight_decay };
        let mut opt: Box<dyn Optimizer> = if decoupled {
            Box::new(AdamW::new(vec![pt.clone()], config))
        } else {
            Box::new(Adam::new(vec![pt.clone()], config))
        };
        let got = run(opt.as_mut(), &pt, &ct, 6);
        let (b1, b2) = config.betas;
        let (mut m, mut v) = (vec![0.0; p.len()], vec![0.0; p.len()]);
        for (step, got) in got.iter().enumerate() {
            let t = step as i32 + 1;
            let mut g = grad(&p, &c);
            if decoupled {
                p = p.iter().map(|p| p * (1.0 - config.lr * weight_decay)).collect();
            } else {
                g = g.iter().zip(&p).map(|(g, p)| g + weight_decay * p).collect();
            }
            for i in 0..p.len() {
                m[i] = b1 * m[i] + (1.0 - b1) * g[i];
                v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
                let m_hat = m[i] / (1.0 - b1.powi(t));
                let v_hat = v[i] / (1.0 - b2.powi(t));
                p[i] -= config.lr * m_hat / (v_hat.sqrt() + config.eps);
            }
            assert_close_tol(
                got,
                &p,
                1e-12,
                &format!("decoupled {decoupled} wd {weight_decay} step {step}"),
            );
        }
    }
}

#[test]
fn parameters_without_gradients_are_skipped_and_f32_works() {
    let used = Tensor::from_vec(vec![1.0f32, 2.0], [2]).requires_grad_(true);
    let unused = Tensor::from_vec(vec![5.0f32], [1]).requires_grad_(true);
    let mut opt =
        Adam::new(vec![used.clone(), unused.clone()], AdamConfig { lr: 0.5, ..Default::default() });
    (&used * &used).sum().backward();
    opt.step();
    assert_eq!(unused.to_vec::<f32>(), vec![5.0]);
    let got = used.to_vec::<f32>();
    assert!((got[0] - 0.5).abs() < 1e-6 && (got[1] - 1.5).abs() < 1e-6, "{got:?}");
    assert_eq!(opt.steps(), 1);
}

#[test]
fn bad_hyperparameters_and_parameters_are_errors() {
    let p = || vec![Tensor::zeros([2]).requires_grad_(true)];
    let e = Sgd::try_new(p(), SgdConfig { lr: -1.0, ..Default::default() }).unwrap_err();
    assert_eq!(e.to_string(), "Sgd::new: lr must be a finite number >= 0, got -1");
    let e = Sgd::try_new(p(), SgdConfig { nesterov: true, ..Default::default() }).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Sgd::new: Nesterov momentum requires momentum > 0 and dampening == 0"
    );
    let e = Adam::try_new(p(), AdamConfig { betas: (0.9, 1.0), ..Default::default() }).unwrap_err();
    assert_eq!(e.to_string(), "Adam::new: betas.1 must be in [0, 1), got 1");
    let e = AdamW::try_new(vec![Tensor::zeros([3])], AdamConfig::adamw()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "AdamW::new: parameter 0 (shape [3]) is not a leaf that requires grad, so it would never get a gradient; call .requires_grad_(true) on it, or leave it out"
    );
    assert_eq!(AdamConfig::adamw().weight_decay, 0.01);
    // A gradient of the wrong shape is refused at step().
    let q = Tensor::zeros([2]).requires_grad_(true);
    let mut opt = Sgd::new(vec![q.clone()], SgdConfig::default());
    q.set_grad(Some(Tensor::ones([3])));
    let e = opt.try_step().unwrap_err();
    assert!(matches!(e, kiln::Error::Shape { op: "Sgd::step", .. }), "{e}");
}

#[test]
fn clip_grad_norm_scales_to_the_bound() {
    let mut rng = Rng::new(3);
    let ga = values(&mut rng, 6, DType::F64);
    let gb = values(&mut rng, 4, DType::F64);
    let norm = ga.iter().chain(&gb).map(|v| v * v).sum::<f64>().sqrt();
    for max_norm in [norm / 3.0, norm * 2.0] {
        let a = Tensor::zeros([2, 3]).double().requires_grad_(true);
        let b = Tensor::zeros([4]).double().requires_grad_(true);
        let none = Tensor::zeros([1]).double().requires_grad_(true);
        a.set_grad(Some(Tensor::from_vec(ga.clone(), [2, 3])));
        b.set_grad(Some(Tensor::from_vec(gb.clone(), [4])));
        let got = clip_grad_norm(&[a.clone(), b.clone(), none.clone()], max_norm).expect("clip");
        assert!((got.item::<f64>() - norm).abs() < 1e-12);
        let scale = (max_norm / (norm + 1e-6)).min(1.0);
        let want: Vec<f64> = ga.iter().map(|g| g * scale).collect();
        assert_close_tol(&a.grad().expect("grad").to_vec::<f64>(), &want, 1e-12, "clipped a");
        assert!(none.grad().is_none());
    }
    assert!(clip_grad_norm(&[], -1.0).is_err());
}

#[test]
fn schedules_follow_pytorch() {
    let p = vec![Tensor::zeros([1]).requires_grad_(true)];
    let mut opt = Sgd::new(p.clone(), SgdConfig { lr: 0.1, ..Default::default() });
    let mut step = StepLr::new(&mut opt, 3, 0.1);
    let lrs: Vec<f64> = (0..7)
        .map(|_| {
            step.step(&mut opt);
            opt.lr()
        })
        .collect();
    let want = [0.1, 0.1, 0.01, 0.01, 0.01, 0.001, 0.001];
    assert_close_tol(&lrs, &want, 1e-12, "StepLr");
    assert_eq!(step.last_lr(), opt.lr());

    let mut opt = Adam::new(p, AdamConfig { lr: 1.0, ..Default::default() });
    let mut cos = CosineAnnealingLr::new(&mut opt, 10, 0.1);
    let lrs: Vec<f64> = (0..10)
        .map(|_| {
            cos.step(&mut opt);
            opt.lr()
        })
        .collect();
    let want: Vec<f64> = (1..=10)
        .map(|t| 0.1 + 0.9 * (1.0 + (std::f64::consts::PI * t as f64 / 10.0).cos()) / 2.0)
        .collect();
    assert_close_tol(&lrs, &want, 1e-12, "CosineAnnealingLr");
}
