//! Layers over volumes (`[N, C, D, H, W]`, or `[C, D, H, W]` unbatched): the 3-D
//! convolution as the 2-D one is built (a strided view of the windows, one product per
//! group), and 3-D pooling as a 2-D pooling of every depth slice followed by a 1-D pooling
//! along the depth. That split is exact: a maximum over a box is a maximum of maxima over
//! its slices, and every divisor PyTorch uses for an average over a box (padding counted or
//! not, windows clipped by `ceil_mode`) is a product of one count per axis.

use kiln_ir::{Shape, View};

use super::conv::{layer_parameters, out_size};
use super::pool::{
    Pool2dOptions, try_adaptive_avg_pool2d, try_adaptive_max_pool2d, try_avg_pool2d, try_max_pool2d,
};
use super::resize::{PadMode, try_pad};
use super::sequence::{
    Pool1dOptions, try_adaptive_avg_pool1d, try_adaptive_max_pool1d, try_avg_pool1d, try_max_pool1d,
};
use super::{Module, Parameters};
use crate::error::ok;
use crate::{Error, Result, Tensor};

/// The options of [`conv3d`], PyTorch's names and defaults; triples are `[depth, height,
/// width]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv3dOptions {
    /// Step between windows.
    pub stride: [usize; 3],
    /// Elements added on each side (ignored when `same` is set).
    pub padding: [usize; 3],
    /// PyTorch's `padding='same'` (stride 1 only; an odd total puts the extra element after).
    pub same: bool,
    /// What the padding holds (zeros by default).
    pub padding_mode: PadMode,
    /// Step between the elements of a window.
    pub dilation: [usize; 3],
    /// Input and output channels are split into this many independent groups.
    pub groups: usize,
}

impl Default for Conv3dOptions {
    fn default() -> Conv3dOptions {
        Conv3dOptions {
            stride: [1; 3],
            padding: [0; 3],
            same: false,
            padding_mode: PadMode::Constant,
            dilation: [1; 3],
            groups: 1,
        }
    }
}

/// `[N, C, D, H, W]` as it is, `[C, D, H, W]` with a batch of one; then `f`, and the batch
/// taken off again.
fn batched(
    op: &'static str,
    input: &Tensor,
    f: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    if !input.dtype().is_float() {
        return Err(Error::dtype(
            op,
            format!("expects floating-point input, got {}", input.dtype()),
        ));
    }
    match input.ndim() {
        5 => f(input),
        4 => f(&input.try_unsqueeze(0)?)?.try_squeeze(0),
        _ => Err(Error::shape(
            op,
            format!("takes [N, C, D, H, W] or [C, D, H, W], got shape {}", input.shape()),
        )),
    }
}

/// A 3-D convolution: `input` `[N, C, D, H, W]`, `weight` `[O, C / groups, KD, KH, KW]`, an
/// optional `bias` `[O]`; the result is `[N, O, OD, OH, OW]`.
///
/// ```
/// use kiln::nn::functional::{Conv3dOptions, conv3d};
/// use kiln::prelude::*;
/// let y = conv3d(&Tensor::ones([1, 2, 4, 4, 4]), &Tensor::ones([3, 2, 2, 2, 2]), None,
///     Conv3dOptions { stride: [2, 2, 2], ..Default::default() });
/// assert_eq!(y.dims(), &[1, 3, 2, 2, 2]);
/// assert_eq!(y.to_vec::<f32>()[0], 16.0);
/// ```
///
/// # Panics
/// As [`try_conv3d`] fails.
#[track_caller]
pub fn conv3d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: Conv3dOptions,
) -> Tensor {
    ok(try_conv3d(input, weight, bias, options))
}

/// [`conv3d`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the shapes do not fit (as [`super::conv::try_conv2d`]),
/// [`Error::DType`] for non-float input.
#[track_caller]
pub fn try_conv3d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: Conv3dOptions,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    batched("conv3d", input, |x| conv3d_batched(x, weight, bias, options))
}

