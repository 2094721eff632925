//! Matrix-vector products over quantized weights (`kiln_runtime::quant::dot_rows`): a
//! 4096 x 4096 weight times one f32 vector, per type, on one thread and on every core, against
//! the time its bytes take to stream at the copy bandwidth measured in the same run (a decode
//! step's projections are this shape and are bound by it). Types with an integer product
//! (`dot_rows_int8`: Q8_0, Q4_0, Q4_K, Q6_K) are timed with it too, the activations'
//! quantization included.
//!
//! ```text
//! cargo run --release -p kiln-runtime --example bench_quant [-- --portable]
//! ```

use std::time::Instant;

use kiln_runtime::quant::{
    DotPath, GgmlType, activation_type, dequantized, dot_rows_int8_on, dot_rows_on, host_path,
    quantize,
};

const ROWS: usize = 4096;
const COLS: usize = 4096;
const RUNS: usize = 15;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Bytes of `kind` for the matrix, pseudo-random with finite scales where the layout puts
/// them at the start of a block (enough for timing: the values do not change the work).
fn weights(kind: GgmlType) -> Vec<u8> {
    let bytes = kind.bytes_of(ROWS * COLS).expect("whole blocks");
    let mut state = 1u32;
    (0..bytes)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            ((state >> 24) as u8) & 0x3b
        })
        .collect()
}

/// The median time of `product` over the rows split across `threads` threads (one call
/// per thread, each over its rows and outputs).
fn timed(w: &[u8], threads: usize, product: &(dyn Fn(&[u8], &mut [f32]) + Sync)) -> f64 {
    let row_bytes = w.len() / ROWS;
    let per = ROWS.div_ceil(threads);
    let mut out = vec![0f32; ROWS];
    median(
        (0..RUNS)
            .map(|_| {
                let t = Instant::now();
                std::thread::scope(|s| {
                    for (rows, out) in w.chunks(per * row_bytes).zip(out.chunks_mut(per)) {
                        s.spawn(move || product(rows, out));
                    }
                });
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

fn main() {
    let path =
        if std::env::args().any(|a| a == "--portable") { DotPath::Portable } else { host_path() };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Copy bandwidth: 256 MiB read and written (as memcpy), the best of five.
    let src = vec![1u8; 256 << 20];
    let mut dst = vec![0u8; 256 << 20];
    let copy = (0..5)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(&mut dst).copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&dst);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min);
    let bandwidth = 2.0 * src.len() as f64 / copy;
    println!(
        "{ROWS} x {COLS} weights times a vector, {path:?} loops, {threads} threads; copy bandwidth {:.1} GB/s",
        bandwidth / 1e9
    );
    println!(
        "{:<6} {:>7} {:>11} {:>10} {:>8} {:>11} {:>11} {:>8}",
        "type", "MB", "f32 1t ms", "f32 all ms", "x floor", "int8 1t ms", "int8 all ms", "x floor"
    );
    let x: Vec<f32> = (0..COLS).map(|i| ((i % 13) as f32 - 6.0) / 7.0).collect();
    // The weight block types (Q8_K holds activations).
    let weights_kinds = dequantized().filter(|&k| k.block().is_some_and(|b| b.0 > 1));
    for kind in weights_kinds.filter(|&k| k != GgmlType::Q8_K) {
        let w = weights(kind);
        let f32_product = |rows: &[u8], out: &mut [f32]| {
            dot_rows_on(path, kind, rows, &x, out).expect("a product");
        };
        let one = timed(&w, 1, &f32_product);
        let all = timed(&w, threads, &f32_product);
        let floor = w.len() as f64 / bandwidth;
        print!(
            "{:<6} {:>7.1} {:>11.2} {:>10.2} {:>8.2}",
            kind.name(),
            w.len() as f64 / 1e6,
            one * 1e3,
            all * 1e3,
            all / floor
        );
        // The integer product, plus quantizing the activations once (before the threads
        // start, as the op that does it runs before the product).
        if let Some(act) = activation_type(kind) {
            let mut a = vec![0u8; act.bytes_of(COLS).expect("whole blocks")];
            let quantizing = median(
                (0..RUNS)
                    .map(|_| {
                        let t = Instant::now();
                        quantize(act, std::hint::black_box(&x), &mut a).expect("activations");
                        t.elapsed().as_secs_f64()
                    })
                    .collect(),
            );
            let product = |rows: &[u8], out: &mut [f32]| {
                dot_rows_int8_on(path, kind, rows, &a, out).expect("a product");
            };
            let one = quantizing + timed(&w, 1, &product);
            let all = quantizing + timed(&w, threads, &product);
            print!(" {:>11.2} {:>11.2} {:>8.2}", one * 1e3, all * 1e3, all / floor);
        }
        println!();
    }
}
