//! Quantizing a float model's weights in place ([`crate::llama::Llama::quantize_`], as
//! torchao's `quantize_`): each projection's weight becomes GGML blocks (Q8_0, Q4_0 or
//! Q4_K, quantized as GGML's reference does) or per-channel int8 rows (`i8` values and an
//! `f32` scale per output, as torchao's `Int8WeightOnlyConfig`) that its products read where
//! they lie ([`crate::Activations`] chooses weight-only or integer products), the head and
//! the embedding table as chosen. A quantized model generates, and LoRA adapters train over its
//! projections (QLoRA's recipe). `save_pretrained` writes the blocks as they are
//! ([`crate::save::QUANTIZED_KEY`]), for kiln-models to load back; transformers cannot.

use kiln::{DType, Error, Result, Tensor};
use kiln_runtime::quant::{self, GgmlType};

use crate::linear::Linear;
use crate::quantized::{Activations, Quantized};

/// How a weight is stored quantized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantKind {
    /// GGML's blocks of this type (u8 `[out, row bytes]`).
    Blocks(GgmlType),
    /// Per-channel symmetric int8: `i8` `[out, in]` and one `f32` scale per output row,
    /// `w ≈ scale · q` (torchao's `Int8WeightOnlyConfig`, PyTorch's `per_channel_symmetric`;
    /// [`kiln_runtime::quant::quantize_rows_i8`] says how).
    Int8,
}

impl From<GgmlType> for QuantKind {
    fn from(kind: GgmlType) -> QuantKind {
        QuantKind::Blocks(kind)
    }
}

impl QuantKind {
    /// The name files record it under: GGML's type name (`Q4_K`), or `int8`.
    pub fn name(self) -> String {
        match self {
            QuantKind::Blocks(kind) => kind.name(),
            QuantKind::Int8 => "int8".to_string(),
        }
    }

    /// The kind [`QuantKind::name`] names, among those a projection keeps.
    pub fn from_name(name: &str) -> Option<QuantKind> {
        match name {
            "int8" => Some(QuantKind::Int8),
            _ => GgmlType::from_name(name)
                .filter(|&k| crate::quantized::keeps(k))
                .map(QuantKind::Blocks),
        }
    }
}

impl std::fmt::Display for QuantKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QuantKind::Blocks(kind) => write!(f, "{kind} blocks"),
            QuantKind::Int8 => f.write_str("per-channel int8"),
        }
    }
}

/// What [`crate::llama::Llama::quantize_`] does.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantConfig {
    /// How the weights are stored: GGML blocks, [`GgmlType::Q8_0`] (8 bits and a scale per
    /// 32 values: 8.5 bits a weight), [`GgmlType::Q4_0`] (4.5 bits) or [`GgmlType::Q4_K`]
    /// (4.5 bits, a scale and a minimum per 32 values: closer than Q4_0); or
    /// [`QuantKind::Int8`] (8 bits and a scale per row: any row length, and with
    /// [`Activations::Int8`] PyTorch's dynamic int8 quantization).
    pub kind: QuantKind,
    /// How the quantized products take their input in decode steps.
    pub activations: Activations,
    /// Projections left in floats: those whose name (`model.layers.3.mlp.down_proj`)
    /// contains any of these.
    pub skip: Vec<String>,
    /// Whether the output head is quantized (for a head tied to the embeddings, a quantized
    /// copy of the table, unless [`QuantConfig::embeddings`] quantizes the table itself).
    pub head: bool,
    /// Whether the embedding table is stored quantized (its lookups dequantize the rows
    /// they pick; a tied head then reads the same blocks).
    pub embeddings: bool,
}

impl QuantConfig {
    /// Every projection and the head as `kind`, the embeddings kept, f32 activations.
    pub fn new(kind: impl Into<QuantKind>) -> QuantConfig {
        QuantConfig {
            kind: kind.into(),
            activations: Activations::F32,
            skip: Vec::new(),
            head: true,
            embeddings: false,
        }
    }
}