fn conv3d_batched(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    o: Conv3dOptions,
) -> Result<Tensor> {
    let op = "conv3d";
    let (n, c) = (input.dims()[0], input.dims()[1]);
    let w = weight.dims();
    let groups = o.groups;
    let fits = w.len() == 5
        && groups > 0
        && c.is_multiple_of(groups)
        && w[0].is_multiple_of(groups)
        && w[1] * groups == c;
    if !fits {
        return Err(Error::shape(
            op,
            format!(
                "the weight must be [O, C / groups, KD, KH, KW] with groups = {groups} dividing \
                 O and C; got weight {} for input {}",
                weight.shape(),
                input.shape()
            ),
        ));
    }
    let (out, cg, kernel) = (w[0], w[1], [w[2], w[3], w[4]]);
    if let Some(b) = bias
        && b.dims() != [out]
    {
        return Err(Error::shape(
            op,
            format!("the bias must have shape [{out}], got {}", b.shape()),
        ));
    }
    let pads = pads(op, &o, kernel)?;
    let x = try_pad(input, &pads, o.padding_mode, 0.0)?;
    let d = x.dims().to_vec();
    let sizes: Vec<usize> = (0..3)
        .map(|i| out_size(op, d[2 + i], kernel[i], o.stride[i], o.dilation[i]))
        .collect::<Result<_>>()?;
    // Columns [G, C/G, KD, KH, KW, N, OD, OH, OW]: a view over the padded input.
    let shape = Shape::new(vec![
        groups, cg, kernel[0], kernel[1], kernel[2], n, sizes[0], sizes[1], sizes[2],
    ]);
    let cols = x.restrided(|v: &View| {
        let s = v.strides();
        let axis = |i: usize, step: usize| s[2 + i] * step as isize;
        View::from_parts(
            shape.clone(),
            vec![
                s[1] * cg as isize,
                s[1],
                axis(0, o.dilation[0]),
                axis(1, o.dilation[1]),
                axis(2, o.dilation[2]),
                s[0],
                axis(0, o.stride[0]),
                axis(1, o.stride[1]),
                axis(2, o.stride[2]),
            ],
            v.offset(),
        )
    });
    let (g, og) = (groups as i64, (out / groups) as i64);
    let k = (cg * kernel.iter().product::<usize>()) as i64;
    let l = sizes.iter().product::<usize>() as i64;
    let cols = cols.contiguous().try_reshape(&[g, k, n as i64 * l])?;
    let y = weight.try_reshape(&[g, og, k])?.try_matmul(&cols)?;
    let dims: Vec<i64> = [out, n, sizes[0], sizes[1], sizes[2]].iter().map(|&v| v as i64).collect();
    let y = y.try_reshape(&dims)?.try_permute(&[1, 0, 2, 3, 4])?;
    match bias {
        Some(b) => y.try_add(&b.try_reshape(&[1, out as i64, 1, 1, 1])?),
        None => Ok(y),
    }
}

/// `[left, right, top, bottom, front, back]` for [`try_pad`].
fn pads(op: &'static str, o: &Conv3dOptions, kernel: [usize; 3]) -> Result<[i64; 6]> {
    let mut p = [0i64; 6];
    for axis in 0..3 {
        let (before, after) = if o.same {
            if o.stride != [1; 3] {
                return Err(Error::shape(op, "padding 'same' needs stride 1"));
            }
            let total = (o.dilation[axis] * kernel[axis].saturating_sub(1)) as i64;
            (total / 2, total - total / 2)
        } else {
            (o.padding[axis] as i64, o.padding[axis] as i64)
        };
        // try_pad lists the last dimension first.
        p[2 * (2 - axis)] = before;
        p[2 * (2 - axis) + 1] = after;
    }
    Ok(p)
}

/// A 3-D convolution layer (PyTorch's `nn.Conv3d`), initialized as PyTorch does (uniform in
/// `±1/sqrt(fan_in)`).
///
/// ```
/// use kiln::nn::{Conv3d, Module};
/// use kiln::nn::functional::Conv3dOptions;
/// use kiln::prelude::*;
/// let conv = Conv3d::new(2, 4, [3, 3, 3], Conv3dOptions { padding: [1, 1, 1], ..Default::default() });
/// assert_eq!(conv.forward(&Tensor::randn([1, 2, 5, 6, 7])).dims(), &[1, 4, 5, 6, 7]);
/// ```
#[derive(Clone, Debug)]
pub struct Conv3d {
    /// `[out_channels, in_channels / groups, KD, KH, KW]`.
    pub weight: Tensor,
    /// `[out_channels]`.
    pub bias: Option<Tensor>,
    /// Stride, padding, dilation and groups.
    pub options: Conv3dOptions,
}

