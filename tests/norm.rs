//! Batch norm, group norm and channel dropout against plain f64 loops; buffers (saved,
//! loaded, moved, skipped by optimizers); running statistics updated eagerly and inside
//! `compile()`.

use kiln::autograd::gradcheck;
use kiln::nn::functional::{self as F, BatchNormOptions};
use kiln::nn::{BatchNorm1d, BatchNorm2d, GroupNorm, Module, Parameters};
use kiln::optim::{Optimizer, Sgd, SgdConfig};
use kiln::prelude::*;

use crate::common::*;

/// Per-channel (dimension 1) mean and biased variance of `x` shaped `[n, c, rest]`.
fn channel_stats(x: &[f64], n: usize, c: usize, rest: usize) -> (Vec<f64>, Vec<f64>) {
    let mut mean = vec![0.0; c];
    let mut var = vec![0.0; c];
    let count = (n * rest) as f64;
    for ch in 0..c {
        let vals: Vec<f64> = (0..n)
            .flat_map(|b| (0..rest).map(move |r| (b, r)))
            .map(|(b, r)| x[(b * c + ch) * rest + r])
            .collect();
        mean[ch] = vals.iter().sum::<f64>() / count;
        var[ch] = vals.iter().map(|v| (v - mean[ch]).powi(2)).sum::<f64>() / count;
    }
    (mean, var)
}

#[allow(clippy::too_many_arguments)]
fn batch_norm_ref(
    x: &[f64],
    n: usize,
    c: usize,
    rest: usize,
    mean: &[f64],
    var: &[f64],
    w: &[f64],
    b: &[f64],
    eps: f64,
) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for bi in 0..n {
        for ch in 0..c {
            for r in 0..rest {
                let i = (bi * c + ch) * rest + r;
                out[i] = (x[i] - mean[ch]) / (var[ch] + eps).sqrt() * w[ch] + b[ch];
            }
        }
    }
    out
}

#[test]
fn batch_norm_matches_the_loop_in_training_and_evaluation() {
    let mut rng = Rng::new(91);
    for (shape, layout) in [
        (vec![5usize, 3, 4, 7], Layout::Permuted),
        (vec![4, 6], Layout::Contiguous),
        (vec![3, 2, 9], Layout::Sliced),
        (vec![2, 3, 5, 3], Layout::Sliced),
    ] {
        let (n, c) = (shape[0], shape[1]);
        let rest: usize = shape[2..].iter().product();
        let dx = values(&mut rng, shape.iter().product(), DType::F64);
        let dw = values(&mut rng, c, DType::F64);
        let db = values(&mut rng, c, DType::F64);
        let drm = values(&mut rng, c, DType::F64);
        let drv: Vec<f64> = values(&mut rng, c, DType::F64).iter().map(|v| v.abs() + 0.5).collect();
        let x = make(&dx, &shape, DType::F64, layout);
        let (w, b) = (tensor(&dw, &[c], DType::F64), tensor(&db, &[c], DType::F64));
        let (rm, rv) = (tensor(&drm, &[c], DType::F64), tensor(&drv, &[c], DType::F64));
        let ctx = format!("{shape:?} {layout:?}");

        // Evaluation: the running statistics normalize, and stay as they were.
        let y = F::batch_norm(&x, Some(&rm), Some(&rv), Some(&w), Some(&b), Default::default());
        let want = batch_norm_ref(&dx, n, c, rest, &drm, &drv, &dw, &db, 1e-5);
        assert_close_tol(&y.to_vec::<f64>(), &want, 1e-12, &ctx);
        assert_eq!(rm.to_vec::<f64>(), drm);

        // Training: batch statistics, and the running ones move by `momentum`.
        let opts = BatchNormOptions { training: true, momentum: 0.3, eps: 1e-3 };
        let y = F::batch_norm(&x, Some(&rm), Some(&rv), Some(&w), Some(&b), opts);
        let (mean, var) = channel_stats(&dx, n, c, rest);
        let want = batch_norm_ref(&dx, n, c, rest, &mean, &var, &dw, &db, 1e-3);
        assert_close_tol(&y.to_vec::<f64>(), &want, 1e-12, &ctx);
        let count = (n * rest) as f64;
        let want_rm: Vec<f64> = (0..c).map(|i| 0.7 * drm[i] + 0.3 * mean[i]).collect();
        let want_rv: Vec<f64> =
            (0..c).map(|i| 0.7 * drv[i] + 0.3 * var[i] * count / (count - 1.0)).collect();
        assert_close_tol(&rm.to_vec::<f64>(), &want_rm, 1e-12, &ctx);
        assert_close_tol(&rv.to_vec::<f64>(), &want_rv, 1e-12, &ctx);
    }
}

