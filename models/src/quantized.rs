//! Projections whose weights stay in GGML blocks: `x Wᵀ` read from the blocks where they
//! lie (`kiln_runtime::quant::dot_rows`, an opaque op split across threads by output
//! element) for a few rows of `x` (a decode step), and through the blocks dequantized once
//! per call and a dense product for more (a prefill). The gradient with respect to `x` is
//! the dequantized weight's product, so adapters can train over a quantized base. On a GPU
//! the same ops run CUDA kernels (`crate::kernels`).
//!
//! With [`Activations::Int8`] a decode step's product quantizes `x` once (an op of its own:
//! Q8_0 or Q8_K blocks) and takes integer dot products with the weight's blocks
//! (`quant::dot_rows_int8`), as llama.cpp does, and a prefill with Q8_0 or Q4_0 blocks on a
//! CPU with AVX512-VNNI takes `crate::prefill`'s integer product; where `x` carries
//! gradients the float product runs instead (the integer ones have no derivative with
//! respect to `x`).

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use kiln::ops::{Opaque, Split};
use kiln::{DType, Error, Result, Shape, Tensor};
use kiln_runtime::quant::{self, GgmlType};

use crate::quantize::QuantKind;

/// Rows of `x` up to which the product reads the blocks in place; past it the weight is
/// dequantized for a dense product (which reuses each weight across the rows), or packed
/// for an integer one (`crate::prefill`).
pub(crate) const IN_PLACE_ROWS: usize = 4;

/// How the products of weights kept quantized take their input: in a decode step (up to
/// four rows of `x`), and for Q8_0, Q4_0 and per-channel int8 weights in a prefill on CPUs
/// with AVX512-VNNI (other prefills run a dense product of the weight dequantized once per
/// call).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activations {
    /// Weight-only quantization: `x` stays f32 and each block's values are widened to
    /// floats inside the product.
    #[default]
    F32,
    /// `x` is quantized to 8-bit blocks once per product (Q8_0 for Q8_0 and Q4_0 weights,
    /// Q8_K for Q4_K and Q6_K; other types keep [`Activations::F32`]) and the products are
    /// integer dot products: faster on CPUs with AVX2, and each input value rounded to
    /// within half a step of its block's scale (1/254 of the block's largest magnitude).
    /// A prefill's products with Q8_0, Q4_0 and per-channel int8 weights are integer too
    /// where the CPU has AVX512-VNNI (the weight repacked once per call into groups of 16
    /// outputs; `vpdpbusd`), and dense f32 products elsewhere. On a GPU the products take
    /// f32 inputs (as [`Activations::F32`]).
    Int8,
}

/// How a weight kept quantized is stored (its data is the weight tensor: GGML blocks or
/// `i8` rows), with per-channel int8's scales, and how its products take their input.
#[derive(Clone, Debug)]
pub(crate) struct Quantized {
    pub(crate) kind: QuantKind,
    pub(crate) activations: Activations,
    /// Per-channel int8's scales, f32 `[out]`.
    pub(crate) scales: Option<Tensor>,
}

/// The block types a projection may keep: those with a product here.
pub(crate) fn keeps(kind: GgmlType) -> bool {
    KINDS.contains(&kind)
}

/// The ops of one block type that do not depend on the row length: the dequantization and
/// the integer product where the type has one.
struct Ops {
    dequantize: Opaque,
    int8: Option<Opaque>,
}

/// The types with ops here (every block type [`quant::dequantize`] reads).
pub(crate) const KINDS: &[GgmlType] = &[
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// `prefix_type[suffix]` (`matmul_q4_k`, `matmul_q4_k_int8`): an op's name is `'static`,
/// and each op is made once.
fn op_name(prefix: &str, kind: GgmlType, suffix: &str) -> &'static str {
    Box::leak(format!("{prefix}_{}{suffix}", kind.name().to_lowercase()).into_boxed_str())
}

