//! PyTorch's everyday vocabulary: each op against an f64 loop of its definition on fresh
//! random inputs with the domain's edges (zeros, signs, NaN, infinities), broadcast and
//! through non-contiguous views, in f32 and f64; the differentiable ones pass gradcheck.

use kiln::autograd::gradcheck;
use kiln::prelude::*;

use crate::common::*;

/// Random values with the edges mixed in.
fn edgy(rng: &mut Rng, n: usize) -> Vec<f64> {
    let edges = [0.0, -0.0, 1.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 2.5, -2.5];
    (0..n)
        .map(|i| if i % 3 == 0 { edges[(i / 3) % edges.len()] } else { rng.uniform(-4.0, 4.0) })
        .collect()
}

/// `op` against `want` elementwise over `[5, 7]` inputs, in every layout and float dtype.
fn unary(name: &str, op: impl Fn(&Tensor) -> Tensor, want: impl Fn(f64) -> f64) {
    let mut rng = Rng::new(480);
    let data = edgy(&mut rng, 35);
    for dtype in [DType::F32, DType::F64] {
        for layout in LAYOUTS {
            let x = make(&data, &[5, 7], dtype, layout);
            let expect: Vec<f64> =
                x.to_vec::<f64>().iter().map(|&v| round_to(dtype, want(v))).collect();
            assert_close(
                &read(&op(&x), dtype),
                &expect,
                dtype,
                &format!("{name} {dtype:?} {layout:?}"),
            );
        }
    }
}

#[test]
fn math_functions_match_their_definitions() {
    unary("rsqrt", Tensor::rsqrt, |v| 1.0 / v.sqrt());
    unary("trunc", Tensor::trunc, f64::trunc);
    unary("frac", Tensor::frac, |v| if v.is_infinite() { f64::NAN } else { v - v.trunc() });
    unary("clip", |x| x.clip(-1.5, 2.0), |v| if v.is_nan() { v } else { v.clamp(-1.5, 2.0) });
    unary(
        "nan_to_num",
        |x| x.nan_to_num(0.5, Some(9.0), Some(-7.0)),
        |v| {
            if v.is_nan() {
                0.5
            } else if v == f64::INFINITY {
                9.0
            } else if v == f64::NEG_INFINITY {
                -7.0
            } else {
                v
            }
        },
    );
    // f32's largest finite value replaces +inf in f32 (f64's would overflow it).
    let x = Tensor::from_vec(vec![f32::INFINITY, f32::NAN], [2]);
    assert_eq!(x.nan_to_num(0.0, None, None).to_vec::<f32>(), [f32::MAX, 0.0]);
    let x = Tensor::from_vec(vec![f64::NEG_INFINITY], [1]);
    assert_eq!(x.nan_to_num(0.0, None, None).to_vec::<f64>(), [f64::MIN]);
    let mut rng = Rng::new(481);
    let (a, b) = (edgy(&mut rng, 35), edgy(&mut rng, 7));
    for dtype in [DType::F32, DType::F64] {
        for layout in LAYOUTS {
            let x = make(&a, &[5, 7], dtype, layout);
            let y = make(&b, &[1, 7], dtype, Layout::Contiguous);
            let (xs, ys) = (x.to_vec::<f64>(), y.to_vec::<f64>());
            let pairs = || xs.iter().enumerate().map(|(i, &u)| (u, ys[i % 7]));
            let logaddexp: Vec<f64> = pairs()
                .map(|(u, v)| {
                    let m = u.max(v);
                    if u == v && u.is_infinite() { u } else { m + (-(u - v).abs()).exp().ln_1p() }
                })
                .collect();
            let ctx = format!("{dtype:?} {layout:?}");
            assert_close(
                &read(&x.logaddexp(&y), dtype),
                &logaddexp,
                dtype,
                &format!("logaddexp {ctx}"),
            );
            let xlogy: Vec<f64> = pairs()
                .map(|(u, v)| if u == 0.0 && !v.is_nan() { 0.0 } else { u * v.ln() })
                .collect();
            assert_close(&read(&x.xlogy(&y), dtype), &xlogy, dtype, &format!("xlogy {ctx}"));
            let w = Tensor::full([5, 1], 0.75).to_dtype(dtype);
            let lerp: Vec<f64> = pairs().map(|(u, v)| v - (v - u) * 0.25).collect();
            assert_close(&read(&x.lerp(&y, &w), dtype), &lerp, dtype, &format!("lerp {ctx}"));
        }
    }
    // lerp's ends are exact: from `self` below 0.5, from `end` above.
    let (s, e) = (Tensor::from_vec(vec![0.1f32], [1]), Tensor::from_vec(vec![0.7f32], [1]));
    assert_eq!(s.lerp(&e, &Tensor::full([1], 1.0)).to_vec::<f32>(), [0.7]);
    assert_eq!(s.lerp(&e, &Tensor::full([1], 0.0)).to_vec::<f32>(), [0.1]);
}

