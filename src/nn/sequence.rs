//! Layers over sequences and per-sample statistics: 1-D pooling (`max_pool1d`,
//! `avg_pool1d`, `adaptive_avg_pool1d` and their modules) and the transposed 1-D
//! convolution, as the 2-D ops over a height of one; instance norm, the bilinear layer, and
//! `gumbel_softmax`.

use super::fold::{ConvTranspose2dOptions, try_conv_transpose2d};
use super::pool::{
    Pool2dOptions, try_adaptive_avg_pool2d, try_adaptive_max_pool2d, try_avg_pool2d, try_max_pool2d,
};
use super::{Module, Parameters};
use crate::error::ok;
use crate::{Error, Result, Tensor};

/// 1-D pooling windows: `kernel_size`, `stride` (the kernel size when `None`), `padding`,
/// `dilation` (max pooling only), `ceil_mode`, `count_include_pad` (average pooling), as
/// PyTorch's `max_pool1d` and `avg_pool1d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pool1dOptions {
    /// The window's length.
    pub kernel_size: usize,
    /// Step between windows.
    pub stride: Option<usize>,
    /// Padding on each side.
    pub padding: usize,
    /// Step between a window's elements.
    pub dilation: usize,
    /// Keep a last partial window.
    pub ceil_mode: bool,
    /// Average pooling divides by the window's length padding included.
    pub count_include_pad: bool,
}

impl Pool1dOptions {
    /// Windows of `kernel_size`, stepping by it, without padding.
    pub fn new(kernel_size: usize) -> Pool1dOptions {
        Pool1dOptions {
            kernel_size,
            stride: None,
            padding: 0,
            dilation: 1,
            ceil_mode: false,
            count_include_pad: true,
        }
    }

    fn as_2d(self) -> Pool2dOptions {
        Pool2dOptions {
            kernel_size: [1, self.kernel_size],
            stride: Some([1, self.stride.unwrap_or(self.kernel_size)]),
            padding: [0, self.padding],
            dilation: [1, self.dilation],
            ceil_mode: self.ceil_mode,
            count_include_pad: self.count_include_pad,
        }
    }
}

/// `[N, C, L]` (or `[C, L]`) as `[N, C, 1, L]`, and the op's result back.
fn as_2d(
    op: &'static str,
    input: &Tensor,
    f: impl FnOnce(&Tensor) -> Result<Tensor>,
) -> Result<Tensor> {
    let batched = match input.ndim() {
        3 => input.clone(),
        2 => input.try_unsqueeze(0)?,
        _ => {
            return Err(Error::shape(
                op,
                format!("takes [N, C, L] or [C, L], got {}", input.shape()),
            ));
        }
    };
    let y = f(&batched.try_unsqueeze(2)?)?.try_squeeze(2)?;
    if input.ndim() == 2 { y.try_squeeze(0) } else { Ok(y) }
}

/// The maximum of each window along the last dimension (PyTorch's `max_pool1d`).
///
/// ```
/// use kiln::nn::functional::{Pool1dOptions, max_pool1d};
/// use kiln::prelude::*;
/// let x = Tensor::from_vec(vec![1.0f32, 3.0, 2.0, 5.0, 4.0], [1, 1, 5]);
/// assert_eq!(max_pool1d(&x, Pool1dOptions::new(2)).to_vec::<f32>(), [3.0, 5.0]);
/// ```
#[track_caller]
pub fn max_pool1d(input: &Tensor, options: Pool1dOptions) -> Tensor {
    ok(try_max_pool1d(input, options))
}

/// [`max_pool1d`], returning an error instead of panicking.
///
/// # Errors
/// As [`try_max_pool2d`] over the input with a height of one.
#[track_caller]
pub fn try_max_pool1d(input: &Tensor, options: Pool1dOptions) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    as_2d("max_pool1d", input, |x| try_max_pool2d(x, options.as_2d()))
}

/// The mean of each window along the last dimension (PyTorch's `avg_pool1d`).
#[track_caller]
pub fn avg_pool1d(input: &Tensor, options: Pool1dOptions) -> Tensor {
    ok(try_avg_pool1d(input, options))
}

