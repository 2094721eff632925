//! Printing, checked against what PyTorch prints for the same values.

use kiln::prelude::*;

#[test]
fn floats_print_like_pytorch() {
    let cases: Vec<(Tensor, &str)> = vec![
        (Tensor::from_vec(vec![1.0f32, 2.5], [2]), "tensor([1.0000, 2.5000])"),
        (Tensor::from_vec(vec![1.0f32, 2.0], [2]), "tensor([1., 2.])"),
        (Tensor::from_vec(vec![-1.0f32, 20.0], [2]), "tensor([-1., 20.])"),
        (Tensor::from_vec(vec![1e-5f64, 1.0], [2]), "tensor([1.0000e-05, 1.0000e+00], dtype=f64)"),
        (
            Tensor::from_vec(vec![1.0f32, 12345.0, 0.5], [3]),
            "tensor([1.0000e+00, 1.2345e+04, 5.0000e-01])",
        ),
        (
            Tensor::from_vec(vec![f32::NAN, f32::INFINITY, -1.5], [3]),
            "tensor([    nan,     inf, -1.5000])",
        ),
        (Tensor::scalar(3.5f32), "tensor(3.5000)"),
        (Tensor::zeros([0]), "tensor([])"),
        (Tensor::zeros([0, 3]), "tensor([], size=[0, 3])"),
        (Tensor::zeros([2, 2]).half(), "tensor([[0., 0.],\n        [0., 0.]], dtype=f16)"),
    ];
    for (t, want) in cases {
        assert_eq!(t.to_string(), want);
    }
}

#[test]
fn integers_and_bools_print_like_pytorch() {
    let m = Tensor::from_vec(vec![1i64, -20, 3, 4], [2, 2]);
    assert_eq!(m.to_string(), "tensor([[  1, -20],\n        [  3,   4]])");
    assert_eq!(Tensor::from_vec(vec![1i32, 2], [2]).to_string(), "tensor([1, 2], dtype=i32)");
    assert_eq!(Tensor::from_vec(vec![true, false], [2]).to_string(), "tensor([ True, False])");
}

#[test]
fn higher_ranks_separate_blocks_with_blank_lines() {
    let t = Tensor::arange(0i64, 8, 1).view(&[2, 2, 2]);
    assert_eq!(
        t.to_string(),
        "tensor([[[0, 1],\n         [2, 3]],\n\n        [[4, 5],\n         [6, 7]]])"
    );
}

#[test]
fn large_tensors_are_summarized() {
    let t = Tensor::arange(0.0f32, 2000.0, 1.0);
    assert_eq!(
        t.to_string(),
        "tensor([0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 1.9970e+03, 1.9980e+03,\n        1.9990e+03])"
    );
    let m = Tensor::arange(0i64, 1200, 1).view(&[40, 30]);
    let s = m.to_string();
    assert!(
        s.starts_with("tensor([[   0,    1,    2,  ...,   27,   28,   29],\n        [  30,"),
        "{s}"
    );
    assert!(s.contains("        ...,\n"), "{s}");
    assert!(s.ends_with("[1170, 1171, 1172,  ..., 1197, 1198, 1199]])"), "{s}");
    // Printing reads only the corners, but still realizes the tensor (a trigger): reading it
    // afterwards computes nothing again.
    let y = Tensor::arange(0.0f32, 3000.0, 1.0).reshape(&[3, 1000]).exp();
    let printed = y.to_string();
    assert!(printed.contains("..."), "{printed}");
    let (values, p) = kiln::profile(|| y.to_vec::<f32>());
    assert_eq!(p.launches(), 0, "printing realized the tensor:\n{p}");
    assert_eq!(values.len(), 3000);
}

#[test]
fn long_rows_wrap_at_80_columns() {
    let t = Tensor::arange(0.0f32, 30.0, 1.0) * 1.5;
    let s = t.to_string();
    assert!(s.lines().all(|l| l.len() <= 80), "{s}");
    assert!(s.starts_with("tensor([ 0.0000,  1.5000,  3.0000,"), "{s}");
    assert_eq!(s.lines().nth(1).map(|l| &l[..8]), Some("        "));
}