#[test]
fn predicates_match_pytorch() {
    let mut rng = Rng::new(482);
    let data = edgy(&mut rng, 35);
    for layout in LAYOUTS {
        let x = make(&data, &[5, 7], DType::F32, layout);
        let v = x.to_vec::<f64>();
        let check = |t: Tensor, f: fn(f64) -> bool, name: &str| {
            assert_eq!(t.to_vec::<bool>(), v.iter().map(|&u| f(u)).collect::<Vec<_>>(), "{name}");
        };
        check(x.isnan(), f64::is_nan, "isnan");
        check(x.isinf(), f64::is_infinite, "isinf");
        check(x.isfinite(), f64::is_finite, "isfinite");
        let nonzero = v.iter().filter(|&&u| u != 0.0).count() as i64;
        assert_eq!(x.count_nonzero(&[] as &[i64]).item::<i64>(), nonzero);
        let rows: Vec<i64> =
            v.chunks(7).map(|r| r.iter().filter(|&&u| u != 0.0).count() as i64).collect();
        assert_eq!(x.count_nonzero(1).to_vec::<i64>(), rows);
    }
    // Integers are never NaN or infinite.
    let i = Tensor::from_vec(vec![1i64, -2, 0], [3]);
    assert_eq!(i.isnan().to_vec::<bool>(), [false; 3]);
    assert_eq!(i.isfinite().to_vec::<bool>(), [true; 3]);
    // isclose: |a - b| <= atol + rtol·|b|, equal infinities, NaN only with equal_nan.
    let a =
        Tensor::from_vec(vec![1.0f64, 100.0, f64::INFINITY, f64::NAN, 0.0, -f64::INFINITY], [6]);
    let b = Tensor::from_vec(
        vec![1.000_009, 100.002, f64::INFINITY, f64::NAN, 1e-9, f64::INFINITY],
        [6],
    );
    assert_eq!(
        a.isclose(&b, 1e-5, 1e-8, false).to_vec::<bool>(),
        [true, false, true, false, true, false]
    );
    assert_eq!(
        a.isclose(&b, 1e-5, 1e-8, true).to_vec::<bool>(),
        [true, false, true, true, true, false]
    );
    assert!(a.narrow(0, 0, 1).allclose(&b.narrow(0, 0, 1), 1e-5, 1e-8, false));
    assert!(!a.allclose(&b, 1e-5, 1e-8, true));
    let err = a.try_isclose(&b, -1.0, 0.0, false).unwrap_err();
    assert!(err.to_string().contains("non-negative"), "{err}");
    let err = a.try_isclose(&Tensor::zeros([4]), 1e-5, 1e-8, false).unwrap_err();
    assert!(err.to_string().contains("[6]") && err.to_string().contains("[4]"), "{err}");
}

#[test]
fn products_and_views_match_pytorch() {
    let mut rng = Rng::new(483);
    let (a, b) = (values(&mut rng, 5, DType::F64), values(&mut rng, 3, DType::F64));
    let (x, y) = (tensor(&a, &[5], DType::F64), tensor(&b, &[3], DType::F64));
    let outer: Vec<f64> = a.iter().flat_map(|&u| b.iter().map(move |&v| u * v)).collect();
    assert_close(&x.outer(&y).to_vec::<f64>(), &outer, DType::F64, "outer");
    assert!(x.try_outer(&x.reshape(&[5, 1])).unwrap_err().to_string().contains("rank 1"));
    let m1 = make(&values(&mut rng, 12, DType::F64), &[4, 3], DType::F64, Layout::Permuted);
    let m2 = make(&values(&mut rng, 6, DType::F64), &[3, 2], DType::F64, Layout::Sliced);
    let bias = tensor(&values(&mut rng, 2, DType::F64), &[2], DType::F64);
    let (p, q, c) = (m1.to_vec::<f64>(), m2.to_vec::<f64>(), bias.to_vec::<f64>());
    let want: Vec<f64> = (0..8)
        .map(|i| {
            let (r, k) = (i / 2, i % 2);
            0.5 * c[k] + 2.0 * (0..3).map(|j| p[r * 3 + j] * q[j * 2 + k]).sum::<f64>()
        })
        .collect();
    assert_close(&bias.addmm(&m1, &m2, 0.5, 2.0).to_vec::<f64>(), &want, DType::F64, "addmm");
    // beta 0 does not read self: its NaN stay out.
    let nan = Tensor::full([2], f64::NAN).double();
    assert!(nan.addmm(&m1, &m2, 0.0, 1.0).isfinite().all().item::<bool>());
    assert!(Tensor::zeros([3]).double().try_addmm(&m1, &m2, 1.0, 1.0).is_err());
    let col = Tensor::from_vec(vec![1i64, 2], [2, 1]);
    assert_eq!(col.expand_as(&Tensor::zeros([2, 3])).to_vec::<i64>(), [1, 1, 1, 2, 2, 2]);
    let m = Tensor::arange(0i64, 6, 1).reshape(&[2, 3]);
    let rows = m.unbind(0);
    assert_eq!((rows.len(), rows[1].to_vec::<i64>()), (2, vec![3, 4, 5]));
    assert_eq!(m.unbind(-1)[1].to_vec::<i64>(), [1, 4]);
    assert!(m.try_unbind(2).is_err());
}