/// [`avg_pool1d`], returning an error instead of panicking.
///
/// # Errors
/// As [`try_avg_pool2d`] over the input with a height of one.
#[track_caller]
pub fn try_avg_pool1d(input: &Tensor, options: Pool1dOptions) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    as_2d("avg_pool1d", input, |x| try_avg_pool2d(x, options.as_2d()))
}

/// Average pooling of the last dimension to `output_size` windows (PyTorch's
/// `adaptive_avg_pool1d`).
#[track_caller]
pub fn adaptive_avg_pool1d(input: &Tensor, output_size: usize) -> Tensor {
    ok(try_adaptive_avg_pool1d(input, output_size))
}

/// [`adaptive_avg_pool1d`], returning an error instead of panicking.
///
/// # Errors
/// As [`try_adaptive_avg_pool2d`].
#[track_caller]
pub fn try_adaptive_avg_pool1d(input: &Tensor, output_size: usize) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    as_2d("adaptive_avg_pool1d", input, |x| try_adaptive_avg_pool2d(x, [1, output_size]))
}

/// Max pooling of the last dimension to `output_size` windows (PyTorch's
/// `adaptive_max_pool1d`).
///
/// ```
/// use kiln::nn::functional::adaptive_max_pool1d;
/// use kiln::prelude::*;
/// let x = Tensor::from_vec(vec![1.0f32, 5.0, 2.0, 4.0, 3.0], [1, 1, 5]);
/// assert_eq!(adaptive_max_pool1d(&x, 2).to_vec::<f32>(), [5.0, 4.0]);
/// ```
#[track_caller]
pub fn adaptive_max_pool1d(input: &Tensor, output_size: usize) -> Tensor {
    ok(try_adaptive_max_pool1d(input, output_size))
}

/// [`adaptive_max_pool1d`], returning an error instead of panicking.
///
/// # Errors
/// As [`try_adaptive_max_pool2d`] over the input with a height of one.
#[track_caller]
pub fn try_adaptive_max_pool1d(input: &Tensor, output_size: usize) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    as_2d("adaptive_max_pool1d", input, |x| try_adaptive_max_pool2d(x, [1, output_size]))
}

/// Max pooling over sequences (PyTorch's `nn.MaxPool1d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxPool1d(pub Pool1dOptions);

/// Average pooling over sequences (PyTorch's `nn.AvgPool1d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvgPool1d(pub Pool1dOptions);

/// Average pooling to a fixed length (PyTorch's `nn.AdaptiveAvgPool1d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveAvgPool1d(pub usize);

/// Max pooling to a fixed length (PyTorch's `nn.AdaptiveMaxPool1d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdaptiveMaxPool1d(pub usize);

pool_modules!(
    MaxPool1d => try_max_pool1d,
    AvgPool1d => try_avg_pool1d,
    AdaptiveAvgPool1d => try_adaptive_avg_pool1d,
    AdaptiveMaxPool1d => try_adaptive_max_pool1d
);

