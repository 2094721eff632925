//! Movement ops: values against index arithmetic, strides and contiguity against PyTorch's,
//! and storage sharing.

use kiln::prelude::*;

use crate::common::*;

fn iota(shape: &[usize]) -> (Vec<f64>, Tensor) {
    let n: usize = shape.iter().product();
    let data: Vec<f64> = (0..n).map(|v| v as f64).collect();
    let t = tensor(&data, shape, DType::I64);
    (data, t)
}

#[test]
fn permute_matches_index_arithmetic() {
    let shape = [2usize, 3, 4];
    for layout in LAYOUTS {
        let data: Vec<f64> = (0..24).map(|v| v as f64).collect();
        let x = make(&data, &shape, DType::I64, layout);
        for perm in [[0usize, 1, 2], [2, 0, 1], [1, 2, 0], [2, 1, 0], [0, 2, 1]] {
            let p: Vec<i64> = perm.iter().map(|&d| d as i64).collect();
            let y = x.permute(&p);
            let out_shape: Vec<usize> = perm.iter().map(|&d| shape[d]).collect();
            assert_eq!(y.dims(), out_shape.as_slice());
            let want: Vec<f64> = (0..24)
                .map(|flat| {
                    let oi = unravel(flat, &out_shape);
                    let mut ii = [0usize; 3];
                    for (o, &d) in perm.iter().enumerate() {
                        ii[d] = oi[o];
                    }
                    data[ravel(&ii, &shape)]
                })
                .collect();
            assert_eq!(y.to_vec::<f64>(), want, "permute {perm:?} of {layout:?}");
            assert!(y.shares_storage_with(&x));
        }
    }
}

#[test]
fn strides_and_contiguity_match_pytorch() {
    let (_, x) = iota(&[2, 3, 4]);
    assert_eq!(x.stride(), vec![12, 4, 1]);
    assert!(x.is_contiguous());
    let t = x.transpose(0, 2);
    assert_eq!((t.dims(), t.stride()), (&[4usize, 3, 2][..], vec![1, 4, 12]));
    assert!(!t.is_contiguous());
    assert_eq!(x.unsqueeze(1).stride(), vec![12, 12, 4, 1]);
    assert_eq!(x.unsqueeze(-1).stride(), vec![12, 4, 1, 1]);
    assert_eq!(x.narrow(2, 1, 2).stride(), vec![12, 4, 1]);
    assert_eq!(x.narrow(2, 1, 2).storage_offset(), 1);
    assert!(!x.narrow(2, 1, 2).is_contiguous());
    assert!(x.narrow(0, 1, 1).is_contiguous());
    let e = Tensor::zeros([3, 1]).expand(&[2, 3, 4]);
    assert_eq!(e.stride(), vec![0, 1, 0]);
    assert_eq!(e.element_size(), 4);
    let c = t.contiguous();
    assert_eq!(c.stride(), vec![6, 2, 1]);
    assert!(!c.shares_storage_with(&x));
    assert!(x.contiguous().shares_storage_with(&x));
}

#[test]
fn view_and_reshape_share_storage_when_they_can() {
    let (data, x) = iota(&[4, 6]);
    let v = x.view(&[2, -1, 3]);
    assert_eq!(v.dims(), &[2, 4, 3]);
    assert!(v.shares_storage_with(&x));
    assert_eq!(v.to_vec::<f64>(), data);
    // Splitting a dimension of a transposed tensor is still a view.
    let t = x.t(); // [6, 4], strides [1, 6]
    let split = t.view(&[2, 3, 4]);
    assert!(split.shares_storage_with(&x));
    assert_eq!(split.stride(), vec![3, 1, 6]);
    // Flattening it needs a copy: view refuses, reshape copies.
    assert!(t.try_view(&[24]).is_err());
    let r = t.reshape(&[24]);
    assert!(!r.shares_storage_with(&x));
    let want: Vec<f64> = (0..24).map(|i| data[(i % 4) * 6 + i / 4]).collect();
    assert_eq!(r.to_vec::<f64>(), want);
    assert_eq!(t.flatten().to_vec::<f64>(), want);
    assert_eq!(x.flatten().dims(), &[24]);
    assert!(x.flatten().shares_storage_with(&x));
}

