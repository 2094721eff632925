//! compressed-tensors' description of per-channel int8 weights (the `quantization_config`
//! that llm-compressor writes and transformers, with the `compressed-tensors` package, and
//! vLLM read): `weight` stored as `i8` `[out, in]`, `weight_scale` `[out, 1]` beside it,
//! symmetric, 8-bit, one scale per output channel. kiln's per-channel int8 rows are exactly
//! that layout, so a model whose quantized weights are all int8 projections is saved with
//! this config, and checkpoints with it load with their rows kept ([`crate::LoadOptions`]'s
//! `keep_quantized`) or dequantized.

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

/// Whether `config.json` in `dir` describes compressed-tensors' per-channel int8 weights.
///
/// # Errors
/// [`Error::Io`] for a compressed-tensors config of another scheme (other bit widths,
/// groups or blocks, asymmetric, packed or float formats), naming what it says.
pub(crate) fn int8_channel(dir: &Path) -> Result<bool> {
    let Ok(text) = std::fs::read_to_string(dir.join("config.json")) else { return Ok(false) };
    let Ok(json) = serde_json::from_str::<Value>(&text) else { return Ok(false) };
    let Some(q) = json.get("quantization_config") else { return Ok(false) };
    if q.get("quant_method").and_then(Value::as_str) != Some(METHOD) {
        return Ok(false);
    }
    let unsupported = |what: String| Error::Io {
        op: "from_pretrained",
        detail: format!(
            "{}: compressed-tensors {what}: kiln reads 8-bit symmetric per-channel int weights ({} formats)",
            dir.join("config.json").display(),
            FORMATS.join(", ")
        ),
    };
    let format = |v: &Value| v.get("format").and_then(Value::as_str).map(str::to_string);
    let top = format(q).unwrap_or_default();
    let groups = q.get("config_groups").and_then(Value::as_object);
    for (name, group) in groups.into_iter().flatten() {
        let weights = &group["weights"];
        let fits = weights["num_bits"] == 8
            && weights["type"] == "int"
            && weights["symmetric"] == true
            && weights["strategy"] == "channel";
        let format = format(group).unwrap_or_else(|| top.clone());
        if !fits || !FORMATS.contains(&format.as_str()) {
            return Err(unsupported(format!(
                "group {name} (format {format:?}, weights {weights})"
            )));
        }
    }
    Ok(groups.is_some_and(|g| !g.is_empty()))
}
