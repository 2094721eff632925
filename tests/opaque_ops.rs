//! Opaque user ops (`kiln::ops::Opaque`): a CPU implementation over strided views, split
//! across threads, against f64 loops on views of every kind; gradients to second order; a
//! compiled training step on the CPU and the emulated device, against the same model written
//! with built-in ops; `KILN_CHECK` catching implementations that break their contract; the
//! errors of misuse; autocast policies.

use std::sync::atomic::{AtomicUsize, Ordering};

use kiln::autograd::gradcheck;
use kiln::nn::{Linear, Module, Parameters, functional as F};
use kiln::ops::{AutocastPolicy, CpuInput, CpuOutput, Opaque, Split};
use kiln::optim::{Optimizer, Sgd, SgdConfig};
use kiln::prelude::*;
use kiln::{Element, Execution, Scalar};

use crate::common::*;

/// Each output element `f` of the inputs' elements at the same row-major position.
fn map_each<T: Element>(
    inputs: &[CpuInput<'_>],
    out: &mut CpuOutput<'_>,
    f: impl Fn(&[f64]) -> f64,
) -> Result<(), String> {
    let data: Vec<&[T]> = inputs.iter().map(|x| x.data::<T>()).collect::<Result<_, _>>()?;
    let start = out.start();
    for (i, v) in out.values::<T>()?.iter_mut().enumerate() {
        let args: Vec<f64> = inputs
            .iter()
            .zip(&data)
            .map(|(x, d)| d[x.position_of(start + i)].to_scalar().to_f64())
            .collect();
        *v = T::from_scalar(Scalar::F64(f(&args)));
    }
    Ok(())
}

/// `x / (1 + |x|)` of f32 elements on a GPU, kiln's launch convention.
const SOFTSIGN_CUDA: &str = r#"
extern "C" __global__ void my_softsign(float* out, const float* x, long long n, long long inner) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    float v = x[i];
    out[i] = v / (1.0f + fabsf(v));
  }
}
"#;

/// Softsign with CPU (f32 and f64) and CUDA (f32) implementations and a backward.
fn softsign(cuda: &str) -> Opaque {
    Opaque::builder("my_softsign", 1, |inputs, out| {
        let f = |a: &[f64]| a[0] / (1.0 + a[0].abs());
        match out.dtype() {
            DType::F32 => map_each::<f32>(inputs, out, f),
            DType::F64 => map_each::<f64>(inputs, out, f),
            d => Err(format!("my_softsign takes f32 or f64, got {d}")),
        }
    })
    .cuda(cuda, "my_softsign")
    .backward(|saved, grad| {
        let x = &saved.inputs()[0];
        Ok(vec![Some(grad / (x.abs() + 1.0).square())])
    })
    .build()
}

