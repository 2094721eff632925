//! compressed-tensors' quantized checkpoints (the `quantization_config` that llm-compressor
//! writes and transformers, with the `compressed-tensors` package, and vLLM read):
//!
//! - per-channel int8 (W8A16, W8A8): `weight` stored as `i8` `[out, in]`, `weight_scale`
//!   `[out, 1]` beside it, symmetric, one scale per output channel. kiln's per-channel int8
//!   rows are exactly that layout, so a model whose quantized weights are all int8
//!   projections is saved with this config, and checkpoints with it load with their rows
//!   kept ([`crate::LoadOptions`]'s `keep_quantized`) or dequantized;
//! - packed int4 (W4A16, `pack-quantized`): `weight_packed` `i32` `[out, in / 8]` (value `c`
//!   of a row in bits `4 (c % 8)` of word `c / 8`, stored as `q + 8`), `weight_scale`
//!   `[out, groups]` (one per group of inputs, or per channel), `weight_shape`, symmetric:
//!   `w = q · scale`. That is GGML's Q4_0 (`(nibble - 8) · d`) with the scale repeated per
//!   32 values, so such a weight loads kept as Q4_0 blocks (its products are Q4_0's) when
//!   its groups are whole blocks and its scales are exact in f16, or dequantized to
//!   `q · scale` exactly (transformers rounds the product to the scales' bf16).

use std::path::Path;

use kiln::{Error, Result};
use serde_json::{Value, json};

/// `quant_method` of compressed-tensors' configs.
const METHOD: &str = "compressed-tensors";

/// The compression formats whose int8 weights are stored as they are (no packing):
/// weight-only (`naive-quantized`) and with dynamically quantized inputs (`int-quantized`,
/// llm-compressor's W8A8; kiln's [`crate::Activations`] choose how inputs are taken).
const FORMATS: [&str; 2] = ["naive-quantized", "int-quantized"];

/// The config for int8 rows in the modules `targets` (`model.layers.0.mlp.up_proj`, ...):
/// one group, weight-only.
pub(crate) fn config(targets: &[String]) -> Value {
    json!({
        "quant_method": METHOD,
        "format": FORMATS[0],
        "quantization_status": "compressed",
        "config_groups": { "group_0": {
            "targets": targets,
            "weights": {
                "num_bits": 8, "type": "int", "symmetric": true, "strategy": "channel",
                "dynamic": false
            },
            "input_activations": null,
            "output_activations": null,
            "format": FORMATS[0],
        }},
        "ignore": [],
    })
}

/// The compressed-tensors schemes a checkpoint's `config.json` describes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Schemes {
    /// Per-channel int8 weights.
    pub(crate) int8_rows: bool,
    /// Packed symmetric int4 weights.
    pub(crate) int4_packed: bool,
}

/// The format of packed int4 weights.
const PACKED_FORMAT: &str = "pack-quantized";

