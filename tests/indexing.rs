//! Indexing and selection against index arithmetic.

use kiln::prelude::*;

use crate::common::*;

fn iota(shape: &[usize]) -> (Vec<f64>, Tensor) {
    let data: Vec<f64> = (0..shape.iter().product::<usize>()).map(|v| v as f64).collect();
    let t = tensor(&data, shape, DType::I64);
    (data, t)
}

#[test]
fn integer_range_ellipsis_and_new_axis_indices() {
    for layout in LAYOUTS {
        let data: Vec<f64> = (0..24).map(|v| v as f64).collect();
        let x = make(&data, &[2, 3, 4], DType::I64, layout);
        let at = |i: usize, j: usize, k: usize| data[i * 12 + j * 4 + k];
        assert_eq!(
            x.i(1).to_vec::<f64>(),
            (0..12).map(|r| at(1, r / 4, r % 4)).collect::<Vec<_>>()
        );
        assert_eq!(x.i(-1).to_vec::<f64>(), x.i(1).to_vec::<f64>());
        assert_eq!(x.i((0, 1..3, -1)).to_vec::<f64>(), vec![at(0, 1, 3), at(0, 2, 3)]);
        assert_eq!(
            x.i((.., 2)).to_vec::<f64>(),
            (0..8).map(|r| at(r / 4, 2, r % 4)).collect::<Vec<_>>()
        );
        assert_eq!(
            x.i((Ellipsis, 1)).to_vec::<f64>(),
            (0..6).map(|r| at(r / 3, r % 3, 1)).collect::<Vec<_>>()
        );
        assert_eq!(x.i((1, Ellipsis, 2..)).dims(), &[3, 2]);
        assert_eq!(x.i((..1, ..=1, 1..=2)).dims(), &[1, 2, 2]);
        assert_eq!(x.i((NewAxis, 0, .., NewAxis)).dims(), &[1, 3, 1, 4]);
        assert_eq!(x.i((.., -2.., ..-1)).dims(), &[2, 2, 3]);
        // Slices clamp like Python's.
        assert_eq!(x.i((0, 0, 2..100)).to_vec::<f64>(), vec![at(0, 0, 2), at(0, 0, 3)]);
        let (hi, lo) = (3, 1);
        assert_eq!(x.i((0, 0, hi..lo)).numel(), 0, "a reversed range is empty");
        assert!(x.i((0, 1..3)).shares_storage_with(&x));
    }
    let (_, x) = iota(&[2, 3]);
    assert_eq!(x.select(1, -1).to_vec::<i64>(), vec![2, 5]);
    assert_eq!(x.i((1usize, 0usize)).item::<i64>(), 3);
}

#[test]
fn index_errors() {
    let (_, x) = iota(&[2, 3]);
    assert_eq!(
        x.try_i(2).unwrap_err().to_string(),
        "i: index 2 is out of range for dimension 0 of size 2 (shape [2, 3])"
    );
    assert_eq!(
        x.try_i((0, -4)).unwrap_err().to_string(),
        "i: index -4 is out of range for dimension 0 of size 3 (shape [2, 3])"
    );
    assert_eq!(
        x.try_i((0, 0, 0)).unwrap_err().to_string(),
        "i: too many indices (3) for a tensor of rank 2 (shape [2, 3])"
    );
    assert_eq!(
        x.try_i((Ellipsis, 0, Ellipsis)).unwrap_err().to_string(),
        "i: an index can contain at most one Ellipsis"
    );
    assert!(
        x.try_select(2, 0)
            .unwrap_err()
            .to_string()
            .starts_with("select: dimension 2 is out of range")
    );
}