#[test]
fn the_differentiable_ones_pass_gradcheck() {
    let mut rng = Rng::new(484);
    let mk = |rng: &mut Rng, dims: &[usize], layout, lo: f64| {
        let n = dims.iter().product();
        let data: Vec<f64> = (0..n).map(|_| rng.uniform(lo, 3.0)).collect();
        make(&data, dims, DType::F64, layout)
    };
    let pos = [mk(&mut rng, &[3, 4], Layout::Permuted, 0.5)];
    gradcheck(|t| t[0].rsqrt(), &pos, 1e-6, 1e-6).unwrap();
    gradcheck(|t| t[0].frac(), &pos, 1e-6, 1e-6).unwrap();
    let two = [
        mk(&mut rng, &[3, 4], Layout::Sliced, -3.0),
        mk(&mut rng, &[1, 4], Layout::Contiguous, 0.5),
    ];
    gradcheck(|t| t[0].logaddexp(&t[1]), &two, 1e-6, 1e-6).unwrap();
    gradcheck(|t| t[0].xlogy(&t[1]), &two, 1e-6, 1e-6).unwrap();
    let w = mk(&mut rng, &[3, 1], Layout::Contiguous, 0.0);
    gradcheck(|t| t[0].lerp(&t[1], &w), &two, 1e-6, 1e-6).unwrap();
    let vecs = [
        mk(&mut rng, &[4], Layout::Contiguous, -3.0),
        mk(&mut rng, &[3], Layout::Contiguous, -3.0),
    ];
    gradcheck(|t| t[0].outer(&t[1]), &vecs, 1e-6, 1e-6).unwrap();
    let mats = [
        mk(&mut rng, &[2], Layout::Contiguous, -3.0),
        mk(&mut rng, &[3, 4], Layout::Permuted, -3.0),
        mk(&mut rng, &[4, 2], Layout::Contiguous, -3.0),
    ];
    gradcheck(|t| t[0].addmm(&t[1], &t[2], 0.5, 1.5), &mats, 1e-6, 1e-6).unwrap();
}

#[test]
fn losses_match_their_definitions_and_pass_gradcheck() {
    use kiln::nn::functional::{self as F, KlReduction, Reduction};
    let mut rng = Rng::new(485);
    let (a, b) = (values(&mut rng, 12, DType::F64), values(&mut rng, 12, DType::F64));
    for layout in LAYOUTS {
        let x = make(&a, &[3, 4], DType::F64, layout);
        let y = make(&b, &[3, 4], DType::F64, Layout::Contiguous);
        let (xs, ys) = (x.to_vec::<f64>(), y.to_vec::<f64>());
        let d: Vec<f64> = xs.iter().zip(&ys).map(|(u, v)| u - v).collect();
        let mean = |v: Vec<f64>| v.iter().sum::<f64>() / v.len() as f64;
        let ctx = format!("{layout:?}");
        let l1 = mean(d.iter().map(|e| e.abs()).collect());
        assert_close(&[F::l1_loss(&x, &y, Reduction::Mean).item::<f64>()], &[l1], DType::F64, &ctx);
        let smooth: Vec<f64> = d
            .iter()
            .map(|e| if e.abs() < 0.7 { 0.5 * e * e / 0.7 } else { e.abs() - 0.35 })
            .collect();
        let got = F::smooth_l1_loss(&x, &y, Reduction::None, 0.7).to_vec::<f64>();
        assert_close(&got, &smooth, DType::F64, &format!("smooth_l1 {ctx}"));
        let huber: f64 = d
            .iter()
            .map(|e| if e.abs() < 0.7 { 0.5 * e * e } else { 0.7 * (e.abs() - 0.35) })
            .sum();
        let got = F::huber_loss(&x, &y, Reduction::Sum, 0.7).item::<f64>();
        assert_close(&[got], &[huber], DType::F64, &format!("huber {ctx}"));
        // Probabilities and log-probabilities from the same values.
        let p = x.sigmoid();
        let q = y.sigmoid();
        let (ps, qs) = (p.to_vec::<f64>(), q.to_vec::<f64>());
        let bce = mean(
            ps.iter().zip(&qs).map(|(p, t)| -(t * p.ln() + (1.0 - t) * (1.0 - p).ln())).collect(),
        );
        let got = F::binary_cross_entropy(&p, &q, Reduction::Mean).item::<f64>();
        assert_close(&[got], &[bce], DType::F64, &format!("bce {ctx}"));
        let log_q = q.log();
        let kl: f64 = ps.iter().zip(&qs).map(|(p, q)| p * (p.ln() - q.ln())).sum();
        let got = F::kl_div(&log_q, &p, KlReduction::BatchMean, false).item::<f64>();
        assert_close(&[got], &[kl / 3.0], DType::F64, &format!("kl_div {ctx}"));
        let got = F::kl_div(&log_q, &p.log(), KlReduction::Sum, true).item::<f64>();
        assert_close(&[got], &[kl], DType::F64, &format!("kl_div log_target {ctx}"));
    }
    // PyTorch's edges: log clamped at -100, 0·ln 0 = 0.
    let p = Tensor::from_vec(vec![0.0f64, 1.0], [2]);
    let t = Tensor::from_vec(vec![1.0f64, 1.0], [2]);
    assert_eq!(F::binary_cross_entropy(&p, &t, Reduction::None).to_vec::<f64>(), [100.0, 0.0]);
    let zero = Tensor::zeros([2]).double();
    assert_eq!(F::kl_div(&p, &zero, KlReduction::Sum, false).item::<f64>(), 0.0);
    assert!(F::try_huber_loss(&p, &t, Reduction::Mean, 0.0).is_err());
    assert!(F::try_l1_loss(&p, &Tensor::zeros([3]).double(), Reduction::Mean).is_err());
    let inputs = [
        make(&a, &[3, 4], DType::F64, Layout::Permuted),
        make(&b, &[3, 4], DType::F64, Layout::Contiguous),
    ];
    gradcheck(|t| F::smooth_l1_loss(&t[0], &t[1], Reduction::Sum, 0.7), &inputs, 1e-6, 1e-6)
        .unwrap();
    gradcheck(|t| F::huber_loss(&t[0], &t[1], Reduction::Mean, 0.7), &inputs, 1e-6, 1e-6).unwrap();
    gradcheck(
        |t| F::binary_cross_entropy(&t[0].sigmoid(), &t[1].sigmoid(), Reduction::Mean),
        &inputs,
        1e-6,
        1e-6,
    )
    .unwrap();
    gradcheck(
        |t| F::kl_div(&t[0].log_softmax(-1), &t[1].softmax(-1), KlReduction::BatchMean, false),
        &inputs,
        1e-6,
        1e-6,
    )
    .unwrap();
}

