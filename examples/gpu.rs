//! kiln on an NVIDIA GPU: the benchmark workloads on the device, against the device's own
//! copy bandwidth measured in the same run, plus NVRTC compile and cached-launch latency.
//!
//! `cargo run --release --example gpu` prints a table; `-- --json` prints one JSON object per
//! line (`workload`, `variant`, `median_ms`, and `gbps` or `gflops`). Without a CUDA device it
//! says why and exits successfully.

use std::time::Instant;

#[path = "common/report.rs"]
mod report;

use kiln::Execution;
use kiln::prelude::*;
use report::Row;

const REPS: usize = 9;

/// Median wall time of `f` in ms, each run ended by waiting for the device.
fn median_ms(mut f: impl FnMut()) -> f64 {
    let mut run = || {
        let t = Instant::now();
        f();
        kiln::cuda::synchronize(0).expect("the device's work failed");
        t.elapsed().as_secs_f64() * 1e3
    };
    run(); // compile kernels, fill the allocator's cache
    let mut times: Vec<f64> = (0..REPS).map(|_| run()).collect();
    times.sort_by(f64::total_cmp);
    times[REPS / 2]
}

fn main() -> kiln::Result<()> {
    let json = std::env::args().any(|a| a == "--json");
    if !kiln::cuda::is_available() {
        println!("no CUDA device: nothing to measure (kiln::cuda::device_count() is 0)");
        return Ok(());
    }
    let gpu = Device::Cuda(0);
    let name = kiln::cuda::describe(0)?;
    let mut rows = Vec::new();
    let gb = |bytes: f64, ms: f64| bytes / (ms * 1e-3) / 1e9;

    let copy = kiln::cuda::copy_bandwidth(0, 1 << 28, REPS)?;
    rows.push(Row {
        workload: "copy".into(),
        variant: "ceiling",
        ms: 2.0 * f64::from(1u32 << 28) / copy / 1e6,
        gbps: Some(copy),
        gflops: None,
    });

    // W1 and W1b over 64M f32 (256 MiB in, 256 MiB out).
    let n = 1usize << 26;
    kiln::manual_seed(0);
    let x = Tensor::randn([n]).to(gpu);
    let w1 =
        |x: &Tensor| ((x * 1.5 + 0.5).tanh() * x.sigmoid() + (x - 0.2).relu()) / (x.square() + 1.0);
    let w1b = |x: &Tensor| ((x * 1.5 + 0.5) * x + (x - 0.2).relu()) / (x.square() + 1.0);
    for (workload, f) in [("W1", &w1 as &dyn Fn(&Tensor) -> Tensor), ("W1b", &w1b)] {
        for (variant, mode) in [("fused", Execution::Fused), ("unfused", Execution::Unfused)] {
            let ms = median_ms(|| {
                kiln::with_execution(mode, || f(&x).realize().clone());
            });
            let bytes = 8.0 * n as f64;
            rows.push(Row {
                workload: workload.into(),
                variant,
                ms,
                gbps: Some(gb(bytes, ms)),
                gflops: None,
            });
        }
    }
    drop(x);

    // W3: row softmax, 4096² and 16384².
    for side in [4096usize, 16384] {
        let a = Tensor::randn([side, side]).to(gpu);
        for (variant, mode) in [("fused", Execution::Fused), ("unfused", Execution::Unfused)] {
            let ms = median_ms(|| {
                kiln::with_execution(mode, || a.softmax(1).realize().clone());
            });
            let bytes = 8.0 * (side * side) as f64;
            rows.push(Row {
                workload: format!("W3 {side}²"),
                variant,
                ms,
                gbps: Some(gb(bytes, ms)),
                gflops: None,
            });
        }
    }

    // W5: matmul through cuBLAS, f32 and f16.
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let side = 4096usize;
        let a = Tensor::randn([side, side]).to_dtype(dtype).to(gpu);
        let b = Tensor::randn([side, side]).to_dtype(dtype).to(gpu);
        a.realize();
        b.realize();
        let ms = median_ms(|| {
            a.matmul(&b).realize();
        });
        let flops = 2.0 * (side * side * side) as f64;
        rows.push(Row {
            workload: format!("W5 {side}³ {dtype}"),
            variant: "fused",
            ms,
            gbps: None,
            gflops: Some(flops / (ms * 1e-3) / 1e9),
        });
    }

    // Compile latency: a kernel structure never seen (a fresh constant count of ops), then
    // the same structure again (a cache hit: planning and launch only).
    let small = Tensor::randn([1000]).to(gpu);
    small.realize();
    let chain = |x: &Tensor| (0..9).fold(x.clone(), |acc, i| (acc * 1.01 + f64::from(i)).tanh());
    let (_, first) = kiln::profile(|| chain(&small).realize().clone());
    rows.push(Row {
        workload: "NVRTC compile, 10-op kernel".into(),
        variant: "first call",
        ms: first.compile_time().as_secs_f64() * 1e3,
        gbps: None,
        gflops: None,
    });
    let ms = median_ms(|| {
        chain(&small).realize();
    });
    rows.push(Row {
        workload: "10-op kernel, 1000 elements".into(),
        variant: "cached call",
        ms,
        gbps: None,
        gflops: None,
    });

    if json {
        report::print(&rows, true, &format!("\"device\":\"{name}\""));
        return Ok(());
    }
    println!("kiln on {name}\n");
    report::print(&rows, false, "");
    let w1 = rows.iter().find(|r| r.workload == "W1" && r.variant == "fused");
    if let Some(w1) = w1.and_then(|r| r.gbps) {
        println!("\nW1 fused reaches {:.0}% of the device's copy bandwidth", 100.0 * w1 / copy);
    }
    Ok(())
}