#[test]
fn gather_scatter_and_index_select_match_loops() {
    let mut rng = Rng::new(52);
    for layout in LAYOUTS {
        let data = values(&mut rng, 12, DType::F32);
        let x = make(&data, &[3, 4], DType::F32, layout);
        let idx: Vec<i64> = (0..6).map(|_| rng.int(0, 4)).collect();
        let index = Tensor::from_vec(idx.clone(), [3, 2]);
        let g = x.gather(1, &index).to_vec::<f64>();
        assert_eq!(
            g,
            (0..6).map(|p| data[(p / 2) * 4 + idx[p] as usize]).collect::<Vec<_>>(),
            "gather {layout:?}"
        );
        let rows: Vec<i64> = vec![2, 0, 2, 1];
        let sel = x.index_select(0, &Tensor::from_vec(rows.clone(), [4])).to_vec::<f64>();
        assert_eq!(
            sel,
            (0..16).map(|p| data[rows[p / 4] as usize * 4 + p % 4]).collect::<Vec<_>>()
        );
        let cols = x.index_select(-1, &Tensor::from_vec(vec![3i32, 3], [2])).to_vec::<f64>();
        assert_eq!(cols, (0..6).map(|p| data[(p / 2) * 4 + 3]).collect::<Vec<_>>());
        // scatter_add accumulates repeated positions; scatter keeps the last write.
        let src = values(&mut rng, 6, DType::F32);
        let s = tensor(&src, &[3, 2], DType::F32);
        let added = x.scatter_add(1, &index, &s).to_vec::<f64>();
        let replaced = x.scatter(1, &index, &s).to_vec::<f64>();
        let mut want_add = data.clone();
        let mut want_rep = data.clone();
        for p in 0..6 {
            let t = (p / 2) * 4 + idx[p] as usize;
            want_add[t] += src[p];
            want_rep[t] = src[p];
        }
        assert_close(
            &added,
            &want_add.iter().map(|&v| round_to(DType::F32, v)).collect::<Vec<_>>(),
            DType::F32,
            "scatter_add",
        );
        assert_eq!(replaced, want_rep);
        let filled =
            x.scatter(0, &Tensor::from_vec(vec![1i64, 0, 2, 1], [1, 4]), 9.0).to_vec::<f64>();
        let mut want = data.clone();
        for (c, r) in [1usize, 0, 2, 1].iter().enumerate() {
            want[r * 4 + c] = 9.0;
        }
        assert_eq!(filled, want);
    }
}

