//! The activations and special functions of transformer code (SiLU, tanh-GELU, softplus,
//! leaky ReLU, ELU, log1p, expm1, sign), RMS norm, and `nn::init`, against f64 references.

use kiln::autograd::gradcheck;
use kiln::nn::functional as F;
use kiln::nn::init::{self, FanMode, Nonlinearity};
use kiln::nn::{ELU, LeakyReLU, Linear, Module, RmsNorm, SiLU, Softplus};
use kiln::prelude::*;

use crate::common::*;

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

type Case = (&'static str, fn(&Tensor) -> Tensor, fn(f64) -> f64);

const CASES: [Case; 8] = [
    ("silu", |t| t.silu(), |x| x * sigmoid(x)),
    (
        "gelu_tanh",
        |t| t.gelu_tanh(),
        |x| {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        },
    ),
    ("softplus", |t| t.softplus(1.0, 20.0), |x| if x > 20.0 { x } else { x.exp().ln_1p() }),
    (
        "softplus beta 2",
        |t| t.softplus(2.0, 5.0),
        |x| if 2.0 * x > 5.0 { x } else { (2.0 * x).exp().ln_1p() / 2.0 },
    ),
    ("leaky_relu", |t| t.leaky_relu(0.1), |x| if x > 0.0 { x } else { 0.1 * x }),
    ("elu", |t| t.elu(1.5), |x| if x > 0.0 { x } else { 1.5 * x.exp_m1() }),
    ("log1p", |t| t.abs().log1p(), |x| x.abs().ln_1p()),
    ("expm1", |t| t.expm1(), f64::exp_m1),
];

#[test]
fn activations_match_f64_references_in_every_layout() {
    let mut rng = Rng::new(121);
    for (name, op, reference) in CASES {
        for dtype in [DType::F32, DType::F64] {
            for layout in LAYOUTS {
                let mut data = values(&mut rng, 7 * 13, dtype);
                // Extremes: tiny, large and exactly-zero inputs.
                data[..6].copy_from_slice(&[0.0, 1e-12, -1e-12, 30.0, -30.0, 1e-30]);
                let data: Vec<f64> = data.iter().map(|&v| round_to(dtype, v)).collect();
                let x = make(&data, &[7, 13], dtype, layout);
                let got = read(&op(&x), dtype);
                let want: Vec<f64> = data.iter().map(|&v| reference(v)).collect();
                let tol = if dtype == DType::F32 { 2e-6 } else { 1e-14 };
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    let scale = w.abs().max(if i < 6 { w.abs() } else { 1.0 });
                    assert!(
                        (g - w).abs() <= tol * scale.max(f64::MIN_POSITIVE) + tol * 1e-3,
                        "{name} {dtype:?} {layout:?} at {}: got {g}, want {w}",
                        data[i]
                    );
                }
            }
        }
    }
}

#[test]
fn log1p_and_expm1_keep_every_digit_near_zero() {
    for x in [1e-300f64, 1e-20, -1e-17, 3e-9, 1e-5, -0.3, 5.0] {
        let t = Tensor::from_vec(vec![x], [1]);
        let (l, e) = (t.log1p().item::<f64>(), t.expm1().item::<f64>());
        assert!((l - x.ln_1p()).abs() <= 4.0 * f64::EPSILON * x.ln_1p().abs(), "log1p({x}) = {l}");
        assert!(
            (e - x.exp_m1()).abs() <= 4.0 * f64::EPSILON * x.exp_m1().abs(),
            "expm1({x}) = {e}"
        );
    }
    assert_eq!(Tensor::from_vec(vec![-800.0f64], [1]).expm1().item::<f64>(), -1.0);
    assert_eq!(Tensor::from_vec(vec![-1.0f64], [1]).log1p().item::<f64>(), f64::NEG_INFINITY);
}

