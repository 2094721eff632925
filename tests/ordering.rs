//! `argsort`, `sort`, `topk`, `cumprod`, `roll`, `multinomial`, `bernoulli`, vector norms,
//! `atan` and `functional::embedding`, against plain f64 loops.

use kiln::autograd::gradcheck;
use kiln::nn::functional as F;
use kiln::prelude::*;

use crate::common::*;

/// The stable order of `line` (ascending; NaN last), as PyTorch's `sort(stable=True)`.
fn reference_order(line: &[f64], descending: bool) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..line.len()).collect();
    idx.sort_by(|&a, &b| {
        let (x, y) = (line[a], line[b]);
        let o = match (x.is_nan(), y.is_nan()) {
            (false, false) => x.partial_cmp(&y).expect("numbers"),
            (p, q) => p.cmp(&q),
        };
        if descending { o.reverse() } else { o }
    });
    idx
}

/// Lines of `data` (row-major, `shape`) along `axis`: each line's flat positions.
fn lines(shape: &[usize], axis: usize) -> Vec<Vec<usize>> {
    let n: usize = shape.iter().product();
    let stride: usize = shape[axis + 1..].iter().product();
    (0..n)
        .filter(|&i| (i / stride).is_multiple_of(shape[axis]))
        .map(|start| (0..shape[axis]).map(|k| start + k * stride).collect())
        .collect()
}

#[test]
fn sort_argsort_and_topk_match_a_stable_sort_in_every_layout() {
    let mut rng = Rng::new(301);
    for dtype in [DType::F32, DType::F64, DType::I64, DType::I32] {
        for layout in LAYOUTS {
            for (shape, axis) in
                [(vec![5, 9], 1usize), (vec![7, 3, 4], 0), (vec![4, 6, 5], 1), (vec![17], 0)]
            {
                let n: usize = shape.iter().product();
                // Few distinct values, so ties are common and stability shows.
                let mut data: Vec<f64> =
                    (0..n).map(|_| round_to(dtype, (rng.int(-4, 5) as f64) * 0.5)).collect();
                if dtype.is_float() {
                    data[0] = f64::NAN;
                    data[n / 2] = -0.0;
                }
                let x = make(&data, &shape, dtype, layout);
                for descending in [false, true] {
                    let idx = x.argsort(axis as i64, descending).to_vec::<i64>();
                    let (values, sidx) = x.sort(axis as i64, descending);
                    assert_eq!(sidx.to_vec::<i64>(), idx);
                    let values = read(&values, dtype);
                    for line in lines(&shape, axis) {
                        let vals: Vec<f64> = line.iter().map(|&i| data[i]).collect();
                        let want = reference_order(&vals, descending);
                        let got: Vec<usize> = line.iter().map(|&i| idx[i] as usize).collect();
                        assert_eq!(
                            got, want,
                            "{dtype:?} {layout:?} {shape:?} axis {axis} desc {descending}"
                        );
                        for (k, &i) in line.iter().enumerate() {
                            let w = vals[want[k]];
                            assert!(values[i] == w || (values[i].is_nan() && w.is_nan()));
                        }
                    }
                }
                let k = shape[axis].min(3);
                let (top, top_idx) = x.topk(k, axis as i64, true);
                let mut top_dims = shape.clone();
                top_dims[axis] = k;
                assert_eq!(top.dims(), top_dims.as_slice());
                let full = x.argsort(axis as i64, true).narrow(axis as i64, 0, k).to_vec::<i64>();
                assert_eq!(top_idx.to_vec::<i64>(), full);
                let (_, low_idx) = x.topk(k, axis as i64, false);
                let asc = x.argsort(axis as i64, false).narrow(axis as i64, 0, k).to_vec::<i64>();
                assert_eq!(low_idx.to_vec::<i64>(), asc);
            }
        }
    }
}

#[test]
fn sorted_values_and_topk_pass_gradcheck() {
    let mut rng = Rng::new(302);
    // Distinct values: the sort is locally constant, so its gradient is a permutation.
    let data = values(&mut rng, 4 * 7, DType::F64);
    let x = make(&data, &[4, 7], DType::F64, Layout::Permuted);
    gradcheck(
        |t| t[0].sort(1, true).0 * Tensor::arange(1.0f64, 8.0, 1.0),
        std::slice::from_ref(&x),
        1e-6,
        1e-6,
    )
    .unwrap();
    gradcheck(|t| t[0].topk(3, 0, false).0.square(), std::slice::from_ref(&x), 1e-6, 1e-6).unwrap();
}

