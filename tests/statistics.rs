//! Order statistics (`median`, `kthvalue`, `quantile`), bins (`bucketize`, `searchsorted`,
//! `histc`, `bincount`), `index_add` and `baddbmm` against f64 loops of PyTorch's
//! definitions on fresh random inputs with odd sizes, NaNs, ties and views; gradchecks where
//! PyTorch differentiates.

use kiln::Interpolation;
use kiln::autograd::gradcheck;
use kiln::prelude::*;

use crate::common::*;

/// The rows of `[rows, cols]` values.
fn rows(data: &[f64], cols: usize) -> Vec<Vec<f64>> {
    data.chunks(cols).map(<[f64]>::to_vec).collect()
}

/// Ascending, NaN last, as PyTorch sorts.
fn sorted(row: &[f64]) -> Vec<f64> {
    let mut s = row.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap_or_else(|| a.is_nan().cmp(&b.is_nan())));
    s
}

#[test]
fn median_and_kthvalue_match_the_sorted_line() {
    let mut rng = Rng::new(900);
    let (r, c) = (6, 7);
    let mut data = values(&mut rng, r * c, DType::F64);
    data[3] = f64::NAN; // row 0 has a NaN
    data[c + 2] = data[c + 5]; // a tie in row 1
    for layout in LAYOUTS {
        let x = make(&data, &[r, c], DType::F64, layout);
        let (v, i) = x.median_dim(1, false);
        let (v, i) = (v.to_vec::<f64>(), i.to_vec::<i64>());
        let xs = x.to_vec::<f64>();
        for (k, row) in rows(&xs, c).iter().enumerate() {
            if row.iter().any(|x| x.is_nan()) {
                assert!(v[k].is_nan() && row[i[k] as usize].is_nan(), "{layout:?} row {k}");
            } else {
                assert_eq!(v[k], sorted(row)[(c - 1) / 2], "{layout:?} row {k}");
                assert_eq!(row[i[k] as usize], v[k], "the index points at the value");
            }
            let (kv, ki) = x.kthvalue(3, 1, true);
            assert_eq!(kv.dims(), &[r, 1]);
            assert_eq!(kv.to_vec::<f64>()[k].to_bits(), sorted(row)[2].to_bits());
            assert_eq!(row[ki.to_vec::<i64>()[k] as usize].to_bits(), sorted(row)[2].to_bits());
        }
    }
    // The whole tensor, an even count: the lower middle.
    let x = Tensor::from_vec(vec![5.0f32, 1.0, 4.0, 2.0, 3.0, 6.0], [2, 3]);
    assert_eq!(x.median().item::<f32>(), 3.0);
    assert_eq!(x.median().dims(), &[] as &[usize]);
    // Gradients go to the picked elements.
    let x = tensor(&values(&mut rng, 15, DType::F64), &[3, 5], DType::F64);
    gradcheck(|t| t[0].median_dim(1, false).0, std::slice::from_ref(&x), 1e-6, 1e-6).unwrap();
    gradcheck(|t| t[0].kthvalue(2, 0, false).0, std::slice::from_ref(&x), 1e-6, 1e-6).unwrap();
}

