//! Autograd: finite-difference checks of every differentiable op (broadcasting and
//! non-contiguous inputs included), higher-order gradients, and PyTorch's rules.

use kiln::BackwardOptions;
use kiln::autograd::gradcheck;
use kiln::prelude::*;

use crate::common::*;

thread_local! {
    /// Where the gradchecks' inputs live: the CPU, or a GPU for tests/cuda.rs.
    static DEVICE: std::cell::Cell<Device> = const { std::cell::Cell::new(Device::Cpu) };
}

/// Runs `check` with its inputs on `device`: each gradcheck of this file runs on every
/// device (`device_test!`).
fn on_device(device: Device, check: fn()) {
    let before = DEVICE.with(|d| d.replace(device));
    check();
    DEVICE.with(|d| d.set(before));
}

fn input(rng: &mut Rng, shape: &[usize], layout: Layout) -> Tensor {
    let data = values(rng, shape.iter().product(), DType::F64);
    make_on(&data, shape, DType::F64, layout, DEVICE.with(std::cell::Cell::get))
}

fn positive(rng: &mut Rng, shape: &[usize], layout: Layout) -> Tensor {
    let data: Vec<f64> = (0..shape.iter().product()).map(|_| rng.uniform(0.5, 2.5)).collect();
    make_on(&data, shape, DType::F64, layout, DEVICE.with(std::cell::Cell::get))
}

/// An index tensor on the device of `like`.
fn index(values: Vec<i64>, shape: &[usize], like: &Tensor) -> Tensor {
    Tensor::from_vec(values, shape).to(like.device())
}

type F = fn(&[Tensor]) -> Tensor;

device_test!(unary_ops_pass_gradcheck, |device| super::on_device(
    device,
    super::unary_ops_pass_gradcheck
));

fn unary_ops_pass_gradcheck() {
    let mut rng = Rng::new(41);
    let cases: Vec<(&str, F, bool)> = vec![
        ("neg", |x| -&x[0], false),
        ("abs", |x| x[0].abs(), false),
        ("sqrt", |x| x[0].sqrt(), true),
        ("exp", |x| x[0].exp(), false),
        ("log", |x| x[0].log(), true),
        ("sin", |x| x[0].sin(), false),
        ("cos", |x| x[0].cos(), false),
        // Away from the poles at ±π/2, where finite differences break down.
        ("tan", |x| (&x[0] * 0.4).tan(), false),
        ("tanh", |x| x[0].tanh(), false),
        ("sigmoid", |x| x[0].sigmoid(), false),
        ("relu", |x| x[0].relu(), false),
        ("gelu", |x| x[0].gelu(), false),
        ("erf", |x| x[0].erf(), false),
        ("reciprocal", |x| x[0].reciprocal(), true),
        ("square", |x| x[0].square(), false),
        ("pow(2.5)", |x| x[0].pow(2.5), true),
        ("pow(-1.5)", |x| x[0].pow(-1.5), true),
        ("clamp", |x| x[0].clamp(-1.0, 1.0), false),
        ("float cast round trip", |x| x[0].float().double(), false),
    ];
    for (name, f, needs_positive) in cases {
        for layout in LAYOUTS {
            let x = if needs_positive {
                positive(&mut rng, &[3, 4], layout)
            } else {
                input(&mut rng, &[3, 4], layout)
            };
            let tol = if name == "float cast round trip" { 1e-4 } else { 1e-6 };
            let eps = if name == "float cast round trip" { 1e-3 } else { 1e-6 };
            gradcheck(f, &[x], eps, tol).unwrap_or_else(|e| panic!("{name} {layout:?}: {e}"));
        }
    }
}

device_test!(binary_ops_pass_gradcheck_with_broadcasting, |device| super::on_device(
    device,
    super::binary_ops_pass_gradcheck_with_broadcasting
));

