//! Reductions against plain f64 loops, over every subset of dimensions, with and without
//! `keepdim`, on contiguous and non-contiguous inputs.

use kiln::nn::functional as F;
use kiln::prelude::*;

use crate::common::*;

/// Reduces `data` (shape `shape`) over `axes` with `f`, starting from `init`; the result has
/// the reduced axes kept as size 1.
fn reference(
    data: &[f64],
    shape: &[usize],
    axes: &[usize],
    init: f64,
    f: impl Fn(f64, f64) -> f64,
) -> (Vec<usize>, Vec<f64>) {
    let out_shape: Vec<usize> =
        shape.iter().enumerate().map(|(i, &d)| if axes.contains(&i) { 1 } else { d }).collect();
    let mut out = vec![init; out_shape.iter().product()];
    for (flat, &v) in data.iter().enumerate() {
        let mut idx = unravel(flat, shape);
        for &a in axes {
            idx[a] = 0;
        }
        let o = ravel(&idx, &out_shape);
        out[o] = f(out[o], v);
    }
    (out_shape, out)
}

fn squeezed(shape: &[usize], axes: &[usize]) -> Vec<usize> {
    shape.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect()
}

fn subsets(rank: usize) -> Vec<Vec<usize>> {
    (1..1u32 << rank).map(|m| (0..rank).filter(|&i| m & (1 << i) != 0).collect()).collect()
}

#[test]
fn sum_over_every_subset_of_dims() {
    let mut rng = Rng::new(21);
    for shape in [&[5usize][..], &[3, 4], &[2, 3, 5], &[4, 1, 3], &[3, 0]] {
        for dtype in
            [DType::F32, DType::F64, DType::F16, DType::I32, DType::I8, DType::U8, DType::Bool]
        {
            for layout in LAYOUTS {
                let data = values(&mut rng, shape.iter().product(), dtype);
                let x = make(&data, shape, dtype, layout);
                let out_dtype = if dtype.is_float() { dtype } else { DType::I64 };
                for axes in subsets(shape.len()) {
                    let (kept, want) = reference(&data, shape, &axes, 0.0, |a, b| a + b);
                    let want: Vec<f64> = want.iter().map(|&v| round_to(out_dtype, v)).collect();
                    let dims: Vec<i64> =
                        axes.iter().map(|&a| a as i64 - shape.len() as i64).collect();
                    let context = format!("sum {dtype} {shape:?} {layout:?} over {axes:?}");
                    let k = x.sum_dim(dims.clone(), true);
                    assert_eq!(k.dims(), kept.as_slice(), "{context}");
                    // A float sum of n values rounds once in the reference and once per
                    // partial sum at most in kiln.
                    let tol = tolerance(out_dtype) * shape.iter().product::<usize>().max(1) as f64;
                    assert_close_tol(&read(&k, out_dtype), &want, tol, &context);
                    let s = x.sum_dim(dims, false);
                    assert_eq!(s.dims(), squeezed(shape, &axes).as_slice(), "{context}");
                    assert_close_tol(&read(&s, out_dtype), &want, tol, &context);
                }
                let total: f64 = data.iter().sum();
                let all = x.sum();
                assert_eq!(all.ndim(), 0);
                assert_close_tol(
                    &read(&all, out_dtype),
                    &[round_to(out_dtype, total)],
                    tolerance(out_dtype) * 64.0,
                    "sum()",
                );
            }
        }
    }
}

#[test]
fn mean_of_floats() {
    let mut rng = Rng::new(22);
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        for layout in LAYOUTS {
            let shape = [4usize, 6];
            let data = values(&mut rng, 24, dtype);
            let x = make(&data, &shape, dtype, layout);
            for axes in subsets(2) {
                let n: usize = axes.iter().map(|&a| shape[a]).product();
                let (_, sums) = reference(&data, &shape, &axes, 0.0, |a, b| a + b);
                let want: Vec<f64> = sums.iter().map(|s| round_to(dtype, s / n as f64)).collect();
                let dims: Vec<usize> = axes.clone();
                let got = read(&x.mean_dim(dims, false), dtype);
                assert_close_tol(
                    &got,
                    &want,
                    tolerance(dtype) * 8.0,
                    &format!("mean {dtype} {layout:?} {axes:?}"),
                );
            }
            let want = round_to(dtype, data.iter().sum::<f64>() / 24.0);
            assert_close_tol(&read(&x.mean(), dtype), &[want], tolerance(dtype) * 8.0, "mean()");
        }
    }
    assert!(Tensor::zeros([0]).mean().item::<f32>().is_nan());
}