#[test]
fn squeeze_unsqueeze_expand_narrow_t() {
    let (data, x) = iota(&[3, 1, 4]);
    assert_eq!(x.squeeze(1).dims(), &[3, 4]);
    assert_eq!(x.squeeze(0).dims(), &[3, 1, 4], "squeezing a dimension of size 3 is a no-op");
    assert_eq!(x.squeeze_all().dims(), &[3, 4]);
    assert_eq!(x.unsqueeze(0).dims(), &[1, 3, 1, 4]);
    assert_eq!(x.unsqueeze(3).dims(), &[3, 1, 4, 1]);
    let e = x.expand(&[2, 3, 5, 4]);
    let want: Vec<f64> = (0..2 * 3 * 5 * 4)
        .map(|flat| {
            let i = unravel(flat, &[2, 3, 5, 4]);
            data[i[1] * 4 + i[3]]
        })
        .collect();
    assert_eq!(e.to_vec::<f64>(), want);
    let n = x.narrow(-1, 1, 2).narrow(0, 1, 2);
    assert_eq!(n.to_vec::<f64>(), vec![5.0, 6.0, 9.0, 10.0]);
    let (_, m) = iota(&[2, 3]);
    assert_eq!(m.t().to_vec::<i64>(), vec![0, 3, 1, 4, 2, 5]);
    let v = Tensor::arange(0i64, 3, 1);
    assert_eq!(v.t().dims(), &[3]);
}

#[test]
fn views_of_pending_results_compute_once() {
    let x = Tensor::arange(0.0f64, 12.0, 1.0).view(&[3, 4]);
    let y = (&x * 2.0).exp();
    let yt = y.t();
    let z = (&yt + 1.0).sum();
    let total: f64 = (0..12).map(|v| (2.0 * v as f64).exp() + 1.0).sum();
    assert!((z.item::<f64>() - total).abs() < 1e-9 * total);
    // y was referenced by a live handle while z was computed, so it was stored then.
    let want: Vec<f64> = (0..12).map(|v| (2.0 * v as f64).exp()).collect();
    assert_eq!(y.to_vec::<f64>(), want);
}

#[test]
fn zero_size_tensors_move_and_compute() {
    let x = Tensor::zeros([0, 3]);
    assert_eq!(x.t().dims(), &[3, 0]);
    assert_eq!(x.reshape(&[3, 1, 0]).dims(), &[3, 1, 0]);
    // As in PyTorch, -1 is ambiguous next to a zero-size dimension.
    assert!(x.try_reshape(&[3, -1, 0]).is_err());
    assert_eq!((&x + 1.0).to_vec::<f32>(), Vec::<f32>::new());
    assert_eq!(x.sum().item::<f32>(), 0.0);
    assert_eq!(x.sum_dim(0, false).to_vec::<f32>(), vec![0.0, 0.0, 0.0]);
}

/// The gradient of a permutation places each element back where it came from, at a size
/// that runs in parallel parts.
#[test]
fn gradients_of_large_permutations_place_every_element() {
    let mut rng = Rng::new(17);
    let shape = [37usize, 29, 40];
    for dims in [[1i64, 0, 2], [2, 1, 0], [0, 2, 1]] {
        for dtype in [DType::F32, DType::F64] {
            let x = Tensor::zeros(shape).to_dtype(dtype).requires_grad_(true);
            let y = x.permute(&dims);
            let yd: Vec<usize> = y.dims().to_vec();
            let r = values(&mut rng, y.numel(), dtype);
            (&y * &tensor(&r, &yd, dtype)).sum().backward();
            let got = read(&x.grad().unwrap(), dtype);
            let mut want = vec![0.0; got.len()];
            for (j, &v) in r.iter().enumerate() {
                // The index of `y` element `j`, and the `x` element it reads.
                let (mut rest, mut at) = (j, [0usize; 3]);
                for a in (0..3).rev() {
                    at[a] = rest % yd[a];
                    rest /= yd[a];
                }
                let mut xi = [0usize; 3];
                for a in 0..3 {
                    xi[dims[a] as usize] = at[a];
                }
                want[(xi[0] * shape[1] + xi[1]) * shape[2] + xi[2]] = v;
            }
            assert_eq!(got, want, "{dims:?} {dtype}");
        }
    }
}