/// An index that is one value along every dimension after the axis (an embedding's lookup
/// and its gradient) gathers and scatters whole rows: the same values as a loop, repeated
/// rows summed once in f64, the last write kept, out-of-range rows refused.
#[test]
fn whole_row_indices_gather_and_scatter_like_loops() {
    let mut rng = Rng::new(54);
    let (b, n, r, w) = (2usize, 5usize, 4usize, 9usize);
    for layout in LAYOUTS {
        let data = values(&mut rng, b * n * w, DType::F32);
        let x = make(&data, &[b, n, w], DType::F32, layout);
        let picks: Vec<i64> =
            (0..b * r).map(|i| if i % 3 == 0 { 2 } else { rng.int(0, n as i64) }).collect();
        let idx: Vec<i64> = (0..b * r * w).map(|p| picks[p / w]).collect();
        let index = Tensor::from_vec(idx.clone(), [b, r, w]);
        let at = |p: usize| (p / (r * w)) * n * w + picks[p / w] as usize * w + p % w;
        let g = x.gather(1, &index).to_vec::<f64>();
        assert_eq!(g, (0..b * r * w).map(|p| data[at(p)]).collect::<Vec<_>>(), "{layout:?}");
        let src = values(&mut rng, b * r * w, DType::F32);
        let s = tensor(&src, &[b, r, w], DType::F32);
        let mut sums = data.clone();
        let mut last = data.clone();
        for p in 0..b * r * w {
            sums[at(p)] += src[p];
            last[at(p)] = src[p];
        }
        let want: Vec<f64> = sums.iter().map(|&v| round_to(DType::F32, v)).collect();
        assert_eq!(x.scatter_add(1, &index, &s).to_vec::<f64>(), want, "{layout:?}");
        assert_eq!(x.scatter(1, &index, &s).to_vec::<f64>(), last, "{layout:?}");
    }
    // Integers wrap.
    let xi = Tensor::from_vec(vec![i64::MAX; n * w], [n, w]);
    let index = Tensor::from_vec((0..2 * w).map(|_| 3i64).collect::<Vec<_>>(), [2, w]);
    let ones = Tensor::from_vec(vec![1i64; 2 * w], [2, w]);
    let got = xi.scatter_add(0, &index, &ones).to_vec::<i64>();
    let want: Vec<i64> =
        (0..n * w).map(|p| if p / w == 3 { i64::MAX.wrapping_add(2) } else { i64::MAX }).collect();
    assert_eq!(got, want);
    // An embedding's gradient: the rows of the incoming gradient summed per token.
    let (vocab, dim) = (7usize, 16usize);
    let weight = Tensor::randn([vocab, dim]).requires_grad_(true);
    let tokens: Vec<i64> = (0..10).map(|_| rng.int(0, vocab as i64)).collect();
    let up = values(&mut rng, 10 * dim, DType::F32);
    let e = kiln::nn::functional::embedding(&Tensor::from_vec(tokens.clone(), [10]), &weight);
    (e * tensor(&up, &[10, dim], DType::F32)).sum().backward();
    let mut want = vec![0.0f64; vocab * dim];
    for (t, &tok) in tokens.iter().enumerate() {
        for c in 0..dim {
            want[tok as usize * dim + c] += up[t * dim + c];
        }
    }
    let want: Vec<f64> = want.iter().map(|&v| round_to(DType::F32, v)).collect();
    assert_eq!(weight.grad().expect("a gradient").to_vec::<f64>(), want);
    // A row out of range fails, naming the op and the size.
    let bad = Tensor::from_vec(vec![5i64; w], [1, 1, w]);
    let err = Tensor::zeros([1, n, w]).gather(1, &bad).try_to_vec::<f32>().unwrap_err();
    assert!(
        err.to_string().starts_with("gather: index 5 is out of bounds for dimension 1 with size 5"),
        "{err}"
    );
}

#[test]
fn a_few_scatter_adds_into_a_large_base_round_each_sum_once() {
    // 12 writes (repeats included) into 3 x 4099 values: the sparse path of `scatter_add`.
    let mut rng = Rng::new(53);
    let (rows, cols) = (3, 4099);
    let data = values(&mut rng, rows * cols, DType::F32);
    let x = tensor(&data, &[rows, cols], DType::F32);
    let idx: Vec<i64> =
        (0..12).map(|i| if i % 3 == 0 { 7 } else { rng.int(0, cols as i64) }).collect();
    let src = values(&mut rng, 12, DType::F32);
    let added = x
        .scatter_add(1, &Tensor::from_vec(idx.clone(), [3, 4]), &tensor(&src, &[3, 4], DType::F32))
        .to_vec::<f32>();
    let mut sums = data.clone();
    for p in 0..12 {
        sums[(p / 4) * cols + idx[p] as usize] += src[p];
    }
    let want: Vec<f32> = sums.iter().map(|&v| v as f32).collect();
    assert_eq!(added, want);
}

#[test]
fn out_of_range_indices_fail_when_computed_naming_the_line() {
    let x = Tensor::zeros([2, 3]);
    let line = line!() + 1;
    let g = x.gather(1, &Tensor::from_vec(vec![0i64, 3], [2, 1]));
    let err = g.try_to_vec::<f32>().unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("gather: index 3 is out of bounds for dimension 1 with size 3"),
        "{text}"
    );
    assert!(text.contains(&format!("indexing.rs:{line}")), "{text}");
    let err = x
        .index_select(0, &Tensor::from_vec(vec![-1i64], [1]))
        .try_to_vec::<f32>()
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("gather: index -1 is out of bounds for dimension 0 with size 2"),
        "{err}"
    );
    assert!(
        x.try_gather(0, &Tensor::zeros([2, 3]))
            .unwrap_err()
            .to_string()
            .starts_with("gather: indices must be an integer tensor")
    );
    assert!(
        x.try_gather(0, &Tensor::from_vec(vec![0i64], [1]))
            .unwrap_err()
            .to_string()
            .starts_with("gather: the index (shape [1]) must have as many dimensions")
    );
    assert!(
        x.try_gather(0, &Tensor::from_vec(vec![0i64; 8], [1, 8]))
            .unwrap_err()
            .to_string()
            .contains("larger than the tensor")
    );
}

