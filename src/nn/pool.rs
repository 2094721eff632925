//! Pooling over 2-D images: a reduction over a view of overlapping windows (no copy), as
//! convolution is a product over the same view. Adaptive pooling picks its windows from the
//! input and output sizes, as PyTorch's does.

use super::conv::{check_image, windows};
use super::resize::constant;
use super::{Module, Parameters};
use crate::error::ok;
use crate::{Error, Result, Tensor};

/// The options of [`max_pool2d`] and [`avg_pool2d`]: PyTorch's, with `stride` defaulting to
/// the kernel size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool2dOptions {
    /// The window's size.
    pub kernel_size: [usize; 2],
    /// Step between windows (`None`: the kernel size).
    pub stride: Option<[usize; 2]>,
    /// Padding on each side (`-inf` for max pooling, zeros for average pooling).
    pub padding: [usize; 2],
    /// Step between the elements of a window (max pooling only).
    pub dilation: [usize; 2],
    /// Round the output size up, so a last partial window is kept (PyTorch's `ceil_mode`).
    pub ceil_mode: bool,
    /// Average pooling divides by the window's size padding included (`true`, the
    /// default) or by the count of input elements it covers.
    pub count_include_pad: bool,
}

impl Pool2dOptions {
    /// Windows of `kernel_size`, stepping by the kernel size, without padding.
    pub fn new(kernel_size: [usize; 2]) -> Pool2dOptions {
        Pool2dOptions {
            kernel_size,
            stride: None,
            padding: [0, 0],
            dilation: [1, 1],
            ceil_mode: false,
            count_include_pad: true,
        }
    }

    /// With this stride.
    #[must_use]
    pub fn stride(mut self, stride: [usize; 2]) -> Pool2dOptions {
        self.stride = Some(stride);
        self
    }

    /// With this padding.
    #[must_use]
    pub fn padding(mut self, padding: [usize; 2]) -> Pool2dOptions {
        self.padding = padding;
        self
    }

    /// With this dilation.
    #[must_use]
    pub fn dilation(mut self, dilation: [usize; 2]) -> Pool2dOptions {
        self.dilation = dilation;
        self
    }

    /// With the output size rounded up.
    #[must_use]
    pub fn ceil_mode(mut self, ceil_mode: bool) -> Pool2dOptions {
        self.ceil_mode = ceil_mode;
        self
    }

    /// Whether average pooling counts padding in its divisor.
    #[must_use]
    pub fn count_include_pad(mut self, count_include_pad: bool) -> Pool2dOptions {
        self.count_include_pad = count_include_pad;
        self
    }
}

/// One axis of a pooling: how many windows, and where the padded input ends.
#[derive(Clone, Copy, Debug)]
struct Sweep {
    out: usize,
    /// Padding added after the input (at least what the last window reads).
    pad_after: usize,
}

/// PyTorch's output size of a pooling along one axis.
fn sweep(
    op: &'static str,
    size: usize,
    kernel: usize,
    stride: usize,
    pad: usize,
    dilation: usize,
    ceil: bool,
) -> Result<Sweep> {
    if stride == 0 || kernel == 0 || dilation == 0 {
        return Err(Error::shape(op, "kernel size, stride and dilation must be at least 1"));
    }
    if pad * 2 > kernel {
        return Err(Error::shape(
            op,
            format!("padding {pad} should be at most half of the kernel size {kernel}"),
        ));
    }
    let span = dilation * (kernel - 1) + 1;
    let room = size + 2 * pad;
    if room < span {
        return Err(Error::shape(
            op,
            format!(
                "a window spanning {span} does not fit an input of size {size} (after padding)"
            ),
        ));
    }
    let steps = room - span;
    let mut out = if ceil { steps.div_ceil(stride) } else { steps / stride } + 1;
    // The last window must start inside the input or its left padding.
    if ceil && (out - 1) * stride >= size + pad {
        out -= 1;
    }
    let needed = (out - 1) * stride + span;
    Ok(Sweep { out, pad_after: needed.saturating_sub(size + pad).max(pad) })
}

/// The windows `[N, C, OH, OW, KH, KW]` of `input` padded with `fill`.
#[track_caller]
fn pooled_windows(
    op: &'static str,
    input: &Tensor,
    o: &Pool2dOptions,
    fill: f64,
) -> Result<(Tensor, [Sweep; 2])> {
    check_image(op, input)?;
    let stride = o.stride.unwrap_or(o.kernel_size);
    let d = input.dims();
    let sh =
        sweep(op, d[2], o.kernel_size[0], stride[0], o.padding[0], o.dilation[0], o.ceil_mode)?;
    let sw =
        sweep(op, d[3], o.kernel_size[1], stride[1], o.padding[1], o.dilation[1], o.ceil_mode)?;
    let [ph, pw] = o.padding;
    let padded = super::resize::try_pad(
        input,
        &[pw as i64, sw.pad_after as i64, ph as i64, sh.pad_after as i64],
        super::resize::PadMode::Constant,
        fill,
    )?;
    let win = windows(op, &padded, o.kernel_size, stride, o.dilation)?;
    // The padded input may hold room for a window more than the sweep keeps.
    let win = win.try_narrow(2, 0, sh.out)?.try_narrow(3, 0, sw.out)?;
    Ok((win, [sh, sw]))
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
    let _at = crate::engine::origin::enter();
    ok(try_max_pool2d(input, options))
}