fn binary_ops_pass_gradcheck_with_broadcasting() {
    let mut rng = Rng::new(42);
    let cases: Vec<(&str, F)> = vec![
        ("add", |x| &x[0] + &x[1]),
        ("sub", |x| &x[0] - &x[1]),
        ("mul", |x| &x[0] * &x[1]),
        ("div", |x| &x[0] / &x[1]),
        ("maximum", |x| x[0].maximum(&x[1])),
        ("minimum", |x| x[0].minimum(&x[1])),
        ("scalar ops", |x| (2.0 - &x[0]) * 3.0 / (&x[1] * &x[1] + 1.0)),
    ];
    for (name, f) in cases {
        for (sa, sb) in [
            (&[3usize, 4][..], &[3usize, 4][..]),
            (&[3, 1], &[4]),
            (&[2, 3, 4], &[3, 1]),
            (&[], &[2, 3]),
        ] {
            for layout in [Layout::Contiguous, Layout::Permuted, Layout::Sliced] {
                let a = input(&mut rng, sa, layout);
                let b = if name == "div" {
                    positive(&mut rng, sb, layout)
                } else {
                    input(&mut rng, sb, layout)
                };
                gradcheck(f, &[a, b], 1e-6, 1e-6)
                    .unwrap_or_else(|e| panic!("{name} {sa:?} {sb:?} {layout:?}: {e}"));
            }
        }
    }
}

device_test!(reductions_and_movement_pass_gradcheck, |device| super::on_device(
    device,
    super::reductions_and_movement_pass_gradcheck
));

fn reductions_and_movement_pass_gradcheck() {
    let mut rng = Rng::new(43);
    let cases: Vec<(&str, F)> = vec![
        ("sum", |x| x[0].sum()),
        ("sum_dim", |x| x[0].sum_dim([0, 2], false)),
        ("sum_dim keepdim", |x| x[0].sum_dim(1, true) * &x[0]),
        ("mean", |x| x[0].mean()),
        ("mean_dim", |x| x[0].mean_dim(-1, false)),
        ("max", |x| x[0].max()),
        ("max_dim", |x| x[0].max_dim(1, false).0),
        ("min_dim", |x| x[0].min_dim(0, true).0),
        ("min", |x| x[0].min()),
        ("permute", |x| x[0].permute(&[2, 0, 1]).exp()),
        ("transpose", |x| x[0].transpose(0, 2) * 2.0),
        ("reshape", |x| x[0].reshape(&[4, -1]).sin()),
        ("view", |x| x[0].contiguous().view(&[6, 4]).cos()),
        ("flatten", |x| x[0].permute(&[1, 0, 2]).flatten().square()),
        ("expand", |x| x[0].narrow(1, 0, 1).expand(&[2, 5, 4]).tanh()),
        ("narrow", |x| x[0].narrow(2, 1, 2).exp()),
        ("squeeze/unsqueeze", |x| {
            x[0].unsqueeze(1).narrow(3, 1, 1).squeeze(-1).squeeze(1).sigmoid()
        }),
        ("squeeze_all", |x| x[0].narrow(0, 1, 1).squeeze_all() * 3.0),
        ("contiguous", |x| x[0].t_last().contiguous().relu()),
    ];
    for (name, f) in cases {
        for layout in LAYOUTS {
            let x = input(&mut rng, &[2, 3, 4], layout);
            gradcheck(f, &[x], 1e-6, 1e-6).unwrap_or_else(|e| panic!("{name} {layout:?}: {e}"));
        }
    }
}

trait TLast {
    fn t_last(&self) -> Tensor;
}

impl TLast for Tensor {
    fn t_last(&self) -> Tensor {
        self.transpose(-1, -2)
    }
}

device_test!(matmul_passes_gradcheck_in_every_form, |device| super::on_device(
    device,
    super::matmul_passes_gradcheck_in_every_form
));

fn matmul_passes_gradcheck_in_every_form() {
    let mut rng = Rng::new(44);
    let shapes: [(&[usize], &[usize]); 6] = [
        (&[3, 4], &[4, 2]),
        (&[4], &[4]),
        (&[4], &[4, 3]),
        (&[2, 4], &[4]),
        (&[2, 3, 4], &[4, 5]),
        (&[2, 1, 3, 4], &[3, 4, 2]),
    ];
    for (sa, sb) in shapes {
        for layout in [Layout::Contiguous, Layout::Permuted] {
            let a = input(&mut rng, sa, layout);
            let b = input(&mut rng, sb, Layout::Sliced);
            gradcheck(|x| x[0].matmul(&x[1]), &[a, b], 1e-6, 1e-6)
                .unwrap_or_else(|e| panic!("matmul {sa:?} {sb:?}: {e}"));
        }
    }
}

device_test!(second_derivatives_of_math_and_matmul, |device| super::on_device(
    device,
    super::second_derivatives_of_math_and_matmul
));