#[test]
fn activations_pass_gradcheck() {
    let mut rng = Rng::new(122);
    // Away from the kinks of leaky ReLU and ELU at 0 and softplus' threshold.
    let data: Vec<f64> = values(&mut rng, 5 * 6, DType::F64)
        .iter()
        .map(|v| if v.abs() < 0.05 { v + 0.1 } else { *v })
        .collect();
    let x = make(&data, &[5, 6], DType::F64, Layout::Permuted);
    for (name, op, _) in CASES {
        if let Err(e) = gradcheck(|t| op(&t[0]), std::slice::from_ref(&x), 1e-6, 1e-6) {
            panic!("{name}: {e}");
        }
    }
    // Tiny inputs take Kahan's branch; their gradient is still the derivative.
    let tiny = tensor(&[1e-17, -3e-18], &[2], DType::F64).requires_grad_(true);
    let g = kiln::grad(&[&(tiny.log1p() + tiny.expm1()).sum()], &[&tiny], false).remove(0);
    assert_close_tol(&g.to_vec::<f64>(), &[2.0, 2.0], 1e-12, "log1p' + expm1' at 0");
}

#[test]
fn sign_and_the_activation_modules() {
    let x = Tensor::from_vec(vec![-2.0f32, 0.0, 3.0, f32::NAN], [4]);
    let s = x.sign().to_vec::<f32>();
    assert_eq!(&s[..3], &[-1.0, 0.0, 1.0]);
    assert!(s[3].is_nan());
    assert_eq!(Tensor::from_vec(vec![-5i64, 0, 7], [3]).sign().to_vec::<i64>(), vec![-1, 0, 1]);
    let x = Tensor::from_vec(vec![-1.0f32, 2.0], [2]);
    assert_eq!(LeakyReLU::default().forward(&x).to_vec::<f32>(), vec![-0.01, 2.0]);
    assert_eq!(ELU::default().forward(&x).to_vec::<f32>(), x.elu(1.0).to_vec::<f32>());
    assert_eq!(
        Softplus::default().forward(&x).to_vec::<f32>(),
        x.softplus(1.0, 20.0).to_vec::<f32>()
    );
    assert_eq!(SiLU.forward(&x).to_vec::<f32>(), F::silu(&x).to_vec::<f32>());
    assert_eq!(F::gelu(&x, true).to_vec::<f32>(), x.gelu_tanh().to_vec::<f32>());
    // They fuse with their neighbors: an affine map, the activation and a scale are one
    // kernel.
    for y in [(&x * 2.0 + 1.0).silu() * 3.0, (&x * 2.0 + 1.0).gelu_tanh() * 3.0] {
        assert_eq!(kiln::debug::plan_summary(&[&y]).kernels, 1);
    }
}

#[test]
fn rms_norm_matches_the_loop_and_passes_gradcheck() {
    let mut rng = Rng::new(123);
    let (rows, d) = (6, 10);
    let data = values(&mut rng, rows * d, DType::F64);
    let w = values(&mut rng, d, DType::F64);
    let x = make(&data, &[2, 3, d], DType::F64, Layout::Sliced);
    let wt = tensor(&w, &[d], DType::F64);
    let y = F::rms_norm(&x, &[d], Some(&wt), Some(1e-6));
    let mut want = vec![0.0; rows * d];
    for r in 0..rows {
        let row = &data[r * d..(r + 1) * d];
        let rms = (row.iter().map(|v| v * v).sum::<f64>() / d as f64 + 1e-6).sqrt();
        for k in 0..d {
            want[r * d + k] = row[k] / rms * w[k];
        }
    }
    assert_close_tol(&y.to_vec::<f64>(), &want, 1e-12, "rms_norm");
    gradcheck(|t| F::rms_norm(&t[0], &[d], Some(&t[1]), None), &[x, wt], 1e-6, 1e-6).unwrap();
    let norm = RmsNorm::new(&[4]);
    assert_eq!(kiln::nn::Parameters::named_parameters(&norm)[0].0, "weight");
    let err = norm.try_forward(&Tensor::zeros([2, 5])).unwrap_err().to_string();
    assert!(
        err.starts_with("rms_norm: the input of shape [2, 5] must end in the normalized shape [4]"),
        "{err}"
    );
}

