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