#[test]
fn max_min_and_their_indices() {
    let mut rng = Rng::new(23);
    for dtype in [DType::F32, DType::F64, DType::F16, DType::I64, DType::I32, DType::I8, DType::U8]
    {
        for layout in LAYOUTS {
            let shape = [3usize, 5, 4];
            let data = values(&mut rng, 60, dtype);
            let x = make(&data, &shape, dtype, layout);
            assert_eq!(
                read(&x.max(), dtype),
                vec![data.iter().copied().fold(f64::NEG_INFINITY, f64::max)]
            );
            assert_eq!(
                read(&x.min(), dtype),
                vec![data.iter().copied().fold(f64::INFINITY, f64::min)]
            );
            for dim in 0..3 {
                let (_, maxes) = reference(&data, &shape, &[dim], f64::NEG_INFINITY, f64::max);
                let (_, mins) = reference(&data, &shape, &[dim], f64::INFINITY, f64::min);
                let (v, i) = x.max_dim(dim as i64, false);
                assert_eq!(read(&v, dtype), maxes, "max_dim {dtype} {layout:?} {dim}");
                let (vmin, imin) = x.min_dim(dim as i64 - 3, true);
                assert_eq!(vmin.dims()[dim], 1);
                assert_eq!(read(&vmin, dtype), mins);
                // The index is the first position along `dim` holding the extreme value.
                let idx = i.to_vec::<i64>();
                let idx_min = imin.to_vec::<i64>();
                let out_shape = squeezed(&shape, &[dim]);
                for (o, (&k, &kmin)) in idx.iter().zip(&idx_min).enumerate() {
                    let mut full = unravel(o, &out_shape);
                    full.insert(dim, 0);
                    let along: Vec<f64> = (0..shape[dim])
                        .map(|j| {
                            full[dim] = j;
                            data[ravel(&full, &shape)]
                        })
                        .collect();
                    let first_max = along.iter().position(|&a| a == maxes[o]).unwrap() as i64;
                    let first_min = along.iter().position(|&a| a == mins[o]).unwrap() as i64;
                    assert_eq!(
                        (k, kmin),
                        (first_max, first_min),
                        "indices {dtype} {layout:?} dim {dim} at {o}"
                    );
                }
                assert_eq!(x.argmax(dim as i64, false).to_vec::<i64>(), idx);
                assert_eq!(x.argmin(dim as i64, true).to_vec::<i64>(), idx_min);
            }
        }
    }
}

#[test]
fn max_propagates_nan_and_argmax_points_at_it() {
    let x = Tensor::from_vec(vec![1.0f32, f32::NAN, 3.0, 2.0], [2, 2]);
    assert!(x.max().item::<f32>().is_nan());
    let (v, i) = x.max_dim(1, false);
    let v = v.to_vec::<f32>();
    assert!(v[0].is_nan() && v[1] == 3.0);
    assert_eq!(i.to_vec::<i64>(), vec![1, 0]);
}

#[test]
fn max_and_min_rows_propagate_nan_from_any_position() {
    // Rows long enough for the vector loop and its scalar tail: a NaN in any lane of any
    // vector, or in the tail, makes that row's max and min NaN; other rows are exact.
    let (rows, cols) = (19usize, 19usize);
    for dtype in [DType::F32, DType::F64] {
        let mut data: Vec<f64> =
            (0..rows * cols).map(|i| ((i * 7919) % 101) as f64 - 50.0).collect();
        for r in 0..rows - 1 {
            data[r * cols + r] = f64::NAN;
        }
        let x = Tensor::from_vec(data.clone(), [rows, cols]).to_dtype(dtype);
        let max = x.max_dim(1, false).0.to_vec::<f64>();
        let min = x.min_dim(1, false).0.to_vec::<f64>();
        for r in 0..rows {
            let row = &data[r * cols..(r + 1) * cols];
            if r < rows - 1 {
                assert!(max[r].is_nan() && min[r].is_nan(), "{dtype:?} row {r}");
            } else {
                assert_eq!(max[r], row.iter().copied().fold(f64::MIN, f64::max));
                assert_eq!(min[r], row.iter().copied().fold(f64::MAX, f64::min));
            }
        }
    }
}

#[test]
fn sums_of_integers_wrap_like_i64() {
    let x = Tensor::from_vec(vec![i64::MAX, 1], [2]);
    assert_eq!(x.sum().item::<i64>(), i64::MIN);
    let b = Tensor::from_vec(vec![true, true, false], [3]);
    assert_eq!(b.sum().item::<i64>(), 2);
}

