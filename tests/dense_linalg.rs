//! Dense linear algebra (`kiln::linalg`) against PyTorch: `scripts/torch_fixtures.py` ran
//! `torch.linalg`'s `cholesky` (lower and upper), `solve` (matrices, a vector, broadcast
//! batches), `solve_triangular` (lower and upper), `inv`, `det`, `slogdet`, `eigh`, `qr`,
//! `svd`, `lstsq` and the compositions (norms, `cross`, `vecdot`, `multi_dot`,
//! `matrix_power`, `pinv`, `cond`, `eigvalsh`, `vander`) in float64 and
//! saved the outputs and the gradients of a random weighting of them
//! (`tests/data/torch_linalg.safetensors`). Also: second derivatives, views read through
//! their strides, errors for shapes, dtypes and singular or indefinite matrices, a compiled
//! function, and the emulated device (host factorization).

use std::collections::HashMap;

use kiln::autograd::gradcheck;
use kiln::linalg;
use kiln::prelude::*;

use crate::common::*;

fn fixture() -> HashMap<String, Tensor> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/torch_linalg.safetensors");
    kiln::serialize::load(&path).expect("the fixture file").into_iter().collect()
}

/// Runs `f` on the case's inputs and checks its output and the gradients of `(f · r).sum()`
/// against PyTorch's.
fn check(file: &HashMap<String, Tensor>, name: &str, f: impl Fn(&[Tensor]) -> Tensor) {
    check_within(file, name, 1e-10, 1e-9, f);
}

/// [`check`] within the given tolerances of the values and the gradients.
fn check_within(
    file: &HashMap<String, Tensor>,
    name: &str,
    values: f64,
    gradients: f64,
    f: impl Fn(&[Tensor]) -> Tensor,
) {
    let get = |k: &str| file.get(&format!("{name}.{k}")).unwrap_or_else(|| panic!("{name}.{k}"));
    let inputs: Vec<Tensor> = (0..)
        .map_while(|i| file.get(&format!("{name}.in{i}")))
        .map(|t| t.clone().requires_grad_(true))
        .collect();
    let y = f(&inputs);
    assert_close_tol(&y.to_vec::<f64>(), &get("out").to_vec::<f64>(), values, name);
    (&y * get("r")).sum().backward();
    for (i, x) in inputs.iter().enumerate() {
        let want = get(&format!("grad{i}")).to_vec::<f64>();
        let got = x.grad().expect("a gradient").to_vec::<f64>();
        assert_close_tol(&got, &want, gradients, &format!("{name} gradient {i}"));
    }
}

fn eye5() -> Tensor {
    Tensor::eye(5).double()
}

