//! Quantizing a float model's weights in place ([`crate::llama::Llama::quantize_`], as
//! torchao's `quantize_`): each projection's weight becomes GGML blocks (Q8_0, Q4_0 or
//! Q4_K, quantized as GGML's reference does) that its products read where they lie
//! ([`crate::Activations`] chooses weight-only or integer products), the head and the
//! embedding table as chosen. A quantized model generates, and LoRA adapters train over its
//! projections (QLoRA's recipe). `save_pretrained` writes the blocks as they are
//! ([`crate::save::QUANTIZED_KEY`]), for kiln-models to load back; transformers cannot.

use kiln::{DType, Device, Error, Result, Tensor};
use kiln_runtime::quant::{self, GgmlType};

use crate::linear::Linear;
use crate::quantized::{Activations, Quantized};

/// What [`crate::llama::Llama::quantize_`] does.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantConfig {
    /// The block type of the weights: [`GgmlType::Q8_0`] (8 bits and a scale per 32
    /// values: 8.5 bits a weight), [`GgmlType::Q4_0`] (4.5 bits) or [`GgmlType::Q4_K`]
    /// (4.5 bits, a scale and a minimum per 32 values: closer than Q4_0).
    pub kind: GgmlType,
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
    pub fn new(kind: GgmlType) -> QuantConfig {
        QuantConfig {
            kind,
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

/// The block types [`QuantConfig::kind`] may name.
const KINDS: [GgmlType; 3] = [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K];

/// Refuses a configuration or a model the quantized products cannot serve.
pub(crate) fn check(config: &QuantConfig, device: Device) -> Result<()> {
    if !KINDS.contains(&config.kind) {
        return Err(Error::Value {
            op: "quantize_",
            detail: format!("{} is not a type quantize_ writes: Q8_0, Q4_0 or Q4_K", config.kind),
        });
    }
    if device != Device::Cpu {
        return Err(Error::Device {
            op: "quantize_",
            detail: format!(
                "quantized products run on the CPU and the model is on {device:?}: quantize it before moving it, or load it with .to(Device::Cpu)"
            ),
        });
    }
    Ok(())
}

/// `weight` (`[rows, cols]`, any float dtype) as `kind` blocks (u8 `[rows, row bytes]`),
/// or why it stays: its row length is not a whole number of blocks.
pub(crate) fn blocks(
    weight: &Tensor,
    kind: GgmlType,
) -> Result<std::result::Result<Tensor, String>> {
    let &[rows, cols] = weight.dims() else {
        return Ok(Err(format!("a weight of shape {} is not a matrix", weight.shape())));
    };
    let Some(row_bytes) = kind.bytes_of(cols) else {
        let values = kind.block().map_or(1, |b| b.0);
        return Ok(Err(format!("rows of {cols} values are not whole {kind} blocks of {values}")));
    };
    let values = weight.to_dtype(DType::F32).try_to_vec::<f32>()?;
    let mut bytes = vec![0u8; rows * row_bytes];
    quant::quantize(kind, &values, &mut bytes)
        .map_err(|e| Error::Value { op: "quantize_", detail: e.to_string() })?;
    Ok(Ok(Tensor::from_vec(bytes, [rows, row_bytes])))
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
    if let Some(q) = linear.quantized {
        report.kept.push((weight, format!("already {} blocks", q.kind)));
        return Ok(());
    }
    match blocks(&linear.weight, config.kind)? {
        Ok(blocks) => {
            linear.weight = blocks;
            linear.quantized =
                Some(Quantized { kind: config.kind, activations: config.activations });
            report.quantized.push(weight);
        }
        Err(why) => report.kept.push((weight, why)),
    }
    Ok(())
}
