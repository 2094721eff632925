//! `config.json`: which architecture a checkpoint folder holds and its sizes, read the way
//! transformers reads them (its defaults where a key is absent, both the 5.x
//! `rope_parameters` and the 4.x `rope_theta` / `rope_scaling` spellings).

use std::path::Path;

use kiln::{Error, Result};
use serde_json::Value;

/// The architecture of a checkpoint, from `config.json`'s `model_type`.
#[derive(Clone, Debug, PartialEq)]
pub enum Config {
    /// `gpt2`.
    Gpt2(Gpt2Config),
    /// `llama`, and `qwen2` (the same layers with biases on the query, key and value
    /// projections).
    Llama(LlamaConfig),
    /// `bert` (and the MiniLM sentence encoders built on it).
    Bert(BertConfig),
}

/// BERT's sizes.
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// The hidden size.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// The feed-forward layer's inner size.
    pub intermediate_size: usize,
    /// The feed-forward layer's activation (`hidden_act`).
    pub hidden_act: Activation,
    /// The longest sequence (rows of the position embedding).
    pub max_position_embeddings: usize,
    /// Rows of the token-type (segment) embedding.
    pub type_vocab_size: usize,
    /// Layer norms' epsilon.
    pub layer_norm_eps: f64,
    /// The padding token's id (`pad_token_id`).
    pub pad_token_id: i64,
}

/// An activation named in `config.json` (`hidden_act`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `gelu`: the exact form, `x·Φ(x)`.
    Gelu,
    /// `gelu_new`, `gelu_pytorch_tanh`: the tanh approximation.
    GeluTanh,
    /// `relu`.
    Relu,
    /// `silu` or `swish`.
    Silu,
}

impl Activation {
    /// The activation of `x`.
    pub fn apply(self, x: &kiln::Tensor) -> kiln::Tensor {
        match self {
            Activation::Gelu => x.gelu(),
            Activation::GeluTanh => x.gelu_tanh(),
            Activation::Relu => x.relu(),
            Activation::Silu => x.silu(),
        }
    }

    /// transformers' name for it.
    pub fn name(self) -> &'static str {
        match self {
            Activation::Gelu => "gelu",
            Activation::GeluTanh => "gelu_pytorch_tanh",
            Activation::Relu => "relu",
            Activation::Silu => "silu",
        }
    }
}

/// GPT-2's sizes.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpt2Config {
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// The longest sequence (rows of the position embedding).
    pub n_positions: usize,
    /// The hidden size.
    pub n_embd: usize,
    /// Transformer blocks.
    pub n_layer: usize,
    /// Attention heads.
    pub n_head: usize,
    /// The MLP's inner size (`4 * n_embd` when `n_inner` is null).
    pub n_inner: usize,
    /// Layer norms' epsilon.
    pub layer_norm_epsilon: f64,
}

/// The Llama family's sizes and switches.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// The hidden size.
    pub hidden_size: usize,
    /// The MLP's inner size.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key and value heads (grouped-query attention when fewer than the query heads).
    pub num_key_value_heads: usize,
    /// Each head's size.
    pub head_dim: usize,
    /// The longest sequence the rotary tables are made for.
    pub max_position_embeddings: usize,
    /// RMS norms' epsilon.
    pub rms_norm_eps: f64,
    /// The rotary embedding.
    pub rope: Rope,
    /// Whether the output head is the token embedding (no `lm_head.weight` in the file).
    pub tie_word_embeddings: bool,
    /// Biases on the query, key and value projections (`attention_bias`; always in Qwen2).
    pub qkv_bias: bool,
    /// A bias on the output projection (`attention_bias` in Llama; never in Qwen2).
    pub o_bias: bool,
    /// Biases on the MLP's projections (`mlp_bias`).
    pub mlp_bias: bool,
}

/// Rotary position embedding: `inv_freq[i] = theta^(-2i/d)`, then the scaling.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    /// The base (`rope_theta`).
    pub theta: f64,
    /// How the frequencies are scaled for longer contexts.
    pub scaling: RopeScaling,
}

/// The `rope_type`s kiln computes.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// `default`: the frequencies as they are.
    None,
    /// `linear`: every frequency divided by `factor` (positions interpolated).
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// `llama3`: low frequencies divided by `factor`, high ones kept, a smooth blend
    /// between (Llama 3.1 and later).
    Llama3 {
        /// The divisor of the low frequencies.
        factor: f64,
        /// Wavelengths above `original / low_freq_factor` are divided.
        low_freq_factor: f64,
        /// Wavelengths below `original / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context the model was trained on before the extension.
        original_max_position_embeddings: f64,
    },
    /// Each frequency divided by its own divisor (`head_dim / 2` of them): a GGUF file's
    /// `rope_freqs.weight`, the form llama.cpp's converter gives Llama 3.1's scaling, which
    /// `config.json` cannot express.
    Divisors(Vec<f64>),
}

