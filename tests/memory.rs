//! Deep graphs and long loops: walks and drops are iterative, and realized history is freed.

use kiln::prelude::*;

#[test]
fn a_100k_op_chain_records_realizes_and_drops_without_overflow() {
    // Run on a thread with a small stack, so that any recursion over the chain would fail.
    let worker = std::thread::Builder::new().stack_size(256 * 1024).spawn(|| {
        let mut x = Tensor::zeros([4]);
        for _ in 0..100_000 {
            x = &x + 1.0;
        }
        let v = x.to_vec::<f32>();
        assert_eq!(v, vec![100_000.0; 4]);
        // And a pending chain dropped without ever being realized.
        let mut y = Tensor::ones([2]);
        for _ in 0..100_000 {
            y = y.exp().log();
        }
        drop(y);
    });
    worker.expect("spawn").join().expect("the deep chain finishes on a 256 KiB stack");
}

/// A reshape of a computed buffer that an op needs whole (here a sort) is the same buffer
/// under a new shape: no copy kernel runs, and the values are those of the reshape.
#[test]
fn a_reshape_of_a_whole_buffer_shares_it() {
    let x = Tensor::randn([6, 7]);
    x.realize();
    let (order, profile) = kiln::profile(|| {
        let order = x.exp().reshape(&[42]).argsort(0, false);
        order.realize();
        order
    });
    let copies: Vec<&str> = profile
        .events()
        .iter()
        .filter(|e| e.ops.trim() == "view")
        .map(|e| e.name.as_str())
        .collect();
    assert!(copies.is_empty(), "copy kernels {copies:?}\n{profile}");
    let xs = x.to_vec::<f32>();
    let mut want: Vec<usize> = (0..42).collect();
    want.sort_by(|&a, &b| xs[a].exp().total_cmp(&xs[b].exp()));
    let got: Vec<usize> = order.to_vec::<i64>().iter().map(|&i| i as usize).collect();
    assert_eq!(got, want);
}