#[test]
fn masks() {
    let mut rng = Rng::new(53);
    for layout in LAYOUTS {
        let data = values(&mut rng, 12, DType::F64);
        let x = make(&data, &[3, 4], DType::F64, layout);
        let m: Vec<bool> = data.iter().map(|v| *v > 0.0).collect();
        let got = x.masked_select(&x.gt(0.0)).to_vec::<f64>();
        assert_eq!(got, data.iter().copied().filter(|v| *v > 0.0).collect::<Vec<_>>());
        let filled = x.masked_fill(&x.gt(0.0), -7.0).to_vec::<f64>();
        assert_eq!(
            filled,
            data.iter().zip(&m).map(|(v, m)| if *m { -7.0 } else { *v }).collect::<Vec<_>>()
        );
        // A broadcast mask.
        let row_mask = Tensor::from_vec(vec![true, false, false, true], [4]);
        let got = x.masked_select(&row_mask).to_vec::<f64>();
        assert_eq!(
            got,
            (0..12).filter(|i| i % 4 == 0 || i % 4 == 3).map(|i| data[i]).collect::<Vec<_>>()
        );
    }
    let x = Tensor::zeros([2, 2]);
    assert!(
        x.try_masked_fill(&Tensor::from_vec(vec![1i64, 0], [2]), 1.0)
            .unwrap_err()
            .to_string()
            .starts_with("masked_fill: the mask must be a bool tensor, got i64")
    );
    assert!(
        x.try_masked_select(&Tensor::from_vec(vec![true; 3], [3]))
            .unwrap_err()
            .to_string()
            .starts_with("masked_select: shapes [2, 2] and [3] cannot be broadcast")
    );
    assert!(
        x.try_masked_fill(&Tensor::from_vec(vec![true; 12], [3, 2, 2]), 1.0)
            .unwrap_err()
            .to_string()
            .starts_with("masked_fill: a mask of shape [3, 2, 2] does not broadcast")
    );
}

#[test]
fn cat_stack_split_chunk_repeat_flip_triangles() {
    let (da, a) = iota(&[2, 3]);
    let b = Tensor::from_vec(vec![100.0f32, 101.0], [2, 1]);
    let c = Tensor::cat(&[&a.t(), &a.t()], 0);
    assert_eq!(c.dims(), &[6, 2]);
    let at = a.t().to_vec::<f64>();
    assert_eq!(c.to_vec::<f64>(), [at.clone(), at].concat());
    let mixed = Tensor::cat(&[&a, &b], 1);
    assert_eq!(mixed.dtype(), DType::F32);
    assert_eq!(mixed.to_vec::<f64>(), vec![0.0, 1.0, 2.0, 100.0, 3.0, 4.0, 5.0, 101.0]);
    assert_eq!(Tensor::cat(&[&a, &Tensor::zeros([0, 3]).long()], 0).to_vec::<f64>(), da);
    let s = Tensor::stack(&[&a, &a], 1);
    assert_eq!(s.dims(), &[2, 2, 3]);
    assert_eq!(s.i((1, 0)).to_vec::<i64>(), vec![3, 4, 5]);
    assert_eq!(Tensor::stack(&[&a, &a], -1).dims(), &[2, 3, 2]);
    let parts = Tensor::arange(0i64, 7, 1).chunk(3, 0);
    assert_eq!(parts.iter().map(Tensor::numel).collect::<Vec<_>>(), vec![3, 3, 1]);
    assert!(parts[1].shares_storage_with(&parts[0]));
    assert_eq!(
        a.split(2, 1).iter().map(|p| p.dims().to_vec()).collect::<Vec<_>>(),
        vec![vec![2, 2], vec![2, 1]]
    );
    let r = a.repeat(&[2, 1, 2]);
    assert_eq!(r.dims(), &[2, 2, 6]);
    assert_eq!(r.i((1, 1)).to_vec::<i64>(), vec![3, 4, 5, 3, 4, 5]);
    assert_eq!(a.flip(&[0, 1]).to_vec::<i64>(), vec![5, 4, 3, 2, 1, 0]);
    assert_eq!(a.t().flip(&[-1]).to_vec::<i64>(), vec![3, 0, 4, 1, 5, 2]);
    let m = Tensor::ones([3, 4]);
    assert_eq!(m.tril(0).to_vec::<f32>(), vec![1., 0., 0., 0., 1., 1., 0., 0., 1., 1., 1., 0.]);
    assert_eq!(m.triu(1).to_vec::<f32>(), vec![0., 1., 1., 1., 0., 0., 1., 1., 0., 0., 0., 1.]);
    assert_eq!(m.tril(-1).sum().item::<f32>(), 3.0);
    // Errors.
    let err = Tensor::try_cat(&[&a, &Tensor::zeros([3, 3]).long()], 1).unwrap_err().to_string();
    assert_eq!(
        err,
        "cat: tensor 1 has shape [3, 3] but tensor 0 has shape [2, 3]; all dimensions except 1 must match"
    );
    assert!(Tensor::try_cat(&[], 0).is_err());
    assert!(
        Tensor::try_stack(&[&a, &a.t()], 0)
            .unwrap_err()
            .to_string()
            .starts_with("stack: tensor 1 has shape [3, 2]")
    );
    assert!(a.try_repeat(&[2]).is_err());
}