#[test]
fn factorizations_and_solves_agree_with_pytorch() {
    let file = fixture();
    let spd = |a: &Tensor| a.matmul(&a.transpose(-2, -1)) + eye5() * 4.0;
    check(&file, "cholesky", |t| linalg::cholesky(&spd(&t[0]), false));
    check(&file, "cholesky_upper", |t| linalg::cholesky(&spd(&t[0]), true));
    for name in ["solve", "solve_vector", "solve_broadcast"] {
        check(&file, name, |t| linalg::solve(&(&t[0] + eye5() * 3.0), &t[1]));
    }
    check(&file, "solve_lower", |t| {
        linalg::solve_triangular(&(t[0].tril(0) + eye5() * 3.0), &t[1], false)
    });
    check(&file, "solve_upper", |t| {
        linalg::solve_triangular(&(t[0].triu(0) + eye5() * 3.0), &t[1], true)
    });
    check(&file, "inv", |t| linalg::inv(&(&t[0] + eye5() * 3.0)));
    check(&file, "det", |t| linalg::det(&t[0]));
    check(&file, "logabsdet", |t| linalg::slogdet(&t[0]).1);
    check(&file, "eigh", |t| {
        let (values, vectors) = linalg::eigh(&(&t[0] + &t[0].transpose(-2, -1)));
        Tensor::cat(&[&values, &(&vectors * &vectors).reshape(&[3, 25])], -1)
    });
    let qr_invariant = |t: &[Tensor]| {
        let (q, r) = linalg::qr(&t[0]);
        let flat = |x: &Tensor| {
            let d = x.dims();
            let mut dims: Vec<i64> = d[..d.len() - 2].iter().map(|&v| v as i64).collect();
            dims.push((d[d.len() - 2] * d[d.len() - 1]) as i64);
            (x * x).reshape(&dims)
        };
        Tensor::cat(&[&flat(&q), &flat(&r)], -1)
    };
    check(&file, "qr", qr_invariant);
    check(&file, "qr_square", qr_invariant);
    check(&file, "qr_wide", qr_invariant);
    check(&file, "lstsq", |t| linalg::lstsq(&t[0], &t[1]));
    // Ill-conditioned (a Hilbert matrix, condition number about 1.5e7): agreement within
    // what the condition number allows of two f64 factorizations.
    let hilbert = file["hilbert"].clone();
    check_within(&file, "solve_ill", 1e-7, 1e-6, |t| {
        linalg::solve(&(&hilbert + &t[0] * 1e-9), &t[1])
    });
    check_within(&file, "inv_ill", 1e-7, 1e-6, |t| linalg::inv(&(&hilbert + &t[0] * 1e-9)));
    let flat = |x: &Tensor| {
        let d = x.dims();
        let mut dims: Vec<i64> = d[..d.len() - 2].iter().map(|&v| v as i64).collect();
        dims.push((d[d.len() - 2] * d[d.len() - 1]) as i64);
        (x * x).reshape(&dims)
    };
    for name in ["svd_tall", "svd_wide"] {
        check(&file, name, |t| {
            let (u, s, vh) = linalg::svd(&t[0]);
            Tensor::cat(&[&s, &flat(&u), &flat(&vh)], -1)
        });
    }
    check(&file, "vector_norm2", |t| linalg::vector_norm(&t[0], 2.0, &[-1], false));
    check(&file, "vector_norm3", |t| linalg::vector_norm(&t[0], 3.0, &[0, 2], true));
    check(&file, "vector_norm_inf", |t| linalg::vector_norm(&t[0], f64::INFINITY, &[], false));
    check(&file, "vector_norm1", |t| linalg::vector_norm(&t[0], 1.0, &[1], false));
    use linalg::MatrixOrd;
    for (name, ord) in [
        ("fro", MatrixOrd::Frobenius),
        ("nuc", MatrixOrd::Nuclear),
        ("2", MatrixOrd::Spectral(1)),
        ("m2", MatrixOrd::Spectral(-1)),
        ("1", MatrixOrd::Columns(1)),
        ("m1", MatrixOrd::Columns(-1)),
        ("inf", MatrixOrd::Rows(1)),
        ("minf", MatrixOrd::Rows(-1)),
    ] {
        check(&file, &format!("matrix_norm_{name}"), |t| linalg::matrix_norm(&t[0], ord));
    }
    check(&file, "cross", |t| linalg::cross(&t[0], &t[1]));
    check(&file, "vecdot", |t| linalg::vecdot(&t[0], &t[1], -1));
    check(&file, "multi_dot", |t| linalg::multi_dot(&[&t[0], &t[1], &t[2]]));
    check(&file, "matrix_power3", |t| linalg::matrix_power(&t[0], 3));
    check(&file, "matrix_power_m2", |t| {
        linalg::matrix_power(&(&t[0] + Tensor::eye(4).double() * 3.0), -2)
    });
    check(&file, "pinv", |t| linalg::pinv(&t[0]));
    check(&file, "cond", |t| linalg::cond(&t[0]));
    check(&file, "eigvalsh", |t| linalg::eigvalsh(&(&t[0] + &t[0].transpose(-2, -1))));
    check(&file, "vander", |t| linalg::vander(&t[0], 4));
    let (sign, _) = linalg::slogdet(&file["logabsdet.in0"]);
    assert_eq!(sign.to_vec::<f64>(), file["logabsdet.sign"].to_vec::<f64>());
}

