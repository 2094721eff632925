//! What is about CUDA devices themselves: transfers, the allocator, two devices, kernels
//! from cubin or PTX, host work in a GPU plan, values moving between devices, random programs
//! and 16-bit roundings against the CPU, printing. Without a device, only the error paths
//! run (each GPU test prints why it is skipped). The ops themselves are tested on every
//! device by their area's `device_test!`s (`on_cpu` and `on_cuda` instances of one body).

use kiln::Execution;
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

/// Printing a GPU tensor shows its values and device; a large one its corners, as on the
/// CPU (only they are copied back).
#[test]
fn gpu_tensors_print_their_values_and_device() {
    let Some((gpu, _memory)) = gpu_or_skip("gpu_tensors_print_their_values_and_device") else {
        return;
    };
    let text = format!("{}", Tensor::from_vec(vec![1.5f32, -2.0], [2]).to(gpu));
    assert!(text.contains("1.5") && text.contains("cuda:0"), "{text}");
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
