//! Matrix products against a plain f64 triple loop, with PyTorch's rank and broadcasting
//! rules, on contiguous and transposed operands.

use std::io::Write;

use kiln::prelude::*;

use crate::common::*;

/// `a @ b` for row-major matrices.
fn mm_ref(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
        }
    }
    out
}

/// `a @ b` for `batch` row-major matrices each, one after another.
fn batched_mm_ref(a: &[f64], b: &[f64], batch: usize, m: usize, k: usize, n: usize) -> Vec<f64> {
    (0..batch)
        .flat_map(|p| {
            mm_ref(&a[p * m * k..(p + 1) * m * k], &b[p * k * n..(p + 1) * k * n], m, k, n)
        })
        .collect()
}

#[test]
fn matrices_of_odd_sizes_in_every_layout() {
    let mut rng = Rng::new(31);
    for (m, k, n) in [(1, 1, 1), (3, 5, 2), (17, 9, 13), (4, 0, 3), (2, 3, 0)] {
        for dtype in [DType::F32, DType::F64, DType::F16, DType::I64, DType::I32] {
            for (la, lb) in [
                (Layout::Contiguous, Layout::Contiguous),
                (Layout::Permuted, Layout::Sliced),
                (Layout::Sliced, Layout::Permuted),
            ] {
                let da = values(&mut rng, m * k, dtype);
                let db = values(&mut rng, k * n, dtype);
                let a = make(&da, &[m, k], dtype, la);
                let b = make(&db, &[k, n], dtype, lb);
                let want: Vec<f64> =
                    mm_ref(&da, &db, m, k, n).iter().map(|&v| round_to(dtype, v)).collect();
                let context = format!("mm {dtype} {m}x{k}x{n} {la:?} {lb:?}");
                let got = a.mm(&b);
                assert_eq!(got.dims(), &[m, n], "{context}");
                assert_close_tol(
                    &read(&got, dtype),
                    &want,
                    tolerance(dtype) * (k.max(1) as f64),
                    &context,
                );
                assert_close_tol(
                    &read(&a.matmul(&b), dtype),
                    &want,
                    tolerance(dtype) * (k.max(1) as f64),
                    &context,
                );
            }
        }
    }
}

#[test]
fn vectors_batches_and_broadcasting_follow_pytorch() {
    let mut rng = Rng::new(32);
    // (a shape, b shape, result shape)
    let cases: [(&[usize], &[usize], &[usize]); 10] = [
        (&[4], &[4], &[]),
        (&[4], &[4, 3], &[3]),
        (&[2, 4], &[4], &[2]),
        (&[5, 2, 4], &[4], &[5, 2]),
        (&[4], &[5, 4, 3], &[5, 3]),
        (&[5, 2, 4], &[4, 3], &[5, 2, 3]),
        (&[2, 1, 2, 4], &[3, 4, 3], &[2, 3, 2, 3]),
        (&[1, 2, 4], &[6, 4, 3], &[6, 2, 3]),
        (&[3, 2, 5, 4], &[4, 3], &[3, 2, 5, 3]),
        (&[3, 2, 5, 4], &[4], &[3, 2, 5]),
    ];
    for (sa, sb, so) in cases {
        let da = values(&mut rng, sa.iter().product(), DType::F64);
        let db = values(&mut rng, sb.iter().product(), DType::F64);
        let got = make(&da, sa, DType::F64, Layout::Permuted).matmul(&make(
            &db,
            sb,
            DType::F64,
            Layout::Sliced,
        ));
        assert_eq!(got.dims(), so, "matmul {sa:?} {sb:?}");
        // Reference: promote vectors, broadcast batch dims, multiply each pair of matrices.
        let a_m: Vec<usize> = if sa.len() == 1 { vec![1, sa[0]] } else { sa.to_vec() };
        let b_m: Vec<usize> = if sb.len() == 1 { vec![sb[0], 1] } else { sb.to_vec() };
        let (m, k, n) = (a_m[a_m.len() - 2], a_m[a_m.len() - 1], b_m[b_m.len() - 1]);
        let ba = &a_m[..a_m.len() - 2];
        let bb = &b_m[..b_m.len() - 2];
        let batch = broadcast_shape(ba, bb).unwrap();
        let mut want = Vec::new();
        for p in 0..batch.iter().product::<usize>() {
            let idx = unravel(p, &batch);
            let pa = if ba.is_empty() { 0 } else { broadcast_index(&idx, ba) };
            let pb = if bb.is_empty() { 0 } else { broadcast_index(&idx, bb) };
            want.extend(mm_ref(
                &da[pa * m * k..(pa + 1) * m * k],
                &db[pb * k * n..(pb + 1) * k * n],
                m,
                k,
                n,
            ));
        }
        assert_close(&read(&got, DType::F64), &want, DType::F64, &format!("matmul {sa:?} {sb:?}"));
    }
}