#[test]
fn topk_and_sort_errors_name_the_op_and_the_fix() {
    let x = Tensor::zeros([3, 4]);
    let err = x.try_topk(5, 1, true).unwrap_err().to_string();
    assert!(err.contains("topk") && err.contains("k = 5") && err.contains("[3, 4]"), "{err}");
    let err = x.try_argsort(2, false).unwrap_err().to_string();
    assert!(err.contains("argsort"), "{err}");
    assert!(x.try_roll(&[1, 2], &[0]).is_err());
    assert!(x.try_roll(&[1, 2], &[]).is_err());
    assert!(x.try_cumprod(-3).is_err());
}

#[test]
fn cumprod_matches_the_running_product_and_its_gradient_is_exact_at_zeros() {
    let mut rng = Rng::new(303);
    for dtype in [DType::F32, DType::F64, DType::I64] {
        for layout in LAYOUTS {
            for (shape, axis) in
                [(vec![3, 13], 1usize), (vec![9, 2, 3], 0), (vec![1], 0), (vec![2, 33], 1)]
            {
                let n: usize = shape.iter().product();
                let data: Vec<f64> = (0..n)
                    .map(|_| {
                        if dtype.is_float() {
                            round_to(dtype, rng.uniform(0.6, 1.4))
                        } else {
                            rng.int(-2, 3) as f64
                        }
                    })
                    .collect();
                let x = make(&data, &shape, dtype, layout);
                let got = read(
                    &x.cumprod(axis as i64),
                    if dtype.is_float() { dtype } else { DType::I64 },
                );
                let mut want = data.clone();
                for line in lines(&shape, axis) {
                    let mut p = 1.0;
                    for &i in &line {
                        p *= data[i];
                        want[i] = p;
                    }
                }
                let tol = if dtype == DType::F32 { 1e-5 } else { 1e-13 };
                assert_close_tol(
                    &got,
                    &want,
                    tol,
                    &format!("cumprod {dtype:?} {layout:?} {shape:?}"),
                );
            }
        }
    }
    let mut data = values(&mut rng, 2 * 6, DType::F64);
    data[2] = 0.0; // one zero in the first row, two in the second
    data[7] = 0.0;
    data[9] = 0.0;
    let x = make(&data, &[2, 6], DType::F64, Layout::Sliced);
    gradcheck(|t| t[0].cumprod(1), std::slice::from_ref(&x), 1e-6, 1e-6).unwrap();
}

#[test]
fn roll_moves_every_element_by_its_shift() {
    let mut rng = Rng::new(304);
    let shape = [3usize, 4, 5];
    let data = values(&mut rng, 60, DType::F64);
    for layout in LAYOUTS {
        let x = make(&data, &shape, DType::F64, layout);
        for (shifts, dims) in
            [(vec![1i64], vec![2i64]), (vec![-2, 7], vec![0, -1]), (vec![3, 1, -9], vec![0, 1, 2])]
        {
            let got = x.roll(&shifts, &dims).to_vec::<f64>();
            let mut want = vec![0.0; 60];
            for (flat, &v) in data.iter().enumerate() {
                let mut idx = unravel(flat, &shape);
                for (&s, &d) in shifts.iter().zip(&dims) {
                    let d = d.rem_euclid(3) as usize;
                    idx[d] = (idx[d] as i64 + s).rem_euclid(shape[d] as i64) as usize;
                }
                want[ravel(&idx, &shape)] = v;
            }
            assert_eq!(got, want, "{layout:?} {shifts:?} {dims:?}");
        }
        let flat = x.roll(&[13], &[]).to_vec::<f64>();
        let want: Vec<f64> = (0..60).map(|i| data[(i + 60 - 13) % 60]).collect();
        assert_eq!(flat, want);
    }
    let x = make(&data[..12], &[3, 4], DType::F64, Layout::Permuted);
    gradcheck(|t| t[0].roll(&[1, -1], &[0, 1]).square(), std::slice::from_ref(&x), 1e-6, 1e-6)
        .unwrap();
}

