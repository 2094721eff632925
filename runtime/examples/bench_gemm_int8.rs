//! Products of many rows with quantized weights (a prefill's projections), 512 rows times
//! each weight shape of the 125M Llama: the input quantized to Q8_0 blocks, the weight
//! packed (`kiln_runtime::quant::pack_gemm`) and multiplied (`gemm_int8`), all three timed
//! together, against the f32 product of the same shape (`gemm`, as kiln's dense products
//! take it), on every core (`RAYON_NUM_THREADS` sets how many); and the packing alone from a
//! Q8_0 weight in cache and from memory (a different copy each run, as a model's weights
//! are met).
//!
//! ```text
//! cargo run --release -p kiln-runtime --example bench_gemm_int8 [-- --portable]
//! ```

use std::time::Instant;

use kiln_runtime::quant::{
    GEMM_GROUP, GemmPath, GemmWeights, GgmlType, gemm_available, gemm_int8_on, pack_gemm_on,
    packed_group_bytes, quantize,
};

const RUNS: usize = 9;
const M: usize = 512;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The median time of `f`, in ms.
fn timed(mut f: impl FnMut()) -> f64 {
    let times = (0..RUNS).map(|_| {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64() * 1e3
    });
    median(times.collect())
}

/// `out = x · wᵀ` in f32 (`x` m × k, `w` n × k, row-major) on `threads` threads.
fn f32_product(
    threads: usize,
    (m, n, k): (usize, usize, usize),
    x: &[f32],
    w: &[f32],
    out: &mut [f32],
) {
    assert!(x.len() == m * k && w.len() == n * k && out.len() == m * n);
    let par = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
    // SAFETY: the operands are inside their vectors (checked above): `x` m × k and `out`
    // m × n row-major, `w` read as its transpose (k × n, column stride k).
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
    let portable = std::env::args().any(|a| a == "--portable") || !gemm_available();
    let path = if portable { GemmPath::Portable } else { GemmPath::Vnni };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("{path:?} loops, {threads} threads; ms, medians of {RUNS}");
    println!(
        "{:<16} {:>8} {:>8} {:>7} {:>6} {:>9} {:>11}",
        "m x n x k", "f32", "int8", "GMAC/s", "x f32", "pack q8_0", "from memory"
    );
    for (n, k) in [(768, 768), (256, 768), (2048, 768), (768, 2048)] {
        let mut state = 7u32;
        let mut next = || {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        let x: Vec<f32> = (0..M * k).map(|_| next()).collect();
        let w: Vec<f32> = (0..n * k).map(|_| next()).collect();
        let mut out = vec![0f32; M * n];
        let fa = timed(|| f32_product(threads, (M, n, k), &x, &w, &mut out));

        let rows: Vec<i8> = w.iter().map(|&v| (v * 254.0) as i8).collect();
        let scales = vec![1.0 / 254.0; n];
        let weights = GemmWeights::Int8 { rows: &rows, scales: &scales };
        let group = packed_group_bytes(k).expect("whole blocks");
        let groups = n.div_ceil(GEMM_GROUP);
        let mut packed = vec![0u8; groups * group];
        let mut a = vec![0u8; GgmlType::Q8_0.bytes_of(M * k).expect("whole blocks")];
        let mut out = vec![0f32; M * groups * GEMM_GROUP];
        // Quantizing and packing split over the threads (as the ops that do them are),
        // then the product (which splits itself over kiln's team).
        let ia = timed(|| {
            std::thread::scope(|s| {
                let per = groups.div_ceil(threads);
                for (i, p) in packed.chunks_mut(per * group).enumerate() {
                    s.spawn(move || pack_gemm_on(path, weights, k, i * per, p).expect("packs"));
                }
                let (rows_per, row_bytes) = (M.div_ceil(threads), a.len() / M);
                for (xs, a) in x.chunks(rows_per * k).zip(a.chunks_mut(rows_per * row_bytes)) {
                    s.spawn(move || quantize(GgmlType::Q8_0, xs, a).expect("quantizes"));
                }
            });
            gemm_int8_on(path, &a, &packed, k, &mut out).expect("sizes fit");
        });

        let mut q8 = vec![0u8; GgmlType::Q8_0.bytes_of(n * k).expect("whole blocks")];
        quantize(GgmlType::Q8_0, &w, &mut q8).expect("quantizes");
        let pack = |q8: &[u8], packed: &mut [u8]| {
            pack_gemm_on(path, GemmWeights::Blocks(GgmlType::Q8_0, q8), k, 0, packed)
                .expect("packs");
        };
        let hot = timed(|| pack(&q8, &mut packed));
        let copies: Vec<Vec<u8>> = (0..64).map(|_| q8.clone()).collect();
        let mut c = 0;
        let cold = timed(|| {
            c = (c + 1) % copies.len();
            pack(&copies[c], &mut packed);
        });
        println!(
            "{:<16} {fa:>8.2} {ia:>8.2} {:>7.1} {:>6.2} {hot:>9.3} {cold:>11.3}",
            format!("{M} x {n} x {k}"),
            (M * n * k) as f64 / ia / 1e6,
            fa / ia
        );
    }
}
