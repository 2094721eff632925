//! Integer products for the prefills of weights kept quantized (Q8_0 or Q4_0 blocks, or
//! per-channel int8 rows) under [`Activations::Int8`](crate::Activations::Int8): the input
//! quantized to Q8_0 blocks once (the decode step's op), the weight repacked into groups of
//! 16 outputs once per call (`pack_gemm_*`, split across threads by group), and one
//! integer product over them (`matmul_packed_int8`, which splits itself over the threads in
//! bands of rows, or of groups for a short input), on CPUs with AVX512-VNNI (`kiln_runtime::quant::gemm_available`).
//! Elsewhere, and where `x` carries gradients, a prefill multiplies by the weight
//! dequantized once per call, as with f32 activations.

use std::sync::OnceLock;

use kiln::ops::{Opaque, Split};
use kiln::{DType, Error, Result, Shape, Tensor};
use kiln_runtime::quant::{self, GEMM_GROUP, GemmWeights, GgmlType};

use crate::quantized::{CHECK_TOLERANCE, dense};

/// A weight the integer prefill product reads.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Weight<'a> {
    /// Q8_0 or Q4_0 blocks, u8 `[out, row bytes]`.
    Blocks(GgmlType, &'a Tensor),
    /// `i8` rows `[out, in]` and their f32 scales `[out]`.
    Int8(&'a Tensor, &'a Tensor),
}

/// Whether a product of `x` (`[.., k]`, more rows than a decode step's) with a weight of
/// `kind` takes the integer prefill product (`kind` `None`: per-channel int8).
pub(crate) fn applies(x: &Tensor, kind: Option<GgmlType>, k: usize) -> bool {
    let kind_fits = kind.is_none_or(|kind| matches!(kind, GgmlType::Q8_0 | GgmlType::Q4_0));
    kind_fits
        && k.is_multiple_of(32)
        && k > 0
        && x.device() == kiln::Device::Cpu
        && !(kiln::is_grad_enabled() && x.requires_grad())
        && quant::gemm_available()
}

/// `x Wᵀ` (`x` f32 `[.., k]`) through the integer product: see the module.
pub(crate) fn matmul_t(x: &Tensor, weight: Weight<'_>) -> Result<Tensor> {
    let (packed, n) = match weight {
        Weight::Blocks(kind, blocks) => {
            let op = match kind {
                GgmlType::Q8_0 => &ops().pack_q8_0,
                GgmlType::Q4_0 => &ops().pack_q4_0,
                _ => return Err(unpacked(kind)),
            };
            (op.try_call(&[blocks])?, blocks.dims()[0])
        }
        Weight::Int8(rows, scales) => (ops().pack_i8.try_call(&[rows, scales])?, rows.dims()[0]),
    };
    let a = crate::quantized::activations(GgmlType::Q8_0)?.try_call(&[x])?;
    let out = ops().product.try_call(&[&a, &packed])?;
    // The groups' padding past the weight's rows.
    match n.is_multiple_of(GEMM_GROUP) {
        true => Ok(out),
        false => out.try_narrow(-1, 0, n),
    }
}

fn unpacked(kind: GgmlType) -> Error {
    Error::Internal(format!("the integer prefill product has no packing of {kind} weights"))
}

struct Ops {
    pack_q8_0: Opaque,
    pack_q4_0: Opaque,
    pack_i8: Opaque,
    product: Opaque,
}

fn ops() -> &'static Ops {
    static OPS: OnceLock<Ops> = OnceLock::new();
    OPS.get_or_init(|| Ops {
        pack_q8_0: pack_blocks(GgmlType::Q8_0, "pack_gemm_q8_0"),
        pack_q4_0: pack_blocks(GgmlType::Q4_0, "pack_gemm_q4_0"),
        pack_i8: pack_i8(),
        product: product(),
    })
}

/// The packed groups' shape, u8 `[groups, bytes per group]`, for `n` rows of `k` values.
fn packed_shape(n: usize, k: usize) -> Option<(Shape, DType)> {
    let group = quant::packed_group_bytes(k)?;
    Some((Shape::from([n.div_ceil(GEMM_GROUP), group]), DType::U8))
}