#[test]
fn multinomial_draws_follow_the_weights() {
    kiln::manual_seed(5);
    let weights = [0.5f64, 0.0, 2.0, 1.0, 0.5];
    let w = Tensor::from_vec(weights.iter().map(|&v| v as f32).collect::<Vec<_>>(), [1, 5])
        .expand(&[3, 5]);
    let draws = w.multinomial(4000, true);
    assert_eq!(draws.dims(), [3, 4000]);
    let draws = draws.to_vec::<i64>();
    let total: f64 = weights.iter().sum();
    for row in draws.chunks(4000) {
        let mut counts = [0usize; 5];
        row.iter().for_each(|&i| counts[i as usize] += 1);
        assert_eq!(counts[1], 0, "a zero weight is never drawn");
        for (c, w) in counts.iter().zip(weights) {
            let p = w / total;
            // 5 standard deviations of a binomial count.
            let sd = (4000.0 * p * (1.0 - p)).sqrt();
            assert!((*c as f64 - 4000.0 * p).abs() <= 5.0 * sd + 1.0, "{counts:?}");
        }
    }
    // Without replacement: distinct categories, zero weights last, first draws favor weight.
    let picks = w.multinomial(5, false).to_vec::<i64>();
    for row in picks.chunks(5) {
        let mut sorted = row.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1, 2, 3, 4]);
        assert_eq!(row[4], 1);
    }
    let mut first_is_2 = 0;
    for _ in 0..200 {
        first_is_2 += usize::from(w.narrow(0, 0, 1).multinomial(2, false).to_vec::<i64>()[0] == 2);
    }
    assert!((80..140).contains(&first_is_2), "{first_is_2} of 200 (expected 100)");
    // Same seed, same draws.
    kiln::manual_seed(9);
    let a = w.multinomial(7, true).to_vec::<i64>();
    kiln::manual_seed(9);
    assert_eq!(w.multinomial(7, true).to_vec::<i64>(), a);
}

/// Weights that are not a distribution (all zero, negative, infinite, NaN) are an error
/// naming the row, as in PyTorch: at the call for weights already computed, when the draws
/// are computed for weights the program computes; never an out-of-range category.
#[test]
fn multinomial_refuses_rows_that_are_not_distributions() {
    let good = [1.0f32, 2.0, 3.0];
    for bad in
        [[0.0f32, 0.0, 0.0], [1.0, -1.0, 2.0], [1.0, f32::INFINITY, 1.0], [f32::NAN, 1.0, 1.0]]
    {
        let w = Tensor::from_vec([good, bad].concat(), [2, 3]);
        w.realize();
        for replacement in [true, false] {
            let err = w.try_multinomial(2, replacement).unwrap_err().to_string();
            assert!(err.starts_with("multinomial: row 1 of the weights"), "{bad:?}: {err}");
            // Computed by the program: the draws' realization fails instead.
            let lazy = &w * 1.0;
            let draws = lazy.try_multinomial(2, replacement).expect("recorded");
            let err = draws.try_to_vec::<i64>().unwrap_err().to_string();
            assert!(err.contains("multinomial: row 1 of the weights"), "{bad:?}: {err}");
        }
    }
    // A 1-D row, and good rows still draw.
    let zeros = Tensor::zeros([4]).try_multinomial(1, true).and_then(|d| d.try_to_vec::<i64>());
    let err = zeros.unwrap_err().to_string();
    assert!(err.contains("row 0"), "{err}");
    let w = Tensor::from_vec(good.to_vec(), [3]) * 2.0;
    assert!(w.multinomial(5, true).to_vec::<i64>().iter().all(|&c| (0..3).contains(&c)));
}

#[test]
fn bernoulli_draws_ones_at_the_given_rate() {
    kiln::manual_seed(6);
    let p = Tensor::from_vec(vec![0.0f64, 0.3, 1.0], [3, 1]).expand(&[3, 5000]);
    let d = p.bernoulli();
    assert_eq!(d.dtype(), DType::F64);
    let rates = d.mean_dim(1, false).to_vec::<f64>();
    assert_eq!(rates[0], 0.0);
    assert!((rates[1] - 0.3).abs() < 0.03, "{rates:?}");
    assert_eq!(rates[2], 1.0);
}