fn second_derivatives_of_math_and_matmul() {
    let mut rng = Rng::new(45);
    // gradcheck of the gradient: d/dx of (d/dx sum f(x)).
    let cases: Vec<(&str, F)> = vec![
        ("exp", |x| x[0].exp()),
        ("tanh", |x| x[0].tanh()),
        ("sigmoid", |x| x[0].sigmoid()),
        ("sin", |x| x[0].sin()),
        ("gelu", |x| x[0].gelu()),
        ("x^3", |x| x[0].pow(3.0)),
        ("cos", |x| x[0].cos()),
        ("tan", |x| (&x[0] * 0.4).tan()),
        ("erf", |x| x[0].erf()),
        ("log", |x| (x[0].square() + 1.0).log()),
        ("sqrt", |x| (x[0].square() + 1.0).sqrt()),
        ("reciprocal", |x| (x[0].square() + 1.0).reciprocal()),
        ("x^2.5", |x| (x[0].square() + 1.0).pow(2.5)),
        ("x*x.t()", |x| x[0].matmul(&x[0].t()).square()),
        ("log_softmax", |x| x[0].log_softmax(0) * &x[0]),
    ];
    for (name, f) in cases {
        let x = input(&mut rng, &[3, 3], Layout::Permuted);
        let first_grad = |xs: &[Tensor]| kiln::grad(&[&f(xs).sum()], &[&xs[0]], true)[0].clone();
        gradcheck(first_grad, &[x], 1e-6, 1e-5)
            .unwrap_or_else(|e| panic!("second derivative of {name}: {e}"));
    }
}

#[test]
fn classic_first_lessons() {
    // dy/dx of x^2 + 3x + 1 at 2 is 7.
    let x = Tensor::scalar(2.0f32).requires_grad_(true);
    (&x * &x + &x * 3.0 + 1.0).backward();
    assert_eq!(x.grad().unwrap().item::<f32>(), 7.0);
    // Gradients accumulate across backward calls until zero_grad.
    for _ in 0..2 {
        (&x * &x + &x * 3.0 + 1.0).backward();
    }
    assert_eq!(x.grad().unwrap().item::<f32>(), 21.0);
    x.zero_grad();
    assert!(x.grad().is_none());
    (&x * &x).backward();
    assert_eq!(x.grad().unwrap().item::<f32>(), 4.0);
    // d2/dx2 of x^3 at 3 is 18.
    let x = Tensor::scalar(3.0f64).requires_grad_(true);
    let dy = kiln::grad(&[&x.pow(3.0)], &[&x], true).remove(0);
    assert_eq!(dy.item::<f64>(), 27.0);
    dy.backward();
    assert_eq!(x.grad().unwrap().item::<f64>(), 18.0);
}

#[test]
fn leaf_rules_and_errors() {
    let x = Tensor::ones([2, 2]).requires_grad_(true);
    assert!(x.is_leaf() && x.requires_grad());
    let y = (&x * 2.0).sum();
    assert!(!y.is_leaf() && y.requires_grad());
    let z = &x * 2.0;
    assert!(z.grad().is_none());
    let err = z.try_requires_grad_(false).unwrap_err().to_string();
    assert!(err.starts_with("requires_grad_: can only change the flag of leaf tensors"), "{err}");
    let err = Tensor::from_vec(vec![1i64], [1]).try_requires_grad_(true).unwrap_err().to_string();
    assert_eq!(err, "requires_grad_: only floating-point tensors can require gradients, got i64");
    // Non-scalar outputs need an explicit gradient.
    let err = z.try_backward().unwrap_err().to_string();
    assert!(
        err.starts_with(
            "backward: a gradient can be created implicitly only for one-element outputs"
        ),
        "{err}"
    );
    z.backward_with(Some(&Tensor::full([2, 2], 0.5)), BackwardOptions::default());
    assert_eq!(x.grad().unwrap().to_vec::<f32>(), vec![1.0; 4]);
    // A second backward without retain_graph fails and says what to do.
    let w = Tensor::ones([3]).requires_grad_(true);
    let loss = w.exp().sum();
    loss.backward();
    let err = loss.try_backward().unwrap_err().to_string();
    assert!(
        err.contains("backward through the graph a second time") && err.contains("retain_graph"),
        "{err}"
    );
    // With retain_graph it works and accumulates.
    let loss = w.exp().sum();
    loss.backward_with(None, BackwardOptions { retain_graph: true, create_graph: false });
    loss.backward();
    let e = 1f32.exp();
    assert!(w.grad().unwrap().to_vec::<f32>().iter().all(|g| (g - 3.0 * e).abs() < 1e-5));
    // A tensor that does not require grad cannot start a backward pass.
    let err = Tensor::ones([1]).try_backward().unwrap_err().to_string();
    assert!(err.starts_with("backward: the output (shape [1]) does not require grad"), "{err}");
    // Integer results (comparisons, argmax) carry no gradient.
    assert!(!x.gt(0.5).requires_grad());
    assert!(!x.argmax(0, false).requires_grad());
}

