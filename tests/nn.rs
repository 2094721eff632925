//! `kiln::nn`: layers against f64 loops, PyTorch's initialization, parameter naming, losses
//! against hand computation, and finite-difference gradients.

use kiln::autograd::gradcheck;
use kiln::nn::functional::{self as F, CrossEntropyOptions, Reduction};
use kiln::nn::{
    Dropout, Embedding, GELU, LayerNorm, Linear, Module, Parameters, ReLU, Sequential, Sigmoid,
    Tanh,
};
use kiln::prelude::*;

use crate::common::{Rng, assert_close_tol, device_test, values};

fn f64_tensor(rng: &mut Rng, shape: &[usize]) -> (Vec<f64>, Tensor) {
    let n = shape.iter().product();
    let v = values(rng, n, DType::F64);
    (v.clone(), Tensor::from_vec(v, shape))
}

#[test]
fn linear_initialization_follows_pytorch_bounds() {
    kiln::manual_seed(3);
    for (fan_in, fan_out) in [(784, 128), (3, 5), (1, 1)] {
        let layer = Linear::new(fan_in, fan_out);
        let bound = 1.0 / (fan_in as f64).sqrt();
        let w = layer.weight.to_vec::<f64>();
        let b = layer.bias.as_ref().expect("bias").to_vec::<f64>();
        assert_eq!(layer.weight.dims(), &[fan_out, fan_in]);
        assert_eq!(b.len(), fan_out);
        for v in w.iter().chain(&b) {
            assert!(v.abs() <= bound, "{v} outside ±{bound}");
        }
        assert!(layer.weight.requires_grad() && layer.weight.is_leaf());
        if w.len() > 10_000 {
            // A uniform sample fills its range: spread and mean as U(-b, b) has them.
            let max = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let mean = w.iter().sum::<f64>() / w.len() as f64;
            let var = w.iter().map(|v| v * v).sum::<f64>() / w.len() as f64;
            assert!(max > 0.999 * bound, "max {max} vs bound {bound}");
            assert!(mean.abs() < 0.01 * bound, "mean {mean}");
            assert!((var / (bound * bound / 3.0) - 1.0).abs() < 0.02, "variance {var}");
        }
    }
}

#[test]
fn parameter_counts_and_names() {
    let mlp = Sequential::new().with(Linear::new(784, 128)).with(ReLU).with(Linear::new(128, 10));
    assert_eq!(mlp.num_parameters(), 101_770);
    let names: Vec<String> = mlp.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["0.weight", "0.bias", "2.weight", "2.bias"]);

    struct Block {
        norm: LayerNorm,
        heads: Vec<Linear>,
        gate: Option<Linear>,
        scale: Tensor,
        drop: Dropout,
        act: GELU,
    }
    kiln::parameters!(Block { norm, heads, gate, scale, drop, act });
    struct Model {
        blocks: Vec<Block>,
        out: Linear,
    }
    kiln::parameters!(Model { blocks, out });

    let block = || Block {
        norm: LayerNorm::new(&[4]),
        heads: vec![Linear::new(4, 2), Linear::with_options(4, 2, false, DType::F32)],
        gate: None,
        scale: Tensor::ones([1]).requires_grad_(true),
        drop: Dropout::new(0.5),
        act: GELU,
    };
    let mut model = Model { blocks: vec![block(), block()], out: Linear::new(4, 1) };
    let names: Vec<String> = model.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "blocks.0.norm.weight",
            "blocks.0.norm.bias",
            "blocks.0.heads.0.weight",
            "blocks.0.heads.0.bias",
            "blocks.0.heads.1.weight",
            "blocks.0.scale",
            "blocks.1.norm.weight",
            "blocks.1.norm.bias",
            "blocks.1.heads.0.weight",
            "blocks.1.heads.0.bias",
            "blocks.1.heads.1.weight",
            "blocks.1.scale",
            "out.weight",
            "out.bias",
        ]
    );
    assert_eq!(model.num_parameters(), 2 * (4 + 4 + 8 + 2 + 8 + 1) + 4 + 1);
    // Parameters share storage with the model: an in-place write through one is seen by both.
    let params = model.parameters();
    kiln::no_grad(|| params[12].fill_(0.25));
    assert_eq!(model.out.weight.to_vec::<f32>(), vec![0.25; 4]);

    model.eval();
    assert!(model.blocks.iter().all(|b| !b.drop.training));
    model.train();
    assert!(model.blocks.iter().all(|b| b.drop.training));

    // zero_grad clears every gradient.
    let loss = model.out.forward(&Tensor::ones([2, 4])).sum();
    loss.backward();
    assert!(model.out.weight.grad().is_some());
    model.zero_grad();
    assert!(model.parameters().iter().all(|p| p.grad().is_none()));

    assert!(model.to(Device::Cpu).is_ok());
    let err = model.to(Device::Cuda(kiln::cuda::device_count())).unwrap_err();
    assert!(matches!(err, kiln::Error::Device { op: "to", .. }), "{err}");
}