#[test]
fn bmm_and_dot() {
    let mut rng = Rng::new(33);
    let da = values(&mut rng, 2 * 3 * 4, DType::F32);
    let db = values(&mut rng, 2 * 4 * 5, DType::F32);
    let got = tensor(&da, &[2, 3, 4], DType::F32).bmm(&tensor(&db, &[2, 4, 5], DType::F32));
    let mut want = mm_ref(&da[..12], &db[..20], 3, 4, 5);
    want.extend(mm_ref(&da[12..], &db[20..], 3, 4, 5));
    let want: Vec<f64> = want.iter().map(|&v| round_to(DType::F32, v)).collect();
    assert_close_tol(&read(&got, DType::F32), &want, 1e-5, "bmm");
    let v = values(&mut rng, 9, DType::F64);
    let d = tensor(&v, &[9], DType::F64).dot(&tensor(&v, &[9], DType::F64));
    assert_eq!(d.ndim(), 0);
    assert_close(&[d.item::<f64>()], &[v.iter().map(|x| x * x).sum()], DType::F64, "dot");
}

/// `((x @ y)ᵀ @ z)ᵀ * 2`: the inner transposed product is an operand of the outer one, and both
/// are rewritten to `bᵀ aᵀ`; the outer must read the inner's new product, not its old one.
#[test]
fn nested_transposed_products() {
    let mut rng = Rng::new(35);
    let (m, k) = (3, 4);
    let dx = values(&mut rng, m * k, DType::F64);
    let dy = values(&mut rng, k * m, DType::F64);
    let dz = values(&mut rng, m * 2, DType::F64);
    let (x, y, z) = (
        tensor(&dx, &[m, k], DType::F64),
        tensor(&dy, &[k, m], DType::F64),
        tensor(&dz, &[m, 2], DType::F64),
    );
    // `* 2.0` records the outer transpose as a node of the graph (an output is read through
    // its view without one).
    let got = x.matmul(&y).t().matmul(&z).t() * 2.0;
    let xy = mm_ref(&dx, &dy, m, k, m);
    let xyt: Vec<f64> = (0..m * m).map(|i| xy[(i % m) * m + i / m]).collect();
    let p = mm_ref(&xyt, &dz, m, m, 2);
    let want: Vec<f64> = (0..2 * m).map(|i| 2.0 * p[(i % m) * 2 + i / m]).collect();
    assert_eq!(got.shape().dims(), &[2, m]);
    assert_close_tol(&read(&got, DType::F64), &want, 1e-12, "((x y)ᵀ z)ᵀ");
}

