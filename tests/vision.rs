//! The rest of the convolutional vocabulary against plain f64 loops written from PyTorch's
//! definitions: padding modes, conv1d, `same` convolutions, transposed convolutions,
//! unfold/fold, pooling with ceil_mode/count_include_pad/indices, adaptive pooling and
//! interpolation; each with a finite-difference gradient check on a non-contiguous input.

use kiln::autograd::gradcheck;
use kiln::nn::functional::{
    self as F, BatchNormOptions, Conv1dOptions, Conv2dOptions, ConvTranspose2dOptions, FoldOptions,
    InterpolateMode, PadMode, Pool2dOptions, Resize,
};
use kiln::nn::{Conv1d, ConvTranspose2d, Module};
use kiln::prelude::*;

use crate::common::*;

fn rand(rng: &mut Rng, shape: &[usize], layout: Layout) -> (Vec<f64>, Tensor) {
    let d = values(rng, shape.iter().product(), DType::F64);
    let t = make(&d, shape, DType::F64, layout);
    (d, t)
}

fn check(t: impl Fn(&[Tensor]) -> Tensor, inputs: &[Tensor]) {
    if let Err(e) = gradcheck(t, inputs, 1e-6, 1e-6) {
        panic!("{e}");
    }
}

/// PyTorch's source index of output position `i` along an axis of size `n` padded by `b`.
fn pad_source(i: usize, b: usize, n: usize, mode: PadMode) -> Option<usize> {
    let src = i as i64 - b as i64;
    let n = n as i64;
    let s = match mode {
        PadMode::Constant => return (0..n).contains(&src).then_some(src as usize),
        PadMode::Reflect if src < 0 => -src,
        PadMode::Reflect if src >= n => 2 * (n - 1) - src,
        PadMode::Replicate => src.clamp(0, n - 1),
        PadMode::Circular => src.rem_euclid(n),
        _ => src,
    };
    Some(s as usize)
}

/// `x` `[rows, n]` padded along its last dimension, or `[a, h, w]` along the last two.
fn pad_ref(x: &[f64], shape: [usize; 3], pads: [usize; 4], mode: PadMode, value: f64) -> Vec<f64> {
    let [a, h, w] = shape;
    let [l, r, t, b] = pads;
    let (oh, ow) = (h + t + b, w + l + r);
    let mut out = Vec::with_capacity(a * oh * ow);
    for p in 0..a {
        for i in 0..oh {
            for j in 0..ow {
                out.push(match (pad_source(i, t, h, mode), pad_source(j, l, w, mode)) {
                    (Some(y), Some(z)) => x[(p * h + y) * w + z],
                    _ => value,
                });
            }
        }
    }
    out
}

#[test]
fn pad_matches_the_loop_in_every_mode() {
    let mut rng = Rng::new(101);
    for mode in [PadMode::Constant, PadMode::Reflect, PadMode::Replicate, PadMode::Circular] {
        for (shape, pads) in [([6usize, 5, 7], [2usize, 3, 1, 4]), ([2, 3, 4], [3, 0, 0, 2])] {
            let (d, x) = rand(&mut rng, &[2, shape[0] / 2, shape[1], shape[2]], Layout::Sliced);
            let p: Vec<i64> = pads.iter().map(|&v| v as i64).collect();
            let y = F::pad(&x, &p, mode, 1.5);
            let want = pad_ref(&d, shape, pads, mode, 1.5);
            assert_close_tol(&y.to_vec::<f64>(), &want, 0.0, &format!("{mode:?} {pads:?}"));
        }
        let (_, x) = rand(&mut rng, &[2, 3, 4, 5], Layout::Permuted);
        check(|t| F::pad(&t[0], &[2, 1, 3, 1], mode, 0.0), &[x]);
    }
    // Negative constant padding crops; errors name the limits.
    let x = Tensor::arange(0.0f64, 12.0, 1.0).view(&[3, 4]);
    assert_eq!(
        F::pad(&x, &[-1, 0, 0, -2], PadMode::Constant, 0.0).to_vec::<f64>(),
        vec![1., 2., 3.]
    );
    let err = |r: kiln::Result<Tensor>| r.unwrap_err().to_string();
    assert!(
        err(F::try_pad(&x, &[4, 0], PadMode::Reflect, 0.0))
            .contains("it must be less than the size")
    );
    assert!(
        err(F::try_pad(&x, &[1, 1, 1], PadMode::Constant, 0.0))
            .starts_with("pad: padding [1, 1, 1] must hold (before, after) pairs")
    );
    assert!(F::try_pad(&x, &[5, 0], PadMode::Circular, 0.0).is_err());
}

