//! Convolution and pooling over 2-D images, built the way a compiler would: a window of the
//! padded input is a *view* (overlapping strides over the same storage, no copy), a
//! convolution is that view reshaped into columns and multiplied by the weight, and a pooling
//! is a reduction over the view's window dimensions. Autograd and fusion come from the ops
//! they are made of: the gradient of the window view adds each window's gradient back where
//! it was read (overlaps summed).

use super::{Module, Parameters};
use crate::error::ok;
use crate::{DType, Error, Result, Tensor};
use kiln_ir::{Shape, View};

/// The options of [`conv2d`], with PyTorch's names and defaults (stride 1, no padding, no
/// dilation, one group). Pairs are `[height, width]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dOptions {
    /// Step between windows.
    pub stride: [usize; 2],
    /// Zeros added on each side.
    pub padding: [usize; 2],
    /// Step between the elements of a window.
    pub dilation: [usize; 2],
    /// Input and output channels are split into this many independent groups.
    pub groups: usize,
}

impl Default for Conv2dOptions {
    fn default() -> Conv2dOptions {
        Conv2dOptions { stride: [1, 1], padding: [0, 0], dilation: [1, 1], groups: 1 }
    }
}

/// The options of [`max_pool2d`] and [`avg_pool2d`]: PyTorch's, with `stride` defaulting to
/// the kernel size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2dOptions {
    /// The window's size.
    pub kernel_size: [usize; 2],
    /// Step between windows (`None`: the kernel size).
    pub stride: Option<[usize; 2]>,
    /// Padding on each side (`-inf` for max pooling, zeros counted in the mean for average
    /// pooling, as PyTorch's `count_include_pad=True`).
    pub padding: [usize; 2],
    /// Step between the elements of a window (max pooling only).
    pub dilation: [usize; 2],
}

impl Pool2dOptions {
    /// Windows of `kernel_size`, stepping by the kernel size, without padding.
    pub fn new(kernel_size: [usize; 2]) -> Pool2dOptions {
        Pool2dOptions { kernel_size, stride: None, padding: [0, 0], dilation: [1, 1] }
    }
}

/// `x` (`[N, C, H, W]`) with `padding` added on both sides of H and W, filled with `value`.
#[track_caller]
fn pad_hw(x: &Tensor, padding: [usize; 2], value: f64) -> Result<Tensor> {
    let mut x = x.clone();
    for (axis, &p) in [(2usize, padding[0]), (3, padding[1])].iter().map(|(a, p)| (*a, p)) {
        if p == 0 {
            continue;
        }
        let mut dims = x.dims().to_vec();
        dims[axis] = p;
        let side = Tensor::try_full_dtype(dims, value, x.dtype())?.try_to(x.device())?;
        x = Tensor::try_cat(&[&side, &x, &side], axis as i64)?;
    }
    Ok(x)
}

/// The output size of a window sweep, or an error naming `op` when no window fits.
fn out_size(
    op: &'static str,
    size: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
) -> Result<usize> {
    let span = dilation * (kernel - 1) + 1;
    if stride == 0 || kernel == 0 || dilation == 0 {
        return Err(Error::shape(op, "kernel size, stride and dilation must be at least 1"));
    }
    if size < span {
        return Err(Error::shape(
            op,
            format!(
                "a window spanning {span} does not fit an input of size {size} (after padding)"
            ),
        ));
    }
    Ok((size - span) / stride + 1)
}

/// The windows of `x` (`[N, C, H, W]`, padded already): a view `[N, C, OH, OW, KH, KW]` over
/// the same storage.
#[track_caller]
fn windows(
    op: &'static str,
    x: &Tensor,
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
) -> Result<Tensor> {
    let d = x.dims().to_vec();
    let oh = out_size(op, d[2], kernel[0], stride[0], dilation[0])?;
    let ow = out_size(op, d[3], kernel[1], stride[1], dilation[1])?;
    let shape = Shape::new(vec![d[0], d[1], oh, ow, kernel[0], kernel[1]]);
    Ok(x.restrided(|v: &View| {
        let s = v.strides();
        View::from_parts(
            shape.clone(),
            vec![
                s[0],
                s[1],
                s[2] * stride[0] as isize,
                s[3] * stride[1] as isize,
                s[2] * dilation[0] as isize,
                s[3] * dilation[1] as isize,
            ],
            v.offset(),
        )
    }))
}