fn ops(kind: GgmlType) -> Result<&'static Ops> {
    static OPS: OnceLock<Vec<(GgmlType, Ops)>> = OnceLock::new();
    let all = OPS.get_or_init(|| KINDS.iter().map(|&kind| (kind, build(kind))).collect());
    all.iter().find(|o| o.0 == kind).map(|o| &o.1).ok_or_else(|| Error::Value {
        op: "quantized matmul",
        detail: format!("{kind} weights are not kept quantized"),
    })
}

/// The values per row of `kind` blocks `row_bytes` long.
fn values_per_row(kind: GgmlType, row_bytes: usize) -> Option<usize> {
    let (values, size) = kind.block()?;
    row_bytes.is_multiple_of(size).then(|| row_bytes / size * values)
}

/// An input's elements in row-major order: in place when it is dense, else copied.
pub(crate) fn dense<'a, T: kiln::Element>(
    input: &kiln::ops::CpuInput<'a>,
) -> std::result::Result<std::borrow::Cow<'a, [T]>, String> {
    Ok(input
        .contiguous::<T>()?
        .map_or_else(|| input.to_vec::<T>().into(), std::borrow::Cow::Borrowed))
}

/// Calls `product(m, n, values)` for each run of a product's output chunk that lies in one
/// row `m` of the input: outputs `n..n + values.len()` of that row (`rows` per row).
pub(crate) fn each_run(
    out: &mut kiln::ops::CpuOutput<'_>,
    rows: usize,
    product: impl Fn(usize, usize, &mut [f32]) -> std::result::Result<(), quant::DequantizeError>,
) -> std::result::Result<(), String> {
    let start = out.start();
    let values = out.values::<f32>()?;
    let mut done = 0;
    while done < values.len() {
        let (m, n) = ((start + done) / rows, (start + done) % rows);
        let run = (rows - n).min(values.len() - done);
        product(m, n, &mut values[done..done + run]).map_err(|e| e.to_string())?;
        done += run;
    }
    Ok(())
}

/// The f32 result's shape of a product of `x` (`[.., k]`, checked to have a last
/// dimension) with `n` rows: `[.., n]`.
pub(crate) fn product_shape(x: &[usize], n: usize) -> Shape {
    let mut dims = x.to_vec();
    if let Some(last) = dims.last_mut() {
        *last = n;
    }
    Shape::from(dims)
}

/// The product of f32 `x` with `kind` blocks of `k`-value rows read in place, made once per
/// kind and row length (the CUDA kernel is specialised to `k`).
fn product(kind: GgmlType, k: usize) -> Result<Opaque> {
    static PRODUCTS: Mutex<BTreeMap<(u32, usize), Opaque>> = Mutex::new(BTreeMap::new());
    let mut all = PRODUCTS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(op) = all.get(&(kind.0, k)) {
        return Ok(op.clone());
    }
    let source = crate::kernels::blocks_product(kind, k).ok_or_else(|| Error::Value {
        op: "quantized matmul",
        detail: format!("rows of {k} values are not whole {kind} blocks"),
    })?;
    let op = build_product(kind, source);
    all.insert((kind.0, k), op.clone());
    Ok(op)
}

fn build_product(kind: GgmlType, cuda: String) -> Opaque {
    Opaque::builder(op_name("matmul", kind, ""), 2, move |inputs, out| {
        let (x, w) = (&inputs[0], &inputs[1]);
        let k = *x.shape().last().ok_or("x has no dimensions")?;
        let rows = w.shape()[0];
        let row_bytes = w.shape()[1];
        let (x_values, w_bytes) = (dense::<f32>(x)?, dense::<u8>(w)?);
        each_run(out, rows, |m, n, values| {
            let w = &w_bytes[n * row_bytes..(n + values.len()) * row_bytes];
            quant::dot_rows(kind, w, &x_values[m * k..(m + 1) * k], values)
        })
    })
    // A few output elements per task: each is a whole row's dot product, and a decode
    // step's projections have only hundreds to thousands of them.
    .split(Split::Runs(64))
    .cuda_warp_per_element(cuda, "kiln_gq_matmul")
    .reference(CHECK_TOLERANCE, reference(kind, None))
    .shape(move |inputs| {
        let ((x, x_dtype), (w, w_dtype)) = (&inputs[0], &inputs[1]);
        let (x, w) = (x.dims(), w.dims());
        let k = x.last().copied();
        let fits = w.len() == 2 && k.is_some() && values_per_row(kind, w[1]) == k;
        if *x_dtype != DType::F32 || *w_dtype != DType::U8 || !fits {
            return Err(format!(
                "x ({x:?}, {x_dtype}) times {kind} blocks ({w:?}, {w_dtype}): x is f32 [.., k] and the blocks u8 [out, bytes of k values]"
            ));
        }
        Ok((crate::quantized::product_shape(x, w[0]), DType::F32))
    })
    .backward(move |saved, grad| {
        let w = dequantize_with(kind, &saved.inputs()[1])?;
        Ok(vec![Some(grad.try_matmul(&w)?), None])
    })
    .build()
}