/// The running product along each row, split by rows, its gradient from the saved output.
fn row_cumprod() -> Opaque {
    fn rows<T: Element>(inputs: &[CpuInput<'_>], out: &mut CpuOutput<'_>) -> Result<(), String> {
        let x = &inputs[0];
        let data = x.data::<T>()?;
        let cols = x.shape()[1];
        let first_row = out.start() / cols;
        for (r, row) in out.values::<T>()?.chunks_mut(cols).enumerate() {
            let mut acc = 1.0;
            for (c, v) in row.iter_mut().enumerate() {
                acc *= data[x.position(&[first_row + r, c])].to_scalar().to_f64();
                *v = T::from_scalar(Scalar::F64(acc));
            }
        }
        Ok(())
    }
    Opaque::builder("row_cumprod", 1, |inputs, out| match out.dtype() {
        DType::F32 => rows::<f32>(inputs, out),
        DType::F64 => rows::<f64>(inputs, out),
        d => Err(format!("row_cumprod takes f32 or f64, got {d}")),
    })
    .split(Split::Rows)
    .shape(|inputs| match inputs[0].0.dims() {
        [_, _] => Ok(inputs[0].clone()),
        _ => Err(format!("takes a matrix, got shape {}", inputs[0].0)),
    })
    .backward(|saved, grad| {
        let (x, y) = (&saved.inputs()[0], saved.output());
        let suffix = (grad * y).flip(&[1]).cumsum(1).flip(&[1]);
        Ok(vec![Some(suffix / x)])
    })
    .build()
}

/// `sqrt(a² + b²)` of two inputs of one shape, with a backward.
fn hypot() -> Opaque {
    Opaque::builder("my_hypot", 2, |inputs, out| match out.dtype() {
        DType::F64 => map_each::<f64>(inputs, out, |a| a[0].hypot(a[1])),
        DType::F32 => map_each::<f32>(inputs, out, |a| a[0].hypot(a[1])),
        d => Err(format!("{d} is not supported")),
    })
    .shape(|inputs| {
        let ((a, da), (b, db)) = (&inputs[0], &inputs[1]);
        if a != b || da != db {
            return Err(format!("inputs must match: got {a} {da} and {b} {db}"));
        }
        Ok((a.clone(), *da))
    })
    .backward(|saved, grad| {
        let (a, b, h) = (&saved.inputs()[0], &saved.inputs()[1], saved.output());
        Ok(vec![Some(grad * a / h), Some(grad * b / h)])
    })
    .build()
}

fn cumprod_reference(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut out = x.to_vec();
    for r in 0..rows {
        for c in 1..cols {
            out[r * cols + c] *= out[r * cols + c - 1];
        }
    }
    out
}

#[test]
fn an_opaque_op_reads_views_of_every_kind_and_matches_an_f64_loop() {
    let mut rng = Rng::new(41);
    // 301 × 67 = 20167 elements: more than one chunk, split at row boundaries.
    let (rows, cols) = (301, 67);
    let xs: Vec<f64> = (0..rows * cols).map(|_| rng.uniform(0.9, 1.1)).collect();
    let want = cumprod_reference(&xs, rows, cols);
    let op = row_cumprod();
    let dense = tensor(&xs, &[rows, cols], DType::F64);
    let transposed = tensor(&xs, &[rows, cols], DType::F64).t().copy().t();
    assert!(!transposed.is_contiguous());
    let wide = Tensor::cat(
        &[&tensor(&xs, &[rows, cols], DType::F64), &Tensor::ones([rows, 5]).double()],
        1,
    );
    let narrowed = wide.narrow(1, 0, cols);
    let flipped_back = dense.flip(&[1]).copy().flip(&[1]);
    for (name, x) in [
        ("dense", &dense),
        ("transposed", &transposed),
        ("narrowed", &narrowed),
        ("flipped", &flipped_back),
    ] {
        let got = op.call(&[x]).to_vec::<f64>();
        assert_close_tol(&got, &want, 1e-13, name);
    }
    // A broadcast row (stride 0) and the reference executor.
    let row = tensor(&xs[..cols], &[1, cols], DType::F64).expand(&[rows as i64, cols as i64]);
    let got = op.call(&[&row]).to_vec::<f64>();
    assert_close_tol(&got[cols * 200..cols * 201], &want[..cols], 1e-13, "broadcast");
    let reference = kiln::with_execution(Execution::Reference, || op.call(&[&dense]).to_vec());
    assert_close_tol(&reference, &want, 1e-13, "reference executor");
    // Two inputs, elementwise, in f32 with one transposed: split anywhere.
    let (a, b) = (values(&mut rng, 150 * 131, DType::F32), values(&mut rng, 150 * 131, DType::F32));
    let ta = tensor(&a, &[150, 131], DType::F32);
    let tb = tensor(&b, &[131, 150], DType::F32).t();
    let got = hypot().call(&[&ta, &tb]).to_vec::<f64>();
    let want: Vec<f64> = (0..150 * 131)
        .map(|i| {
            let (r, c) = (i / 131, i % 131);
            f64::from((a[i] as f32).hypot(b[c * 150 + r] as f32))
        })
        .collect();
    assert_close_tol(&got, &want, 1e-7, "hypot of a transposed input");
}

#[test]
fn an_opaque_op_passes_gradcheck_to_second_order() {
    let mut rng = Rng::new(42);
    let xs: Vec<f64> = (0..4 * 5).map(|_| rng.uniform(0.5, 2.0)).collect();
    let x = tensor(&xs, &[4, 5], DType::F64);
    let op = row_cumprod();
    gradcheck(|t| op.call(&[&t[0]]), std::slice::from_ref(&x), 1e-6, 1e-6).unwrap();
    // The second derivative goes through the saved output's history.
    let first = |t: &[Tensor]| {
        let x = t[0].clone();
        let y = op.call(&[&x]);
        kiln::grad(&[&(&y * &y).sum()], &[&x], true).remove(0)
    };
    gradcheck(first, std::slice::from_ref(&x), 1e-6, 1e-5).unwrap();
    let (a, b) = (
        tensor(&values(&mut rng, 6, DType::F64), &[2, 3], DType::F64),
        tensor(&values(&mut rng, 6, DType::F64), &[2, 3], DType::F64),
    );
    let h = hypot();
    gradcheck(|t| h.call(&[&t[0], &t[1]]), &[a.clone(), b.clone()], 1e-6, 1e-6).unwrap();
    let first = |t: &[Tensor]| {
        let (a, b) = (t[0].clone(), t[1].clone());
        kiln::grad(&[&h.call(&[&a, &b]).square().sum()], &[&a], true).remove(0)
    };
    gradcheck(first, &[a, b], 1e-6, 1e-5).unwrap();
}

/// Losses of eight compiled SGD steps of `linear → act → linear`, and the compile stats.
fn train(
    device: Device,
    act: &dyn Fn(&Tensor) -> Tensor,
) -> (Vec<f64>, kiln::compile::CompileStats) {
    kiln::manual_seed(5);
    let (mut l1, mut l2) = (Linear::new(12, 24), Linear::new(24, 3));
    l1.to(device).expect("moved");
    l2.to(device).expect("moved");
    let x = Tensor::randn([32, 12]).to(device);
    let target = Tensor::randint(0, 3, [32]).to(device);
    let params: Vec<Tensor> = l1.parameters().into_iter().chain(l2.parameters()).collect();
    let mut opt = Sgd::new(params, SgdConfig { lr: 0.2, ..Default::default() });
    let mut step = kiln::compile(|()| {
        opt.zero_grad();
        let loss = F::cross_entropy(&l2.forward(&act(&l1.forward(&x))), &target);
        loss.backward();
        opt.step();
        loss
    });
    let losses = (0..8).map(|_| f64::from(step.call(()).item::<f32>())).collect();
    (losses, step.stats().clone())
}

fn trains_in_a_compiled_step(device: Device) {
    let op = softsign(SOFTSIGN_CUDA);
    let (mine, stats) = train(device, &|h: &Tensor| op.call(&[h]));
    let (builtin, _) = train(device, &|h: &Tensor| h / (h.abs() + 1.0));
    assert_close_tol(&mine, &builtin, 1e-5, "losses: the opaque op against built-in ops");
    assert!(mine[7] < mine[0], "it trains: {mine:?}");
    assert_eq!((stats.plans, stats.replays), (1, 7), "{stats:?}");
    if device != Device::Cpu {
        // The user's kernel is captured with the rest of the step into one CUDA graph.
        assert_eq!((stats.graph_launches, stats.stepwise.as_deref()), (7, None), "{stats:?}");
    }
    // A step of its own in profiles, by name, and checked by KILN_CHECK.
    let x = Tensor::randn([40, 7]).to(device);
    let (y, profile) = kiln::profile(|| op.call(&[&(&x * 2.0)]).exp().realize().clone());
    let names: Vec<String> = profile.kernels().iter().map(|k| k.name.clone()).collect();
    assert!(names.iter().any(|n| n == "my_softsign"), "{names:?}");
    let checked = kiln::with_check(|| op.call(&[&(&x * 2.0)]).exp().to_vec::<f64>());
    assert_close_tol(&checked, &y.to_vec::<f64>(), 1e-6, "checked run");
}
device_test!(an_opaque_op_trains_in_a_compiled_step, super::trains_in_a_compiled_step);

#[test]
fn kiln_check_catches_a_cpu_implementation_that_breaks_its_contract() {
    // Leaves the last element of each chunk as it found it.
    let lazy = Opaque::builder("lazy_copy", 1, |inputs, out| {
        let x = inputs[0].to_vec::<f32>();
        let start = out.start();
        let values = out.values::<f32>()?;
        let n = values.len();
        values[..n - 1].copy_from_slice(&x[start..start + n - 1]);
        Ok(())
    })
    .build();
    let x = Tensor::randn([3, 5]);
    // Unchecked, the element is zero; checked, the run fails naming it (so a run of the
    // whole suite under KILN_CHECK=1 sees the failure here too).
    let y = lazy.call(&[&x]);
    let plain = y.try_realize().map(|()| y.to_vec::<f32>()[14]);
    if std::env::var("KILN_CHECK").is_ok_and(|v| !v.is_empty() && v != "0") {
        assert!(plain.is_err());
    } else {
        assert_eq!(plain.ok(), Some(0.0));
    }
    let m =
        kiln::with_check(|| lazy.call(&[&x]).try_realize().map(|_| ()).unwrap_err()).to_string();
    assert!(m.contains("lazy_copy") && m.contains("did not write element [2, 4]"), "{m}");
    assert!(m.contains("opaque_ops.rs"), "names the caller's line: {m}");
    // An implementation's own error and panic, and a read in the wrong type.
    let failing = Opaque::builder("failing", 1, |_, _| Err("no luck today".into())).build();
    let m = failing.call(&[&x]).try_realize().map(|_| ()).unwrap_err().to_string();
    assert!(m.contains("failing") && m.contains("no luck today"), "{m}");
    let panicking = Opaque::builder("panicking", 1, |_, _| panic!("index out of reach")).build();
    let m = panicking.call(&[&x]).try_realize().map(|_| ()).unwrap_err().to_string();
    assert!(m.contains("panicked: index out of reach"), "{m}");
    let wrong_type = Opaque::builder("wrong_type", 1, |inputs, _| {
        inputs[0].data::<f64>()?;
        Ok(())
    })
    .build();
    let m = wrong_type.call(&[&x]).try_realize().map(|_| ()).unwrap_err().to_string();
    assert!(m.contains("input 0 holds f32 elements, read as f64"), "{m}");
}

#[test]
fn misuse_is_a_clear_error() {
    let x = Tensor::randn([3, 4]).requires_grad_(true);
    let m = hypot().try_call(&[&x]).unwrap_err().to_string();
    assert!(m.contains("my_hypot") && m.contains("takes 2 inputs, got 1"), "{m}");
    let m = hypot().try_call(&[&x, &Tensor::randn([4, 3])]).unwrap_err().to_string();
    assert!(m.contains("inputs must match: got [3, 4] f32 and [4, 3] f32"), "{m}");
    let m = row_cumprod().try_call(&[&Tensor::randn([3])]).unwrap_err().to_string();
    assert!(m.contains("takes a matrix, got shape [3]"), "{m}");
    // No backward: a gradient reaching the op is refused, naming it and the fix.
    let plain =
        Opaque::builder("no_grad_op", 1, |inputs, out| map_each::<f32>(inputs, out, |a| a[0]))
            .build();
    let m = plain.call(&[&x]).sum().try_backward().unwrap_err().to_string();
    assert!(
        m.contains("`no_grad_op` has no backward") && m.contains("OpaqueBuilder::backward"),
        "{m}"
    );
    // A backward that answers with the wrong shape or count.
    let identity =
        |inputs: &[CpuInput<'_>], out: &mut CpuOutput<'_>| map_each::<f32>(inputs, out, |a| a[0]);
    let wrong_shape = Opaque::builder("wrong_shape_grad", 1, identity)
        .backward(|_, grad| Ok(vec![Some(grad.sum())]))
        .build();
    let m = wrong_shape.call(&[&x]).sum().try_backward().unwrap_err().to_string();
    assert!(m.contains("gradient of shape [] for input 0 of shape [3, 4]"), "{m}");
    let wrong_count = Opaque::builder("wrong_count_grad", 1, identity)
        .backward(|_, grad| Ok(vec![Some(grad.clone()), None]))
        .build();
    let m = wrong_count.call(&[&x]).sum().try_backward().unwrap_err().to_string();
    assert!(m.contains("returned 2 gradients for 1 inputs"), "{m}");
}

#[test]
fn autocast_policies_cast_the_inputs() {
    let seen = std::sync::Arc::new(AtomicUsize::new(0));
    let op = |policy| {
        let seen = seen.clone();
        Opaque::builder("dtype_probe", 1, move |inputs, out| {
            seen.store(inputs[0].dtype() as usize, Ordering::Relaxed);
            match out.dtype() {
                DType::F32 => map_each::<f32>(inputs, out, |a| a[0]),
                DType::BF16 => map_each::<half::bf16>(inputs, out, |a| a[0]),
                d => Err(format!("{d}")),
            }
        })
        .autocast(policy)
        .build()
    };
    let x = Tensor::randn([4, 4]);
    let xb = x.to_dtype(DType::BF16);
    let seen_dtype = |t: &Tensor| {
        t.realize();
        seen.load(Ordering::Relaxed)
    };
    let widened = kiln::autocast(DType::BF16, || op(AutocastPolicy::Widen).call(&[&xb]));
    assert_eq!((widened.dtype(), seen_dtype(&widened)), (DType::F32, DType::F32 as usize));
    let lowered = kiln::autocast(DType::BF16, || op(AutocastPolicy::Lower).call(&[&x]));
    assert_eq!((lowered.dtype(), seen_dtype(&lowered)), (DType::BF16, DType::BF16 as usize));
    assert_eq!(lowered.to_vec::<f32>(), xb.to_vec::<f32>());
    let kept = kiln::autocast(DType::BF16, || op(AutocastPolicy::Keep).call(&[&xb]));
    assert_eq!((kept.dtype(), seen_dtype(&kept)), (DType::BF16, DType::BF16 as usize));
}

#[test]
fn on_cuda_an_implementation_is_checked_against_the_cpu_one() {
    let Some((gpu, _memory)) =
        gpu_or_skip("on_cuda_an_implementation_is_checked_against_the_cpu_one")
    else {
        return;
    };
    let x = Tensor::randn([33, 9]).to(gpu);
    // Right on the device, and in agreement under KILN_CHECK.
    let good = softsign(SOFTSIGN_CUDA);
    let want = softsign(SOFTSIGN_CUDA).call(&[&x.cpu()]).to_vec::<f64>();
    assert_close_tol(&good.call(&[&x]).to_vec::<f64>(), &want, 1e-6, "on the device");
    kiln::with_check(|| good.call(&[&x]).realize().clone());
    // A CUDA implementation that computes something else is caught.
    let wrong = softsign(&SOFTSIGN_CUDA.replace("1.0f + fabsf(v)", "2.0f + fabsf(v)"));
    let m =
        kiln::with_check(|| wrong.call(&[&x]).try_realize().map(|_| ()).unwrap_err()).to_string();
    assert!(m.contains("my_softsign") && m.contains("its CUDA implementation's element"), "{m}");
    // Source that does not compile, and an op with no CUDA implementation.
    let broken = softsign("this is not CUDA");
    let m = broken.call(&[&x]).try_realize().map(|_| ()).unwrap_err().to_string();
    assert!(m.contains("user-defined op `my_softsign`"), "{m}");
    let cpu_only =
        Opaque::builder("cpu_only", 1, |inputs, out| map_each::<f32>(inputs, out, |a| a[0]))
            .build();
    let m = cpu_only.try_call(&[&x]).unwrap_err().to_string();
    assert!(m.contains("cpu_only") && m.contains("no CUDA implementation"), "{m}");
}

/// Each row's sum, a warp per row: lanes stride over the row, `__shfl_xor_sync` adds them.
const ROW_SUM_CUDA: &str = r#"
extern "C" __global__ void row_sum(float* out, const float* x, long long n, long long inner) {
  long long cols = 0;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < 32 * n;
       i += (long long)gridDim.x * blockDim.x) {
    long long row = i >> 5;
    int lane = (int)(i & 31);
    float acc = 0.0f;
    for (long long c = lane; c < COLS; c += 32) acc += x[row * COLS + c];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) out[row] = acc;
  }
}
"#;