#[test]
fn var_std_prod_amax_amin_over_dims() {
    let mut rng = Rng::new(24);
    let shape = [3usize, 4, 5];
    for layout in LAYOUTS {
        let data = values(&mut rng, 60, DType::F64);
        let x = make(&data, &shape, DType::F64, layout);
        for axes in subsets(3) {
            let n: usize = axes.iter().map(|&a| shape[a]).product();
            let (_, sums) = reference(&data, &shape, &axes, 0.0, |a, b| a + b);
            let (kept, _) = reference(&data, &shape, &axes, 0.0, |a, b| a + b);
            let mean: Vec<f64> = sums.iter().map(|s| s / n as f64).collect();
            let mut ss = vec![0.0; mean.len()];
            for (flat, &v) in data.iter().enumerate() {
                let mut idx = unravel(flat, &shape);
                for &a in &axes {
                    idx[a] = 0;
                }
                let o = ravel(&idx, &kept);
                ss[o] += (v - mean[o]).powi(2);
            }
            let var: Vec<f64> = ss.iter().map(|s| s / (n as f64 - 1.0)).collect();
            let pop: Vec<f64> = ss.iter().map(|s| s / n as f64).collect();
            let dims: Vec<usize> = axes.clone();
            let ctx = format!("{layout:?} {axes:?}");
            assert_close_tol(
                &x.var_dim(dims.clone(), false).to_vec::<f64>(),
                &var,
                1e-10,
                &format!("var {ctx}"),
            );
            assert_close_tol(
                &x.std_dim(dims.clone(), true).to_vec::<f64>(),
                &var.iter().map(|v| v.sqrt()).collect::<Vec<_>>(),
                1e-10,
                &ctx,
            );
            assert_close_tol(
                &x.try_var_dim_correction(dims.clone(), 0.0, false).unwrap().to_vec::<f64>(),
                &pop,
                1e-10,
                &ctx,
            );
            let (_, prods) = reference(&data, &shape, &axes, 1.0, |a, b| a * b);
            assert_close_tol(
                &x.prod_dim(dims.clone(), false).to_vec::<f64>(),
                &prods,
                1e-10,
                &format!("prod {ctx}"),
            );
            let (_, maxes) = reference(&data, &shape, &axes, f64::NEG_INFINITY, f64::max);
            let (_, mins) = reference(&data, &shape, &axes, f64::INFINITY, f64::min);
            assert_eq!(x.amax(dims.clone(), false).to_vec::<f64>(), maxes);
            assert_eq!(x.amin(dims, true).to_vec::<f64>(), mins);
        }
        let total_var = {
            let m = data.iter().sum::<f64>() / 60.0;
            data.iter().map(|v| (v - m).powi(2)).sum::<f64>() / 59.0
        };
        assert!((x.var().item::<f64>() - total_var).abs() < 1e-10);
        assert!((x.std().item::<f64>() - total_var.sqrt()).abs() < 1e-10);
    }
    assert_eq!(Tensor::from_vec(vec![2i32, 3, 4], [3]).prod().item::<i64>(), 24);
}

#[test]
fn softmax_log_softmax_logsumexp_are_stable_and_right() {
    let mut rng = Rng::new(25);
    for layout in LAYOUTS {
        let data: Vec<f64> = (0..12).map(|_| rng.uniform(-30.0, 30.0)).collect();
        let x = make(&data, &[3, 4], DType::F64, layout);
        for dim in [0usize, 1] {
            let (out_shape, maxes) = reference(&data, &[3, 4], &[dim], f64::NEG_INFINITY, f64::max);
            let mut sums = vec![0.0; maxes.len()];
            for (flat, &v) in data.iter().enumerate() {
                let mut idx = unravel(flat, &[3, 4]);
                idx[dim] = 0;
                let o = ravel(&idx, &out_shape);
                sums[o] += (v - maxes[o]).exp();
            }
            let at = |flat: usize| {
                let mut idx = unravel(flat, &[3, 4]);
                idx[dim] = 0;
                ravel(&idx, &out_shape)
            };
            let sm: Vec<f64> =
                (0..12).map(|f| (data[f] - maxes[at(f)]).exp() / sums[at(f)]).collect();
            let lsm: Vec<f64> =
                (0..12).map(|f| data[f] - maxes[at(f)] - sums[at(f)].ln()).collect();
            let lse: Vec<f64> = maxes.iter().zip(&sums).map(|(m, s)| m + s.ln()).collect();
            assert_close_tol(&x.softmax(dim as i64).to_vec::<f64>(), &sm, 1e-12, "softmax");
            assert_close_tol(
                &x.log_softmax(dim as i64).to_vec::<f64>(),
                &lsm,
                1e-12,
                "log_softmax",
            );
            assert_close_tol(
                &x.logsumexp(dim as i64, false).to_vec::<f64>(),
                &lse,
                1e-12,
                "logsumexp",
            );
        }
    }
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let big = tensor(&[1000.0, 1000.0], &[2], dtype);
        assert_eq!(big.softmax(0).to_vec::<f64>(), vec![0.5, 0.5], "{dtype}");
        let lsm = big.log_softmax(0).to_vec::<f64>();
        assert!(lsm.iter().all(|v| (v + std::f64::consts::LN_2).abs() < 1e-2), "{dtype}: {lsm:?}");
    }
    let neg = Tensor::from_vec(vec![f32::NEG_INFINITY, 0.0], [2]);
    assert_eq!(neg.softmax(0).to_vec::<f32>(), vec![0.0, 1.0]);
    assert_eq!(Tensor::from_vec(vec![0i64, 0], [2]).softmax(0).to_vec::<f32>(), vec![0.5, 0.5]);
}

