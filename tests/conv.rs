//! Convolution and pooling against plain f64 loops, on odd sizes, strides, padding,
//! dilation and groups, with gradients checked by finite differences.

use kiln::autograd::gradcheck;
use kiln::nn::functional::{self as F, Conv2dOptions, Pool2dOptions};
use kiln::nn::{Conv2d, Flatten, MaxPool2d, Module};
use kiln::prelude::*;

use crate::common::*;

/// Every tap of PyTorch's conv2d (cross-correlation) over `x` `[n, c, h, w]` with a weight
/// `[o, c/g, kh, kw]`: `tap(out, x, w)` with the flat indices of an output element, the
/// input element it reads (padding skipped) and the weight element it multiplies.
fn for_each_tap(
    xs: [usize; 4],
    ws: [usize; 4],
    o: Conv2dOptions,
    mut tap: impl FnMut(usize, usize, usize),
) {
    let [n, c, h, w] = xs;
    let [oc, cg, kh, kw] = ws;
    let [oh, ow] = out_hw(xs, ws, o);
    for b in 0..n {
        for f in 0..oc {
            let group = f / (oc / o.groups);
            for i in 0..oh {
                for j in 0..ow {
                    for ci in 0..cg {
                        for u in 0..kh {
                            for v in 0..kw {
                                let y = (i * o.stride[0] + u * o.dilation[0]) as isize
                                    - o.padding[0] as isize;
                                let z = (j * o.stride[1] + v * o.dilation[1]) as isize
                                    - o.padding[1] as isize;
                                if y < 0 || z < 0 || y >= h as isize || z >= w as isize {
                                    continue;
                                }
                                let xi =
                                    ((b * c + group * cg + ci) * h + y as usize) * w + z as usize;
                                let wi = ((f * cg + ci) * kh + u) * kw + v;
                                tap(((b * oc + f) * oh + i) * ow + j, xi, wi);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The output's height and width.
fn out_hw(xs: [usize; 4], ws: [usize; 4], o: Conv2dOptions) -> [usize; 2] {
    let oh = (xs[2] + 2 * o.padding[0] - o.dilation[0] * (ws[2] - 1) - 1) / o.stride[0] + 1;
    let ow = (xs[3] + 2 * o.padding[1] - o.dilation[1] * (ws[3] - 1) - 1) / o.stride[1] + 1;
    [oh, ow]
}

/// PyTorch's conv2d as a loop: `x` `[n, c, h, w]`, `wt` `[o, c/g, kh, kw]`.
fn conv_ref(
    x: &[f64],
    xs: [usize; 4],
    wt: &[f64],
    ws: [usize; 4],
    bias: Option<&[f64]>,
    o: Conv2dOptions,
) -> (Vec<f64>, [usize; 4]) {
    let [oh, ow] = out_hw(xs, ws, o);
    let plane = oh * ow;
    let mut out: Vec<f64> =
        (0..xs[0] * ws[0] * plane).map(|i| bias.map_or(0.0, |b| b[(i / plane) % ws[0]])).collect();
    for_each_tap(xs, ws, o, |oi, xi, wi| out[oi] += x[xi] * wt[wi]);
    (out, [xs[0], ws[0], oh, ow])
}

fn pool_ref(x: &[f64], xs: [usize; 4], o: Pool2dOptions, max: bool) -> Vec<f64> {
    let [n, c, h, w] = xs;
    let [kh, kw] = o.kernel_size;
    let st = o.stride.unwrap_or(o.kernel_size);
    let oh = (h + 2 * o.padding[0] - o.dilation[0] * (kh - 1) - 1) / st[0] + 1;
    let ow = (w + 2 * o.padding[1] - o.dilation[1] * (kw - 1) - 1) / st[1] + 1;
    let mut out = Vec::new();
    for plane in 0..n * c {
        for i in 0..oh {
            for j in 0..ow {
                let mut acc = if max { f64::NEG_INFINITY } else { 0.0 };
                for u in 0..kh {
                    for v in 0..kw {
                        let y = (i * st[0] + u * o.dilation[0]) as isize - o.padding[0] as isize;
                        let z = (j * st[1] + v * o.dilation[1]) as isize - o.padding[1] as isize;
                        let inside = y >= 0 && z >= 0 && y < h as isize && z < w as isize;
                        let xv = if inside {
                            x[(plane * h + y as usize) * w + z as usize]
                        } else if max {
                            f64::NEG_INFINITY
                        } else {
                            0.0
                        };
                        acc = if max { acc.max(xv) } else { acc + xv };
                    }
                }
                out.push(if max { acc } else { acc / (kh * kw) as f64 });
            }
        }
    }
    out
}

#[test]
fn conv2d_matches_the_loop_in_every_configuration() {
    let mut rng = Rng::new(81);
    let cases: [([usize; 4], [usize; 4], Conv2dOptions); 6] = [
        ([2, 3, 7, 6], [4, 3, 3, 3], Conv2dOptions::default()),
        (
            [1, 2, 9, 8],
            [3, 2, 3, 2],
            Conv2dOptions { stride: [2, 3], padding: [1, 2], ..Default::default() },
        ),
        (
            [2, 4, 10, 9],
            [6, 2, 3, 3],
            Conv2dOptions { groups: 2, dilation: [2, 1], padding: [2, 1], ..Default::default() },
        ),
        (
            [1, 4, 5, 5],
            [4, 1, 3, 3],
            Conv2dOptions { groups: 4, padding: [1, 1], ..Default::default() },
        ),
        ([3, 5, 4, 4], [7, 5, 1, 1], Conv2dOptions::default()),
        (
            [1, 1, 3, 3],
            [1, 1, 3, 3],
            Conv2dOptions { stride: [5, 5], padding: [1, 1], ..Default::default() },
        ),
    ];
    for (xs, ws, o) in cases {
        for dtype in [DType::F32, DType::F64] {
            for layout in LAYOUTS {
                let dx = values(&mut rng, xs.iter().product(), dtype);
                let dw = values(&mut rng, ws.iter().product(), dtype);
                let db = values(&mut rng, ws[0], dtype);
                let x = make(&dx, &xs, dtype, layout);
                let w = tensor(&dw, &ws, dtype);
                let b = tensor(&db, &[ws[0]], dtype);
                let y = F::conv2d(&x, &w, Some(&b), o);
                let (want, shape) = conv_ref(&dx, xs, &dw, ws, Some(&db), o);
                assert_eq!(y.dims(), &shape, "{xs:?} {ws:?} {o:?}");
                let tol = if dtype == DType::F32 { 1e-5 } else { 1e-12 };
                assert_close_tol(
                    &read(&y, dtype),
                    &want,
                    tol,
                    &format!("{xs:?} {ws:?} {o:?} {layout:?}"),
                );
            }
        }
    }
}

#[test]
fn pooling_matches_the_loop() {
    let mut rng = Rng::new(82);
    let xs = [2, 3, 7, 9];
    let dx = values(&mut rng, xs.iter().product(), DType::F64);
    let x = tensor(&dx, &xs, DType::F64);
    let options = [
        Pool2dOptions::new([2, 2]),
        Pool2dOptions { stride: Some([1, 2]), ..Pool2dOptions::new([3, 3]) },
        Pool2dOptions { padding: [1, 1], ..Pool2dOptions::new([3, 2]) },
        Pool2dOptions { dilation: [2, 2], stride: Some([1, 1]), ..Pool2dOptions::new([2, 3]) },
    ];
    for o in options {
        assert_close_tol(
            &F::max_pool2d(&x, o).to_vec::<f64>(),
            &pool_ref(&dx, xs, o, true),
            0.0,
            &format!("max {o:?}"),
        );
        if o.dilation == [1, 1] {
            assert_close_tol(
                &F::avg_pool2d(&x, o).to_vec::<f64>(),
                &pool_ref(&dx, xs, o, false),
                1e-12,
                &format!("avg {o:?}"),
            );
        }
    }
}

#[test]
fn convolution_and_pooling_pass_gradcheck() {
    let mut rng = Rng::new(83);
    let x = tensor(&values(&mut rng, 2 * 4 * 5 * 6, DType::F64), &[2, 4, 5, 6], DType::F64);
    let w = tensor(&values(&mut rng, 6 * 2 * 3 * 2, DType::F64), &[6, 2, 3, 2], DType::F64);
    let b = tensor(&values(&mut rng, 6, DType::F64), &[6], DType::F64);
    let o = Conv2dOptions {
        stride: [2, 1],
        padding: [1, 1],
        dilation: [1, 2],
        groups: 2,
        ..Default::default()
    };
    gradcheck(|t| F::conv2d(&t[0], &t[1], Some(&t[2]), o), &[x.clone(), w, b], 1e-6, 1e-6).unwrap();
    // Overlapping windows (stride 1 < kernel 3): their gradients add up where they overlap.
    gradcheck(
        |t| {
            F::avg_pool2d(
                &t[0],
                Pool2dOptions {
                    stride: Some([1, 1]),
                    padding: [1, 1],
                    ..Pool2dOptions::new([3, 3])
                },
            )
        },
        std::slice::from_ref(&x),
        1e-6,
        1e-6,
    )
    .unwrap();
    // Max pooling on distinct values (no ties, where the gradient is not defined).
    let distinct: Vec<f64> = (0..2 * 4 * 5 * 6).map(|i| ((i * 37) % 241) as f64 / 10.0).collect();
    let xd = tensor(&distinct, &[2, 4, 5, 6], DType::F64);
    gradcheck(
        |t| {
            F::max_pool2d(
                &t[0],
                Pool2dOptions { stride: Some([1, 2]), ..Pool2dOptions::new([2, 2]) },
            )
        },
        &[xd],
        1e-6,
        1e-6,
    )
    .unwrap();
}

#[test]
fn a_small_cnn_trains_and_its_mistakes_are_errors() {
    kiln::manual_seed(5);
    let conv = Conv2d::new(1, 4, [3, 3], Conv2dOptions { padding: [1, 1], ..Default::default() });
    let pool = MaxPool2d(Pool2dOptions::new([2, 2]));
    let head = kiln::nn::Linear::new(4 * 4 * 4, 3);
    let x = Tensor::randn([6, 1, 8, 8]);
    let y = Tensor::from_vec(vec![0i64, 1, 2, 0, 1, 2], [6]);
    let mut params = kiln::nn::Parameters::parameters(&conv);
    params.extend(kiln::nn::Parameters::parameters(&head));
    let mut opt =
        kiln::optim::Sgd::new(params, kiln::optim::SgdConfig { lr: 0.1, ..Default::default() });
    let mut losses = Vec::new();
    for _ in 0..30 {
        use kiln::optim::Optimizer;
        opt.zero_grad();
        let h = Flatten.forward(&pool.forward(&conv.forward(&x).relu()));
        let loss = F::cross_entropy(&head.forward(&h), &y);
        loss.backward();
        opt.step();
        losses.push(loss.item::<f32>());
    }
    assert!(losses[29] < losses[0] * 0.5, "{losses:?}");
    let err = |r: kiln::Result<Tensor>| r.expect_err("a mistake").to_string();
    assert!(
        err(conv.try_forward(&Tensor::zeros([1, 2, 8, 8])))
            .starts_with("conv2d: the weight [4, 1, 3, 3] expects 1 input channels")
    );
    assert!(
        err(conv.try_forward(&Tensor::zeros([8, 8])))
            .starts_with("conv2d: expects a [N, C, H, W] batch")
    );
    assert!(
        err(F::try_max_pool2d(&Tensor::zeros([1, 1, 1, 1]), Pool2dOptions::new([2, 2])))
            .starts_with("max_pool2d: a window spanning 2 does not fit")
    );
    assert!(
        Conv2d::try_new(3, 4, [3, 3], Conv2dOptions { groups: 2, ..Default::default() }).is_err()
    );
}

/// What one conv–batch-norm–ReLU block compiles to: in evaluation mode the batch norm is a
/// per-channel scale and shift that fuses with the ReLU into one kernel after the product;
/// in training mode the batch statistics are reductions over the product's output.
#[test]
fn conv_bn_relu_block_kernel_snapshot() {
    use kiln::nn::{BatchNorm2d, Parameters, ReLU, Sequential};
    kiln::manual_seed(1);
    let mut conv = Conv2d::new(3, 4, [3, 3], Conv2dOptions::default().padding([1, 1]));
    conv.bias = None;
    let mut block = Sequential::new().with(conv).with(BatchNorm2d::new(4)).with(ReLU);
    let x = Tensor::randn([2, 3, 5, 5]);
    x.realize();
    let mut text = String::new();
    for (mode, training) in [("training", true), ("evaluation", false)] {
        block.set_training(training);
        let y = kiln::no_grad(|| block.forward(&x));
        let plan = kiln::debug::plan_summary(&[&y]);
        text += &format!("== {mode}: {} kernels, {} other ops\n", plan.kernels, plan.other_ops);
        for (note, kernel) in plan.kernel_notes.iter().zip(&plan.kernel_text) {
            text += &format!("-- {note}\n{kernel}\n");
        }
        y.realize(); // and, with it, the running statistics' update
    }
    insta::assert_snapshot!(text);
}

/// The whole batch meets the weight in one product per group (the columns hold the batch
/// beside the pixels), and the weight's gradient is one product over every image's pixels,
/// not a product per image summed afterwards.
#[test]
fn a_batch_of_images_is_one_product() {
    let x = Tensor::randn([4, 6, 7, 7]).requires_grad_(true);
    let w = Tensor::randn([8, 3, 3, 3]).requires_grad_(true);
    let y =
        F::conv2d(&x, &w, None, Conv2dOptions { groups: 2, stride: [2, 2], ..Default::default() });
    assert_eq!(y.dims(), &[4, 8, 3, 3]);
    let dot = kiln::debug::graph_dot(&[&y]);
    assert_eq!(dot.matches("matmul").count(), 1, "{dot}");
    assert!(dot.contains("[2, 27, 36]"), "groups x C/G·KH·KW x N·OH·OW columns:\n{dot}");
    let ran = backward_ran(&(&y * &y).sum());
    let products = ran.iter().filter(|(name, _)| *name == "matmul").count();
    assert_eq!(products, 2, "the weight's and the columns' gradients: {ran:?}");
    assert!(
        ran.iter().all(|(_, ops)| !ops.contains("sum")),
        "no sum over per-image products: {ran:?}"
    );
    assert!(ran.iter().any(|(name, _)| *name == "unview"), "col2im: {ran:?}");
}

/// The gradients of `sum(conv2d(x, w) · r)`: `(dx, dw)`, tap by tap.
fn conv_grads_ref(
    x: &[f64],
    xs: [usize; 4],
    wt: &[f64],
    ws: [usize; 4],
    r: &[f64],
    o: Conv2dOptions,
) -> (Vec<f64>, Vec<f64>) {
    let (mut dx, mut dw) = (vec![0.0; x.len()], vec![0.0; wt.len()]);
    for_each_tap(xs, ws, o, |oi, xi, wi| {
        dx[xi] += r[oi] * wt[wi];
        dw[wi] += r[oi] * x[xi];
    });
    (dx, dw)
}

/// Input and weight gradients against the loops at sizes whose columns' gradient (col2im)
/// is scattered in parallel parts, one per image, with groups, strides and padding.
#[test]
fn conv2d_gradients_match_the_loop_at_size() {
    let mut rng = Rng::new(82);
    let cases: [([usize; 4], [usize; 4], Conv2dOptions); 2] = [
        (
            [4, 6, 24, 25],
            [6, 3, 3, 3],
            Conv2dOptions { groups: 2, stride: [2, 1], padding: [1, 1], ..Default::default() },
        ),
        ([3, 5, 30, 30], [4, 5, 3, 3], Conv2dOptions { dilation: [2, 2], ..Default::default() }),
    ];
    for (xs, ws, o) in cases {
        for dtype in [DType::F32, DType::F64] {
            let dx = values(&mut rng, xs.iter().product(), dtype);
            let dw = values(&mut rng, ws.iter().product(), dtype);
            let x = tensor(&dx, &xs, dtype).requires_grad_(true);
            let w = tensor(&dw, &ws, dtype).requires_grad_(true);
            let y = F::conv2d(&x, &w, None, o);
            let r = values(&mut rng, y.numel(), dtype);
            (&y * &tensor(&r, y.dims(), dtype)).sum().backward();
            let (want_x, want_w) = conv_grads_ref(&dx, xs, &dw, ws, &r, o);
            let tol = if dtype == DType::F32 { 1e-4 } else { 1e-11 };
            let context = format!("{xs:?} {ws:?} {o:?} {dtype}");
            assert_close_tol(&read(&x.grad().unwrap(), dtype), &want_x, tol, &context);
            assert_close_tol(&read(&w.grad().unwrap(), dtype), &want_w, tol * 10.0, &context);
        }
    }
}