#[test]
fn batch_norm_and_group_norm_pass_gradcheck() {
    let mut rng = Rng::new(92);
    let x =
        make(&values(&mut rng, 4 * 3 * 5, DType::F64), &[4, 3, 5], DType::F64, Layout::Permuted);
    let w = tensor(&values(&mut rng, 3, DType::F64), &[3], DType::F64);
    let b = tensor(&values(&mut rng, 3, DType::F64), &[3], DType::F64);
    let train = BatchNormOptions { training: true, ..Default::default() };
    gradcheck(
        |t| F::batch_norm(&t[0], None, None, Some(&t[1]), Some(&t[2]), train),
        &[x.clone(), w.clone(), b.clone()],
        1e-6,
        1e-6,
    )
    .unwrap();
    let rm = tensor(&values(&mut rng, 3, DType::F64), &[3], DType::F64);
    let rv = tensor(&[0.5, 1.5, 2.0], &[3], DType::F64);
    gradcheck(
        |t| {
            F::batch_norm(&t[0], Some(&rm), Some(&rv), Some(&t[1]), Some(&t[2]), Default::default())
        },
        &[x.clone(), w.clone(), b.clone()],
        1e-6,
        1e-6,
    )
    .unwrap();
    let x6 = make(&values(&mut rng, 2 * 6 * 5, DType::F64), &[2, 6, 5], DType::F64, Layout::Sliced);
    let w6 = tensor(&values(&mut rng, 6, DType::F64), &[6], DType::F64);
    let b6 = tensor(&values(&mut rng, 6, DType::F64), &[6], DType::F64);
    gradcheck(
        |t| F::group_norm(&t[0], 3, Some(&t[1]), Some(&t[2]), 1e-5),
        &[x6, w6, b6],
        1e-6,
        1e-6,
    )
    .unwrap();
}

#[test]
fn group_norm_matches_the_loop() {
    let mut rng = Rng::new(93);
    let (n, c, g, rest) = (3usize, 6usize, 2usize, 7usize);
    let dx = values(&mut rng, n * c * rest, DType::F64);
    let dw = values(&mut rng, c, DType::F64);
    let db = values(&mut rng, c, DType::F64);
    let x = make(&dx, &[n, c, rest], DType::F64, Layout::Permuted);
    let y = F::group_norm(
        &x,
        g,
        Some(&tensor(&dw, &[c], DType::F64)),
        Some(&tensor(&db, &[c], DType::F64)),
        1e-5,
    );
    let per = c / g * rest;
    let mut want = vec![0.0; dx.len()];
    for s in 0..n * g {
        let vals = &dx[s * per..(s + 1) * per];
        let mean = vals.iter().sum::<f64>() / per as f64;
        let var = vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / per as f64;
        for (k, v) in vals.iter().enumerate() {
            let ch = (s % g) * (c / g) + k / rest;
            want[s * per + k] = (v - mean) / (var + 1e-5).sqrt() * dw[ch] + db[ch];
        }
    }
    assert_close_tol(&y.to_vec::<f64>(), &want, 1e-12, "group_norm");
    let gn = GroupNorm::new(2, 4);
    assert!(
        gn.try_forward(&Tensor::zeros([2, 3, 5]))
            .unwrap_err()
            .to_string()
            .starts_with("GroupNorm: expects an input of shape [N, 4, ...]")
    );
    assert!(GroupNorm::try_with_options(3, 4, 1e-5, true).is_err());
}

#[test]
fn batch_norm_layers_keep_buffers_that_optimizers_skip_and_files_carry() {
    kiln::manual_seed(3);
    let bn = BatchNorm2d::new(3);
    assert_eq!(
        bn.named_parameters().into_iter().map(|(n, _)| n).collect::<Vec<_>>(),
        ["weight", "bias"]
    );
    let x = Tensor::randn([6, 3, 4, 4]) * 2.0 + 0.5;
    let mut opt = Sgd::new(bn.parameters(), SgdConfig { lr: 0.1, ..Default::default() });
    for _ in 0..3 {
        opt.zero_grad();
        bn.forward(&x).square().mean().backward();
        opt.step();
    }
    assert_eq!(bn.num_batches_tracked.item::<i64>(), 3);
    // Three updates toward the batch mean: 1 - 0.9^3 of the way.
    let xv = x.to_vec::<f32>().iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
    let (mean, _) = channel_stats(&xv, 6, 3, 16);
    let want: Vec<f64> = mean.iter().map(|m| m * (1.0 - 0.9f64.powi(3))).collect();
    let got: Vec<f64> = bn.running_mean.to_vec::<f32>().iter().map(|&v| f64::from(v)).collect();
    assert_close_tol(&got, &want, 1e-5, "running mean");

    // Saved and loaded with the parameters; a fresh layer gets the same statistics.
    let path = std::env::temp_dir().join(format!("kiln-bn-{}.safetensors", std::process::id()));
    bn.save(&path).unwrap();
    let fresh = BatchNorm2d::new(3);
    fresh.load(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(fresh.running_mean.to_vec::<f32>(), bn.running_mean.to_vec::<f32>());
    assert_eq!(fresh.running_var.to_vec::<f32>(), bn.running_var.to_vec::<f32>());
    assert_eq!(fresh.num_batches_tracked.item::<i64>(), 3);
    let names: Vec<String> = fresh.state_dict().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]);

    // Evaluation mode reads the running statistics and leaves them alone.
    let mut fresh = fresh;
    fresh.eval();
    let y = fresh.forward(&x);
    let mut trained = bn.clone();
    trained.eval();
    assert_eq!(y.to_vec::<f32>(), trained.forward(&x).to_vec::<f32>());
    assert_eq!(fresh.num_batches_tracked.item::<i64>(), 3);

    // Mistakes.
    let err = |r: kiln::Result<Tensor>| r.unwrap_err().to_string();
    assert!(
        err(bn.try_forward(&Tensor::zeros([2, 4, 3, 3])))
            .starts_with("BatchNorm2d: the layer has 3 channels")
    );
    assert!(
        err(bn.try_forward(&Tensor::zeros([2, 3])))
            .starts_with("BatchNorm2d: expects an input of shape [N, C, H, W]")
    );
    assert!(
        err(BatchNorm1d::new(3).try_forward(&Tensor::zeros([1, 3])))
            .starts_with("batch_norm: training needs more than one value per channel")
    );
    assert!(
        err(F::try_batch_norm(&Tensor::zeros([2, 3]), None, None, None, None, Default::default()))
            .starts_with("batch_norm: evaluation mode normalizes with the running statistics")
    );
}

