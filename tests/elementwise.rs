//! Elementwise ops against plain f64 loops: every dtype each op accepts, broadcasting,
//! non-contiguous inputs, odd sizes and type promotion.

use kiln::prelude::*;

use crate::common::*;

const SHAPES: [&[usize]; 6] = [&[], &[1], &[17], &[3, 5], &[2, 3, 4], &[0, 3]];

type Unary = (&'static str, fn(&Tensor) -> Tensor, fn(f64) -> f64);

fn float_unaries() -> Vec<Unary> {
    vec![
        ("sqrt", |t| t.sqrt(), f64::sqrt),
        ("exp", |t| t.exp(), f64::exp),
        ("log", |t| t.log(), f64::ln),
        ("sin", |t| t.sin(), f64::sin),
        ("cos", |t| t.cos(), f64::cos),
        ("tan", |t| t.tan(), f64::tan),
        ("tanh", |t| t.tanh(), f64::tanh),
        ("sigmoid", |t| t.sigmoid(), |x| 1.0 / (1.0 + (-x).exp())),
        ("erf", |t| t.erf(), erf_by_simpson),
        ("gelu", |t| t.gelu(), |x| 0.5 * x * (1.0 + erf_by_simpson(x / 2f64.sqrt()))),
        ("reciprocal", |t| t.reciprocal(), |x| 1.0 / x),
        ("floor", |t| t.floor(), f64::floor),
        ("ceil", |t| t.ceil(), f64::ceil),
        ("round", |t| t.round(), f64::round_ties_even),
        ("square", |t| t.square(), |x| x * x),
        ("pow(3)", |t| t.pow(3.0), |x| x.powi(3)),
        ("pow(-0.5)", |t| t.pow(-0.5), |x| x.powf(-0.5)),
        ("clamp", |t| t.clamp(-1.0, 0.5), |x| x.clamp(-1.0, 0.5)),
        ("neg", |t| -t, |x| -x),
        ("abs", |t| t.abs(), f64::abs),
        ("relu", |t| t.relu(), |x| x.max(0.0)),
    ]
}

/// erf as its defining integral, `2/√π ∫₀ˣ exp(-t²) dt`, by Simpson's rule over 2000
/// intervals (within 1e-14 of erf over -10..10), written out independently
/// of the library's own erf (Abramowitz-Stegun 7.1.26 is too coarse for f64).
fn erf_by_simpson(x: f64) -> f64 {
    let n = 2000;
    let h = x / n as f64;
    let f = |t: f64| (-t * t).exp();
    let mut s = f(0.0) + f(x);
    for i in 1..n {
        s += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
    }
    s * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
fn float_unary_ops_match_f64_on_every_float_dtype_and_layout() {
    let mut rng = Rng::new(1);
    for (name, op, reference) in float_unaries() {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
            for shape in SHAPES {
                for layout in LAYOUTS {
                    let n: usize = shape.iter().product();
                    let data = values(&mut rng, n, dtype);
                    let got = read(&op(&make(&data, shape, dtype, layout)), dtype);
                    let want: Vec<f64> =
                        data.iter().map(|&x| round_to(dtype, reference(x))).collect();
                    // gelu is a chain of four ops, each rounded to the dtype.
                    let tol = if name == "gelu" {
                        4.0 * tolerance(dtype).max(1e-10)
                    } else {
                        tolerance(dtype)
                    };
                    assert_close_tol(
                        &got,
                        &want,
                        tol,
                        &format!("{name} {dtype} {shape:?} {layout:?}"),
                    );
                }
            }
        }
    }
}

#[test]
fn math_functions_of_integers_compute_in_f32() {
    let mut rng = Rng::new(2);
    for dtype in [DType::I64, DType::I32, DType::I8, DType::U8, DType::Bool] {
        let data = values(&mut rng, 11, dtype);
        let x = tensor(&data, &[11], dtype);
        let got = read(&x.exp(), DType::F32);
        let want: Vec<f64> = data.iter().map(|&v| round_to(DType::F32, v.exp())).collect();
        assert_close(&got, &want, DType::F32, &format!("exp of {dtype}"));
        let got = read(&x.pow(2.0), DType::F32);
        let want: Vec<f64> = data.iter().map(|&v| v * v).collect();
        assert_close(&got, &want, DType::F32, &format!("pow of {dtype}"));
    }
}

#[test]
fn integer_neg_abs_relu_keep_their_dtype() {
    let mut rng = Rng::new(3);
    for dtype in [DType::I64, DType::I32, DType::I8] {
        for layout in LAYOUTS {
            let data = values(&mut rng, 12, dtype);
            let x = make(&data, &[3, 4], dtype, layout);
            assert_eq!(read(&x.neg(), dtype), data.iter().map(|v| -v).collect::<Vec<_>>());
            assert_eq!(read(&x.abs(), dtype), data.iter().map(|v| v.abs()).collect::<Vec<_>>());
            assert_eq!(read(&x.relu(), dtype), data.iter().map(|v| v.max(0.0)).collect::<Vec<_>>());
            assert_eq!(
                read(&x.clamp(-5.0, 5.0), dtype),
                data.iter().map(|v| v.clamp(-5.0, 5.0)).collect::<Vec<_>>()
            );
        }
    }
    // i8 wraps as PyTorch's int8 does: -(-128) and |-128| are -128, 100 * 2 is -56.
    let x = Tensor::from_vec(vec![-128i8, 100, -3], [3]);
    assert_eq!(x.neg().to_vec::<i8>(), vec![-128, -100, 3]);
    assert_eq!(x.abs().to_vec::<i8>(), vec![-128, 100, 3]);
    assert_eq!((&x * 2).to_vec::<i8>(), vec![0, -56, -6]);
    // With u8 it meets at i32 (PyTorch's i16, which kiln does not have); with floats, f32.
    let u = Tensor::from_vec(vec![200u8, 1, 255], [3]);
    assert_eq!((&x + &u).dtype(), DType::I32);
    assert_eq!((&x + &u).to_vec::<i32>(), vec![72, 101, 252]);
    assert_eq!((&x * 0.5).to_vec::<f32>(), vec![-64.0, 50.0, -1.5]);
    // u8 wraps like the C type: -3 is 253.
    let x = Tensor::from_vec(vec![3u8, 0, 200], [3]);
    assert_eq!(x.neg().to_vec::<u8>(), vec![253, 0, 56]);
}

type Binary = (&'static str, fn(&Tensor, &Tensor) -> Tensor, fn(f64, f64) -> f64);

fn arithmetic() -> Vec<Binary> {
    vec![
        ("add", |a, b| a + b, |x, y| x + y),
        ("sub", |a, b| a - b, |x, y| x - y),
        ("mul", |a, b| a * b, |x, y| x * y),
        ("maximum", |a, b| a.maximum(b), f64::max),
        ("minimum", |a, b| a.minimum(b), f64::min),
    ]
}

fn comparisons() -> Vec<Binary> {
    fn b(v: bool) -> f64 {
        f64::from(u8::from(v))
    }
    vec![
        ("eq", |a, c| a.eq(c), |x, y| b(x == y)),
        ("ne", |a, c| a.ne(c), |x, y| b(x != y)),
        ("lt", |a, c| a.lt(c), |x, y| b(x < y)),
        ("le", |a, c| a.le(c), |x, y| b(x <= y)),
        ("gt", |a, c| a.gt(c), |x, y| b(x > y)),
        ("ge", |a, c| a.ge(c), |x, y| b(x >= y)),
    ]
}

const BROADCASTS: [(&[usize], &[usize]); 7] = [
    (&[3, 4], &[3, 4]),
    (&[3, 1], &[4]),
    (&[2, 3, 4], &[3, 1]),
    (&[5, 1, 7], &[6, 1]),
    (&[], &[2, 3]),
    (&[17], &[1]),
    (&[0, 3], &[3]),
];

/// Runs `op` on every broadcast pair and layout, comparing with the reference computed in
/// f64 and rounded to `out` (given the inputs' `dtype`).
fn check_binary(op: &Binary, dtype: DType, out: DType, seed: u64) {
    let (name, f, reference) = op;
    let mut rng = Rng::new(seed);
    for (sa, sb) in BROADCASTS {
        for (la, lb) in [
            (Layout::Contiguous, Layout::Contiguous),
            (Layout::Permuted, Layout::Sliced),
            (Layout::Sliced, Layout::Permuted),
        ] {
            let da = values(&mut rng, sa.iter().product(), dtype);
            let db = values(&mut rng, sb.iter().product(), dtype);
            let a = make(&da, sa, dtype, la);
            let b = make(&db, sb, dtype, lb);
            let shape = broadcast_shape(sa, sb).expect("test shapes broadcast");
            let n: usize = shape.iter().product();
            let want: Vec<f64> = (0..n)
                .map(|flat| {
                    let idx = unravel(flat, &shape);
                    round_to(
                        out,
                        reference(da[broadcast_index(&idx, sa)], db[broadcast_index(&idx, sb)]),
                    )
                })
                .collect();
            let context = format!("{name} {dtype} {sa:?} {la:?} with {sb:?} {lb:?}");
            let r = f(&a, &b);
            assert_eq!(r.dims(), shape.as_slice(), "{context}");
            assert_close(&read(&r, out), &want, out, &context);
            // Swapped operands broadcast the same way.
            let r = f(&b, &a);
            let want: Vec<f64> = (0..n)
                .map(|flat| {
                    let idx = unravel(flat, &shape);
                    round_to(
                        out,
                        reference(db[broadcast_index(&idx, sb)], da[broadcast_index(&idx, sa)]),
                    )
                })
                .collect();
            assert_close(&read(&r, out), &want, out, &format!("{context} (swapped)"));
        }
    }
}

#[test]
fn arithmetic_broadcasts_on_every_numeric_dtype() {
    for (i, op) in arithmetic().iter().enumerate() {
        // Every numeric dtype (a new one is checked without a change here).
        for dtype in DType::ALL.into_iter().filter(|d| *d != DType::Bool) {
            check_binary(op, dtype, dtype, 100 + i as u64);
        }
    }
}

#[test]
fn division_is_true_division() {
    let div: Binary = ("div", |a, b| a / b, |x, y| x / y);
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        check_binary(&div, dtype, dtype, 7);
    }
    for dtype in DType::ALL.into_iter().filter(|d| d.is_int()) {
        check_binary(&div, dtype, DType::F32, 8);
    }
}

#[test]
fn comparisons_give_bool_on_every_dtype() {
    for (i, op) in comparisons().iter().enumerate() {
        for dtype in DType::ALL {
            check_binary(op, dtype, DType::Bool, 200 + i as u64);
        }
    }
}

#[test]
fn logical_ops_on_bools() {
    let a = Tensor::from_vec(vec![true, true, false, false], [4]);
    let b = Tensor::from_vec(vec![true, false, true, false], [4]);
    assert_eq!(a.logical_and(&b).to_vec::<bool>(), vec![true, false, false, false]);
    assert_eq!(a.logical_or(&b).to_vec::<bool>(), vec![true, true, true, false]);
    assert_eq!(a.logical_not().to_vec::<bool>(), vec![false, false, true, true]);
}

#[test]
fn promotion_follows_pytorch() {
    let cases = [
        (DType::I32, DType::F32, DType::F32),
        (DType::F16, DType::F32, DType::F32),
        (DType::F16, DType::BF16, DType::F32),
        (DType::U8, DType::I64, DType::I64),
        (DType::U8, DType::I32, DType::I32),
        (DType::Bool, DType::F16, DType::F16),
        (DType::Bool, DType::I32, DType::I32),
        (DType::I64, DType::F64, DType::F64),
        (DType::BF16, DType::F64, DType::F64),
    ];
    let mut rng = Rng::new(9);
    for (da, db, want) in cases {
        let va = values(&mut rng, 6, da);
        let vb = values(&mut rng, 6, db);
        let a = make(&va, &[2, 3], da, Layout::Permuted);
        let b = tensor(&vb, &[2, 3], db);
        let expect: Vec<f64> = va.iter().zip(&vb).map(|(x, y)| round_to(want, x * y)).collect();
        assert_close(&read(&(&a * &b), want), &expect, want, &format!("{da} * {db}"));
        assert_close(&read(&(&b * &a), want), &expect, want, &format!("{db} * {da}"));
    }
}

#[test]
fn scalars_promote_by_category_only() {
    let h = Tensor::from_vec(vec![half::f16::from_f32(1.5), half::f16::from_f32(-2.0)], [2]);
    assert_eq!((&h * 2.5).dtype(), DType::F16);
    assert_eq!((&h * 2.5).to_vec::<f32>(), vec![3.75, -5.0]);
    let i = Tensor::from_vec(vec![1i32, 2], [2]);
    assert_eq!((&i + 1).dtype(), DType::I32);
    assert_eq!((&i * 2.5).dtype(), DType::F32);
    assert_eq!((&i * 2.5).to_vec::<f32>(), vec![2.5, 5.0]);
    let b = Tensor::from_vec(vec![true, false], [2]);
    assert_eq!((&b + 1).dtype(), DType::I64);
    assert_eq!((&b + 1).to_vec::<i64>(), vec![2, 1]);
    // A zero-dimensional tensor of a higher category decides the dtype.
    let z = Tensor::scalar(0.5f64);
    assert_eq!((&i * &z).dtype(), DType::F64);
    // Of the same category, the dimensioned tensor decides.
    let zi = Tensor::scalar(3i64);
    assert_eq!((&i * &zi).dtype(), DType::I32);
}

#[test]
fn scalar_operands_work_on_either_side() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 4.0], [3]);
    assert_eq!((2.0 - &x).to_vec::<f32>(), vec![1.0, 0.0, -2.0]);
    assert_eq!((8.0 / &x).to_vec::<f32>(), vec![8.0, 4.0, 2.0]);
    assert_eq!((&x - 1).to_vec::<f32>(), vec![0.0, 1.0, 3.0]);
    assert_eq!((3 * x.clone()).to_vec::<f32>(), vec![3.0, 6.0, 12.0]);
    assert_eq!(x.add(1.0f32).to_vec::<f32>(), vec![2.0, 3.0, 5.0]);
    assert_eq!(x.gt(1.5).to_vec::<bool>(), vec![false, true, true]);
    assert_eq!(x.maximum(2.0).to_vec::<f32>(), vec![2.0, 2.0, 4.0]);
}

