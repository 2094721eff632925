//! `save_pretrained`: a model written as a Hugging Face folder that transformers (and
//! kiln-models) loads unchanged: `config.json`, and `model.safetensors` or, above
//! [`SaveOptions::max_shard_bytes`], shards `model-0000k-of-0000n.safetensors` with
//! `model.safetensors.index.json`, tensors under the checkpoint's names in the parameters'
//! dtype. A model with weights kept quantized is written with those weights as stored (GGML
//! blocks, or int8 rows and their scales; each file's metadata names how under
//! [`QUANTIZED_KEY`]); kiln-models loads such a folder back, transformers does not.

use std::collections::BTreeMap;
use std::path::Path;

use kiln::{DType, Error, Result, Tensor};
use serde_json::{Map, Value, json};

use crate::config::{BertConfig, Config, Gpt2Config, LlamaConfig, RopeScaling};
use crate::quantize::QuantKind;

/// How [`crate::llama::Llama::save_pretrained`] and friends write a folder.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SaveOptions {
    /// The largest shard, in bytes (transformers' `max_shard_size`, 50 GB by default there
    /// and here); a tensor larger than this is a shard of its own.
    pub max_shard_bytes: u64,
}

impl Default for SaveOptions {
    fn default() -> SaveOptions {
        SaveOptions { max_shard_bytes: 50_000_000_000 }
    }
}

fn io(detail: String) -> Error {
    Error::Io { op: "save_pretrained", detail }
}

/// Writes `config` (over `base`, the `config.json` the model was loaded from, whose other keys
/// such as the special token ids are kept) and `tensors` into `dir`, created if needed.
/// `quantized` names the tensors stored quantized and how: each file's metadata records them
/// ([`QUANTIZED_KEY`]), and `config.json` gains a `quantization_config`.
pub(crate) fn save(
    dir: &Path,
    base: Option<&Value>,
    config: &Config,
    tensors: &[(String, Tensor)],
    quantized: &BTreeMap<String, QuantKind>,
    options: SaveOptions,
) -> Result<()> {
    if let Some((name, t)) =
        tensors.iter().find(|(name, t)| !t.dtype().is_float() && !quantized.contains_key(name))
    {
        return Err(io(format!("{name} is a {} tensor, not a float parameter", t.dtype())));
    }
    let dtype = tensors
        .iter()
        .find(|(name, _)| !quantized.contains_key(name))
        .map_or(DType::F32, |(_, t)| t.dtype());
    // A config with no config.json form fails before anything is written.
    let Value::Object(ours) = config_json(config, dtype)? else {
        unreachable!("config_json writes an object")
    };
    std::fs::create_dir_all(dir)
        .map_err(|e| io(format!("cannot create {}: {e}", dir.display())))?;
    let mut json = match base {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    // transformers 4.x's spellings of what `rope_parameters` now holds would contradict it,
    // and a quantization the loaded model had is not necessarily the saved one's.
    for stale in ["rope_theta", "rope_scaling", "torch_dtype", "quantization_config"] {
        json.remove(stale);
    }
    json.extend(ours);
    if !quantized.is_empty() {
        json.insert("quantization_config".into(), quantization_config(quantized));
    }
    let text = serde_json::to_string_pretty(&Value::Object(json))
        .map_err(|e| io(format!("cannot write config.json: {e}")))?;
    let path = dir.join("config.json");
    std::fs::write(&path, text + "\n")
        .map_err(|e| io(format!("cannot write {}: {e}", path.display())))?;
    write_shards(dir, tensors, quantized, options)
}

/// `config.json`'s `quantization_config` for the `quantized` weights: compressed-tensors'
/// per-channel int8 scheme when every one is int8 rows of a projection or the head (the
/// layout is theirs), else kiln's own (blocks, or an int8 embedding table, which
/// compressed-tensors' loader in transformers does not restore).
fn quantization_config(quantized: &BTreeMap<String, QuantKind>) -> Value {
    let modules: Option<Vec<String>> = (quantized.iter())
        .map(|(name, kind)| match (kind, name.strip_suffix(".weight")) {
            (QuantKind::Int8, Some(module)) if !module.ends_with("embed_tokens") => {
                Some(module.to_string())
            }
            _ => None,
        })
        .collect();
    match modules {
        Some(modules) => crate::compressed::config(&modules),
        None => {
            let types: std::collections::BTreeSet<String> =
                quantized.values().map(|k| k.name()).collect();
            json!({ "format": QUANT_FORMAT, "types": types })
        }
    }
}

/// The prefix of a safetensors metadata key naming a tensor stored quantized, and how
/// ([`QuantKind::name`]): `"quantized:model.layers.0.mlp.up_proj.weight": "Q4_K"`, the
/// tensor u8 `[out, row bytes]`, each row the blocks of one output's weights in GGML's
/// layout; or `"int8"`, the tensor `i8` `[out, in]` and its f32 scales `[out, 1]` beside it
/// under the name with [`SCALE_SUFFIX`].
pub const QUANTIZED_KEY: &str = "quantized:";

/// What the scales of int8 rows add to their weight's name (`up_proj.weight_scale`, as
/// compressed-tensors names them).
pub const SCALE_SUFFIX: &str = "_scale";

/// `config.json`'s `quantization_config.format` for a folder kiln-models quantized. The
/// config has no `quant_method`, so that transformers refuses the folder (it raises for a
/// quantization config without one; an unknown method it skips, and would then load int8
/// rows as if they were the weights, scales left aside, with only a warning).
const QUANT_FORMAT: &str = "kiln";

/// The tensors in shards of at most `options.max_shard_bytes` (in name order), with an index
/// when there is more than one.
fn write_shards(
    dir: &Path,
    tensors: &[(String, Tensor)],
    quantized: &BTreeMap<String, QuantKind>,
    options: SaveOptions,
) -> Result<()> {
    let mut sorted: Vec<&(String, Tensor)> = tensors.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let bytes = |t: &Tensor| (t.numel() * t.element_size()) as u64;
    let mut shards: Vec<Vec<(String, Tensor)>> = vec![Vec::new()];
    let mut size = 0;
    // Int8 rows' scales stay in their rows' shard (they sort right after them): a file's
    // metadata describes the tensors it holds.
    let scales_of_rows = |name: &str| {
        name.strip_suffix(SCALE_SUFFIX).is_some_and(|w| quantized.get(w) == Some(&QuantKind::Int8))
    };
    for (name, t) in sorted {
        let last = shards.last_mut().expect("one shard at least");
        let full = size + bytes(t) > options.max_shard_bytes;
        if !last.is_empty() && full && !scales_of_rows(name) {
            shards.push(Vec::new());
            size = 0;
        }
        size += bytes(t);
        shards.last_mut().expect("one shard at least").push((name.clone(), t.clone()));
    }
    let metadata = |shard: &[(String, Tensor)]| {
        let mut m = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        for (name, _) in shard {
            if let Some(kind) = quantized.get(name) {
                m.insert(format!("{QUANTIZED_KEY}{name}"), kind.name());
            }
        }
        m
    };
    if shards.len() == 1 {
        return kiln::serialize::save_with_metadata(
            dir.join("model.safetensors"),
            &shards[0],
            &metadata(&shards[0]),
        );
    }
    let n = shards.len();
    let mut weight_map = Map::new();
    for (k, shard) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{n:05}.safetensors", k + 1);
        kiln::serialize::save_with_metadata(dir.join(&file), shard, &metadata(shard))?;
        for (name, _) in shard {
            weight_map.insert(name.clone(), Value::String(file.clone()));
        }
    }
    let total: u64 = tensors.iter().map(|(_, t)| bytes(t)).sum();
    let index = json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
    let path = dir.join("model.safetensors.index.json");
    let text = serde_json::to_string_pretty(&index).map_err(|e| io(e.to_string()))?;
    std::fs::write(&path, text + "\n")
        .map_err(|e| io(format!("cannot write {}: {e}", path.display())))
}