#[test]
fn second_derivatives_and_views() {
    let mut rng = Rng::new(91);
    let a = tensor(&values(&mut rng, 2 * 4 * 4, DType::F64), &[2, 4, 4], DType::F64)
        + Tensor::eye(4).double() * 3.0;
    let b = tensor(&values(&mut rng, 2 * 4 * 3, DType::F64), &[2, 4, 3], DType::F64);
    gradcheck(|t| linalg::inv(&t[0]), std::slice::from_ref(&a), 1e-6, 1e-6).unwrap();
    gradcheck(|t| linalg::solve(&t[0], &t[1]), &[a.clone(), b.clone()], 1e-6, 1e-6).unwrap();
    let first = |t: &[Tensor]| {
        let (x, y) = (t[0].clone(), t[1].clone());
        let g = kiln::grad(&[&linalg::solve(&x, &y).square().sum()], &[&x, &y], true);
        (&g[0] * &g[0]).sum() + (&g[1] * &g[1]).sum()
    };
    gradcheck(first, &[a.clone(), b.clone()], 1e-6, 1e-5).unwrap();
    let det2 = |t: &[Tensor]| {
        let x = t[0].clone();
        kiln::grad(&[&linalg::det(&x).sum()], &[&x], true).remove(0)
    };
    gradcheck(det2, std::slice::from_ref(&a), 1e-6, 1e-5).unwrap();
    let spd = a.matmul(&a.transpose(-2, -1));
    let chol2 = |t: &[Tensor]| {
        let x = t[0].clone();
        let s = (&x + &x.transpose(-2, -1)) * 0.5;
        kiln::grad(&[&linalg::cholesky(&s, false).square().sum()], &[&x], true).remove(0)
    };
    gradcheck(chol2, std::slice::from_ref(&spd), 1e-6, 1e-5).unwrap();
    // Eigenvalues and eigenvectors: A V = V diag(λ), and gradients of gradients.
    let sym = (&a + &a.transpose(-2, -1)) * 0.5;
    let (lambda, vectors) = linalg::eigh(&sym);
    let av = sym.matmul(&vectors).to_vec::<f64>();
    let vl = (&vectors * &lambda.unsqueeze(-2)).to_vec::<f64>();
    assert_close_tol(&av, &vl, 1e-10, "A V = V diag(λ)");
    let eig2 = |t: &[Tensor]| {
        let x = t[0].clone();
        let (l, v) = linalg::eigh(&((&x + &x.transpose(-2, -1)) * 0.5));
        let loss = l.square().sum() + (&v * &v * &v * &v).sum();
        kiln::grad(&[&loss], &[&x], true).remove(0)
    };
    gradcheck(eig2, std::slice::from_ref(&a), 1e-6, 1e-5).unwrap();
    // Q has orthonormal columns and Q R = A; a gradient of the gradient through QR.
    let tall = tensor(&values(&mut rng, 2 * 6 * 4, DType::F64), &[2, 6, 4], DType::F64);
    let (q, r) = linalg::qr(&tall);
    assert_close_tol(&q.matmul(&r).to_vec::<f64>(), &tall.to_vec::<f64>(), 1e-12, "Q R = A");
    let qtq = q.transpose(-2, -1).matmul(&q).to_vec::<f64>();
    let eye4 = Tensor::eye(4).double().expand(&[2, 4, 4]).to_vec::<f64>();
    assert_close_tol(&qtq, &eye4, 1e-12, "QᵀQ = I");
    let qr2 = |t: &[Tensor]| {
        let x = t[0].clone();
        let (q, r) = linalg::qr(&x);
        let loss = (&q * &q * &q * &q).sum() + (&r * &r).sum();
        kiln::grad(&[&loss], &[&x], true).remove(0)
    };
    gradcheck(qr2, std::slice::from_ref(&tall), 1e-6, 1e-5).unwrap();
    let m =
        linalg::try_lstsq(&Tensor::randn([3, 5]), &Tensor::randn([3, 1])).unwrap_err().to_string();
    assert!(m.contains("fewer rows than columns"), "{m}");
    // A wide matrix's factors differentiate too (PyTorch's rule for m < n), twice.
    let wide = tensor(&values(&mut rng, 3 * 5, DType::F64), &[3, 5], DType::F64);
    let loss = |x: &Tensor| {
        let (q, r) = linalg::qr(x);
        (&q * &q * &q * &q).sum() + (&r * &r * &r).sum()
    };
    gradcheck(|t| loss(&t[0]), std::slice::from_ref(&wide), 1e-6, 1e-6).unwrap();
    let wide2 = |t: &[Tensor]| {
        let x = t[0].clone();
        kiln::grad(&[&loss(&x)], &[&x], true).remove(0)
    };
    gradcheck(wide2, std::slice::from_ref(&wide), 1e-6, 1e-5).unwrap();
    // A transposed and a sliced input are read through their strides.
    let at = a.transpose(-2, -1);
    assert!(!at.is_contiguous());
    let want = linalg::inv(&at.copy()).to_vec::<f64>();
    assert_close_tol(
        &linalg::inv(&at).to_vec::<f64>(),
        &want,
        1e-12,
        "inverse of a transposed view",
    );
    let wide = Tensor::cat(&[&b, &b], 2);
    let x = linalg::solve(&a, &wide.narrow(2, 1, 3));
    let want = linalg::solve(&a, &wide.narrow(2, 1, 3).copy()).to_vec::<f64>();
    assert_close_tol(&x.to_vec::<f64>(), &want, 1e-12, "a sliced right-hand side");
    // f32, and a batch large enough to be split across threads.
    let big = Tensor::randn([300, 6, 6]) + Tensor::eye(6) * 4.0;
    let inv = linalg::inv(&big);
    let id = big.matmul(&inv).to_vec::<f32>();
    let eye = Tensor::eye(6).expand(&[300, 6, 6]).to_vec::<f32>();
    let worst = id.iter().zip(&eye).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst < 1e-4, "A · inv(A) is I within {worst}");
}

