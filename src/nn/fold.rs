//! `unfold` (im2col), its adjoint `fold` (col2im), and the transposed convolution built on
//! `fold`: a transposed convolution multiplies each input pixel by the kernel and adds the
//! products into overlapping windows of the output, which is exactly `fold` of a product.

use super::Module;
use super::conv::{check_image, windows};
use crate::error::ok;
use crate::{Error, Result, Tensor};
use kiln_ir::{Op, Shape, View};

/// The window geometry of [`unfold`] and [`fold`], with PyTorch's names and defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FoldOptions {
    /// The window's size.
    pub kernel_size: [usize; 2],
    /// Step between the elements of a window.
    pub dilation: [usize; 2],
    /// Zeros added on each side of the image.
    pub padding: [usize; 2],
    /// Step between windows.
    pub stride: [usize; 2],
}

impl FoldOptions {
    /// Windows of `kernel_size`, stride 1, no padding or dilation.
    pub fn new(kernel_size: [usize; 2]) -> FoldOptions {
        FoldOptions { kernel_size, dilation: [1, 1], padding: [0, 0], stride: [1, 1] }
    }
}

/// Every window of `[N, C, H, W]` images as a column, PyTorch's `F.unfold`: the result is
/// `[N, C·KH·KW, L]` with `L` windows, channel-major within a column.
///
/// # Panics
/// As [`try_unfold`] fails.
///
/// ```
/// use kiln::nn::functional::{self as F, FoldOptions};
/// use kiln::prelude::*;
/// let x = Tensor::arange(0.0f32, 9.0, 1.0).view(&[1, 1, 3, 3]);
/// let cols = F::unfold(&x, FoldOptions::new([2, 2]));
/// assert_eq!(cols.dims(), &[1, 4, 4]);
/// assert_eq!(cols.select(1, 0).to_vec::<f32>(), vec![0.0, 1.0, 3.0, 4.0]); // top-left of each window
/// ```
#[track_caller]
pub fn unfold(input: &Tensor, options: FoldOptions) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_unfold(input, options))
}

/// [`unfold`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the input is not `[N, C, H, W]` or no window fits; [`Error::DType`]
/// for non-float input.
#[track_caller]
pub fn try_unfold(input: &Tensor, options: FoldOptions) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    const OP: &str = "unfold";
    check_image(OP, input)?;
    let [ph, pw] = options.padding;
    let padded = super::resize::try_pad(
        input,
        &[pw as i64, pw as i64, ph as i64, ph as i64],
        super::resize::PadMode::Constant,
        0.0,
    )?;
    let win = windows(OP, &padded, options.kernel_size, options.stride, options.dilation)?;
    let d = win.dims().to_vec();
    win.try_permute(&[0, 1, 4, 5, 2, 3])?.try_reshape(&[
        d[0] as i64,
        (d[1] * d[4] * d[5]) as i64,
        (d[2] * d[3]) as i64,
    ])
}

/// Sums columns back into `[N, C, H, W]` images, PyTorch's `F.fold`: the adjoint of
/// [`unfold`], so overlapping windows add up. `input` is `[N, C·KH·KW, L]` and
/// `output_size` is `[H, W]`.
///
/// # Panics
/// As [`try_fold`] fails.
///
/// ```
/// use kiln::nn::functional::{self as F, FoldOptions};
/// use kiln::prelude::*;
/// let o = FoldOptions::new([2, 2]);
/// let ones = F::unfold(&Tensor::ones([1, 1, 3, 3]), o);
/// // How many windows cover each pixel: the center is in all four.
/// assert_eq!(F::fold(&ones, [3, 3], o).to_vec::<f32>(), vec![1., 2., 1., 2., 4., 2., 1., 2., 1.]);
/// ```
#[track_caller]
pub fn fold(input: &Tensor, output_size: [usize; 2], options: FoldOptions) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_fold(input, output_size, options))
}

/// [`fold`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the input is not `[N, C·KH·KW, L]` with `L` the number of windows
/// that fit `output_size`; [`Error::DType`] for non-float input.
#[track_caller]
pub fn try_fold(input: &Tensor, output_size: [usize; 2], options: FoldOptions) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    const OP: &str = "fold";
    let FoldOptions { kernel_size: [kh, kw], dilation, padding: [ph, pw], stride } = options;
    if input.ndim() != 3 {
        return Err(Error::shape(
            OP,
            format!("expects columns of shape [N, C·KH·KW, L], got {}", input.shape()),
        ));
    }
    if !input.dtype().is_float() {
        return Err(Error::dtype(
            OP,
            format!("expects floating-point columns, got {}", input.dtype()),
        ));
    }
    let (n, ck, l) = (input.dims()[0], input.dims()[1], input.dims()[2]);
    let kk = kh * kw;
    let [hp, wp] = [output_size[0] + 2 * ph, output_size[1] + 2 * pw];
    let oh = super::conv::out_size(OP, hp, kh, stride[0], dilation[0])?;
    let ow = super::conv::out_size(OP, wp, kw, stride[1], dilation[1])?;
    if kk == 0 || !ck.is_multiple_of(kk) || l != oh * ow {
        return Err(Error::shape(
            OP,
            format!(
                "columns of shape {} do not fit an output of {output_size:?} with kernel [{kh}, {kw}]: expected [N, C·{kk}, {}]",
                input.shape(),
                oh * ow
            ),
        ));
    }
    let c = ck / kk;
    let cols = input
        .try_reshape(&[n as i64, c as i64, kh as i64, kw as i64, oh as i64, ow as i64])?
        .try_permute(&[0, 1, 4, 5, 2, 3])?;
    let image = col2im(&cols, [n, c, hp, wp], stride, dilation)?;
    image.try_narrow(2, ph, output_size[0])?.try_narrow(3, pw, output_size[1])
}

