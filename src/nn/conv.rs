//! Convolution over 1-D and 2-D inputs, built the way a compiler would: a window of the
//! padded input is a *view* (overlapping strides over the same storage, no copy), a
//! convolution is that view reshaped into columns and multiplied by the weight. Autograd and
//! fusion come from the ops they are made of: the gradient of the window view adds each
//! window's gradient back where it was read (overlaps summed). That adjoint, `col2im`, is
//! also `fold` and the heart of the transposed convolution.

use super::Module;
use super::resize::{PadMode, try_pad};
use crate::error::ok;
use crate::{DType, Error, Result, Tensor};
use kiln_ir::{Shape, View};

/// The options of [`conv2d`], with PyTorch's names and defaults (stride 1, no padding, no
/// dilation, one group, zero padding). Pairs are `[height, width]`. Build them with struct
/// update syntax or the builder methods.
///
/// ```
/// use kiln::nn::functional::{Conv2dOptions, PadMode};
/// let o = Conv2dOptions::default().stride([2, 2]).padding([1, 1]).padding_mode(PadMode::Reflect);
/// assert_eq!(o, Conv2dOptions { stride: [2, 2], padding: [1, 1], padding_mode: PadMode::Reflect, ..Default::default() });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dOptions {
    /// Step between windows.
    pub stride: [usize; 2],
    /// Elements added on each side (ignored when `same` is set).
    pub padding: [usize; 2],
    /// PyTorch's `padding='same'`: pad so the output has the input's size (stride 1 only;
    /// an odd total puts the extra element after, as PyTorch does).
    pub same: bool,
    /// What the padding holds: zeros (`PadMode::Constant`, PyTorch's `'zeros'`), or the
    /// input reflected, replicated or wrapped around.
    pub padding_mode: PadMode,
    /// Step between the elements of a window.
    pub dilation: [usize; 2],
    /// Input and output channels are split into this many independent groups.
    pub groups: usize,
}

impl Default for Conv2dOptions {
    fn default() -> Conv2dOptions {
        Conv2dOptions {
            stride: [1, 1],
            padding: [0, 0],
            same: false,
            padding_mode: PadMode::Constant,
            dilation: [1, 1],
            groups: 1,
        }
    }
}

impl Conv2dOptions {
    /// With this stride.
    #[must_use]
    pub fn stride(mut self, stride: [usize; 2]) -> Conv2dOptions {
        self.stride = stride;
        self
    }

    /// With this padding on each side.
    #[must_use]
    pub fn padding(mut self, padding: [usize; 2]) -> Conv2dOptions {
        self.padding = padding;
        self
    }

    /// With `padding='same'`.
    #[must_use]
    pub fn same(mut self) -> Conv2dOptions {
        self.same = true;
        self
    }

    /// With this padding mode.
    #[must_use]
    pub fn padding_mode(mut self, mode: PadMode) -> Conv2dOptions {
        self.padding_mode = mode;
        self
    }

    /// With this dilation.
    #[must_use]
    pub fn dilation(mut self, dilation: [usize; 2]) -> Conv2dOptions {
        self.dilation = dilation;
        self
    }

    /// With this many groups.
    #[must_use]
    pub fn groups(mut self, groups: usize) -> Conv2dOptions {
        self.groups = groups;
        self
    }

    /// `[left, right, top, bottom]` for [`try_pad`], given the kernel size.
    fn pads(&self, op: &'static str, kernel: [usize; 2]) -> Result<[i64; 4]> {
        if !self.same {
            let [ph, pw] = self.padding;
            return Ok([pw as i64, pw as i64, ph as i64, ph as i64]);
        }
        if self.stride != [1, 1] {
            return Err(Error::shape(
                op,
                format!("padding 'same' needs stride 1, got {:?}", self.stride),
            ));
        }
        let total = |i: usize| (self.dilation[i] * kernel[i].saturating_sub(1)) as i64;
        let (th, tw) = (total(0), total(1));
        Ok([tw / 2, tw - tw / 2, th / 2, th - th / 2])
    }
}

