//! The Llama family from GGUF: the config from llama.cpp's metadata keys, and the tensors
//! under transformers' names, the query and key projections' rows put back in
//! transformers' order (llama.cpp's converter interleaves each head's two rotary halves).

use std::collections::BTreeMap;

use kiln::{Device, Error, Result, Tensor};

use super::Gguf;
use crate::checkpoint::{LoadOptions, Weights};
use crate::config::{LlamaConfig, Rope, RopeScaling};
use crate::llama::Llama;

impl Llama {
    /// Builds a Llama-family model (`general.architecture` `llama` or `qwen2`) from a GGUF
    /// file: the config from its metadata, every tensor dequantized to the options' dtype
    /// and moved to their device.
    ///
    /// ```no_run
    /// use kiln_models::{LoadOptions, llama::Llama};
    /// let model = Llama::from_gguf("tinyllama-1.1b-chat.Q8_0.gguf", LoadOptions::default())?;
    /// # Ok::<(), kiln::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Io`] for a file [`Gguf::open`] rejects, another architecture, or metadata
    /// that does not describe a model; [`Error::Load`] listing every missing, unexpected or
    /// mis-shaped tensor.
    pub fn from_gguf(path: impl AsRef<std::path::Path>, options: LoadOptions) -> Result<Llama> {
        Llama::load_gguf(&Gguf::open(path)?, options)
    }

    /// [`Llama::from_gguf`] of a file already open (whose tokenizer
    /// [`crate::Tokenizer::from_gguf`] reads too).
    ///
    /// # Errors
    /// As [`Llama::from_gguf`].
    pub fn load_gguf(file: &Gguf, options: LoadOptions) -> Result<Llama> {
        let config = config(file)?;
        let weights = GgufWeights::llama(file, &config)?;
        Llama::load(config, &weights, options)
    }
}

/// The architectures (`general.architecture`) built as [`crate::llama::Llama`], and whether
/// llama.cpp's converter permuted their query and key rows.
const ARCHITECTURES: &[(&str, bool)] = &[("llama", true), ("qwen2", false)];