/// Adds windows `[N, C, OH, OW, KH, KW]` into a zero image of `shape` (the padded image
/// they were read from): the adjoint of the window view, recorded as one `Unview`.
#[track_caller]
fn col2im(
    cols: &Tensor,
    shape: [usize; 4],
    stride: [usize; 2],
    dilation: [usize; 2],
) -> Result<Tensor> {
    let d = cols.dims();
    let image = Shape::new(shape.to_vec());
    let dense = View::contiguous(image.clone());
    let s = dense.strides();
    let view = View::from_parts(
        Shape::new(d.to_vec()),
        vec![
            s[0],
            s[1],
            s[2] * stride[0] as isize,
            s[3] * stride[1] as isize,
            s[2] * dilation[0] as isize,
            s[3] * dilation[1] as isize,
        ],
        0,
    );
    // Every window must lie inside the image, or the adjoint would write outside it.
    let last = |axis: usize, k: usize, st: usize, dl: usize| (d[axis] - 1) * st + (d[k] - 1) * dl;
    if d.contains(&0)
        || last(2, 4, stride[0], dilation[0]) >= shape[2]
        || last(3, 5, stride[1], dilation[1]) >= shape[3]
    {
        return Err(Error::Internal(format!(
            "col2im: windows {d:?} do not fit an image of {shape:?}"
        )));
    }
    Tensor::from_op(Op::Unview { view, shape: image }, &[cols])
}

/// The options of [`conv_transpose2d`], with PyTorch's names and defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTranspose2dOptions {
    /// Step between the output windows that input pixels write.
    pub stride: [usize; 2],
    /// Removed from each side of the output (the padding of the convolution this inverts).
    pub padding: [usize; 2],
    /// Added to the bottom and right of the output, to pick among the sizes that a strided
    /// convolution maps to one size; less than the stride or the dilation.
    pub output_padding: [usize; 2],
    /// Independent channel groups.
    pub groups: usize,
    /// Step between the elements of a window.
    pub dilation: [usize; 2],
}

impl Default for ConvTranspose2dOptions {
    fn default() -> ConvTranspose2dOptions {
        ConvTranspose2dOptions {
            stride: [1, 1],
            padding: [0, 0],
            output_padding: [0, 0],
            groups: 1,
            dilation: [1, 1],
        }
    }
}

/// A 2-D transposed convolution (PyTorch's `F.conv_transpose2d`, the gradient of
/// [`conv2d`](super::functional::conv2d) with respect to its input): `input` `[N, C, H, W]`,
/// `weight` `[C, O / groups, KH, KW]`, an optional `bias` `[O]`; the result is `[N, O, OH, OW]`
/// with `OH = (H - 1)·stride - 2·padding + dilation·(KH - 1) + output_padding + 1`.
///
/// # Panics
/// As [`try_conv_transpose2d`] fails.
///
/// ```
/// use kiln::nn::functional::{self as F, ConvTranspose2dOptions};
/// use kiln::prelude::*;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0], [1, 1, 1, 2]);
/// let w = Tensor::ones([1, 1, 2, 2]);
/// let o = ConvTranspose2dOptions { stride: [2, 2], ..Default::default() };
/// let y = F::conv_transpose2d(&x, &w, None, o); // each pixel becomes a 2x2 block
/// assert_eq!(y.to_vec::<f32>(), vec![1., 1., 2., 2., 1., 1., 2., 2.]);
/// ```
#[track_caller]
pub fn conv_transpose2d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: ConvTranspose2dOptions,
) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_conv_transpose2d(input, weight, bias, options))
}