#[test]
fn init_functions_draw_the_documented_distributions() {
    kiln::manual_seed(7);
    let w = Tensor::zeros([400, 300]);
    let stats = |t: &Tensor| (t.mean().item::<f32>() as f64, t.std().item::<f32>() as f64);

    init::normal_(&w, 1.0, 2.0).unwrap();
    let (m, s) = stats(&w);
    assert!((m - 1.0).abs() < 0.03 && (s - 2.0).abs() < 0.03, "normal_: {m} {s}");

    init::uniform_(&w, -3.0, 1.0).unwrap();
    let v = w.to_vec::<f32>();
    assert!(v.iter().all(|&x| (-3.0..1.0).contains(&x)));
    assert!((stats(&w).1 - 4.0 / 12f64.sqrt()).abs() < 0.02);

    init::trunc_normal_(&w, 0.0, 1.0, -0.5, 2.0).unwrap();
    let v = w.to_vec::<f32>();
    assert!(v.iter().all(|&x| (-0.5..=2.0).contains(&x)));
    assert!(v.iter().any(|&x| x > 1.5) && v.iter().any(|&x| x < -0.45));

    let (fan_in, fan_out) = init::fans(&w).unwrap();
    assert_eq!((fan_in, fan_out), (300, 400));
    init::xavier_uniform_(&w, 1.0).unwrap();
    let bound = (6.0f64 / 700.0).sqrt();
    assert!(w.abs().max().item::<f32>() as f64 <= bound);
    assert!((stats(&w).1 - bound / 3f64.sqrt()).abs() < 0.002);
    init::xavier_normal_(&w, 2.0).unwrap();
    assert!((stats(&w).1 - 2.0 * (2.0f64 / 700.0).sqrt()).abs() < 0.003);
    init::kaiming_normal_(&w, 0.0, FanMode::FanOut, Nonlinearity::ReLU).unwrap();
    assert!((stats(&w).1 - (2.0f64 / 400.0).sqrt()).abs() < 0.002);
    init::kaiming_uniform_(&w, 5f64.sqrt(), FanMode::FanIn, Nonlinearity::LeakyReLU(0.0)).unwrap();
    // PyTorch's nn.Linear default: bound 1/sqrt(fan_in).
    assert!(w.abs().max().item::<f32>() as f64 <= 1.0 / 300f64.sqrt() + 1e-7);

    // Conv weights count the receptive field; parameters stay leaves that require grad.
    let conv = Tensor::zeros([8, 4, 3, 3]);
    assert_eq!(init::fans(&conv).unwrap(), (36, 72));
    let layer = Linear::new(3, 2);
    init::ones_(&layer.weight).unwrap();
    assert_eq!(layer.weight.sum().item::<f32>(), 6.0);
    assert!(layer.weight.requires_grad() && layer.weight.is_leaf());
    assert!(init::fans(&Tensor::zeros([3])).is_err());
    assert!(init::uniform_(&w, 1.0, 0.0).is_err());
    assert!(init::normal_(&Tensor::from_vec(vec![0i64, 0], [2]), 0.0, 1.0).is_err());
    assert!((init::calculate_gain(Nonlinearity::Tanh) - 5.0 / 3.0).abs() < 1e-15);
}

device_test!(
    activations_and_rms_norm_match_the_reference,
    super::activations_and_rms_norm_match_the_reference_on
);

/// The composite activations and special functions, and RMS norm, with their gradients on
/// `device`, against the reference executor.
fn activations_and_rms_norm_match_the_reference_on(device: Device) {
    use kiln::nn::functional as F;
    let mut rng = Rng::new(124);
    let mut data = values(&mut rng, 6 * 9, DType::F64);
    data[..3].copy_from_slice(&[1e-12, -25.0, 25.0]);
    let x = tensor(&data, &[6, 9], DType::F64);
    let run = |x: &Tensor| {
        let x = x.requires_grad_(true);
        let y = x.silu()
            + x.gelu_tanh()
            + x.softplus(1.0, 20.0)
            + x.leaky_relu(0.1)
            + x.elu(1.0)
            + x.abs().log1p()
            + x.clamp_max(5.0).expm1()
            + F::rms_norm(&x, &[9], None, None);
        let g = kiln::grad(&[&y.sum()], &[&x], false).remove(0);
        (y.to_vec::<f64>(), g.to_vec::<f64>(), x.sign().to_vec::<f64>())
    };
    let (want, want_g, want_s) = kiln::with_execution(kiln::Execution::Reference, || run(&x));
    let (got, got_g, got_s) = run(&x.to(device).detach());
    assert_close_tol(&got, &want, 1e-12, "values");
    assert_close_tol(&got_g, &want_g, 1e-12, "gradients");
    assert_eq!(got_s, want_s);
}