/// Checks that `x` is a float `[N, C, H, W]` batch.
fn check_image(op: &'static str, x: &Tensor) -> Result<()> {
    if x.ndim() != 4 {
        return Err(Error::shape(
            op,
            format!(
                "expects a [N, C, H, W] batch of images, got shape {}; add a batch dimension with .unsqueeze(0)",
                x.shape()
            ),
        ));
    }
    if !x.dtype().is_float() {
        return Err(Error::dtype(op, format!("expects floating-point images, got {}", x.dtype())));
    }
    Ok(())
}

/// A 2-D convolution (PyTorch's cross-correlation): `input` `[N, C, H, W]`, `weight`
/// `[O, C / groups, KH, KW]`, an optional `bias` `[O]`; the result is `[N, O, OH, OW]`.
///
/// # Panics
/// As [`try_conv2d`] fails.
///
/// ```
/// use kiln::nn::functional as F;
/// use kiln::prelude::*;
/// let x = Tensor::arange(0.0f32, 16.0, 1.0).view(&[1, 1, 4, 4]);
/// let w = Tensor::ones([1, 1, 2, 2]);
/// let y = F::conv2d(&x, &w, None, F::Conv2dOptions { stride: [2, 2], ..Default::default() });
/// assert_eq!(y.to_vec::<f32>(), vec![10.0, 18.0, 42.0, 50.0]); // sums of 2x2 blocks
/// ```
#[track_caller]
pub fn conv2d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: Conv2dOptions,
) -> Tensor {
    let _at = crate::origin::enter();
    ok(try_conv2d(input, weight, bias, options))
}

/// [`conv2d`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the input is not `[N, C, H, W]`, the weight's channels do not match
/// `C / groups`, the groups do not divide the channels, the bias is not `[O]`, or no window
/// fits; [`Error::DType`] for non-float inputs or mixed dtypes.
#[track_caller]
pub fn try_conv2d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: Conv2dOptions,
) -> Result<Tensor> {
    let _at = crate::origin::enter();
    let op = "conv2d";
    check_image(op, input)?;
    let Conv2dOptions { stride, padding, dilation, groups } = options;
    let (n, c) = (input.dims()[0], input.dims()[1]);
    if weight.ndim() != 4 {
        return Err(Error::shape(
            op,
            format!("the weight must be [O, C / groups, KH, KW], got shape {}", weight.shape()),
        ));
    }
    let (o, cg, kh, kw) = (weight.dims()[0], weight.dims()[1], weight.dims()[2], weight.dims()[3]);
    if groups == 0 || !c.is_multiple_of(groups) || !o.is_multiple_of(groups) {
        return Err(Error::shape(
            op,
            format!(
                "groups = {groups} must divide both the input's {c} channels and the weight's {o} output channels"
            ),
        ));
    }
    if cg * groups != c {
        return Err(Error::shape(
            op,
            format!(
                "the weight {} expects {} input channels (C / groups = {cg} with groups = {groups}), the input {} has {c}",
                weight.shape(),
                cg * groups,
                input.shape()
            ),
        ));
    }
    if let Some(b) = bias
        && b.dims() != [o]
    {
        return Err(Error::shape(op, format!("the bias must have shape [{o}], got {}", b.shape())));
    }
    let padded = pad_hw(input, padding, 0.0)?;
    let win = windows(op, &padded, [kh, kw], stride, dilation)?;
    let (oh, ow) = (win.dims()[2], win.dims()[3]);
    let (g, og, k) = (groups as i64, (o / groups) as i64, (cg * kh * kw) as i64);
    // Columns: [N, G, OH*OW, C/G*KH*KW] (one copy, the im2col), times the weight as
    // [G, C/G*KH*KW, O/G]: [N, G, OH*OW, O/G].
    let cols = win
        .try_reshape(&[n as i64, g, cg as i64, oh as i64, ow as i64, kh as i64, kw as i64])?
        .try_permute(&[0, 1, 3, 4, 2, 5, 6])?
        .try_reshape(&[n as i64, g, (oh * ow) as i64, k])?;
    let w = weight.try_reshape(&[g, og, k])?.try_transpose(1, 2)?;
    let out = cols.try_matmul(&w)?;
    let out =
        out.try_permute(&[0, 1, 3, 2])?.try_reshape(&[n as i64, o as i64, oh as i64, ow as i64])?;
    match bias {
        Some(b) => out.try_add(&b.try_reshape(&[1, o as i64, 1, 1])?),
        None => Ok(out),
    }
}