/// Packs the groups of one chunk of the output (whole groups: it splits by rows).
fn pack_chunk(
    weights: GemmWeights<'_>,
    k: usize,
    out: &mut kiln::ops::CpuOutput<'_>,
) -> std::result::Result<(), String> {
    let group = quant::packed_group_bytes(k).ok_or("rows of partial blocks")?;
    let first = out.start() / group;
    quant::pack_gemm(weights, k, first, out.values::<u8>()?).map_err(|e| e.to_string())
}

fn pack_blocks(kind: GgmlType, name: &'static str) -> Opaque {
    let (values, size) = kind.block().expect("a block type");
    Opaque::builder(name, 1, move |inputs, out| {
        let w = &inputs[0];
        let k = w.shape()[1] / size * values;
        pack_chunk(GemmWeights::Blocks(kind, &dense::<u8>(w)?), k, out)
    })
    .split(Split::Rows)
    .shape(move |inputs| {
        let (w, dtype) = &inputs[0];
        match w.dims() {
            &[n, bytes] if *dtype == DType::U8 && bytes.is_multiple_of(size) => {
                packed_shape(n, bytes / size * values)
            }
            _ => None,
        }
        .ok_or_else(|| format!("{kind} blocks ({w}, {dtype}): u8 [out, whole blocks]"))
    })
    .build()
}

fn pack_i8() -> Opaque {
    Opaque::builder("pack_gemm_i8", 2, |inputs, out| {
        let (w, s) = (&inputs[0], &inputs[1]);
        let k = w.shape()[1];
        let (rows, scales) = (dense::<i8>(w)?, dense::<f32>(s)?);
        pack_chunk(GemmWeights::Int8 { rows: &rows, scales: &scales }, k, out)
    })
    .split(Split::Rows)
    .shape(|inputs| {
        let ((w, w_dtype), (s, s_dtype)) = (&inputs[0], &inputs[1]);
        match (w.dims(), s.dims()) {
            (&[n, k], &[ns]) if *w_dtype == DType::I8 && *s_dtype == DType::F32 && ns == n => {
                packed_shape(n, k)
            }
            _ => None,
        }
        .ok_or_else(|| {
            format!(
                "int8 rows ({w}, {w_dtype}) with scales ({s}, {s_dtype}): i8 [out, in] and f32 [out], in a multiple of 32"
            )
        })
    })
    .build()
}

/// Q8_0 activation blocks (u8 `[.., bytes of k]`) times packed groups (u8 `[groups, bytes]`):
/// f32 `[.., 16 · groups]`.
fn product() -> Opaque {
    Opaque::builder("matmul_packed_int8", 2, |inputs, out| {
        let (a, w) = (&inputs[0], &inputs[1]);
        let a_row = *a.shape().last().ok_or("the activations have no dimensions")?;
        let (k, cols) = (a_row / 34 * 32, w.shape()[0] * GEMM_GROUP);
        let (a_bytes, w_bytes) = (dense::<u8>(a)?, dense::<u8>(w)?);
        debug_assert_eq!((out.start(), out.len()), (0, a_bytes.len() / a_row * cols));
        let values = out.values::<f32>()?;
        quant::gemm_int8(&a_bytes, &w_bytes, k, values).map_err(|e| e.to_string())
    })
    // One call: the product splits itself over the team, in bands of rows or of groups.
    .split(Split::Whole)
    .reference(CHECK_TOLERANCE, reference)
    .shape(|inputs| {
        let ((a, a_dtype), (w, w_dtype)) = (&inputs[0], &inputs[1]);
        let (a, w) = (a.dims(), w.dims());
        let k = a.last().filter(|b| b.is_multiple_of(34)).map(|b| b / 34 * 32);
        let fits = w.len() == 2 && k.and_then(quant::packed_group_bytes) == Some(w[1]);
        if *a_dtype != DType::U8 || *w_dtype != DType::U8 || !fits {
            return Err(format!(
                "Q8_0 activations ({a:?}, {a_dtype}) times packed groups ({w:?}, {w_dtype}): both u8, the groups packed for rows of the activations' values"
            ));
        }
        Ok((crate::quantized::product_shape(a, w[0] * GEMM_GROUP), DType::F32))
    })
    .build()
}