fn build(kind: GgmlType) -> Ops {
    let dequantize = Opaque::builder(op_name("dequantize", kind, ""), 1, move |inputs, out| {
        let w = &inputs[0];
        let row_bytes = w.shape()[1];
        let k = values_per_row(kind, row_bytes).ok_or("rows of partial blocks")?;
        let w_bytes = dense::<u8>(w)?;
        let first = out.start() / k;
        let values = out.values::<f32>()?;
        let rows = values.len() / k;
        quant::dequantize(kind, &w_bytes[first * row_bytes..(first + rows) * row_bytes], values)
            .map_err(|e| e.to_string())
    })
    .split(Split::Rows)
    .cuda(
        crate::kernels::blocks_dequantize(kind).expect("a kind with ops has a CUDA reader"),
        "kiln_gq_dequantize",
    )
    .shape(move |inputs| {
        let (w, dtype) = &inputs[0];
        let w = w.dims();
        match (w, values_per_row(kind, w.get(1).copied().unwrap_or(0))) {
            ([rows, _], Some(k)) if *dtype == DType::U8 => {
                Ok((Shape::from(vec![*rows, k]), DType::F32))
            }
            _ => Err(format!("{kind} blocks ({w:?}, {dtype}): u8 [out, whole blocks]")),
        }
    })
    .build();
    let int8 = quant::activation_type(kind).map(|_| int8_product(kind));
    Ops { dequantize, int8 }
}

/// How far (of the larger magnitude, at least 1) a product may be from the f64 product of
/// the blocks' values under `KILN_CHECK`: each block's sum is in f32 lanes (or exact
/// integers) and the blocks' sums are added in f32; a misread block is off by far more.
pub(crate) const CHECK_TOLERANCE: f64 = 1e-3;

/// `KILN_CHECK`'s reference for the products of `kind` weights with f32 inputs (`act`
/// `None`) or with activation blocks: each element the f64 dot product of the weight row's
/// dequantized values with the input row's.
fn reference(
    kind: GgmlType,
    act: Option<GgmlType>,
) -> impl Fn(
    &[kiln::ops::CpuInput<'_>],
    &mut kiln::ops::CpuOutput<'_>,
) -> std::result::Result<(), String>
+ Send
+ Sync
+ 'static {
    move |inputs, out| {
        let (x, w) = (&inputs[0], &inputs[1]);
        let (rows, row_bytes) = (w.shape()[0], w.shape()[1]);
        let k = values_per_row(kind, row_bytes).ok_or("rows of partial blocks")?;
        let xs: Vec<f32> = match act {
            None => dense::<f32>(x)?.into_owned(),
            Some(act) => {
                let bytes = dense::<u8>(x)?;
                let (values, size) = act.block().ok_or("an unknown activation type")?;
                let mut xs = vec![0f32; bytes.len() / size * values];
                quant::dequantize(act, &bytes, &mut xs).map_err(|e| e.to_string())?;
                xs
            }
        };
        let w_bytes = dense::<u8>(w)?;
        let mut row = vec![0f32; k];
        let start = out.start();
        for (i, o) in out.values::<f32>()?.iter_mut().enumerate() {
            let (m, n) = ((start + i) / rows, (start + i) % rows);
            quant::dequantize(kind, &w_bytes[n * row_bytes..(n + 1) * row_bytes], &mut row)
                .map_err(|e| e.to_string())?;
            let terms = row.iter().zip(&xs[m * k..(m + 1) * k]);
            *o = terms.map(|(&a, &b)| f64::from(a) * f64::from(b)).sum::<f64>() as f32;
        }
        Ok(())
    }
}