#[test]
fn transposed_and_broadcast_operands_go_to_gemm_as_strides() {
    let mut rng = Rng::new(34);
    let da = values(&mut rng, 12, DType::F32);
    let db = values(&mut rng, 5, DType::F32);
    let a = tensor(&da, &[4, 3], DType::F32); // used transposed: [3, 4]
    let b = tensor(&db, &[5], DType::F32); // a broadcast column block: [4, 5] with stride 0 rows
    a.realize();
    b.realize();
    let at = a.t();
    let bb = b.unsqueeze(0).expand(&[4, 5]);
    let p = at.matmul(&bb);
    let plan = kiln::debug::plan_summary(&[&p]);
    assert_eq!((plan.kernels, plan.other_ops), (0, 1), "no copy kernels: {:?}", plan.kernel_notes);
    let mut want = vec![0.0; 15];
    for i in 0..3 {
        for j in 0..5 {
            want[i * 5 + j] = (0..4).map(|l| da[l * 3 + i] * db[j]).sum::<f64>();
        }
    }
    assert_close_tol(&read(&p, DType::F32), &want, 1e-5, "strided gemm");
    // The same through the reference executor.
    let r = kiln::with_execution(kiln::Execution::Reference, || at.matmul(&bb).to_vec::<f64>());
    assert_close_tol(&r, &want, 1e-6, "reference");
}

#[test]
fn products_split_across_threads_match_the_loop() {
    // Sizes past the threshold at which products run on several threads (kiln's own split
    // below a size, gemm's above): bands of columns, bands of rows (also a left operand
    // stored column by column, `gᵀ x`, which splits into rows when the output is not far
    // wider than tall), parallel batches, with transposed operands, against the f64 loop.
    let mut rng = Rng::new(41);
    for (batch, m, k, n) in [
        (1, 70, 300, 90),
        (1, 300, 64, 37),
        (3, 40, 100, 70),
        (1, 128, 784, 256),
        (1, 99, 200, 301),
    ] {
        for (la, lb) in [
            (Layout::Contiguous, Layout::Contiguous),
            (Layout::Contiguous, Layout::Permuted),
            (Layout::Permuted, Layout::Contiguous),
            (Layout::Permuted, Layout::Permuted),
        ] {
            let dtype = DType::F32;
            let da = values(&mut rng, batch * m * k, dtype);
            let db = values(&mut rng, batch * k * n, dtype);
            let a = make(&da, &[batch, m, k], dtype, la);
            let b = make(&db, &[batch, k, n], dtype, lb);
            let got = read(&a.matmul(&b), dtype);
            let want = batched_mm_ref(&da, &db, batch, m, k, n);
            let context = format!("{batch}x{m}x{k}x{n} {la:?} {lb:?}");
            assert_close_tol(&got, &want, tolerance(dtype) * k as f64, &context);
        }
    }
}

/// Products whose right operand has its inner dimension contiguous (`x @ wᵀ`, a weight
/// gradient) and whose output is wider than tall run column-major into scratch and are
/// transposed into place: single products, batches, and bands of a split product (whose
/// blocks start inside a row), in every float dtype, against the f64 loop.
#[test]
fn reoriented_products_match_the_loop() {
    let mut rng = Rng::new(43);
    for (batch, m, k, n) in [(1, 3, 300, 7), (3, 20, 300, 50), (1, 40, 1000, 90), (2, 1, 257, 2)] {
        for dtype in [DType::F32, DType::F64, DType::F16] {
            let da = values(&mut rng, batch * m * k, dtype);
            let db = values(&mut rng, batch * k * n, dtype);
            let a = make(&da, &[batch, m, k], dtype, Layout::Contiguous);
            let b = make(&db, &[batch, k, n], dtype, Layout::Permuted);
            let got = read(&a.matmul(&b), dtype);
            let want: Vec<f64> = batched_mm_ref(&da, &db, batch, m, k, n)
                .into_iter()
                .map(|v| round_to(dtype, v))
                .collect();
            let context = format!("{dtype} {batch}x{m}x{k}x{n}");
            assert_close_tol(&got, &want, tolerance(dtype) * k as f64, &context);
        }
    }
}