#[test]
fn distances_and_one_hot_match_pytorch() {
    use kiln::nn::functional as F;
    let mut rng = Rng::new(486);
    let (a, b) = (values(&mut rng, 12, DType::F64), values(&mut rng, 4, DType::F64));
    let x = make(&a, &[3, 4], DType::F64, Layout::Permuted);
    let y = tensor(&b, &[1, 4], DType::F64);
    let (xs, ys) = (x.to_vec::<f64>(), y.to_vec::<f64>());
    let norm = |v: &[f64]| v.iter().map(|u| u * u).sum::<f64>().sqrt();
    let cos: Vec<f64> = xs
        .chunks(4)
        .map(|r| r.iter().zip(&ys).map(|(u, v)| u * v).sum::<f64>() / (norm(r) * norm(&ys)))
        .collect();
    assert_close(&F::cosine_similarity(&x, &y, 1, 1e-8).to_vec::<f64>(), &cos, DType::F64, "cos");
    let unit: Vec<f64> = xs.chunks(4).flat_map(|r| r.iter().map(move |u| u / norm(r))).collect();
    assert_close(&F::normalize(&x, 2.0, 1, 1e-12).to_vec::<f64>(), &unit, DType::F64, "normalize");
    let dist: Vec<f64> = xs
        .chunks(4)
        .map(|r| r.iter().zip(&ys).map(|(u, v)| (u - v + 1e-6).powi(2)).sum::<f64>().sqrt())
        .collect();
    assert_close(
        &F::pairwise_distance(&x, &y, 2.0, 1e-6, false).to_vec::<f64>(),
        &dist,
        DType::F64,
        "pdist",
    );
    // A zero vector stays zero, its similarity 0, not NaN.
    let z = Tensor::zeros([1, 4]).double();
    assert_eq!(F::normalize(&z, 2.0, 1, 1e-12).to_vec::<f64>(), [0.0; 4]);
    assert_eq!(F::cosine_similarity(&z, &y, 1, 1e-8).to_vec::<f64>(), [0.0]);
    gradcheck(|t| F::cosine_similarity(&t[0], &t[1], 1, 1e-8), &[x.clone(), y.clone()], 1e-6, 1e-6)
        .unwrap();
    let idx = Tensor::from_vec(vec![1i64, 0, 3, 1], [2, 2]);
    let oh = F::one_hot(&idx, None);
    assert_eq!(oh.dims(), [2, 2, 4]);
    assert_eq!(oh.to_vec::<i64>(), [0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0]);
    let err = F::try_one_hot(&idx, Some(3)).unwrap_err().to_string();
    assert!(err.contains("class 3 is outside 0..3"), "{err}");
    assert!(F::try_one_hot(&idx.float(), None).is_err());
}