#[test]
fn linear_forward_matches_a_loop() {
    let mut rng = Rng::new(11);
    for (batch, fan_in, fan_out, bias) in [(5, 7, 3, true), (1, 1, 1, false), (2, 17, 9, true)] {
        let (w, wt) = f64_tensor(&mut rng, &[fan_out, fan_in]);
        let (b, bt) = f64_tensor(&mut rng, &[fan_out]);
        let layer = Linear::from_parts(wt, bias.then_some(bt)).expect("parts");
        // A 3-D input with a permuted layout: leading dimensions are batch dimensions.
        let (x, xt) = f64_tensor(&mut rng, &[fan_in, 2, batch]);
        let xt = xt.permute(&[1, 2, 0]);
        let got = layer.forward(&xt);
        assert_eq!(got.dims(), &[2, batch, fan_out]);
        let mut want = Vec::new();
        for a in 0..2 {
            for r in 0..batch {
                for o in 0..fan_out {
                    let mut acc = if bias { b[o] } else { 0.0 };
                    for i in 0..fan_in {
                        acc += w[o * fan_in + i] * x[(i * 2 + a) * batch + r];
                    }
                    want.push(acc);
                }
            }
        }
        assert_close_tol(&got.to_vec::<f64>(), &want, 1e-12, "linear");
    }
    let err = Linear::new(3, 2).try_forward(&Tensor::zeros([4, 5])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "Linear: expected an input whose last dimension is 3, got shape [4, 5]; reshape the input or build the layer for 5 features"
    );
    assert!(Linear::from_parts(Tensor::zeros([2, 3]), Some(Tensor::zeros([3]))).is_err());
}