/// [`max_pool2d`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the input is not `[N, C, H, W]`, the padding exceeds half the
/// kernel (as PyTorch refuses), or no window fits; [`Error::DType`] for non-float input.
#[track_caller]
pub fn try_max_pool2d(input: &Tensor, options: Pool2dOptions) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    let (win, _) = pooled_windows("max_pool2d", input, &options, f64::NEG_INFINITY)?;
    win.try_amax([4i64, 5].as_slice(), false)
}

/// [`max_pool2d`] with the position of each maximum: indices into the flattened `H × W`
/// plane of the input (`i64`), as PyTorch's `return_indices=True`. The gradient goes to
/// the first maximum of each window.
///
/// # Panics
/// As [`try_max_pool2d_with_indices`] fails.
///
/// ```
/// use kiln::nn::functional as F;
/// use kiln::prelude::*;
/// let x = Tensor::from_vec(vec![1.0f32, 9.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [1, 1, 2, 4]);
/// let (values, indices) = F::max_pool2d_with_indices(&x, F::Pool2dOptions::new([2, 2]));
/// assert_eq!(values.to_vec::<f32>(), vec![9.0, 8.0]);
/// assert_eq!(indices.to_vec::<i64>(), vec![1, 7]);
/// ```
#[track_caller]
pub fn max_pool2d_with_indices(input: &Tensor, options: Pool2dOptions) -> (Tensor, Tensor) {
    let _at = crate::engine::origin::enter();
    ok(try_max_pool2d_with_indices(input, options))
}

/// [`max_pool2d_with_indices`], returning an error instead of panicking.
///
/// # Errors
/// As [`try_max_pool2d`].
#[track_caller]
pub fn try_max_pool2d_with_indices(
    input: &Tensor,
    options: Pool2dOptions,
) -> Result<(Tensor, Tensor)> {
    let _at = crate::engine::origin::enter();
    let (win, [sh, sw]) =
        pooled_windows("max_pool2d_with_indices", input, &options, f64::NEG_INFINITY)?;
    let d = win.dims().to_vec();
    let [kh, kw] = options.kernel_size;
    let flat = win.try_reshape(&[d[0] as i64, d[1] as i64, d[2] as i64, d[3] as i64, -1])?;
    let (values, k) = flat.try_max_dim(-1, false)?;
    // Position in the input plane = window origin + offset of element k in the window.
    let w = input.dims()[3] as i64;
    let stride = options.stride.unwrap_or(options.kernel_size);
    let [dh, dw] = options.dilation;
    let [ph, pw] = options.padding;
    let offsets: Vec<i64> =
        (0..kh * kw).map(|k| ((k / kw) * dh) as i64 * w + ((k % kw) * dw) as i64).collect();
    let origins: Vec<i64> = (0..sh.out)
        .flat_map(|i| {
            (0..sw.out).map(move |j| {
                ((i * stride[0]) as i64 - ph as i64) * w + (j * stride[1]) as i64 - pw as i64
            })
        })
        .collect();
    let offsets = Tensor::try_from_vec(offsets, [kh * kw])?.try_to(input.device())?;
    let origins = Tensor::try_from_vec(origins, [sh.out, sw.out])?.try_to(input.device())?;
    let picked = offsets.try_index_select(0, &k.try_reshape(&[-1])?)?.try_reshape(&[
        d[0] as i64,
        d[1] as i64,
        d[2] as i64,
        d[3] as i64,
    ])?;
    Ok((values, picked.try_add(&origins)?))
}

/// 2-D average pooling over `[N, C, H, W]`: the mean of each window, padding zeros counted
/// unless `count_include_pad` is off (PyTorch's semantics, `ceil_mode` included).
///
/// # Panics
/// As [`try_avg_pool2d`] fails.
///
/// ```
/// use kiln::nn::functional as F;
/// use kiln::prelude::*;
/// let x = Tensor::ones([1, 1, 3, 3]);
/// let o = F::Pool2dOptions::new([2, 2]).padding([1, 1]);
/// assert_eq!(F::avg_pool2d(&x, o).to_vec::<f32>()[0], 0.25);
/// assert_eq!(F::avg_pool2d(&x, o.count_include_pad(false)).to_vec::<f32>()[0], 1.0);
/// ```
#[track_caller]
pub fn avg_pool2d(input: &Tensor, options: Pool2dOptions) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_avg_pool2d(input, options))
}