impl Config {
    /// Reads `dir/config.json`.
    ///
    /// # Errors
    /// [`Error::Io`] when the file is missing or not JSON, a needed key is missing or of the
    /// wrong type, or the `model_type` or `rope_type` is one kiln does not run.
    pub fn from_dir(dir: &Path) -> Result<Config> {
        read_dir(dir).map(|(config, _)| config)
    }

    /// Reads a parsed `config.json`; `file` names it in errors.
    ///
    /// # Errors
    /// As [`Config::from_dir`].
    pub fn from_json(value: &Value, file: &str) -> Result<Config> {
        let json = Json { value, file };
        match json.str("model_type")? {
            "gpt2" => Ok(Config::Gpt2(gpt2(&json)?)),
            kind @ ("llama" | "qwen2") => Ok(Config::Llama(llama(&json, kind == "qwen2")?)),
            "bert" => Ok(Config::Bert(bert(&json)?)),
            other => Err(io(format!(
                "{file}: model_type {other:?} is not one kiln-models runs (gpt2, llama, qwen2, bert)"
            ))),
        }
    }
}

/// `dir/config.json` read once: the config, and the file's JSON (which `save_pretrained`
/// writes back with its other keys).
pub(crate) fn read_dir(dir: &Path) -> Result<(Config, Value)> {
    let value = read_json(dir)?;
    let config = Config::from_json(&value, &dir.join("config.json").display().to_string())?;
    Ok((config, value))
}

/// `dir/config.json`, parsed.
fn read_json(dir: &Path) -> Result<Value> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        io(format!("cannot read {}: {e} (a Hugging Face model folder holds one)", path.display()))
    })?;
    serde_json::from_str(&text)
        .map_err(|e| io(format!("{} is not valid JSON: {e}", path.display())))
}

fn gpt2(json: &Json<'_>) -> Result<Gpt2Config> {
    let n_embd = json.usize("n_embd")?;
    Ok(Gpt2Config {
        vocab_size: json.usize("vocab_size")?,
        n_positions: json.usize("n_positions")?,
        n_embd,
        n_layer: json.usize("n_layer")?,
        n_head: json.usize("n_head")?,
        n_inner: json.usize_or("n_inner", 4 * n_embd)?,
        layer_norm_epsilon: json.f64_or("layer_norm_epsilon", 1e-5)?,
    })
}

fn llama(json: &Json<'_>, qwen2: bool) -> Result<LlamaConfig> {
    let hidden_size = json.usize("hidden_size")?;
    let heads = json.usize("num_attention_heads")?;
    if heads == 0 || (hidden_size % heads != 0 && json.value.get("head_dim").is_none()) {
        return Err(io(format!(
            "{}: hidden_size {hidden_size} is not a multiple of num_attention_heads {heads}",
            json.file
        )));
    }
    let kv_heads = json.usize_or("num_key_value_heads", heads)?;
    if kv_heads == 0 || heads % kv_heads != 0 {
        return Err(io(format!(
            "{}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}",
            json.file
        )));
    }
    let attention_bias = json.bool_or("attention_bias", false)?;
    Ok(LlamaConfig {
        vocab_size: json.usize("vocab_size")?,
        hidden_size,
        intermediate_size: json.usize("intermediate_size")?,
        num_hidden_layers: json.usize("num_hidden_layers")?,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim: json.usize_or("head_dim", hidden_size / heads)?,
        max_position_embeddings: json.usize_or("max_position_embeddings", 2048)?,
        rms_norm_eps: json.f64_or("rms_norm_eps", 1e-6)?,
        rope: rope(json)?,
        tie_word_embeddings: json.bool_or("tie_word_embeddings", false)?,
        qkv_bias: qwen2 || attention_bias,
        o_bias: !qwen2 && attention_bias,
        mlp_bias: json.bool_or("mlp_bias", false)?,
    })
}