#[test]
fn rearrangements_match_pytorch() {
    let mut rng = Rng::new(487);
    let data = values(&mut rng, 12, DType::F64);
    for layout in LAYOUTS {
        let x = make(&data, &[3, 4], DType::F64, layout);
        let v = x.to_vec::<f64>();
        let ctx = format!("{layout:?}");
        // repeat_interleave along 0 and 1, and flattened.
        let rows: Vec<f64> = v.chunks(4).flat_map(|r| [r, r].concat()).collect();
        assert_eq!(x.repeat_interleave(2, Some(0)).to_vec::<f64>(), rows, "{ctx}");
        let cols: Vec<f64> = v.iter().flat_map(|&u| [u, u, u]).collect();
        assert_eq!(x.repeat_interleave(3, Some(1)).to_vec::<f64>(), cols, "{ctx}");
        assert_eq!(x.repeat_interleave(3, None).to_vec::<f64>(), cols, "{ctx}");
        // diag of a matrix for every offset, including past the edges.
        for k in -4i64..=5 {
            let want: Vec<f64> = (0..3i64)
                .filter_map(|r| {
                    let c = r + k;
                    (0..4).contains(&c).then(|| v[(r * 4 + c) as usize])
                })
                .collect();
            assert_eq!(x.diag(k).to_vec::<f64>(), want, "diag {k} {ctx}");
        }
        // take_along_dim with broadcast indices.
        let idx = Tensor::from_vec(vec![3i64, 0], [1, 2]);
        let want: Vec<f64> = (0..3).flat_map(|r| [v[r * 4 + 3], v[r * 4]]).collect();
        assert_eq!(x.take_along_dim(&idx, 1).to_vec::<f64>(), want, "{ctx}");
        // rot90 k times against the index map.
        let r1: Vec<f64> = (0..4)
            .flat_map(|i| (0..3).map(move |j| (i, j)))
            .map(|(i, j)| v[j * 4 + (3 - i)])
            .collect();
        assert_eq!(x.rot90(1, [0, 1]).to_vec::<f64>(), r1, "{ctx}");
        let r2: Vec<f64> = v.iter().rev().copied().collect();
        assert_eq!(x.rot90(2, [0, 1]).to_vec::<f64>(), r2, "{ctx}");
        assert_eq!(x.rot90(-1, [0, 1]).to_vec::<f64>(), x.rot90(3, [0, 1]).to_vec::<f64>());
        assert_eq!(x.rot90(4, [0, 1]).to_vec::<f64>(), v);
    }
    // diag of a vector, both ways round.
    let d = Tensor::from_vec(vec![1.0f64, 2.0, 3.0], [3]);
    for k in [-2i64, 0, 1] {
        let m = d.diag(k);
        let n = 3 + k.unsigned_abs() as usize;
        assert_eq!(m.dims(), [n, n]);
        assert_eq!(m.diag(k).to_vec::<f64>(), [1.0, 2.0, 3.0], "diag {k}");
        assert_eq!(m.sum().item::<f64>(), 6.0);
    }
    assert!(Tensor::zeros([2, 2, 2]).try_diag(0).is_err());
    let (a, b) = (Tensor::arange(0i64, 3, 1), Tensor::arange(10i64, 12, 1));
    let ij = Tensor::meshgrid(&[&a, &b], kiln::Indexing::Ij);
    assert_eq!(ij[1].to_vec::<i64>(), [10, 11, 10, 11, 10, 11]);
    let xy = Tensor::meshgrid(&[&a, &b], kiln::Indexing::Xy);
    assert_eq!((xy[0].dims(), xy[0].to_vec::<i64>()), (&[2usize, 3][..], vec![0, 1, 2, 0, 1, 2]));
    assert!(Tensor::try_meshgrid(&[&Tensor::zeros([2, 2])], kiln::Indexing::Ij).is_err());
    assert!(Tensor::zeros([3, 4]).try_take_along_dim(&Tensor::zeros([2, 2]).long(), 1).is_err());
    assert!(Tensor::zeros([3, 4]).try_rot90(1, [1, 1]).is_err());
    // Gradients flow through each.
    let m = [make(&data, &[3, 4], DType::F64, Layout::Permuted)];
    gradcheck(|t| t[0].repeat_interleave(2, Some(1)) * 1.5, &m, 1e-6, 1e-6).unwrap();
    gradcheck(|t| t[0].diag(1), &m, 1e-6, 1e-6).unwrap();
    gradcheck(|t| t[0].rot90(1, [0, 1]), &m, 1e-6, 1e-6).unwrap();
    gradcheck(|t| t[0].narrow(0, 0, 1).squeeze(0).diag(-1), &m, 1e-6, 1e-6).unwrap();
}