/// [`avg_pool2d`], returning an error instead of panicking.
///
/// # Errors
/// As [`try_max_pool2d`]; a dilation other than 1 is refused (PyTorch has none).
#[track_caller]
pub fn try_avg_pool2d(input: &Tensor, options: Pool2dOptions) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    const OP: &str = "avg_pool2d";
    if options.dilation != [1, 1] {
        return Err(Error::shape(OP, "average pooling has no dilation"));
    }
    let (win, [sh, sw]) = pooled_windows(OP, input, &options, 0.0)?;
    let [kh, kw] = options.kernel_size;
    let plain = !options.ceil_mode
        || (sh.pad_after == options.padding[0] && sw.pad_after == options.padding[1]);
    if plain && (options.count_include_pad || options.padding == [0, 0]) {
        return win.try_mean_dim([4i64, 5].as_slice(), false);
    }
    // PyTorch's divisor: the window clipped to input + padding, then (without
    // count_include_pad) to the input itself.
    let stride = options.stride.unwrap_or(options.kernel_size);
    let divisor = |out: usize, k: usize, s: usize, p: usize, size: usize| -> Vec<f64> {
        (0..out)
            .map(|i| {
                let start = (i * s) as i64 - p as i64;
                let end = (start + k as i64).min((size + p) as i64);
                let full = end - start;
                let clipped = end.min(size as i64) - start.max(0);
                (if options.count_include_pad { full } else { clipped }) as f64
            })
            .collect()
    };
    let d = input.dims();
    let dh = divisor(sh.out, kh, stride[0], options.padding[0], d[2]);
    let dw = divisor(sw.out, kw, stride[1], options.padding[1], d[3]);
    let table: Vec<f64> = dh.iter().flat_map(|a| dw.iter().map(move |b| 1.0 / (a * b))).collect();
    let scale = constant(table, &[sh.out, sw.out], input)?;
    win.try_sum_dim([4i64, 5].as_slice(), false)?.try_mul(&scale)
}

/// Where adaptive pooling's window `i` of `out` starts and ends over `size` (PyTorch's
/// `floor(i·size/out)` to `ceil((i+1)·size/out)`).
fn adaptive_bounds(i: usize, size: usize, out: usize) -> (usize, usize) {
    (i * size / out, ((i + 1) * size).div_ceil(out))
}

/// Checks an adaptive pool's input and output size.
fn check_adaptive(op: &'static str, input: &Tensor, output_size: [usize; 2]) -> Result<()> {
    check_image(op, input)?;
    if output_size.contains(&0) || input.dims()[2] == 0 || input.dims()[3] == 0 {
        return Err(Error::shape(
            op,
            format!(
                "cannot pool an input of shape {} to an output size of {output_size:?}",
                input.shape()
            ),
        ));
    }
    Ok(())
}

/// Average pooling to a fixed output size (PyTorch's `F.adaptive_avg_pool2d`): window `i`
/// of `out` along an axis of `size` covers `floor(i·size/out)` to `ceil((i+1)·size/out)`.
///
/// # Panics
/// As [`try_adaptive_avg_pool2d`] fails.
///
/// ```
/// use kiln::nn::functional as F;
/// use kiln::prelude::*;
/// let x = Tensor::arange(0.0f32, 10.0, 1.0).view(&[1, 1, 2, 5]);
/// assert_eq!(F::adaptive_avg_pool2d(&x, [1, 1]).item::<f32>(), 4.5);
/// // Width 5 into 2 windows: columns 0..3 and 2..5 (they overlap at column 2).
/// let y = F::adaptive_avg_pool2d(&x, [1, 2]).to_vec::<f32>();
/// assert!((y[0] - 3.5).abs() < 1e-6 && (y[1] - 5.5).abs() < 1e-6);
/// ```
#[track_caller]
pub fn adaptive_avg_pool2d(input: &Tensor, output_size: [usize; 2]) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_adaptive_avg_pool2d(input, output_size))
}

/// [`adaptive_avg_pool2d`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the input is not `[N, C, H, W]` or a size is 0; [`Error::DType`]
/// for non-float input.
#[track_caller]
pub fn try_adaptive_avg_pool2d(input: &Tensor, output_size: [usize; 2]) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    check_adaptive("adaptive_avg_pool2d", input, output_size)?;
    let (h, w) = (input.dims()[2], input.dims()[3]);
    let [oh, ow] = output_size;
    if output_size == [1, 1] {
        return input.try_mean_dim([2i64, 3].as_slice(), true);
    }
    if h.is_multiple_of(oh) && w.is_multiple_of(ow) {
        return try_avg_pool2d(input, Pool2dOptions::new([h / oh, w / ow]));
    }
    // Uneven windows: a product with an averaging matrix on each side.
    let averaging = |out: usize, size: usize| -> Result<Tensor> {
        let mut m = vec![0.0; out * size];
        for i in 0..out {
            let (s, e) = adaptive_bounds(i, size, out);
            for j in s..e {
                m[i * size + j] = 1.0 / (e - s) as f64;
            }
        }
        constant(m, &[out, size], input)
    };
    averaging(oh, h)?.try_matmul(input)?.try_matmul(&averaging(ow, w)?.try_transpose(0, 1)?)
}