#[test]
fn on_cuda_a_warp_per_element_kernel_reduces_rows() {
    let Some((gpu, _memory)) = gpu_or_skip("on_cuda_a_warp_per_element_kernel_reduces_rows") else {
        return;
    };
    // More rows than the launch has warps (the grid-stride loop takes several turns), rows
    // longer than a warp and not a multiple of it.
    let (rows, cols) = (2000, 67);
    let source = ROW_SUM_CUDA.replace("COLS", &cols.to_string());
    let op = Opaque::builder("row_sum", 1, move |inputs, out| {
        let x = inputs[0].data::<f32>()?;
        let start = out.start();
        for (r, v) in out.values::<f32>()?.iter_mut().enumerate() {
            let row = (0..cols).map(|c| f64::from(x[inputs[0].position(&[start + r, c])]));
            *v = row.sum::<f64>() as f32;
        }
        Ok(())
    })
    .cuda_warp_per_element(source, "row_sum")
    .shape(|inputs| Ok((Shape::from(vec![inputs[0].0.dims()[0]]), inputs[0].1)))
    .build();
    let x = Tensor::randn([rows, cols]);
    let want = op.call(&[&x]).to_vec::<f64>();
    let got = kiln::with_check(|| op.call(&[&x.to(gpu)]).to_vec::<f64>());
    assert_close_tol(&got, &want, 1e-5, "a warp per row");
}