#[test]
fn quantile_interpolates_as_pytorch() {
    let mut rng = Rng::new(901);
    let (r, c) = (4, 9);
    let data = values(&mut rng, r * c, DType::F64);
    let modes = [
        Interpolation::Linear,
        Interpolation::Lower,
        Interpolation::Higher,
        Interpolation::Nearest,
        Interpolation::Midpoint,
    ];
    for q in [0.0, 0.1, 0.25, 0.5, 0.8, 1.0] {
        for mode in modes {
            for layout in LAYOUTS {
                let x = make(&data, &[r, c], DType::F64, layout);
                let got = x.quantile(q, Some(-1), false, mode).to_vec::<f64>();
                for (k, row) in rows(&x.to_vec::<f64>(), c).iter().enumerate() {
                    let s = sorted(row);
                    let pos = q * (c - 1) as f64;
                    let (lo, hi) = (s[pos.floor() as usize], s[pos.ceil() as usize]);
                    let frac = pos - pos.floor();
                    let want = match mode {
                        Interpolation::Linear => lo + (hi - lo) * frac,
                        Interpolation::Lower => lo,
                        Interpolation::Higher => hi,
                        Interpolation::Nearest => s[pos.round_ties_even() as usize],
                        Interpolation::Midpoint => (lo + hi) / 2.0,
                    };
                    assert!(
                        (got[k] - want).abs() < 1e-12,
                        "q {q} {mode:?} {layout:?}: {} vs {want}",
                        got[k]
                    );
                }
            }
        }
    }
    // All elements, keepdim, a NaN, f32.
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
    let all = x.quantile(0.5, None, true, Interpolation::Linear);
    assert_eq!((all.dims(), all.to_vec::<f32>()), (&[1usize, 1][..], vec![3.5]));
    let with_nan = Tensor::from_vec(vec![1.0f32, f32::NAN, 3.0, 4.0, 5.0, 6.0], [2, 3]);
    let q = with_nan.quantile(0.5, Some(1), false, Interpolation::Linear).to_vec::<f32>();
    assert!(q[0].is_nan() && q[1] == 5.0, "{q:?}");
    let x = tensor(&values(&mut rng, 12, DType::F64), &[3, 4], DType::F64);
    gradcheck(
        |t| t[0].quantile(0.3, Some(1), false, Interpolation::Linear),
        std::slice::from_ref(&x),
        1e-6,
        1e-6,
    )
    .unwrap();
    let m = Tensor::ones([3]).try_quantile(1.5, None, false, Interpolation::Linear).unwrap_err();
    assert!(m.to_string().starts_with("quantile") && m.to_string().contains("[0, 1]"), "{m}");
}

#[test]
fn bins_match_binary_search_and_counting_loops() {
    let mut rng = Rng::new(902);
    let mut edges = values(&mut rng, 11, DType::F64);
    edges.sort_by(f64::total_cmp);
    let mut xs = values(&mut rng, 5 * 13, DType::F64);
    xs[0] = edges[4]; // on a boundary
    xs[1] = edges[0];
    let b = tensor(&edges, &[11], DType::F64);
    for layout in LAYOUTS {
        let x = make(&xs, &[5, 13], DType::F64, layout);
        for right in [false, true] {
            let got = x.bucketize(&b, right).to_vec::<i64>();
            let want: Vec<i64> = x
                .to_vec::<f64>()
                .iter()
                .map(|&v| {
                    edges.iter().filter(|&&e| if right { e <= v } else { e < v }).count() as i64
                })
                .collect();
            assert_eq!(got, want, "bucketize right={right} {layout:?}");
        }
    }
    // searchsorted: a sequence per row.
    let mut seqs = values(&mut rng, 3 * 8, DType::F64);
    seqs.chunks_mut(8).for_each(|row| row.sort_by(f64::total_cmp));
    let vals = values(&mut rng, 3 * 5, DType::F64);
    let (s, v) = (tensor(&seqs, &[3, 8], DType::F64), tensor(&vals, &[3, 5], DType::F64));
    let got = s.searchsorted(&v, false).to_vec::<i64>();
    for (k, &val) in vals.iter().enumerate() {
        let row = &seqs[(k / 5) * 8..(k / 5) * 8 + 8];
        assert_eq!(got[k], row.iter().position(|&e| e >= val).unwrap_or(8) as i64);
    }
    let m = s.try_searchsorted(&Tensor::zeros([2, 5]), false).unwrap_err().to_string();
    assert!(m.starts_with("searchsorted") && m.contains("[3, 8]") && m.contains("[2, 5]"), "{m}");
    // histc over a range, the top edge in the last bin, outside values and NaN left out.
    let h = Tensor::from_vec(vec![0.0f32, 0.5, 1.0, 2.0, -1.0, 3.0, f32::NAN, 1.99], [8]);
    assert_eq!(h.histc(4, 0.0, 2.0).to_vec::<f32>(), [1.0, 1.0, 1.0, 2.0]);
    let data: Vec<f64> = values(&mut rng, 50, DType::F64);
    let (lo, hi) = data.iter().fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    let got = tensor(&data, &[50], DType::F64).histc(7, 0.0, 0.0).to_vec::<f64>();
    let mut want = [0.0; 7];
    for v in &data {
        want[(((v - lo) / (hi - lo) * 7.0).floor() as usize).min(6)] += 1.0;
    }
    assert_eq!(got, want, "histc over the data's range");
    // bincount with and without weights, and minlength.
    let ids = Tensor::from_vec(vec![2i64, 0, 2, 5], [4]);
    assert_eq!(ids.bincount(None, 0).to_vec::<i64>(), [1, 0, 2, 0, 0, 1]);
    assert_eq!(ids.bincount(None, 8).dims(), &[8]);
    let w = Tensor::from_vec(vec![0.5f32, 1.0, 2.0, 4.0], [4]);
    assert_eq!(ids.bincount(Some(&w), 0).to_vec::<f32>(), [1.0, 0.0, 2.5, 0.0, 0.0, 4.0]);
    let m = Tensor::from_vec(vec![1i64, -1], [2]).try_bincount(None, 0).unwrap_err().to_string();
    assert!(m.starts_with("bincount") && m.contains("-1"), "{m}");
}