/// Each layer tensor's GGUF name (`blk.N.` stripped, `.weight`/`.bias` kept apart) and
/// transformers' (under `model.layers.N.`).
const LAYER_NAMES: &[(&str, &str)] = &[
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_norm", "post_attention_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// The model-level tensors' GGUF and transformers names.
const TOP_NAMES: &[(&str, &str)] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// The longest context kiln makes rotary tables and positions for from a file's word.
const MAX_CONTEXT: usize = 1 << 24;

/// Llama 3.1's rotary scaling as llama.cpp's converter stores it: one divisor per frequency
/// (read into the config, not a parameter).
const ROPE_DIVISORS: &str = "rope_freqs.weight";

fn fail(file: &Gguf, detail: String) -> Error {
    Error::Io { op: "Llama::from_gguf", detail: format!("{}: {detail}", file.path().display()) }
}

/// The architecture's name, when kiln builds it from GGUF.
fn architecture(file: &Gguf) -> Result<(&str, bool)> {
    let arch = file.get("general.architecture").and_then(|v| v.as_str()).unwrap_or("");
    ARCHITECTURES.iter().find(|a| a.0 == arch).map(|&(a, permuted)| (a, permuted)).ok_or_else(
        || {
            let known: Vec<&str> = ARCHITECTURES.iter().map(|a| a.0).collect();
            fail(
                file,
                format!(
                    "general.architecture is {arch:?}: kiln builds {} from GGUF",
                    known.join(" and ")
                ),
            )
        },
    )
}

/// The config llama.cpp's metadata describes.
pub(super) fn config(file: &Gguf) -> Result<LlamaConfig> {
    let (arch, _) = architecture(file)?;
    let key = |k: &str| format!("{arch}.{k}");
    let number = |k: &str| -> Result<Option<u64>> {
        match file.get(&key(k)) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                fail(file, format!("{} is {v:?}, not a non-negative integer", key(k)))
            }),
        }
    };
    let float = |k: &str, default: f64| -> Result<f64> {
        match file.get(&key(k)) {
            None => Ok(default),
            Some(v) => {
                v.as_f64().ok_or_else(|| fail(file, format!("{} is {v:?}, not a number", key(k))))
            }
        }
    };
    let required = |k: &str| -> Result<usize> {
        number(k)?
            .map(|n| n as usize)
            .ok_or_else(|| fail(file, format!("the metadata has no {}", key(k))))
    };
    let hidden = required("embedding_length")?;
    let heads = required("attention.head_count")?;
    let kv_heads = number("attention.head_count_kv")?.map_or(heads, |n| n as usize);
    if heads == 0 || kv_heads == 0 || heads % kv_heads != 0 {
        return Err(fail(
            file,
            format!("{heads} attention heads cannot share {kv_heads} key/value heads"),
        ));
    }
    let head_dim = number("attention.key_length")?.map_or(hidden / heads, |n| n as usize);
    let Some(embedding) = file.info("token_embd.weight") else {
        return Err(fail(file, "the file has no token_embd.weight".into()));
    };
    let scaling = match file.get(&key("rope.scaling.type")).and_then(|v| v.as_str()) {
        None | Some("none") => RopeScaling::None,
        Some("linear") => RopeScaling::Linear { factor: float("rope.scaling.factor", 1.0)? },
        Some(other) => {
            return Err(fail(file, format!("rope scaling {other:?} is not one kiln computes")));
        }
    };
    let scaling = match file.info(ROPE_DIVISORS) {
        None => scaling,
        Some(t) if t.shape == [head_dim / 2] => {
            let divisors = file.tensor(ROPE_DIVISORS)?.to_dtype(kiln::DType::F64).to_vec::<f64>();
            RopeScaling::Divisors(divisors)
        }
        Some(t) => {
            return Err(fail(
                file,
                format!("{ROPE_DIVISORS} has shape {:?}, not [{}]", t.shape, head_dim / 2),
            ));
        }
    };
    // Sizes the tensors do not check: bounded before anything is made of them.
    let layers = required("block_count")?;
    let context = number("context_length")?.map_or(2048, |n| n as usize);
    if layers > file.tensors().len() || context > MAX_CONTEXT {
        return Err(fail(
            file,
            format!(
                "{layers} layers in {} tensors, or a context of {context} positions (at most {MAX_CONTEXT}): the metadata does not describe this file",
                file.tensors().len()
            ),
        ));
    }
    let has = |name: &str| file.info(name).is_some();
    Ok(LlamaConfig {
        vocab_size: embedding.shape[0],
        hidden_size: hidden,
        intermediate_size: required("feed_forward_length")?,
        num_hidden_layers: layers,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim,
        max_position_embeddings: context,
        rms_norm_eps: float("attention.layer_norm_rms_epsilon", 1e-6)?,
        rope: Rope { theta: float("rope.freq_base", 10_000.0)?, scaling },
        tie_word_embeddings: !has("output.weight"),
        qkv_bias: has("blk.0.attn_q.bias"),
        o_bias: has("blk.0.attn_output.bias"),
        mlp_bias: has("blk.0.ffn_up.bias"),
    })
}

/// A GGUF file's tensors under transformers' names ([`Weights`]), for
/// [`crate::llama::Llama::load`]; tensors it has no name for keep their GGUF names, so the
/// loader reports them as unexpected.
pub struct GgufWeights<'a> {
    file: &'a Gguf,
    /// transformers' name → the GGUF name and, for a permuted query or key projection, its
    /// head count.
    names: BTreeMap<String, (String, Option<usize>)>,
}

