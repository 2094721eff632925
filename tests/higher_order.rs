//! Higher-order gradients, where kiln goes beyond its peers: Hessian-vector products,
//! gradient penalties and second derivatives of networks, each checked numerically.

use kiln::prelude::*;

use crate::common::*;

fn randn(rng: &mut Rng, shape: &[usize]) -> Tensor {
    let n = shape.iter().product();
    tensor(&(0..n).map(|_| rng.uniform(-1.5, 1.5)).collect::<Vec<_>>(), shape, DType::F64)
}

#[test]
fn hessian_vector_product_matches_finite_differences() {
    let mut rng = Rng::new(71);
    let a = randn(&mut rng, &[5, 5]);
    let f = |x: &Tensor| a.matmul(x).tanh().square().sum() + x.pow(3.0).sum();
    let x = randn(&mut rng, &[5]);
    let v = randn(&mut rng, &[5]);
    assert_hvp_matches_differences(&f, &x, &v, "Hessian-vector product");
}

/// The Hessian-vector product `H(f)(x) v`, from the gradient's own graph, equals central
/// differences of the gradient along `v`.
fn assert_hvp_matches_differences(
    f: &dyn Fn(&Tensor) -> Tensor,
    x: &Tensor,
    v: &Tensor,
    context: &str,
) {
    let x = x.detach().requires_grad_(true);
    let g = kiln::grad(&[&f(&x)], &[&x], true).remove(0);
    let hv = kiln::grad(&[&(&g * v).sum()], &[&x], false).remove(0).to_vec::<f64>();
    let grad_at = |p: Tensor| {
        let p = p.detach().requires_grad_(true);
        kiln::grad(&[&f(&p)], &[&p], false).remove(0).to_vec::<f64>()
    };
    let eps = 1e-5;
    let plus = grad_at(&x.detach() + &(v * eps));
    let minus = grad_at(&x.detach() - &(v * eps));
    let numeric: Vec<f64> = plus.iter().zip(&minus).map(|(p, m)| (p - m) / (2.0 * eps)).collect();
    assert_close_tol(&hv, &numeric, 1e-6, context);
}

/// `tanh(x W1 + b1) W2 + b2` with its parameters.
fn net(rng: &mut Rng, hidden: usize) -> Vec<Tensor> {
    [vec![1, hidden], vec![hidden], vec![hidden, 1], vec![1]]
        .iter()
        .map(|s| (randn(rng, s) * 0.8).requires_grad_(true))
        .collect()
}

fn forward(p: &[Tensor], x: &Tensor) -> Tensor {
    (x.matmul(&p[0]) + &p[1]).tanh().matmul(&p[2]) + &p[3]
}

#[test]
fn second_derivative_of_a_network_matches_the_analytic_one() {
    let mut rng = Rng::new(72);
    let p = net(&mut rng, 6);
    let x = tensor(&[-1.0, -0.3, 0.2, 0.9], &[4, 1], DType::F64).requires_grad_(true);
    let u = forward(&p, &x);
    let du = kiln::grad(&[&u.sum()], &[&x], true).remove(0);
    let d2u = kiln::grad(&[&du.sum()], &[&x], true).remove(0);
    let analytic = kiln::no_grad(|| {
        let t = (x.matmul(&p[0]) + &p[1]).tanh();
        (&t * -2.0 * (1.0 - t.square()) * p[0].square()).matmul(&p[2])
    });
    assert_close_tol(&d2u.to_vec::<f64>(), &analytic.to_vec::<f64>(), 1e-10, "d2u/dx2");
    // A physics-style residual loss (u'' + u = 0) differentiates with respect to the
    // parameters through the second derivative.
    let residual = (&d2u + &u).square().mean();
    residual.backward();
    for (i, q) in p.iter().enumerate() {
        let g = q.grad().unwrap_or_else(|| panic!("parameter {i} has a gradient"));
        assert!(g.to_vec::<f64>().iter().all(|v| v.is_finite()));
    }
    // And that gradient is right: check it numerically for the first weight matrix.
    let loss_with = |w1: &Tensor| {
        let params = [w1.clone(), p[1].detach(), p[2].detach(), p[3].detach()];
        let x = x.detach().requires_grad_(true);
        let u = forward(&params, &x);
        let du = kiln::grad(&[&u.sum()], &[&x], true).remove(0);
        let d2u = kiln::grad(&[&du.sum()], &[&x], true).remove(0);
        (&d2u + &u).square().mean()
    };
    kiln::autograd::gradcheck(|xs| loss_with(&xs[0]), &[p[0].detach()], 1e-6, 1e-5).unwrap();
}

#[test]
fn a_gradient_penalty_trains() {
    let mut rng = Rng::new(73);
    let p = net(&mut rng, 8);
    let xs = Tensor::linspace(-2.0, 2.0, 16).double().view(&[16, 1]);
    let target = xs.sin();
    let mut losses = Vec::new();
    for _ in 0..25 {
        let x = xs.detach().requires_grad_(true);
        let out = forward(&p, &x);
        let dx = kiln::grad(&[&out.sum()], &[&x], true).remove(0);
        let loss = (&out - &target).square().mean() + (dx.abs() - 1.0).square().mean() * 0.1;
        loss.backward();
        losses.push(loss.item::<f64>());
        kiln::no_grad(|| {
            for q in &p {
                let g = q.grad().expect("every parameter is used");
                q.sub_(&g * 0.05);
                q.zero_grad();
            }
        });
    }
    assert!(losses[24] < losses[0] * 0.5, "the penalized loss should fall: {losses:?}");
}

/// Second derivatives through the normalizations: a Hessian-vector product through
/// training-mode batch norm (whose statistics depend on the input) and through layer norm
/// matches finite differences of the gradient, so their formulations stay exact beyond the
/// first derivative.
#[test]
fn hessian_vector_products_through_normalizations() {
    use kiln::nn::functional::{self as F, BatchNormOptions};
    let mut rng = Rng::new(72);
    let w = randn(&mut rng, &[3]);
    let b = randn(&mut rng, &[3]);
    let r = randn(&mut rng, &[4, 3, 5]);
    let train = BatchNormOptions { training: true, ..Default::default() };
    let batch_norm =
        |x: &Tensor| (F::batch_norm(x, None, None, Some(&w), Some(&b), train) * &r).tanh().sum();
    let layer_norm = |x: &Tensor| (F::layer_norm(x, &[5], None, None, 1e-5) * &r).tanh().sum();
    let (x, v) = (randn(&mut rng, &[4, 3, 5]), randn(&mut rng, &[4, 3, 5]));
    assert_hvp_matches_differences(&batch_norm, &x, &v, "batch_norm");
    let (x, v) = (randn(&mut rng, &[4, 3, 5]), randn(&mut rng, &[4, 3, 5]));
    assert_hvp_matches_differences(&layer_norm, &x, &v, "layer_norm");
}
