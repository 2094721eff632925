//! CUDA tensors. Without a device, only the error paths run (each GPU test prints why it is
//! skipped); with one, the same checks as the CPU JIT: random programs fused on the GPU
//! against the CPU reference executor, products against plain loops, gradients in f64 on the
//! device, exact transfers, the allocator's counters.

use kiln::Execution;
use kiln::nn::functional as F;
use kiln::optim::{Adam, AdamConfig, Optimizer};
use kiln::prelude::*;

use crate::common::*;

#[test]
fn unavailable_devices_are_clear_errors() {
    // It empties the allocators' caches, which a test reading their counters must not see.
    let _memory = shared_device_memory();
    let x = Tensor::ones([2]);
    let missing = Device::Cuda(kiln::cuda::device_count() + 3);
    let err = x.try_to(missing).unwrap_err().to_string();
    assert!(err.contains(&missing.to_string()), "{err}");
    assert!(err.contains("Device::cuda_if_available"), "{err}");
    if !kiln::cuda::is_available() {
        assert!(err.contains("driver") || err.contains("no devices"), "{err}");
        assert_eq!(Device::cuda_if_available(0), Device::Cpu);
        assert!(kiln::cuda::describe(0).is_err());
        assert!(kiln::cuda::synchronize(0).is_err());
    }
    let ordinal = kiln::cuda::device_count() + 3;
    assert_eq!(kiln::cuda::memory_allocated(ordinal), 0);
    assert_eq!(kiln::cuda::memory_reserved(ordinal), 0);
    kiln::cuda::empty_cache().unwrap();
}

#[test]
fn transfers_round_trip_exactly_in_every_dtype() {
    let Some((gpu, _memory)) = gpu_or_skip("transfers_round_trip_exactly_in_every_dtype") else {
        return;
    };
    let mut rng = Rng::new(3);
    for dtype in DType::ALL {
        for shape in [vec![], vec![0], vec![1], vec![17], vec![3, 1023], vec![5, 7, 2]] {
            let data = values(&mut rng, shape.iter().product(), dtype);
            for layout in LAYOUTS {
                let x = make(&data, &shape, dtype, layout);
                let on_gpu = x.to(gpu);
                assert_eq!(on_gpu.device(), gpu);
                assert_eq!(on_gpu.dims(), x.dims());
                let back = on_gpu.cpu();
                assert_eq!(back.device(), Device::Cpu);
                let (want, got) = (x.to_vec::<f64>(), back.to_vec::<f64>());
                let same = want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same && want.len() == got.len(), "{dtype} {shape:?} {layout:?}");
                // Reading straight from the device gives the same values.
                let direct = on_gpu.to_vec::<f64>();
                assert!(direct.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }
}

#[test]
fn large_transfers_are_staged_and_exact() {
    let Some((gpu, _memory)) = gpu_or_skip("large_transfers_are_staged_and_exact") else { return };
    // Above the staging threshold, across several 8 MiB chunks, with a ragged last chunk.
    for n in [(1 << 18) + 1, 5_000_001, 9 << 20] {
        let bytes: Vec<u8> = (0..n).map(|i| (i * 7 + i / 4096) as u8).collect();
        let x = Tensor::from_vec(bytes.clone(), [n]);
        assert_eq!(x.to(gpu).to_vec::<u8>(), bytes, "{n} bytes");
        let f: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let y = Tensor::from_vec(f.clone(), [n]).to(gpu);
        assert_eq!((&y + 1.0).cpu().to_vec::<f32>(), f.iter().map(|v| v + 1.0).collect::<Vec<_>>());
    }
}

#[test]
fn random_programs_on_the_gpu_agree_with_the_cpu_reference() {
    let Some((gpu, _memory)) =
        gpu_or_skip("random_programs_on_the_gpu_agree_with_the_cpu_reference")
    else {
        return;
    };
    // Each program compiles its own kernels: KILN_GPU_PROGRAMS runs fewer (the emulated
    // device compiles with the host C++ compiler, ~0.1 s a kernel).
    let programs = std::env::var("KILN_GPU_PROGRAMS").ok().and_then(|v| v.parse().ok());
    for seed in 0..programs.unwrap_or(2000) {
        let (want, dtype, precision) = kiln::with_execution(Execution::Reference, || {
            let (y, precision) = crate::programs::program_on(seed, Device::Cpu);
            (y.to_vec::<f64>(), y.dtype(), precision)
        });
        // CUDA's libm is within a few ULP of f64 math, like kiln's CPU polynomials, but not
        // the same few: only the reference is common ground.
        let (_, tolerance) = crate::fusion::tolerances(dtype, precision);
        for mode in [Execution::Fused, Execution::Unfused] {
            let (got, d, device) = kiln::with_execution(mode, || {
                let (y, _) = crate::programs::program_on(seed, gpu);
                (y.to_vec::<f64>(), y.dtype(), y.device())
            });
            assert_eq!((d, device, got.len()), (dtype, gpu, want.len()), "seed {seed} {mode:?}");
            if let Some(tol) = tolerance {
                assert_close_tol(&got, &want, tol, &format!("seed {seed} {mode:?} on {gpu}"));
            }
        }
    }
}

#[test]
fn index_ops_on_the_gpu_agree_with_the_reference() {
    let Some((gpu, _memory)) = gpu_or_skip("index_ops_on_the_gpu_agree_with_the_reference") else {
        return;
    };
    crate::fusion::index_ops_agree_with_the_reference_on(gpu);
}

#[test]
fn random_fills_on_the_gpu_match_the_cpu_stream() {
    let Some((gpu, _memory)) = gpu_or_skip("random_fills_on_the_gpu_match_the_cpu_stream") else {
        return;
    };
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        let host = Tensor::zeros([1001]).to_dtype(dtype);
        let device = host.to(gpu);
        kiln::manual_seed(21);
        let (u, z) = (host.rand_like().to_vec::<f64>(), host.randn_like().to_vec::<f64>());
        kiln::manual_seed(21);
        let (gu, gz) = (device.rand_like(), device.randn_like());
        assert_eq!(gu.device(), gpu);
        assert_eq!(gu.to_vec::<f64>(), u, "uniform {dtype}: the same bits");
        // Normal values go through the device's log and cos: a few ULP of f64.
        assert_close_tol(&gz.to_vec::<f64>(), &z, 1e-14_f64.max(tolerance(dtype)), "normal");
    }
}

/// `a @ b` in f64 with plain loops, for `[.., m, k] @ [.., k, n]` row-major data.
fn matmul_loop(a: &[f64], b: &[f64], batch: usize, m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; batch * m * n];
    for p in 0..batch {
        for i in 0..m {
            for j in 0..n {
                out[(p * m + i) * n + j] =
                    (0..k).map(|l| a[(p * m + i) * k + l] * b[(p * k + l) * n + j]).sum();
            }
        }
    }
    out
}