/// `KILN_CHECK`'s reference: each element the f64 dot product of the input row's
/// dequantized blocks with the packed weight row's values.
fn reference(
    inputs: &[kiln::ops::CpuInput<'_>],
    out: &mut kiln::ops::CpuOutput<'_>,
) -> std::result::Result<(), String> {
    let (a, w) = (&inputs[0], &inputs[1]);
    let a_bytes = dense::<u8>(a)?;
    let k = a.shape().last().ok_or("the activations have no dimensions")? / 34 * 32;
    let cols = w.shape()[0] * GEMM_GROUP;
    let mut xs = vec![0f32; a_bytes.len() / 34 * 32];
    quant::dequantize(GgmlType::Q8_0, &a_bytes, &mut xs).map_err(|e| e.to_string())?;
    let mut ws = vec![0f32; cols * k];
    quant::unpack_gemm(&dense::<u8>(w)?, k, &mut ws).map_err(|e| e.to_string())?;
    let start = out.start();
    for (i, o) in out.values::<f32>()?.iter_mut().enumerate() {
        let (m, n) = ((start + i) / cols, (start + i) % cols);
        let terms = xs[m * k..(m + 1) * k].iter().zip(&ws[n * k..(n + 1) * k]);
        *o = terms.map(|(&x, &w)| f64::from(x) * f64::from(w)).sum::<f64>() as f32;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quantize::QuantKind;
    use crate::quantized::{Activations, Quantized};

    fn relative(got: &[f32], want: &[f32]) -> f64 {
        let big = want.iter().fold(0f64, |m, &v| m.max(f64::from(v).abs()));
        let diff = got.iter().zip(want).map(|(&a, &b)| f64::from(a - b).abs());
        diff.fold(0.0, f64::max) / big
    }

    #[test]
    fn prefills_agree_with_the_decode_step_s_integer_products() {
        // Odd row counts and outputs that are not whole groups; the input a transposed view.
        let (m, n, k) = (7, 40, 96);
        let x = Tensor::from_vec(kiln_ir::testing::uniform(m * k, 1), [k, m]).t();
        let w = kiln_ir::testing::uniform(n * k, 2);
        let mut cases: Vec<(Quantized, Tensor)> = Vec::new();
        for kind in [GgmlType::Q8_0, GgmlType::Q4_0] {
            let mut bytes = vec![0u8; kind.bytes_of(n * k).expect("whole blocks")];
            quant::quantize(kind, &w, &mut bytes).expect("quantizes");
            let stored = Tensor::from_vec(bytes, [n, kind.bytes_of(k).expect("whole blocks")]);
            let q = Quantized { kind: kind.into(), activations: Activations::Int8, scales: None };
            cases.push((q, stored));
        }
        let (mut rows, mut scales) = (vec![0i8; n * k], vec![0f32; n]);
        quant::quantize_rows_i8(&w, k, &mut rows, &mut scales).expect("quantizes");
        let scales = Some(Tensor::from_vec(scales, [n]));
        let q = Quantized { kind: QuantKind::Int8, activations: Activations::Int8, scales };
        cases.push((q, Tensor::from_vec(rows, [n, k])));
        for (q, stored) in &cases {
            let weight = match (q.kind, &q.scales) {
                (QuantKind::Blocks(kind), _) => Weight::Blocks(kind, stored),
                (QuantKind::Int8, scales) => Weight::Int8(stored, scales.as_ref().expect("scales")),
            };
            // Under KILN_CHECK: the product against the f64 product of the values.
            let got = kiln::with_check(|| matmul_t(&x, weight).expect("a product").to_vec::<f32>());
            assert_eq!(got.len(), m * n, "{:?}: the groups' padding is dropped", q.kind);
            // Row by row, the decode step's products of the same activation blocks.
            let mut want = Vec::new();
            for i in 0..m {
                let row = x.narrow(0, i, 1);
                want.extend(
                    crate::quantized::matmul_t(&row, q, stored).expect("a row").to_vec::<f32>(),
                );
            }
            let error = relative(&got, &want);
            assert!(error < 1e-5, "{:?}: {error:e} from the decode step's products", q.kind);
        }
        assert!(matmul_t(&x, Weight::Blocks(GgmlType::Q4_K, &cases[0].1)).is_err());
    }
}