/// The output size of a window sweep, or an error naming `op` when no window fits.
pub(super) fn out_size(
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
pub(super) fn windows(
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

/// The windows of `x` (`[N, C, H, W]`, padded already) in the order a convolution's
/// columns need them: a view `[G, C/G, KH, KW, N, OH, OW]` over the same storage.
#[track_caller]
fn columns(
    op: &'static str,
    x: &Tensor,
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    groups: usize,
) -> Result<Tensor> {
    let d = x.dims().to_vec();
    let oh = out_size(op, d[2], kernel[0], stride[0], dilation[0])?;
    let ow = out_size(op, d[3], kernel[1], stride[1], dilation[1])?;
    let cg = d[1] / groups;
    let shape = Shape::new(vec![groups, cg, kernel[0], kernel[1], d[0], oh, ow]);
    Ok(x.restrided(|v: &View| {
        let s = v.strides();
        View::from_parts(
            shape.clone(),
            vec![
                s[1] * cg as isize,
                s[1],
                s[2] * dilation[0] as isize,
                s[3] * dilation[1] as isize,
                s[0],
                s[2] * stride[0] as isize,
                s[3] * stride[1] as isize,
            ],
            v.offset(),
        )
    }))
}

/// Checks that `x` is a float `[N, C, H, W]` batch.
pub(super) fn check_image(op: &'static str, x: &Tensor) -> Result<()> {
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
    let _at = crate::engine::origin::enter();
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
    let _at = crate::engine::origin::enter();
    let op = "conv2d";
    check_image(op, input)?;
    let Conv2dOptions { stride, dilation, groups, .. } = options;
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
    let padded = try_pad(input, &options.pads(op, [kh, kw])?, options.padding_mode, 0.0)?;
    let cols = columns(op, &padded, [kh, kw], stride, dilation, groups)?;
    let (oh, ow) = (cols.dims()[5], cols.dims()[6]);
    let (g, og, k, l) =
        (groups as i64, (o / groups) as i64, (cg * kh * kw) as i64, (oh * ow) as i64);
    // Columns: [G, C/G·KH·KW, N·OH·OW], one copy (the im2col) of a view whose gradient is a
    // single `unview` (col2im). The batch sits beside the pixels so that the weight
    // [G, O/G, C/G·KH·KW] meets the whole batch in one product per group (and the weight's
    // gradient is one product over N·OH·OW, not a batch of small ones summed); the result
    // [G, O/G, N, OH·OW] is the output as a permuted view.
    let cols = cols.contiguous().try_reshape(&[g, k, n as i64 * l])?;
    let out = weight.try_reshape(&[g, og, k])?.try_matmul(&cols)?;
    let out = out.try_reshape(&[o as i64, n as i64, oh as i64, ow as i64])?;
    let out = out.try_permute(&[1, 0, 2, 3])?;
    match bias {
        Some(b) => out.try_add(&b.try_reshape(&[1, o as i64, 1, 1])?),
        None => Ok(out),
    }
}

/// A convolution layer's weight (of `weight_shape`) and bias (`[out_channels]`), uniform in
/// `±1/sqrt(fan_in)` as PyTorch initializes them, with `fan_in = per_group_in·KH·KW`, after
/// checking that `groups` divides both channel counts and the kernel is not empty.
pub(super) fn layer_parameters(
    layer: &'static str,
    [in_channels, out_channels]: [usize; 2],
    kernel_size: &[usize],
    groups: usize,
    weight_shape: &[usize],
    per_group_in: usize,
) -> Result<(Tensor, Tensor)> {
    if groups == 0 || !in_channels.is_multiple_of(groups) || !out_channels.is_multiple_of(groups) {
        return Err(Error::shape(
            layer,
            format!(
                "groups = {groups} must divide in_channels = {in_channels} and out_channels = {out_channels}"
            ),
        ));
    }
    if kernel_size.contains(&0) {
        return Err(Error::shape(
            layer,
            format!("kernel_size must be positive, got {kernel_size:?}"),
        ));
    }
    let fan_in = per_group_in * kernel_size.iter().product::<usize>();
    let bound = if fan_in == 0 { 0.0 } else { 1.0 / (fan_in as f64).sqrt() };
    let uniform = |shape: &[usize]| -> Result<Tensor> {
        let t = (Tensor::try_rand(shape)? * (2.0 * bound) - bound).to_dtype(DType::F32);
        t.try_realize()?;
        Ok(t.requires_grad_(true))
    };
    Ok((uniform(weight_shape)?, uniform(&[out_channels])?))
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
        let (weight, bias) = layer_parameters(
            "Conv2d",
            [in_channels, out_channels],
            &kernel_size,
            g,
            &[out_channels, in_channels / g.max(1), kernel_size[0], kernel_size[1]],
            in_channels / g.max(1),
        )?;
        Ok(Conv2d { weight, bias: Some(bias), options })
    }
}

crate::parameters!(Conv2d { weight, bias });

impl Module for Conv2d {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        try_conv2d(input, &self.weight, self.bias.as_ref(), self.options)
    }
}

/// The options of [`conv1d`]: [`Conv2dOptions`] for one spatial dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv1dOptions {
    /// Step between windows.
    pub stride: usize,
    /// Elements added on each side (ignored when `same` is set).
    pub padding: usize,
    /// PyTorch's `padding='same'` (stride 1 only).
    pub same: bool,
    /// What the padding holds.
    pub padding_mode: PadMode,
    /// Step between the elements of a window.
    pub dilation: usize,
    /// Independent channel groups.
    pub groups: usize,
}