#[test]
fn layers_pass_gradcheck() {
    kiln::manual_seed(5);
    let lin = Linear::with_options(4, 3, true, DType::F64);
    let (w, b) = (lin.weight.clone(), lin.bias.clone().expect("bias"));
    let x = Tensor::randn([5, 4]).double();
    gradcheck(
        |t| {
            Linear::from_parts(t[1].clone(), Some(t[2].clone()))
                .expect("parts")
                .forward(&t[0])
                .tanh()
        },
        &[x.clone(), w, b],
        1e-6,
        1e-6,
    )
    .expect("linear");
    let (g, beta) = (Tensor::randn([4]).double(), Tensor::randn([4]).double());
    gradcheck(
        |t| F::layer_norm(&t[0], &[4], Some(&t[1]), Some(&t[2]), 1e-5),
        &[x.clone(), g, beta],
        1e-6,
        1e-5,
    )
    .expect("layer_norm");
    let x3 = Tensor::randn([2, 3, 4]).double();
    gradcheck(|t| F::layer_norm(&t[0], &[3, 4], None, None, 1e-5), &[x3], 1e-6, 1e-5)
        .expect("layer_norm 2-D");
    for (name, m) in [
        ("relu", Box::new(ReLU) as Box<dyn Module>),
        ("gelu", Box::new(GELU)),
        ("sigmoid", Box::new(Sigmoid)),
        ("tanh", Box::new(Tanh)),
    ] {
        gradcheck(|t| m.forward(&t[0]), &[x.clone() + 0.01], 1e-6, 1e-6)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn layer_norm_matches_a_loop() {
    let mut rng = Rng::new(21);
    let (rows, cols) = (6, 13);
    let (x, xt) = f64_tensor(&mut rng, &[rows, cols]);
    let (w, wt) = f64_tensor(&mut rng, &[cols]);
    let (b, bt) = f64_tensor(&mut rng, &[cols]);
    let ln =
        LayerNorm { normalized_shape: vec![cols], eps: 1e-5, weight: Some(wt), bias: Some(bt) };
    let got = ln.forward(&xt).to_vec::<f64>();
    let mut want = Vec::new();
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let mean = row.iter().sum::<f64>() / cols as f64;
        let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / cols as f64;
        want.extend((0..cols).map(|c| (row[c] - mean) / (var + 1e-5).sqrt() * w[c] + b[c]));
    }
    assert_close_tol(&got, &want, 1e-10, "layer_norm");
    let err = ln.try_forward(&Tensor::zeros([2, 5]).double()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "layer_norm: the input of shape [2, 5] must end in the normalized shape [13]"
    );
}

/// log-softmax of one row, in f64.
fn log_softmax(row: &[f64]) -> Vec<f64> {
    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
    row.iter().map(|v| v - lse).collect()
}

#[test]
fn cross_entropy_on_known_logits() {
    // Hand-computed: logits [[2, 1, 0.1], [0.5, 2.5, 0.3]], targets [0, 1].
    // Row 0: lse = ln(e^2 + e^1 + e^0.1) = 2.41703; loss 0.41703.
    // Row 1: lse = ln(e^0.5 + e^2.5 + e^0.3) = 2.72005; loss 0.22005.
    let logits = Tensor::from_vec(vec![2.0f64, 1.0, 0.1, 0.5, 2.5, 0.3], [2, 3]);
    let target = Tensor::from_vec(vec![0i64, 1], [2]);
    let loss = F::cross_entropy(&logits, &target).item::<f64>();
    assert!((loss - (0.417_030 + 0.220_050) / 2.0).abs() < 1e-5, "{loss}");

    // Huge logits stay finite (log_softmax subtracts the row maximum).
    let big = Tensor::from_vec(vec![1000.0f32, 0.0, -1000.0, 0.0], [2, 2]);
    let right = F::cross_entropy(&big, &Tensor::from_vec(vec![0i64, 1], [2])).item::<f32>();
    let wrong = F::cross_entropy(&big, &Tensor::from_vec(vec![1i64, 0], [2])).item::<f32>();
    assert_eq!((right, wrong), (0.0, 1000.0));
}

#[test]
fn cross_entropy_options_match_a_loop() {
    let mut rng = Rng::new(31);
    let (n, c) = (7, 5);
    let (x, xt) = f64_tensor(&mut rng, &[n, c]);
    let t: Vec<i64> = (0..n).map(|_| rng.int(0, c as i64)).collect();
    let mut t_ignored = t.clone();
    t_ignored[2] = -100;
    t_ignored[5] = -100;
    for (eps, ignore, reduction) in [
        (0.0, false, Reduction::Mean),
        (0.1, false, Reduction::Mean),
        (0.2, true, Reduction::Mean),
        (0.0, true, Reduction::Sum),
        (0.3, false, Reduction::None),
        (0.0, true, Reduction::None),
    ] {
        let targets = if ignore { &t_ignored } else { &t };
        let per: Vec<Option<f64>> = (0..n)
            .map(|i| {
                if targets[i] < 0 {
                    return None;
                }
                let lp = log_softmax(&x[i * c..(i + 1) * c]);
                let nll = -lp[targets[i] as usize];
                let smooth = -lp.iter().sum::<f64>() / c as f64;
                Some((1.0 - eps) * nll + eps * smooth)
            })
            .collect();
        let kept: Vec<f64> = per.iter().flatten().copied().collect();
        let want = match reduction {
            Reduction::Mean => vec![kept.iter().sum::<f64>() / kept.len() as f64],
            Reduction::Sum => vec![kept.iter().sum::<f64>()],
            Reduction::None => per.iter().map(|v| v.unwrap_or(0.0)).collect(),
        };
        let opts = CrossEntropyOptions {
            reduction,
            label_smoothing: eps,
            ignore_index: ignore.then_some(-100),
        };
        let got = F::cross_entropy_with(&xt, &Tensor::from_vec(targets.clone(), [n]), opts);
        assert_close_tol(&got.to_vec::<f64>(), &want, 1e-12, &format!("{opts:?}"));
    }

    // nll_loss of log_softmax is cross_entropy.
    let target = Tensor::from_vec(t.clone(), [n]);
    let a = F::nll_loss(&F::log_softmax(&xt, 1), &target).item::<f64>();
    let b = F::cross_entropy(&xt, &target).item::<f64>();
    assert!((a - b).abs() < 1e-14);
    let summed =
        F::nll_loss_with(&F::log_softmax(&xt, 1), &target, Reduction::Sum, None).item::<f64>();
    assert!((summed - b * n as f64).abs() < 1e-12);
    let mse = F::mse_loss_with(&xt, &xt.neg(), Reduction::Sum).item::<f64>();
    assert!((mse - x.iter().map(|v| 4.0 * v * v).sum::<f64>()).abs() < 1e-12);

    // Classes in dimension 1 of a 3-D input; and a single sample of shape [C].
    let (x3, x3t) = f64_tensor(&mut rng, &[2, c, 3]);
    let t3: Vec<i64> = (0..6).map(|_| rng.int(0, c as i64)).collect();
    let got = F::cross_entropy(&x3t, &Tensor::from_vec(t3.clone(), [2, 3])).item::<f64>();
    let mut want = 0.0;
    for b in 0..2 {
        for d in 0..3 {
            let row: Vec<f64> = (0..c).map(|k| x3[(b * c + k) * 3 + d]).collect();
            want -= log_softmax(&row)[t3[b * 3 + d] as usize];
        }
    }
    assert!((got - want / 6.0).abs() < 1e-12);
    let single = F::cross_entropy(&xt.select(0, 0), &Tensor::scalar(t[0])).item::<f64>();
    assert!((single + log_softmax(&x[..c])[t[0] as usize]).abs() < 1e-12);

    let x = Tensor::randn([4, 3]).double();
    let target = Tensor::from_vec(vec![2i64, 0, 1, 1], [4]);
    gradcheck(
        |t| {
            let opts = CrossEntropyOptions { label_smoothing: 0.1, ..Default::default() };
            F::cross_entropy_with(&t[0], &target, opts)
        },
        &[x],
        1e-6,
        1e-6,
    )
    .expect("cross_entropy");
}

#[test]
fn cross_entropy_errors_name_the_fix() {
    let x = Tensor::zeros([4, 3]);
    let e = F::try_cross_entropy_with(&x, &Tensor::zeros([4]), CrossEntropyOptions::default())
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "cross_entropy: the target must hold integer class indices, got f32; for probabilities use a soft-target loss, for float labels convert with .long()"
    );
    let e =
        F::try_cross_entropy_with(&x, &Tensor::from_vec(vec![0i64; 3], [3]), Default::default())
            .unwrap_err();
    assert_eq!(
        e.to_string(),
        "cross_entropy: input of shape [4, 3] (classes in dimension 1) needs a target of shape [4], got [3]"
    );
    let opts = CrossEntropyOptions { label_smoothing: 1.5, ..Default::default() };
    let e = F::try_cross_entropy_with(&x, &Tensor::from_vec(vec![0i64; 4], [4]), opts).unwrap_err();
    assert!(matches!(e, kiln::Error::Value { .. }), "{e}");
    // A class index out of range is found when the loss is computed, naming the gather.
    let loss = F::cross_entropy(&x, &Tensor::from_vec(vec![0i64, 1, 2, 3], [4]));
    let e = loss.try_realize().unwrap_err();
    assert!(e.to_string().contains("gather"), "{e}");
}

