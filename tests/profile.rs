//! `kiln::profile`, `kiln::debug::kernels` and the fused DOT: what they report matches what
//! ran.

use kiln::prelude::*;
use kiln::{Profile, StepKind};

fn program(x: &Tensor) -> Tensor {
    // One reduction kernel with its prologue, then an epilogue over the reduced rows.
    let rows = ((x * 2.0).exp() + 1.0).sum_dim(1, true);
    (x / &rows).relu()
}

#[test]
fn profile_counts_kernels_bytes_and_compiles() {
    let x = Tensor::randn([64, 33]);
    x.realize();
    let (y, fused) = kiln::profile(|| program(&x).realize().clone());
    assert_eq!(y.dims(), &[64, 33]);
    let kernels = fused.kernels();
    assert_eq!(fused.launches(), 2, "{fused}");
    assert_eq!((fused.realizations(), fused.plans()), (1, 1));
    assert!(kernels.iter().all(|k| k.kind == StepKind::Kernel && k.launches == 1));
    assert_eq!(kernels[0].ops, "mul exp add sum[1]");
    assert!(kernels[0].name.starts_with("k_"));
    // The first kernel reads x and writes 64 row sums; the second reads both, writes y.
    let (n, f32b) = (64 * 33, 4);
    assert_eq!(kernels[0].bytes_read, (n * f32b) as u64);
    assert_eq!(kernels[0].bytes_written, (64 * f32b) as u64);
    assert_eq!(kernels[1].bytes_read, ((n + 64) * f32b) as u64);
    assert_eq!(kernels[1].bytes_written, (n * f32b) as u64);
    assert_eq!(
        fused.bytes_moved(),
        kernels.iter().map(|k| k.bytes_read + k.bytes_written).sum::<u64>()
    );
    assert!(fused.wall_time() >= fused.step_time());
    // Every launch is either compiled now or served from the cache.
    for k in &kernels {
        assert_eq!(usize::from(!k.compile.is_zero()) + k.cache_hits, 1, "{k:?}");
    }
    // A second run of the same program compiles nothing.
    let (_, again) = kiln::profile(|| program(&x).realize().clone());
    assert!(again.compile_time().is_zero());
    assert_eq!(again.kernels().iter().map(|k| k.cache_hits).sum::<usize>(), 2);
    // Peak memory counts x, the row sums and y at least.
    assert!(fused.peak_memory().peak_bytes >= ((2 * n + 64) * f32b) as u64);

    let (_, unfused) = kiln::with_execution(kiln::Execution::Unfused, || {
        kiln::profile(|| program(&x).realize().clone())
    });
    assert_eq!(unfused.launches(), 6, "{unfused}");
    let table = Profile::compare(&fused, &unfused).to_string();
    assert!(table.contains("launches") && table.contains("speed-up"), "{table}");
    assert!(table.contains("mul exp add sum[1]"), "{table}");
    let shown = fused.to_string();
    assert!(shown.contains("total: 2 launches in 1 realizations (1 planned)"), "{shown}");
    assert!(shown.contains("peak memory"), "{shown}");
    assert!(kiln::machine_bandwidth() > 0.1);
}

#[test]
fn work_outside_the_closure_is_not_counted_and_reference_ops_are() {
    let x = Tensor::randn([10, 4]);
    let (_, nothing) = kiln::profile(|| program(&x)); // recorded, never realized inside
    assert_eq!(nothing.launches(), 0);
    let index = Tensor::from_vec(vec![3i64, 0, 0], [3]);
    let (_, p) = kiln::profile(|| x.index_select(0, &index).cumsum(0).realize().clone());
    let kinds: Vec<StepKind> = p.kernels().iter().map(|k| k.kind).collect();
    // Random fills, gathers and cumulative sums have native loops: nothing runs on the
    // reference executor...
    assert!(kinds.contains(&StepKind::Library) && !kinds.contains(&StepKind::Reference), "{p}");
    // ...unless a kernel cannot be compiled, and then its row says so.
    kiln::debug::fail_cpu_compiles(true);
    let (_, r) = kiln::profile(|| (&x * 1.732_050_8).exp().realize().clone());
    kiln::debug::fail_cpu_compiles(false);
    assert!(r.kernels().iter().any(|k| k.kind == StepKind::Reference), "{r}");
    let (_, m) = kiln::profile(|| x.matmul(&x.t()).realize().clone());
    assert!(m.kernels().iter().any(|k| k.kind == StepKind::Library && k.name == "matmul"), "{m}");
}

