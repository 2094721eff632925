//! kiln on an NVIDIA GPU: the benchmark workloads on the device, against the device's own
//! copy bandwidth measured in the same run, plus NVRTC compile and cached-launch latency.
//!
//! `cargo run --release --example gpu` prints a table; `-- --json` prints one JSON object per
//! line (`workload`, `variant`, `median_ms`, and `gbps` or `gflops`); `-- --quick` runs every
//! workload at a small size, to check that the whole benchmark runs (CI does so on the
//! emulated device). Without a CUDA device it says why and exits successfully.

use std::time::Instant;

#[path = "common/report.rs"]
mod report;

use kiln::Execution;
use kiln::prelude::*;
use report::Row;

/// Workload sizes: the benchmark's, or small ones for `--quick`.
struct Sizes {
    reps: usize,
    /// Elements of the elementwise chains and whole-tensor reductions.
    n: usize,
    /// Sides of the softmax matrices.
    softmax: [usize; 2],
    /// Side of the square matrix products.
    matmul: usize,
}

const FULL: Sizes = Sizes { reps: 9, n: 1 << 26, softmax: [4096, 16384], matmul: 4096 };
const QUICK: Sizes = Sizes { reps: 1, n: 1 << 16, softmax: [64, 300], matmul: 96 };

/// Median wall time of `f` in ms over `reps` runs, each ended by waiting for the device.
fn median_ms(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut run = || {
        let t = Instant::now();
        f();
        kiln::cuda::synchronize(0).expect("the device's work failed");
        t.elapsed().as_secs_f64() * 1e3
    };
    run(); // compile kernels, fill the allocator's cache
    let mut times: Vec<f64> = (0..reps).map(|_| run()).collect();
    times.sort_by(f64::total_cmp);
    times[reps / 2]
}

fn main() -> kiln::Result<()> {
    let json = std::env::args().any(|a| a == "--json");
    let size = if std::env::args().any(|a| a == "--quick") { QUICK } else { FULL };
    let reps = size.reps;
    if !kiln::cuda::is_available() {
        println!("no CUDA device: nothing to measure (kiln::cuda::device_count() is 0)");
        return Ok(());
    }
    let gpu = Device::Cuda(0);
    let name = kiln::cuda::describe(0)?;
    let mut rows = Vec::new();
    let gb = |bytes: f64, ms: f64| bytes / (ms * 1e-3) / 1e9;

    let copy_bytes = 4 * size.n;
    let copy = kiln::cuda::copy_bandwidth(0, copy_bytes, reps)?;
    rows.push(Row {
        workload: "copy".into(),
        variant: "ceiling",
        ms: 2.0 * copy_bytes as f64 / copy / 1e6,
        gbps: Some(copy),
        gflops: None,
    });

    // W1 and W1b over 64M f32 (256 MiB in, 256 MiB out).
    let n = size.n;
    kiln::manual_seed(0);
    let x = Tensor::randn([n]).to(gpu);
    let w1 =
        |x: &Tensor| ((x * 1.5 + 0.5).tanh() * x.sigmoid() + (x - 0.2).relu()) / (x.square() + 1.0);
    let w1b = |x: &Tensor| ((x * 1.5 + 0.5) * x + (x - 0.2).relu()) / (x.square() + 1.0);
    for (workload, f) in [("W1", &w1 as &dyn Fn(&Tensor) -> Tensor), ("W1b", &w1b)] {
        for (variant, mode) in [("fused", Execution::Fused), ("unfused", Execution::Unfused)] {
            let ms = median_ms(reps, || {
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

    // Whole-tensor reductions (split across blocks) and scans over the same vector.
    type Op = fn(&Tensor) -> Tensor;
    let whole: [(&str, Op); 4] = [
        ("sum", |x| x.sum()),
        ("mean of squares", |x| x.square().mean()),
        ("argmax", |x| x.argmax(0, false)),
        ("cumsum", |x| x.cumsum(0)),
    ];
    for (workload, f) in whole {
        let ms = median_ms(reps, || {
            f(&x).realize();
        });
        let written = if workload == "cumsum" { 4.0 * n as f64 } else { 0.0 };
        rows.push(Row {
            workload: format!("{workload}, {n} f32"),
            variant: "fused",
            ms,
            gbps: Some(gb(4.0 * n as f64 + written, ms)),
            gflops: None,
        });
    }
    drop(x);

    // W3: row softmax, 4096² and 16384².
    for side in size.softmax {
        let a = Tensor::randn([side, side]).to(gpu);
        for (variant, mode) in [("fused", Execution::Fused), ("unfused", Execution::Unfused)] {
            let ms = median_ms(reps, || {
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
        let side = size.matmul;
        let a = Tensor::randn([side, side]).to_dtype(dtype).to(gpu);
        let b = Tensor::randn([side, side]).to_dtype(dtype).to(gpu);
        a.realize();
        b.realize();
        let ms = median_ms(reps, || {
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
    let ms = median_ms(reps, || {
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