/// Normalizes each sample's channels over their own positions (PyTorch's `instance_norm`
/// without running statistics): `[N, C, *]`, then `weight` and `bias` (`[C]`) if given.
///
/// ```
/// use kiln::nn::functional::instance_norm;
/// use kiln::prelude::*;
/// let y = instance_norm(&Tensor::randn([2, 3, 10]), None, None, 1e-5);
/// assert!(y.mean_dim(2, false).abs().max().item::<f32>() < 1e-5);
/// ```
#[track_caller]
pub fn instance_norm(
    input: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Tensor {
    ok(try_instance_norm(input, weight, bias, eps))
}

/// [`instance_norm`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] for an input of fewer than 3 dimensions or a weight or bias not `[C]`.
#[track_caller]
pub fn try_instance_norm(
    input: &Tensor,
    weight: Option<&Tensor>,
    bias: Option<&Tensor>,
    eps: f64,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    if input.ndim() < 3 {
        return Err(Error::shape(
            "instance_norm",
            format!(
                "takes [N, C, ...] with at least one position dimension, got {}",
                input.shape()
            ),
        ));
    }
    // Instance norm is group norm with one channel per group.
    super::norm::try_group_norm(input, input.dims()[1], weight, bias, eps)
}

/// Instance normalization (PyTorch's `nn.InstanceNorm1d`/`2d`/`3d`, which differ only in
/// the rank they take): per-channel `weight` and `bias` when `affine` (PyTorch's default
/// is without); running statistics are not kept (`track_running_stats=False`).
#[derive(Clone, Debug)]
pub struct InstanceNorm {
    /// Added to the variance (`1e-5`).
    pub eps: f64,
    /// `[C]`, ones at first, when affine.
    pub weight: Option<Tensor>,
    /// `[C]`, zeros at first, when affine.
    pub bias: Option<Tensor>,
}

crate::parameters!(InstanceNorm { weight, bias });

/// PyTorch's `nn.InstanceNorm1d` (`[N, C, L]`): [`InstanceNorm`].
pub type InstanceNorm1d = InstanceNorm;
/// PyTorch's `nn.InstanceNorm2d` (`[N, C, H, W]`): [`InstanceNorm`].
pub type InstanceNorm2d = InstanceNorm;
/// PyTorch's `nn.InstanceNorm3d` (`[N, C, D, H, W]`): [`InstanceNorm`].
pub type InstanceNorm3d = InstanceNorm;

impl InstanceNorm {
    /// For `num_features` channels, `eps = 1e-5`, with a learned scale and shift if `affine`.
    #[must_use]
    #[track_caller]
    pub fn new(num_features: usize, affine: bool) -> InstanceNorm {
        let param = |v: f64| Tensor::full([num_features], v).requires_grad_(true);
        let (weight, bias) =
            if affine { (Some(param(1.0)), Some(param(0.0))) } else { (None, None) };
        InstanceNorm { eps: 1e-5, weight, bias }
    }
}

impl Module for InstanceNorm {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        try_instance_norm(input, self.weight.as_ref(), self.bias.as_ref(), self.eps)
    }
}