#[test]
fn retain_grad_detach_and_no_grad() {
    let x = Tensor::from_vec(vec![1.0f64, 2.0], [2]).requires_grad_(true);
    let h = &x * 3.0;
    h.retain_grad();
    let y = h.square().sum();
    y.backward();
    assert_eq!(h.grad().unwrap().to_vec::<f64>(), vec![6.0, 12.0]);
    assert_eq!(x.grad().unwrap().to_vec::<f64>(), vec![18.0, 36.0]);
    let d = h.detach();
    assert!(d.is_leaf() && !d.requires_grad() && d.shares_storage_with(&h));
    let inside = kiln::no_grad(|| {
        assert!(!kiln::is_grad_enabled());
        let nested = kiln::enable_grad(|| (&x * 2.0).requires_grad());
        assert!(nested);
        &x * 2.0
    });
    assert!(!inside.requires_grad());
    assert!(kiln::is_grad_enabled());
    {
        let _guard = NoGradGuard::new();
        assert!(!(&x + 1.0).requires_grad());
        let _inner = kiln::InferenceModeGuard::new();
        assert!(!(&x + 1.0).requires_grad());
    }
    assert!((&x + 1.0).requires_grad());
    // The mode is restored when a panic unwinds through no_grad.
    let _ = std::panic::catch_unwind(|| kiln::no_grad(|| panic!("inside")));
    assert!(kiln::is_grad_enabled());
    assert!(!kiln::inference_mode(|| (&x * 2.0).requires_grad()));
}

#[test]
fn grad_rejects_unused_inputs() {
    let x = Tensor::ones([2]).requires_grad_(true);
    let unused = Tensor::ones([2]).requires_grad_(true);
    let err = kiln::try_grad(&[&x.sum()], &[&x, &unused], false).unwrap_err().to_string();
    assert!(err.starts_with("grad: input 1 (shape [2]) was not used"), "{err}");
}

#[test]
fn display_shows_autograd_state() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0], [2]).requires_grad_(true);
    assert_eq!(x.to_string(), "tensor([1., 2.], requires_grad=True)");
    assert_eq!((&x * 2.0).to_string(), "tensor([2., 4.], grad_fn=<mul>)");
}

#[test]
fn max_gradients_follow_pytorch_on_ties() {
    let x = Tensor::from_vec(vec![1.0f64, 3.0, 3.0, 2.0, 0.0, 2.0], [2, 3]).requires_grad_(true);
    // max_dim routes the gradient to the returned (first) index only.
    let (values, indices) = x.max_dim(1, false);
    assert_eq!(indices.to_vec::<i64>(), vec![1, 0]);
    values.sum().backward();
    assert_eq!(x.grad().unwrap().to_vec::<f64>(), vec![0.0, 1.0, 0.0, 1.0, 0.0, 0.0]);
    x.zero_grad();
    // max() over everything shares the gradient evenly among the tied maxima.
    x.max().backward();
    assert_eq!(x.grad().unwrap().to_vec::<f64>(), vec![0.0, 0.5, 0.5, 0.0, 0.0, 0.0]);
    x.zero_grad();
    x.min_dim(0, true).0.sum().backward();
    assert_eq!(x.grad().unwrap().to_vec::<f64>(), vec![1.0, 0.0, 0.0, 0.0, 1.0, 1.0]);
}

#[test]
fn where_and_pow_edge_cases_pass_gradcheck() {
    let mut rng = Rng::new(46);
    for layout in LAYOUTS {
        let a = input(&mut rng, &[3, 4], layout);
        let b = input(&mut rng, &[4], Layout::Contiguous);
        gradcheck(|x| Tensor::where_(&x[0].gt(&x[1]), &x[0], &(&x[1] * 2.0)), &[a, b], 1e-6, 1e-6)
            .unwrap_or_else(|e| panic!("where {layout:?}: {e}"));
    }
    // Negative bases with integer exponents, and the gradient at 0.
    let x = Tensor::from_vec(vec![-2.0f64, -0.5, 1.5], [3]);
    gradcheck(|x| x[0].pow(3.0), std::slice::from_ref(&x), 1e-6, 1e-6).unwrap();
    gradcheck(|x| x[0].pow(-2.0), &[x], 1e-6, 1e-6).unwrap();
    let z = Tensor::zeros([2]).double().requires_grad_(true);
    z.pow(2.0).sum().backward();
    assert_eq!(z.grad().unwrap().to_vec::<f64>(), vec![0.0, 0.0]);
    let z = Tensor::zeros([1]).double().requires_grad_(true);
    z.pow(0.0).sum().backward();
    assert_eq!(z.grad().unwrap().to_vec::<f64>(), vec![0.0], "no gradient through a zero exponent");
}