#[test]
fn index_add_and_baddbmm_match_loops_and_gradcheck() {
    let mut rng = Rng::new(903);
    let base = values(&mut rng, 4 * 3, DType::F64);
    let src = values(&mut rng, 5 * 3, DType::F64);
    let index = [3i64, 0, 3, 1, 3];
    let x = tensor(&base, &[4, 3], DType::F64);
    let s = tensor(&src, &[5, 3], DType::F64);
    let idx = Tensor::from_vec(index.to_vec(), [5]);
    let got = x.index_add(0, &idx, &s, 0.5).to_vec::<f64>();
    let mut want = base.clone();
    for (i, &at) in index.iter().enumerate() {
        for j in 0..3 {
            want[at as usize * 3 + j] += 0.5 * src[i * 3 + j];
        }
    }
    assert_close_tol(&got, &want, 1e-12, "index_add along 0");
    // Along the last dimension.
    let got =
        x.index_add(1, &Tensor::from_vec(vec![2i64, 2], [2]), &Tensor::ones([4, 2]).double(), 1.0);
    let got = got.to_vec::<f64>();
    for r in 0..4 {
        assert!((got[r * 3 + 2] - base[r * 3 + 2] - 2.0).abs() < 1e-12);
    }
    gradcheck(|t| t[0].index_add(0, &idx, &t[1], 2.0), &[x.clone(), s.clone()], 1e-6, 1e-6)
        .unwrap();
    let m = x.try_index_add(0, &idx, &Tensor::zeros([5, 2]).double(), 1.0).unwrap_err().to_string();
    assert!(m.starts_with("index_add") && m.contains("[5, 3]"), "{m}");

    let (b1, b2) =
        (values(&mut rng, 2 * 3 * 4, DType::F64), values(&mut rng, 2 * 4 * 5, DType::F64));
    let inp = values(&mut rng, 5, DType::F64);
    let (t1, t2, ti) = (
        tensor(&b1, &[2, 3, 4], DType::F64),
        tensor(&b2, &[2, 4, 5], DType::F64),
        tensor(&inp, &[5], DType::F64),
    );
    let got = ti.baddbmm(&t1, &t2, 0.25, -1.5).to_vec::<f64>();
    for b in 0..2 {
        for i in 0..3 {
            for j in 0..5 {
                let dot: f64 =
                    (0..4).map(|k| b1[b * 12 + i * 4 + k] * b2[b * 20 + k * 5 + j]).sum();
                let want = 0.25 * inp[j] - 1.5 * dot;
                assert!((got[b * 15 + i * 5 + j] - want).abs() < 1e-12);
            }
        }
    }
    gradcheck(|t| t[0].baddbmm(&t[1], &t[2], 0.5, 2.0), &[ti, t1.clone(), t2], 1e-6, 1e-6).unwrap();
    let m = Tensor::zeros([1]).try_baddbmm(&t1, &Tensor::zeros([3, 4, 5]), 1.0, 1.0).unwrap_err();
    assert!(m.to_string().starts_with("baddbmm"), "{m}");
}