/// `y = x1ᵀ A x2 + b` for each of `out_features` matrices `A` (PyTorch's `bilinear`):
/// `x1` `[.., in1]`, `x2` `[.., in2]`, `weight` `[out, in1, in2]`, `bias` `[out]`.
///
/// # Panics
/// As [`try_bilinear`] fails.
#[track_caller]
pub fn bilinear(x1: &Tensor, x2: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Tensor {
    ok(try_bilinear(x1, x2, weight, bias))
}

/// [`bilinear`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the inputs' leading dimensions differ or their last dimensions are
/// not the weight's.
#[track_caller]
pub fn try_bilinear(
    x1: &Tensor,
    x2: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    let fits = weight.ndim() == 3
        && x1.ndim() >= 1
        && x1.ndim() == x2.ndim()
        && x1.dims()[..x1.ndim() - 1] == x2.dims()[..x2.ndim() - 1]
        && x1.dims()[x1.ndim() - 1] == weight.dims()[1]
        && x2.dims()[x2.ndim() - 1] == weight.dims()[2];
    if !fits {
        return Err(Error::shape(
            "bilinear",
            format!(
                "takes x1 [.., in1], x2 [.., in2] with the same leading dimensions and a weight \
                 [out, in1, in2]; got {}, {} and {}",
                x1.shape(),
                x2.shape(),
                weight.shape()
            ),
        ));
    }
    let lead: Vec<i64> = x1.dims()[..x1.ndim() - 1].iter().map(|&d| d as i64).collect();
    let (a, b) = (
        x1.try_reshape(&[-1, x1.dims()[x1.ndim() - 1] as i64])?,
        x2.try_reshape(&[-1, x2.dims()[x2.ndim() - 1] as i64])?,
    );
    let y = crate::try_einsum("ni,oij,nj->no", &[&a, weight, &b])?;
    let y = match bias {
        Some(b) => y.try_add(b)?,
        None => y,
    };
    y.try_reshape(&[lead, vec![weight.dims()[0] as i64]].concat())
}

/// A bilinear layer (PyTorch's `nn.Bilinear`): weight `[out, in1, in2]` and bias `[out]`
/// drawn from `U(-1/√in1, 1/√in1)`.
#[derive(Clone, Debug)]
pub struct Bilinear {
    /// `[out_features, in1_features, in2_features]`.
    pub weight: Tensor,
    /// `[out_features]`.
    pub bias: Option<Tensor>,
}

crate::parameters!(Bilinear { weight, bias });

impl Bilinear {
    /// A layer with a bias, initialized as PyTorch does.
    #[must_use]
    #[track_caller]
    pub fn new(in1_features: usize, in2_features: usize, out_features: usize) -> Bilinear {
        let bound = 1.0 / (in1_features.max(1) as f64).sqrt();
        let uniform = |shape: &[usize]| {
            let t = Tensor::rand(shape) * (2.0 * bound) - bound;
            t.realize();
            t.requires_grad_(true)
        };
        Bilinear {
            weight: uniform(&[out_features, in1_features, in2_features]),
            bias: Some(uniform(&[out_features])),
        }
    }

    /// The layer of `x1` and `x2`.
    ///
    /// # Errors
    /// As [`try_bilinear`].
    #[track_caller]
    pub fn try_forward2(&self, x1: &Tensor, x2: &Tensor) -> Result<Tensor> {
        try_bilinear(x1, x2, &self.weight, self.bias.as_ref())
    }
}

/// Samples from the Gumbel-softmax distribution (PyTorch's `gumbel_softmax`):
/// `softmax((logits + g) / tau)` along `dim` with Gumbel noise `g = -ln(-ln U)`; with `hard`,
/// the one-hot of its maximum, differentiated as the soft sample (the straight-through
/// estimator).
///
/// ```
/// use kiln::nn::functional::gumbel_softmax;
/// use kiln::prelude::*;
/// let y = gumbel_softmax(&Tensor::zeros([4, 5]), 0.5, true, -1);
/// assert_eq!(y.sum_dim(1, false).to_vec::<f32>(), [1.0; 4]);
/// ```
#[track_caller]
pub fn gumbel_softmax(logits: &Tensor, tau: f64, hard: bool, dim: i64) -> Tensor {
    ok(try_gumbel_softmax(logits, tau, hard, dim))
}

/// [`gumbel_softmax`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Value`] for a `tau` that is not positive; [`Error::Index`] for a `dim` out of
/// range; [`Error::DType`] for non-float logits.
#[track_caller]
pub fn try_gumbel_softmax(logits: &Tensor, tau: f64, hard: bool, dim: i64) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    if tau.is_nan() || tau <= 0.0 {
        return Err(Error::value("gumbel_softmax", format!("tau must be positive, got {tau}")));
    }
    if !logits.dtype().is_float() {
        return Err(Error::dtype(
            "gumbel_softmax",
            format!("takes float logits, got {}", logits.dtype()),
        ));
    }
    // U in (0, 1): -ln(-ln U) is finite.
    let u = (logits.rand_like() * (1.0 - 2e-7) + 1e-7).to_dtype(logits.dtype());
    let noise = -((-(u.log())).log());
    let soft = ((logits + noise) / tau).try_softmax(dim)?;
    if !hard {
        return Ok(soft);
    }
    let (_, index) = soft.try_max_dim(dim, true)?;
    let one_hot = soft.zeros_like().try_scatter(dim, &index, 1.0)?;
    Ok(&one_hot - soft.detach() + soft)
}

/// A transposed 1-D convolution (PyTorch's `conv_transpose1d`): `input` `[N, C_in, L]` (or
/// `[C_in, L]`), `weight` `[C_in, C_out / groups, K]`; the 2-D op over a height of one.
///
/// ```
/// use kiln::nn::functional::{ConvTranspose1dOptions, conv_transpose1d};
/// use kiln::prelude::*;
/// let y = conv_transpose1d(&Tensor::ones([1, 2, 4]), &Tensor::ones([2, 3, 3]), None,
///     ConvTranspose1dOptions { stride: 2, ..Default::default() });
/// assert_eq!(y.dims(), &[1, 3, 9]);
/// ```
#[track_caller]
pub fn conv_transpose1d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: ConvTranspose1dOptions,
) -> Tensor {
    ok(try_conv_transpose1d(input, weight, bias, options))
}