/// 2-D max pooling over `[N, C, H, W]`: the largest value of each window (padding never
/// wins).
///
/// # Panics
/// As [`try_max_pool2d`] fails.
///
/// ```
/// use kiln::nn::functional as F;
/// use kiln::prelude::*;
/// let x = Tensor::arange(0.0f32, 16.0, 1.0).view(&[1, 1, 4, 4]);
/// let y = F::max_pool2d(&x, F::Pool2dOptions::new([2, 2]));
/// assert_eq!(y.to_vec::<f32>(), vec![5.0, 7.0, 13.0, 15.0]);
/// ```
#[track_caller]
pub fn max_pool2d(input: &Tensor, options: Pool2dOptions) -> Tensor {
    let _at = crate::origin::enter();
    ok(try_max_pool2d(input, options))
}

/// [`max_pool2d`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the input is not `[N, C, H, W]`, the padding exceeds half the
/// kernel (as PyTorch refuses), or no window fits; [`Error::DType`] for non-float input.
#[track_caller]
pub fn try_max_pool2d(input: &Tensor, options: Pool2dOptions) -> Result<Tensor> {
    let _at = crate::origin::enter();
    pool("max_pool2d", input, options, true)
}

/// 2-D average pooling over `[N, C, H, W]`: the mean of each window, padding zeros included
/// (PyTorch's default `count_include_pad=True`).
///
/// # Panics
/// As [`try_avg_pool2d`] fails.
#[track_caller]
pub fn avg_pool2d(input: &Tensor, options: Pool2dOptions) -> Tensor {
    let _at = crate::origin::enter();
    ok(try_avg_pool2d(input, options))
}

/// [`avg_pool2d`], returning an error instead of panicking.
///
/// # Errors
/// As [`try_max_pool2d`]; a dilation other than 1 is refused (PyTorch has none).
#[track_caller]
pub fn try_avg_pool2d(input: &Tensor, options: Pool2dOptions) -> Result<Tensor> {
    let _at = crate::origin::enter();
    if options.dilation != [1, 1] {
        return Err(Error::shape("avg_pool2d", "average pooling has no dilation"));
    }
    pool("avg_pool2d", input, options, false)
}

#[track_caller]
fn pool(op: &'static str, input: &Tensor, options: Pool2dOptions, max: bool) -> Result<Tensor> {
    check_image(op, input)?;
    let Pool2dOptions { kernel_size, stride, padding, dilation } = options;
    for i in 0..2 {
        if padding[i] * 2 > kernel_size[i] {
            return Err(Error::shape(
                op,
                format!(
                    "padding {padding:?} should be at most half of the kernel size {kernel_size:?}"
                ),
            ));
        }
    }
    let fill = if max { f64::NEG_INFINITY } else { 0.0 };
    let padded = pad_hw(input, padding, fill)?;
    let win = windows(op, &padded, kernel_size, stride.unwrap_or(kernel_size), dilation)?;
    if max {
        win.try_amax([4i64, 5].as_slice(), false)
    } else {
        win.try_mean_dim([4i64, 5].as_slice(), false)
    }
}