/// Products whose operands both have the inner dimension contiguous (`x @ wᵀ` in every
/// linear layer, a convolution's weight gradient) copy the smaller operand to a layout
/// `gemm` runs fast: the left one (output wider than tall) or the right one, whole or per
/// band of a split product, from dense and sliced storage, against the f64 loop.
#[test]
fn products_with_both_operands_along_k_match_the_loop() {
    let mut rng = Rng::new(44);
    let shapes = [
        (1, 20, 300, 50),
        (2, 60, 260, 17),
        (1, 64, 1000, 300),
        (1, 300, 512, 40),
        (3, 16, 256, 16),
    ];
    for (batch, m, k, n) in shapes {
        for (dtype, la) in [
            (DType::F32, Layout::Contiguous),
            (DType::F64, Layout::Sliced),
            (DType::F32, Layout::Sliced),
        ] {
            let da = values(&mut rng, batch * m * k, dtype);
            let db = values(&mut rng, batch * k * n, dtype);
            // `b` stored as [batch, n, k] (each matrix transposed) and viewed as [batch, k, n].
            let mut db_t = vec![0.0; db.len()];
            for p in 0..batch {
                for kk in 0..k {
                    for j in 0..n {
                        db_t[p * k * n + j * k + kk] = db[p * k * n + kk * n + j];
                    }
                }
            }
            let a = make(&da, &[batch, m, k], dtype, la);
            let b = make(&db_t, &[batch, n, k], dtype, Layout::Contiguous).transpose(1, 2);
            let got = read(&a.matmul(&b), dtype);
            let want = batched_mm_ref(&da, &db, batch, m, k, n);
            let context = format!("{dtype} {la:?} {batch}x{m}x{k}x{n}");
            assert_close_tol(&got, &want, tolerance(dtype) * k as f64, &context);
        }
    }
}

/// A batch of matrices times one matrix is one product over all rows: the matrix is not
/// copied per batch entry, and its gradient is one product, not a sum of per-entry ones.
#[test]
fn a_batch_times_a_matrix_is_one_product() {
    let x = Tensor::randn([4, 6, 8]).requires_grad_(true);
    let w = Tensor::randn([5, 8]).requires_grad_(true);
    let y = x.matmul(&w.t());
    assert_eq!(y.dims(), &[4, 6, 5]);
    let dot = kiln::debug::graph_dot(&[&y]);
    assert_eq!(dot.matches("matmul").count(), 1, "{dot}");
    assert!(dot.contains("[24, 8]"), "the batch folds into 24 rows:\n{dot}");
    let ran = backward_ran(&(&y * &y).sum());
    assert_eq!(ran.iter().filter(|(name, _)| *name == "matmul").count(), 2, "{ran:?}");
    assert!(
        ran.iter().all(|(_, ops)| !ops.contains("sum")),
        "no sum over per-entry products: {ran:?}"
    );
}