/// [`conv_transpose1d`]'s stride, padding, output padding, groups and dilation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvTranspose1dOptions {
    /// Step between the output windows that input positions write.
    pub stride: usize,
    /// Removed from each end of the output.
    pub padding: usize,
    /// Added to the end of the output.
    pub output_padding: usize,
    /// Independent channel groups.
    pub groups: usize,
    /// Step between a window's elements.
    pub dilation: usize,
}

impl Default for ConvTranspose1dOptions {
    fn default() -> ConvTranspose1dOptions {
        ConvTranspose1dOptions { stride: 1, padding: 0, output_padding: 0, groups: 1, dilation: 1 }
    }
}

/// [`conv_transpose1d`], returning an error instead of panicking.
///
/// # Errors
/// [`Error::Shape`] when the weight is not `[C_in, C_out / groups, K]` for the input's
/// channels; as the 2-D op otherwise.
#[track_caller]
pub fn try_conv_transpose1d(
    input: &Tensor,
    weight: &Tensor,
    bias: Option<&Tensor>,
    options: ConvTranspose1dOptions,
) -> Result<Tensor> {
    let _at = crate::engine::origin::enter();
    if weight.ndim() != 3 {
        return Err(Error::shape(
            "conv_transpose1d",
            format!("takes a weight [C_in, C_out / groups, K], got {}", weight.shape()),
        ));
    }
    let o = ConvTranspose2dOptions {
        stride: [1, options.stride],
        padding: [0, options.padding],
        output_padding: [0, options.output_padding],
        groups: options.groups,
        dilation: [1, options.dilation],
    };
    let w = weight.try_unsqueeze(2)?;
    as_2d("conv_transpose1d", input, |x| try_conv_transpose2d(x, &w, bias, o))
}

/// A transposed 1-D convolution layer (PyTorch's `nn.ConvTranspose1d`): weight
/// `[in_channels, out_channels / groups, K]` and bias `[out_channels]`, initialized as
/// PyTorch does (uniform in `±1/sqrt(fan_in)`, `fan_in = out_channels / groups · K`).
///
/// ```
/// use kiln::nn::{ConvTranspose1d, Module};
/// use kiln::nn::functional::ConvTranspose1dOptions;
/// use kiln::prelude::*;
/// let up = ConvTranspose1d::new(4, 2, 3, ConvTranspose1dOptions { stride: 2, ..Default::default() });
/// assert_eq!(up.forward(&Tensor::randn([1, 4, 5])).dims(), &[1, 2, 11]);
/// ```
#[derive(Clone, Debug)]
pub struct ConvTranspose1d {
    /// `[in_channels, out_channels / groups, K]`.
    pub weight: Tensor,
    /// `[out_channels]`.
    pub bias: Option<Tensor>,
    /// Stride, padding, output padding, groups and dilation.
    pub options: ConvTranspose1dOptions,
}

impl ConvTranspose1d {
    /// A layer with a bias, in `f32`.
    ///
    /// # Panics
    /// As [`ConvTranspose1d::try_new`] fails.
    #[must_use]
    #[track_caller]
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel_size: usize,
        options: ConvTranspose1dOptions,
    ) -> ConvTranspose1d {
        ok(ConvTranspose1d::try_new(in_channels, out_channels, kernel_size, options))
    }

    /// [`ConvTranspose1d::new`], returning an error instead of panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when `groups` does not divide both channel counts, or a size is 0.
    #[track_caller]
    pub fn try_new(
        in_channels: usize,
        out_channels: usize,
        kernel_size: usize,
        options: ConvTranspose1dOptions,
    ) -> Result<ConvTranspose1d> {
        let per_group = out_channels / options.groups.max(1);
        let (weight, bias) = super::conv::layer_parameters(
            "ConvTranspose1d",
            [in_channels, out_channels],
            &[kernel_size],
            options.groups,
            &[in_channels, per_group, kernel_size],
            per_group,
        )?;
        Ok(ConvTranspose1d { weight, bias: Some(bias), options })
    }
}

crate::parameters!(ConvTranspose1d { weight, bias });

impl Module for ConvTranspose1d {
    #[track_caller]
    fn try_forward(&self, input: &Tensor) -> Result<Tensor> {
        try_conv_transpose1d(input, &self.weight, self.bias.as_ref(), self.options)
    }
}
