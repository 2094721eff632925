//! einsum against explicit loops over every letter.

use std::collections::BTreeMap;

use kiln::prelude::*;

use crate::common::*;

/// Evaluates an einsum by looping over every assignment of its letters (no ellipsis).
fn reference(eq: &str, data: &[Vec<f64>], shapes: &[Vec<usize>]) -> (Vec<usize>, Vec<f64>) {
    let (lhs, out) = eq.split_once("->").expect("explicit output in reference cases");
    let inputs: Vec<Vec<char>> = lhs.split(',').map(|s| s.chars().collect()).collect();
    let out: Vec<char> = out.chars().collect();
    let mut size: BTreeMap<char, usize> = BTreeMap::new();
    for (labels, shape) in inputs.iter().zip(shapes) {
        for (l, &d) in labels.iter().zip(shape) {
            size.insert(*l, d);
        }
    }
    let letters: Vec<char> = size.keys().copied().collect();
    let extents: Vec<usize> = letters.iter().map(|l| size[l]).collect();
    let out_shape: Vec<usize> = out.iter().map(|l| size[l]).collect();
    let mut result = vec![0.0; out_shape.iter().product()];
    for flat in 0..extents.iter().product::<usize>() {
        let assign = unravel(flat, &extents);
        let value = |l: &char| {
            assign[letters.iter().position(|x| x == l).expect("every letter has a position")]
        };
        let mut term = 1.0;
        for ((labels, shape), d) in inputs.iter().zip(shapes).zip(data) {
            let idx: Vec<usize> = labels.iter().map(value).collect();
            term *= d[ravel(&idx, shape)];
        }
        let o: Vec<usize> = out.iter().map(value).collect();
        result[ravel(&o, &out_shape)] += term;
    }
    (out_shape, result)
}

#[test]
fn einsum_matches_loops() {
    let mut rng = Rng::new(61);
    let cases: [(&str, &[&[usize]]); 14] = [
        ("ij->ji", &[&[3, 4]]),
        ("ij->", &[&[3, 4]]),
        ("ii->i", &[&[4, 4]]),
        ("iij->j", &[&[3, 3, 2]]),
        ("ij,jk->ik", &[&[3, 4], &[4, 5]]),
        ("i,i->", &[&[5], &[5]]),
        ("i,j->ij", &[&[3], &[4]]),
        ("bij,bjk->bik", &[&[2, 3, 4], &[2, 4, 5]]),
        ("bij,bkj->bik", &[&[2, 3, 4], &[2, 5, 4]]),
        ("ij,ij->i", &[&[3, 4], &[3, 4]]),
        ("abc,cd->dba", &[&[2, 3, 4], &[4, 2]]),
        ("ij,jk,kl->il", &[&[2, 3], &[3, 4], &[4, 5]]),
        ("ia,ib,ic->abc", &[&[3, 2], &[3, 2], &[3, 2]]),
        ("ij,jk,k->", &[&[2, 3], &[3, 4], &[4]]),
    ];
    for (eq, shapes) in cases {
        for layout in [Layout::Contiguous, Layout::Permuted] {
            let data: Vec<Vec<f64>> =
                shapes.iter().map(|s| values(&mut rng, s.iter().product(), DType::F64)).collect();
            let tensors: Vec<Tensor> =
                data.iter().zip(shapes).map(|(d, s)| make(d, s, DType::F64, layout)).collect();
            let refs: Vec<&Tensor> = tensors.iter().collect();
            let shapes: Vec<Vec<usize>> = shapes.iter().map(|s| s.to_vec()).collect();
            let (out_shape, want) = reference(eq, &data, &shapes);
            let got = kiln::einsum(eq, &refs);
            assert_eq!(got.dims(), out_shape.as_slice(), "{eq}");
            assert_close_tol(&got.to_vec::<f64>(), &want, 1e-12, &format!("{eq} {layout:?}"));
        }
    }
}