/// bf16 products on each path this CPU has (its bf16 dot-product instructions where it has
/// them, f32 `gemm` over widened operands always): tile and panel edges, odd `k` (a sliced
/// operand's padding past each row must not leak in), every layout, batches, products split
/// across threads and blocked along rows. Against the f64 loop: exactly where every sum is an
/// integer (f32 holds them all, so only the final rounding to bf16 remains), and otherwise
/// within one bf16 rounding plus f32 accumulation (`k · 2⁻²³ · Σ|a·b|`). The profile names the
/// path.
#[test]
fn bf16_products_match_the_loop_on_every_path() {
    let mut rng = Rng::new(47);
    let shapes = [
        (1, 1, 1, 1),
        (1, 1, 3, 1),
        (1, 11, 7, 15),
        (1, 12, 2, 16),
        (1, 13, 5, 17),
        (2, 25, 33, 33),
        (1, 37, 128, 65),
        (3, 24, 257, 31),
        (1, 300, 64, 70),
        (1, 130, 2048, 40),
        (1, 64, 300, 512),
        // Rows of a decode step: dot products along `k` where the operands allow.
        (1, 1, 768, 70),
        (2, 3, 33, 40),
        (1, 2, 1025, 9),
    ];
    let layouts = [
        (Layout::Contiguous, Layout::Contiguous),
        (Layout::Permuted, Layout::Sliced),
        (Layout::Sliced, Layout::Permuted),
        (Layout::Permuted, Layout::Permuted),
    ];
    let dtype = DType::BF16;
    // The dot-product path runs on the instruction where the CPU has it, and everywhere (on
    // x86-64) with its portable tile in the instruction's place, so its packing, tiles and
    // masked stores are tested on every host; then the widening path.
    let mut paths = Vec::new();
    if kiln::debug::bf16_dot_products() {
        paths.push("matmul bf16-dot");
    }
    if cfg!(target_arch = "x86_64") {
        paths.push("matmul bf16-dot-portable");
    }
    paths.push("matmul bf16-widened-to-f32");
    // Which paths ran, past the harness's capture.
    let _ = writeln!(std::io::stderr(), "bf16 product paths tested here: {paths:?}");
    for path in paths {
        let dot = path != "matmul bf16-widened-to-f32";
        let was = kiln::debug::allow_bf16_dot_products(dot);
        let portable = kiln::debug::portable_bf16_dot_products(path.ends_with("portable"));
        let x = Tensor::ones([2, 3]).bfloat16();
        let (_, profile) = kiln::profile(|| {
            x.matmul(&x.t()).realize();
        });
        assert!(profile.events().iter().any(|e| e.ops == path), "{path}: {:?}", profile.events());
        for (batch, m, k, n) in shapes {
            for (la, lb) in layouts {
                let context = format!("dot {dot} {batch}x{m}x{k}x{n} {la:?} {lb:?}");
                let ints = |rng: &mut Rng, len| -> Vec<f64> {
                    (0..len).map(|_| rng.int(-4, 5) as f64).collect()
                };
                let (ia, ib) = (ints(&mut rng, batch * m * k), ints(&mut rng, batch * k * n));
                let product = |a: &[f64], b: &[f64]| {
                    let x = make(a, &[batch, m, k], dtype, la);
                    read(&x.matmul(&make(b, &[batch, k, n], dtype, lb)), dtype)
                };
                let want: Vec<f64> = batched_mm_ref(&ia, &ib, batch, m, k, n)
                    .into_iter()
                    .map(|v| round_to(dtype, v))
                    .collect();
                assert_close_tol(&product(&ia, &ib), &want, 0.0, &format!("integers {context}"));
                let (da, db) = (
                    values(&mut rng, batch * m * k, dtype),
                    values(&mut rng, batch * k * n, dtype),
                );
                let got = product(&da, &db);
                let want = batched_mm_ref(&da, &db, batch, m, k, n);
                let abs = |v: &[f64]| v.iter().map(|x| x.abs()).collect::<Vec<_>>();
                let magnitude = batched_mm_ref(&abs(&da), &abs(&db), batch, m, k, n);
                for (i, ((g, w), s)) in got.iter().zip(&want).zip(&magnitude).enumerate() {
                    let bound = w.abs() * 2f64.powi(-8) + s * k as f64 * 2f64.powi(-23);
                    assert!((g - w).abs() <= bound, "{context}: element {i}: {g} vs {w}");
                }
            }
        }
        // A right operand whose packing is larger than a thread keeps between products.
        let (m, k, n) = (3, 2048, 2100);
        let mut ints = |len| -> Vec<f64> { (0..len).map(|_| rng.int(-4, 5) as f64).collect() };
        let (ia, ib) = (ints(m * k), ints(k * n));
        let got = read(&tensor(&ia, &[m, k], dtype).matmul(&tensor(&ib, &[k, n], dtype)), dtype);
        let want: Vec<f64> =
            mm_ref(&ia, &ib, m, k, n).into_iter().map(|v| round_to(dtype, v)).collect();
        assert_close_tol(&got, &want, 0.0, &format!("dot {dot} {m}x{k}x{n}"));
        // A subnormal operand: the dot-product instruction reads it as zero (as documented),
        // the widening path multiplies it exactly.
        let tiny = 2f64.powi(-130);
        let a = tensor(&[tiny, 1.0], &[1, 2], dtype);
        let b = tensor(&[2.0, 0.0], &[2, 1], dtype);
        let got = read(&a.matmul(&b), dtype)[0];
        assert_eq!(got, if dot { 0.0 } else { 2.0 * tiny }, "subnormal operand, dot {dot}");
        kiln::debug::allow_bf16_dot_products(was);
        kiln::debug::portable_bf16_dot_products(portable);
    }
    // Where the CPU has the instruction, the portable tile gives its bits.
    if kiln::debug::bf16_dot_products() {
        let (m, k, n) = (29, 301, 45);
        let a = tensor(&values(&mut rng, m * k, dtype), &[m, k], dtype);
        let b = tensor(&values(&mut rng, k * n, dtype), &[k, n], dtype);
        let hardware = read(&a.matmul(&b), dtype);
        let was = kiln::debug::portable_bf16_dot_products(true);
        let portable = read(&a.matmul(&b), dtype);
        kiln::debug::portable_bf16_dot_products(was);
        assert_eq!(hardware, portable, "the portable tile against the instruction");
        // A row against columns along `k` (`x @ wᵀ`): the dot products' lanes too.
        for (m, k, n) in [(1, 301, 45), (3, 64, 7), (2, 1000, 33)] {
            let a = tensor(&values(&mut rng, m * k, dtype), &[m, k], dtype);
            let w = tensor(&values(&mut rng, n * k, dtype), &[n, k], dtype);
            let hardware = read(&a.matmul(&w.t()), dtype);
            let was = kiln::debug::portable_bf16_dot_products(true);
            let portable = read(&a.matmul(&w.t()), dtype);
            kiln::debug::portable_bf16_dot_products(was);
            assert_eq!(
                hardware, portable,
                "the portable dot products against the instruction, {m}x{k}x{n}"
            );
        }
    }
}