#[test]
fn conv1d_and_same_and_padding_modes_match_the_loop() {
    let mut rng = Rng::new(102);
    // conv1d is conv2d of height 1: compare with an explicit loop.
    let (n, c, l, o, k) = (2, 4, 11, 6, 3);
    for opts in [
        Conv1dOptions { stride: 2, padding: 1, dilation: 2, groups: 2, ..Default::default() },
        Conv1dOptions { same: true, dilation: 2, ..Default::default() },
        Conv1dOptions { padding: 2, padding_mode: PadMode::Circular, ..Default::default() },
    ] {
        let (dx, x) = rand(&mut rng, &[n, c, l], Layout::Permuted);
        let cg = c / opts.groups;
        let (dw, w) = rand(&mut rng, &[o, cg, k], Layout::Contiguous);
        let y = F::conv1d(&x, &w, None, opts);
        let (lo, hi) = if opts.same {
            let t = opts.dilation * (k - 1);
            (t / 2, t - t / 2)
        } else {
            (opts.padding, opts.padding)
        };
        let ol = (l + lo + hi - opts.dilation * (k - 1) - 1) / opts.stride + 1;
        assert_eq!(y.dims(), &[n, o, ol], "{opts:?}");
        let mut want = vec![0.0; n * o * ol];
        for b in 0..n {
            for f in 0..o {
                let g = f / (o / opts.groups);
                for i in 0..ol {
                    let mut s = 0.0;
                    for ci in 0..cg {
                        for u in 0..k {
                            let pos = i * opts.stride + u * opts.dilation;
                            if let Some(src) = pad_source(pos, lo, l, opts.padding_mode) {
                                s +=
                                    dx[(b * c + g * cg + ci) * l + src] * dw[(f * cg + ci) * k + u];
                            }
                        }
                    }
                    want[(b * o + f) * ol + i] = s;
                }
            }
        }
        assert_close_tol(&y.to_vec::<f64>(), &want, 1e-12, &format!("{opts:?}"));
        check(|t| F::conv1d(&t[0], &t[1], None, opts), &[x, w]);
    }
    // 2-D `same` with an even kernel pads one more after, as PyTorch.
    let (_, x) = rand(&mut rng, &[1, 2, 6, 7], Layout::Sliced);
    let (_, w) = rand(&mut rng, &[3, 2, 2, 4], Layout::Contiguous);
    let same = F::conv2d(&x, &w, None, Conv2dOptions::default().same());
    assert_eq!(same.dims(), &[1, 3, 6, 7]);
    let explicit = F::conv2d(
        &F::pad(&x, &[1, 2, 0, 1], PadMode::Constant, 0.0),
        &w,
        None,
        Conv2dOptions::default(),
    );
    assert_close_tol(&same.to_vec::<f64>(), &explicit.to_vec::<f64>(), 1e-12, "same");
    let reflect = Conv2dOptions::default().padding([1, 2]).padding_mode(PadMode::Reflect);
    let want =
        F::conv2d(&F::pad(&x, &[2, 2, 1, 1], PadMode::Reflect, 0.0), &w, None, Default::default());
    assert_close_tol(
        &F::conv2d(&x, &w, None, reflect).to_vec::<f64>(),
        &want.to_vec::<f64>(),
        1e-12,
        "reflect",
    );
    assert!(F::try_conv2d(&x, &w, None, Conv2dOptions::default().same().stride([2, 2])).is_err());
    let layer = Conv1d::new(4, 5, 3, Conv1dOptions::default());
    assert_eq!(layer.forward(&Tensor::randn([2, 4, 8])).dims(), &[2, 5, 6]);
    assert!(
        layer
            .try_forward(&Tensor::randn([4, 8]))
            .unwrap_err()
            .to_string()
            .starts_with("conv1d: expects a [N, C, L] batch")
    );
}