#[test]
fn vector_norms_match_their_definitions_and_pass_gradcheck() {
    let mut rng = Rng::new(305);
    let shape = [4usize, 6];
    let data = values(&mut rng, 24, DType::F64);
    for layout in LAYOUTS {
        let x = make(&data, &shape, DType::F64, layout);
        for ord in [1.0, 2.0, 3.0, 0.5, f64::INFINITY, f64::NEG_INFINITY, 0.0] {
            let got = x.vector_norm(ord, [1], false).to_vec::<f64>();
            let want: Vec<f64> = data
                .chunks(6)
                .map(|r| {
                    let a = r.iter().map(|v| v.abs());
                    if ord == f64::INFINITY {
                        a.fold(0.0, f64::max)
                    } else if ord == f64::NEG_INFINITY {
                        a.fold(f64::INFINITY, f64::min)
                    } else if ord == 0.0 {
                        a.filter(|&v| v != 0.0).count() as f64
                    } else {
                        a.map(|v| v.powf(ord)).sum::<f64>().powf(1.0 / ord)
                    }
                })
                .collect();
            assert_close_tol(&got, &want, 1e-13, &format!("ord {ord} {layout:?}"));
        }
        let all = x.vector_norm(2.0, [0i64; 0], true);
        assert_eq!(all.dims(), [1, 1]);
        let want = data.iter().map(|v| v * v).sum::<f64>().sqrt();
        assert!((all.to_vec::<f64>()[0] - want).abs() < 1e-13);
    }
    let x = make(&data, &shape, DType::F64, Layout::Permuted);
    for ord in [1.0, 2.0, 3.0, f64::INFINITY] {
        gradcheck(|t| t[0].vector_norm(ord, [0], false), std::slice::from_ref(&x), 1e-6, 1e-6)
            .unwrap_or_else(|e| panic!("ord {ord}: {e}"));
    }
    let zero = Tensor::zeros([3]).double().requires_grad_(true);
    let g = kiln::grad(&[&zero.vector_norm(2.0, [0], false)], &[&zero], false).remove(0);
    assert_eq!(g.to_vec::<f64>(), [0.0; 3], "PyTorch's zero subgradient");
}

#[test]
fn atan_matches_std_and_passes_gradcheck() {
    let mut rng = Rng::new(306);
    for dtype in [DType::F32, DType::F64] {
        for layout in LAYOUTS {
            let mut data: Vec<f64> =
                (0..5 * 11).map(|_| round_to(dtype, rng.uniform(-4.0, 4.0))).collect();
            data[..8].copy_from_slice(&[0.0, -0.0, 0.66, 0.6601, 2.4142, 2.4143, 1e30, -1e-30]);
            let data: Vec<f64> = data.iter().map(|&v| round_to(dtype, v)).collect();
            let x = make(&data, &[5, 11], dtype, layout);
            let got = read(&x.atan(), dtype);
            let want: Vec<f64> = data.iter().map(|v| v.atan()).collect();
            let tol = if dtype == DType::F32 { 3e-7 } else { 3e-16 };
            for ((g, w), v) in got.iter().zip(&want).zip(&data) {
                assert!(
                    (g - w).abs() <= tol * w.abs().max(1e-300),
                    "{dtype:?} atan({v}) = {g}, want {w}"
                );
            }
        }
    }
    let nan = Tensor::from_vec(vec![f64::NAN, f64::INFINITY, f64::NEG_INFINITY], [3])
        .atan()
        .to_vec::<f64>();
    assert!(nan[0].is_nan());
    assert_eq!(&nan[1..], [std::f64::consts::FRAC_PI_2, -std::f64::consts::FRAC_PI_2]);
    let x = make(
        &values(&mut rng, 12, DType::F64).iter().map(|v| v * 4.0).collect::<Vec<_>>(),
        &[3, 4],
        DType::F64,
        Layout::Sliced,
    );
    gradcheck(|t| t[0].atan(), std::slice::from_ref(&x), 1e-6, 1e-6).unwrap();
}

#[test]
fn functional_embedding_picks_rows_and_adds_gradients_into_them() {
    let mut rng = Rng::new(307);
    let weight_data = values(&mut rng, 5 * 3, DType::F64);
    let weight = make(&weight_data, &[5, 3], DType::F64, Layout::Permuted);
    let ids = Tensor::from_vec(vec![4i64, 0, 4, 2, 1, 4], [2, 3]);
    let rows = F::embedding(&ids, &weight);
    assert_eq!(rows.dims(), [2, 3, 3]);
    let want: Vec<f64> = [4usize, 0, 4, 2, 1, 4]
        .iter()
        .flat_map(|&i| weight_data[i * 3..i * 3 + 3].to_vec())
        .collect();
    assert_eq!(rows.to_vec::<f64>(), want);
    gradcheck(|t| F::embedding(&ids, &t[0]).square(), std::slice::from_ref(&weight), 1e-6, 1e-6)
        .unwrap();
    assert!(F::try_embedding(&Tensor::zeros([2]), &weight).is_err());
    assert!(F::try_embedding(&ids, &Tensor::zeros([5])).is_err());
    let bad = F::embedding(&Tensor::from_vec(vec![5i64], [1]), &weight);
    assert!(bad.try_to_vec::<f64>().is_err(), "an index past the table is an error");
}

