//! Functions and layers that change a tensor's spatial size: padding in four modes,
//! interpolation (nearest, bilinear), `Upsample` and `Flatten`.
//!
//! All of them are ordinary recorded ops: a pad is a concatenation of slices (flipped for
//! `reflect`, broadcast for `replicate`), nearest interpolation picks rows and columns with
//! `index_select`, and bilinear interpolation is a product with a small interpolation matrix
//! on each side. Their gradients come from those ops.

use super::{Module, Parameters};
use crate::error::ok;
use crate::{Error, Result, Tensor};
use kiln_ir::{Op, Shape, View};

/// How [`pad`] fills the new border (PyTorch's `mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PadMode {
    /// A constant value (`value`, 0 by default).
    #[default]
    Constant,
    /// The input mirrored at its edge, the edge itself not repeated: `[1 2 3]` padded by 2
    /// is `[3 2 1 2 3 2 1]`.
    Reflect,
    /// The edge value repeated: `[1 1 1 2 3 3 3]`.
    Replicate,
    /// The input wrapped around: `[2 3 1 2 3 1 2]`.
    Circular,
}

/// Pads the last dimensions of `input`, PyTorch's `F.pad`: `padding` lists `(before, after)`
/// pairs starting from the **last** dimension, `[left, right, top, bottom, ...]`. In
/// `Constant` mode a negative amount crops.
///
/// # Panics
/// As [`try_pad`] fails.
///
/// ```
/// use kiln::nn::functional::{self as F, PadMode};
/// use kiln::prelude::*;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [1, 3]);
/// assert_eq!(F::pad(&x, &[2, 2], PadMode::Reflect, 0.0).to_vec::<f32>(), [3., 2., 1., 2., 3., 2., 1.]);
/// assert_eq!(F::pad(&x, &[2, 2], PadMode::Replicate, 0.0).to_vec::<f32>(), [1., 1., 1., 2., 3., 3., 3.]);
/// assert_eq!(F::pad(&x, &[2, 2], PadMode::Circular, 0.0).to_vec::<f32>(), [2., 3., 1., 2., 3., 1., 2.]);
/// assert_eq!(F::pad(&x, &[1, -1], PadMode::Constant, 9.0).to_vec::<f32>(), [9., 1., 2.]);
/// ```
#[track_caller]
pub fn pad(input: &Tensor, padding: &[i64], mode: PadMode, value: f64) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_pad(input, padding, mode, value))
}

/// [`pad`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when `padding` has an odd length or more pairs than the input has
/// dimensions, a non-constant mode pads more than it can (`reflect`: less than the size;
/// `circular`: at most the size), or an amount is negative outside `Constant` mode.
#[track_caller]
pub fn try_pad(input: &Tensor, padding: &[i64], mode: PadMode, value: f64) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    const OP: &str = "pad";
    if !padding.len().is_multiple_of(2) || padding.len() / 2 > input.ndim() {
        return Err(Error::shape(
            OP,
            format!(
                "padding {padding:?} must hold (before, after) pairs for at most the input's {} dimensions (shape {}), last dimension first",
                input.ndim(),
                input.shape()
            ),
        ));
    }
    if mode == PadMode::Constant && value == 0.0 && padding.iter().all(|&p| p >= 0) {
        return zero_pad(input, padding);
    }
    let mut x = input.clone();
    for (pair, amounts) in padding.chunks(2).enumerate() {
        let axis = input.ndim() - 1 - pair;
        x = pad_axis(&x, axis, amounts[0], amounts[1], mode, value)?;
    }
    Ok(x)
}

/// Zero padding as one op: the input written into a zero tensor of the padded shape (the
/// adjoint of the slice that would cut it back out), so its gradient is that slice, a view.
#[track_caller]
fn zero_pad(input: &Tensor, padding: &[i64]) -> Result<Tensor> {
    if padding.iter().all(|&p| p == 0) {
        return Ok(input.clone());
    }
    let mut dims = input.dims().to_vec();
    let mut before = vec![0usize; dims.len()];
    for (pair, amounts) in padding.chunks(2).enumerate() {
        let axis = dims.len() - 1 - pair;
        before[axis] = amounts[0] as usize;
        dims[axis] += (amounts[0] + amounts[1]) as usize;
    }
    let padded = Shape::new(dims);
    padded.check_size("pad", input.dtype())?;
    let strides = View::contiguous(padded.clone()).strides().to_vec();
    let offset: usize = before.iter().zip(&strides).map(|(&b, &s)| b * s as usize).sum();
    let view = View::from_parts(input.shape().clone(), strides, offset);
    Tensor::from_op(Op::Unview { view, shape: padded }, &[input])
}