/// transformers' name of a dtype in `config.json`.
fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::F64 => "float64",
        _ => "float32",
    }
}

/// `config.json`'s keys for `config`, as transformers 5 writes them.
///
/// # Errors
/// [`Error::Io`] for a config `config.json` cannot express (rotary divisors read from a
/// GGUF file).
pub fn config_json(config: &Config, dtype: DType) -> Result<Value> {
    Ok(match config {
        Config::Gpt2(c) => gpt2_json(c, dtype),
        Config::Llama(c) => llama_json(c, dtype)?,
        Config::Bert(c) => bert_json(c, dtype),
    })
}

fn bert_json(c: &BertConfig, dtype: DType) -> Value {
    json!({
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "intermediate_size": c.intermediate_size,
        "hidden_act": c.hidden_act.name(),
        "max_position_embeddings": c.max_position_embeddings,
        "type_vocab_size": c.type_vocab_size,
        "layer_norm_eps": c.layer_norm_eps,
        "pad_token_id": c.pad_token_id,
        "position_embedding_type": "absolute",
        "dtype": dtype_name(dtype),
    })
}

fn gpt2_json(c: &Gpt2Config, dtype: DType) -> Value {
    json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": c.vocab_size,
        "n_positions": c.n_positions,
        "n_embd": c.n_embd,
        "n_layer": c.n_layer,
        "n_head": c.n_head,
        "n_inner": c.n_inner,
        "layer_norm_epsilon": c.layer_norm_epsilon,
        "activation_function": "gelu_new",
        "tie_word_embeddings": true,
        "dtype": dtype_name(dtype),
    })
}

fn llama_json(c: &LlamaConfig, dtype: DType) -> Result<Value> {
    // Qwen2 is the Llama with biases on the query, key and value projections only.
    let qwen2 = c.qkv_bias && !c.o_bias;
    let (model_type, architecture) =
        if qwen2 { ("qwen2", "Qwen2ForCausalLM") } else { ("llama", "LlamaForCausalLM") };
    let mut rope = json!({ "rope_theta": c.rope.theta });
    let extra = match c.rope.scaling {
        RopeScaling::Divisors(_) => {
            return Err(io(
                "the rotary embedding's per-frequency divisors (read from a GGUF file's rope_freqs.weight) have no config.json form: transformers would compute other frequencies".into(),
            ));
        }
        RopeScaling::None => json!({ "rope_type": "default" }),
        RopeScaling::Linear { factor } => json!({ "rope_type": "linear", "factor": factor }),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => json!({
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position_embeddings as u64,
        }),
    };
    if let (Value::Object(r), Value::Object(e)) = (&mut rope, extra) {
        r.extend(e);
    }
    let mut j = json!({
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "hidden_act": "silu",
        "rope_parameters": rope,
        "tie_word_embeddings": c.tie_word_embeddings,
        "dtype": dtype_name(dtype),
    });
    if !qwen2 && let Value::Object(m) = &mut j {
        m.insert("attention_bias".into(), Value::Bool(c.o_bias));
        m.insert("mlp_bias".into(), Value::Bool(c.mlp_bias));
    }
    Ok(j)
}
