//! Spatial transformers: `affine_grid` (the sampling positions of an affine map) and
//! `grid_sample` (bilinear sampling at positions, zeros outside), as PyTorch's, with
//! gradients to the image and to the grid.

use crate::error::ok;
use crate::{Error, Result, Tensor};

/// Normalized coordinates of `n` pixel centres (`-1` and `1` the edge pixels' centres with
/// `align_corners`, else the image's edges).
fn base_coordinates(n: usize, align_corners: bool) -> Vec<f64> {
    (0..n)
        .map(|i| match (align_corners, n) {
            (true, 1) => 0.0,
            (true, _) => -1.0 + 2.0 * i as f64 / (n - 1) as f64,
            (false, _) => (2.0 * i as f64 + 1.0) / n as f64 - 1.0,
        })
        .collect()
}

/// The sampling grid `[N, H, W, 2]` (x, y) of the affine maps `theta` (`[N, 2, 3]`) over an
/// output of `size` `[N, C, H, W]` (PyTorch's `affine_grid`).
///
/// ```
/// use kiln::nn::functional::affine_grid;
/// use kiln::prelude::*;
/// let identity = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 0.0, 1.0, 0.0], [1, 2, 3]);
/// let grid = affine_grid(&identity, [1, 1, 2, 2], true);
/// assert_eq!(grid.to_vec::<f32>(), [-1.0, -1.0, 1.0, -1.0, -1.0, 1.0, 1.0, 1.0]);
/// ```
#[track_caller]
pub fn affine_grid(theta: &Tensor, size: [usize; 4], align_corners: bool) -> Tensor {
    ok(try_affine_grid(theta, size, align_corners))
}

/// [`affine_grid`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] unless `theta` is `[N, 2, 3]` with `size`'s `N`.
#[track_caller]
pub fn try_affine_grid(theta: &Tensor, size: [usize; 4], align_corners: bool) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    let [n, _, h, w] = size;
    if theta.dims() != [n, 2, 3] {
        return Err(Error::shape(
            "affine_grid",
            format!("takes theta [{n}, 2, 3] for size {size:?}, got {}", theta.shape()),
        ));
    }
    let (xs, ys) = (base_coordinates(w, align_corners), base_coordinates(h, align_corners));
    let mut base = Vec::with_capacity(h * w * 3);
    for y in &ys {
        for x in &xs {
            base.extend([*x, *y, 1.0]);
        }
    }
    let base =
        Tensor::try_from_vec(base, [h * w, 3])?.to_dtype(theta.dtype()).try_to(theta.device())?;
    // [H·W, 3] @ [N, 3, 2] -> [N, H·W, 2].
    let grid = base.try_matmul(&theta.try_transpose(1, 2)?)?;
    grid.try_reshape(&[n as i64, h as i64, w as i64, 2])
}

/// Samples `input` (`[N, C, H, W]`) at `grid` (`[N, Ho, Wo, 2]`, normalized x and y)
/// bilinearly, zeros outside the image (PyTorch's `grid_sample` with `mode="bilinear"`,
/// `padding_mode="zeros"`): `[N, C, Ho, Wo]`.
///
/// ```
/// use kiln::nn::functional::{affine_grid, grid_sample};
/// use kiln::prelude::*;
/// let image = Tensor::randn([1, 3, 4, 5]);
/// let identity = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 0.0, 1.0, 0.0], [1, 2, 3]);
/// let same = grid_sample(&image, &affine_grid(&identity, [1, 3, 4, 5], false), false);
/// assert!((same - &image).abs().max().item::<f32>() < 1e-5);
/// ```
#[track_caller]
pub fn grid_sample(input: &Tensor, grid: &Tensor, align_corners: bool) -> Tensor {
    ok(try_grid_sample(input, grid, align_corners))
}

/// [`grid_sample`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] unless `input` is `[N, C, H, W]` and `grid` `[N, Ho, Wo, 2]`.
#[track_caller]
pub fn try_grid_sample(input: &Tensor, grid: &Tensor, align_corners: bool) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    let fits = input.ndim() == 4
        && grid.ndim() == 4
        && grid.dims()[3] == 2
        && grid.dims()[0] == input.dims()[0];
    if !fits {
        return Err(Error::shape(
            "grid_sample",
            format!(
                "takes input [N, C, H, W] and grid [N, Ho, Wo, 2], got {} and {}",
                input.shape(),
                grid.shape()
            ),
        ));
    }
    let [n, c, h, w] = [input.dims()[0], input.dims()[1], input.dims()[2], input.dims()[3]];
    let (ho, wo) = (grid.dims()[1], grid.dims()[2]);
    let grid = grid.to_dtype(input.dtype());
    // Pixel coordinates of each sample.
    let unnormalize = |g: Tensor, size: usize| {
        let size = size as f64;
        if align_corners {
            (g + 1.0) * ((size - 1.0) / 2.0)
        } else {
            ((g + 1.0) * size - 1.0) / 2.0
        }
    };
    let ix =
        unnormalize(grid.try_select(3, 0)?, w).try_reshape(&[n as i64, 1, (ho * wo) as i64])?;
    let iy =
        unnormalize(grid.try_select(3, 1)?, h).try_reshape(&[n as i64, 1, (ho * wo) as i64])?;
    let (x0, y0) = (ix.floor().detach(), iy.floor().detach());
    let flat = input.try_reshape(&[n as i64, c as i64, (h * w) as i64])?;
    let mut out: Option<Tensor> = None;
    for (dx, dy) in [(0.0, 0.0), (1.0, 0.0), (0.0, 1.0), (1.0, 1.0)] {
        let (xc, yc) = (&x0 + dx, &y0 + dy);
        // The weight of this corner: 1 - distance along each axis.
        let wx = if dx == 0.0 { 1.0 - (&ix - &x0) } else { &ix - &x0 };
        let wy = if dy == 0.0 { 1.0 - (&iy - &y0) } else { &iy - &y0 };
        let inside = xc
            .ge(0.0)
            .logical_and(xc.le((w - 1) as f64))
            .logical_and(yc.ge(0.0))
            .logical_and(yc.le((h - 1) as f64));
        let at = (yc.clamp(0.0, (h - 1) as f64) * w as f64 + xc.clamp(0.0, (w - 1) as f64)).long();
        let at = at.try_expand(&[n as i64, c as i64, (ho * wo) as i64])?;
        let value = flat.try_gather(2, &at)?;
        let term = Tensor::try_where_(&inside, &(value * (wx * wy)), 0.0)?;
        out = Some(match out {
            Some(o) => o + term,
            None => term,
        });
    }
    let out = out.expect("four corners were added");
    out.try_reshape(&[n as i64, c as i64, ho as i64, wo as i64])
}
