//! Pixel shuffles (PyTorch's `pixel_shuffle`, `pixel_unshuffle` and their modules): channels
//! traded for resolution by a reshape and a permutation, as in sub-pixel convolution.

use super::{Module, Parameters};
use crate::error::ok;
use crate::{Error, Result, Tensor};

/// `[.., C·r², H, W] -> [.., C, H·r, W·r]`: each group of `r²` channels spread over an
/// `r × r` block of pixels.
///
/// ```
/// use kiln::nn::functional as F;
/// use kiln::prelude::*;
/// let x = Tensor::arange(0i64, 4, 1).reshape(&[1, 4, 1, 1]);
/// assert_eq!(F::pixel_shuffle(&x, 2).to_vec::<i64>(), [0, 1, 2, 3]);
/// assert_eq!(F::pixel_shuffle(&x, 2).dims(), [1, 1, 2, 2]);
/// ```
///
/// # Panics
/// As [`try_pixel_shuffle`] fails.
#[must_use]
#[track_caller]
pub fn pixel_shuffle(x: &Tensor, upscale: usize) -> Tensor {
    ok(try_pixel_shuffle(x, upscale))
}

/// [`pixel_shuffle`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] for fewer than 3 dimensions, a factor of 0, or channels not divisible
/// by `upscale²`.
#[track_caller]
pub fn try_pixel_shuffle(x: &Tensor, upscale: usize) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    let (lead, [c, h, w]) = split("pixel_shuffle", x, upscale)?;
    let r = upscale as i64;
    if c % (r * r) != 0 {
        return Err(Error::shape(
            "pixel_shuffle",
            format!("{c} channels (shape {}) are not a multiple of {r}² = {}", x.shape(), r * r),
        ));
    }
    let k = lead.len();
    let mut split_dims = lead.clone();
    split_dims.extend([c / (r * r), r, r, h, w]);
    let mut order: Vec<i64> = (0..k as i64).collect();
    order.extend([0, 3, 1, 4, 2].map(|d| k as i64 + d));
    let mut out = lead;
    out.extend([c / (r * r), h * r, w * r]);
    x.try_reshape(&split_dims)?.try_permute(&order)?.try_reshape(&out)
}

/// `[.., C, H·r, W·r] -> [.., C·r², H, W]`, the inverse of [`pixel_shuffle`].
///
/// # Panics
/// As [`try_pixel_unshuffle`] fails.
#[must_use]
#[track_caller]
pub fn pixel_unshuffle(x: &Tensor, downscale: usize) -> Tensor {
    ok(try_pixel_unshuffle(x, downscale))
}

/// [`pixel_unshuffle`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] for fewer than 3 dimensions, a factor of 0, or a height or width not
/// divisible by `downscale`.
#[track_caller]
pub fn try_pixel_unshuffle(x: &Tensor, downscale: usize) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    let (lead, [c, h, w]) = split("pixel_unshuffle", x, downscale)?;
    let r = downscale as i64;
    if h % r != 0 || w % r != 0 {
        return Err(Error::shape(
            "pixel_unshuffle",
            format!("height and width of {} are not multiples of {r}", x.shape()),
        ));
    }
    let k = lead.len();
    let mut split_dims = lead.clone();
    split_dims.extend([c, h / r, r, w / r, r]);
    let mut order: Vec<i64> = (0..k as i64).collect();
    order.extend([0, 2, 4, 1, 3].map(|d| k as i64 + d));
    let mut out = lead;
    out.extend([c * r * r, h / r, w / r]);
    x.try_reshape(&split_dims)?.try_permute(&order)?.try_reshape(&out)
}

/// The leading dimensions and `[C, H, W]` of `x`, after checking the rank and the factor.
fn split(op: &'static str, x: &Tensor, factor: usize) -> Result<(Vec<i64>, [i64; 3])> {
    let dims: Vec<i64> = x.dims().iter().map(|&d| d as i64).collect();
    if dims.len() < 3 || factor == 0 {
        return Err(Error::shape(
            op,
            format!(
                "takes [.., C, H, W] and a factor of at least 1, got {} and {factor}",
                x.shape()
            ),
        ));
    }
    let n = dims.len();
    Ok((dims[..n - 3].to_vec(), [dims[n - 3], dims[n - 2], dims[n - 1]]))
}

/// [`pixel_shuffle`] as a module (PyTorch's `nn.PixelShuffle`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PixelShuffle(pub usize);

/// [`pixel_unshuffle`] as a module (PyTorch's `nn.PixelUnshuffle`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PixelUnshuffle(pub usize);

impl Parameters for PixelShuffle {
    fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Tensor)) {}
    fn visit_mut(&mut self, _: &str, _: &mut dyn FnMut(&str, &mut Tensor)) {}
}

impl Parameters for PixelUnshuffle {
    fn visit(&self, _: &str, _: &mut dyn FnMut(&str, &Tensor)) {}
    fn visit_mut(&mut self, _: &str, _: &mut dyn FnMut(&str, &mut Tensor)) {}
}

impl Module for PixelShuffle {
    #[track_caller]
    fn try_forward(&self, x: &Tensor) -> Result<Tensor> {
        try_pixel_shuffle(x, self.0)
    }
}

impl Module for PixelUnshuffle {
    #[track_caller]
    fn try_forward(&self, x: &Tensor) -> Result<Tensor> {
        try_pixel_unshuffle(x, self.0)
    }
}
