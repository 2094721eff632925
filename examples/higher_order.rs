//! Higher-order gradients: a Hessian-vector product, a gradient penalty trained for a few
//! steps, and a physics-style loss built on d2u/dx2 of a small network.
//!
//! Run with `cargo run --release --example higher_order`.

use kiln::prelude::*;

/// A one-hidden-layer tanh network `u(x) = tanh(x W1 + b1) W2 + b2` on `[n, 1]` inputs.
struct Net {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

impl Net {
    fn new(hidden: usize) -> Net {
        Net {
            w1: Tensor::randn([1, hidden]).double().requires_grad_(true),
            b1: Tensor::randn([hidden]).double().requires_grad_(true),
            w2: (Tensor::randn([hidden, 1]) * 0.5).double().requires_grad_(true),
            b2: Tensor::zeros([1]).double().requires_grad_(true),
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        (x.matmul(&self.w1) + &self.b1).tanh().matmul(&self.w2) + &self.b2
    }

    fn parameters(&self) -> [&Tensor; 4] {
        [&self.w1, &self.b1, &self.w2, &self.b2]
    }

    /// One step of plain gradient descent.
    fn step(&self, lr: f64) {
        kiln::no_grad(|| {
            for p in self.parameters() {
                if let Some(g) = p.grad() {
                    p.sub_(&g * lr);
                }
                p.zero_grad();
            }
        });
    }
}

fn main() -> kiln::Result<()> {
    kiln::manual_seed(7);

    // 1. Hessian-vector product of f(x) = sum(tanh(A x)^2): H v = d/dx (grad f . v),
    //    checked against central differences of the gradient.
    let a = Tensor::randn([4, 4]).double();
    let f = |x: &Tensor| a.matmul(x).tanh().square().sum();
    let x = Tensor::randn([4]).double().requires_grad_(true);
    let v = Tensor::randn([4]).double();
    let g = kiln::try_grad(&[&f(&x)], &[&x], true)?.remove(0);
    let hv = kiln::try_grad(&[&(&g * &v).sum()], &[&x], false)?.remove(0).to_vec::<f64>();
    let eps = 1e-5;
    let grad_at = |p: Tensor| -> kiln::Result<Vec<f64>> {
        let p = p.detach().requires_grad_(true);
        kiln::try_grad(&[&f(&p)], &[&p], false)?.remove(0).try_to_vec()
    };
    let plus = grad_at(&x.detach() + &(&v * eps))?;
    let minus = grad_at(&x.detach() - &(&v * eps))?;
    let numeric: Vec<f64> = plus.iter().zip(&minus).map(|(p, m)| (p - m) / (2.0 * eps)).collect();
    let err = hv.iter().zip(&numeric).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    println!(
        "1. Hessian-vector product {hv:.5?}\n   finite differences      {numeric:.5?}  (max difference {err:.1e})"
    );

    // 2. A gradient penalty: push |d D(x) / dx| toward 1 while fitting D to a target.
    let net = Net::new(8);
    let xs = Tensor::linspace(-2.0, 2.0, 16).double().view(&[16, 1]);
    let target = xs.sin();
    for step in 0..30 {
        let x = xs.detach().requires_grad_(true);
        let out = net.forward(&x);
        let fit = (&out - &target).square().mean();
        let dx = kiln::try_grad(&[&out.sum()], &[&x], true)?.remove(0);
        let penalty = (dx.abs() - 1.0).square().mean();
        let loss = &fit + &(&penalty * 0.1);
        loss.try_backward()?;
        net.step(0.05);
        if step % 10 == 0 || step == 29 {
            println!(
                "2. step {step:2}: fit {:.5}  penalty {:.5}",
                fit.item::<f64>(),
                penalty.item::<f64>()
            );
        }
    }

    // 3. Physics-style: d2u/dx2 of the network by double backward, against the analytic
    //    second derivative sum_j W2_j W1_j^2 tanh''(z_j), tanh'' = -2 tanh (1 - tanh^2).
    let x = Tensor::linspace(-1.0, 1.0, 5).double().view(&[5, 1]).requires_grad_(true);
    let u = net.forward(&x);
    let du = kiln::try_grad(&[&u.sum()], &[&x], true)?.remove(0);
    let d2u = kiln::try_grad(&[&du.sum()], &[&x], false)?.remove(0);
    let analytic = kiln::no_grad(|| {
        let t = (x.matmul(&net.w1) + &net.b1).tanh();
        let tanh2 = &t * -2.0 * (1.0 - t.square());
        (tanh2 * net.w1.square()).matmul(&net.w2)
    });
    println!("3. d2u/dx2 by double backward {:.6?}", d2u.to_vec::<f64>());
    println!("   analytic                   {:.6?}", analytic.to_vec::<f64>());
    Ok(())
}