/// A gather's gradient picks each line's own position where an `f32` count of positions
/// would round two of them together (past 2^24 classes).
#[test]
fn a_picked_gradient_lands_on_its_position_past_exact_f32_integers() {
    let classes = (1usize << 24) + 2;
    let x = Tensor::zeros([2, classes]).requires_grad_(true);
    let last = classes as i64 - 1;
    let picked = x.gather(1, &Tensor::from_vec(vec![last, last - 1], [2, 1]));
    (picked * Tensor::from_vec(vec![2.0f32, 3.0], [2, 1])).sum().backward();
    let grad = x.grad().expect("a gradient");
    assert_eq!(grad.argmax(1, false).to_vec::<i64>(), [last, last - 1]);
    assert_eq!(grad.sum_dim(1, false).to_vec::<f32>(), [2.0, 3.0]);
}

device_test!(selection_ops_pass_gradcheck, |device| super::on_device(
    device,
    super::selection_ops_pass_gradcheck
));

fn selection_ops_pass_gradcheck() {
    let mut rng = Rng::new(47);
    let cases: Vec<(&str, F)> = vec![
        ("i(..)", |x| x[0].i((1.., 1..3)).exp()),
        ("select", |x| x[0].select(1, -1).square()),
        ("gather", |x| x[0].gather(1, &index(vec![2, 0, 1, 1, 3, 0], &[3, 2], &x[0])).exp()),
        // One element per line (cross-entropy's pattern): the gradient is a select, not a
        // scatter, along either axis.
        ("gather one per row", |x| x[0].gather(1, &index(vec![2, 0, 3], &[3, 1], &x[0])).exp()),
        ("gather one per column", |x| {
            x[0].gather(0, &index(vec![1, 2, 0, 2], &[1, 4], &x[0])).exp()
        }),
        ("index_select", |x| x[0].index_select(0, &index(vec![2, 0, 2], &[3], &x[0])).sin()),
        ("masked_select", |x| x[0].masked_select(&x[0].gt(0.0)).square()),
        ("masked_fill", |x| x[0].masked_fill(&x[0].lt(0.0), 1.5) * &x[0]),
        ("cat", |x| Tensor::cat(&[&x[0], &x[0].exp(), &x[0].narrow(0, 0, 1)], 0).tanh()),
        ("stack", |x| Tensor::stack(&[&x[0], &x[0].t().t()], 1).sigmoid()),
        ("split", |x| {
            let parts = x[0].split(2, 1);
            &parts[0] * &parts[1]
        }),
        ("repeat", |x| x[0].repeat(&[2, 1, 2]).square()),
        ("flip", |x| x[0].flip(&[0, 1]) * &x[0]),
        ("tril", |x| x[0].tril(0).exp()),
        ("triu", |x| x[0].triu(1) * 3.0),
        // Distinct positions per row: with repeated positions the gradient of scatter is
        // undefined (PyTorch's too).
        ("scatter base and src", |x| {
            x[0].scatter(
                1,
                &index(vec![2, 0, 1, 3, 3, 0], &[3, 2], &x[0]),
                x[0].narrow(1, 0, 2).exp(),
            )
        }),
        ("scatter_add", |x| {
            x[0].scatter_add(1, &index(vec![2, 2, 1, 1, 3, 0], &[3, 2], &x[0]), &x[0].square())
        }),
    ];
    for (name, f) in cases {
        for layout in LAYOUTS {
            let x = input(&mut rng, &[3, 4], layout);
            gradcheck(f, &[x], 1e-6, 1e-6).unwrap_or_else(|e| panic!("{name} {layout:?}: {e}"));
        }
    }
}

device_test!(composite_reductions_pass_gradcheck, |device| super::on_device(
    device,
    super::composite_reductions_pass_gradcheck
));

