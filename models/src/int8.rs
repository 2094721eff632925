//! Projections whose weights are per-channel int8 ([`crate::quantize::QuantKind::Int8`]):
//! `i8` rows `[out, in]` and an `f32` scale per row. A decode step's product reads the rows
//! in place (`kiln_runtime::quant::dot_rows_i8`, or with [`Activations::Int8`] the input
//! quantized to Q8_0 blocks once and integer dot products, `dot_rows_i8_int8`: PyTorch's
//! dynamic int8 quantization); a longer input multiplies by the rows dequantized once per
//! call (`q · scale`, one fused kernel), which is also the gradient's path, or with
//! [`Activations::Int8`] on CPUs with AVX512-VNNI takes `crate::prefill`'s integer product.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use kiln::ops::{Opaque, OpaqueBuilder, Split};
use kiln::{DType, Result, Tensor};
use kiln_runtime::quant::{self, GgmlType};

use crate::quantized::{Activations, CHECK_TOLERANCE, IN_PLACE_ROWS, dense, each_run};

/// `x Wᵀ` for `W = scales · rows` (`rows` `i8` `[out, in]`, `scales` f32 `[out]`), `x`
/// `[.., in]`.
pub(crate) fn matmul_t(
    x: &Tensor,
    activations: Activations,
    rows: &Tensor,
    scales: &Tensor,
) -> Result<Tensor> {
    let k = x.dims().last().copied().unwrap_or(0);
    let m = x.numel().checked_div(k).unwrap_or(0);
    let x = x.to_dtype(DType::F32);
    let gradients = kiln::is_grad_enabled() && x.requires_grad();
    if m > IN_PLACE_ROWS {
        if activations == Activations::Int8 && crate::prefill::applies(&x, None, k) {
            return crate::prefill::matmul_t(&x, crate::prefill::Weight::Int8(rows, scales));
        }
        return x.try_matmul(&dequantize(rows, scales).t());
    }
    // Integer products run on the CPU; elsewhere, and where `x` carries gradients, the
    // float one.
    let integer = x.device() == kiln::Device::Cpu && !gradients && k.is_multiple_of(32);
    match activations {
        Activations::Int8 if integer => {
            let a = crate::quantized::activations(GgmlType::Q8_0)?.try_call(&[&x])?;
            int8_product().try_call(&[&a, rows, scales])
        }
        _ => float_product(k).try_call(&[&x, rows, scales]),
    }
}

/// The weight `scales · rows` as f32 `[out, in]`: one elementwise kernel.
pub(crate) fn dequantize(rows: &Tensor, scales: &Tensor) -> Tensor {
    rows.to_dtype(DType::F32) * scales.unsqueeze(1)
}

/// The product with Q8_0 activation blocks (on the CPU).
fn int8_product() -> &'static Opaque {
    static OP: OnceLock<Opaque> = OnceLock::new();
    OP.get_or_init(|| product(true).build())
}

/// The product with f32 inputs of `k` values a row, made once per row length (the CUDA
/// kernel is specialised to `k`).
fn float_product(k: usize) -> Opaque {
    static PRODUCTS: Mutex<BTreeMap<usize, Opaque>> = Mutex::new(BTreeMap::new());
    let mut all = PRODUCTS.lock().unwrap_or_else(PoisonError::into_inner);
    let op = all.entry(k).or_insert_with(|| {
        product(false)
            .cuda_warp_per_element(crate::kernels::i8_product(k), "kiln_i8_matmul")
            .build()
    });
    op.clone()
}