/// A product cuBLAS cannot take (batch dimensions with no single stride: heads split by a
/// reshape and a transpose) runs on the host, and says so: a `host` step in the profile and
/// a count in `kiln::debug::host_products`.
#[test]
fn a_product_on_the_host_is_labelled_and_counted() {
    let Some((gpu, _memory)) = gpu_or_skip("a_product_on_the_host_is_labelled_and_counted") else {
        return;
    };
    let mut rng = Rng::new(12);
    let a = values(&mut rng, 2 * 5 * 3 * 4, DType::F32);
    let b = values(&mut rng, 2 * 3 * 4 * 6, DType::F32);
    // [batch 2, len 5, heads 3, dim 4] -> [2, 3, 5, 4]: (batch, head) has no single stride.
    let heads = tensor(&a, &[2, 5, 3, 4], DType::F32).to(gpu).permute(&[0, 2, 1, 3]);
    let other = tensor(&b, &[2, 3, 4, 6], DType::F32).to(gpu);
    let want = tensor(&a, &[2, 5, 3, 4], DType::F32).permute(&[0, 2, 1, 3]).matmul(&other.cpu());
    let before = kiln::debug::host_products();
    let (got, profile) = kiln::profile(|| heads.matmul(&other).to_vec::<f64>());
    assert_close_tol(&got, &want.to_vec::<f64>(), 1e-5, "values");
    assert!(kiln::debug::host_products() > before);
    let kinds: Vec<String> = profile
        .events()
        .iter()
        .filter(|e| e.ops.contains("matmul"))
        .map(|e| format!("{:?}", e.kind))
        .collect();
    assert_eq!(kinds, ["Host"], "{profile}");
}

#[test]
fn products_on_the_gpu_match_the_loop() {
    let Some((gpu, _memory)) = gpu_or_skip("products_on_the_gpu_match_the_loop") else { return };
    let mut rng = Rng::new(11);
    for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
        for &(batch, m, k, n) in
            &[(1, 1, 1, 1), (1, 3, 17, 5), (2, 33, 7, 65), (3, 64, 128, 32), (1, 129, 1, 3)]
        {
            let a = values(&mut rng, batch * m * k, dtype);
            let b = values(&mut rng, batch * k * n, dtype);
            let want = matmul_loop(&a, &b, batch, m, k, n);
            for layout in LAYOUTS {
                let ta = make_on(&a, &[batch, m, k], dtype, layout, gpu);
                let tb = make_on(&b, &[batch, k, n], dtype, layout, gpu);
                let got = ta.matmul(&tb);
                assert_eq!(got.device(), gpu);
                let tol = 4.0 * tolerance(dtype) * (k as f64).sqrt();
                assert_close_tol(&got.to_vec::<f64>(), &want, tol, &format!("{dtype} {layout:?}"));
            }
            // A transposed operand (`x @ w.t()`), and a batch broadcast against one matrix.
            let wt = make_on(&b[..k * n], &[k, n], dtype, Layout::Contiguous, gpu).t().contiguous();
            let x = make_on(&a, &[batch, m, k], dtype, Layout::Contiguous, gpu);
            let got = x.matmul(&wt.t());
            let b1: Vec<f64> = (0..batch).flat_map(|_| b[..k * n].iter().copied()).collect();
            let want = matmul_loop(&a, &b1, batch, m, k, n);
            let tol = 4.0 * tolerance(dtype) * (k as f64).sqrt();
            assert_close_tol(&got.to_vec::<f64>(), &want, tol, &format!("{dtype} broadcast"));
        }
    }
}