device_test!(assorted_ops_match_the_reference, super::assorted_ops_match_the_reference_on);

/// Ops that are not simple elementwise chains on `device`, over odd sizes and non-contiguous
/// views, against the reference executor.
fn assorted_ops_match_the_reference_on(device: Device) {
    type Op = fn(&Tensor) -> Tensor;
    let ops: Vec<(&str, Op)> = vec![
        ("cumsum long rows", |x| x.cumsum(1)),
        ("cumsum over rows", |x| x.cumsum(0)),
        ("argmax", |x| x.argmax(1, false)),
        ("argmin dim 0", |x| x.argmin(0, true)),
        ("logsumexp", |x| x.logsumexp(1, false)),
        ("std", |x| x.std_dim(0, true)),
        ("all/any", |x| Tensor::stack(&[&x.gt(0.0).all(), &x.lt(-3.0).any()], 0)),
        ("cat", |x| Tensor::cat(&[x, &x.exp(), &x.narrow(0, 1, 2)], 0)),
        ("stack transposed", |x| Tensor::stack(&[&x.t(), &x.t().sin()], 1)),
        ("flip", |x| x.flip(&[0, 1])),
        ("repeat", |x| x.repeat(&[2, 1])),
        ("chunk", |x| x.chunk(3, 1)[1].tanh()),
        ("masked_fill", |x| x.masked_fill(&x.gt(0.5), -1.0)),
        ("clamp and where", |x| Tensor::where_(&x.gt(0.0), x.clamp(0.1, 0.9), x * 3.0)),
        ("tril", |x| x.tril(1)),
        ("einsum", |x| kiln::einsum("ij,kj->ik", &[x, &x.narrow(0, 0, 3)])),
        ("matmul f16", |x| x.half().matmul(&x.t().half()).float()),
        ("matmul bf16", |x| x.bfloat16().matmul(&x.t().bfloat16()).float()),
        ("bmm of views", |x| {
            x.narrow(1, 0, 60).reshape(&[5, 16, 15]).bmm(&x.narrow(1, 0, 60).reshape(&[5, 15, 16]))
        }),
        ("integer ops", |x| ((x * 10.0).to_dtype(DType::I32) * 7 + 3).cumsum(1)),
        ("u8 sums", |x| (x.abs() * 40.0).to_dtype(DType::U8).sum_dim(1, false)),
        ("in-place", |x| {
            let y = x.copy();
            y.narrow(1, 2, 5).mul_(x.narrow(1, 0, 5));
            y.add_(1.0);
            y
        }),
    ];
    let mut rng = Rng::new(17);
    let data = values(&mut rng, 20 * 67, DType::F32);
    for layout in LAYOUTS {
        let x = make(&data, &[20, 67], DType::F32, layout);
        for (name, op) in &ops {
            let run = |x: &Tensor| {
                let y = op(x);
                (y.device(), y.dims().to_vec(), y.dtype(), y.to_vec::<f64>())
            };
            let want = kiln::with_execution(kiln::Execution::Reference, || run(&x));
            let got = run(&x.to(device));
            assert_eq!(got.0, device, "{name}");
            assert_eq!((&got.1, got.2), (&want.1, want.2), "{name}");
            let tol = if name.contains("16") { 1e-2 } else { 1e-5 };
            assert_close_tol(&got.3, &want.3, tol, &format!("{name} {layout:?}"));
        }
    }
}
