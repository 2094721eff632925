//! `kiln::linalg` against calling faer directly: on the same row-major data (what kiln adds:
//! recording and planning the op, reading the input, writing the result), and on the same
//! matrix in faer's own column-major layout (a faer user's best case). Everything runs
//! sequentially per matrix (kiln splits a batch's matrices across its threads; these rows
//! are one matrix each).
//!
//! ```sh
//! cargo run --release --example bench_linalg
//! ```

use std::time::{Duration, Instant};

use faer::linalg::solvers::{DenseSolveCore, Solve};
use faer::{MatRef, Side};
use kiln::linalg;
use kiln::prelude::*;

/// The median of `runs` timings of `f`, after one warm-up call.
fn median(runs: usize, mut f: impl FnMut()) -> Duration {
    f();
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2]
}

fn main() {
    kiln::manual_seed(0);
    println!(
        "| op | n | kiln (ms) | faer, same data (ms) | faer, column-major (ms) | kiln / same | kiln / column-major |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for n in [256usize, 512, 1024] {
        let a = Tensor::randn([n, n]).double() + Tensor::eye(n).double() * (n as f64).sqrt() * 2.0;
        let spd = a.matmul(&a.t()).realize().clone();
        let b = Tensor::randn([n, 16]).double().realize().clone();
        let (av, sv, bv) = (a.to_vec::<f64>(), spd.to_vec::<f64>(), b.to_vec::<f64>());
        // The same row-major data, as a user holding it would hand it to faer.
        let fa = MatRef::from_row_major_slice(&av, n, n);
        let fs = MatRef::from_row_major_slice(&sv, n, n);
        let fb = MatRef::from_row_major_slice(&bv, n, 16);
        let (ca, cs, cb) = (fa.to_owned(), fs.to_owned(), fb.to_owned());
        let runs = if n >= 1024 { 9 } else { 21 };
        let rows: [(&str, Duration, Duration, Duration); 4] = [
            (
                "inv",
                median(runs, || {
                    linalg::inv(&a).realize();
                }),
                median(runs, || {
                    std::hint::black_box(fa.partial_piv_lu().inverse());
                }),
                median(runs, || {
                    std::hint::black_box(ca.partial_piv_lu().inverse());
                }),
            ),
            (
                "solve (k = 16)",
                median(runs, || {
                    linalg::solve(&a, &b).realize();
                }),
                median(runs, || {
                    std::hint::black_box(fa.partial_piv_lu().solve(fb));
                }),
                median(runs, || {
                    std::hint::black_box(ca.partial_piv_lu().solve(&cb));
                }),
            ),
            (
                "cholesky",
                median(runs, || {
                    linalg::cholesky(&spd, false).realize();
                }),
                median(runs, || {
                    std::hint::black_box(
                        fs.llt(Side::Lower).expect("positive-definite").L().to_owned(),
                    );
                }),
                median(runs, || {
                    std::hint::black_box(
                        cs.llt(Side::Lower).expect("positive-definite").L().to_owned(),
                    );
                }),
            ),
            (
                "det",
                median(runs, || {
                    linalg::det(&a).realize();
                }),
                median(runs, || {
                    std::hint::black_box(fa.determinant());
                }),
                median(runs, || {
                    std::hint::black_box(ca.determinant());
                }),
            ),
        ];
        for (name, kiln, same, column) in rows {
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            let (k, s, c) = (ms(kiln), ms(same), ms(column));
            println!("| {name} | {n} | {k:.2} | {s:.2} | {c:.2} | {:.3} | {:.3} |", k / s, k / c);
        }
    }
}