/// What [`crate::llama::Llama::quantize_`] did: the weights it quantized and those it left,
/// each with the reason.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuantReport {
    /// The weights now stored as blocks, by parameter name.
    pub quantized: Vec<String>,
    /// The weights left as they were, and why.
    pub kept: Vec<(String, String)>,
}

/// The kinds [`QuantConfig::kind`] may name.
const KINDS: [QuantKind; 4] = [
    QuantKind::Blocks(GgmlType::Q8_0),
    QuantKind::Blocks(GgmlType::Q4_0),
    QuantKind::Blocks(GgmlType::Q4_K),
    QuantKind::Int8,
];

/// Refuses a configuration the quantized products cannot serve.
pub(crate) fn check(config: &QuantConfig) -> Result<()> {
    if !KINDS.contains(&config.kind) {
        return Err(Error::Value {
            op: "quantize_",
            detail: format!(
                "{} is not a kind quantize_ writes: Q8_0, Q4_0 or Q4_K blocks, or per-channel int8",
                config.kind
            ),
        });
    }
    Ok(())
}

/// `weight` (`[rows, cols]`, any float dtype) stored as `kind` (GGML blocks, u8 `[rows, row
/// bytes]`; or int8, `i8` `[rows, cols]` with its scales), or why it stays: its row length
/// is not a whole number of blocks.
pub(crate) fn quantized(
    weight: &Tensor,
    kind: QuantKind,
    activations: Activations,
) -> Result<std::result::Result<(Tensor, Quantized), String>> {
    let &[rows, cols] = weight.dims() else {
        return Ok(Err(format!("a weight of shape {} is not a matrix", weight.shape())));
    };
    let values = weight.to_dtype(DType::F32).try_to_vec::<f32>()?;
    let error = |e: quant::DequantizeError| Error::Value { op: "quantize_", detail: e.to_string() };
    let stored = match kind {
        QuantKind::Blocks(ggml) => {
            let Some(row_bytes) = ggml.bytes_of(cols) else {
                let values = ggml.block().map_or(1, |b| b.0);
                return Ok(Err(format!(
                    "rows of {cols} values are not whole {ggml} blocks of {values}"
                )));
            };
            let mut bytes = vec![0u8; rows * row_bytes];
            quant::quantize(ggml, &values, &mut bytes).map_err(error)?;
            (Tensor::from_vec(bytes, [rows, row_bytes]).to(weight.device()), None)
        }
        QuantKind::Int8 => {
            let (mut q, mut scales) = (vec![0i8; rows * cols], vec![0f32; rows]);
            quant::quantize_rows_i8(&values, cols, &mut q, &mut scales).map_err(error)?;
            let device = weight.device();
            let scales = Tensor::from_vec(scales, [rows]).to(device);
            (Tensor::from_vec(q, [rows, cols]).to(device), Some(scales))
        }
    };
    Ok(Ok((stored.0, Quantized { kind, activations, scales: stored.1 })))
}

/// Quantizes one projection unless the configuration skips it or it cannot be.
pub(crate) fn linear(
    name: &str,
    linear: &mut Linear,
    config: &QuantConfig,
    report: &mut QuantReport,
) -> Result<()> {
    let weight = format!("{name}.weight");
    if let Some(pattern) = config.skip.iter().find(|p| name.contains(p.as_str())) {
        report.kept.push((weight, format!("skipped: the name contains {pattern:?}")));
        return Ok(());
    }
    if let Some(q) = &linear.quantized {
        report.kept.push((weight, format!("already {}", q.kind)));
        return Ok(());
    }
    match quantized(&linear.weight, config.kind, config.activations)? {
        Ok((stored, q)) => {
            linear.weight = stored;
            linear.quantized = Some(q);
            report.quantized.push(weight);
        }
        Err(why) => report.kept.push((weight, why)),
    }
    Ok(())
}