#[test]
fn cumsum_all_any() {
    let mut rng = Rng::new(26);
    for layout in LAYOUTS {
        for dtype in [DType::F64, DType::I32] {
            let data = values(&mut rng, 12, dtype);
            let x = make(&data, &[3, 4], dtype, layout);
            let out = if dtype.is_float() { dtype } else { DType::I64 };
            let rows = read(&x.cumsum(1), out);
            let cols = read(&x.cumsum(0), out);
            let want_rows: Vec<f64> =
                (0..12).map(|f| (f / 4 * 4..=f).map(|g| data[g]).sum()).collect();
            let want_cols: Vec<f64> =
                (0..12).map(|f| (0..=f / 4).map(|r| data[r * 4 + f % 4]).sum()).collect();
            assert_close(&rows, &want_rows, out, &format!("cumsum rows {dtype} {layout:?}"));
            assert_close(&cols, &want_cols, out, &format!("cumsum cols {dtype} {layout:?}"));
        }
    }
    let b = Tensor::from_vec(vec![true, false, true, true], [2, 2]);
    assert!(!b.all().item::<bool>());
    assert!(b.any().item::<bool>());
    assert_eq!(b.all_dim(1, false).to_vec::<bool>(), vec![false, true]);
    assert_eq!(b.any_dim(0, true).to_vec::<bool>(), vec![true, true]);
    assert!(Tensor::zeros([0]).all().item::<bool>());
    assert!(!Tensor::zeros([0]).any().item::<bool>());
    assert!(Tensor::from_vec(vec![0.5f32, -1.0], [2]).all().item::<bool>());
}

/// Reductions over leading dimensions run as column reductions: vectorized across the
/// outputs, in groups of 16 f32 (8 f64) columns whose accumulators stay in registers over
/// the whole reduced walk, then the remainder one vector and one element at a time. Every
/// remainder of a group, one and two reduced dimensions, a prologue reading an input that
/// varies along the outputs and one that is constant across them: against f64 loops.
#[test]
fn column_reductions_agree_with_loops_at_every_group_remainder() {
    let mut rng = Rng::new(404);
    for dtype in [DType::F32, DType::F64, DType::F16] {
        // The last two have fewer outputs than a column block but enough work that the
        // launch splits the outputs across threads (unevenly: 32 + 1, 112 + 88).
        for &(rows, cols) in &[
            (1, 1),
            (3, 15),
            (5, 16),
            (7, 17),
            (300, 33),
            (64, 70),
            (2, 1029),
            (1100, 33),
            (700, 200),
        ] {
            let xs = values(&mut rng, rows * 2 * cols, dtype);
            let bs = values(&mut rng, cols, dtype);
            let cs = values(&mut rng, rows * 2, dtype);
            let x = tensor(&xs, &[rows, 2, cols], dtype);
            let b = tensor(&bs, &[cols], dtype);
            let c = tensor(&cs, &[rows, 2, 1], dtype);
            Tensor::try_realize_all(&[&x, &b, &c]).expect("inputs");
            // v[r, s, j] = x * c + b, and p = 1 + v / 1024 for a product that stays finite.
            let v =
                |r: usize, s: usize, j: usize| xs[(r * 2 + s) * cols + j] * cs[r * 2 + s] + bs[j];
            let pre = &x * &c + &b;
            let got = [
                pre.sum_dim(&[0, 1][..], false),
                pre.amax(&[0, 1][..], false),
                pre.amin(0, false).amin(0, false),
                (&pre / 1024.0 + 1.0).prod_dim(&[0, 1][..], false),
                x.sum_dim(0, false).sum_dim(0, false),
            ];
            let fold =
                |init: f64, f: &dyn Fn(f64, f64) -> f64, g: &dyn Fn(usize, usize, usize) -> f64| {
                    (0..cols)
                        .map(|j| {
                            let mut acc = init;
                            for r in 0..rows {
                                for s in 0..2 {
                                    acc = f(acc, g(r, s, j));
                                }
                            }
                            acc
                        })
                        .collect::<Vec<f64>>()
                };
            let want = [
                fold(0.0, &|a, b| a + b, &v),
                fold(f64::NEG_INFINITY, &f64::max, &v),
                fold(f64::INFINITY, &f64::min, &v),
                fold(1.0, &|a, b| a * b, &|r, s, j| 1.0 + v(r, s, j) / 1024.0),
                fold(0.0, &|a, b| a + b, &|r, s, j| xs[(r * 2 + s) * cols + j]),
            ];
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let what = format!("reduction {i} of {dtype} [{rows}, 2, {cols}]");
                kiln::with_check(|| g.realize().clone());
                // Sums and products of many rounded terms: the tolerance grows with the count.
                let tol =
                    tolerance(dtype) * if matches!(i, 0 | 3 | 4) { 4.0 * rows as f64 } else { 4.0 };
                assert_close_tol(&g.to_vec::<f64>(), w, tol, &what);
            }
        }
    }
}