/// `x` padded along `axis` by `before` and `after`.
#[track_caller]
fn pad_axis(
    x: &Tensor,
    axis: usize,
    before: i64,
    after: i64,
    mode: PadMode,
    value: f64,
) -> Result<Tensor> {
    const OP: &str = "pad";
    let len = x.dims()[axis] as i64;
    let a = axis as i64;
    if mode == PadMode::Constant {
        // Crops first, so a negative amount never reads past the other side's padding.
        let (crop_l, crop_r) = ((-before).max(0), (-after).max(0));
        if crop_l + crop_r > len {
            return Err(Error::shape(
                OP,
                format!("cropping {crop_l} + {crop_r} exceeds dimension {axis} of size {len}"),
            ));
        }
        let core = x.try_narrow(a, crop_l as usize, (len - crop_l - crop_r) as usize)?;
        let side = |n: i64| -> Result<Tensor> {
            let mut dims = x.dims().to_vec();
            dims[axis] = n as usize;
            Tensor::try_full_dtype(dims, value, x.dtype())?.try_to(x.device())
        };
        let mut parts = Vec::new();
        if before > 0 {
            parts.push(side(before)?);
        }
        parts.push(core);
        if after > 0 {
            parts.push(side(after)?);
        }
        return Tensor::try_cat(&parts.iter().collect::<Vec<_>>(), a);
    }
    if before < 0 || after < 0 {
        return Err(Error::shape(
            OP,
            format!("{mode:?} padding cannot be negative, got {before}, {after}"),
        ));
    }
    let limit_ok = match mode {
        PadMode::Reflect => before < len && after < len,
        _ if len == 0 => before == 0 && after == 0,
        PadMode::Circular => before <= len && after <= len,
        _ => true,
    };
    if !limit_ok {
        return Err(Error::shape(
            OP,
            format!(
                "{mode:?} padding of ({before}, {after}) is too large for dimension {axis} of size {len}{}",
                if mode == PadMode::Reflect { "; it must be less than the size" } else { "" }
            ),
        ));
    }
    let (b, e) = (before as usize, after as usize);
    let n = len as usize;
    let (left, right) = match mode {
        PadMode::Reflect => {
            (x.try_narrow(a, 1, b)?.try_flip(&[a])?, x.try_narrow(a, n - 1 - e, e)?.try_flip(&[a])?)
        }
        PadMode::Replicate => {
            let mut dims: Vec<i64> = x.dims().iter().map(|&d| d as i64).collect();
            dims[axis] = before;
            let l = x.try_narrow(a, 0, 1)?.try_expand(&dims)?;
            dims[axis] = after;
            let r = x.try_narrow(a, n - 1, 1)?.try_expand(&dims)?;
            (l, r)
        }
        PadMode::Circular => (x.try_narrow(a, n - b, b)?, x.try_narrow(a, 0, e)?),
        PadMode::Constant => unreachable!("handled above"),
    };
    Tensor::try_cat(&[&left, x, &right], a)
}

/// How [`interpolate`] computes new values (PyTorch's `mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum InterpolateMode {
    /// The nearest source pixel (PyTorch's `nearest`: `floor(dst · in / out)`).
    #[default]
    Nearest,
    /// Linear in each of the two spatial dimensions.
    Bilinear,
}

/// The target of [`interpolate`]: an output size or a scale factor, as PyTorch's `size` and
/// `scale_factor`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Resize {
    /// The output's `[height, width]`.
    Size([usize; 2]),
    /// Multiply the height and width by these (the output size is rounded down).
    Scale([f64; 2]),
}

/// Resizes `[N, C, H, W]` images, PyTorch's `F.interpolate` for 2-D inputs. With
/// `align_corners` (bilinear only) the corner pixels of input and output line up exactly;
/// without it (the default) pixels are treated as areas, as PyTorch does.
///
/// # Panics
/// As [`try_interpolate`] fails.
///
/// ```
/// use kiln::nn::functional::{self as F, InterpolateMode, Resize};
/// use kiln::prelude::*;
/// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [1, 1, 2, 2]);
/// let up = F::interpolate(&x, Resize::Scale([2.0, 2.0]), InterpolateMode::Nearest, false);
/// assert_eq!(up.to_vec::<f32>()[..4], [1.0, 1.0, 2.0, 2.0]);
/// let smooth = F::interpolate(&x, Resize::Size([3, 3]), InterpolateMode::Bilinear, true);
/// assert_eq!(smooth.to_vec::<f32>()[4], 2.5); // the center: the mean of all four
/// ```
#[track_caller]
pub fn interpolate(
    input: &Tensor,
    size: Resize,
    mode: InterpolateMode,
    align_corners: bool,
) -> Tensor {
    let _at = crate::engine::origin::enter();
    ok(try_interpolate(input, size, mode, align_corners))
}