#[test]
fn regression_losses_match_a_loop() {
    let mut rng = Rng::new(41);
    let (a, at) = f64_tensor(&mut rng, &[3, 5]);
    let (b, bt) = f64_tensor(&mut rng, &[3, 5]);
    let mse = a.iter().zip(&b).map(|(x, y)| (x - y).powi(2)).sum::<f64>();
    assert!((F::mse_loss(&at, &bt).item::<f64>() - mse / 15.0).abs() < 1e-12);
    let sum = F::try_mse_loss_with(&at, &bt, Reduction::Sum).expect("mse").item::<f64>();
    assert!((sum - mse).abs() < 1e-12);
    let e = F::try_mse_loss_with(&at, &bt.t(), Reduction::Mean).unwrap_err();
    assert_eq!(
        e.to_string(),
        "mse_loss: input shape [3, 5] and target shape [5, 3] differ; reshape or expand the target explicitly"
    );

    // Binary cross-entropy with logits: -(y ln σ(x) + (1-y) ln(1-σ(x))), scaled logits.
    let logits: Vec<f64> = a.iter().map(|v| v * 30.0).collect();
    let probs: Vec<f64> = b.iter().map(|v| (v + 1.0) / 2.0).collect();
    let want: Vec<f64> = logits
        .iter()
        .zip(&probs)
        .map(|(&x, &y)| {
            // ln σ(x) = -ln(1 + e^-x), computed stably on each side.
            let log_sig = |z: f64| if z > 0.0 { -(-z).exp().ln_1p() } else { z - z.exp().ln_1p() };
            -(y * log_sig(x) + (1.0 - y) * log_sig(-x))
        })
        .collect();
    let (lt, pt) = (Tensor::from_vec(logits, [3, 5]), Tensor::from_vec(probs, [3, 5]));
    let got = F::try_binary_cross_entropy_with_logits(&lt, &pt, Reduction::None).expect("bce");
    assert_close_tol(&got.to_vec::<f64>(), &want, 1e-12, "bce");
    gradcheck(
        |t| F::binary_cross_entropy_with_logits(&t[0], &t[1]),
        &[at.clone(), pt.clone()],
        1e-6,
        1e-6,
    )
    .expect("bce grad");
    gradcheck(|t| F::mse_loss(&t[0], &t[1]), &[at, bt], 1e-6, 1e-6).expect("mse grad");
}

