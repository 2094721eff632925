//! Projections whose weights stay in GGML blocks: `x Wᵀ` read from the blocks where they
//! lie (`kiln_runtime::quant::dot_rows`, an opaque op split across threads by output
//! element) for a few rows of `x` (a decode step), and through the blocks dequantized once
//! per call and a dense product for more (a prefill). The gradient with respect to `x` is
//! the dequantized weight's product, so adapters can train over a quantized base.

use std::sync::OnceLock;

use kiln::ops::{Opaque, Split};
use kiln::{DType, Error, Result, Shape, Tensor};
use kiln_runtime::quant::{self, GgmlType};

/// Rows of `x` up to which the product reads the blocks in place; past it the weight is
/// dequantized for a dense product (which reuses each weight across the rows).
const IN_PLACE_ROWS: usize = 4;

/// The block types a projection may keep: those [`quant::dot_rows`] reads, less the plain
/// float types.
pub(crate) fn keeps(kind: GgmlType) -> bool {
    kind.block().is_some_and(|(values, _)| values > 1) && quant::dequantized().any(|k| k == kind)
}

/// The two ops of one block type: the product read in place, and the dequantization.
struct Ops {
    product: Opaque,
    dequantize: Opaque,
}

/// The op names, one pair per type (an op's name is `'static`).
const NAMES: &[(GgmlType, &str, &str)] = &[
    (GgmlType::Q8_0, "matmul_q8_0", "dequantize_q8_0"),
    (GgmlType::Q4_0, "matmul_q4_0", "dequantize_q4_0"),
    (GgmlType::Q4_1, "matmul_q4_1", "dequantize_q4_1"),
    (GgmlType::Q5_0, "matmul_q5_0", "dequantize_q5_0"),
    (GgmlType::Q5_1, "matmul_q5_1", "dequantize_q5_1"),
    (GgmlType::Q2_K, "matmul_q2_k", "dequantize_q2_k"),
    (GgmlType::Q3_K, "matmul_q3_k", "dequantize_q3_k"),
    (GgmlType::Q4_K, "matmul_q4_k", "dequantize_q4_k"),
    (GgmlType::Q5_K, "matmul_q5_k", "dequantize_q5_k"),
    (GgmlType::Q6_K, "matmul_q6_k", "dequantize_q6_k"),
];

fn ops(kind: GgmlType) -> Result<&'static Ops> {
    static OPS: OnceLock<Vec<(GgmlType, Ops)>> = OnceLock::new();
    let all = OPS.get_or_init(|| {
        NAMES
            .iter()
            .map(|&(kind, product, dequantize)| (kind, build(kind, product, dequantize)))
            .collect()
    });
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
fn dense<'a, T: kiln::Element>(
    input: &kiln::ops::CpuInput<'a>,
) -> std::result::Result<std::borrow::Cow<'a, [T]>, String> {
    Ok(input
        .contiguous::<T>()?
        .map_or_else(|| input.to_vec::<T>().into(), std::borrow::Cow::Borrowed))
}

fn build(kind: GgmlType, product: &'static str, dequantize: &'static str) -> Ops {
    let product = Opaque::builder(product, 2, move |inputs, out| {
        let (x, w) = (&inputs[0], &inputs[1]);
        let k = *x.shape().last().ok_or("x has no dimensions")?;
        let rows = w.shape()[0];
        let row_bytes = w.shape()[1];
        let (x_values, w_bytes) = (dense::<f32>(x)?, dense::<u8>(w)?);
        let start = out.start();
        let values = out.values::<f32>()?;
        // Runs of the chunk within one row of x: one call each.
        let mut done = 0;
        while done < values.len() {
            let (m, n) = ((start + done) / rows, (start + done) % rows);
            let run = (rows - n).min(values.len() - done);
            quant::dot_rows(
                kind,
                &w_bytes[n * row_bytes..(n + run) * row_bytes],
                &x_values[m * k..(m + 1) * k],
                &mut values[done..done + run],
            )
            .map_err(|e| e.to_string())?;
            done += run;
        }
        Ok(())
    })
    // A few output elements per task: each is a whole row's dot product, and a decode
    // step's projections have only hundreds to thousands of them.
    .split(Split::Runs(64))
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
        let mut dims = x.to_vec();
        *dims.last_mut().expect("x has a last dimension") = w[0];
        Ok((Shape::from(dims), DType::F32))
    })
    .backward(move |saved, grad| {
        let w = dequantize_with(kind, &saved.inputs()[1])?;
        Ok(vec![Some(grad.try_matmul(&w)?), None])
    })
    .build();
    let dequantize = Opaque::builder(dequantize, 1, move |inputs, out| {
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
    Ops { product, dequantize }
}

fn dequantize_with(kind: GgmlType, blocks: &Tensor) -> Result<Tensor> {
    ops(kind)?.dequantize.try_call(&[blocks])
}

/// `x Wᵀ` for `W` stored as `kind` blocks (`blocks`: u8 `[out, row bytes]`), `x` f32
/// `[.., in]`: in place for up to [`IN_PLACE_ROWS`] rows of `x`, else dequantized and dense.
pub(crate) fn matmul_t(x: &Tensor, kind: GgmlType, blocks: &Tensor) -> Result<Tensor> {
    let k = x.dims().last().copied().unwrap_or(0);
    let rows = x.numel().checked_div(k).unwrap_or(0);
    let x = x.to_dtype(DType::F32);
    if rows <= IN_PLACE_ROWS {
        return ops(kind)?.product.try_call(&[&x, blocks]);
    }
    x.try_matmul(&dequantize_with(kind, blocks)?.t())
}