/// `log(sum(exp(v)))` of each group of `data` (shape `shape`) over `axes`, in f64.
fn logsumexp_reference(data: &[f64], shape: &[usize], axes: &[usize]) -> Vec<f64> {
    let (out_shape, _) = reference(data, shape, axes, 0.0, |a, _| a);
    let mut groups = vec![Vec::new(); out_shape.iter().product()];
    for (flat, &v) in data.iter().enumerate() {
        let mut idx = unravel(flat, shape);
        for &a in axes {
            idx[a] = 0;
        }
        groups[ravel(&idx, &out_shape)].push(v);
    }
    groups
        .iter()
        .map(|g| {
            if g.iter().any(|v| v.is_nan()) {
                return f64::NAN;
            }
            let m = g.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if m.is_infinite() { m } else { m + g.iter().map(|v| (v - m).exp()).sum::<f64>().ln() }
        })
        .collect()
}

#[test]
fn one_pass_logsumexp_matches_the_reference() {
    // The CPU's logsumexp kernel reads each row once, a block of 2048 at a time with the
    // maximum kept as it grows. Rows shorter than a vector, rows of several blocks whose
    // maximum rises block after block (the running sum is rescaled), scalar tails, every
    // layout (a permuted input takes the scalar path), an expression fused in front (the
    // vector path into scratch), several reduced dimensions, and a broadcast input.
    let mut rng = Rng::new(41);
    let shapes: [&[usize]; 5] = [&[1, 1], &[3, 7], &[4, 2049], &[2, 6000], &[3, 5, 9]];
    for shape in shapes {
        let n: usize = shape.iter().product();
        let rising: Vec<f64> = (0..n)
            .map(|i| (i % shape[shape.len() - 1]) as f64 * 0.01 + rng.uniform(-3.0, 3.0))
            .collect();
        let wide: Vec<f64> = (0..n).map(|_| rng.uniform(-60.0, 60.0)).collect();
        for data in [&rising, &wide] {
            let data: Vec<f64> = data.iter().map(|&v| round_to(DType::F32, v)).collect();
            for layout in LAYOUTS {
                let x = make(&data, shape, DType::F32, layout);
                let last = shape.len() - 1;
                let want = logsumexp_reference(&data, shape, &[last]);
                let got = kiln::with_check(|| x.logsumexp(-1, false).to_vec::<f64>());
                assert_close_tol(&got, &want, 2e-6, &format!("{shape:?} {layout:?}"));
                // An expression in front of the reduction.
                let scaled: Vec<f64> = data.iter().map(|v| v * 0.5 - 1.0).collect();
                let want = logsumexp_reference(&scaled, shape, &[last]);
                let got = (&x * 0.5 - 1.0).logsumexp(-1, false).to_vec::<f64>();
                assert_close_tol(&got, &want, 2e-6, &format!("{shape:?} {layout:?} scaled"));
            }
        }
    }
    let data: Vec<f64> =
        (0..3 * 5 * 9).map(|_| round_to(DType::F32, rng.uniform(-5.0, 5.0))).collect();
    let x = tensor(&data, &[3, 5, 9], DType::F32);
    for axes in subsets(3) {
        let want = logsumexp_reference(&data, &[3, 5, 9], &axes);
        let got = x.logsumexp(axes.iter().map(|&a| a as i64).collect::<Vec<_>>(), true);
        assert_close_tol(&got.to_vec::<f64>(), &want, 2e-6, &format!("axes {axes:?}"));
    }
    // A row broadcast over 6 rows.
    let row: Vec<f64> = (0..300).map(|_| round_to(DType::F32, rng.uniform(-5.0, 5.0))).collect();
    let b = tensor(&row, &[1, 300], DType::F32).expand(&[6, 300]);
    let want = logsumexp_reference(&row, &[300], &[0])[0];
    assert_close_tol(&b.logsumexp(1, false).to_vec::<f64>(), &[want; 6], 2e-6, "broadcast");
    let p = kiln::debug::plan_summary(&[&x.logsumexp(-1, false)]);
    assert!(p.kernel_text.iter().any(|k| k.contains("logsumexp over")), "{p:?}");
}