impl Conv3d {
    /// A layer with a bias, in `f32`.
    ///
    /// # Panics
    /// As [`Conv3d::try_new`] fails.
    #[must_use]
    #[track_caller]
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel_size: [usize; 3],
        options: Conv3dOptions,
    ) -> Conv3d {
        ok(Conv3d::try_new(in_channels, out_channels, kernel_size, options))
    }

    /// [`Conv3d::new`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when `groups` does not divide both channel counts, or a size is 0.
    #[track_caller]
    pub fn try_new(
        in_channels: usize,
        out_channels: usize,
        kernel_size: [usize; 3],
        options: Conv3dOptions,
    ) -> Result<Conv3d> {
        let g = options.groups.max(1);
        let [kd, kh, kw] = kernel_size;
        let (weight, bias) = layer_parameters(
            "Conv3d",
            [in_channels, out_channels],
            &kernel_size,
            options.groups,
            &[out_channels, in_channels / g, kd, kh, kw],
            in_channels / g,
        )?;
        Ok(Conv3d { weight, bias: Some(bias), options })
    }
}

crate::parameters!(Conv3d { weight, bias });

impl Module for Conv3d {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        try_conv3d(input, &self.weight, self.bias.as_ref(), self.options)
    }
}

/// The options of [`max_pool3d`] and [`avg_pool3d`]: PyTorch's, triples `[depth, height,
/// width]`, `stride` defaulting to the kernel size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool3dOptions {
    /// The window's size.
    pub kernel_size: [usize; 3],
    /// Step between windows (`None`: the kernel size).
    pub stride: Option<[usize; 3]>,
    /// Padding on each side (`-inf` for max pooling, zeros for average pooling).
    pub padding: [usize; 3],
    /// Step between the elements of a window (max pooling only).
    pub dilation: [usize; 3],
    /// Keep a last partial window (PyTorch's `ceil_mode`).
    pub ceil_mode: bool,
    /// Average pooling counts padding in its divisor (the default).
    pub count_include_pad: bool,
}

impl Pool3dOptions {
    /// Windows of `kernel_size`, stepping by it, without padding.
    pub fn new(kernel_size: [usize; 3]) -> Pool3dOptions {
        Pool3dOptions {
            kernel_size,
            stride: None,
            padding: [0; 3],
            dilation: [1; 3],
            ceil_mode: false,
            count_include_pad: true,
        }
    }

    /// The height-and-width part and the depth part.
    fn split(self) -> (Pool2dOptions, Pool1dOptions) {
        let s = self.stride.unwrap_or(self.kernel_size);
        let plane = Pool2dOptions {
            kernel_size: [self.kernel_size[1], self.kernel_size[2]],
            stride: Some([s[1], s[2]]),
            padding: [self.padding[1], self.padding[2]],
            dilation: [self.dilation[1], self.dilation[2]],
            ceil_mode: self.ceil_mode,
            count_include_pad: self.count_include_pad,
        };
        let depth = Pool1dOptions {
            kernel_size: self.kernel_size[0],
            stride: Some(s[0]),
            padding: self.padding[0],
            dilation: self.dilation[0],
            ceil_mode: self.ceil_mode,
            count_include_pad: self.count_include_pad,
        };
        (plane, depth)
    }
}

/// `plane` over each depth slice of `[N, C, D, H, W]`, then `depth` along the depth.
fn separable(
    op: &'static str,
    input: &Tensor,
    plane: impl FnOnce(&Tensor) -> Result<Tensor>,
    depth: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    batched(op, input, |x| {
        let [n, c, d, h, w] = [0, 1, 2, 3, 4].map(|i| x.dims()[i] as i64);
        let y = plane(&x.try_reshape(&[n, c * d, h, w])?)?;
        let (oh, ow) = (y.dims()[2] as i64, y.dims()[3] as i64);
        // [N, C, OH·OW, D] as [N, C·OH·OW, D] for the 1-D pooling.
        let y = y.try_reshape(&[n, c, d, oh * ow])?.try_transpose(2, 3)?;
        let z = depth(&y.try_reshape(&[n, c * oh * ow, d])?)?;
        let od = z.dims()[2] as i64;
        z.try_reshape(&[n, c, oh, ow, od])?.try_permute(&[0, 1, 4, 2, 3])
    })
}