/// The rows `ids` picks from a table stored quantized, dequantized to f32.
pub(crate) fn embedding(ids: &Tensor, q: &Quantized, table: &Tensor) -> Result<Tensor> {
    match (q.kind, &q.scales) {
        // The rows' blocks picked by kiln's own lookup (its index checks, on any device),
        // then dequantized.
        (QuantKind::Blocks(kind), _) => {
            let &[_, row_bytes] = table.dims() else { return Err(no_blocks(kind)) };
            let k = values_per_row(kind, row_bytes).ok_or_else(|| no_blocks(kind))?;
            let rows = kiln::nn::functional::try_embedding(ids, table)?;
            let values = dequantize_with(kind, &rows.try_reshape(&[-1, row_bytes as i64])?)?;
            let mut dims = ids.dims().to_vec();
            dims.push(k);
            values.try_reshape(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>())
        }
        (QuantKind::Int8, Some(scales)) => {
            let rows = kiln::nn::functional::try_embedding(ids, table)?.to_dtype(DType::F32);
            Ok(rows * kiln::nn::functional::try_embedding(ids, &scales.unsqueeze(1))?)
        }
        (QuantKind::Int8, None) => Err(no_scales("embedding")),
    }
}

fn no_blocks(kind: GgmlType) -> Error {
    Error::Internal(format!("quantized embedding: a table that is not rows of whole {kind} blocks"))
}

fn no_scales(op: &'static str) -> Error {
    Error::Internal(format!("{op}: a per-channel int8 weight without its scales"))
}

/// The values of `kind` blocks (u8 `[rows, row bytes]`), f32 `[rows, values per row]`.
pub(crate) fn dequantize_with(kind: GgmlType, blocks: &Tensor) -> Result<Tensor> {
    ops(kind)?.dequantize.try_call(&[blocks])
}

/// `x Wᵀ` for `W` stored as `q` says (`stored`: GGML blocks, u8 `[out, row bytes]`, or
/// int8 rows, `i8` `[out, in]`), `x` f32 `[.., in]`: in place for up to [`IN_PLACE_ROWS`]
/// rows of `x` (integer products under [`Activations::Int8`] where `x` carries no
/// gradient), else dequantized and dense.
pub(crate) fn matmul_t(x: &Tensor, q: &Quantized, stored: &Tensor) -> Result<Tensor> {
    match (q.kind, &q.scales) {
        (QuantKind::Blocks(kind), _) => blocks_matmul_t(x, kind, q.activations, stored),
        (QuantKind::Int8, Some(scales)) => crate::int8::matmul_t(x, q.activations, stored, scales),
        (QuantKind::Int8, None) => Err(no_scales("quantized matmul")),
    }
}

fn blocks_matmul_t(
    x: &Tensor,
    kind: GgmlType,
    input: Activations,
    blocks: &Tensor,
) -> Result<Tensor> {
    let k = x.dims().last().copied().unwrap_or(0);
    let rows = x.numel().checked_div(k).unwrap_or(0);
    let x = x.to_dtype(DType::F32);
    let ops = ops(kind)?;
    if rows > IN_PLACE_ROWS {
        if input == Activations::Int8 && crate::prefill::applies(&x, Some(kind), k) {
            return crate::prefill::matmul_t(&x, crate::prefill::Weight::Blocks(kind, blocks));
        }
        return x.try_matmul(&ops.dequantize.try_call(&[blocks])?.t());
    }
    // Integer products run on the CPU; elsewhere, and where `x` carries gradients, the
    // float one.
    let integer =
        x.device() == kiln::Device::Cpu && !(kiln::is_grad_enabled() && x.requires_grad());
    match (&ops.int8, quant::activation_type(kind), input) {
        (Some(int8), Some(act), Activations::Int8) if integer => {
            int8.try_call(&[&activations(act)?.try_call(&[&x])?, blocks])
        }
        _ => product(kind, k)?.try_call(&[&x, blocks]),
    }
}

