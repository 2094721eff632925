//! The classic first lessons of autograd, in kiln.
//!
//! Run with `cargo run --release --example autograd`.

use kiln::prelude::*;

fn main() -> kiln::Result<()> {
    // 1. dy/dx of y = x^2 + 3x + 1 at x = 2 is 2x + 3 = 7.
    let x = Tensor::scalar(2.0f32).requires_grad_(true);
    let y = &x * &x + &x * 3.0 + 1.0;
    y.try_backward()?;
    println!(
        "1. dy/dx of x^2 + 3x + 1 at 2 = {}",
        x.grad().expect("x requires grad").item::<f32>()
    );

    // 2. A linear model pred = w * x + b with squared loss: the gradients match the
    //    hand-derived 2 (pred - target) x and 2 (pred - target).
    let w = Tensor::scalar(0.5f32).requires_grad_(true);
    let b = Tensor::scalar(-1.0f32).requires_grad_(true);
    let (input, target) = (3.0f32, 2.0f32);
    let pred = &w * f64::from(input) + &b;
    let loss = (&pred - f64::from(target)).square();
    loss.try_backward()?;
    let residual = 0.5 * input - 1.0 - target;
    println!(
        "2. dloss/dw = {} (by hand {}), dloss/db = {} (by hand {})",
        w.grad().expect("w requires grad").item::<f32>(),
        2.0 * residual * input,
        b.grad().expect("b requires grad").item::<f32>(),
        2.0 * residual
    );

    // 3. Gradients accumulate across backward calls, as in PyTorch: three calls give three
    //    times the gradient until you clear it.
    let x = Tensor::scalar(2.0f32).requires_grad_(true);
    for _ in 0..3 {
        (&x * &x).try_backward()?;
    }
    println!(
        "3. after three backward calls: {} (each adds 2x = 4)",
        x.grad().expect("x requires grad").item::<f32>()
    );
    x.zero_grad();
    (&x * &x).try_backward()?;
    println!(
        "   after zero_grad and one more: {}",
        x.grad().expect("x requires grad").item::<f32>()
    );

    // 4. d2/dx2 of x^3 at 3 is 6x = 18: differentiate the gradient, which `create_graph`
    //    records as a graph of its own.
    let x = Tensor::scalar(3.0f64).requires_grad_(true);
    let dy = kiln::try_grad(&[&x.pow(3.0)], &[&x], true)?.remove(0);
    let d2y = kiln::try_grad(&[&dy], &[&x], false)?.remove(0);
    println!("4. d/dx x^3 at 3 = {}, d2/dx2 = {}", dy.item::<f64>(), d2y.item::<f64>());
    Ok(())
}