fn composite_reductions_pass_gradcheck() {
    let mut rng = Rng::new(48);
    let cases: Vec<(&str, F)> = vec![
        ("softmax", |x| x[0].softmax(1) * &x[0]),
        ("softmax dim 0", |x| x[0].softmax(0).square()),
        ("log_softmax", |x| x[0].log_softmax(-1) * &x[0]),
        ("logsumexp", |x| x[0].logsumexp([0, 1], false)),
        ("var", |x| x[0].var_dim(1, true) * &x[0]),
        ("std", |x| x[0].std()),
        ("prod", |x| x[0].prod_dim(1, false)),
        ("amax", |x| x[0].amax([0, 1], false)),
        ("amin", |x| x[0].amin(0, true) * &x[0]),
        ("cumsum", |x| x[0].cumsum(1) * &x[0]),
        ("einsum ij,jk", |x| kiln::einsum("ij,kj->ik", &[&x[0], &x[0]])),
        ("einsum three", |x| {
            kiln::einsum("ij,jk,ki->", &[&x[0], &x[0].t(), &x[0].narrow(1, 0, 3)])
        }),
        ("einsum diagonal", |x| kiln::einsum("ii->i", &[&x[0].narrow(1, 0, 3)]).exp()),
    ];
    for (name, f) in cases {
        for layout in LAYOUTS {
            let x = input(&mut rng, &[3, 4], layout);
            gradcheck(f, &[x], 1e-6, 1e-6).unwrap_or_else(|e| panic!("{name} {layout:?}: {e}"));
        }
    }
    // prod with zeros: exactly one zero gets the product of the others, two zeros give 0.
    let x = Tensor::from_vec(vec![2.0f64, 0.0, 3.0, 0.0, 0.0, 5.0], [2, 3]).requires_grad_(true);
    x.prod_dim(1, false).sum().backward();
    assert_eq!(x.grad().expect("a gradient").to_vec::<f64>(), vec![0.0, 6.0, 0.0, 0.0, 0.0, 0.0]);
    gradcheck(|x| x[0].prod(), &[Tensor::from_vec(vec![2.0f64, 0.0, 3.0], [3])], 1e-6, 1e-6)
        .expect("prod through a zero");
    // Second derivatives of softmax.
    let x = input(&mut rng, &[2, 3], Layout::Permuted);
    let first = |xs: &[Tensor]| {
        kiln::grad(&[&(xs[0].softmax(1) * &xs[0]).sum()], &[&xs[0]], true).remove(0)
    };
    gradcheck(first, &[x], 1e-6, 1e-5).expect("second derivatives of softmax");
}

/// gradcheck differentiates through the caller's layout: `f` sees the permuted or sliced
/// strides on every call (the analytic one and each perturbed one), and an input whose
/// elements share memory is refused with the fix.
#[test]
fn gradcheck_keeps_the_callers_layout() {
    let mut rng = Rng::new(44);
    for layout in [Layout::Permuted, Layout::Sliced] {
        let x = input(&mut rng, &[3, 4], layout);
        let (strides, offset) = (x.stride(), x.storage_offset());
        let seen = std::sync::Mutex::new(Vec::new());
        gradcheck(
            |xs| {
                seen.lock().unwrap().push((xs[0].stride(), xs[0].storage_offset()));
                (xs[0].tanh() * &xs[0]).sum_dim(1, false)
            },
            &[x],
            1e-6,
            1e-6,
        )
        .unwrap();
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen.len(), 1 + 2 * 12, "{layout:?}: one analytic call, two per element");
        assert!(seen.iter().all(|s| *s == (strides.clone(), offset)), "{layout:?}: {seen:?}");
    }
    let expanded = Tensor::from_vec(vec![1.0f64, 2.0], [2, 1]).expand(&[2, 3]);
    let err = gradcheck(|xs| xs[0].exp(), &[expanded], 1e-6, 1e-6).unwrap_err().to_string();
    assert!(err.contains("share memory") && err.contains(".contiguous()"), "{err}");
}