/// Max pooling to a fixed output size (PyTorch's `F.adaptive_max_pool2d`), with the windows
/// of [`adaptive_avg_pool2d`].
///
/// # Panics
/// As [`try_adaptive_max_pool2d`] fails.
///
/// ```
/// use kiln::nn::functional as F;
/// use kiln::prelude::*;
/// let x = Tensor::arange(0.0f32, 10.0, 1.0).view(&[1, 1, 2, 5]);
/// assert_eq!(F::adaptive_max_pool2d(&x, [1, 2]).to_vec::<f32>(), vec![7.0, 9.0]);
/// ```
#[track_caller]
pub fn adaptive_max_pool2d(input: &Tensor, output_size: [usize; 2]) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_adaptive_max_pool2d(input, output_size))
}

/// [`adaptive_max_pool2d`], returning an error instead of panicking.
///
/// # Errors
/// As [`try_adaptive_avg_pool2d`].
#[track_caller]
pub fn try_adaptive_max_pool2d(input: &Tensor, output_size: [usize; 2]) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    check_adaptive("adaptive_max_pool2d", input, output_size)?;
    let (h, w) = (input.dims()[2], input.dims()[3]);
    let [oh, ow] = output_size;
    if h.is_multiple_of(oh) && w.is_multiple_of(ow) {
        return try_max_pool2d(input, Pool2dOptions::new([h / oh, w / ow]));
    }
    // A maximum over a rectangle is a maximum over its rows of maxima over its columns.
    // Windows of uneven length repeat their last element up to the longest (a repeat never
    // changes a maximum); the repeats' gradients add back onto that one element.
    let along = |x: Tensor, axis: usize, size: usize, out: usize| -> Result<Tensor> {
        let longest =
            (0..out).map(|i| adaptive_bounds(i, size, out)).map(|(s, e)| e - s).max().unwrap_or(1);
        let idx: Vec<i64> = (0..out)
            .flat_map(|i| {
                let (s, e) = adaptive_bounds(i, size, out);
                (0..longest).map(move |k| (s + k).min(e - 1) as i64)
            })
            .collect();
        let idx = Tensor::try_from_vec(idx, [out * longest])?.try_to(input.device())?;
        let picked = x.try_index_select(axis as i64, &idx)?;
        let mut dims: Vec<i64> = picked.dims().iter().map(|&d| d as i64).collect();
        dims[axis] = out as i64;
        dims.insert(axis + 1, longest as i64);
        picked.try_reshape(&dims)?.try_amax((axis + 1) as i64, false)
    };
    let rows = along(input.clone(), 2, h, oh)?;
    along(rows, 3, w, ow)
}

/// Max pooling (PyTorch's `nn.MaxPool2d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxPool2d(pub Pool2dOptions);

/// Average pooling (PyTorch's `nn.AvgPool2d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvgPool2d(pub Pool2dOptions);

/// Average pooling to a fixed `[height, width]` (PyTorch's `nn.AdaptiveAvgPool2d`).
///
/// ```
/// use kiln::nn::{AdaptiveAvgPool2d, Module};
/// use kiln::prelude::*;
/// let gap = AdaptiveAvgPool2d([1, 1]);
/// assert_eq!(gap.forward(&Tensor::ones([2, 8, 5, 7])).dims(), &[2, 8, 1, 1]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveAvgPool2d(pub [usize; 2]);

/// Max pooling to a fixed `[height, width]` (PyTorch's `nn.AdaptiveMaxPool2d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveMaxPool2d(pub [usize; 2]);

macro_rules! pool_modules {
    ($($t:ty => $f:ident),*) => {$(
        impl Parameters for $t {
            fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Tensor)) {}
            fn visit_mut(&mut self, _: &str, _: &mut dyn FnMut(&str, &mut Tensor)) {}
        }

        impl Module for $t {
            #[track_caller]
            fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
                let _at = crate::engine::origin::enter();
                $f(input, self.0)
            }
        }
    )*};
}
pool_modules!(
    MaxPool2d => try_max_pool2d,
    AvgPool2d => try_avg_pool2d,
    AdaptiveAvgPool2d => try_adaptive_avg_pool2d,
    AdaptiveMaxPool2d => try_adaptive_max_pool2d
);