#[test]
fn one_pass_logsumexp_special_values() {
    // NaN anywhere gives NaN; +inf gives +inf; rows of -inf (or nothing) give -inf; a -inf
    // among finite values adds nothing; huge values neither overflow nor lose the sum.
    let inf = f64::INFINITY;
    let rows: Vec<Vec<f64>> = vec![
        vec![1.0, f64::NAN, 2.0],
        vec![-inf, f64::NAN, -inf],
        vec![1.0, inf, 2.0],
        vec![inf, f64::NAN, 2.0],
        vec![-inf, -inf, -inf],
        vec![-inf, 0.0, -inf],
        vec![3e38, 3e38, -3e38],
        vec![-1e30, -1e30, -1e30],
    ];
    for row in &rows {
        for len in [3usize, 3000] {
            // The row's values spread over a long row too (several blocks), the rest -inf.
            let mut data = vec![-inf; len];
            for (i, &v) in row.iter().enumerate() {
                data[i * (len / 3)] = v;
            }
            let x = tensor(&data, &[1, len], DType::F32);
            let want = logsumexp_reference(&data, &[1, len], &[1]);
            let got = x.logsumexp(1, false).to_vec::<f64>();
            assert_close_tol(&got, &want, 2e-6, &format!("{row:?} over {len}"));
        }
    }
    let empty = Tensor::zeros([3, 0]);
    assert_eq!(empty.logsumexp(1, false).to_vec::<f32>(), vec![f32::NEG_INFINITY; 3]);
}

/// The rows of the log-softmax precision test at one logit magnitude: equal logits, logits
/// spread over a few units, a row with `-inf` entries, and a long row (several blocks of the
/// one-pass fold).
fn logit_rows(rng: &mut Rng, magnitude: f64) -> (Vec<f64>, [usize; 2]) {
    let len = 9;
    let mut data = vec![magnitude; len];
    data.extend((0..len).map(|_| magnitude + rng.uniform(-4.0, 4.0)));
    data.extend(
        (0..len).map(|i| if i % 3 == 1 { f64::NEG_INFINITY } else { -magnitude + i as f64 }),
    );
    data.extend((0..len).map(|_| rng.uniform(-magnitude, magnitude)));
    (data.into_iter().map(|v| round_to(DType::F32, v)).collect(), [4, len])
}

/// `x - logsumexp(x)` along the last axis, in f64.
fn log_softmax_reference(data: &[f64], len: usize) -> Vec<f64> {
    data.chunks(len)
        .flat_map(|row| {
            let lse = logsumexp_reference(row, &[len], &[0])[0];
            row.iter().map(move |&v| v - lse)
        })
        .collect()
}

/// Within a few ulp of the f32 result: the log-sum-exp must not be rounded at the logits'
/// magnitude (which would be off by half an ulp of the largest logit, 3e-5 at 1000).
#[track_caller]
fn assert_within_result_ulps(got: &[f64], want: &[f64], context: &str) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_finite() { (g - w).abs() <= 3e-7 * w.abs().max(1.0) } else { g == w };
        assert!(ok, "{context}: element {i} is {g}, the f64 reference {w}");
    }
}

device_test!(
    log_softmax_and_cross_entropy_are_precise_at_any_logit_magnitude,
    super::log_softmax_is_precise_on
);

