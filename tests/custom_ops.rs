//! User-defined elementwise ops (`kiln::ops`): fused with their neighbours like the
//! built-in ops they are made of, bit for bit equal to a built-in with the same expression,
//! differentiable to second order, on the emulated device too, shown by name in profiles,
//! and refused when the definition is not elementwise.

use kiln::Execution;
use kiln::autograd::gradcheck;
use kiln::ops::{Elementwise, Elementwise2};
use kiln::prelude::*;

use crate::common::*;

fn swish(beta: f64) -> Elementwise<impl Fn(&Tensor) -> Tensor> {
    Elementwise::new("swish", move |x: &Tensor| x * (x * beta).sigmoid())
}

/// Kernels launched realizing `t`, with their ops.
fn kernels_of(t: &Tensor) -> Vec<String> {
    let (_, kernels) = kiln::debug::kernels(|| t.realize().clone());
    kernels.into_iter().map(|k| k.ops).collect()
}

#[test]
fn a_user_activation_fuses_and_equals_the_builtin_bit_for_bit() {
    let mut rng = Rng::new(11);
    let xs = values(&mut rng, 37 * 19, DType::F32);
    let x = tensor(&xs, &[37, 19], DType::F32);
    x.realize();
    // silu is `x * sigmoid(x)`: swish with beta 1 is the same expression.
    let silu = Elementwise::new("my_silu", |x: &Tensor| x * x.sigmoid());
    let mine = (silu.call(&x) * 2.0 + 1.0).relu();
    let builtin = (x.silu() * 2.0 + 1.0).relu();
    let (k_mine, k_builtin) = (kernels_of(&mine), kernels_of(&builtin));
    assert_eq!(k_mine.len(), 1, "{k_mine:?}");
    assert_eq!(k_builtin.len(), 1, "{k_builtin:?}");
    // The op's own ops grouped under its name, the neighbours' beside them.
    assert_eq!(k_mine[0], "my_silu(sigmoid mul) mul add relu");
    assert_eq!(k_builtin[0], "sigmoid mul mul add relu");
    assert_eq!(mine.to_vec::<f32>(), builtin.to_vec::<f32>());
    // In f64 against a plain loop.
    let x64 = tensor(&xs, &[37, 19], DType::F64);
    let got = swish(1.5).call(&x64).to_vec::<f64>();
    let want: Vec<f64> = xs.iter().map(|&v| v / (1.0 + (-1.5 * v).exp())).collect();
    assert_close_tol(&got, &want, 1e-14, "swish in f64");
}

#[test]
fn a_user_op_passes_gradcheck_to_second_order() {
    let mut rng = Rng::new(12);
    let x = tensor(&values(&mut rng, 12, DType::F64), &[3, 4], DType::F64);
    let y = tensor(&values(&mut rng, 4, DType::F64), &[4], DType::F64);
    let op = swish(0.7);
    gradcheck(|t| op.call(&t[0]), std::slice::from_ref(&x), 1e-6, 1e-6).unwrap();
    // The second derivative: the gradient of the first, itself checked numerically.
    let first = |t: &[Tensor]| {
        let x = t[0].clone();
        kiln::grad(&[&op.call(&x).sum()], &[&x], true).remove(0)
    };
    gradcheck(first, std::slice::from_ref(&x), 1e-6, 1e-5).unwrap();
    // Two inputs, broadcast: a soft maximum.
    let softmax2 =
        Elementwise2::new("softmax2", |a: &Tensor, b: &Tensor| (a.exp() + b.exp()).log());
    gradcheck(|t| softmax2.call(&t[0], &t[1]), &[x, y], 1e-6, 1e-6).unwrap();
}

#[test]
fn profiles_name_the_op_and_its_gradient() {
    let x = Tensor::randn([64, 33]).requires_grad_(true);
    let loss = swish(2.0).call(&x).square().mean();
    let ((), profile) = kiln::profile(|| loss.backward());
    let ops: Vec<String> = profile.kernels().iter().map(|k| k.ops.clone()).collect();
    assert!(ops.iter().any(|o| o.contains("swish(")), "{ops:?}");
    assert!(ops.iter().any(|o| o.contains("swish.grad(")), "{ops:?}");
    // The reference executor (what KILN_CHECK compares against) agrees in f64.
    let x = Tensor::randn([5, 7]).double();
    let fused = swish(0.3).call(&x).to_vec::<f64>();
    let reference =
        kiln::with_execution(Execution::Reference, || swish(0.3).call(&x).to_vec::<f64>());
    assert_close_tol(&fused, &reference, 1e-12, "fused against the reference executor");
}

#[test]
fn a_user_op_runs_fused_on_cuda() {
    let Some((gpu, _memory)) = gpu_or_skip("a_user_op_runs_fused_on_cuda") else { return };
    let mut rng = Rng::new(13);
    let xs = values(&mut rng, 300, DType::F32);
    let x = tensor(&xs, &[20, 15], DType::F32);
    let on_cpu = (swish(1.2).call(&x) + 1.0).to_vec::<f64>();
    let xg = x.to(gpu);
    let y = swish(1.2).call(&xg) + 1.0;
    assert_eq!(kernels_of(&y).len(), 1);
    assert_close_tol(&y.to_vec::<f64>(), &on_cpu, 1e-6, "swish on the device");
}

#[test]
fn a_definition_that_is_not_elementwise_is_refused() {
    let x = Tensor::randn([4, 4]);
    let product = Elementwise::new("mixer", |x: &Tensor| x.matmul(x));
    let m = product.try_call(&x).unwrap_err().to_string();
    assert!(m.starts_with("mixer") && m.contains("matmul"), "{m}");
    let reduce = Elementwise::new("total", |x: &Tensor| x.sum());
    let m = reduce.try_call(&x).unwrap_err().to_string();
    assert!(m.contains("shape [4, 4]") && m.contains("returned []"), "{m}");
    let pair = Elementwise2::new("pair", |a: &Tensor, b: &Tensor| a + b);
    let m = pair.try_call(&x, &Tensor::ones([3])).unwrap_err().to_string();
    assert!(m.starts_with("pair") && m.contains("do not broadcast"), "{m}");
}