impl<'a> GgufWeights<'a> {
    /// The Llama-family view of `file` for `config`.
    ///
    /// # Errors
    /// [`Error::Io`] when `general.architecture` is not one kiln builds.
    pub fn llama(file: &'a Gguf, config: &LlamaConfig) -> Result<GgufWeights<'a>> {
        let (_, permuted) = architecture(file)?;
        let mut names = BTreeMap::new();
        for t in file.tensors().iter().filter(|t| t.name != ROPE_DIVISORS) {
            let hf = hf_name(&t.name);
            let heads = match hf.as_deref().map(|n| n.rsplit('.').nth(1)) {
                Some(Some("q_proj")) if permuted => Some(config.num_attention_heads),
                Some(Some("k_proj")) if permuted => Some(config.num_key_value_heads),
                _ => None,
            };
            names.insert(hf.unwrap_or_else(|| t.name.clone()), (t.name.clone(), heads));
        }
        Ok(GgufWeights { file, names })
    }
}

/// transformers' name of a GGUF tensor of the Llama family.
fn hf_name(gguf: &str) -> Option<String> {
    if let Some(&(_, hf)) = TOP_NAMES.iter().find(|t| t.0 == gguf) {
        return Some(hf.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, kind) = rest.rsplit_once('.')?;
    let &(_, hf) = LAYER_NAMES.iter().find(|l| l.0 == part)?;
    matches!(kind, "weight" | "bias").then(|| format!("model.layers.{layer}.{hf}.{kind}"))
}

impl Weights for GgufWeights<'_> {
    fn source(&self) -> String {
        self.file.path().display().to_string()
    }

    fn names(&self) -> Vec<String> {
        self.names.keys().cloned().collect()
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        let (gguf, _) = self.names.get(name)?;
        self.file.info(gguf).map(|t| t.shape.clone())
    }

    fn tensor_on(&self, name: &str, device: Device) -> Result<Tensor> {
        let Some((gguf, heads)) = self.names.get(name) else {
            return Err(Error::Load { detail: format!("missing: {name}") });
        };
        unpermute(self.file.tensor_on(gguf, device)?, *heads, gguf)
    }

    fn quantized(&self, name: &str) -> Result<Option<crate::checkpoint::StoredWeight>> {
        let Some((gguf, heads)) = self.names.get(name) else { return Ok(None) };
        let Some(info) = self.file.info(gguf).filter(|t| crate::quantized::keeps(t.kind)) else {
            return Ok(None);
        };
        let bytes = self.file.bytes(gguf)?;
        let rows = info.shape[0];
        let blocks = Tensor::try_from_le_bytes(
            bytes,
            kiln::DType::U8,
            [rows, bytes.len() / rows.max(1)],
            Device::Cpu,
        )?;
        // Rows are whole blocks: llama.cpp's row order is undone on the bytes.
        Ok(Some(crate::checkpoint::StoredWeight {
            kind: info.kind.into(),
            data: unpermute(blocks, *heads, gguf)?,
            scales: None,
        }))
    }
}

/// `t` (rows first) with llama.cpp's order of each head's rows undone when `heads` is given:
/// it stores a head's rows as (half, 2), transformers as (2, half).
fn unpermute(t: Tensor, heads: Option<usize>, gguf: &str) -> Result<Tensor> {
    let Some(heads) = heads else { return Ok(t) };
    let dims: Vec<i64> = t.dims().iter().map(|&d| d as i64).collect();
    let rest = dims[1..].to_vec();
    let heads = heads as i64;
    if heads == 0 || dims[0] % heads != 0 || (dims[0] / heads) % 2 != 0 {
        return Err(Error::Load {
            detail: format!(
                "{gguf}: {} rows do not split into {heads} heads of two rotary halves",
                dims[0]
            ),
        });
    }
    let split: Vec<i64> = [heads, dims[0] / heads / 2, 2].into_iter().chain(rest).collect();
    t.try_reshape(&split)?.try_transpose(1, 2)?.contiguous().try_reshape(&dims)
}