/// 3-D max pooling (PyTorch's `max_pool3d`): the largest value of each window.
///
/// ```
/// use kiln::nn::functional::{Pool3dOptions, max_pool3d};
/// use kiln::prelude::*;
/// let x = Tensor::arange(0.0f32, 64.0, 1.0).view(&[1, 1, 4, 4, 4]);
/// let y = max_pool3d(&x, Pool3dOptions::new([2, 2, 2]));
/// assert_eq!(y.to_vec::<f32>(), [21.0, 23.0, 29.0, 31.0, 53.0, 55.0, 61.0, 63.0]);
/// ```
///
/// # Panics
/// As [`try_max_pool3d`] fails.
#[track_caller]
pub fn max_pool3d(input: &Tensor, options: Pool3dOptions) -> Tensor {
    ok(try_max_pool3d(input, options))
}

/// [`max_pool3d`], returning an error instead of panicking.
///
/// # Errors
/// As [`super::pool::try_max_pool2d`] along each axis.
#[track_caller]
pub fn try_max_pool3d(input: &Tensor, options: Pool3dOptions) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    let (plane, depth) = options.split();
    separable("max_pool3d", input, |x| try_max_pool2d(x, plane), |x| try_max_pool1d(x, depth))
}

/// 3-D average pooling (PyTorch's `avg_pool3d`, without `divisor_override`).
///
/// # Panics
/// As [`try_avg_pool3d`] fails.
#[track_caller]
pub fn avg_pool3d(input: &Tensor, options: Pool3dOptions) -> Tensor {
    ok(try_avg_pool3d(input, options))
}

/// [`avg_pool3d`], returning an error instead of panicking.
///
/// # Errors
/// As [`super::pool::try_avg_pool2d`] along each axis.
#[track_caller]
pub fn try_avg_pool3d(input: &Tensor, options: Pool3dOptions) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    let (plane, depth) = options.split();
    separable("avg_pool3d", input, |x| try_avg_pool2d(x, plane), |x| try_avg_pool1d(x, depth))
}

/// Average pooling to a fixed `[depth, height, width]` (PyTorch's `adaptive_avg_pool3d`).
///
/// # Panics
/// As [`try_adaptive_avg_pool3d`] fails.
#[track_caller]
pub fn adaptive_avg_pool3d(input: &Tensor, output_size: [usize; 3]) -> Tensor {
    ok(try_adaptive_avg_pool3d(input, output_size))
}

/// [`adaptive_avg_pool3d`], returning an error instead of panicking.
///
/// # Errors
/// As [`super::pool::try_adaptive_avg_pool2d`].
#[track_caller]
pub fn try_adaptive_avg_pool3d(input: &Tensor, [d, h, w]: [usize; 3]) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    separable(
        "adaptive_avg_pool3d",
        input,
        |x| try_adaptive_avg_pool2d(x, [h, w]),
        |x| try_adaptive_avg_pool1d(x, d),
    )
}

/// Max pooling to a fixed `[depth, height, width]` (PyTorch's `adaptive_max_pool3d`).
///
/// # Panics
/// As [`try_adaptive_max_pool3d`] fails.
#[track_caller]
pub fn adaptive_max_pool3d(input: &Tensor, output_size: [usize; 3]) -> Tensor {
    ok(try_adaptive_max_pool3d(input, output_size))
}

/// [`adaptive_max_pool3d`], returning an error instead of panicking.
///
/// # Errors
/// As [`super::pool::try_adaptive_max_pool2d`].
#[track_caller]
pub fn try_adaptive_max_pool3d(input: &Tensor, [d, h, w]: [usize; 3]) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    separable(
        "adaptive_max_pool3d",
        input,
        |x| try_adaptive_max_pool2d(x, [h, w]),
        |x| try_adaptive_max_pool1d(x, d),
    )
}

/// 3-D max pooling (PyTorch's `nn.MaxPool3d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxPool3d(pub Pool3dOptions);

/// 3-D average pooling (PyTorch's `nn.AvgPool3d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvgPool3d(pub Pool3dOptions);

/// Average pooling to a fixed `[depth, height, width]` (PyTorch's `nn.AdaptiveAvgPool3d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveAvgPool3d(pub [usize; 3]);

/// Max pooling to a fixed `[depth, height, width]` (PyTorch's `nn.AdaptiveMaxPool3d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveMaxPool3d(pub [usize; 3]);

// `pool_modules!` is pool.rs's (`#[macro_use]` in `nn/mod.rs`).
pool_modules!(
    MaxPool3d => try_max_pool3d,
    AvgPool3d => try_avg_pool3d,
    AdaptiveAvgPool3d => try_adaptive_avg_pool3d,
    AdaptiveMaxPool3d => try_adaptive_max_pool3d
);