#[test]
fn kiln_check_compares_an_op_with_its_reference_implementation() {
    // A "fast" square that is wrong for inputs above 2, beside an f64 reference.
    let square = |wrong_above: f64| {
        move |inputs: &[kiln::ops::CpuInput<'_>], out: &mut kiln::ops::CpuOutput<'_>| {
            let x = inputs[0].to_vec::<f32>();
            let start = out.start();
            for (i, o) in out.values::<f32>()?.iter_mut().enumerate() {
                let v = x[start + i];
                *o = if f64::from(v) > wrong_above { v * v * 1.01 } else { v * v };
            }
            Ok(())
        }
    };
    let reference = |inputs: &[kiln::ops::CpuInput<'_>], out: &mut kiln::ops::CpuOutput<'_>| {
        let x = inputs[0].to_vec::<f64>();
        let start = out.start();
        for (i, o) in out.values::<f32>()?.iter_mut().enumerate() {
            *o = (x[start + i] * x[start + i]) as f32;
        }
        Ok(())
    };
    let good = Opaque::builder("checked_square", 1, square(f64::INFINITY))
        .reference(1e-6, reference)
        .build();
    let wrong = Opaque::builder("wrong_square", 1, square(2.0)).reference(1e-6, reference).build();
    let x = Tensor::from_vec(vec![0.5f32, -1.5, 3.0, 1.0], [2, 2]);
    assert_eq!(kiln::with_check(|| good.call(&[&x]).to_vec::<f32>()), [0.25, 2.25, 9.0, 1.0]);
    // Unchecked, the wrong one runs; checked, it fails naming the element and both values.
    if !std::env::var("KILN_CHECK").is_ok_and(|v| !v.is_empty() && v != "0") {
        assert_eq!(wrong.call(&[&x]).to_vec::<f32>()[2], 9.09);
    }
    let m =
        kiln::with_check(|| wrong.call(&[&x]).try_realize().map(|_| ()).unwrap_err()).to_string();
    assert!(
        m.contains("wrong_square") && m.contains("element [1, 0]") && m.contains("is 9.09"),
        "{m}"
    );
    assert!(m.contains("reference implementation's is 9"), "{m}");
}
