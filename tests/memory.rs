//! Deep graphs and long loops: walks and drops are iterative, and realized history is freed.

use kiln::prelude::*;

use crate::common::rss_bytes;

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

#[test]
fn realizing_a_graph_many_times_keeps_memory_flat() {
    let step = || {
        let x = Tensor::arange(0.0f32, 64.0, 1.0).view(&[8, 8]);
        let mut y = &x * 0.5;
        for _ in 0..18 {
            y = (&y + 1.0).relu();
        }
        y.t().sum().item::<f32>()
    };
    let expected = step();
    for _ in 0..5_000 {
        step();
    }
    let before = rss_bytes();
    for _ in 0..100_000 {
        assert_eq!(step(), expected);
    }
    let after = rss_bytes();
    // Allow for allocator noise, but not for growth proportional to the iterations (each
    // iteration touches over 5 KiB, so a leak would add hundreds of MiB).
    assert!(
        after < before + 8 * 1024 * 1024,
        "resident memory grew from {before} to {after} bytes"
    );
}