#[test]
fn nonzero_unique_and_index_put_match_loops() {
    let mut rng = Rng::new(904);
    let data: Vec<f64> =
        (0..3 * 4 * 5).map(|i| if i % 3 == 0 { rng.uniform(-1.0, 1.0) } else { 0.0 }).collect();
    for layout in LAYOUTS {
        let x = make(&data, &[3, 4, 5], DType::F32, layout);
        let xs = x.to_vec::<f64>();
        let want: Vec<i64> = (0..60)
            .filter(|&i| xs[i] != 0.0)
            .flat_map(|i| [(i / 20) as i64, ((i / 5) % 4) as i64, (i % 5) as i64])
            .collect();
        let got = x.nonzero();
        assert_eq!(got.dims(), &[want.len() / 3, 3], "{layout:?}");
        assert_eq!(got.to_vec::<i64>(), want, "{layout:?}");
    }
    assert_eq!(Tensor::zeros([2, 2]).nonzero().dims(), &[0, 2]);
    // unique: floats with a repeated NaN and signed zeros, ints.
    let x = Tensor::from_vec(vec![2.0f64, f64::NAN, -1.0, 2.0, 0.0, -0.0, f64::NAN], [7]);
    let u = x.unique();
    let v = u.values.to_vec::<f64>();
    assert_eq!(&v[..3], &[-1.0, 0.0, 2.0]);
    assert!(v.len() == 5 && v[3].is_nan() && v[4].is_nan(), "{v:?}");
    assert_eq!(u.counts.to_vec::<i64>(), [1, 2, 2, 1, 1]);
    let inv = u.inverse.to_vec::<i64>();
    let xs = x.to_vec::<f64>();
    for (i, &j) in inv.iter().enumerate() {
        assert!(xs[i] == v[j as usize] || (xs[i].is_nan() && v[j as usize].is_nan()));
    }
    let ints: Vec<i64> = (0..40).map(|_| rng.uniform(0.0, 6.0).floor() as i64).collect();
    let u = Tensor::from_vec(ints.clone(), [5, 8]).unique();
    let mut want = ints.clone();
    want.sort_unstable();
    want.dedup();
    assert_eq!(u.values.to_vec::<i64>(), want);
    assert_eq!(u.inverse.dims(), &[5, 8]);
    assert_eq!(u.counts.to_vec::<i64>().iter().sum::<i64>(), 40);
    // index_put: broadcast index tuples, negative indices, slices, accumulate.
    let base = values(&mut rng, 4 * 3 * 2, DType::F64);
    let x = tensor(&base, &[4, 3, 2], DType::F64);
    let rows = Tensor::from_vec(vec![0i64, -1, 2], [3]);
    let cols = Tensor::from_vec(vec![1i64], [1]);
    let vals = tensor(&values(&mut rng, 6, DType::F64), &[3, 2], DType::F64);
    let vs = vals.to_vec::<f64>();
    for accumulate in [false, true] {
        let got = x.index_put(&[&rows, &cols], &vals, accumulate).to_vec::<f64>();
        let mut want = base.clone();
        for (k, &r) in [0usize, 3, 2].iter().enumerate() {
            for j in 0..2 {
                let at = r * 6 + 2 + j; // element [r, 1, j]
                want[at] = if accumulate { want[at] + vs[k * 2 + j] } else { vs[k * 2 + j] };
            }
        }
        assert_close_tol(&got, &want, 1e-12, &format!("index_put accumulate={accumulate}"));
    }
    let repeated = Tensor::from_vec(vec![1i64, 1, 1], [3]);
    let got =
        Tensor::zeros([3]).double().index_put(&[&repeated], &Tensor::ones([3]).double(), true);
    assert_eq!(got.to_vec::<f64>(), [0.0, 3.0, 0.0]);
    gradcheck(
        |t| t[0].index_put(&[&rows, &cols], &t[1], true),
        &[x.clone(), vals.clone()],
        1e-6,
        1e-6,
    )
    .unwrap();
    let m = x.try_index_put(&[&rows, &cols], &Tensor::ones([4]).double(), false).unwrap_err();
    assert!(m.to_string().starts_with("index_put"), "{m}");
}