/// Log-softmax, its gradient and cross-entropy on `device`, fused and unfused, against f64
/// at logit magnitudes 1 to 1e4.
fn log_softmax_is_precise_on(device: Device) {
    // Two logits of 1000 once gave -0.69317627 (x - logsumexp(x), the sum rounded at 1000).
    let big = Tensor::from_vec(vec![1000.0f32, 1000.0], [1, 2]).to(device).log_softmax(-1);
    assert_eq!(big.to_vec::<f32>(), vec![-std::f32::consts::LN_2; 2]);
    let eight = Tensor::full([1, 8], 1000.0f32).to(device).log_softmax(-1).to_vec::<f32>();
    assert_eq!(eight, vec![-(8f32.ln()); 8]);

    let mut rng = Rng::new(42);
    for magnitude in [1.0, 10.0, 100.0, 1e3, 1e4] {
        let (data, shape) = logit_rows(&mut rng, magnitude);
        let want = log_softmax_reference(&data, shape[1]);
        for (name, mode) in
            [("fused", kiln::Execution::Fused), ("unfused", kiln::Execution::Unfused)]
        {
            let context = format!("magnitude {magnitude}, {name}");
            let x = tensor(&data, &shape, DType::F32).to(device).requires_grad_(true);
            let logp = kiln::with_execution(mode, || {
                kiln::with_check(|| x.log_softmax(-1).to_vec::<f64>())
            });
            assert_within_result_ulps(&logp, &want, &context);
            // The gradient of sum(w * log_softmax(x)) is w - softmax(x) * sum(w).
            let w: Vec<f64> = (0..data.len()).map(|_| rng.uniform(-1.0, 1.0)).collect();
            let wt = tensor(&w, &shape, DType::F32).to(device);
            let grad = kiln::with_execution(mode, || {
                (x.log_softmax(-1) * &wt).sum().backward();
                x.grad().expect("a gradient").to_vec::<f64>()
            });
            let want_grad: Vec<f64> = want
                .chunks(shape[1])
                .zip(w.chunks(shape[1]))
                .flat_map(|(lp, w)| {
                    let total: f64 = w.iter().sum();
                    lp.iter().zip(w).map(move |(l, w)| w - l.exp() * total)
                })
                .collect();
            assert_close_tol(&grad, &want_grad, 1e-6, &format!("{context}: gradient"));
        }
        // Cross-entropy of the finite rows against each row's first class.
        let finite: Vec<f64> = [&data[..18], &data[27..]].concat();
        let x = tensor(&finite, &[3, shape[1]], DType::F32).to(device);
        let target = Tensor::from_vec(vec![0i64, 4, 8], [3]).to(device);
        let loss = F::cross_entropy_with(
            &x,
            &target,
            F::CrossEntropyOptions { reduction: F::Reduction::None, ..Default::default() },
        );
        let lp = log_softmax_reference(&finite, shape[1]);
        let want_loss = [-lp[0], -lp[shape[1] + 4], -lp[2 * shape[1] + 8]];
        assert_within_result_ulps(&loss.to_vec::<f64>(), &want_loss, &format!("{magnitude}: loss"));
    }
}

device_test!(row_reductions_match_the_reference, super::row_reductions_match_the_reference_on);

/// Softmax, log-softmax, max, sums, variances and cross-entropy over short and long rows
/// (split across blocks on a GPU) on `device`, against the reference executor.
fn row_reductions_match_the_reference_on(device: Device) {
    kiln::manual_seed(5);
    // Long rows (few of them) are split across blocks and merged.
    for &(rows, cols) in &[(1, 1), (3, 17), (37, 203), (8, 1025), (2, 4099), (300, 257), (2, 30001)]
    {
        let x = Tensor::randn([rows, cols]);
        let target = Tensor::randint(0, cols as i64, [rows]);
        let run = |x: &Tensor, target: &Tensor| {
            [
                x.softmax(1),
                x.log_softmax(1),
                x.max_dim(1, false).0,
                x.sum_dim(0, true),
                x.var_dim(1, false),
                // Over rows: one thread per output once there are many outputs.
                x.var_dim(0, false),
                x.amax(0, true),
                x.t().softmax(1),
                F::cross_entropy(x, target),
            ]
            .map(|r| (r.device(), r.to_vec::<f64>()))
        };
        let want = kiln::with_execution(kiln::Execution::Reference, || run(&x, &target));
        let got = run(&x.to(device), &target.to(device));
        for (i, ((at, got), (_, want))) in got.iter().zip(&want).enumerate() {
            assert_eq!(*at, device);
            assert_close_tol(got, want, 1e-5, &format!("reduction {i} on {rows}x{cols}"));
        }
    }
}

device_test!(long_reductions_match_the_reference, super::long_reductions_match_the_reference_on);