#[test]
fn row_reductions_softmax_and_cross_entropy_on_the_gpu() {
    let Some((gpu, _memory)) = gpu_or_skip("row_reductions_softmax_and_cross_entropy_on_the_gpu")
    else {
        return;
    };
    kiln::manual_seed(5);
    // Long rows (few of them) are split across blocks and merged.
    for &(rows, cols) in &[(1, 1), (3, 17), (37, 203), (8, 1025), (2, 4099), (300, 257), (2, 30001)]
    {
        let x = Tensor::randn([rows, cols]);
        let target = Tensor::randint(0, cols as i64, [rows]);
        let g = x.to(gpu);
        let pairs = [
            (x.softmax(1), g.softmax(1)),
            (x.log_softmax(1), g.log_softmax(1)),
            (x.max_dim(1, false).0, g.max_dim(1, false).0),
            (x.sum_dim(0, true), g.sum_dim(0, true)),
            (x.var_dim(1, false), g.var_dim(1, false)),
            // Over rows: one thread per output once there are many outputs.
            (x.var_dim(0, false), g.var_dim(0, false)),
            (x.amax(0, true), g.amax(0, true)),
            (x.t().softmax(1), g.t().softmax(1)),
            (F::cross_entropy(&x, &target), F::cross_entropy(&g, &target.to(gpu))),
        ];
        for (i, (cpu, cuda)) in pairs.iter().enumerate() {
            assert_eq!(cuda.device(), gpu);
            assert_close_tol(
                &cuda.to_vec::<f64>(),
                &cpu.to_vec::<f64>(),
                1e-5,
                &format!("reduction {i} on {rows}x{cols}"),
            );
        }
    }
}

#[test]
fn gradients_on_the_gpu_pass_gradcheck_in_f64() {
    let Some((gpu, _memory)) = gpu_or_skip("gradients_on_the_gpu_pass_gradcheck_in_f64") else {
        return;
    };
    let mut rng = Rng::new(9);
    let x = tensor(&values(&mut rng, 12, DType::F64), &[3, 4], DType::F64).to(gpu);
    let w = tensor(&values(&mut rng, 20, DType::F64), &[4, 5], DType::F64).to(gpu);
    let f = |xs: &[Tensor]| {
        let h = (xs[0].matmul(&xs[1]) * 0.5 + 0.1).tanh();
        (h.log_softmax(1) * h.sigmoid()).sum_dim(0, false)
    };
    kiln::autograd::gradcheck(f, &[x.clone(), w.clone()], 1e-6, 1e-6).unwrap();
    // Higher order: the gradient of a gradient, on the device.
    let g = |xs: &[Tensor]| {
        let y = (xs[0].tanh() * &xs[0]).sum();
        kiln::autograd::grad(&[&y], &[&xs[0]], true).remove(0)
    };
    kiln::autograd::gradcheck(g, &[x], 1e-6, 1e-6).unwrap();
}

/// The CPU's finite-difference checks of every differentiable op, with the inputs on the GPU
/// (f64, every layout, broadcasting, second derivatives).
#[test]
fn every_differentiable_op_passes_gradcheck_on_the_gpu() {
    let Some((gpu, _memory)) = gpu_or_skip("every_differentiable_op_passes_gradcheck_on_the_gpu")
    else {
        return;
    };
    use crate::autograd::*;
    for check in [
        unary_ops_pass_gradcheck,
        binary_ops_pass_gradcheck_with_broadcasting,
        reductions_and_movement_pass_gradcheck,
        matmul_passes_gradcheck_in_every_form,
        selection_ops_pass_gradcheck,
        composite_reductions_pass_gradcheck,
        second_derivatives_of_math_and_matmul,
    ] {
        on_device(gpu, check);
    }
}

#[test]
fn gradients_flow_back_across_a_device_copy() {
    let Some((gpu, _memory)) = gpu_or_skip("gradients_flow_back_across_a_device_copy") else {
        return;
    };
    let mut rng = Rng::new(4);
    let data = values(&mut rng, 15, DType::F32);
    let loss = |x: &Tensor| (x.sigmoid() * x).sum();
    let a = tensor(&data, &[3, 5], DType::F32).requires_grad_(true);
    loss(&a).backward();
    let b = tensor(&data, &[3, 5], DType::F32).requires_grad_(true);
    let on_gpu = b.to(gpu);
    assert_eq!(on_gpu.device(), gpu);
    loss(&on_gpu).backward();
    let (want, got) = (a.grad().unwrap(), b.grad().unwrap());
    assert_eq!(got.device(), Device::Cpu, "the gradient lives where the leaf does");
    assert_close_tol(&got.to_vec::<f64>(), &want.to_vec::<f64>(), 1e-6, "grad across .to");
}