#[test]
fn implicit_output_and_ellipsis() {
    let a = Tensor::arange(0.0f64, 6.0, 1.0).view(&[2, 3]);
    let b = Tensor::arange(0.0f64, 12.0, 1.0).view(&[3, 4]);
    // Implicit output: letters appearing once, alphabetically.
    assert_eq!(kiln::einsum("ij,jk", &[&a, &b]).to_vec::<f64>(), a.matmul(&b).to_vec::<f64>());
    assert_eq!(kiln::einsum("ba", &[&a]).to_vec::<f64>(), a.t().to_vec::<f64>());
    // Ellipsis: batched matmul with broadcasting batch dimensions.
    let x = Tensor::randn([2, 1, 3, 4]).double();
    let y = Tensor::randn([5, 4, 2]).double();
    let got = kiln::einsum("...ij,...jk->...ik", &[&x, &y]);
    assert_eq!(got.dims(), &[2, 5, 3, 2]);
    assert_close_tol(&got.to_vec::<f64>(), &x.matmul(&y).to_vec::<f64>(), 1e-12, "ellipsis matmul");
    let s = kiln::einsum("...i->...", &[&x]);
    assert_close_tol(
        &s.to_vec::<f64>(),
        &x.sum_dim(-1, false).to_vec::<f64>(),
        1e-12,
        "ellipsis sum",
    );
    assert_eq!(kiln::einsum("i...->...", &[&x]).dims(), &[1, 3, 4]);
    // Any number of '...' dimensions (their labels are not digits).
    let dims: Vec<usize> = (0..12).map(|d| 1 + d % 2).collect();
    let many =
        Tensor::arange(0.0f64, 64.0, 1.0).view(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>());
    let same = kiln::try_einsum("...->...", &[&many]).unwrap();
    assert_eq!((same.dims(), same.to_vec::<f64>()), (&dims[..], many.to_vec::<f64>()));
    let summed = kiln::try_einsum("...i->...", &[&many]).unwrap();
    assert_eq!(summed.to_vec::<f64>(), many.sum_dim(-1, false).to_vec::<f64>());
    // Broadcast dimensions that disagree are named as such, not by an internal label.
    let err = kiln::try_einsum("...i,...i->...", &[&Tensor::zeros([2, 3]), &Tensor::zeros([4, 3])])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("dimension 1 from the right of '...' has size 4 in operand 1 but 2"),
        "{err}"
    );
}

#[test]
fn einsum_errors_name_the_problem() {
    let a = Tensor::zeros([2, 3]);
    let b = Tensor::zeros([4, 5]);
    let e = |eq: &str, ops: &[&Tensor]| kiln::try_einsum(eq, ops).unwrap_err().to_string();
    assert_eq!(
        e("ij,jk->ik", &[&a, &b]),
        "einsum: subscript 'j' has size 4 in operand 1 but 3 elsewhere (ij,jk->ik)"
    );
    assert_eq!(
        e("ijk->i", &[&a]),
        "einsum: operand 0 has 2 dimensions (shape [2, 3]) but 3 subscripts in \"ijk->i\""
    );
    assert_eq!(
        e("ij->ix", &[&a]),
        "einsum: output subscript 'x' does not appear in any operand in \"ij->ix\""
    );
    assert_eq!(
        e("ij->ii", &[&a]),
        "einsum: output subscript 'i' appears more than once in \"ij->ii\""
    );
    assert_eq!(
        e("ij,jk->ik", &[&a]),
        "einsum: 2 operand subscripts for 1 operands in \"ij,jk->ik\""
    );
    assert_eq!(
        e("i1->i", &[&a]),
        "einsum: invalid subscript '1' in operand 0: use letters a-z and A-Z in \"i1->i\""
    );
    assert_eq!(e("ij->i->j", &[&a]), "einsum: more than one '->' in \"ij->i->j\"");
    assert_eq!(e("i..j->i", &[&a]), "einsum: a malformed '...' in operand 0 in \"i..j->i\"");
    assert!(
        e("ij,jk->ik", &[&a, &Tensor::zeros([3, 2]).double()])
            .starts_with("einsum: operand 1 has dtype f64")
    );
    assert!(e("ii->i", &[&a]).starts_with(
        "einsum: subscript 'i' is repeated in one operand over dimensions of sizes 2 and 3"
    ));
}