#[test]
fn pixel_shuffles_ranking_losses_and_identity_match_pytorch() {
    use kiln::nn::functional::{self as F, Reduction};
    use kiln::nn::{Identity, Module, PixelShuffle, PixelUnshuffle};
    // out[n, c, h·r + i, w·r + j] = in[n, c·r² + i·r + j, h, w].
    let (n, c, h, w, r) = (2usize, 3, 2, 3, 2);
    let x = Tensor::arange(0i64, (n * c * r * r * h * w) as i64, 1).reshape(&[2, 12, 2, 3]);
    let y = F::pixel_shuffle(&x, r);
    assert_eq!(y.dims(), [n, c, h * r, w * r]);
    let (xs, ys) = (x.to_vec::<i64>(), y.to_vec::<i64>());
    for (flat, &got) in ys.iter().enumerate() {
        let idx = unravel(flat, &[n, c, h * r, w * r]);
        let (hh, i, ww, j) = (idx[2] / r, idx[2] % r, idx[3] / r, idx[3] % r);
        let want = xs[ravel(&[idx[0], idx[1] * r * r + i * r + j, hh, ww], &[n, c * r * r, h, w])];
        assert_eq!(got, want, "{idx:?}");
    }
    assert_eq!(F::pixel_unshuffle(&y, r).to_vec::<i64>(), xs);
    assert_eq!(PixelUnshuffle(2).forward(&PixelShuffle(2).forward(&x)).to_vec::<i64>(), xs);
    assert!(F::try_pixel_shuffle(&x.narrow(1, 0, 5), 2).is_err());
    assert!(F::try_pixel_unshuffle(&x, 2).is_err());
    assert_eq!(Identity.forward(&x).to_vec::<i64>(), xs);
    let mut rng = Rng::new(488);
    let (a, b) = (values(&mut rng, 6, DType::F64), values(&mut rng, 6, DType::F64));
    let (x1, x2) = (tensor(&a, &[6], DType::F64), tensor(&b, &[6], DType::F64));
    let y = Tensor::from_vec(vec![1.0f64, -1.0, 1.0, 1.0, -1.0, -1.0], [6]);
    let ys = y.to_vec::<f64>();
    let want: f64 = (0..6).map(|i| (-ys[i] * (a[i] - b[i]) + 0.3).max(0.0)).sum::<f64>() / 6.0;
    let got = F::margin_ranking_loss(&x1, &x2, &y, 0.3, Reduction::Mean).item::<f64>();
    assert_close(&[got], &[want], DType::F64, "margin_ranking");
    let t = |rng: &mut Rng| tensor(&values(rng, 12, DType::F64), &[3, 4], DType::F64);
    let (an, po, ne) = (t(&mut rng), t(&mut rng), t(&mut rng));
    let d = |u: &Tensor, v: &Tensor| -> Vec<f64> {
        let (u, v) = (u.to_vec::<f64>(), v.to_vec::<f64>());
        (0..3)
            .map(|r| {
                (0..4).map(|k| (u[r * 4 + k] - v[r * 4 + k] + 1e-6).powi(2)).sum::<f64>().sqrt()
            })
            .collect()
    };
    let (dp, dn, ds) = (d(&an, &po), d(&an, &ne), d(&po, &ne));
    for swap in [false, true] {
        let want: Vec<f64> = (0..3)
            .map(|i| (dp[i] - if swap { dn[i].min(ds[i]) } else { dn[i] } + 1.0).max(0.0))
            .collect();
        let got = F::triplet_margin_loss(&an, &po, &ne, 1.0, 2.0, 1e-6, swap, Reduction::None);
        assert_close(&got.to_vec::<f64>(), &want, DType::F64, &format!("triplet swap {swap}"));
    }
}

#[test]
fn hyperbolic_functions_and_hypot_keep_their_digits() {
    unary("sinh", Tensor::sinh, f64::sinh);
    unary("cosh", Tensor::cosh, f64::cosh);
    unary("asinh", Tensor::asinh, f64::asinh);
    unary("acosh", Tensor::acosh, f64::acosh);
    unary("atanh", Tensor::atanh, f64::atanh);
    // Near their delicate points, in f64: tiny arguments, 1 for acosh, huge ones.
    let tiny = Tensor::from_vec(vec![1e-300f64, -3e-17, 1e-8], [3]);
    for (name, got, want) in [
        ("sinh", tiny.sinh(), f64::sinh as fn(f64) -> f64),
        ("asinh", tiny.asinh(), f64::asinh),
        ("atanh", tiny.atanh(), f64::atanh),
    ] {
        let want: Vec<f64> = tiny.to_vec::<f64>().iter().map(|&v| want(v)).collect();
        assert_close_tol(&got.to_vec::<f64>(), &want, 1e-15, name);
    }
    let near_one = Tensor::from_vec(vec![1.0f64 + 1e-12, 1.5, 1e300], [3]);
    let want: Vec<f64> = near_one.to_vec::<f64>().iter().map(|v| v.acosh()).collect();
    assert_close_tol(&near_one.acosh().to_vec::<f64>(), &want, 1e-12, "acosh");
    let huge = Tensor::from_vec(vec![-1e300f64, 3e8], [2]);
    let want: Vec<f64> = huge.to_vec::<f64>().iter().map(|v| v.asinh()).collect();
    assert_close_tol(&huge.asinh().to_vec::<f64>(), &want, 1e-15, "asinh huge");
    let mut rng = Rng::new(489);
    let (a, b) = (edgy(&mut rng, 35), edgy(&mut rng, 7));
    for dtype in [DType::F32, DType::F64] {
        let x = make(&a, &[5, 7], dtype, Layout::Sliced);
        let y = make(&b, &[1, 7], dtype, Layout::Contiguous);
        let (xs, ys) = (x.to_vec::<f64>(), y.to_vec::<f64>());
        let want: Vec<f64> =
            xs.iter().enumerate().map(|(i, u)| round_to(dtype, u.hypot(ys[i % 7]))).collect();
        assert_close(&read(&x.hypot(&y), dtype), &want, dtype, &format!("hypot {dtype:?}"));
    }
    let big = Tensor::from_vec(vec![3e300f64, 1e-300], [2]);
    let other = Tensor::from_vec(vec![4e300f64, 1e-300], [2]);
    assert_close_tol(
        &big.hypot(&other).to_vec::<f64>(),
        &[5e300, 2f64.sqrt() * 1e-300],
        1e-15,
        "hypot range",
    );
    let mut rng = Rng::new(490);
    let mk = |rng: &mut Rng, lo: f64, hi: f64| {
        let data: Vec<f64> = (0..12).map(|_| rng.uniform(lo, hi)).collect();
        make(&data, &[3, 4], DType::F64, Layout::Permuted)
    };
    gradcheck(|t| t[0].sinh() + t[0].cosh() + t[0].asinh(), &[mk(&mut rng, -2.0, 2.0)], 1e-6, 1e-6)
        .unwrap();
    gradcheck(|t| t[0].acosh(), &[mk(&mut rng, 1.5, 3.0)], 1e-6, 1e-6).unwrap();
    gradcheck(|t| t[0].atanh(), &[mk(&mut rng, -0.8, 0.8)], 1e-6, 1e-6).unwrap();
    gradcheck(
        |t| t[0].hypot(&t[1]),
        &[mk(&mut rng, -2.0, 2.0), mk(&mut rng, 0.5, 2.0)],
        1e-6,
        1e-6,
    )
    .unwrap();
}