/// [`conv_transpose2d`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the input is not `[N, C, H, W]`, the weight is not
/// `[C, O / groups, KH, KW]`, the groups do not divide the channels, the bias is not `[O]`,
/// `output_padding` is not less than the stride or the dilation, or the output is empty;
/// [`Error::DType`] for non-float input.
#[track_caller]
pub fn try_conv_transpose2d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: ConvTranspose2dOptions,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    const OP: &str = "conv_transpose2d";
    check_image(OP, input)?;
    let ConvTranspose2dOptions { stride, padding, output_padding, groups, dilation } = options;
    let [n, c, h, w] = [input.dims()[0], input.dims()[1], input.dims()[2], input.dims()[3]];
    if weight.ndim() != 4 || weight.dims()[0] != c {
        return Err(Error::shape(
            OP,
            format!(
                "the weight must be [C, O / groups, KH, KW] with C = {c} input channels, got shape {}",
                weight.shape()
            ),
        ));
    }
    let [og, kh, kw] = [weight.dims()[1], weight.dims()[2], weight.dims()[3]];
    if groups == 0 || !c.is_multiple_of(groups) {
        return Err(Error::shape(
            OP,
            format!("groups = {groups} must divide the input's {c} channels"),
        ));
    }
    let o = og * groups;
    if let Some(b) = bias
        && b.dims() != [o]
    {
        return Err(Error::shape(OP, format!("the bias must have shape [{o}], got {}", b.shape())));
    }
    if stride.contains(&0) || dilation.contains(&0) || kh == 0 || kw == 0 {
        return Err(Error::shape(OP, "kernel size, stride and dilation must be at least 1"));
    }
    for i in 0..2 {
        if output_padding[i] >= stride[i].max(dilation[i]) {
            return Err(Error::shape(
                OP,
                format!(
                    "output_padding {output_padding:?} must be less than the stride {stride:?} or the dilation {dilation:?}"
                ),
            ));
        }
    }
    // The uncropped output: every input pixel's window, plus the output padding.
    let full = |size: usize, k: usize, i: usize| {
        (size - 1) * stride[i] + dilation[i] * (k - 1) + 1 + output_padding[i]
    };
    let [hp, wp] = [full(h, kh, 0), full(w, kw, 1)];
    if hp <= 2 * padding[0] || wp <= 2 * padding[1] || h == 0 || w == 0 {
        return Err(Error::shape(
            OP,
            format!("padding {padding:?} leaves no output for an input of shape {}", input.shape()),
        ));
    }
    let (g, cg) = (groups as i64, (c / groups) as i64);
    // Per group: [O/G·KH·KW, C/G] times [C/G, H·W] gives each pixel's window contributions.
    let wt = weight.try_reshape(&[g, cg, (og * kh * kw) as i64])?.try_transpose(1, 2)?;
    let x = input.try_reshape(&[n as i64, g, cg, (h * w) as i64])?;
    let cols = wt
        .try_matmul(&x)?
        .try_reshape(&[n as i64, o as i64, kh as i64, kw as i64, h as i64, w as i64])?
        .try_permute(&[0, 1, 4, 5, 2, 3])?;
    let image = col2im(&cols, [n, o, hp, wp], stride, dilation)?;
    let out = image.try_narrow(2, padding[0], hp - 2 * padding[0])?.try_narrow(
        3,
        padding[1],
        wp - 2 * padding[1],
    )?;
    match bias {
        Some(b) => out.try_add(&b.try_reshape(&[1, o as i64, 1, 1])?),
        None => Ok(out),
    }
}

/// A 2-D transposed convolution layer (PyTorch's `nn.ConvTranspose2d`), initialized as
/// PyTorch does (uniform in `±1/sqrt(fan_in)` with `fan_in = (O / groups)·KH·KW`).
///
/// ```
/// use kiln::nn::{ConvTranspose2d, Module};
/// use kiln::nn::functional::ConvTranspose2dOptions;
/// use kiln::prelude::*;
/// let up = ConvTranspose2d::new(8, 4, [2, 2], ConvTranspose2dOptions { stride: [2, 2], ..Default::default() });
/// assert_eq!(up.forward(&Tensor::randn([1, 8, 5, 6])).dims(), &[1, 4, 10, 12]);
/// ```
#[derive(Clone, Debug)]
pub struct ConvTranspose2d {
    /// `[in_channels, out_channels / groups, KH, KW]`.
    pub weight: Tensor,
    /// `[out_channels]`.
    pub bias: Option<Tensor>,
    /// Stride, padding, output padding, groups and dilation.
    pub options: ConvTranspose2dOptions,
}

impl ConvTranspose2d {
    /// A layer with a bias, in `f32`.
    ///
    /// # Panics
    /// As [`ConvTranspose2d::try_new`] fails.
    #[must_use]
    #[track_caller]
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel_size: [usize; 2],
        options: ConvTranspose2dOptions,
    ) -> ConvTranspose2d {
        ok(ConvTranspose2d::try_new(in_channels, out_channels, kernel_size, options))
    }

    /// [`ConvTranspose2d::new`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when `groups` does not divide both channel counts, or the kernel
    /// size is 0.
    #[track_caller]
    pub fn try_new(
        in_channels: usize,
        out_channels: usize,
        kernel_size: [usize; 2],
        options: ConvTranspose2dOptions,
    ) -> Result<ConvTranspose2d> {
        let g = options.groups;
        let (weight, bias) = super::conv::layer_parameters(
            "ConvTranspose2d",
            [in_channels, out_channels],
            &kernel_size,
            g,
            &[in_channels, out_channels / g.max(1), kernel_size[0], kernel_size[1]],
            out_channels / g.max(1),
        )?;
        Ok(ConvTranspose2d { weight, bias: Some(bias), options })
    }
}

crate::parameters!(ConvTranspose2d { weight, bias });

impl Module for ConvTranspose2d {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        try_conv_transpose2d(input, &self.weight, self.bias.as_ref(), self.options)
    }
}