/// The op quantizing f32 rows (`[.., k]`) to `act` blocks (u8 `[.., bytes of k]`).
pub(crate) fn activations(act: GgmlType) -> Result<&'static Opaque> {
    static OPS: OnceLock<[(GgmlType, Opaque); 2]> = OnceLock::new();
    let all = OPS.get_or_init(|| {
        [(GgmlType::Q8_0, "quantize_q8_0"), (GgmlType::Q8_K, "quantize_q8_k")]
            .map(|(act, name)| (act, quantize_rows(act, name)))
    });
    all.iter().find(|o| o.0 == act).map(|o| &o.1).ok_or_else(|| Error::Value {
        op: "quantized matmul",
        detail: format!("no op quantizes activations to {act}"),
    })
}

fn quantize_rows(act: GgmlType, name: &'static str) -> Opaque {
    let (values, size) = act.block().expect("an activation type is known");
    Opaque::builder(name, 1, move |inputs, out| {
        let x = &inputs[0];
        let k = *x.shape().last().ok_or("x has no dimensions")?;
        let row_bytes = k / values * size;
        let x_values = dense::<f32>(x)?;
        let first = out.start() / row_bytes;
        let bytes = out.values::<u8>()?;
        let rows = bytes.len() / row_bytes;
        quant::quantize(act, &x_values[first * k..(first + rows) * k], bytes)
            .map_err(|e| e.to_string())
    })
    .split(Split::Rows)
    .shape(move |inputs| {
        let (x, dtype) = &inputs[0];
        let mut dims = x.dims().to_vec();
        match dims.last_mut() {
            Some(k) if *dtype == DType::F32 && k.is_multiple_of(values) => {
                *k = *k / values * size;
                Ok((Shape::from(dims), DType::U8))
            }
            _ => Err(format!(
                "x ({dims:?}, {dtype}) to {act} blocks: f32 [.., k], k a multiple of {values}"
            )),
        }
    })
    .build()
}

/// The integer product of activation blocks (u8 `[.., bytes]`) with `kind` weight blocks.
fn int8_product(kind: GgmlType) -> Opaque {
    let act = quant::activation_type(kind).expect("a type with an integer product");
    let (act_values, act_size) = act.block().expect("an activation type is known");
    Opaque::builder(op_name("matmul", kind, "_int8"), 2, move |inputs, out| {
        let (a, w) = (&inputs[0], &inputs[1]);
        let a_row = *a.shape().last().ok_or("the activations have no dimensions")?;
        let (rows, row_bytes) = (w.shape()[0], w.shape()[1]);
        let (a_bytes, w_bytes) = (dense::<u8>(a)?, dense::<u8>(w)?);
        each_run(out, rows, |m, n, values| {
            let w = &w_bytes[n * row_bytes..(n + values.len()) * row_bytes];
            quant::dot_rows_int8(kind, w, &a_bytes[m * a_row..(m + 1) * a_row], values)
        })
    })
    .split(Split::Runs(64))
    .reference(CHECK_TOLERANCE, reference(kind, Some(act)))
    .shape(move |inputs| {
        let ((a, a_dtype), (w, w_dtype)) = (&inputs[0], &inputs[1]);
        let (a, w) = (a.dims(), w.dims());
        let k = a.last().filter(|b| b.is_multiple_of(act_size)).map(|b| b / act_size * act_values);
        let fits = w.len() == 2 && k.is_some() && values_per_row(kind, w[1]) == k;
        if *a_dtype != DType::U8 || *w_dtype != DType::U8 || !fits {
            return Err(format!(
                "{act} activations ({a:?}, {a_dtype}) times {kind} blocks ({w:?}, {w_dtype}): both u8, of the same values per row"
            ));
        }
        Ok((crate::quantized::product_shape(a, w[0]), DType::F32))
    })
    .build()
}