#[test]
fn conv_transpose2d_matches_the_loop() {
    let mut rng = Rng::new(103);
    for o in [
        ConvTranspose2dOptions::default(),
        ConvTranspose2dOptions {
            stride: [2, 3],
            padding: [1, 0],
            output_padding: [1, 2],
            ..Default::default()
        },
        ConvTranspose2dOptions {
            groups: 2,
            dilation: [2, 1],
            padding: [1, 1],
            ..Default::default()
        },
    ] {
        let (n, c, h, w, og, kh, kw) = (2, 4, 3, 5, 3, 3, 2);
        let (dx, x) = rand(&mut rng, &[n, c, h, w], Layout::Permuted);
        let (dw, wt) = rand(&mut rng, &[c, og, kh, kw], Layout::Contiguous);
        let (db, b) = rand(&mut rng, &[og * o.groups], Layout::Contiguous);
        let y = F::conv_transpose2d(&x, &wt, Some(&b), o);
        let oc = og * o.groups;
        let size = |i: usize, len: usize, k: usize| {
            (len - 1) * o.stride[i] - 2 * o.padding[i]
                + o.dilation[i] * (k - 1)
                + o.output_padding[i]
                + 1
        };
        let (oh, ow) = (size(0, h, kh), size(1, w, kw));
        assert_eq!(y.dims(), &[n, oc, oh, ow], "{o:?}");
        let mut want = vec![0.0; n * oc * oh * ow];
        for (i, v) in want.iter_mut().enumerate() {
            *v = db[(i / (oh * ow)) % oc];
        }
        let cg = c / o.groups;
        for bi in 0..n {
            for ic in 0..c {
                for i in 0..h {
                    for j in 0..w {
                        for f in 0..og {
                            for u in 0..kh {
                                for v in 0..kw {
                                    let yy = (i * o.stride[0] + u * o.dilation[0]) as i64
                                        - o.padding[0] as i64;
                                    let zz = (j * o.stride[1] + v * o.dilation[1]) as i64
                                        - o.padding[1] as i64;
                                    if yy < 0 || zz < 0 || yy >= oh as i64 || zz >= ow as i64 {
                                        continue;
                                    }
                                    let ch = (ic / cg) * og + f;
                                    want[((bi * oc + ch) * oh + yy as usize) * ow + zz as usize] +=
                                        dx[((bi * c + ic) * h + i) * w + j]
                                            * dw[((ic * og + f) * kh + u) * kw + v];
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_close_tol(&y.to_vec::<f64>(), &want, 1e-12, &format!("{o:?}"));
        check(|t| F::conv_transpose2d(&t[0], &t[1], Some(&t[2]), o), &[x, wt, b]);
    }
    // It is the adjoint of conv2d: <conv(x), y> = <x, conv_transpose(y)>.
    let (_, x) = rand(&mut rng, &[1, 2, 7, 6], Layout::Contiguous);
    let (_, w) = rand(&mut rng, &[3, 2, 3, 3], Layout::Contiguous);
    let fwd = Conv2dOptions { stride: [2, 2], padding: [1, 1], ..Default::default() };
    let y = F::conv2d(&x, &w, None, fwd);
    let (_, g) = rand(&mut rng, y.dims(), Layout::Contiguous);
    let back = F::conv_transpose2d(
        &g,
        &w,
        None,
        ConvTranspose2dOptions {
            stride: [2, 2],
            padding: [1, 1],
            output_padding: [0, 1],
            ..Default::default()
        },
    );
    assert_eq!(back.dims(), x.dims());
    let lhs = (&y * &g).sum().item::<f64>();
    let rhs = (&x * &back).sum().item::<f64>();
    assert!((lhs - rhs).abs() < 1e-10, "{lhs} {rhs}");
    let up = ConvTranspose2d::new(
        4,
        2,
        [2, 2],
        ConvTranspose2dOptions { stride: [2, 2], ..Default::default() },
    );
    assert_eq!(up.forward(&Tensor::randn([1, 4, 3, 3])).dims(), &[1, 2, 6, 6]);
    assert!(
        up.try_forward(&Tensor::randn([1, 3, 3, 3]))
            .unwrap_err()
            .to_string()
            .starts_with("conv_transpose2d: the weight must be [C, O / groups, KH, KW] with C = 3")
    );
    assert!(
        F::try_conv_transpose2d(
            &Tensor::randn([1, 4, 3, 3]),
            &up.weight,
            None,
            ConvTranspose2dOptions { output_padding: [1, 1], ..Default::default() }
        )
        .is_err()
    );
}

#[test]
fn unfold_and_fold_match_the_loop_and_are_adjoint() {
    let mut rng = Rng::new(104);
    let o = FoldOptions { kernel_size: [2, 3], dilation: [2, 1], padding: [1, 1], stride: [1, 2] };
    let (n, c, h, w) = (2, 3, 6, 7);
    let (dx, x) = rand(&mut rng, &[n, c, h, w], Layout::Sliced);
    let cols = F::unfold(&x, o);
    let oh = (h + 2 - 2 - 1) + 1;
    let ow = (w + 2 - 2 - 1) / 2 + 1;
    assert_eq!(cols.dims(), &[n, c * 6, oh * ow]);
    let got = cols.to_vec::<f64>();
    for b in 0..n {
        for ch in 0..c {
            for u in 0..2 {
                for v in 0..3 {
                    for i in 0..oh {
                        for j in 0..ow {
                            let y = (i + u * 2) as i64 - 1;
                            let z = (j * 2 + v) as i64 - 1;
                            let inside = y >= 0 && z >= 0 && y < h as i64 && z < w as i64;
                            let want = if inside {
                                dx[((b * c + ch) * h + y as usize) * w + z as usize]
                            } else {
                                0.0
                            };
                            let row = ch * 6 + u * 3 + v;
                            assert_eq!(got[(b * c * 6 + row) * oh * ow + i * ow + j], want);
                        }
                    }
                }
            }
        }
    }
    // fold is unfold's adjoint: <unfold(x), y> = <x, fold(y)>.
    let (_, g) = rand(&mut rng, cols.dims(), Layout::Permuted);
    let folded = F::fold(&g, [h, w], o);
    assert_eq!(folded.dims(), &[n, c, h, w]);
    let lhs = (&cols * &g).sum().item::<f64>();
    let rhs = (&x * &folded).sum().item::<f64>();
    assert!((lhs - rhs).abs() < 1e-10, "{lhs} {rhs}");
    check(|t| F::unfold(&t[0], o), std::slice::from_ref(&x));
    check(|t| F::fold(&t[0], [h, w], o), &[g]);
    assert!(
        F::try_fold(&Tensor::zeros([1, 5, 4]), [3, 3], FoldOptions::new([2, 2]))
            .unwrap_err()
            .to_string()
            .starts_with("fold: columns of shape [1, 5, 4] do not fit")
    );
}

/// PyTorch's pooling along one axis: (start, end within input+padding, output count).
fn pool_out(size: usize, k: usize, s: usize, p: usize, d: usize, ceil: bool) -> usize {
    let span = d * (k - 1) + 1;
    let steps = size + 2 * p - span;
    let mut out = if ceil { steps.div_ceil(s) } else { steps / s } + 1;
    if ceil && (out - 1) * s >= size + p {
        out -= 1;
    }
    out
}

#[test]
fn pooling_options_match_the_loop() {
    let mut rng = Rng::new(105);
    let (n, c, h, w) = (2, 2, 7, 8);
    let (dx, x) = rand(&mut rng, &[n, c, h, w], Layout::Permuted);
    for o in [
        Pool2dOptions::new([3, 3]).stride([2, 2]).ceil_mode(true),
        Pool2dOptions::new([3, 2]).stride([2, 3]).padding([1, 1]).ceil_mode(true),
        Pool2dOptions::new([3, 3]).stride([2, 2]).padding([1, 1]).count_include_pad(false),
        Pool2dOptions::new([2, 3])
            .stride([3, 2])
            .padding([1, 1])
            .ceil_mode(true)
            .count_include_pad(false),
        Pool2dOptions::new([2, 2]).dilation([2, 3]).stride([1, 2]).padding([1, 1]),
    ] {
        let st = o.stride.unwrap();
        let oh = pool_out(h, o.kernel_size[0], st[0], o.padding[0], o.dilation[0], o.ceil_mode);
        let ow = pool_out(w, o.kernel_size[1], st[1], o.padding[1], o.dilation[1], o.ceil_mode);
        let (mut mx, mut ix, mut avg) = (vec![], vec![], vec![]);
        for plane in 0..n * c {
            for i in 0..oh {
                for j in 0..ow {
                    let (mut best, mut at, mut sum) = (f64::NEG_INFINITY, -1i64, 0.0);
                    for u in 0..o.kernel_size[0] {
                        for v in 0..o.kernel_size[1] {
                            let y = (i * st[0] + u * o.dilation[0]) as i64 - o.padding[0] as i64;
                            let z = (j * st[1] + v * o.dilation[1]) as i64 - o.padding[1] as i64;
                            if y < 0 || z < 0 || y >= h as i64 || z >= w as i64 {
                                continue;
                            }
                            let val = dx[(plane * h + y as usize) * w + z as usize];
                            sum += val;
                            if val > best {
                                (best, at) = (val, y * w as i64 + z);
                            }
                        }
                    }
                    mx.push(best);
                    ix.push(at);
                    // PyTorch's divisor: the window within input + padding, or within the input.
                    let div = |i: usize, k: usize, s: usize, p: usize, size: usize| {
                        let start = (i * s) as i64 - p as i64;
                        let end = (start + k as i64).min((size + p) as i64);
                        if o.count_include_pad {
                            end - start
                        } else {
                            end.min(size as i64) - start.max(0)
                        }
                    };
                    let dv = div(i, o.kernel_size[0], st[0], o.padding[0], h)
                        * div(j, o.kernel_size[1], st[1], o.padding[1], w);
                    avg.push(sum / dv as f64);
                }
            }
        }
        let (values, indices) = F::max_pool2d_with_indices(&x, o);
        assert_eq!(values.dims(), &[n, c, oh, ow], "{o:?}");
        assert_close_tol(&values.to_vec::<f64>(), &mx, 0.0, &format!("max {o:?}"));
        assert_eq!(indices.to_vec::<i64>(), ix, "indices {o:?}");
        assert_close_tol(&F::max_pool2d(&x, o).to_vec::<f64>(), &mx, 0.0, &format!("max {o:?}"));
        if o.dilation == [1, 1] {
            assert_close_tol(
                &F::avg_pool2d(&x, o).to_vec::<f64>(),
                &avg,
                1e-12,
                &format!("avg {o:?}"),
            );
            check(|t| F::avg_pool2d(&t[0], o), std::slice::from_ref(&x));
        }
        check(|t| F::max_pool2d_with_indices(&t[0], o).0, std::slice::from_ref(&x));
    }
}

#[test]
fn adaptive_pooling_matches_the_loop() {
    let mut rng = Rng::new(106);
    let (n, c, h, w) = (2, 3, 7, 10);
    let (dx, x) = rand(&mut rng, &[n, c, h, w], Layout::Sliced);
    for out in [[1usize, 1], [3, 4], [7, 5], [2, 10], [5, 3]] {
        let (mut mx, mut avg) = (vec![], vec![]);
        for plane in 0..n * c {
            for i in 0..out[0] {
                for j in 0..out[1] {
                    let (y0, y1) = (i * h / out[0], ((i + 1) * h).div_ceil(out[0]));
                    let (z0, z1) = (j * w / out[1], ((j + 1) * w).div_ceil(out[1]));
                    let vals: Vec<f64> = (y0..y1)
                        .flat_map(|y| (z0..z1).map(move |z| (y, z)))
                        .map(|(y, z)| dx[(plane * h + y) * w + z])
                        .collect();
                    mx.push(vals.iter().copied().fold(f64::NEG_INFINITY, f64::max));
                    avg.push(vals.iter().sum::<f64>() / vals.len() as f64);
                }
            }
        }
        assert_close_tol(
            &F::adaptive_avg_pool2d(&x, out).to_vec::<f64>(),
            &avg,
            1e-12,
            &format!("avg {out:?}"),
        );
        assert_close_tol(
            &F::adaptive_max_pool2d(&x, out).to_vec::<f64>(),
            &mx,
            0.0,
            &format!("max {out:?}"),
        );
        check(|t| F::adaptive_avg_pool2d(&t[0], out), std::slice::from_ref(&x));
        check(|t| F::adaptive_max_pool2d(&t[0], out), std::slice::from_ref(&x));
    }
    assert!(F::try_adaptive_avg_pool2d(&x, [0, 2]).is_err());
}

/// PyTorch's bilinear source position and weights along one axis.
fn linear_src(d: usize, n_in: usize, n_out: usize, scale: f64, align: bool) -> (usize, usize, f64) {
    let src = if align {
        if n_out > 1 { d as f64 * (n_in - 1) as f64 / (n_out - 1) as f64 } else { 0.0 }
    } else {
        ((d as f64 + 0.5) * scale - 0.5).max(0.0)
    };
    let i0 = (src.floor() as usize).min(n_in - 1);
    (i0, (i0 + 1).min(n_in - 1), src - i0 as f64)
}

#[test]
fn interpolate_matches_the_loop() {
    let mut rng = Rng::new(107);
    let (n, c, h, w) = (2, 2, 5, 4);
    let (dx, x) = rand(&mut rng, &[n, c, h, w], Layout::Permuted);
    for (size, mode, align) in [
        (Resize::Size([9, 7]), InterpolateMode::Nearest, false),
        (Resize::Size([3, 2]), InterpolateMode::Nearest, false),
        (Resize::Scale([2.0, 1.5]), InterpolateMode::Nearest, false),
        (Resize::Size([8, 7]), InterpolateMode::Bilinear, false),
        (Resize::Size([8, 7]), InterpolateMode::Bilinear, true),
        (Resize::Size([3, 1]), InterpolateMode::Bilinear, true),
        (Resize::Scale([0.5, 2.0]), InterpolateMode::Bilinear, false),
    ] {
        let (out, scale) = match size {
            Resize::Size(s) => (s, [h as f64 / s[0] as f64, w as f64 / s[1] as f64]),
            Resize::Scale(f) => {
                ([(h as f64 * f[0]) as usize, (w as f64 * f[1]) as usize], [1.0 / f[0], 1.0 / f[1]])
            }
        };
        let mut want = vec![];
        for plane in 0..n * c {
            for i in 0..out[0] {
                for j in 0..out[1] {
                    let at = |y: usize, z: usize| dx[(plane * h + y) * w + z];
                    want.push(match mode {
                        InterpolateMode::Nearest => {
                            let y = ((i as f64 * scale[0]).floor() as usize).min(h - 1);
                            let z = ((j as f64 * scale[1]).floor() as usize).min(w - 1);
                            at(y, z)
                        }
                        InterpolateMode::Bilinear => {
                            let (y0, y1, ly) = linear_src(i, h, out[0], scale[0], align);
                            let (z0, z1, lz) = linear_src(j, w, out[1], scale[1], align);
                            (1.0 - ly) * ((1.0 - lz) * at(y0, z0) + lz * at(y0, z1))
                                + ly * ((1.0 - lz) * at(y1, z0) + lz * at(y1, z1))
                        }
                    });
                }
            }
        }
        let y = F::interpolate(&x, size, mode, align);
        assert_eq!(y.dims(), &[n, c, out[0], out[1]]);
        assert_close_tol(&y.to_vec::<f64>(), &want, 1e-12, &format!("{size:?} {mode:?} {align}"));
        check(|t| F::interpolate(&t[0], size, mode, align), std::slice::from_ref(&x));
    }
    assert!(F::try_interpolate(&x, Resize::Size([4, 4]), InterpolateMode::Nearest, true).is_err());
    assert!(
        F::try_interpolate(&x, Resize::Scale([0.0, 1.0]), InterpolateMode::Nearest, false).is_err()
    );
}

/// Agreement with PyTorch itself (the convolutional ops, and the activations and norms of
/// transformer code): `scripts/torch_fixtures.py` wrote PyTorch's float64
/// outputs and input gradients (of `sum(out * r)` for a random `r`) for each op; kiln must
/// reproduce them from the same inputs.
#[test]
fn every_op_agrees_with_pytorch_float64() {
    use std::collections::HashMap;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/torch_vision.safetensors");
    let file: HashMap<String, Tensor> =
        kiln::serialize::load(&path).expect("the fixture file").into_iter().collect();
    let get =
        |name: &str| file.get(name).unwrap_or_else(|| panic!("{name} is in the fixture")).clone();
    let t = ConvTranspose2dOptions {
        stride: [2, 3],
        padding: [1, 0],
        output_padding: [1, 2],
        groups: 2,
        dilation: [2, 1],
    };
    let fold_o =
        FoldOptions { kernel_size: [2, 3], dilation: [2, 1], padding: [1, 1], stride: [1, 2] };
    type Op = Box<dyn Fn(&[Tensor]) -> Tensor>;
    let cases: Vec<(&str, Op)> = vec![
        (
            "conv2d",
            Box::new(|i| {
                F::conv2d(
                    &i[0],
                    &i[1],
                    Some(&i[2]),
                    Conv2dOptions {
                        stride: [2, 1],
                        padding: [1, 1],
                        dilation: [1, 2],
                        groups: 2,
                        ..Default::default()
                    },
                )
            }),
        ),
        (
            "conv2d_reflect",
            Box::new(|i| {
                F::conv2d(
                    &i[0],
                    &i[1],
                    None,
                    Conv2dOptions::default().padding([1, 2]).padding_mode(PadMode::Reflect),
                )
            }),
        ),
        (
            "conv2d_same",
            Box::new(|i| {
                F::conv2d(&i[0], &i[1], None, Conv2dOptions::default().same().dilation([1, 2]))
            }),
        ),
        (
            "conv1d",
            Box::new(|i| {
                F::conv1d(
                    &i[0],
                    &i[1],
                    None,
                    Conv1dOptions {
                        stride: 2,
                        padding: 1,
                        dilation: 2,
                        groups: 2,
                        ..Default::default()
                    },
                )
            }),
        ),
        ("conv_transpose2d", Box::new(move |i| F::conv_transpose2d(&i[0], &i[1], Some(&i[2]), t))),
        (
            "max_pool2d",
            Box::new(|i| {
                F::max_pool2d(
                    &i[0],
                    Pool2dOptions::new([3, 3]).stride([2, 2]).padding([1, 1]).ceil_mode(true),
                )
            }),
        ),
        (
            "avg_pool2d",
            Box::new(|i| {
                F::avg_pool2d(
                    &i[0],
                    Pool2dOptions::new([3, 2])
                        .stride([2, 3])
                        .padding([1, 1])
                        .ceil_mode(true)
                        .count_include_pad(false),
                )
            }),
        ),
        (
            "avg_pool2d_pad",
            Box::new(|i| {
                F::avg_pool2d(
                    &i[0],
                    Pool2dOptions::new([3, 3]).stride([2, 2]).padding([1, 1]).ceil_mode(true),
                )
            }),
        ),
        ("adaptive_avg_pool2d", Box::new(|i| F::adaptive_avg_pool2d(&i[0], [3, 4]))),
        ("adaptive_max_pool2d", Box::new(|i| F::adaptive_max_pool2d(&i[0], [5, 4]))),
        (
            "bilinear",
            Box::new(|i| {
                F::interpolate(&i[0], Resize::Size([9, 7]), InterpolateMode::Bilinear, false)
            }),
        ),
        (
            "bilinear_align",
            Box::new(|i| {
                F::interpolate(&i[0], Resize::Size([9, 7]), InterpolateMode::Bilinear, true)
            }),
        ),
        (
            "bilinear_scale",
            Box::new(|i| {
                F::interpolate(&i[0], Resize::Scale([0.5, 2.0]), InterpolateMode::Bilinear, false)
            }),
        ),
        (
            "nearest_scale",
            Box::new(|i| {
                F::interpolate(&i[0], Resize::Scale([2.0, 1.5]), InterpolateMode::Nearest, false)
            }),
        ),
        (
            "nearest_size",
            Box::new(|i| {
                F::interpolate(&i[0], Resize::Size([4, 9]), InterpolateMode::Nearest, false)
            }),
        ),
        ("pad_reflect", Box::new(|i| F::pad(&i[0], &[2, 1, 1, 2], PadMode::Reflect, 0.0))),
        ("pad_replicate", Box::new(|i| F::pad(&i[0], &[2, 1, 1, 2], PadMode::Replicate, 0.0))),
        ("pad_circular", Box::new(|i| F::pad(&i[0], &[2, 1, 1, 2], PadMode::Circular, 0.0))),
        ("unfold", Box::new(move |i| F::unfold(&i[0], fold_o))),
        ("fold", Box::new(move |i| F::fold(&i[0], [7, 6], fold_o))),
        ("group_norm", Box::new(|i| F::group_norm(&i[0], 2, Some(&i[1]), Some(&i[2]), 1e-5))),
        ("silu", Box::new(|i| i[0].silu())),
        ("gelu_tanh", Box::new(|i| i[0].gelu_tanh())),
        ("softplus", Box::new(|i| i[0].softplus(2.0, 5.0))),
        ("leaky_relu", Box::new(|i| i[0].leaky_relu(0.1))),
        ("elu", Box::new(|i| i[0].elu(1.5))),
        ("log1p", Box::new(|i| i[0].abs().log1p())),
        ("expm1", Box::new(|i| i[0].expm1())),
        ("rms_norm", Box::new(|i| F::rms_norm(&i[0], &[7], Some(&i[1]), None))),
    ];
    let check_case = |name: &str, op: &dyn Fn(&[Tensor]) -> Tensor| {
        let inputs: Vec<Tensor> = (0..)
            .map_while(|k| {
                file.get(&format!("{name}.in{k}")).map(|t| t.detach().requires_grad_(true))
            })
            .collect();
        let y = op(&inputs);
        let want = get(&format!("{name}.out"));
        assert_eq!(y.dims(), want.dims(), "{name}");
        assert_close_tol(&y.to_vec::<f64>(), &want.to_vec::<f64>(), 1e-12, name);
        let loss = (&y * &get(&format!("{name}.r"))).sum();
        let grads = kiln::grad(&[&loss], &inputs.iter().collect::<Vec<_>>(), false);
        for (k, g) in grads.iter().enumerate() {
            let want = get(&format!("{name}.grad{k}")).to_vec::<f64>();
            assert_close_tol(&g.to_vec::<f64>(), &want, 1e-12, &format!("{name} gradient {k}"));
        }
    };
    for (name, op) in &cases {
        check_case(name, op.as_ref());
    }
    let x = get("max_pool2d.in0");
    let (_, idx) = F::max_pool2d_with_indices(
        &x,
        Pool2dOptions::new([3, 3]).stride([2, 2]).padding([1, 1]).ceil_mode(true),
    );
    assert_eq!(idx.to_vec::<i64>(), get("max_pool2d.indices").to_vec::<i64>());
    // Batch norm in training mode, and the running statistics it leaves behind.
    let (rm, rv) =
        (get("batch_norm.running_mean_before").copy(), get("batch_norm.running_var_before").copy());
    let train = BatchNormOptions { training: true, momentum: 0.3, eps: 1e-5 };
    check_case("batch_norm", &|i: &[Tensor]| {
        F::batch_norm(&i[0], Some(&rm), Some(&rv), Some(&i[1]), Some(&i[2]), train)
    });
    // That forward moved `rm`/`rv` once; check one update from fresh copies, by value.
    let (rm1, rv1) =
        (get("batch_norm.running_mean_before").copy(), get("batch_norm.running_var_before").copy());
    let i = [get("batch_norm.in0"), get("batch_norm.in1"), get("batch_norm.in2")];
    F::batch_norm(&i[0], Some(&rm1), Some(&rv1), Some(&i[1]), Some(&i[2]), train).realize();
    assert_close_tol(
        &rm1.to_vec::<f64>(),
        &get("batch_norm.running_mean").to_vec::<f64>(),
        1e-12,
        "running mean",
    );
    assert_close_tol(
        &rv1.to_vec::<f64>(),
        &get("batch_norm.running_var").to_vec::<f64>(),
        1e-12,
        "running var",
    );
}

device_test!(
    convolution_and_pooling_match_the_reference,
    super::convolution_and_pooling_match_the_reference_on
);

/// A grouped, strided convolution, max and average pooling and the input gradient on
/// `device`, in f64, against the reference executor.
fn convolution_and_pooling_match_the_reference_on(device: Device) {
    use kiln::nn::functional::{self as F, Conv2dOptions, Pool2dOptions};
    let mut rng = Rng::new(84);
    let x = tensor(&values(&mut rng, 2 * 4 * 7 * 6, DType::F64), &[2, 4, 7, 6], DType::F64);
    let w = tensor(&values(&mut rng, 6 * 2 * 3 * 3, DType::F64), &[6, 2, 3, 3], DType::F64);
    let o = Conv2dOptions { stride: [2, 1], padding: [1, 1], groups: 2, ..Default::default() };
    let p = Pool2dOptions { stride: Some([1, 1]), padding: [1, 1], ..Pool2dOptions::new([3, 3]) };
    let run = |x: &Tensor, w: &Tensor| {
        let x = x.requires_grad_(true);
        let y = F::max_pool2d(&F::conv2d(&x, w, None, o), p) + F::avg_pool2d(&x, p).sum();
        let g = kiln::grad(&[&y.sum()], &[&x], false).remove(0);
        (y.to_vec::<f64>(), g.to_vec::<f64>())
    };
    let (want, want_g) = kiln::with_execution(kiln::Execution::Reference, || run(&x, &w));
    let (got, got_g) = run(&x.to(device).detach(), &w.to(device));
    assert_close_tol(&got, &want, 1e-12, "conv and pool values");
    assert_close_tol(&got_g, &want_g, 1e-12, "conv and pool gradients");
}

device_test!(
    vision_ops_and_batch_norm_match_the_reference,
    super::vision_ops_and_batch_norm_match_the_reference_on
);

/// The rest of the convolutional vocabulary on `device`: transposed convolution (col2im),
/// padding modes, interpolation, adaptive pooling, pooling indices, group norm, and a batch
/// norm layer moved to the device with its buffers, updating them there; against the
/// reference executor.
fn vision_ops_and_batch_norm_match_the_reference_on(device: Device) {
    use kiln::nn::functional::{
        self as F, ConvTranspose2dOptions, InterpolateMode, PadMode, Pool2dOptions, Resize,
    };
    use kiln::nn::{BatchNorm2d, Module, Parameters};
    let mut rng = Rng::new(85);
    let x = tensor(&values(&mut rng, 2 * 4 * 5 * 6, DType::F64), &[2, 4, 5, 6], DType::F64);
    let w = tensor(&values(&mut rng, 4 * 3 * 3 * 2, DType::F64), &[4, 3, 3, 2], DType::F64);
    let run = |x: &Tensor, w: &Tensor| {
        let x = x.requires_grad_(true);
        let t = ConvTranspose2dOptions {
            stride: [2, 2],
            padding: [1, 0],
            output_padding: [1, 1],
            ..Default::default()
        };
        let parts = [
            F::conv_transpose2d(&x, w, None, t).square().sum(),
            F::pad(&x, &[2, 1, 1, 2], PadMode::Reflect, 0.0).sin().sum(),
            F::interpolate(&x, Resize::Size([7, 9]), InterpolateMode::Bilinear, false)
                .square()
                .sum(),
            F::adaptive_max_pool2d(&x, [3, 4]).sum()
                + F::adaptive_avg_pool2d(&x, [2, 4]).square().sum(),
            F::max_pool2d_with_indices(&x, Pool2dOptions::new([2, 2]).ceil_mode(true)).0.sum(),
            F::group_norm(&x, 2, None, None, 1e-5).square().mean(),
        ];
        let total = parts[1..].iter().fold(parts[0].clone(), |a, p| a + p);
        let g = kiln::grad(&[&total], &[&x], false).remove(0);
        let idx = F::max_pool2d_with_indices(&x.detach(), Pool2dOptions::new([2, 2])).1;
        (total.item::<f64>(), g.to_vec::<f64>(), idx.to_vec::<i64>())
    };
    let (want, want_g, want_i) = kiln::with_execution(kiln::Execution::Reference, || run(&x, &w));
    let (got, got_g, got_i) = run(&x.to(device).detach(), &w.to(device));
    assert_close_tol(&[got], &[want], 1e-10, "vision values");
    assert_close_tol(&got_g, &want_g, 1e-10, "vision gradients");
    assert_eq!(got_i, want_i);

    // A batch norm layer on the device: buffers move with it and update there.
    kiln::manual_seed(2);
    let cpu_bn = BatchNorm2d::new(4);
    let mut gpu_bn = BatchNorm2d::new(4);
    gpu_bn.to(device).expect("batch norm to the device");
    assert!(gpu_bn.buffers().iter().all(|b| b.device() == device));
    let xf = x.float();
    let a =
        kiln::with_execution(kiln::Execution::Reference, || cpu_bn.forward(&xf).to_vec::<f32>());
    let b = gpu_bn.forward(&xf.to(device)).to_vec::<f32>();
    assert_close_tol(
        &b.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
        &a.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
        1e-5,
        "batch norm",
    );
    assert_close_tol(
        &read(&gpu_bn.running_var, DType::F32),
        &read(&cpu_bn.running_var, DType::F32),
        1e-6,
        "running variance",
    );
    assert_eq!(gpu_bn.num_batches_tracked.item::<i64>(), 1);
}