#[test]
fn inverse_trigonometry_signs_and_tensor_clamps_match_c() {
    unary("asin", Tensor::asin, f64::asin);
    unary("acos", Tensor::acos, f64::acos);
    unary(
        "signbit",
        |x| x.signbit().to_dtype(x.dtype()),
        |v| if v.is_sign_negative() && !v.is_nan() { 1.0 } else { 0.0 },
    );
    // Near the ends of [-1, 1], where 1 - x² would lose the digits.
    let ends = [1.0 - 1e-12, -1.0 + 1e-12, 1.0 - 1e-6, 1e-300, -1.0, 1.0];
    let x = Tensor::from_vec(ends.to_vec(), [6]);
    for (name, got, f) in
        [("asin", x.asin(), f64::asin as fn(f64) -> f64), ("acos", x.acos(), f64::acos)]
    {
        for (g, v) in got.to_vec::<f64>().iter().zip(ends) {
            assert!(
                (g - f(v)).abs() <= 8.0 * f64::EPSILON * f(v).abs().max(1e-300),
                "{name}({v}) = {g}"
            );
        }
    }
    // atan2 over every pair of edges: signed zeros, infinities, NaN, both signs.
    let edges = [0.0, -0.0, 1.0, -1.0, 2.5, -0.3, f64::INFINITY, f64::NEG_INFINITY, f64::NAN];
    let (ys, xs): (Vec<f64>, Vec<f64>) =
        edges.iter().flat_map(|&y| edges.iter().map(move |&x| (y, x))).unzip();
    for dtype in [DType::F64, DType::F32] {
        let (y, x) = (tensor(&ys, &[81], dtype), tensor(&xs, &[81], dtype));
        let got = read(&y.atan2(&x), dtype);
        for ((g, &a), &b) in got.iter().zip(&ys).zip(&xs) {
            let want = round_to(dtype, a.atan2(b));
            let ok = (g.is_nan() && want.is_nan())
                || (g.to_bits() == want.to_bits())
                || (g - want).abs() <= 4.0 * tolerance(dtype) * want.abs();
            assert!(ok, "atan2({a}, {b}) = {g} in {dtype:?}, C gives {want}");
        }
        let got = read(&x.copysign(&y), dtype);
        for ((g, &a), &b) in got.iter().zip(&xs).zip(&ys) {
            let want = round_to(dtype, a.copysign(b));
            assert!(
                g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                "copysign({a}, {b}) = {g}"
            );
        }
    }
    // Broadcast, through a view.
    let mut rng = Rng::new(491);
    let a = make(&values(&mut rng, 12, DType::F64), &[3, 4], DType::F64, Layout::Permuted);
    let b = tensor(&values(&mut rng, 4, DType::F64), &[4], DType::F64);
    let got = a.atan2(&b).to_vec::<f64>();
    let (av, bv) = (a.to_vec::<f64>(), b.to_vec::<f64>());
    for (i, g) in got.iter().enumerate() {
        assert!((g - av[i].atan2(bv[i % 4])).abs() < 1e-14);
    }
    // clamp with tensor bounds: NaN kept, min > max gives max.
    let x = Tensor::from_vec(vec![-3.0f64, 0.5, 7.0, f64::NAN, 2.0], [5]);
    let lo = Tensor::from_vec(vec![-1.0f64, 1.0, 0.0, 0.0, 5.0], [5]);
    let hi = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 1.0, 4.0], [5]);
    let got = x.clamp_tensor(Some(&lo), Some(&hi)).to_vec::<f64>();
    assert_eq!(&got[..3], &[-1.0, 1.0, 3.0]);
    assert!(got[3].is_nan() && got[4] == 4.0, "{got:?}");
    assert!(x.try_clamp_tensor(None, None).unwrap_err().to_string().starts_with("clamp"));
    let mk = |rng: &mut Rng, lo: f64, hi: f64| {
        let data: Vec<f64> = (0..12).map(|_| rng.uniform(lo, hi)).collect();
        make(&data, &[3, 4], DType::F64, Layout::Permuted)
    };
    gradcheck(|t| t[0].asin() + t[0].acos() * 2.0, &[mk(&mut rng, -0.9, 0.9)], 1e-6, 1e-6).unwrap();
    gradcheck(
        |t| t[0].atan2(&t[1]),
        &[mk(&mut rng, -2.0, 2.0), mk(&mut rng, 0.5, 2.0)],
        1e-6,
        1e-6,
    )
    .unwrap();
    gradcheck(
        |t| t[0].atan2(&t[1]),
        &[mk(&mut rng, -2.0, 2.0), mk(&mut rng, -2.0, -0.5)],
        1e-6,
        1e-6,
    )
    .unwrap();
    let signs = mk(&mut rng, -1.0, 1.0);
    gradcheck(|t| t[0].copysign(&signs), &[mk(&mut rng, 0.5, 2.0)], 1e-6, 1e-6).unwrap();
    gradcheck(
        |t| t[0].clamp_tensor(Some(&t[1]), None),
        &[mk(&mut rng, -1.0, 1.0), mk(&mut rng, -1.0, 1.0)],
        1e-6,
        1e-6,
    )
    .unwrap();
}