#[test]
fn ops_between_devices_are_errors_and_scalars_join_any_device() {
    let Some((gpu, _memory)) =
        gpu_or_skip("ops_between_devices_are_errors_and_scalars_join_any_device")
    else {
        return;
    };
    let x = Tensor::from_vec(vec![1.0f32, -2.0, 3.0], [3]);
    let g = x.to(gpu);
    let err = x.try_add(&g).unwrap_err().to_string();
    assert!(err.contains("cpu") && err.contains("cuda:0") && err.contains(".to("), "{err}");
    // Scalars, fills and `*_like` constants go where the data is.
    let y = (&g * 2.0 + 1.0).relu();
    assert_eq!(y.device(), gpu);
    assert_eq!(y.to_vec::<f32>(), vec![3.0, 0.0, 7.0]);
    assert_eq!(g.zeros_like().device(), gpu);
    let z = g.copy();
    z.fill_(4.0);
    assert_eq!((z.device(), z.to_vec::<f32>()), (gpu, vec![4.0; 3]));
    // A realized CPU tensor is data: it must be moved explicitly, except by `copy_`.
    let ones = Tensor::ones([3]);
    ones.realize();
    assert!(g.try_add(&ones).is_err());
    z.copy_(&ones);
    assert_eq!((z.device(), z.to_vec::<f32>()), (gpu, vec![1.0; 3]));
    // Saved weights load into parameters on a GPU.
    let dir = std::env::temp_dir().join(format!("kiln-cuda-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.safetensors");
    let saved = Tensor::from_vec(vec![5.0f32, 6.0, 7.0], [3]);
    kiln::serialize::save(&path, &[("w".to_string(), saved)]).unwrap();
    let loaded = kiln::serialize::load(&path).unwrap();
    z.copy_(&loaded[0].1);
    assert_eq!((z.device(), z.to_vec::<f32>()), (gpu, vec![5.0, 6.0, 7.0]));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_allocator_caches_and_releases_device_memory() {
    let Some((gpu, _alone)) = gpu_alone_or_skip("the_allocator_caches_and_releases_device_memory")
    else {
        return;
    };
    let Device::Cuda(i) = gpu else { unreachable!() };
    let before = kiln::cuda::memory_allocated(i);
    let x = Tensor::zeros([1 << 20]).to(gpu);
    x.realize();
    let held = kiln::cuda::memory_allocated(i);
    assert!(held >= before + (4 << 20), "{before} -> {held}");
    drop(x);
    let after = kiln::cuda::memory_allocated(i);
    assert!(after < held, "{held} -> {after}");
    assert!(kiln::cuda::memory_reserved(i) >= held, "the block stays cached");
    kiln::cuda::empty_cache().unwrap();
    assert_eq!(kiln::cuda::memory_reserved(i), kiln::cuda::memory_allocated(i));
}

#[test]
fn a_compiled_training_step_runs_on_the_gpu() {
    let Some((gpu, _memory)) = gpu_or_skip("a_compiled_training_step_runs_on_the_gpu") else {
        return;
    };
    kiln::manual_seed(2);
    let x = Tensor::randn([16, 8]);
    let w0 = Tensor::randn([8, 4]);
    let target = Tensor::randint(0, 4, [16]);
    let train = |device: Device| {
        // Its own storage: `to(Device::Cpu)` of a CPU tensor is the tensor itself, and the
        // optimizer updates the parameter in place.
        let w = w0.to(device).copy().detach().requires_grad_(true);
        let (x, target) = (x.to(device), target.to(device));
        // Adam's state (zeros_like of the parameter) lives on the parameter's device.
        let mut opt = Adam::new(vec![w.clone()], AdamConfig { lr: 1e-2, ..Default::default() });
        let mut step = kiln::compile(|()| {
            opt.zero_grad();
            let loss = F::cross_entropy(&x.matmul(&w), &target);
            loss.backward();
            opt.step();
            loss
        });
        let losses: Vec<f32> = (0..5).map(|_| step.call(()).item::<f32>()).collect();
        assert_eq!(w.device(), device);
        (losses, w.to_vec::<f32>())
    };
    let (cpu_losses, cpu_w) = train(Device::Cpu);
    let (gpu_losses, gpu_w) = train(gpu);
    let f64s = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    assert_close_tol(&f64s(&gpu_losses), &f64s(&cpu_losses), 1e-5, "losses");
    assert_close_tol(&f64s(&gpu_w), &f64s(&cpu_w), 1e-5, "weights");
}

/// A model of kiln's layers, moved to the GPU with `Parameters::to`, trains as on the CPU:
/// embedding, layer norm, linear layers, GELU, dropout (in eval mode), cross-entropy and
/// AdamW, eagerly and with `f16` activations.
#[test]
fn modules_train_on_the_gpu_as_on_the_cpu() {
    use kiln::nn::{Dropout, Embedding, GELU, LayerNorm, Linear, Module, Parameters, Sequential};
    use kiln::optim::AdamW;
    let Some((gpu, _memory)) = gpu_or_skip("modules_train_on_the_gpu_as_on_the_cpu") else {
        return;
    };
    let tokens = Tensor::from_vec((0..24).map(|i| (i * 7 % 11) as i64).collect::<Vec<_>>(), [24]);
    let target = Tensor::from_vec((0..24).map(|i| (i % 5) as i64).collect::<Vec<_>>(), [24]);
    let train = |device: Device| {
        kiln::manual_seed(13);
        let embed = Embedding::new(11, 16);
        let mut body = Sequential::new()
            .with(LayerNorm::new(&[16]))
            .with(Linear::new(16, 32))
            .with(GELU)
            .with(Dropout::new(0.25))
            .with(Linear::new(32, 5));
        let mut embed = embed;
        body.eval();
        embed.to(device).expect("embedding to the device");
        body.to(device).expect("layers to the device");
        let mut params = embed.parameters();
        params.extend(body.parameters());
        assert!(params.iter().all(|p| p.device() == device && p.is_leaf()));
        let mut opt = AdamW::new(params, AdamConfig { lr: 1e-2, ..AdamConfig::adamw() });
        let (tokens, target) = (tokens.to(device), target.to(device));
        let mut losses = Vec::new();
        for _ in 0..4 {
            opt.zero_grad();
            let h = embed.forward(&tokens);
            let logits = body.forward(&h.half()).float();
            let loss = F::cross_entropy(&logits, &target);
            loss.backward();
            opt.step();
            losses.push(loss.item::<f64>());
        }
        (losses, body.parameters()[2].to_vec::<f64>())
    };
    let (cpu_losses, cpu_w) = train(Device::Cpu);
    let (gpu_losses, gpu_w) = train(gpu);
    assert!(cpu_losses[3] < cpu_losses[0], "the model learns: {cpu_losses:?}");
    // f16 activations: the two devices round the same values, but sums may differ in order.
    assert_close_tol(&gpu_losses, &cpu_losses, 2e-3, "losses");
    assert_close_tol(&gpu_w, &cpu_w, 2e-3, "a weight after four steps");
}

/// Ops that are not simple elementwise chains, each on the same data on both devices, over
/// odd sizes and non-contiguous views.
#[test]
fn assorted_ops_on_the_gpu_match_the_cpu() {
    let Some((gpu, _memory)) = gpu_or_skip("assorted_ops_on_the_gpu_match_the_cpu") else { return };
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
        let g = x.to(gpu);
        for (name, op) in &ops {
            let (want, got) = (op(&x), op(&g));
            assert_eq!(got.device(), gpu, "{name}");
            assert_eq!((got.dims(), got.dtype()), (want.dims(), want.dtype()), "{name}");
            let tol = if name.contains("16") { 1e-2 } else { 1e-5 };
            let at = format!("{name} {layout:?}");
            assert_close_tol(&got.to_vec::<f64>(), &want.to_vec::<f64>(), tol, &at);
        }
    }
    // Printing a GPU tensor shows its values and device.
    let text = format!("{}", Tensor::from_vec(vec![1.5f32, -2.0], [2]).to(gpu));
    assert!(text.contains("1.5") && text.contains("cuda:0"), "{text}");
    // A large one prints its corners, as on the CPU (only they are copied back).
    let big = Tensor::arange(0.0, 3000.0, 1.0).reshape(&[2, 3, 500]).sin();
    let (cpu, on_gpu) = (big.to_string(), big.to(gpu).to_string());
    let want = format!("{}, device='cuda:0')", cpu.strip_suffix(')').unwrap());
    assert_eq!(on_gpu, want, "printed on the GPU");
}

#[test]
fn kernels_compile_once_per_structure() {
    let Some((gpu, _memory)) = gpu_or_skip("kernels_compile_once_per_structure") else { return };
    let x = Tensor::randn([1000]).to(gpu);
    let run = |x: &Tensor| kiln::profile(|| ((x * 1.25 + 0.5).tanh() - 0.125).realize().clone());
    let (_, first) = run(&x);
    let (_, again) = run(&x);
    assert!(again.compile_time().is_zero(), "the second realization compiles nothing");
    assert!(first.launches() >= 1 && again.launches() >= 1);
}

#[test]
fn sixteen_bit_roundings_on_the_gpu_match_the_cpu_bit_for_bit() {
    let Some((gpu, _memory)) =
        gpu_or_skip("sixteen_bit_roundings_on_the_gpu_match_the_cpu_bit_for_bit")
    else {
        return;
    };
    // f64 values just above and below ties between 16-bit neighbours: a conversion that
    // rounds to f32 first lands on the tie and goes to even.
    let mut data = Vec::new();
    for k in 0..64 {
        let q = 1.0 + f64::from(k) / 64.0;
        for half_ulp in [2f64.powi(-11), 2f64.powi(-8)] {
            data.extend([q + half_ulp + 1e-12, q + half_ulp - 1e-12, -(q + half_ulp + 1e-12)]);
        }
    }
    let x = Tensor::from_vec(data.clone(), [data.len()]);
    let same = |got: &Tensor, want: &Tensor, what: &str| {
        let (got, want) = (got.to_vec::<f64>(), want.to_vec::<f64>());
        if let Some(i) = (0..want.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
            panic!("{what}: element {i} is {:e} on the GPU, {:e} on the CPU", got[i], want[i]);
        }
    };
    for dtype in [DType::F16, DType::BF16] {
        let cast = |x: &Tensor| x.to_dtype(dtype);
        same(&cast(&x.to(gpu)), &cast(&x), &format!("f64 -> {dtype}"));
        // A scalar operand rounds to the tensor's dtype once, on its way to the kernel.
        let scaled = |x: &Tensor| x.ones_like().to_dtype(dtype) * data[0];
        same(&scaled(&x.to(gpu)), &scaled(&x), &format!("{dtype} * scalar"));
        // Running sums accumulate in f64 and round once per position.
        let tiny = [1.0, 2f64.powi(-11), 2f64.powi(-24), 2f64.powi(-8), 2f64.powi(-20)];
        let t = Tensor::from_vec(tiny.to_vec(), [tiny.len()]).to_dtype(dtype);
        same(&t.to(gpu).cumsum(0), &t.cumsum(0), &format!("{dtype} cumsum"));
    }
}

#[test]
fn long_reductions_split_across_blocks_on_the_gpu() {
    let Some((gpu, _memory)) = gpu_or_skip("long_reductions_split_across_blocks_on_the_gpu") else {
        return;
    };
    let mut rng = Rng::new(23);
    let n = 40_003;
    for dtype in [DType::F32, DType::F64, DType::BF16, DType::I32, DType::U8] {
        let data = values(&mut rng, n, dtype);
        let layouts: &[Layout] = if matches!(dtype, DType::F32 | DType::I32) {
            &[Layout::Contiguous, Layout::Sliced]
        } else {
            &[Layout::Contiguous]
        };
        for &layout in layouts {
            let x = make(&data, &[n], dtype, layout);
            let g = x.to(gpu);
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
                let (want, got) = (op(&x), op(&g));
                // f32 sums accumulate in f32 on the GPU (in f64 on the CPU).
                let tol = if name.starts_with("arg") || !dtype.is_float() {
                    0.0
                } else if matches!(dtype, DType::F16 | DType::BF16) {
                    1e-2
                } else {
                    1e-4
                };
                let at = format!("{name} of {n} {dtype} {layout:?}");
                assert_close_tol(&got.to_vec::<f64>(), &want.to_vec::<f64>(), tol, &at);
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
        (loss, a.grad().expect("a gradient"))
    };
    let (want, want_grad) = mse(&a, &b);
    let (got, got_grad) = mse(&a.to(gpu), &b.to(gpu));
    assert_close_tol(&got.to_vec::<f64>(), &want.to_vec::<f64>(), 1e-12, "mse");
    assert_close_tol(&got_grad.to_vec::<f64>(), &want_grad.to_vec::<f64>(), 1e-12, "mse gradient");
}

#[test]
fn two_devices_keep_their_memory_kernels_and_errors_apart() {
    let Some((_, _memory)) = gpu_or_skip("two_devices_keep_their_memory_kernels_and_errors_apart")
    else {
        return;
    };
    if kiln::cuda::device_count() < 2 {
        let test = "two_devices_keep_their_memory_kernels_and_errors_apart";
        skip(test, "there is one CUDA device", &["KILN_REQUIRE_TWO_GPUS"]);
        return;
    }
    let (d0, d1) = (Device::Cuda(0), Device::Cuda(1));
    let mut rng = Rng::new(41);
    let x = tensor(&values(&mut rng, 37 * 53, DType::F32), &[37, 53], DType::F32);
    let w = tensor(&values(&mut rng, 53 * 11, DType::F32), &[53, 11], DType::F32);
    type Op = fn(&Tensor, &Tensor) -> Tensor;
    let ops: [(&str, Op); 5] = [
        ("matmul, relu, row sums", |x, w| x.matmul(w).relu().sum_dim(1, false)),
        ("softmax", |x, _| x.softmax(1)),
        ("argmax", |x, _| x.argmax(1, false)),
        ("cumsum", |x, _| x.cumsum(0)),
        ("gather", |x, _| x.gather(1, &x.gt(0.0).to_dtype(DType::I64))),
    ];
    // Device 1 first: its kernels and cuBLAS handle are its own, not device 0's.
    for d in [d1, d0, d1] {
        let (xd, wd) = (x.to(d), w.to(d));
        for (name, op) in ops {
            let (want, got) = (op(&x, &w), op(&xd, &wd));
            assert_eq!(got.device(), d, "{name}");
            let at = format!("{name} on {d}");
            assert_close_tol(&got.to_vec::<f64>(), &want.to_vec::<f64>(), 1e-5, &at);
        }
    }
    // From one GPU to the other, and a gradient back across both to a CPU leaf.
    let leaf = x.detach().requires_grad_(true);
    let y = (leaf.to(d0).exp() * 2.0).to(d1).tanh();
    assert_eq!(y.device(), d1);
    y.sum().backward();
    let want_leaf = x.detach().requires_grad_(true);
    (want_leaf.exp() * 2.0).tanh().sum().backward();
    let (got, want) = (leaf.grad().unwrap(), want_leaf.grad().unwrap());
    assert_eq!(got.device(), Device::Cpu);
    assert_close_tol(&got.to_vec::<f64>(), &want.to_vec::<f64>(), 1e-5, "gradient across GPUs");
    // Mixing the two is an error naming both; each keeps its own memory.
    let err = x.to(d0).try_add(x.to(d1)).unwrap_err().to_string();
    assert!(err.contains("cuda:0") && err.contains("cuda:1"), "{err}");
    let held = x.to(d1);
    held.realize();
    assert!(kiln::cuda::memory_allocated(1) >= 37 * 53 * 4);
}

/// An op of a GPU plan that no device kernel takes (an integer product) runs on the host
/// over copies, gives the CPU's values, and its profile row says `host`, not `library`.
#[test]
fn host_work_in_a_gpu_plan_is_labelled_as_such() {
    let Some((gpu, _memory)) = gpu_or_skip("host_work_in_a_gpu_plan_is_labelled_as_such") else {
        return;
    };
    let a = Tensor::from_vec((0..12).map(|i| i - 5).collect::<Vec<i64>>(), [3, 4]);
    let b = Tensor::from_vec((0..8).map(|i| 2 * i + 1).collect::<Vec<i64>>(), [4, 2]);
    let want = a.matmul(&b).to_vec::<i64>();
    let (ga, gb) = (a.to(gpu), b.to(gpu));
    let (got, p) = kiln::profile(|| ga.matmul(&gb).to_vec::<i64>());
    assert_eq!(got, want);
    let kinds: Vec<_> = p.kernels().iter().map(|k| k.kind).collect();
    assert!(kinds.contains(&kiln::StepKind::Host), "{p}");
}

/// Kernels load from the cubin NVRTC makes for the device's architecture, or from the PTX
/// when the driver refuses the cubin (a driver older than NVRTC), or from PTX for an older
/// architecture when the device is newer than NVRTC knows. `emulator/run-tests` runs this
/// test three times: as is, with `KILN_EMULATOR_REJECT_CUBIN=1` (the emulated driver refuses
/// cubins) and with `KILN_EMULATOR_ARCHS=75,80,86` (the emulated NVRTC does not know sm_90).
#[test]
fn kernels_load_from_the_cubin_or_fall_back_to_ptx() {
    let Some((gpu, _memory)) = gpu_or_skip("kernels_load_from_the_cubin_or_fall_back_to_ptx")
    else {
        return;
    };
    let x = Tensor::from_vec((0..19).map(|i| i as f32).collect::<Vec<_>>(), [19]);
    let want: Vec<f64> =
        (0..19).map(|i| (f64::from(i as f32 * 0.123_456_78f32) + 0.5).tanh()).collect();
    // A constant no other test uses, so that the kernel is compiled and loaded here.
    let got = (&x.to(gpu) * 0.123_456_78 + 0.5).tanh().to_vec::<f32>();
    for (a, b) in got.iter().zip(&want) {
        assert!((f64::from(*a) - b).abs() < 1e-6, "{got:?}");
    }
}

/// Convolution and pooling on the GPU (overlapping window views, the im2col copy, cuBLAS
/// products) agree with the CPU, and so do their gradients.
#[test]
fn convolution_and_pooling_on_the_gpu_match_the_cpu() {
    use kiln::nn::functional::{self as F, Conv2dOptions, Pool2dOptions};
    let Some((gpu, _memory)) = gpu_or_skip("convolution_and_pooling_on_the_gpu_match_the_cpu")
    else {
        return;
    };
    let mut rng = Rng::new(84);
    let x = tensor(&values(&mut rng, 2 * 4 * 7 * 6, DType::F64), &[2, 4, 7, 6], DType::F64);
    let w = tensor(&values(&mut rng, 6 * 2 * 3 * 3, DType::F64), &[6, 2, 3, 3], DType::F64);
    let o = Conv2dOptions { stride: [2, 1], padding: [1, 1], groups: 2, ..Default::default() };
    let p = Pool2dOptions { stride: Some([1, 1]), padding: [1, 1], ..Pool2dOptions::new([3, 3]) };
    let run = |x: &Tensor, w: &Tensor| {
        let x = x.requires_grad_(true);
        let y = F::max_pool2d(&F::conv2d(&x, w, None, o), p) + F::avg_pool2d(&x, p).sum();
        let g = kiln::grad(&[&y.sum()], &[&x], false).remove(0);
        (y.to_vec::<f64>(), g.to_vec::<f64>())
    };
    let (want, want_g) = run(&x, &w);
    let (got, got_g) = run(&x.to(gpu).detach(), &w.to(gpu));
    assert_close_tol(&got, &want, 1e-12, "conv and pool values");
    assert_close_tol(&got_g, &want_g, 1e-12, "conv and pool gradients");
}

/// The rest of the convolutional vocabulary on the GPU: transposed convolution (col2im),
/// padding modes, interpolation, adaptive pooling, pooling indices, group norm, and a batch
/// norm layer moved to the device with its buffers, updating them there.
#[test]
fn vision_ops_and_batch_norm_on_the_gpu_match_the_cpu() {
    use kiln::nn::functional::{
        self as F, ConvTranspose2dOptions, InterpolateMode, PadMode, Pool2dOptions, Resize,
    };
    use kiln::nn::{BatchNorm2d, Module, Parameters};
    let Some((gpu, _memory)) = gpu_or_skip("vision_ops_and_batch_norm_on_the_gpu_match_the_cpu")
    else {
        return;
    };
    let mut rng = Rng::new(85);
    let x = tensor(&values(&mut rng, 2 * 4 * 5 * 6, DType::F64), &[2, 4, 5, 6], DType::F64);
    let w = tensor(&values(&mut rng, 4 * 3 * 3 * 2, DType::F64), &[4, 3, 3, 2], DType::F64);
    let run = |x: &Tensor, w: &Tensor| {
        let x = x.requires_grad_(true);
        let t = ConvTranspose2dOptions {
            stride: [2, 2],
            padding: [1, 0],
            output_padding: [1, 1],
            ..Default::default()
        };
        let parts = [
            F::conv_transpose2d(&x, w, None, t).square().sum(),
            F::pad(&x, &[2, 1, 1, 2], PadMode::Reflect, 0.0).sin().sum(),
            F::interpolate(&x, Resize::Size([7, 9]), InterpolateMode::Bilinear, false)
                .square()
                .sum(),
            F::adaptive_max_pool2d(&x, [3, 4]).sum()
                + F::adaptive_avg_pool2d(&x, [2, 4]).square().sum(),
            F::max_pool2d_with_indices(&x, Pool2dOptions::new([2, 2]).ceil_mode(true)).0.sum(),
            F::group_norm(&x, 2, None, None, 1e-5).square().mean(),
        ];
        let total = parts[1..].iter().fold(parts[0].clone(), |a, p| a + p);
        let g = kiln::grad(&[&total], &[&x], false).remove(0);
        let idx = F::max_pool2d_with_indices(&x.detach(), Pool2dOptions::new([2, 2])).1;
        (total.item::<f64>(), g.to_vec::<f64>(), idx.to_vec::<i64>())
    };
    let (want, want_g, want_i) = run(&x, &w);
    let (got, got_g, got_i) = run(&x.to(gpu).detach(), &w.to(gpu));
    assert_close_tol(&[got], &[want], 1e-10, "vision values");
    assert_close_tol(&got_g, &want_g, 1e-10, "vision gradients");
    assert_eq!(got_i, want_i);

    // A batch norm layer on the device: buffers move with it and update there.
    kiln::manual_seed(2);
    let cpu_bn = BatchNorm2d::new(4);
    let mut gpu_bn = BatchNorm2d::new(4);
    gpu_bn.to(gpu).unwrap();
    assert!(gpu_bn.buffers().iter().all(|b| b.device() == gpu));
    let xf = x.float();
    let a = cpu_bn.forward(&xf).to_vec::<f32>();
    let b = gpu_bn.forward(&xf.to(gpu)).to_vec::<f32>();
    assert_close_tol(
        &b.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
        &a.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
        1e-5,
        "batch norm",
    );
    assert_close_tol(
        &read(&gpu_bn.running_var, DType::F32),
        &read(&cpu_bn.running_var, DType::F32),
        1e-6,
        "running variance",
    );
    assert_eq!(gpu_bn.num_batches_tracked.item::<i64>(), 1);
}

/// The composite activations and special functions, and RMS norm, on the GPU.
#[test]
fn activations_and_rms_norm_on_the_gpu_match_the_cpu() {
    use kiln::nn::functional as F;
    let Some((gpu, _memory)) = gpu_or_skip("activations_and_rms_norm_on_the_gpu_match_the_cpu")
    else {
        return;
    };
    let mut rng = Rng::new(124);
    let mut data = values(&mut rng, 6 * 9, DType::F64);
    data[..3].copy_from_slice(&[1e-12, -25.0, 25.0]);
    let x = tensor(&data, &[6, 9], DType::F64);
    let run = |x: &Tensor| {
        let x = x.requires_grad_(true);
        let y = x.silu()
            + x.gelu_tanh()
            + x.softplus(1.0, 20.0)
            + x.leaky_relu(0.1)
            + x.elu(1.0)
            + x.abs().log1p()
            + x.clamp_max(5.0).expm1()
            + F::rms_norm(&x, &[9], None, None);
        let g = kiln::grad(&[&y.sum()], &[&x], false).remove(0);
        (y.to_vec::<f64>(), g.to_vec::<f64>(), x.sign().to_vec::<f64>())
    };
    let (want, want_g, want_s) = run(&x);
    let (got, got_g, got_s) = run(&x.to(gpu).detach());
    assert_close_tol(&got, &want, 1e-12, "values");
    assert_close_tol(&got_g, &want_g, 1e-12, "gradients");
    assert_eq!(got_s, want_s);
}

#[test]
fn ordering_sampling_and_norms_on_the_gpu_match_the_cpu() {
    let Some((gpu, _lock)) = gpu_or_skip("ordering_sampling_and_norms_on_the_gpu_match_the_cpu")
    else {
        return;
    };
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
    let (want, want_g, want_i, want_d) = run(&x, 3);
    let (got, got_g, got_i, got_d) = run(&x.to(gpu).detach(), 3);
    assert_close_tol(&got, &want, 1e-12, "values");
    assert_close_tol(&got_g, &want_g, 1e-12, "gradients");
    assert_eq!(got_i, want_i);
    assert_eq!(got_d, want_d, "the same seed draws the same samples on both devices");
}

#[test]
fn fused_attention_on_the_gpu_matches_the_cpu() {
    use kiln::nn::functional as F;
    let Some((gpu, _lock)) = gpu_or_skip("fused_attention_on_the_gpu_matches_the_cpu") else {
        return;
    };
    let mut rng = Rng::new(810);
    // Every float dtype (16-bit ones widened on the device and rounded once, as on the CPU),
    // and rows longer than a warp's 32 lanes (e = 40, ev = 70).
    for (dtype, causal, tol, [e, ev]) in [
        (DType::F64, true, 1e-12, [4, 3]),
        (DType::F64, false, 1e-12, [40, 70]),
        (DType::F32, true, 2e-5, [4, 3]),
        // Dot products of 40 and 70 terms summed in another order; `dp - D` cancels.
        (DType::F32, true, 2e-4, [40, 70]),
        (DType::F16, false, 4e-3, [40, 3]),
        (DType::BF16, true, 3e-2, [4, 70]),
    ] {
        let q = tensor(&values(&mut rng, 2 * 9 * e, DType::F64), &[2, 9, e], dtype);
        let k = tensor(&values(&mut rng, 2 * 11 * e, DType::F64), &[2, 11, e], dtype);
        let v = tensor(&values(&mut rng, 2 * 11 * ev, DType::F64), &[2, 11, ev], dtype);
        let run = |q: &Tensor, k: &Tensor, v: &Tensor| {
            let (q, k, v) =
                (q.requires_grad_(true), k.requires_grad_(true), v.requires_grad_(true));
            let y = F::scaled_dot_product_attention(&q, &k, &v, None, causal);
            let g = kiln::grad(&[&y.square().sum()], &[&q, &k, &v], false);
            [y.to_vec::<f64>(), g[0].to_vec::<f64>(), g[1].to_vec::<f64>(), g[2].to_vec::<f64>()]
        };
        let want = run(&q, &k, &v);
        let (qg, kg, vg) = (q.to(gpu).detach(), k.to(gpu).detach(), v.to(gpu).detach());
        let (got, profile) = kiln::profile(|| run(&qg, &kg, &vg));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_close_tol(g, w, tol, &format!("{dtype:?} causal {causal} part {i}"));
        }
        // The device's own kernels, not host copies.
        let kernels = profile.kernels();
        let attention: Vec<_> =
            kernels.iter().filter(|k| k.name.starts_with("attention")).collect();
        assert_eq!(attention.len(), 2, "attention and attention_grad");
        for k in attention {
            assert_eq!(k.kind, kiln::StepKind::Library, "{}", k.name);
        }
    }
}

/// A compiled step whose results live on two devices (a GPU step that also keeps a value on
/// the CPU) runs eagerly: counted in `unplanned`, with the right values.
#[test]
fn a_compiled_step_with_results_on_two_devices_is_counted_unplanned() {
    let Some((gpu, _memory)) =
        gpu_or_skip("a_compiled_step_with_results_on_two_devices_is_counted_unplanned")
    else {
        return;
    };
    let w = Tensor::randn([4, 3]).to(gpu);
    let count = Tensor::zeros([1]);
    let mut f = kiln::compile(|x: &Tensor| (x.matmul(&w).tanh(), &count + 1.0));
    let x = Tensor::randn([2, 4]);
    let (h, next): (Tensor, Tensor) = f.call(&x.to(gpu));
    assert_eq!((h.device(), next.device()), (gpu, Device::Cpu));
    let want = x.matmul(&w.cpu()).tanh();
    assert_close_tol(&h.to_vec::<f64>(), &want.to_vec::<f64>(), 1e-5, "values");
    assert_eq!(next.to_vec::<f32>(), [1.0]);
    assert_eq!(f.stats().unplanned, 1, "{}", f.stats());
}

mod graphs;
mod profile;