/// A 2-D convolution layer (PyTorch's `nn.Conv2d`), with its weight and bias initialized as
/// PyTorch does (uniform in `±1/sqrt(fan_in)`).
///
/// ```
/// use kiln::nn::{Conv2d, Module};
/// use kiln::nn::functional::Conv2dOptions;
/// use kiln::prelude::*;
/// let conv = Conv2d::new(3, 8, [3, 3], Conv2dOptions { padding: [1, 1], ..Default::default() });
/// let y = conv.forward(&Tensor::randn([2, 3, 10, 12]));
/// assert_eq!(y.dims(), &[2, 8, 10, 12]);
/// ```
#[derive(Clone, Debug)]
pub struct Conv2d {
    /// `[out_channels, in_channels / groups, KH, KW]`.
    pub weight: Tensor,
    /// `[out_channels]`.
    pub bias: Option<Tensor>,
    /// Stride, padding, dilation and groups.
    pub options: Conv2dOptions,
}

impl Conv2d {
    /// A layer with a bias, in `f32`.
    ///
    /// # Panics
    /// As [`Conv2d::try_new`] fails.
    #[must_use]
    #[track_caller]
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel_size: [usize; 2],
        options: Conv2dOptions,
    ) -> Conv2d {
        ok(Conv2d::try_new(in_channels, out_channels, kernel_size, options))
    }

    /// [`Conv2d::new`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when `groups` does not divide both channel counts, or a size is 0.
    #[track_caller]
    pub fn try_new(
        in_channels: usize,
        out_channels: usize,
        kernel_size: [usize; 2],
        options: Conv2dOptions,
    ) -> Result<Conv2d> {
        let g = options.groups;
        if g == 0 || !in_channels.is_multiple_of(g) || !out_channels.is_multiple_of(g) {
            return Err(Error::shape(
                "Conv2d",
                format!(
                    "groups = {g} must divide in_channels = {in_channels} and out_channels = {out_channels}"
                ),
            ));
        }
        if kernel_size.contains(&0) {
            return Err(Error::shape(
                "Conv2d",
                format!("kernel_size must be positive, got {kernel_size:?}"),
            ));
        }
        let fan_in = in_channels / g * kernel_size[0] * kernel_size[1];
        let bound = if fan_in == 0 { 0.0 } else { 1.0 / (fan_in as f64).sqrt() };
        let uniform = |shape: &[usize]| -> Result<Tensor> {
            let t = (Tensor::try_rand(shape)? * (2.0 * bound) - bound).to_dtype(DType::F32);
            t.try_realize()?;
            Ok(t.requires_grad_(true))
        };
        let weight = uniform(&[out_channels, in_channels / g, kernel_size[0], kernel_size[1]])?;
        let bias = Some(uniform(&[out_channels])?);
        Ok(Conv2d { weight, bias, options })
    }
}

crate::parameters!(Conv2d { weight, bias });

impl Module for Conv2d {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        let _at = crate::origin::enter();
        try_conv2d(input, &self.weight, self.bias.as_ref(), self.options)
    }
}

/// Max pooling (PyTorch's `nn.MaxPool2d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxPool2d(pub Pool2dOptions);

/// Average pooling (PyTorch's `nn.AvgPool2d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvgPool2d(pub Pool2dOptions);

/// Flattens every dimension after the first (PyTorch's `nn.Flatten()`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flatten;

macro_rules! no_parameters {
    ($($t:ty),*) => {$(
        impl Parameters for $t {
            fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Tensor)) {}
            fn visit_mut(&mut self, _: &str, _: &mut dyn FnMut(&str, &mut Tensor)) {}
        }
    )*};
}
no_parameters!(MaxPool2d, AvgPool2d, Flatten);

impl Module for MaxPool2d {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        let _at = crate::origin::enter();
        try_max_pool2d(input, self.0)
    }
}

impl Module for AvgPool2d {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        let _at = crate::origin::enter();
        try_avg_pool2d(input, self.0)
    }
}

impl Module for Flatten {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        let _at = crate::origin::enter();
        let n = input.dims().first().copied().unwrap_or(1) as i64;
        input.try_reshape(&[n, -1])
    }
}