fn bert(json: &Json<'_>) -> Result<BertConfig> {
    let hidden_size = json.usize("hidden_size")?;
    let heads = json.usize("num_attention_heads")?;
    if heads == 0 || hidden_size % heads != 0 {
        return Err(io(format!(
            "{}: hidden_size {hidden_size} is not a multiple of num_attention_heads {heads}",
            json.file
        )));
    }
    let position = json.value.get("position_embedding_type").and_then(Value::as_str);
    if position.is_some_and(|p| p != "absolute") {
        return Err(io(format!(
            "{}: position_embedding_type {position:?} is not one kiln-models computes (absolute)",
            json.file
        )));
    }
    let hidden_act = match json.value.get("hidden_act").and_then(Value::as_str).unwrap_or("gelu") {
        "gelu" => Activation::Gelu,
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Activation::GeluTanh,
        "relu" => Activation::Relu,
        "silu" | "swish" => Activation::Silu,
        other => {
            return Err(io(format!(
                "{}: hidden_act {other:?} is not one kiln-models computes \
                 (gelu, gelu_new, gelu_pytorch_tanh, relu, silu)",
                json.file
            )));
        }
    };
    Ok(BertConfig {
        vocab_size: json.usize("vocab_size")?,
        hidden_size,
        num_hidden_layers: json.usize("num_hidden_layers")?,
        num_attention_heads: heads,
        intermediate_size: json.usize("intermediate_size")?,
        hidden_act,
        max_position_embeddings: json.usize_or("max_position_embeddings", 512)?,
        type_vocab_size: json.usize_or("type_vocab_size", 2)?,
        layer_norm_eps: json.f64_or("layer_norm_eps", 1e-12)?,
        pad_token_id: json.usize_or("pad_token_id", 0)? as i64,
    })
}

/// transformers 5 writes `rope_parameters` (with `rope_theta` inside); 4.x wrote `rope_theta`
/// and an optional `rope_scaling` (`rope_type`, or the older `type`).
fn rope(json: &Json<'_>) -> Result<Rope> {
    let (params, theta) = match json.value.get("rope_parameters") {
        Some(p) if p.is_object() => {
            let inner = Json { value: p, file: json.file };
            (Some(p), inner.f64_or("rope_theta", json.f64_or("rope_theta", 10_000.0)?)?)
        }
        _ => (
            json.value.get("rope_scaling").filter(|s| s.is_object()),
            json.f64_or("rope_theta", 10_000.0)?,
        ),
    };
    let Some(params) = params else { return Ok(Rope { theta, scaling: RopeScaling::None }) };
    let p = Json { value: params, file: json.file };
    let kind = match params.get("rope_type").or_else(|| params.get("type")) {
        Some(Value::String(kind)) => kind.as_str(),
        _ => "default",
    };
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: p.f64("factor")? },
        "llama3" => RopeScaling::Llama3 {
            factor: p.f64("factor")?,
            low_freq_factor: p.f64("low_freq_factor")?,
            high_freq_factor: p.f64("high_freq_factor")?,
            original_max_position_embeddings: p.f64("original_max_position_embeddings")?,
        },
        other => {
            return Err(io(format!(
                "{}: rope_type {other:?} is not one kiln-models computes (default, linear, llama3)",
                json.file
            )));
        }
    };
    Ok(Rope { theta, scaling })
}

fn io(detail: String) -> Error {
    Error::Io { op: "from_pretrained", detail }
}

/// A JSON object and the file it came from, with typed getters whose errors name both.
struct Json<'a> {
    value: &'a Value,
    file: &'a str,
}

impl Json<'_> {
    fn get(&self, key: &str) -> Result<&Value> {
        match self.value.get(key) {
            Some(v) if !v.is_null() => Ok(v),
            _ => Err(io(format!("{}: the key {key:?} is missing", self.file))),
        }
    }

    fn wrong(&self, key: &str, want: &str, got: &Value) -> Error {
        io(format!("{}: {key:?} should be {want}, found {got}", self.file))
    }

    fn str(&self, key: &str) -> Result<&str> {
        let v = self.get(key)?;
        v.as_str().ok_or_else(|| self.wrong(key, "a string", v))
    }

    fn usize(&self, key: &str) -> Result<usize> {
        let v = self.get(key)?;
        v.as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.wrong(key, "a non-negative integer", v))
    }

    fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        match self.value.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(_) => self.usize(key),
        }
    }

    fn f64(&self, key: &str) -> Result<f64> {
        let v = self.get(key)?;
        v.as_f64().ok_or_else(|| self.wrong(key, "a number", v))
    }

    fn f64_or(&self, key: &str, default: f64) -> Result<f64> {
        match self.value.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(_) => self.f64(key),
        }
    }

    fn bool_or(&self, key: &str, default: bool) -> Result<bool> {
        match self.value.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v.as_bool().ok_or_else(|| self.wrong(key, "true or false", v)),
        }
    }
}