#[test]
fn large_cats_and_partial_writes_match_loops_without_touching_shared_buffers() {
    // Big enough (>= 32768 elements) for the parallel write path; odd sizes; 1-D pieces
    // (a gradient bucket) and 2-D ones along either dim.
    let mut rng = Rng::new(41);
    let sizes = [33_001usize, 7, 40_013, 1];
    let pieces: Vec<Vec<f64>> = sizes.iter().map(|&n| values(&mut rng, n, DType::F32)).collect();
    let tensors: Vec<Tensor> = pieces.iter().map(|p| tensor(p, &[p.len()], DType::F32)).collect();
    let joined = Tensor::cat(&tensors.iter().collect::<Vec<_>>(), 0).to_vec::<f64>();
    assert_eq!(joined, pieces.concat());

    let (rows, a_cols, b_cols) = (211, 173, 59);
    let a = values(&mut rng, rows * a_cols, DType::F32);
    let b = values(&mut rng, rows * b_cols, DType::F32);
    let (ta, tb) =
        (tensor(&a, &[rows, a_cols], DType::F32), tensor(&b, &[rows, b_cols], DType::F32));
    let side = Tensor::cat(&[&ta, &tb], 1).to_vec::<f64>();
    for r in 0..rows {
        let row = &side[r * (a_cols + b_cols)..(r + 1) * (a_cols + b_cols)];
        assert_eq!(row[..a_cols], a[r * a_cols..(r + 1) * a_cols]);
        assert_eq!(row[a_cols..], b[r * b_cols..(r + 1) * b_cols]);
    }
    let stacked = Tensor::cat(&[&ta, &ta.narrow(0, 3, 100)], 0).to_vec::<f64>();
    assert_eq!(stacked, [a.clone(), a[3 * a_cols..103 * a_cols].to_vec()].concat());

    // A partial write into a copy: the copy's buffer starts as the original's, which must
    // stay as it was.
    let x = tensor(&pieces[0], &[sizes[0]], DType::F32).realize().clone();
    let y = x.copy();
    y.narrow(0, 5, 32_990).copy_(&Tensor::full([32_990], 2.5));
    let mut want = pieces[0].clone();
    want[5..5 + 32_990].fill(2.5);
    assert_eq!(y.to_vec::<f64>(), want);
    assert_eq!(x.to_vec::<f64>(), pieces[0]);
}
