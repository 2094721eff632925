//! Products of many rows with quantized weights (a prefill's projections): the input as
//! Q8_0 blocks times a weight packed once per product (`kiln_runtime::quant::pack_gemm`,
//! `gemm_int8`), against the f32 product of the same shape (`gemm`, as kiln's dense products
//! take it) and against dequantizing the weight first, on one thread and on every core
//! (rows split between threads, each packing its share of the weight's groups first).
//!
//! ```text
//! cargo run --release -p kiln-runtime --example bench_gemm_int8 [-- --portable]
//! ```

use std::time::Instant;

use kiln_runtime::quant::{
    GEMM_GROUP, GemmPath, GemmWeights, GgmlType, gemm_available, gemm_int8_on, pack_gemm,
    packed_group_bytes, quantize,
};

const RUNS: usize = 9;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn timed(mut f: impl FnMut()) -> f64 {
    median(
        (0..RUNS)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

fn f32_product(
    threads: usize,
    m: usize,
    n: usize,
    k: usize,
    x: &[f32],
    w: &[f32],
    out: &mut [f32],
) {
    let par = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
    // SAFETY: `x` is m x k, `w` is n x k (read as its transpose, k x n), `out` m x n, all
    // row-major and inside their vectors.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

fn main() {
    let path = if std::env::args().any(|a| a == "--portable") || !gemm_available() {
        GemmPath::Portable
    } else {
        GemmPath::Vnni
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("{path:?} loops; {threads} threads; times in ms (medians of {RUNS})");
    println!(
        "{:<22} {:>9} {:>9} {:>10} {:>10} {:>9} {:>9}",
        "m x n x k", "f32 1t", "f32 all", "int8 1t", "int8 all", "GMAC/s", "x f32"
    );
    let m = 512;
    for (n, k) in [(768, 768), (256, 768), (2048, 768), (768, 2048)] {
        let mut state = 7u32;
        let mut next = || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        let x: Vec<f32> = (0..m * k).map(|_| next()).collect();
        let wf: Vec<f32> = (0..n * k).map(|_| next()).collect();
        let rows: Vec<i8> = wf.iter().map(|&v| (v * 254.0) as i8).collect();
        let scales = vec![1.0 / 254.0; n];
        let weights = GemmWeights::Int8 { rows: &rows, scales: &scales };
        let mut out = vec![0f32; m * n];
        let f1 = timed(|| f32_product(1, m, n, k, &x, &wf, &mut out));
        let fa = timed(|| f32_product(threads, m, n, k, &x, &wf, &mut out));
        let group = packed_group_bytes(k).expect("whole blocks");
        let groups = n.div_ceil(GEMM_GROUP);
        let mut packed = vec![0u8; groups * group];
        let mut a = vec![0u8; GgmlType::Q8_0.bytes_of(m * k).expect("whole blocks")];
        let mut out = vec![0f32; m * groups * GEMM_GROUP];
        let cols = groups * GEMM_GROUP;
        let run = |threads: usize, packed: &mut [u8], a: &mut [u8], out: &mut [f32]| {
            // Quantize and pack split over the threads, then the rows.
            std::thread::scope(|s| {
                let per = groups.div_ceil(threads);
                for (i, p) in packed.chunks_mut(per * group).enumerate() {
                    s.spawn(move || pack_gemm(weights, k, i * per, p).expect("packs"));
                }
                let rows_per = m.div_ceil(threads);
                let row_bytes = a.len() / m;
                for (xs, a) in x.chunks(rows_per * k).zip(a.chunks_mut(rows_per * row_bytes)) {
                    s.spawn(move || quantize(GgmlType::Q8_0, xs, a).expect("quantizes"));
                }
            });
            let (packed, a) = (&*packed, &*a);
            std::thread::scope(|s| {
                let rows_per = m.div_ceil(threads);
                let row_bytes = a.len() / m;
                for (a, out) in a.chunks(rows_per * row_bytes).zip(out.chunks_mut(rows_per * cols))
                {
                    s.spawn(move || gemm_int8_on(path, a, packed, k, out).expect("fits"));
                }
            });
        };
        let i1 = timed(|| run(1, &mut packed, &mut a, &mut out));
        let ia = timed(|| run(threads, &mut packed, &mut a, &mut out));
        let pk = timed(|| pack_gemm(weights, k, 0, &mut packed).expect("packs"));
        let qz = timed(|| quantize(GgmlType::Q8_0, &x, &mut a).expect("quantizes"));
        eprintln!("  pack {:.3} ms, quantize {:.3} ms (one thread)", pk * 1e3, qz * 1e3);
        let macs = (m * n * k) as f64;
        println!(
            "{:<22} {:>9.2} {:>9.2} {:>10.2} {:>10.2} {:>9.1} {:>9.2}",
            format!("{m} x {n} x {k}"),
            f1 * 1e3,
            fa * 1e3,
            i1 * 1e3,
            ia * 1e3,
            macs / ia / 1e9,
            fa / ia
        );
    }
}