#[test]
fn dropout_keeps_scales_and_respects_eval() {
    kiln::manual_seed(9);
    let x = Tensor::ones([100_000]);
    for p in [0.1, 0.5, 0.9] {
        let y = F::dropout(&x, p, true).to_vec::<f32>();
        let kept = y.iter().filter(|&&v| v != 0.0).count() as f64 / y.len() as f64;
        assert!((kept - (1.0 - p)).abs() < 0.01, "p {p}: kept {kept}");
        let scale = (1.0 / (1.0 - p)) as f32;
        assert!(y.iter().all(|&v| v == 0.0 || (v - scale).abs() < 1e-6));
    }
    assert_eq!(F::dropout(&x, 1.0, true).sum().item::<f32>(), 0.0);
    assert_eq!(F::dropout(&x, 0.5, false).sum().item::<f32>(), 100_000.0);
    let mut d = Dropout::new(0.3);
    d.eval();
    assert!(d.forward(&x).shares_storage_with(&x));
    let e = F::try_dropout(&x, 1.5, true).unwrap_err();
    assert_eq!(e.to_string(), "dropout: p must be in [0, 1], got 1.5");
    // The gradient passes through the kept elements only, with the same scale.
    let w = Tensor::ones([1000]).requires_grad_(true);
    let y = F::dropout(&w, 0.5, true);
    y.sum().backward();
    assert_eq!(w.grad().expect("grad").to_vec::<f32>(), y.detach().to_vec::<f32>());
}