/// The schemes `config.json` in `dir` describes (none without a compressed-tensors config).
///
/// # Errors
/// [`Error::Io`] for a compressed-tensors config of another scheme (other bit widths,
/// asymmetric, activation-ordered, blocks, float formats), naming what it says.
pub(crate) fn schemes(dir: &Path) -> Result<Schemes> {
    let mut found = Schemes::default();
    let Ok(text) = std::fs::read_to_string(dir.join("config.json")) else { return Ok(found) };
    let Ok(json) = serde_json::from_str::<Value>(&text) else { return Ok(found) };
    let Some(q) = json.get("quantization_config") else { return Ok(found) };
    if q.get("quant_method").and_then(Value::as_str) != Some(METHOD) {
        return Ok(found);
    }
    let unsupported = |what: String| Error::Io {
        op: "from_pretrained",
        detail: format!(
            "{}: compressed-tensors {what}: kiln reads symmetric int weights, 8-bit per channel ({} formats) or 4-bit per group or channel ({PACKED_FORMAT})",
            dir.join("config.json").display(),
            FORMATS.join(", ")
        ),
    };
    let format = |v: &Value| v.get("format").and_then(Value::as_str).map(str::to_string);
    let top = format(q).unwrap_or_default();
    let groups = q.get("config_groups").and_then(Value::as_object);
    for (name, group) in groups.into_iter().flatten() {
        let weights = &group["weights"];
        let format = format(group).unwrap_or_else(|| top.clone());
        let symmetric = weights["type"] == "int" && weights["symmetric"] == true;
        let ordered =
            !matches!(weights.get("actorder"), None | Some(Value::Null | Value::Bool(false)));
        let strategy = weights["strategy"].as_str().unwrap_or_default();
        match (weights["num_bits"].as_u64(), format.as_str()) {
            (Some(8), f) if symmetric && strategy == "channel" && FORMATS.contains(&f) => {
                found.int8_rows = true;
            }
            (Some(4), PACKED_FORMAT)
                if symmetric && !ordered && matches!(strategy, "group" | "channel") =>
            {
                found.int4_packed = true;
            }
            _ => {
                return Err(unsupported(format!(
                    "group {name} (format {format:?}, weights {weights})"
                )));
            }
        }
    }
    Ok(found)
}

/// The suffixes of a packed weight's parts (`NAME_packed`, `NAME_shape`; its scales are
/// `NAME_scale`, [`crate::save::SCALE_SUFFIX`]).
pub(crate) const PACKED_SUFFIX: &str = "_packed";
pub(crate) const SHAPE_SUFFIX: &str = "_shape";

/// A weight stored as packed int4: `[out, inp]` values, `groups` scales a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Packed {
    pub(crate) out: usize,
    pub(crate) inp: usize,
    pub(crate) groups: usize,
}

impl Packed {
    /// The stored nibble (`q + 8`) of value `c` of row `r` in `packed` (the `i32` words'
    /// little-endian bytes).
    fn nibble(&self, packed: &[u8], r: usize, c: usize) -> u8 {
        let byte = packed[r * self.inp.div_ceil(8) * 4 + c / 2];
        if c.is_multiple_of(2) { byte & 15 } else { byte >> 4 }
    }

    /// The values `q · scale`, f32 `[out, inp]` row-major, exact (`scales` f32
    /// `[out, groups]`).
    pub(crate) fn values(&self, packed: &[u8], scales: &[f32]) -> Vec<f32> {
        let group = self.inp / self.groups;
        let mut values = Vec::with_capacity(self.out * self.inp);
        for r in 0..self.out {
            for c in 0..self.inp {
                let q = f32::from(self.nibble(packed, r, c)) - 8.0;
                values.push(q * scales[r * self.groups + c / group]);
            }
        }
        values
    }

    /// The weight as GGML Q4_0 blocks (u8 `[out, inp / 32 · 18]`), the same values, or
    /// why not: groups that are not whole blocks, or a scale f16 cannot hold exactly.
    pub(crate) fn q4_0(
        &self,
        packed: &[u8],
        scales: &[f32],
    ) -> std::result::Result<Vec<u8>, String> {
        let group = self.inp / self.groups;
        if !group.is_multiple_of(32) {
            return Err(format!("its groups of {group} inputs are not whole Q4_0 blocks of 32"));
        }
        let mut blocks = Vec::with_capacity(self.out * self.inp / 32 * 18);
        for r in 0..self.out {
            for b in 0..self.inp / 32 {
                let scale = scales[r * self.groups + 32 * b / group];
                let d = half::f16::from_f32(scale);
                if d.to_f32() != scale {
                    return Err(format!("its scale {scale:e} (row {r}) is not exact in f16"));
                }
                blocks.extend(d.to_le_bytes());
                blocks.extend((0..16).map(|j| {
                    let c = 32 * b + j;
                    self.nibble(packed, r, c) | (self.nibble(packed, r, c + 16) << 4)
                }));
            }
        }
        Ok(blocks)
    }
}