#[test]
fn nan_propagates_through_maximum_relu_and_clamp() {
    let x = Tensor::from_vec(vec![f32::NAN, 1.0, -1.0], [3]);
    let m = x.maximum(0.0).to_vec::<f32>();
    assert!(m[0].is_nan() && m[1] == 1.0 && m[2] == 0.0);
    assert!(x.relu().to_vec::<f32>()[0].is_nan());
    assert!(x.clamp(-0.5, 0.5).to_vec::<f32>()[0].is_nan());
}

#[test]
fn casts_follow_as_semantics() {
    let x = Tensor::from_vec(vec![-1.5f32, 0.0, 2.7, 300.0, f32::NAN], [5]);
    assert_eq!(x.long().to_vec::<i64>(), vec![-1, 0, 2, 300, 0]);
    assert_eq!(x.to_dtype(DType::U8).to_vec::<u8>(), vec![255, 0, 2, 44, 0]);
    assert_eq!(x.bool().to_vec::<bool>(), vec![true, false, true, true, true]);
    let h = x.half().to_vec::<f32>();
    assert_eq!(&h[..4], &[-1.5, 0.0, half::f16::from_f32(2.7).to_f32(), 300.0]);
    assert_eq!(x.bfloat16().to_vec::<f32>()[2], 2.703125);
    assert_eq!(x.double().dtype(), DType::F64);
    assert_eq!(Tensor::from_vec(vec![true, false], [2]).float().to_vec::<f32>(), vec![1.0, 0.0]);
    assert_eq!(Tensor::from_vec(vec![70_000i64], [1]).int().to_vec::<i32>(), vec![70_000]);
    // A cast to the same dtype is the same tensor.
    assert!(x.float().shares_storage_with(&x));
}