#[test]
fn cumulative_average_without_momentum() {
    let bn = BatchNorm1d::with_options(2, 1e-5, None, false);
    let batches = [
        Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 6.0], [2, 2]),
        Tensor::from_vec(vec![5.0f32, 0.0, 7.0, 2.0], [2, 2]),
    ];
    for b in &batches {
        let _ = bn.forward(b);
    }
    // The plain average of the two batch means: (2, 4) and (6, 1).
    assert_eq!(bn.running_mean.to_vec::<f32>(), vec![4.0, 2.5]);
}

#[test]
fn running_statistics_update_inside_compile_on_every_replay() {
    kiln::manual_seed(4);
    let bn = BatchNorm2d::new(2);
    let eager = bn.clone();
    // A deep copy for the eager run: the same starting values in separate storages.
    let eager = BatchNorm2d {
        running_mean: eager.running_mean.copy(),
        running_var: eager.running_var.copy(),
        num_batches_tracked: eager.num_batches_tracked.copy(),
        weight: eager.weight.as_ref().map(|w| w.copy().detach().requires_grad_(true)),
        bias: eager.bias.as_ref().map(|b| b.copy().detach().requires_grad_(true)),
        ..eager
    };
    let mut step = kiln::compile(|x: &Tensor| bn.forward(x).sum());
    for i in 0..4 {
        let x = Tensor::randn([4, 2, 3, 3]) + i as f64;
        let a = step.call(&x).item::<f32>();
        let b = eager.forward(&x).sum().item::<f32>();
        assert!((a - b).abs() < 1e-4, "{a} {b}");
    }
    assert_eq!(step.stats().plans, 1, "{:?}", step.stats());
    assert_eq!(bn.num_batches_tracked.item::<i64>(), 4);
    assert_close_tol(
        &read(&bn.running_mean, DType::F32),
        &read(&eager.running_mean, DType::F32),
        1e-5,
        "compiled running mean",
    );
    assert_close_tol(
        &read(&bn.running_var, DType::F32),
        &read(&eager.running_var, DType::F32),
        1e-5,
        "compiled running var",
    );
}

#[test]
fn eager_running_updates_do_not_pile_up() {
    // Each update joins the next realization: after a step, the buffers hold values.
    let bn = BatchNorm1d::new(3);
    for _ in 0..5 {
        bn.forward(&Tensor::randn([8, 3])).sum().item::<f32>();
        let left = kiln::debug::plan_summary(&[&bn.running_mean, &bn.num_batches_tracked]);
        assert_eq!(left.kernels, 0, "the running statistics should be computed with the step");
    }
}

#[test]
fn dropout2d_zeroes_whole_channels() {
    kiln::manual_seed(9);
    let x = Tensor::randn([16, 8, 3, 5]);
    let y = F::dropout2d(&x, 0.25, true);
    let (xv, yv) = (x.to_vec::<f32>(), y.to_vec::<f32>());
    let mut dropped = 0;
    for ch in 0..16 * 8 {
        let (xs, ys) = (&xv[ch * 15..(ch + 1) * 15], &yv[ch * 15..(ch + 1) * 15]);
        if ys.iter().all(|&v| v == 0.0) {
            dropped += 1;
        } else {
            for (a, b) in xs.iter().zip(ys) {
                assert!((a / 0.75 - b).abs() < 1e-6);
            }
        }
    }
    assert!((16..=48).contains(&dropped), "{dropped} of 128 channels dropped at p = 0.25");
    assert_eq!(F::dropout2d(&x, 0.25, false).to_vec::<f32>(), xv);
    assert!(F::try_dropout2d(&Tensor::zeros([3, 3]), 0.5, true).is_err());
}
