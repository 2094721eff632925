//! Row groups: kernels that work on the same rows run tile by tile on the CPU (softmax,
//! log-softmax, layer norm, cross-entropy and their gradients over a million elements or
//! more), and as one kernel with a block per row on a GPU (at every size). Checked against
//! plain loops, against one kernel per op (which never groups) and against the reference
//! executor.

use kiln::debug::{RowGroupSizes, with_row_group_sizes};
use kiln::nn::functional as F;
use kiln::prelude::*;

use crate::common::*;

/// 1,031 rows of 1,021: above the size at which groups form, and a row count that leaves a
/// partial last tile.
const SHAPE: [usize; 2] = [1031, 1021];

/// How many kernels ran in a row group: tile by tile on the CPU, in one launch on a GPU.
fn grouped(profile: &kiln::Profile) -> usize {
    let cuts = ["row tile by row tile", "one launch with its row group"];
    profile.events().iter().filter(|e| cuts.iter().any(|c| e.cut.contains(c))).count()
}

device_test!(row_groups_match_the_reference, super::row_groups_match_the_reference_on);

/// Softmax, log-softmax, cross-entropy, layer norm and their gradients, grouped (from the
/// smallest size on the CPU), on every layout and in f32, f64 and bf16, against the reference
/// executor; with masked rows, large logits and odd row lengths (one below and one above a
/// block's threads).
fn row_groups_match_the_reference_on(device: Device) {
    let tiny = RowGroupSizes { min_positions: 1, tile_positions: 1 };
    let mut rng = Rng::new(45);
    // Rows of a multiple of 4 (16-byte loads on a GPU, where aligned), of an odd length,
    // longer than a block's threads, and long enough (64 KB of f32, too short to be split
    // across blocks) that a GPU block keeps rows in registers, each thread eight 16-byte
    // pieces, the last thread's last one empty.
    for (rows, cols) in [(37usize, 64usize), (29, 61), (130, 516), (3, 16380)] {
        let n = rows * cols;
        let mut data = values(&mut rng, n, DType::F64);
        data[3..cols].iter_mut().step_by(4).for_each(|v| *v = f64::NEG_INFINITY);
        data[cols + 1] = 80.0;
        let targets: Vec<i64> = (0..rows).map(|_| rng.int(0, cols as i64)).collect();
        let w: Vec<f64> = values(&mut rng, cols, DType::F64);
        // Every dtype and layout at the first size; the emulated device compiles every
        // kernel, so the others in f32, the largest contiguous only.
        for dtype in [DType::F32, DType::F64, DType::BF16] {
            for layout in LAYOUTS {
                let sampled = cols == 64
                    || dtype == DType::F32
                        && (rows < 100 || layout == Layout::Contiguous)
                        && (cols < 4096 || layout != Layout::Permuted);
                if !sampled {
                    continue;
                }
                let run = |execution: kiln::Execution, on: Device| {
                    with_row_group_sizes(tiny, || {
                        kiln::with_execution(execution, || {
                            let x = make_on(&data, &[rows, cols], dtype, layout, on)
                                .requires_grad_(true);
                            let w = tensor(&w, &[cols], DType::F64).to(on).to_dtype(dtype);
                            let t = Tensor::from_vec(targets.clone(), [rows]).to(on);
                            let masked = x.softmax(-1) * &w + x.log_softmax(-1).exp();
                            let finite = Tensor::where_(&x.gt(-1e30), &x, 0.0);
                            let normed = F::layer_norm(&finite, &[cols], None, None, 1e-5);
                            let loss = F::cross_entropy(&finite, &t)
                                + (&normed * &w).sum() * 1e-2
                                + masked.sum() * 1e-3;
                            let (_, profile) = kiln::profile(|| loss.backward());
                            let grad = x.grad().expect("a gradient");
                            let outs = [loss.to_dtype(DType::F64), masked, normed, grad];
                            let outs = outs.map(|t| t.to(Device::Cpu).to_vec::<f64>());
                            (outs, grouped(&profile))
                        })
                    })
                };
                let (got, groups) = run(kiln::Execution::Fused, device);
                let (want, _) = run(kiln::Execution::Reference, Device::Cpu);
                let at = format!("{device} {rows}x{cols} {dtype:?} {layout:?}");
                // The CPU groups at least two rows per thread (tiles are its parallelism).
                let cpu_groups = rows >= 2 * rayon::current_num_threads();
                if device != Device::Cpu || cpu_groups {
                    assert!(groups >= 2, "{at}: the backward ran no row group");
                }
                let tol = match dtype {
                    DType::F64 => 1e-10,
                    DType::F32 => 2e-5,
                    _ => 3e-2,
                };
                for (name, (g, w)) in
                    ["loss", "softmax", "layer norm", "gradient"].iter().zip(got.iter().zip(&want))
                {
                    assert_close_tol(g, w, tol, &format!("{at} {name}"));
                }
            }
        }
    }
}