/// `matmul_i8` (f32 `x`) or `matmul_i8_int8` (`x` as Q8_0 blocks, u8) times `i8` rows and
/// their f32 scales, but for a CUDA implementation.
fn product(int8: bool) -> OpaqueBuilder {
    let name = if int8 { "matmul_i8_int8" } else { "matmul_i8" };
    Opaque::builder(name, 3, move |inputs, out| {
        let (x, w, s) = (&inputs[0], &inputs[1], &inputs[2]);
        let x_row = *x.shape().last().ok_or("x has no dimensions")?;
        let (rows, k) = (w.shape()[0], w.shape()[1]);
        let (w, s) = (dense::<i8>(w)?, dense::<f32>(s)?);
        // The input read once: Q8_0 blocks for the integer product, else floats.
        let (blocks, floats) = match int8 {
            true => (dense::<u8>(x)?, Default::default()),
            false => (Default::default(), dense::<f32>(x)?),
        };
        let run = |m: usize, n: usize, values: &mut [f32]| {
            let (w, s) = (&w[n * k..(n + values.len()) * k], &s[n..n + values.len()]);
            let at = m * x_row..(m + 1) * x_row;
            match int8 {
                true => quant::dot_rows_i8_int8(w, s, &blocks[at], values),
                false => quant::dot_rows_i8(w, s, &floats[at], values),
            }
        };
        each_run(out, rows, run)
    })
    .split(Split::Runs(64))
    .reference(CHECK_TOLERANCE, move |inputs, out| reference(int8, inputs, out))
    .shape(move |inputs| {
        let ((x, x_dtype), (w, w_dtype), (s, s_dtype)) = (&inputs[0], &inputs[1], &inputs[2]);
        let (x, w, s) = (x.dims(), w.dims(), s.dims());
        let (want, k) = match int8 {
            true => (DType::U8, x.last().filter(|b| b.is_multiple_of(34)).map(|b| b / 34 * 32)),
            false => (DType::F32, x.last().copied()),
        };
        let fits = w.len() == 2 && k == Some(w[1]) && s == [w[0]];
        if *x_dtype != want || *w_dtype != DType::I8 || *s_dtype != DType::F32 || !fits {
            return Err(format!(
                "x ({x:?}, {x_dtype}) times int8 rows ({w:?}, {w_dtype}) with scales ({s:?}, {s_dtype}): x is {want} [.., {}], the rows i8 [out, in], the scales f32 [out]",
                if int8 { "Q8_0 blocks of in" } else { "in" }
            ));
        }
        Ok((crate::quantized::product_shape(x, w[0]), DType::F32))
    })
    .backward(|saved, grad| {
        let [_, w, s] = saved.inputs() else { unreachable!("three inputs") };
        Ok(vec![Some(grad.try_matmul(&dequantize(w, s))?), None, None])
    })
}

/// `KILN_CHECK`'s reference: each element the f64 dot product of a row's `q · scale` with
/// the input row (dequantized from its blocks for the integer product).
fn reference(
    int8: bool,
    inputs: &[kiln::ops::CpuInput<'_>],
    out: &mut kiln::ops::CpuOutput<'_>,
) -> std::result::Result<(), String> {
    let (x, w, s) = (&inputs[0], &inputs[1], &inputs[2]);
    let (rows, k) = (w.shape()[0], w.shape()[1]);
    let xs: Vec<f32> = match int8 {
        true => {
            let bytes = dense::<u8>(x)?;
            let mut xs = vec![0f32; bytes.len() / 34 * 32];
            quant::dequantize(GgmlType::Q8_0, &bytes, &mut xs).map_err(|e| e.to_string())?;
            xs
        }
        false => dense::<f32>(x)?.into_owned(),
    };
    let (w, s) = (dense::<i8>(w)?, dense::<f32>(s)?);
    let start = out.start();
    for (i, o) in out.values::<f32>()?.iter_mut().enumerate() {
        let (m, n) = ((start + i) / rows, (start + i) % rows);
        let terms = w[n * k..(n + 1) * k].iter().zip(&xs[m * k..(m + 1) * k]);
        let dot: f64 = terms.map(|(&a, &b)| f64::from(a) * f64::from(b)).sum();
        *o = (f64::from(s[n]) * dot) as f32;
    }
    Ok(())
}