impl Default for Conv1dOptions {
    fn default() -> Conv1dOptions {
        Conv1dOptions {
            stride: 1,
            padding: 0,
            same: false,
            padding_mode: PadMode::Constant,
            dilation: 1,
            groups: 1,
        }
    }
}

impl Conv1dOptions {
    /// The same convolution as a 2-D one over a height of 1.
    fn as_2d(self) -> Conv2dOptions {
        Conv2dOptions {
            stride: [1, self.stride],
            padding: [0, self.padding],
            same: self.same,
            padding_mode: self.padding_mode,
            dilation: [1, self.dilation],
            groups: self.groups,
        }
    }
}

/// A 1-D convolution: `input` `[N, C, L]`, `weight` `[O, C / groups, K]`, an optional `bias`
/// `[O]`; the result is `[N, O, OL]`. It runs as [`conv2d`] over a height of 1.
///
/// # Panics
/// As [`try_conv1d`] fails.
///
/// ```
/// use kiln::nn::functional::{self as F, Conv1dOptions};
/// use kiln::prelude::*;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [1, 1, 4]);
/// let w = Tensor::from_vec(vec![1.0f32, -1.0], [1, 1, 2]);
/// let y = F::conv1d(&x, &w, None, Conv1dOptions { same: true, ..Default::default() });
/// assert_eq!(y.to_vec::<f32>(), vec![-1.0, -1.0, -1.0, 4.0]);
/// ```
#[track_caller]
pub fn conv1d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: Conv1dOptions,
) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_conv1d(input, weight, bias, options))
}

/// [`conv1d`], returning an error instead of panicking.
///
/// # Errors
/// As [`try_conv2d`], for `[N, C, L]` inputs and `[O, C / groups, K]` weights.
#[track_caller]
pub fn try_conv1d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: Conv1dOptions,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    if input.ndim() != 3 {
        return Err(Error::shape(
            "conv1d",
            format!(
                "expects a [N, C, L] batch, got shape {}; add a batch dimension with .unsqueeze(0)",
                input.shape()
            ),
        ));
    }
    if weight.ndim() != 3 {
        return Err(Error::shape(
            "conv1d",
            format!("the weight must be [O, C / groups, K], got shape {}", weight.shape()),
        ));
    }
    try_conv2d(&input.try_unsqueeze(2)?, &weight.try_unsqueeze(2)?, bias, options.as_2d())
        .map_err(|e| e.reported_as("conv1d"))?
        .try_squeeze(2)
}

/// A 1-D convolution layer (PyTorch's `nn.Conv1d`), initialized as PyTorch does.
///
/// ```
/// use kiln::nn::{Conv1d, Module};
/// use kiln::nn::functional::Conv1dOptions;
/// use kiln::prelude::*;
/// let conv = Conv1d::new(4, 6, 3, Conv1dOptions { padding: 1, ..Default::default() });
/// assert_eq!(conv.forward(&Tensor::randn([2, 4, 9])).dims(), &[2, 6, 9]);
/// ```
#[derive(Clone, Debug)]
pub struct Conv1d {
    /// `[out_channels, in_channels / groups, K]`.
    pub weight: Tensor,
    /// `[out_channels]`.
    pub bias: Option<Tensor>,
    /// Stride, padding, dilation and groups.
    pub options: Conv1dOptions,
}

impl Conv1d {
    /// A layer with a bias, in `f32`.
    ///
    /// # Panics
    /// As [`Conv1d::try_new`] fails.
    #[must_use]
    #[track_caller]
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel_size: usize,
        options: Conv1dOptions,
    ) -> Conv1d {
        ok(Conv1d::try_new(in_channels, out_channels, kernel_size, options))
    }

    /// [`Conv1d::new`], returning an error instead of panicking.
    ///
    /// # Errors
    /// As [`Conv2d::try_new`].
    #[track_caller]
    pub fn try_new(
        in_channels: usize,
        out_channels: usize,
        kernel_size: usize,
        options: Conv1dOptions,
    ) -> Result<Conv1d> {
        let c = Conv2d::try_new(in_channels, out_channels, [1, kernel_size], options.as_2d())
            .map_err(|e| e.reported_as("Conv1d"))?;
        let weight = c.weight.detach().try_squeeze(2)?.contiguous();
        weight.try_realize()?;
        Ok(Conv1d { weight: weight.requires_grad_(true), bias: c.bias, options })
    }
}

crate::parameters!(Conv1d { weight, bias });

impl Module for Conv1d {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        try_conv1d(input, &self.weight, self.bias.as_ref(), self.options)
    }
}