/// [`interpolate`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the input is not `[N, C, H, W]` or the output would be empty;
/// [`Error::Value`] for a non-positive scale factor or `align_corners` with nearest
/// interpolation; [`Error::DType`] for non-float input.
#[track_caller]
pub fn try_interpolate(
    input: &Tensor,
    size: Resize,
    mode: InterpolateMode,
    align_corners: bool,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    const OP: &str = "interpolate";
    super::conv::check_image(OP, input)?;
    if align_corners && mode == InterpolateMode::Nearest {
        return Err(Error::value(OP, "align_corners only applies to bilinear interpolation"));
    }
    let (h, w) = (input.dims()[2], input.dims()[3]);
    let (out, scale) = match size {
        Resize::Size(s) => (s, [h as f64 / s[0] as f64, w as f64 / s[1] as f64]),
        Resize::Scale(f) => {
            if !(f[0] > 0.0 && f[1] > 0.0 && f[0].is_finite() && f[1].is_finite()) {
                return Err(Error::value(OP, format!("scale factors must be positive, got {f:?}")));
            }
            (
                [(h as f64 * f[0]).floor() as usize, (w as f64 * f[1]).floor() as usize],
                [1.0 / f[0], 1.0 / f[1]],
            )
        }
    };
    if out.contains(&0) {
        return Err(Error::shape(
            OP,
            format!("the output size {out:?} is empty for an input of shape {}", input.shape()),
        ));
    }
    match mode {
        InterpolateMode::Nearest => {
            let pick = |n_in: usize, n_out: usize, scale: f64| -> Result<Tensor> {
                let idx: Vec<i64> = (0..n_out)
                    .map(|d| ((d as f64 * scale).floor() as i64).min(n_in as i64 - 1))
                    .collect();
                Tensor::try_from_vec(idx, [n_out])?.try_to(input.device())
            };
            input
                .try_index_select(2, &pick(h, out[0], scale[0])?)?
                .try_index_select(3, &pick(w, out[1], scale[1])?)
        }
        InterpolateMode::Bilinear => {
            let mh = linear_weights(h, out[0], scale[0], align_corners, input)?;
            let mw = linear_weights(w, out[1], scale[1], align_corners, input)?;
            mh.try_matmul(input)?.try_matmul(&mw.try_transpose(0, 1)?)
        }
    }
}

/// The `[n_out, n_in]` matrix of linear interpolation weights along one axis.
fn linear_weights(
    n_in: usize,
    n_out: usize,
    scale: f64,
    align_corners: bool,
    like: &Tensor,
) -> Result<Tensor> {
    let mut m = vec![0.0; n_out * n_in];
    for d in 0..n_out {
        let src = if align_corners {
            if n_out > 1 { d as f64 * (n_in - 1) as f64 / (n_out - 1) as f64 } else { 0.0 }
        } else {
            ((d as f64 + 0.5) * scale - 0.5).max(0.0)
        };
        let i0 = (src.floor() as usize).min(n_in - 1);
        let i1 = (i0 + 1).min(n_in - 1);
        let l = (src - i0 as f64).clamp(0.0, 1.0);
        m[d * n_in + i0] += 1.0 - l;
        m[d * n_in + i1] += l;
    }
    constant(m, &[n_out, n_in], like)
}

/// A constant `f64` table as a tensor of `like`'s dtype on `like`'s device.
pub(super) fn constant(data: Vec<f64>, shape: &[usize], like: &Tensor) -> Result<Tensor> {
    Tensor::try_from_vec(data, shape.to_vec())?.to_dtype(like.dtype()).try_to(like.device())
}

/// Resizes images by [`interpolate`] (PyTorch's `nn.Upsample`).
///
/// ```
/// use kiln::nn::{Module, Upsample};
/// use kiln::nn::functional::{InterpolateMode, Resize};
/// use kiln::prelude::*;
/// let up = Upsample { size: Resize::Scale([2.0, 3.0]), mode: InterpolateMode::Nearest, align_corners: false };
/// assert_eq!(up.forward(&Tensor::zeros([1, 2, 4, 4])).dims(), &[1, 2, 8, 12]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Upsample {
    /// The output size or scale factor.
    pub size: Resize,
    /// Nearest or bilinear.
    pub mode: InterpolateMode,
    /// Align corner pixels (bilinear only).
    pub align_corners: bool,
}

/// Flattens every dimension after the first (PyTorch's `nn.Flatten()`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flatten;

impl Parameters for Upsample {
    fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Tensor)) {}
    fn visit_mut(&mut self, _: &str, _: &mut dyn FnMut(&str, &mut Tensor)) {}
}

impl Parameters for Flatten {
    fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Tensor)) {}
    fn visit_mut(&mut self, _: &str, _: &mut dyn FnMut(&str, &mut Tensor)) {}
}

impl Module for Upsample {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        try_interpolate(input, self.size, self.mode, self.align_corners)
    }
}

impl Module for Flatten {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        let _at = crate::engine::origin::enter();
        let n = input.dims().first().copied().unwrap_or(1) as i64;
        input.try_reshape(&[n, -1])
    }
}