#[test]
fn in_place_autograd_rules() {
    // In place on a leaf that requires grad is an error, with the fix.
    let w = Tensor::ones([2]).requires_grad_(true);
    let err = w.try_add_(1.0).unwrap_err().to_string();
    assert!(
        err.starts_with("add_: a leaf tensor that requires grad cannot be modified in place"),
        "{err}"
    );
    kiln::no_grad(|| w.add_(1.0));
    assert_eq!(w.to_vec::<f32>(), vec![2.0, 2.0]);
    // In place on a non-leaf rewrites its history: d/dx sum((2x * 3) * x) = 12x.
    let x = Tensor::from_vec(vec![1.0f64, -2.0], [2]).requires_grad_(true);
    let y = &x * 2.0;
    y.mul_(3.0);
    y.mul_(&x);
    assert!(!y.is_leaf());
    y.sum().backward();
    assert_eq!(x.grad().unwrap().to_vec::<f64>(), vec![12.0, -24.0]);
    // A leaf that does not require grad becomes part of the graph when written with one that does.
    let acc = Tensor::zeros([2]).double();
    acc.add_(&(&x * 5.0));
    assert!(acc.requires_grad() && !acc.is_leaf());
    x.zero_grad();
    acc.sum().backward();
    assert_eq!(x.grad().unwrap().to_vec::<f64>(), vec![5.0, 5.0]);
    // Modifying a tensor that backward needs makes backward fail, naming the op and versions.
    let x = Tensor::ones([2]).requires_grad_(true);
    let y = &x * 2.0;
    let z = &y * &y;
    y.add_(1.0);
    let err = z.sum().try_backward().unwrap_err().to_string();
    assert!(err.contains("of `mul`") && err.contains("modified by an in-place operation"), "{err}");
    assert!(err.contains("version 1") && err.contains("version 0"), "{err}");
    // Ops that do not read their inputs' values are unaffected (as in PyTorch).
    let x = Tensor::ones([2]).requires_grad_(true);
    let y = &x * 2.0;
    let z = &y + 1.0;
    y.add_(1.0);
    z.sum().backward();
    assert_eq!(x.grad().unwrap().to_vec::<f32>(), vec![2.0, 2.0]);
    // A result recorded before a write differentiates the values it read: its gradient
    // flows into the history the tensor had then, not into the write's. d/dx of sum(2x + 1)
    // is 2 whatever y.mul_(3) did to y afterwards; y's own sum adds 6.
    let x = Tensor::ones([2]).requires_grad_(true);
    let y = &x * 2.0;
    let z = &y + 1.0;
    y.mul_(3.0);
    (z.sum() + y.sum()).backward();
    assert_eq!(x.grad().unwrap().to_vec::<f32>(), vec![8.0, 8.0]);
    // A view taken before a write through another handle of its storage reads the new
    // values and takes its history from the write (as PyTorch's views do).
    let x = Tensor::from_vec(vec![1.0f64, 2.0], [2]).requires_grad_(true);
    let y = &x * 1.0;
    let (view_line, v, u) = (line!(), y.narrow(0, 0, 1), y.narrow(0, 0, 1));
    let write_line = line!() + 1;
    y.mul_(3.0);
    assert_eq!(v.to_vec::<f64>(), vec![3.0]);
    v.sum().backward();
    assert_eq!(x.grad().unwrap().to_vec::<f64>(), vec![3.0, 0.0]);
    // After a later write without history (under no_grad), the view's values are no
    // longer that history's: backward refuses it, naming the view's line and the write's.
    kiln::no_grad(|| y.add_(1.0));
    let err = u.sum().try_backward().unwrap_err().to_string();
    assert!(err.starts_with("backward: a tensor of shape [1] made by `view`"), "{err}");
    assert!(err.contains(&format!("autograd.rs:{view_line}:")), "{err}");
    assert!(err.contains(&format!("autograd.rs:{write_line}:")), "{err}");
    // Writing into part of a tensor that requires grad differentiates through the write
    // (PyTorch's CopySlices): the filled element gets no gradient, the others theirs.
    let x = Tensor::ones([3]).requires_grad_(true);
    let h = &x * 2.0;
    h.narrow(0, 0, 1).fill_(0.0);
    h.sum().backward();
    assert_eq!(x.grad().unwrap().to_vec::<f32>(), vec![0.0, 2.0, 2.0]);
    // A view of a leaf that requires grad may not be written (as in PyTorch).
    let leaf = Tensor::ones([3]).requires_grad_(true);
    let err = leaf.narrow(0, 0, 1).try_fill_(0.0).unwrap_err().to_string();
    assert!(err.starts_with("fill_: a view of a leaf tensor that requires grad"), "{err}");
    // Overwriting a whole non-leaf with a constant cuts the gradient to zero.
    let x = Tensor::ones([2]).double().requires_grad_(true);
    let y = &x * 2.0;
    y.fill_(5.0);
    assert!(y.requires_grad());
    (&y * &x).sum().backward();
    assert_eq!(x.grad().unwrap().to_vec::<f64>(), vec![5.0, 5.0]);
}