#[test]
fn embedding_looks_up_rows_and_accumulates_gradients() {
    kiln::manual_seed(1);
    let emb = Embedding::new(5, 3);
    let table = emb.weight.to_vec::<f32>();
    let ids = Tensor::from_vec(vec![4i64, 0, 4, 2], [2, 2]);
    let out = emb.forward(&ids);
    assert_eq!(out.dims(), &[2, 2, 3]);
    let want: Vec<f32> =
        [4usize, 0, 4, 2].iter().flat_map(|&r| table[r * 3..r * 3 + 3].to_vec()).collect();
    assert_eq!(out.to_vec::<f32>(), want);
    out.sum().backward();
    let counts = [1.0f32, 0.0, 1.0, 0.0, 2.0];
    let grad = emb.weight.grad().expect("grad").to_vec::<f32>();
    assert_eq!(grad, counts.iter().flat_map(|&c| [c; 3]).collect::<Vec<_>>());
    let e = emb.try_forward(&Tensor::zeros([2])).unwrap_err();
    assert!(matches!(e, kiln::Error::DType { op: "Embedding", .. }), "{e}");
}

device_test!(modules_train_as_in_the_reference, super::modules_train_as_in_the_reference_on);

/// A model of kiln's layers, moved to `device` with `Parameters::to`, trains as the reference
/// executor computes it: embedding, layer norm, linear layers, GELU, dropout (in eval mode),
/// cross-entropy and AdamW, eagerly and with `f16` activations.
fn modules_train_as_in_the_reference_on(device: Device) {
    use kiln::nn::{Dropout, Embedding, GELU, LayerNorm, Linear, Module, Parameters, Sequential};
    use kiln::optim::{AdamConfig, AdamW};
    let tokens = Tensor::from_vec((0..24).map(|i| (i * 7 % 11) as i64).collect::<Vec<_>>(), [24]);
    let target = Tensor::from_vec((0..24).map(|i| (i % 5) as i64).collect::<Vec<_>>(), [24]);
    let train = |device: Device| {
        kiln::manual_seed(13);
        let embed = Embedding::new(11, 16);
        let mut body = Sequential::new()
            .with(LayerNorm::new(&[16]))
            .with(Linear::new(16, 32))
            .with(GELU)
            .with(Dropout::new(0.25))
            .with(Linear::new(32, 5));
        let mut embed = embed;
        body.eval();
        embed.to(device).expect("embedding to the device");
        body.to(device).expect("layers to the device");
        let mut params = embed.parameters();
        params.extend(body.parameters());
        assert!(params.iter().all(|p| p.device() == device && p.is_leaf()));
        let mut opt = AdamW::new(params, AdamConfig { lr: 1e-2, ..AdamConfig::adamw() });
        let (tokens, target) = (tokens.to(device), target.to(device));
        let mut losses = Vec::new();
        for _ in 0..4 {
            opt.zero_grad();
            let h = embed.forward(&tokens);
            let logits = body.forward(&h.half()).float();
            let loss = F::cross_entropy(&logits, &target);
            loss.backward();
            opt.step();
            losses.push(loss.item::<f64>());
        }
        (losses, body.parameters()[2].to_vec::<f64>())
    };
    let (want_losses, want_w) =
        kiln::with_execution(kiln::Execution::Reference, || train(Device::Cpu));
    let (losses, w) = train(device);
    assert!(losses[3] < losses[0], "the model learns: {losses:?}");
    // f16 activations: both round the same values, but sums may differ in order.
    assert_close_tol(&losses, &want_losses, 2e-3, "losses");
    assert_close_tol(&w, &want_w, 2e-3, "a weight after four steps");
}