fn softmax_rows(data: &[f64], cols: usize, log: bool) -> Vec<f64> {
    data.chunks(cols)
        .flat_map(|row| {
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
            row.iter()
                .map(move |v| if log { v - max - sum.ln() } else { (v - max).exp() / sum })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn softmax_in_row_groups_matches_a_loop_on_every_layout() {
    let mut rng = Rng::new(41);
    let n: usize = SHAPE.iter().product();
    for dtype in [DType::F32, DType::F64] {
        let data = values(&mut rng, n, dtype);
        for layout in LAYOUTS {
            let x = make(&data, &SHAPE, dtype, layout);
            for log in [false, true] {
                let (y, profile) = kiln::profile(|| {
                    let y = if log { x.log_softmax(-1) } else { x.softmax(-1) };
                    y.realize();
                    y
                });
                let at = format!("{dtype:?} {layout:?} log={log}");
                assert!(grouped(&profile) >= 2, "{at}: no row group ran\n{profile}");
                let tol = if dtype == DType::F32 { 1e-5 } else { 1e-12 };
                assert_close_tol(&read(&y, dtype), &softmax_rows(&data, SHAPE[1], log), tol, &at);
            }
        }
    }
}

#[test]
fn a_row_group_keeps_what_only_it_reads_out_of_memory() {
    let x = Tensor::randn(SHAPE);
    x.realize();
    let (_, profile) = kiln::profile(|| {
        x.softmax(-1).realize();
    });
    // Live at the peak: the input and the result. Unfused, exp(x - max) would be a third
    // tensor of the input's size; in a group it lives in a per-tile scratch buffer.
    let bytes = (SHAPE.iter().product::<usize>() * 4) as u64;
    let peak = profile.peak_memory().peak_bytes;
    if std::env::var("KILN_CHECK").is_ok_and(|v| !v.is_empty() && v != "0") {
        // The oracle needs every kernel's whole output, so checked runs keep them.
        assert!(peak >= 3 * bytes, "KILN_CHECK keeps the group's buffers whole: {peak}");
        return;
    }
    assert!(peak < bytes * 5 / 2, "peak {peak} bytes for a {bytes}-byte result\n{profile}");
}

#[test]
fn layer_norm_and_its_gradients_in_row_groups_match_one_kernel_per_op() {
    let mut rng = Rng::new(42);
    let shape = [3, 347, 1013];
    let n: usize = shape.iter().product();
    let data = values(&mut rng, n, DType::F64);
    let w_data = values(&mut rng, shape[2], DType::F64);
    let b_data = values(&mut rng, shape[2], DType::F64);
    let g_data = values(&mut rng, n, DType::F64);
    for layout in LAYOUTS {
        let run = |mode: kiln::Execution| {
            kiln::with_execution(mode, || {
                let x = make(&data, &shape, DType::F64, layout).requires_grad_(true);
                let w = tensor(&w_data, &shape[2..], DType::F64).requires_grad_(true);
                let b = tensor(&b_data, &shape[2..], DType::F64).requires_grad_(true);
                let g = tensor(&g_data, &shape, DType::F64);
                let y = F::layer_norm(&x, &shape[2..], Some(&w), Some(&b), 1e-5);
                let (_, profile) = kiln::profile(|| (&y * &g).sum().backward());
                let grads = [&x, &w, &b].map(|t| t.grad().expect("a gradient").to_vec::<f64>());
                (y.to_vec::<f64>(), grads, grouped(&profile))
            })
        };
        let (y, grads, groups) = run(kiln::Execution::Fused);
        let (want_y, want_grads, none) = run(kiln::Execution::Unfused);
        assert!(groups >= 2, "{layout:?}: the backward ran no row group");
        assert_eq!(none, 0, "one kernel per op never groups");
        assert_close_tol(&y, &want_y, 1e-10, &format!("{layout:?} forward"));
        for (i, (got, want)) in grads.iter().zip(&want_grads).enumerate() {
            assert_close_tol(got, want, 1e-9, &format!("{layout:?} gradient {i}"));
        }
        // The forward against a loop.
        let d = shape[2];
        let want: Vec<f64> = data
            .chunks(d)
            .flat_map(|row| {
                let mean = row.iter().sum::<f64>() / d as f64;
                let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / d as f64;
                let scale = 1.0 / (var + 1e-5).sqrt();
                row.iter()
                    .enumerate()
                    .map(|(j, v)| (v - mean) * scale * w_data[j] + b_data[j])
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_close_tol(&y, &want, 1e-10, &format!("{layout:?} forward vs loop"));
    }
}

#[test]
fn cross_entropy_and_its_gradient_in_row_groups_match_one_kernel_per_op() {
    let mut rng = Rng::new(43);
    let n: usize = SHAPE.iter().product();
    let data = values(&mut rng, n, DType::F32);
    let targets: Vec<i64> = (0..SHAPE[0]).map(|_| rng.int(0, SHAPE[1] as i64)).collect();
    let run = |mode: kiln::Execution| {
        kiln::with_execution(mode, || {
            let x = tensor(&data, &SHAPE, DType::F32).requires_grad_(true);
            let t = Tensor::from_vec(targets.clone(), [SHAPE[0]]);
            let loss = F::cross_entropy(&x, &t);
            loss.backward();
            (loss.item::<f32>(), x.grad().expect("a gradient").to_vec::<f32>())
        })
    };
    let ((loss, grad), (want_loss, want_grad)) =
        (run(kiln::Execution::Fused), run(kiln::Execution::Unfused));
    assert!((loss - want_loss).abs() <= 1e-5 * want_loss.abs(), "{loss} vs {want_loss}");
    let (grad, want_grad): (Vec<f64>, Vec<f64>) = (
        grad.iter().map(|&v| f64::from(v)).collect(),
        want_grad.iter().map(|&v| f64::from(v)).collect(),
    );
    assert_close_tol(&grad, &want_grad, 1e-5, "cross-entropy gradient");
}

#[test]
fn reads_across_rows_keep_kernels_apart() {
    // Programs whose later kernels read other rows of what earlier kernels wrote: a shift
    // along the rows, a transpose, a column statistic broadcast back to every row. Grouped
    // from the smallest size, one row per tile, they must still equal the reference.
    let tiny = RowGroupSizes { min_positions: 1, tile_positions: 1 };
    let mut rng = Rng::new(44);
    let (r, c) = (13, 11);
    let data = values(&mut rng, r * c, DType::F64);
    type Program = fn(&Tensor) -> Tensor;
    let programs: [(&str, Program); 5] = [
        ("shifted rows", |x| {
            let s = x.softmax(-1);
            let n = s.dims()[0];
            (s.narrow(0, 1, n - 1) * 2.0 + x.narrow(0, 0, n - 1)).log_softmax(-1)
        }),
        ("transposed", |x| x.softmax(-1).t().softmax(-1)),
        ("column mean", |x| {
            let s = x.softmax(-1);
            (&s - &s.mean_dim(0, true)).softmax(-1)
        }),
        ("row and column", |x| {
            let centred = x - &x.mean_dim(1, true);
            &centred / &centred.square().sum_dim(0, true).sqrt()
        }),
        ("flipped rows", |x| {
            let s = x.exp().sum_dim(1, true);
            x / &s.flip(&[0])
        }),
    ];
    for layout in LAYOUTS {
        let x = make(&data, &[r, c], DType::F64, layout);
        for (name, f) in &programs {
            let want = kiln::with_execution(kiln::Execution::Reference, || f(&x).to_vec::<f64>());
            let got = with_row_group_sizes(tiny, || f(&x).to_vec::<f64>());
            assert_close_tol(&got, &want, 1e-12, &format!("{name} {layout:?}"));
        }
    }
}

/// Elementwise kernels kept apart by fusion (a GELU's gate, read by its product and kept for
/// the backward; the product, read by a matrix product) run whole: a group gains only by
/// keeping a row in cache from a reduction to its use.
#[test]
fn elementwise_chains_without_a_reduction_do_not_group() {
    let x = Tensor::randn(SHAPE);
    let w = Tensor::randn([SHAPE[1], 3]);
    Tensor::try_realize_all(&[&x, &w]).unwrap();
    let ((gate, y), profile) = kiln::profile(|| {
        let gate = ((&x * &x * &x * 0.044715 + &x) * 1.6).sigmoid();
        let y = (&x * &gate).matmul(&w);
        // A transposed read keeps the gate a kernel of its own.
        let t = gate.t().contiguous();
        Tensor::try_realize_all(&[&y, &t]).unwrap();
        (gate, y)
    });
    assert!(
        profile.kernels().iter().filter(|k| k.name.starts_with("k_")).count() >= 2,
        "{profile}"
    );
    assert_eq!(grouped(&profile), 0, "{profile}");
    let (xs, ws, gs, ys) =
        (x.to_vec::<f32>(), w.to_vec::<f32>(), gate.to_vec::<f32>(), y.to_vec::<f32>());
    let cols = SHAPE[1];
    for r in (0..SHAPE[0]).step_by(97) {
        let row = &xs[r * cols..(r + 1) * cols];
        let g: Vec<f64> = row
            .iter()
            .map(|&v| {
                let v = f64::from(v);
                1.0 / (1.0 + (-(v * v * v * 0.044715 + v) * 1.6).exp())
            })
            .collect();
        for (c, &want) in g.iter().enumerate() {
            assert!((f64::from(gs[r * cols + c]) - want).abs() < 1e-6, "gate {r},{c}");
        }
        for j in 0..3 {
            let want: f64 =
                (0..cols).map(|c| f64::from(row[c]) * g[c] * f64::from(ws[c * 3 + j])).sum();
            assert!(
                (f64::from(ys[r * 3 + j]) - want).abs() < 1e-3 * (1.0 + want.abs()),
                "y {r},{j}"
            );
        }
    }
}

/// Rows long enough for the exponentials' row call (64 and more), with the values a
/// softmax meets in practice: masked positions (`-inf`), large logits, a NaN, a row with
/// nothing visible; against the f64 loop (the NaN and the empty row: NaN, as PyTorch).
#[test]
fn softmax_rows_with_masked_and_special_values_match_a_loop() {
    let mut rng = Rng::new(43);
    for cols in [64usize, 100, 257] {
        let rows = 5;
        let mut data = values(&mut rng, rows * cols, DType::F32);
        for j in (0..cols).step_by(3) {
            data[j] = f64::NEG_INFINITY; // row 0: every third position masked
        }
        data[cols] = 1000.0; // row 1: one large logit, and a second close to it
        data[cols + cols / 2] = 999.5;
        data[2 * cols + 7] = f64::NAN; // row 2
        data[3 * cols..4 * cols].fill(f64::NEG_INFINITY); // row 3: nothing visible
        let x = tensor(&data, &[rows, cols], DType::F32);
        let got = x.softmax(-1).to_vec::<f64>();
        let want = softmax_rows(&data, cols, false);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let (r, j) = (i / cols, i % cols);
            if r == 2 || r == 3 {
                assert!(g.is_nan(), "row {r} of {cols}: position {j} is {g}, not NaN");
            } else {
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs().max(1e-30) + 1e-7,
                    "[{r}, {j}] of {cols}: {g} vs {w}"
                );
            }
        }
    }
}

device_test!(a_softmax_is_one_launch_measured_against_its_device, super::one_launch_on);

/// A row softmax is one launch on a GPU (its three kernels in one row group) and one group
/// on the CPU at the group size; a profile measures bandwidth against the copies of the
/// device that ran it.
fn one_launch_on(device: Device) {
    let tiny = RowGroupSizes { min_positions: 1, tile_positions: 1 };
    let x = Tensor::randn([300, 257]).to(device);
    x.realize();
    let (_, profile) =
        with_row_group_sizes(tiny, || kiln::profile(|| x.softmax(-1).realize().clone()));
    let kernels = profile.kernels().len();
    assert!(kernels >= 3, "the maximum, the sum and the division at least\n{profile}");
    assert_eq!(grouped(&profile), kernels, "every kernel in the group\n{profile}");
    let text = profile.to_string();
    match device {
        Device::Cpu => assert!(text.contains("GB/s this machine copies at"), "{text}"),
        Device::Cuda(i) => {
            assert_eq!(profile.launches(), 1, "one launch, each member listed\n{profile}");
            assert!(text.contains(&format!("GB/s cuda:{i} copies at")), "{text}");
            assert!(kiln::copy_ceiling(device) > 0.0);
        }
    }
}