#[test]
fn long_chains_of_mixed_ops_agree_with_f64() {
    let mut rng = Rng::new(11);
    for layout in LAYOUTS {
        let data = values(&mut rng, 35, DType::F64);
        let x = make(&data, &[5, 7], DType::F64, layout);
        let y = ((&x * 1.5 + 0.5).tanh() * x.sigmoid() + (&x - 0.2).relu()) / (x.square() + 1.0);
        let want: Vec<f64> = data
            .iter()
            .map(|&v| {
                ((v * 1.5 + 0.5).tanh() / (1.0 + (-v).exp()) + (v - 0.2).max(0.0)) / (v * v + 1.0)
            })
            .collect();
        assert_close(&read(&y, DType::F64), &want, DType::F64, &format!("chain {layout:?}"));
    }
}

/// Rows read with a stride (every other element, as a stride-2 convolution's windows read
/// their input) run on vectors with gathered lanes, and rows of 64 or more stage their
/// transcendentals: odd row lengths on both sides of that, f32 and f64, against f64.
#[test]
fn strided_rows_gather_their_lanes() {
    let mut rng = Rng::new(12);
    for (rows, len) in [(3, 5), (4, 9), (3, 67), (2, 130)] {
        for dtype in [DType::F32, DType::F64] {
            let data = values(&mut rng, rows * len * 2, dtype);
            let x = tensor(&data, &[rows, len, 2], dtype).select(2, 1);
            assert_eq!(x.dims(), &[rows, len]);
            let y = ((&x * 1.5 + 0.5).tanh() * x.sigmoid() + x.exp()) / (x.square() + 1.0);
            let want: Vec<f64> = data
                .iter()
                .skip(1)
                .step_by(2)
                .map(|&v| {
                    let chain = (v * 1.5 + 0.5).tanh() / (1.0 + (-v).exp()) + v.exp();
                    round_to(dtype, chain / (v * v + 1.0))
                })
                .collect();
            let context = format!("strided rows {dtype} {rows}x{len}");
            assert_close_tol(&read(&y, dtype), &want, 8.0 * tolerance(dtype), &context);
        }
    }
}

