//! A first tour of kiln: build a small program, print tensors, and take a gradient.
//!
//! Run with `cargo run --release --example quickstart`.

use kiln::prelude::*;

fn main() -> kiln::Result<()> {
    kiln::manual_seed(0);

    // Tensors are recorded lazily; printing one computes it.
    let x = Tensor::arange(0.0f32, 6.0, 1.0).view(&[2, 3]);
    let w = Tensor::randn([3, 2]);
    println!("x =\n{x}\n");
    println!(
        "x.t() shares x's storage: {} (strides {:?})\n",
        x.t().shares_storage_with(&x),
        x.t().stride()
    );

    // Broadcasting, math functions and reductions, all recorded into one graph.
    let bias = Tensor::from_vec(vec![0.5f32, -0.5], [2]);
    let y = (x.matmul(&w) + &bias).tanh();
    println!("the graph behind y.sum():\n{}", kiln::debug::graph_dot(&[&y.sum()]));
    println!("y = tanh(x @ w + b) =\n{y}\n");
    println!("row sums: {}", y.sum_dim(1, false));
    println!("column max and argmax: {:?}\n", {
        let (values, indices) = y.max_dim(0, false);
        (values.to_vec::<f32>(), indices.to_vec::<i64>())
    });

    // Mistakes are caught where they are made, with the shapes and the fix.
    if let Err(e) = x.try_matmul(&x) {
        println!("x.matmul(&x) fails at once: {e}\n");
    }

    // A gradient: d/dw of mean((tanh(x @ w + b) - target)^2).
    let w = w.requires_grad_(true);
    let target = Tensor::ones([2, 2]);
    let loss = ((x.matmul(&w) + &bias).tanh() - &target).square().mean();
    loss.backward();
    println!("loss = {:.6}", loss.item::<f32>());
    let grad = w.grad().expect("backward fills the gradient of every leaf that requires grad");
    println!("dloss/dw =\n{grad}\n");

    // Higher-order derivatives come from the same machinery: d2/dx2 of x^3 at 3 is 18.
    let t = Tensor::scalar(3.0f64).requires_grad_(true);
    let dt = kiln::try_grad(&[&t.pow(3.0)], &[&t], true)?.remove(0);
    let d2t = kiln::try_grad(&[&dt], &[&t], false)?.remove(0);
    println!("d/dt t^3 at 3 = {}, d2/dt2 = {}", dt.item::<f64>(), d2t.item::<f64>());

    // What was printed, checked against plain loops (CI runs this example).
    let (xs, ws) = (x.to_vec::<f32>(), w.to_vec::<f32>());
    let (mut want_loss, mut want_grad) = (0.0f64, [0.0f64; 6]);
    for i in 0..2 {
        for j in 0..2 {
            let z: f64 = (0..3).map(|k| f64::from(xs[i * 3 + k] * ws[k * 2 + j])).sum::<f64>()
                + [0.5, -0.5][j];
            let (t, d) = (z.tanh(), z.tanh() - 1.0);
            want_loss += d * d / 4.0;
            for k in 0..3 {
                want_grad[k * 2 + j] += d / 2.0 * (1.0 - t * t) * f64::from(xs[i * 3 + k]);
            }
        }
    }
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * b.abs().max(1.0);
    let got_grad = grad.to_vec::<f64>();
    let checked = close(loss.item::<f64>(), want_loss)
        && got_grad.iter().zip(want_grad).all(|(&a, b)| close(a, b))
        && (dt.item::<f64>(), d2t.item::<f64>()) == (27.0, 18.0)
        && y.sum_dim(1, false).numel() == 2;
    if !checked {
        eprintln!(
            "the printed values disagree with plain loops: loss {want_loss}, grad {want_grad:?}"
        );
        std::process::exit(1);
    }
    println!("(the values above agree with plain f64 loops)");
    Ok(())
}