#[test]
fn bad_inputs_are_errors_naming_the_op() {
    let m = linalg::try_inv(&Tensor::randn([3, 4])).unwrap_err().to_string();
    assert!(
        m.starts_with("linalg.inv") && m.contains("square matrices") && m.contains("[3, 4]"),
        "{m}"
    );
    let m = linalg::try_det(&Tensor::ones([2, 2]).long()).unwrap_err().to_string();
    assert!(m.contains("float tensor, got i64"), "{m}");
    let m =
        linalg::try_solve(&Tensor::randn([3, 3]), &Tensor::randn([4, 2])).unwrap_err().to_string();
    assert!(m.starts_with("linalg.solve") && m.contains("[.., 3, k]"), "{m}");
    let m = linalg::try_solve(&Tensor::randn([2, 3, 3]), &Tensor::randn([4, 3, 1]))
        .unwrap_err()
        .to_string();
    assert!(m.contains("do not broadcast"), "{m}");
    let m = linalg::try_solve(&Tensor::randn([3, 3]), &Tensor::randn([3, 1]).double())
        .unwrap_err()
        .to_string();
    assert!(m.contains("A (f32) and B (f64) must have the same dtype"), "{m}");
    // Found while computing: an indefinite matrix, a singular one; each names the matrix.
    let indefinite = Tensor::from_vec(vec![1.0f64, 0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 1.0], [2, 2, 2]);
    let m = linalg::cholesky(&indefinite, false).try_realize().map(|_| ()).unwrap_err().to_string();
    assert!(m.contains("matrix 1 of the batch is not positive-definite"), "{m}");
    assert!(m.contains("leading minor of order 2"), "{m}");
    assert!(m.contains("dense_linalg.rs"), "names the caller's line: {m}");
    let singular = Tensor::from_vec(vec![1.0f64, 2.0, 2.0, 4.0], [2, 2]);
    let m = linalg::inv(&singular).try_realize().map(|_| ()).unwrap_err().to_string();
    assert!(m.contains("matrix 0 of the batch is singular"), "{m}");
    let (sign, logabs) = linalg::slogdet(&singular);
    assert_eq!((sign.item::<f64>(), logabs.item::<f64>()), (0.0, f64::NEG_INFINITY));
    assert_eq!(linalg::det(&singular).item::<f64>(), 0.0);
}

fn on_device(device: Device) {
    kiln::manual_seed(4);
    let a = (Tensor::randn([3, 4, 4]) + Tensor::eye(4) * 3.0).to(device);
    let b = Tensor::randn([3, 4, 2]).to(device).requires_grad_(true);
    let a = a.requires_grad_(true);
    // Planned once inside a compiled function, with its gradient.
    let mut f = kiln::compile(|(a, b): (&Tensor, &Tensor)| {
        let loss = linalg::solve(a, b).square().sum() + linalg::slogdet(a).1.sum();
        kiln::grad(&[&loss], &[a, b], false)
    });
    let grads: Vec<Vec<Tensor>> = (0..3).map(|_| f.call((&a, &b))).collect();
    assert_eq!(f.stats().plans, 1, "{:?}", f.stats());
    assert_eq!(grads[2][0].device(), device);
    let (ac, bc) = (
        a.to(Device::Cpu).detach().requires_grad_(true),
        b.to(Device::Cpu).detach().requires_grad_(true),
    );
    let loss = linalg::solve(&ac, &bc).square().sum() + linalg::slogdet(&ac).1.sum();
    let want = kiln::grad(&[&loss], &[&ac, &bc], false);
    for (g, w) in grads[2].iter().zip(&want) {
        assert_close_tol(&g.to_vec::<f64>(), &w.to_vec::<f64>(), 1e-5, "gradients");
    }
    // On a GPU the factorization is a host step, and profiles say so.
    let (_, profile) = kiln::profile(|| linalg::inv(&a.detach()).realize().clone());
    let step = profile.kernels().into_iter().find(|k| k.name == "linalg.inv").expect("a step");
    let want = if device == Device::Cpu { kiln::StepKind::Library } else { kiln::StepKind::Host };
    assert_eq!(step.kind, want);
}
device_test!(linalg_plans_once_in_a_compiled_function, super::on_device);