#[test]
fn where_broadcasts_and_promotes() {
    let mut rng = Rng::new(12);
    for layout in LAYOUTS {
        let c = values(&mut rng, 12, DType::Bool);
        let a = values(&mut rng, 4, DType::I32);
        let b = values(&mut rng, 3, DType::F16);
        let r = Tensor::where_(
            &make(&c, &[3, 4], DType::Bool, layout),
            tensor(&a, &[4], DType::I32),
            tensor(&b, &[3, 1], DType::F16),
        );
        let want: Vec<f64> =
            (0..12).map(|i| if c[i] != 0.0 { a[i % 4] } else { b[i / 4] }).collect();
        assert_close(&read(&r, DType::F16), &want, DType::F16, &format!("where {layout:?}"));
    }
    let x = Tensor::from_vec(vec![1i64, -2], [2]);
    assert_eq!(Tensor::where_(&x.lt(0), 0, &x).to_vec::<i64>(), vec![1, 0]);
    assert_eq!(Tensor::where_(&x.lt(0), 0.5, &x).dtype(), DType::F32);
    let err = Tensor::try_where_(&x, &x, &x).unwrap_err().to_string();
    assert!(err.starts_with("where: the condition must be a bool tensor, got i64"), "{err}");
}

#[test]
fn large_integer_constants_pass_exactly() {
    // 2^53 + 1 is not an f64: constants travel to generated code as integers.
    let big = (1i64 << 53) + 1;
    let x = Tensor::from_vec(vec![0i64, 1, -1], [3]);
    assert_eq!((&x + big).to_vec::<i64>(), vec![big, big + 1, big - 1]);
    assert_eq!(Tensor::full([2], big).to_vec::<i64>(), vec![big, big]);
    assert_eq!(x.eq(big - big + 1).to_vec::<bool>(), vec![false, true, false]);
}