/// `scripts/torch_fixtures.py` wrote PyTorch's float64 results and input gradients of the
/// ops above to `tests/data/torch_transformer.safetensors`.
#[test]
fn the_new_ops_agree_with_pytorch_float64() {
    use std::collections::HashMap;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/torch_transformer.safetensors");
    let file: HashMap<String, Tensor> =
        kiln::serialize::load(&path).expect("the fixture file").into_iter().collect();
    let get =
        |name: &str| file.get(name).unwrap_or_else(|| panic!("{name} is in the fixture")).clone();
    let ids = get("embedding.ids");
    type Op<'a> = Box<dyn Fn(&Tensor) -> Tensor + 'a>;
    let cases: Vec<(&str, Op<'_>)> = vec![
        ("cumprod", Box::new(|x| x.cumprod(1))),
        ("atan", Box::new(|x| (x * 3.0).atan())),
        ("vector_norm_3", Box::new(|x| x.vector_norm(3.0, [1], false))),
        ("vector_norm_2", Box::new(|x| x.vector_norm(2.0, [0], false))),
        ("vector_norm_inf", Box::new(|x| x.vector_norm(f64::INFINITY, [0i64; 0], false))),
        ("sort", Box::new(|x| x.sort(1, true).0)),
        ("topk", Box::new(|x| x.topk(3, 0, false).0)),
        ("roll", Box::new(|x| x.roll(&[1, -2], &[0, 1]))),
        ("embedding", Box::new(|w| F::embedding(&ids, w))),
    ];
    for (name, op) in cases {
        let x = get(&format!("{name}.in0")).requires_grad_(true);
        let y = op(&x);
        assert_close_tol(
            &y.to_vec::<f64>(),
            &get(&format!("{name}.out")).to_vec::<f64>(),
            1e-13,
            name,
        );
        let g = kiln::grad(&[&(&y * &get(&format!("{name}.r"))).sum()], &[&x], false).remove(0);
        assert_close_tol(
            &g.to_vec::<f64>(),
            &get(&format!("{name}.grad0")).to_vec::<f64>(),
            1e-12,
            &format!("{name} grad"),
        );
    }
    let a = get("sort.in0");
    assert_eq!(a.sort(1, true).1.to_vec::<i64>(), get("sort.indices").to_vec::<i64>());
    assert_eq!(a.topk(3, 0, false).1.to_vec::<i64>(), get("topk.indices").to_vec::<i64>());
}

device_test!(
    ordering_sampling_and_norms_match_the_reference,
    super::ordering_sampling_and_norms_match_the_reference_on
);

/// topk, cumprod, roll, vector norms and their gradients, and multinomial draws from one seed
/// on `device`, against the reference executor.
fn ordering_sampling_and_norms_match_the_reference_on(device: Device) {
    let mut rng = Rng::new(809);
    let data = values(&mut rng, 5 * 8, DType::F64);
    let x = tensor(&data, &[5, 8], DType::F64);
    let run = |x: &Tensor, seed: u64| {
        let x = x.requires_grad_(true);
        let (top, idx) = x.topk(3, 1, true);
        let y = top.sum()
            + x.cumprod(1).sum()
            + x.roll(&[2], &[1]).atan().sum()
            + x.vector_norm(2.0, [1], false).sum();
        let g = kiln::grad(&[&y], &[&x], false).remove(0);
        kiln::manual_seed(seed);
        let draws = x.detach().abs().multinomial(6, true);
        (y.to_vec::<f64>(), g.to_vec::<f64>(), idx.to_vec::<i64>(), draws.to_vec::<i64>())
    };
    let (want, want_g, want_i, want_d) =
        kiln::with_execution(kiln::Execution::Reference, || run(&x, 3));
    let (got, got_g, got_i, got_d) = run(&x.to(device).detach(), 3);
    assert_close_tol(&got, &want, 1e-12, "values");
    assert_close_tol(&got_g, &want_g, 1e-12, "gradients");
    assert_eq!(got_i, want_i);
    assert_eq!(got_d, want_d, "the same seed draws the same samples");
}