#[test]
fn the_chrome_trace_is_valid_json() {
    let x = Tensor::randn([16, 16]);
    let path = std::env::temp_dir().join(format!("kiln-trace-{}.json", std::process::id()));
    let (_, p) = kiln::profile(|| program(&x).sum().item::<f32>());
    p.to_chrome_trace(&path).expect("write");
    let text = std::fs::read_to_string(&path).expect("read");
    std::fs::remove_file(&path).expect("cleanup");
    let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    let events = v["traceEvents"].as_array().expect("traceEvents");
    assert_eq!(events.len(), p.events().len());
    assert!(events.iter().all(|e| e["ph"] == "X" && e["ts"].is_number() && e["dur"].is_number()));
    let names: Vec<&str> = events.iter().filter_map(|e| e["name"].as_str()).collect();
    assert_eq!(names[0], "plan");
    assert!(names.iter().any(|n| n.starts_with("k_")));
    assert!(
        events
            .iter()
            .any(|e| e["args"]["sources"].as_str().is_some_and(|s| s.contains("tests/profile.rs")))
    );
}

#[test]
fn kernels_returns_each_generated_kernel_once() {
    let x = Tensor::randn([8, 5]);
    x.realize();
    let (_, ks) = kiln::debug::kernels(|| {
        program(&x).realize();
        program(&x).realize(); // the same kernels again: listed once
    });
    assert_eq!(ks.len(), 2);
    assert_eq!(ks[0].ops, "mul exp add sum[1]");
    assert!(ks[0].text.contains("sum"), "{}", ks[0].text);
    let clif = ks[1].clif.as_deref().expect("clif");
    assert!(clif.starts_with("function"), "{clif}");
    assert!(ks.iter().all(|k| k.cuda.as_deref().is_some_and(|c| c.contains(&k.name))));

    let y = program(&x);
    let dot = kiln::debug::fused_dot(&[&y]);
    assert_eq!(dot.matches("subgraph cluster_").count(), 2, "{dot}");
    assert!(dot.contains(&ks[0].name), "{dot}");
    let unfused = kiln::with_execution(kiln::Execution::Unfused, || kiln::debug::fused_dot(&[&y]));
    assert_eq!(unfused.matches("subgraph cluster_").count(), 6, "{unfused}");
}

#[test]
fn gradient_kernels_name_the_forward_lines() {
    let x = Tensor::randn([6, 4]).requires_grad_(true);
    let w = Tensor::randn([4, 3]).requires_grad_(true);
    let loss = x.matmul(&w).tanh().sum_dim(1, false).exp().mean();
    let (_, p) = kiln::profile(|| loss.backward());
    let sources: Vec<String> =
        p.events().iter().flat_map(|e| e.sources.iter().map(ToString::to_string)).collect();
    assert!(!sources.is_empty());
    assert!(sources.iter().all(|s| s.starts_with("tests/profile.rs")), "{sources:?}");
}

/// A kernel that cannot be compiled is never a silent slow path: its ops still give the right
/// values (on the reference executor), and the failure is counted in `cache_stats`, listed
/// by `compile_failures` with the code generator's message, and noted on its profile row.
#[test]
fn a_failed_compile_is_visible() {
    let x = Tensor::from_vec((0..37).map(|i| i as f32 * 0.25).collect::<Vec<_>>(), [37]);
    x.realize();
    let before = kiln::debug::cache_stats().failures;
    kiln::debug::fail_cpu_compiles(true);
    // A constant no other test uses, so that this kernel is not cached already.
    let y = (&x * 1.918_273_6 + 0.5).tanh();
    let (values, kernels) = kiln::debug::kernels(|| y.to_vec::<f32>());
    kiln::debug::fail_cpu_compiles(false);
    for (i, v) in values.iter().enumerate() {
        let want = ((i as f64 * 0.25) * f64::from(1.918_273_6f32) + 0.5).tanh();
        assert!((f64::from(*v) - want).abs() < 1e-6, "{i}: {v} vs {want}");
    }
    assert!(kiln::debug::cache_stats().failures > before);
    let name = &kernels[0].name;
    assert!(kernels[0].clif.is_none(), "no machine code ran");
    assert!(
        kernels[0].cut.contains("could not be compiled, ran on the reference executor"),
        "{}",
        kernels[0].cut
    );
    let failures = kiln::debug::compile_failures();
    assert!(
        failures.iter().any(|(k, why)| k == name && why.contains("made to fail")),
        "{failures:?}"
    );
}

/// The oracle does not pass a kernel it could not check: a kernel that failed to compile ran
/// on the reference executor, so comparing it with the reference would compare the
/// reference with itself; it is counted as unchecked instead.
#[test]
fn the_oracle_counts_a_kernel_it_could_not_check() {
    let x = Tensor::from_vec((0..29).map(|i| i as f32 * 0.5).collect::<Vec<_>>(), [29]);
    x.realize();
    let before = kiln::debug::unchecked_kernel_runs();
    kiln::debug::fail_cpu_compiles(true);
    // A constant no other test uses, so that this kernel is not cached already.
    let y = (&x * 2.718_039_3 - 0.25).sigmoid();
    let values = kiln::with_check(|| y.to_vec::<f32>());
    kiln::debug::fail_cpu_compiles(false);
    assert_eq!(values.len(), 29);
    assert!(kiln::debug::unchecked_kernel_runs() > before);
}