#[test]
fn lgamma_and_digamma_match_the_c_library_and_known_values() {
    let mut xs: Vec<f64> = (0..1400).map(|i| -20.0 + i as f64 * 0.05 + 0.0173).collect();
    xs.extend([0.5, 1.0, 2.0, 3.0, 1e-8, 1.0 + 1e-9, 2.0 - 1e-9, 1e6, 1e15, 171.5, -0.5, -7.5]);
    let got = Tensor::from_vec(xs.clone(), [xs.len()]).lgamma().to_vec::<f64>();
    for (g, &x) in got.iter().zip(&xs) {
        let want = libm::lgamma(x);
        assert!(
            (g - want).abs() <= 2e-13 * want.abs().max(1.0),
            "lgamma({x}) = {g}, C gives {want}"
        );
    }
    let poles = Tensor::from_vec(vec![0.0f64, -1.0, -4.0, f64::INFINITY, f64::NAN], [5]).lgamma();
    let p = poles.to_vec::<f64>();
    assert!(p[..4].iter().all(|v| *v == f64::INFINITY) && p[4].is_nan(), "{p:?}");
    // f32: the f64 value rounded.
    let small: Vec<f64> = xs.iter().copied().filter(|x| x.abs() < 30.0).collect();
    let got = tensor(&small, &[small.len()], DType::F32).lgamma().to_vec::<f32>();
    for (g, &x) in got.iter().zip(&small) {
        let want = libm::lgamma(f64::from(x as f32)) as f32;
        assert!((g - want).abs() <= 4.0 * f32::EPSILON * want.abs().max(1.0), "f32 lgamma({x})");
    }
    // digamma: ψ(n + 1) = H(n) - γ, ψ(1/2) = -γ - 2 ln 2, and lgamma's slope elsewhere.
    let euler = 0.577_215_664_901_532_9;
    let known = Tensor::from_vec(vec![1.0f64, 5.0, 0.5], [3]).digamma().to_vec::<f64>();
    let h4: f64 = (1..5).map(|k| 1.0 / k as f64).sum();
    assert!((known[0] + euler).abs() < 1e-14 && (known[1] - (h4 - euler)).abs() < 1e-14);
    assert!((known[2] + euler + 2.0 * 2f64.ln()).abs() < 1e-14, "{known:?}");
    let got = Tensor::from_vec(xs.clone(), [xs.len()]).digamma().to_vec::<f64>();
    for (g, &x) in got.iter().zip(&xs) {
        if x.abs() > 1e5 || (x - x.round()).abs() < 1e-3 {
            continue;
        }
        let h = 1e-6 * x.abs().max(1.0);
        let slope = (libm::lgamma(x + h) - libm::lgamma(x - h)) / (2.0 * h);
        assert!(
            (g - slope).abs() <= 1e-6 * slope.abs().max(1.0),
            "digamma({x}) = {g}, slope {slope}"
        );
    }
    let edges = Tensor::from_vec(vec![0.0f64, -3.0, f64::INFINITY], [3]).digamma().to_vec::<f64>();
    assert!(
        edges[0] == f64::NEG_INFINITY && edges[1].is_nan() && edges[2] == f64::INFINITY,
        "{edges:?}"
    );
    // lgamma's gradient is digamma; digamma's is checked numerically.
    let x = Tensor::from_vec(vec![0.3f64, 1.7, 4.2, -2.4], [4]).requires_grad_(true);
    x.lgamma().sum().backward();
    let want = x.detach().digamma().to_vec::<f64>();
    assert_close_tol(&x.grad().expect("a gradient").to_vec::<f64>(), &want, 1e-10, "d lgamma");
    gradcheck(
        |t| t[0].digamma(),
        &[Tensor::from_vec(vec![0.3f64, 1.7, 4.2, -2.4], [4])],
        1e-6,
        1e-5,
    )
    .unwrap();
}
