//! In-place ops and aliasing: writes through views reach the base and every other alias,
//! lazily, with PyTorch's semantics.

use kiln::prelude::*;

use crate::common::*;

type Case = (&'static str, fn(&Tensor, &Tensor) -> Tensor, fn(f64, f64) -> f64);

#[test]
fn in_place_ops_match_the_out_of_place_ones() {
    let mut rng = Rng::new(51);
    for layout in LAYOUTS {
        let a = values(&mut rng, 12, DType::F64);
        let b = values(&mut rng, 4, DType::F64);
        let cases: [Case; 4] = [
            ("add_", |x, y| x.add_(y), |x, y| x + y),
            ("sub_", |x, y| x.sub_(y), |x, y| x - y),
            ("mul_", |x, y| x.mul_(y), |x, y| x * y),
            ("div_", |x, y| x.div_(y), |x, y| x / y),
        ];
        for (name, f, r) in cases {
            let x = make(&a, &[3, 4], DType::F64, layout);
            let returned = f(&x, &tensor(&b, &[4], DType::F64));
            let want: Vec<f64> = (0..12).map(|i| r(a[i], b[i % 4])).collect();
            assert_close(&x.to_vec::<f64>(), &want, DType::F64, &format!("{name} {layout:?}"));
            assert!(returned.shares_storage_with(&x));
        }
        let x = make(&a, &[3, 4], DType::F64, layout);
        x.clamp_(-1.0, 1.0);
        assert_eq!(x.to_vec::<f64>(), a.iter().map(|v| v.clamp(-1.0, 1.0)).collect::<Vec<_>>());
        let x = make(&a, &[3, 4], DType::F64, layout);
        x.relu_();
        assert_eq!(x.to_vec::<f64>(), a.iter().map(|v| v.max(0.0)).collect::<Vec<_>>());
        let x = make(&a, &[3, 4], DType::F64, layout);
        x.zero_();
        assert_eq!(x.to_vec::<f64>(), vec![0.0; 12]);
        x.fill_(2.5);
        assert_eq!(x.to_vec::<f64>(), vec![2.5; 12]);
        x.copy_(&tensor(&b, &[4], DType::F64));
        assert_eq!(x.to_vec::<f64>(), (0..12).map(|i| b[i % 4]).collect::<Vec<_>>());
        x.add_(1).mul_(2);
        assert_eq!(x.to_vec::<f64>(), (0..12).map(|i| (b[i % 4] + 1.0) * 2.0).collect::<Vec<_>>());
    }
}

#[test]
fn writing_through_a_view_changes_the_base() {
    let base = Tensor::zeros([3, 4]);
    base.view(&[4, 3]).i((0, 0)).fill_(999.0);
    assert_eq!(base.to_vec::<f32>()[0], 999.0);
    // Through a transposed, sliced view.
    let x = Tensor::arange(0i64, 12, 1).view(&[3, 4]);
    x.t().i((1..3, 0)).add_(100);
    assert_eq!(x.to_vec::<i64>(), vec![0, 101, 102, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
    // Every alias sees the write, including ones made before it.
    let x = Tensor::zeros([2, 3]);
    let row = x.i(1);
    let col = x.i((.., 2));
    x.i((1, 2)).fill_(7.0);
    assert_eq!(row.to_vec::<f32>(), vec![0.0, 0.0, 7.0]);
    assert_eq!(col.to_vec::<f32>(), vec![0.0, 7.0]);
}

#[test]
fn a_result_recorded_before_a_write_keeps_the_old_values() {
    // Write the base, then read a view recorded earlier in the same lazy graph.
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    let v = x.t();
    let before = v.exp(); // pending, reads the values as they are now
    x.add_(10.0);
    let after = v.exp();
    // Generated `exp` is within 2 ULP of the correctly rounded value.
    let close = |got: Vec<f32>, want: [f32; 4]| {
        got.iter().zip(want.map(f32::exp)).all(|(g, w)| (g - w).abs() <= 2.0 * f32::EPSILON * w)
    };
    assert!(close(before.to_vec::<f32>(), [1.0, 3.0, 2.0, 4.0]), "{before}");
    assert!(close(after.to_vec::<f32>(), [11.0, 13.0, 12.0, 14.0]), "{after}");
}

#[test]
fn two_views_written_alternately() {
    let x = Tensor::zeros([4]);
    let left = x.narrow(0, 0, 3);
    let right = x.narrow(0, 1, 3);
    left.add_(1.0);
    right.mul_(10.0);
    left.add_(1.0);
    right.add_(&left);
    // After: left += 1 -> [1,1,1,0]; right *= 10 -> [1,10,10,0]; left += 1 -> [2,11,11,0];
    // right += left (read before the write: [2,11,11]) -> [2,13,22,11].
    assert_eq!(x.to_vec::<f32>(), vec![2.0, 13.0, 22.0, 11.0]);
    assert_eq!(left.to_vec::<f32>(), vec![2.0, 13.0, 22.0]);
}

#[test]
fn in_place_errors() {
    let i = Tensor::from_vec(vec![1i64, 2], [2]);
    let err = i.try_div_(2).unwrap_err().to_string();
    assert_eq!(err, "div_: the result type f32 cannot be cast to the tensor's type i64 in place");
    let x = Tensor::zeros([3]);
    let err = x.try_add_(Tensor::zeros([2, 3])).unwrap_err().to_string();
    assert_eq!(
        err,
        "add_: the result has shape [2, 3] and cannot be written into a tensor of shape [3]"
    );
    let e = Tensor::zeros([3, 1]).expand(&[3, 4]);
    let err = e.try_add_(1.0).unwrap_err().to_string();
    assert!(err.starts_with("add_: several elements of this tensor (shape [3, 4], strides [1, 0]) share one memory location"), "{err}");
    let err = x.try_copy_(&Tensor::zeros([4])).unwrap_err().to_string();
    assert!(err.starts_with("copy_: shapes [4] and [3] cannot be broadcast"), "{err}");
    // An integer tensor keeps its dtype; a float fill is truncated, as in PyTorch.
    assert_eq!(i.fill_(2.7).to_vec::<i64>(), vec![2, 2]);
}

#[test]
fn copy_makes_an_independent_storage() {
    let x = Tensor::arange(0.0f32, 3.0, 1.0);
    let c = x.copy();
    assert!(!c.shares_storage_with(&x));
    c.add_(1.0);
    assert_eq!(x.to_vec::<f32>(), vec![0.0, 1.0, 2.0]);
    assert_eq!(c.to_vec::<f32>(), vec![1.0, 2.0, 3.0]);
}

#[test]
fn a_scatter_written_back_into_its_base_writes_in_place() {
    // A static cache's write: the old value is dead once the scatter has read it, so the
    // scatter writes into its buffer instead of a copy of it.
    let cache = Tensor::zeros([2, 8, 3]);
    let at = cache.data_ptr();
    let write = |pos: i64, value: f32| {
        let index = Tensor::from_vec(vec![pos], [1, 1, 1]).expand(&[2, 1, 3]);
        cache.copy_(&cache.scatter(1, &index, Tensor::full([2, 1, 3], value)));
    };
    let mut step = kiln::compile(|pos: &Tensor| {
        let index = pos.reshape(&[1, 1, 1]).expand(&[2, 1, 3]);
        cache.copy_(&cache.scatter(1, &index, Tensor::full([2, 1, 3], 5.0)));
        cache.sum()
    });
    write(0, 1.0);
    write(3, 2.0);
    assert_eq!(cache.data_ptr(), at, "eager");
    for pos in [4i64, 6] {
        step.call(&Tensor::from_vec(vec![pos], [1]));
    }
    assert_eq!(cache.data_ptr(), at, "compiled");
    let want: Vec<f32> = (0..2 * 8 * 3)
        .map(|i| match i / 3 % 8 {
            0 => 1.0,
            3 => 2.0,
            4 | 6 => 5.0,
            _ => 0.0,
        })
        .collect();
    assert_eq!(cache.to_vec::<f32>(), want);
    // A value something else still needs is not overwritten: the scatter copies.
    let held = cache.copy(); // pending: reads the values as they are now
    write(7, 9.0);
    cache.realize();
    assert_eq!(held.to_vec::<f32>(), want);
    assert_eq!(cache.narrow(1, 7, 1).to_vec::<f32>(), vec![9.0; 6]);
}

/// Writes into views of a computed tensor under autograd (PyTorch's `CopySlices`): through
/// narrow, select, a strided and a transposed view, a masked fill and a copy into a slice,
/// each the gradients of the base's history and of the written values, checked against
/// finite differences to first and second order.
#[test]
fn writes_into_views_differentiate_to_second_order() {
    use kiln::autograd::gradcheck;
    let mut rng = Rng::new(77);
    let x = tensor(&values(&mut rng, 12, DType::F64), &[3, 4], DType::F64);
    let w = tensor(&values(&mut rng, 4, DType::F64), &[4], DType::F64);
    let mask = Tensor::from_vec((0..12).map(|i| i % 5 == 1).collect::<Vec<bool>>(), [3, 4]);
    type Write = Box<dyn Fn(&Tensor, &Tensor)>;
    let writes: Vec<(&str, Write)> = vec![
        (
            "narrow add_",
            Box::new(|y, w| {
                y.narrow(1, 1, 2).add_(w.narrow(0, 0, 2).square());
            }),
        ),
        (
            "select mul_",
            Box::new(|y, w| {
                y.select(0, 1).mul_(w);
            }),
        ),
        (
            "strided copy_",
            Box::new(|y, w| {
                // Every other element of the flat storage: stride 2.
                y.reshape(&[6, 2]).select(1, 0).copy_(&w.narrow(0, 0, 3).repeat(&[2]).tanh());
            }),
        ),
        (
            "transposed sub_",
            Box::new(|y, w| {
                y.t().narrow(0, 2, 2).sub_(w.narrow(0, 1, 3).exp());
            }),
        ),
        (
            "a view that covers the whole storage",
            Box::new(|y, w| {
                y.reshape(&[3, 4]).narrow(0, 0, 3).mul_(w);
            }),
        ),
        (
            "two writes, overlapping",
            Box::new(|y, w| {
                y.narrow(0, 0, 2).mul_(w);
                y.narrow(1, 0, 1).fill_(0.5);
            }),
        ),
    ];
    for (name, write) in &writes {
        // y = x·x + 1 (computed), written through a view, then read whole.
        let f = |t: &[Tensor]| {
            let y = &t[0] * &t[0] + 1.0;
            write(&y, &t[1]);
            (&y * &y).sum()
        };
        gradcheck(f, &[x.clone(), w.clone()], 1e-6, 1e-6).unwrap_or_else(|e| panic!("{name}: {e}"));
        // Second order: the gradient of the first gradient.
        let first = |t: &[Tensor]| {
            let (a, b) = (t[0].clone(), t[1].clone());
            let g = kiln::grad(&[&f(&[a.clone(), b.clone()])], &[&a, &b], true);
            (&g[0] * &g[0]).sum() + (&g[1] * &g[1]).sum()
        };
        gradcheck(first, &[x.clone(), w.clone()], 1e-6, 1e-5)
            .unwrap_or_else(|e| panic!("{name}, second order: {e}"));
    }
    // A masked fill through a view; a slice of zeros that becomes a function of its values.
    gradcheck(
        |t| {
            let y = t[0].exp();
            y.narrow(0, 1, 2).masked_fill_(&mask.narrow(0, 1, 2), 0.0);
            y.sum()
        },
        std::slice::from_ref(&x),
        1e-6,
        1e-6,
    )
    .unwrap();
    let z = w.requires_grad_(true);
    let out = Tensor::zeros([3, 4]).double();
    out.select(0, 2).copy_(&(&z * 3.0));
    assert!(out.requires_grad());
    out.sum().backward();
    assert_eq!(z.grad().expect("a gradient").to_vec::<f64>(), vec![3.0; 4]);
}

/// A write under `no_grad` between two writes into views under autograd: the second builds
/// on the values the unrecorded write left, not on the value with history the first left.
#[test]
fn a_write_without_history_between_writes_into_views() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [4]).requires_grad_(true);
    let y = &x * 1.0;
    y.narrow(0, 0, 2).mul_(2.0);
    kiln::no_grad(|| {
        y.fill_(0.0);
    });
    y.narrow(0, 2, 2).add_(1.0);
    assert_eq!(y.to_vec::<f32>(), vec![0.0, 0.0, 1.0, 1.0]);
}