/// The gradient of one tensor read through several slices (q, k and v of one projection,
/// split into heads) is the slices' gradients side by side; slices that overlap add up.
#[test]
fn slices_of_one_tensor_get_their_gradients_side_by_side() {
    let mut rng = Rng::new(45);
    let (b, t, h, dh) = (2usize, 5usize, 2usize, 3usize);
    let d = h * dh;
    let data = values(&mut rng, b * t * 3 * d, DType::F64);
    let weights: Vec<Vec<f64>> = (0..3).map(|_| values(&mut rng, b * t * d, DType::F64)).collect();
    let x = tensor(&data, &[b, t, 3 * d], DType::F64).requires_grad_(true);
    let head = |i: usize| {
        x.narrow(2, i * d, d).reshape(&[b as i64, t as i64, h as i64, dh as i64]).transpose(1, 2)
    };
    let w = |i: usize| {
        tensor(&weights[i], &[b, t, d], DType::F64)
            .reshape(&[b as i64, t as i64, h as i64, dh as i64])
            .transpose(1, 2)
    };
    let loss = (head(0) * w(0)).sum() + (head(1) * w(1)).sum() + head(2).exp().sum();
    let (_, profile) = kiln::profile(|| loss.backward());
    let got = x.grad().expect("a gradient").to_vec::<f64>();
    for (flat, g) in got.iter().enumerate() {
        let (row, col) = (flat / (3 * d), flat % (3 * d));
        let (which, c) = (col / d, col % d);
        let want = match which {
            0 | 1 => weights[which][row * d + c],
            _ => data[flat].exp(),
        };
        assert!((g - want).abs() <= 1e-12 * want.abs().max(1.0), "at {flat}: {g} vs {want}");
    }
    // Written into one buffer, not added up from three zero-padded ones.
    let kinds: Vec<&str> = profile.events().iter().map(|e| e.name.as_str()).collect();
    assert_eq!(kinds.iter().filter(|&&k| k == "assign").count(), 2, "{profile}");

    // Overlapping slices add where they meet; checked against finite differences too.
    let x = tensor(&data[..30], &[3, 10], DType::F64).requires_grad_(true);
    let loss = (x.narrow(1, 0, 6).tanh().sum() + x.narrow(1, 4, 6).exp().sum()).realize().clone();
    loss.backward();
    let got = x.grad().expect("a gradient").to_vec::<f64>();
    for (flat, g) in got.iter().enumerate() {
        let (col, v) = (flat % 10, data[flat]);
        let mut want = 0.0;
        if col < 6 {
            want += 1.0 - v.tanh().powi(2);
        }
        if col >= 4 {
            want += v.exp();
        }
        assert!((g - want).abs() <= 1e-12 * want.abs().max(1.0), "at {flat}: {g} vs {want}");
    }
    let x = tensor(&data[..30], &[3, 10], DType::F64);
    gradcheck(
        |xs| xs[0].narrow(1, 0, 4).sin().sum() + xs[0].narrow(1, 4, 6).square().sum(),
        &[x],
        1e-6,
        1e-6,
    )
    .unwrap();
}

device_test!(gradients_pass_gradcheck_in_f64, super::gradients_pass_gradcheck_in_f64_on);

/// A product, tanh, log-softmax and sigmoid, and a second derivative, through `gradcheck`
/// with the inputs on `device`.
fn gradients_pass_gradcheck_in_f64_on(device: Device) {
    let mut rng = Rng::new(9);
    let x = tensor(&values(&mut rng, 12, DType::F64), &[3, 4], DType::F64).to(device);
    let w = tensor(&values(&mut rng, 20, DType::F64), &[4, 5], DType::F64).to(device);
    let f = |xs: &[Tensor]| {
        let h = (xs[0].matmul(&xs[1]) * 0.5 + 0.1).tanh();
        (h.log_softmax(1) * h.sigmoid()).sum_dim(0, false)
    };
    kiln::autograd::gradcheck(f, &[x.clone(), w.clone()], 1e-6, 1e-6).expect("first derivatives");
    // Higher order: the gradient of a gradient, on the device.
    let g = |xs: &[Tensor]| {
        let y = (xs[0].tanh() * &xs[0]).sum();
        kiln::autograd::grad(&[&y], &[&xs[0]], true).remove(0)
    };
    kiln::autograd::gradcheck(g, &[x], 1e-6, 1e-6).expect("second derivatives");
}