#[test]
fn integer_powers_rewritten_as_products_stay_exact() {
    // `pow(x, 2)` runs as `x * x` and `pow(x, -1)` as `1 / x`: both round the exact value
    // once, as `pow` does, so they match the reference bit for bit, special values included.
    let mut data = vec![0.0, -0.0, 1.5, -2.25, 1e-40, -3e30, 7e38, f64::INFINITY];
    data.extend([f64::NEG_INFINITY, f64::NAN, 0.1, -0.3333]);
    for dtype in [DType::F32, DType::F64, DType::F16] {
        let x = Tensor::from_vec(data.clone(), [data.len()]).to_dtype(dtype);
        for e in [2.0, -1.0, 1.0] {
            let fused = x.pow(e).to_vec::<f64>();
            let reference =
                kiln::with_execution(kiln::Execution::Reference, || x.pow(e).to_vec::<f64>());
            for (i, (a, b)) in fused.iter().zip(&reference).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "{dtype} pow({}, {e}): {a} vs {b}",
                    data[i]
                );
            }
        }
    }
}

#[test]
fn f64_to_16_bit_rounds_once() {
    // Just above a 16-bit tie: rounding to f32 first lands on the tie and then goes to even.
    let mut rng = Rng::new(31);
    for (dtype, bits) in [(DType::F16, 10), (DType::BF16, 7)] {
        let mut data = Vec::new();
        for _ in 0..200 {
            let q = round_to(dtype, rng.uniform(-3.0, 3.0));
            let half_ulp = 2f64.powi(q.abs().log2().floor() as i32 - bits - 1);
            let tiny = q.abs() * 2f64.powi(-40);
            data.extend([
                q + half_ulp,
                q + half_ulp + tiny,
                q + half_ulp - tiny,
                q - half_ulp - tiny,
            ]);
        }
        data.extend([1e-30, -1e-30, 7e4, 1e39, f64::INFINITY, f64::NAN, 0.0, -0.0]);
        // The data holds values where rounding through f32 (half's conversion) is wrong, so
        // an implementation that rounds twice fails against the oracle.
        let twice = |v: f64| match dtype {
            DType::F16 => half::f16::from_f64(v).to_f64(),
            _ => half::bf16::from_f64(v).to_f64(),
        };
        let double_rounded =
            data.iter().filter(|&&v| !v.is_nan() && twice(v) != round_to(dtype, v)).count();
        assert!(double_rounded >= 50, "{dtype}: only {double_rounded} values round twice wrongly");
        let x = Tensor::from_vec(data.clone(), [data.len()]);
        let fused = x.to_dtype(dtype).to_vec::<f64>();
        let reference =
            kiln::with_execution(kiln::Execution::Reference, || x.to_dtype(dtype).to_vec::<f64>());
        for (i, &v) in data.iter().enumerate() {
            let want = round_to(dtype, v);
            for (what, got) in [("fused", fused[i]), ("reference", reference[i])] {
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "{what} {v:e} as {dtype}: {got:e}, want {want:e}"
                );
            }
        }
    }
    // A 16-bit sum accumulates in f64 and rounds once.
    let x = Tensor::from_vec(vec![1.0, 2f64.powi(-11), 2f64.powi(-24)], [3]).to_dtype(DType::F16);
    assert_eq!(x.sum().item::<f64>(), 1.0 + 2f64.powi(-10));
}