/// Reductions, arg-reductions and running sums over 40,003 elements (split across blocks on a
/// GPU) in five dtypes on `device`, and a mean-squared error with its gradient, against the
/// reference executor.
fn long_reductions_match_the_reference_on(device: Device) {
    let mut rng = Rng::new(23);
    let n = 40_003;
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::I32, DType::I8, DType::U8] {
        let data = values(&mut rng, n, dtype);
        let layouts: &[Layout] = if matches!(dtype, DType::F32 | DType::I32) {
            &[Layout::Contiguous, Layout::Sliced]
        } else {
            &[Layout::Contiguous]
        };
        for &layout in layouts {
            let x = make(&data, &[n], dtype, layout);
            type Op = fn(&Tensor) -> Tensor;
            let ops: [(&str, Op); 19] = [
                ("sum", |x| x.sum()),
                ("max", |x| x.max()),
                ("min", |x| x.min()),
                // Powers of two, exact in any order, so a lost or repeated element shows (on
                // floats in [-3, 3], whose partial products stay inside f32's range).
                ("prod", |x| {
                    let f = |m: &Tensor| m.to_dtype(DType::F32);
                    (f(&x.gt(2.9)) - f(&x.lt(-2.9)) * 0.5 + 1.0).prod()
                }),
                ("any/all", |x| Tensor::stack(&[&x.gt(2.5).any(), &x.ne(1000.0).all()], 0)),
                // Long columns, few outputs: chunks of each column, then merged in order.
                ("sum down long columns", |x| {
                    x.narrow(0, 0, 40_000).reshape(&[250, 160]).sum_dim(0, false)
                }),
                ("max down long columns", |x| {
                    x.narrow(0, 0, 40_000).reshape(&[250, 160]).amax(0, true)
                }),
                ("sum over the rows of 3-d blocks", |x| {
                    x.narrow(0, 0, 39_936).reshape(&[13, 24, 128]).sum_dim(&[0, 1][..], false)
                }),
                ("sum over a short axis", |x| {
                    x.narrow(0, 0, 40_000).reshape(&[2, 20_000]).sum_dim(1, false)
                }),
                // Ties (integers) pick the first; chunks of a line, then lines of a block.
                ("argmax", |x| x.argmax(0, false)),
                ("argmin", |x| x.argmin(0, true)),
                ("argmax of 2 long rows", |x| {
                    x.narrow(0, 0, 40_000).reshape(&[2, 20_000]).argmax(1, false)
                }),
                ("argmin down columns", |x| {
                    x.narrow(0, 0, 40_000).reshape(&[2, 20_000]).argmin(0, false)
                }),
                ("argmin of 200 rows", |x| {
                    x.narrow(0, 0, 40_000).reshape(&[200, 200]).argmin(1, false)
                }),
                ("cumsum", |x| x.cumsum(0)),
                ("cumsum of 2 long rows", |x| {
                    x.narrow(0, 0, 40_000).reshape(&[2, 20_000]).cumsum(1)
                }),
                ("cumsum down columns", |x| x.narrow(0, 0, 40_000).reshape(&[2, 20_000]).cumsum(0)),
                ("cumsum of 20 rows", |x| x.narrow(0, 0, 40_000).reshape(&[20, 2000]).cumsum(1)),
                ("argmax with NaNs", |x| {
                    let x = x.to_dtype(DType::F64);
                    x.masked_fill(&x.gt(2.99), f64::NAN).argmax(0, false)
                }),
            ];
            for (name, op) in ops {
                if name == "prod" && !dtype.is_float() {
                    continue;
                }
                let want =
                    kiln::with_execution(kiln::Execution::Reference, || op(&x).to_vec::<f64>());
                let got = op(&x.to(device)).to_vec::<f64>();
                // f32 sums accumulate in f32 on a GPU (in f64 in the reference).
                let tol = if name.starts_with("arg") || !dtype.is_float() {
                    0.0
                } else if matches!(dtype, DType::F16 | DType::BF16) {
                    1e-2
                } else {
                    1e-4
                };
                let at = format!("{name} of {n} {dtype} {layout:?}");
                assert_close_tol(&got, &want, tol, &at);
            }
        }
    }
    // The gradient of a mean-squared error over a long vector, and the mean itself.
    let data = values(&mut rng, 2 * n, DType::F64);
    let (a, b) = (
        make(&data[..n], &[n], DType::F64, Layout::Contiguous),
        make(&data[n..], &[n], DType::F64, Layout::Contiguous),
    );
    let mse = |a: &Tensor, b: &Tensor| {
        let a = a.detach().requires_grad_(true);
        let loss = (&a - b).pow(2.0).mean();
        loss.backward();
        (loss.to_vec::<f64>(), a.grad().expect("a gradient").to_vec::<f64>())
    };
    let (want, want_grad) = kiln::with_execution(kiln::Execution::Reference, || mse(&a, &b));
    let (got, got_grad) = mse(&a.to(device), &b.to(device));
    assert_close_tol(&got, &want, 1e-12, "mse");
    assert_close_tol(&got_grad, &want_grad, 1e-12, "mse gradient");
}
