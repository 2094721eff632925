//! The recorded graph, as DOT: a snapshot makes any change to what is recorded visible.

use kiln::prelude::*;

#[test]
fn recorded_graph_snapshot() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
    let b = Tensor::from_vec(vec![0.5f32, -0.5, 1.0], [3]);
    let y = (x.t().matmul(&x) + 1.0).relu();
    let z = (&x + &b).exp().sum_dim(1, true) / 3.0;
    insta::assert_snapshot!(kiln::debug::graph_dot(&[&y, &z]));
}

#[test]
fn realized_tensors_become_inputs() {
    let x = Tensor::ones([4]);
    let y = (&x + 1.0).realize().clone();
    let dot = kiln::debug::graph_dot(&[&(&y * 2.0)]);
    assert!(!dot.contains("add"), "the realized add is an input now:\n{dot}");
    assert!(dot.contains("input"), "{dot}");
}