device_test!(products_match_the_loop, super::products_match_the_loop_on);

/// Batched products on `device` in every float dtype and layout, a transposed operand and a
/// batch broadcast, against plain f64 loops.
fn products_match_the_loop_on(device: Device) {
    let mut rng = Rng::new(11);
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for &(batch, m, k, n) in
            &[(1, 1, 1, 1), (1, 3, 17, 5), (2, 33, 7, 65), (3, 64, 128, 32), (1, 129, 1, 3)]
        {
            let a = values(&mut rng, batch * m * k, dtype);
            let b = values(&mut rng, batch * k * n, dtype);
            let want = batched_mm_ref(&a, &b, batch, m, k, n);
            for layout in LAYOUTS {
                let ta = make_on(&a, &[batch, m, k], dtype, layout, device);
                let tb = make_on(&b, &[batch, k, n], dtype, layout, device);
                let got = ta.matmul(&tb);
                assert_eq!(got.device(), device);
                let tol = 4.0 * tolerance(dtype) * (k as f64).sqrt();
                assert_close_tol(&got.to_vec::<f64>(), &want, tol, &format!("{dtype} {layout:?}"));
            }
            // A transposed operand (`x @ w.t()`), and a batch broadcast against one matrix.
            let wt =
                make_on(&b[..k * n], &[k, n], dtype, Layout::Contiguous, device).t().contiguous();
            let x = make_on(&a, &[batch, m, k], dtype, Layout::Contiguous, device);
            let got = x.matmul(&wt.t());
            let b1: Vec<f64> = (0..batch).flat_map(|_| b[..k * n].iter().copied()).collect();
            let want = batched_mm_ref(&a, &b1, batch, m, k, n);
            let tol = 4.0 * tolerance(dtype) * (k as f64).sqrt();
            assert_close_tol(&got.to_vec::<f64>(), &want, tol, &format!("{dtype} broadcast"));
        }
    }
}
