//! The Llama family (`LlamaForCausalLM`, `Qwen2ForCausalLM`): RMS norms, rotary
//! positions, grouped-query attention, the SwiGLU MLP, a tied or untied head, and the
//! config's bias switches. Parameter names and shapes are the checkpoint's (projections
//! `[out, in]`, applied as `x @ wᵀ`).

use std::path::Path;

use kiln::nn::Parameters;
use kiln::nn::functional as F;
use kiln::{Result, Tensor};

use crate::cache::{KvCache, positions_on};
use crate::checkpoint::{Checkpoint, LoadOptions, Loader, Weights};
use crate::config::{Config, LlamaConfig};
use crate::linear::Linear;
use crate::lora::{LoraConfig, LoraModel};
use crate::quantize::{QuantConfig, QuantReport};
use crate::quantized::Quantized;
use crate::rope;

/// A Llama-family model with its language-model head.
///
/// ```no_run
/// use kiln::prelude::*;
/// use kiln_models::{LoadOptions, llama::Llama};
/// let model = Llama::from_pretrained("tinyllama-folder".as_ref(), LoadOptions::default())?;
/// let logits = model.forward(&Tensor::from_vec(vec![1i64, 450, 4996], [1, 3]))?;
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Debug)]
pub struct Llama {
    config: LlamaConfig,
    embed_tokens: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    /// `None` when tied to `embed_tokens`.
    lm_head: Option<Tensor>,
    /// The block type of a head kept quantized (`lm_head` then holds its blocks).
    lm_head_quantized: Option<Quantized>,
    /// The block type of an embedding table stored quantized ([`Llama::quantize_`]).
    embed_quantized: Option<Quantized>,
    /// `0..max_position_embeddings` (i64) and the rotary inverse frequencies (f32) on the
    /// parameters' device, for the rotary tables of a forward pass without a cache (moving
    /// data to a device inside a compiled step would split its plan).
    positions: Tensor,
    inv_freq: Tensor,
    /// The `config.json` it was loaded from: `save_pretrained` keeps its other keys.
    source: Option<serde_json::Value>,
    /// The LoRA adapters' settings, while the projections have adapters.
    lora: Option<LoraConfig>,
}

#[derive(Debug)]
struct Layer {
    input_layernorm: Tensor,
    /// `q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`, `up_proj`, `down_proj`, in the
    /// order of [`PROJS`].
    projs: [Linear; 7],
    post_attention_layernorm: Tensor,
}

/// Each projection's name under its layer.
const PROJS: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

impl Llama {
    /// Loads the model in the Hugging Face folder `dir`.
    ///
    /// # Errors
    /// [`kiln::Error::Io`] for an unreadable folder, config or file, or a config of
    /// another architecture; [`kiln::Error::Load`] listing every missing, unexpected or
    /// mis-shaped tensor.
    pub fn from_pretrained(dir: &Path, options: LoadOptions) -> Result<Llama> {
        let (config, source) = crate::config::read_dir(dir)?;
        let config = match config {
            Config::Llama(c) => c,
            other => {
                return Err(kiln::Error::Io {
                    op: "from_pretrained",
                    detail: format!(
                        "{}: config.json describes {other:?}, not a Llama-family model",
                        dir.display()
                    ),
                });
            }
        };
        let checkpoint = Checkpoint::open(dir)?;
        let mut model = Llama::load(config, &checkpoint, options)?;
        model.source = Some(source);
        Ok(model)
    }

    /// Writes the model as a Hugging Face folder (`config.json`, `model.safetensors`) that
    /// transformers' `from_pretrained` and [`Llama::from_pretrained`] load unchanged, in the
    /// parameters' dtype. Weights kept quantized ([`Llama::quantize_`], or a GGUF file's
    /// blocks kept) are written as their GGML blocks, which [`Llama::from_pretrained`] with
    /// [`LoadOptions::keep_quantized`] reads back as they were (without it, dequantized);
    /// transformers does not load such a folder.
    ///
    /// # Errors
    /// [`kiln::Error::Io`] when the folder or a file cannot be written.
    pub fn save_pretrained(&self, dir: &Path) -> Result<()> {
        self.save_pretrained_with(dir, crate::SaveOptions::default())
    }

    /// [`Llama::save_pretrained`] with shards of at most `options.max_shard_bytes`.
    ///
    /// # Errors
    /// As [`Llama::save_pretrained`].
    pub fn save_pretrained_with(&self, dir: &Path, options: crate::SaveOptions) -> Result<()> {
        let config = Config::Llama(self.config.clone());
        let mut tensors = self.named_parameters();
        let quantized = self.quantized();
        // Per-channel int8's scales beside their rows, `[out, 1]` as compressed-tensors
        // stores them.
        for (name, q) in &quantized {
            if let Some(scales) = &q.scales {
                let scales = scales.try_reshape(&[-1, 1])?;
                tensors.push((format!("{name}{}", crate::save::SCALE_SUFFIX), scales));
            }
        }
        let kinds = quantized.into_iter().map(|(name, q)| (name, q.kind)).collect();
        crate::save::save(dir, self.source.as_ref(), &config, &tensors, &kinds, options)
    }

    /// The weights kept quantized, by parameter name.
    fn quantized(&self) -> std::collections::BTreeMap<String, &Quantized> {
        let mut kinds = std::collections::BTreeMap::new();
        if let Some(q) = &self.embed_quantized {
            kinds.insert("model.embed_tokens.weight".to_string(), q);
        }
        if let (Some(_), Some(q)) = (&self.lm_head, &self.lm_head_quantized) {
            kinds.insert("lm_head.weight".to_string(), q);
        }
        for (i, layer) in self.layers.iter().enumerate() {
            for (name, proj) in PROJS.iter().zip(&layer.projs) {
                if let Some(q) = &proj.quantized {
                    kinds.insert(format!("model.layers.{i}.{name}.weight"), q);
                }
            }
        }
        kinds
    }

    /// A new model of `config` with transformers' initialisation (projections and
    /// embeddings drawn from `N(0, 0.02²)`, norms at 1; kiln's generator, so
    /// [`kiln::manual_seed`] makes it reproducible), every parameter requiring gradients:
    /// a Llama-architecture model to train from scratch and `save_pretrained`.
    ///
    /// # Errors
    /// When the memory cannot be had.
    pub fn new(config: LlamaConfig, options: LoadOptions) -> Result<Llama> {
        let c = &config;
        let (e, d) = (c.hidden_size, c.head_dim);
        let (q, kv) = (c.num_attention_heads * d, c.num_key_value_heads * d);
        let normal = |shape: &[usize]| {
            (Tensor::randn(shape.to_vec()) * 0.02).to_dtype(options.dtype).to(options.device)
        };
        let ones = |n: usize| Tensor::ones([n]).to_dtype(options.dtype).to(options.device);
        let linear = |out: usize, inp: usize, bias: bool| Linear {
            weight: normal(&[out, inp]),
            bias: bias.then(|| Tensor::zeros([out]).to_dtype(options.dtype).to(options.device)),
            adapter: None,
            quantized: None,
        };
        let layers: Vec<Layer> = (0..c.num_hidden_layers)
            .map(|_| Layer {
                input_layernorm: ones(e),
                projs: [
                    linear(q, e, c.qkv_bias),
                    linear(kv, e, c.qkv_bias),
                    linear(kv, e, c.qkv_bias),
                    linear(e, q, c.o_bias),
                    linear(c.intermediate_size, e, c.mlp_bias),
                    linear(c.intermediate_size, e, c.mlp_bias),
                    linear(e, c.intermediate_size, c.mlp_bias),
                ],
                post_attention_layernorm: ones(e),
            })
            .collect();
        let mut model = Llama {
            embed_tokens: normal(&[c.vocab_size, e]),
            layers,
            norm: ones(e),
            lm_head: (!c.tie_word_embeddings).then(|| normal(&[c.vocab_size, e])),
            lm_head_quantized: None,
            embed_quantized: None,
            positions: positions_on(c.max_position_embeddings, options.device)?,
            inv_freq: inv_freq_on(&config, options.device)?,
            config,
            source: None,
            lora: None,
        };
        crate::fresh_parameters(&mut model)?;
        Ok(model)
    }

    /// Builds the model of `config` from `checkpoint`'s tensors.
    ///
    /// # Errors
    /// As [`Llama::from_pretrained`].
    pub fn load(
        config: LlamaConfig,
        checkpoint: &dyn Weights,
        options: LoadOptions,
    ) -> Result<Llama> {
        let mut l = Loader::new(checkpoint, options);
        let c = &config;
        let (e, d) = (c.hidden_size, c.head_dim);
        let (q, kv) = (c.num_attention_heads * d, c.num_key_value_heads * d);
        // Kept quantized, the table's lookups dequantize the rows they pick (a large
        // vocabulary's table is most of a small model's bytes).
        let (embed_tokens, embed_quantized) =
            l.take_projection("model.embed_tokens.weight", c.vocab_size, e);
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let at = format!("model.layers.{i}");
                // (out, in, bias) of each projection, in the order of PROJS.
                let sizes = [
                    (q, e, c.qkv_bias),
                    (kv, e, c.qkv_bias),
                    (kv, e, c.qkv_bias),
                    (e, q, c.o_bias),
                    (c.intermediate_size, e, c.mlp_bias),
                    (c.intermediate_size, e, c.mlp_bias),
                    (e, c.intermediate_size, c.mlp_bias),
                ];
                l.skip(&format!("{at}.self_attn.rotary_emb.inv_freq"));
                Layer {
                    input_layernorm: l.take(&format!("{at}.input_layernorm.weight"), &[e]),
                    projs: std::array::from_fn(|j| {
                        let (out, inp, bias) = sizes[j];
                        Linear::load(&mut l, &format!("{at}.{}", PROJS[j]), out, inp, bias)
                    }),
                    post_attention_layernorm: l
                        .take(&format!("{at}.post_attention_layernorm.weight"), &[e]),
                }
            })
            .collect();
        let norm = l.take("model.norm.weight", &[e]);
        // A tied model quantized by `quantize_` may have saved a quantized copy of the table
        // as its head, which a model keeping blocks keeps.
        let (lm_head, lm_head_quantized) = if c.tie_word_embeddings {
            match l.take_quantized("lm_head.weight", c.vocab_size, e) {
                Some((head, q)) => (Some(head), Some(q)),
                None => {
                    // Some tied checkpoints still carry the head's copy.
                    l.skip("lm_head.weight");
                    (None, None)
                }
            }
        } else {
            let (head, q) = l.take_projection("lm_head.weight", c.vocab_size, e);
            (Some(head), q)
        };
        l.finish()?;
        let positions = positions_on(config.max_position_embeddings, options.device)?;
        let inv_freq = inv_freq_on(&config, options.device)?;
        Ok(Llama {
            config,
            embed_tokens,
            layers,
            norm,
            lm_head,
            lm_head_quantized,
            embed_quantized,
            positions,
            inv_freq,
            source: None,
            lora: None,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The device the parameters live on.
    pub fn device(&self) -> kiln::Device {
        self.embed_tokens.device()
    }

    /// The dtype the model computes in (its norms'; quantized weights are u8 blocks or i8
    /// rows).
    pub fn dtype(&self) -> kiln::DType {
        self.norm.dtype()
    }

    /// Stores the projections' weights (and, as `config` says, the head and the embedding
    /// table) as GGML blocks or per-channel int8 rows, in place, as torchao's `quantize_`: a
    /// decode step then reads a quarter (Q8_0, int8) or an eighth (Q4_0, Q4_K) of f32's
    /// bytes. Returns what was quantized and what was left, with the reasons. Quantizing
    /// runs on the host (the values are read once); the stored weights stay on the model's
    /// device, where the products read them (on a GPU, CUDA kernels; the integer products
    /// of [`crate::Activations::Int8`] are the CPU's, and a GPU takes f32 inputs instead).
    ///
    /// ```
    /// use kiln_models::config::{LlamaConfig, Rope, RopeScaling};
    /// use kiln_models::quantize::QuantConfig;
    /// use kiln_models::{LoadOptions, llama::Llama};
    /// use kiln_runtime::quant::GgmlType;
    /// let config = LlamaConfig {
    ///     vocab_size: 96, hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2,
    ///     num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16,
    ///     max_position_embeddings: 64, rms_norm_eps: 1e-5,
    ///     rope: Rope { theta: 10000.0, scaling: RopeScaling::None },
    ///     tie_word_embeddings: true, qkv_bias: false, o_bias: false, mlp_bias: false,
    /// };
    /// let mut model = Llama::new(config, LoadOptions::default())?;
    /// let report = model.quantize_(&QuantConfig::new(GgmlType::Q8_0))?;
    /// assert!(report.quantized.contains(&"model.layers.0.self_attn.q_proj.weight".to_string()));
    /// let logits = model.forward(&kiln::Tensor::from_vec(vec![1i64, 2, 3], [1, 3]))?;
    /// assert_eq!(logits.dims(), &[1, 3, model.config().vocab_size]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    ///
    /// # Errors
    /// A `kind` other than Q8_0, Q4_0, Q4_K and int8.
    pub fn quantize_(&mut self, config: &QuantConfig) -> Result<QuantReport> {
        crate::quantize::check(config)?;
        let mut report = QuantReport::default();
        for (name, linear) in self.linears_mut() {
            crate::quantize::linear(&name, linear, config, &mut report)?;
        }
        let embed = "model.embed_tokens.weight".to_string();
        if config.embeddings && self.embed_quantized.is_none() {
            match crate::quantize::quantized(&self.embed_tokens, config.kind, config.activations)? {
                Ok((stored, q)) => {
                    (self.embed_tokens, self.embed_quantized) = (stored, Some(q));
                    report.quantized.push(embed);
                }
                Err(why) => report.kept.push((embed, why)),
            }
        }
        let head = "lm_head.weight".to_string();
        match (&self.lm_head, &self.lm_head_quantized) {
            _ if !config.head => {}
            (Some(_), Some(q)) => report.kept.push((head, format!("already {}", q.kind))),
            // A tied head reads the embeddings' quantized table.
            (None, _) if self.embed_quantized.is_some() => {}
            (table, _) => match crate::quantize::quantized(
                table.as_ref().unwrap_or(&self.embed_tokens),
                config.kind,
                config.activations,
            )? {
                Ok((stored, q)) => {
                    (self.lm_head, self.lm_head_quantized) = (Some(stored), Some(q));
                    report.quantized.push(head);
                }
                Err(why) => report.kept.push((head, why)),
            },
        }
        Ok(report)
    }

    /// Next-token logits `[batch, len, vocab]` for token ids `[batch, len]`, every token
    /// attending to those before it.
    ///
    /// # Errors
    /// [`kiln::Error::Shape`] when `ids` is not 2-D; [`kiln::Error::Index`] for an id
    /// outside the vocabulary.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.forward_with(ids, None, 0)
    }

    /// A key/value cache for `batch` sequences of up to `max_len` tokens, in the model's
    /// dtype on its device, with the rotary tables of its positions.
    ///
    /// # Errors
    /// When the memory cannot be had.
    pub fn new_cache(&self, batch: usize, max_len: usize) -> Result<KvCache> {
        let c = &self.config;
        let (dtype, device) = (self.dtype(), self.device());
        let (cos, sin) = rope::tables(&c.rope, c.head_dim, max_len, dtype, device);
        KvCache::new(
            c.num_hidden_layers,
            [batch, c.num_key_value_heads, max_len, c.head_dim],
            dtype,
            device,
        )?
        .with_rope(cos, sin)
    }

    /// Logits `[batch, len, vocab]` for the tokens `ids` (`[batch, len]`) at `positions`
    /// (an i64 tensor `[len]`), their keys and values written into `cache` and each token
    /// attending to the cache up to its position. Positions are data, so every decode step
    /// records the same program.
    ///
    /// # Errors
    /// As [`Llama::forward`]; a position past the cache's length is an index error.
    pub fn forward_cached(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        cache: &KvCache,
    ) -> Result<Tensor> {
        self.forward_with(ids, Some((cache, positions)), 0)
    }

    /// [`Llama::forward`] (`cached` `None`) or [`Llama::forward_cached`] (the cache and
    /// the positions), with the logits of the last `logits_to_keep` positions only
    /// (`[batch, logits_to_keep, vocab]`; 0 keeps them all), as transformers'
    /// `logits_to_keep`: a prefill that only samples the next token runs the head on one
    /// row per sequence.
    ///
    /// # Errors
    /// As [`Llama::forward_cached`].
    pub fn forward_with(
        &self,
        ids: &Tensor,
        cached: Option<(&KvCache, &Tensor)>,
        logits_to_keep: usize,
    ) -> Result<Tensor> {
        let &[batch, len] = ids.dims() else {
            return Err(kiln::Error::Shape {
                op: "Llama::forward",
                detail: format!("takes token ids [batch, len], got {}", ids.shape()),
            });
        };
        let c = &self.config;
        let (heads, kv_heads, d) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let dtype = self.dtype();
        let ((cos, sin), mask) = match cached {
            None => (
                rope::on_device(&self.positions.try_narrow(0, 0, len)?, &self.inv_freq, dtype)?,
                None,
            ),
            Some((cache, slots)) => {
                (cache.rope_at(&cache.position_ids(slots)?)?, Some(cache.mask(slots)?))
            }
        };
        let (b, t) = (batch as i64, len as i64);
        let split = |x: Tensor, n: usize| x.reshape(&[b, t, n as i64, d as i64]).transpose(1, 2);
        let norm = |x: &Tensor, w: &Tensor| {
            F::try_rms_norm(x, &[c.hidden_size], Some(w), Some(c.rms_norm_eps))
        };
        let mut h = match &self.embed_quantized {
            Some(q) => crate::quantized::embedding(ids, q, &self.embed_tokens)?.to_dtype(dtype),
            None => F::try_embedding(ids, &self.embed_tokens)?,
        };
        for (i, layer) in self.layers.iter().enumerate() {
            let [q_proj, k_proj, v_proj, o_proj, gate, up, down] = &layer.projs;
            let x = norm(&h, &layer.input_layernorm)?;
            let q = rope::apply(&split(q_proj.apply(&x)?, heads), &cos, &sin);
            let k = rope::apply(&split(k_proj.apply(&x)?, kv_heads), &cos, &sin);
            let v = split(v_proj.apply(&x)?, kv_heads);
            // Grouped-query attention: query head h reads key/value head h / (heads /
            // kv_heads), shared by broadcasting.
            let y = match cached {
                None => F::try_scaled_dot_product_attention_with(
                    &q,
                    &k,
                    &v,
                    F::AttentionOptions { is_causal: true, enable_gqa: true, ..Default::default() },
                )?,
                Some((cache, positions)) => {
                    let (k, v) = cache.write(i, positions, &k, &v)?;
                    F::try_scaled_dot_product_attention_with(
                        &q,
                        &k,
                        &v,
                        F::AttentionOptions {
                            attn_mask: mask.as_ref(),
                            enable_gqa: true,
                            ..Default::default()
                        },
                    )?
                }
            };
            let y = y.transpose(1, 2).reshape(&[b, t, (heads * d) as i64]);
            h = h + o_proj.apply(&y)?;
            let x = norm(&h, &layer.post_attention_layernorm)?;
            h = h + down.apply(&(gate.apply(&x)?.silu() * up.apply(&x)?))?;
        }
        let h = norm(&crate::keep_last(h, logits_to_keep)?, &self.norm)?;
        let (head, quantized) = match &self.lm_head {
            Some(head) => (head, &self.lm_head_quantized),
            None => (&self.embed_tokens, &self.embed_quantized),
        };
        match quantized {
            Some(q) => Ok(crate::quantized::matmul_t(&h, q, head)?.to_dtype(h.dtype())),
            None => h.try_matmul(&head.t()),
        }
    }
}

/// The rotary inverse frequencies of `config` (f32) on `device`, computed now.
fn inv_freq_on(config: &LlamaConfig, device: kiln::Device) -> Result<Tensor> {
    let freqs: Vec<f32> =
        rope::inv_freq(&config.rope, config.head_dim).iter().map(|&f| f as f32).collect();
    let inv_freq = Tensor::from_vec(freqs, [config.head_dim / 2]).to(device);
    inv_freq.try_realize()?;
    Ok(inv_freq)
}

impl LoraModel for Llama {
    fn linears(&self) -> Vec<(String, &Linear)> {
        let mut out = Vec::new();
        for (i, layer) in self.layers.iter().enumerate() {
            for (name, proj) in PROJS.iter().zip(&layer.projs) {
                out.push((format!("model.layers.{i}.{name}"), proj));
            }
        }
        out
    }

    fn linears_mut(&mut self) -> Vec<(String, &mut Linear)> {
        let mut out = Vec::new();
        for (i, layer) in self.layers.iter_mut().enumerate() {
            for (name, proj) in PROJS.iter().zip(&mut layer.projs) {
                out.push((format!("model.layers.{i}.{name}"), proj));
            }
        }
        out
    }

    fn lora_config(&self) -> Option<&LoraConfig> {
        self.lora.as_ref()
    }

    fn set_lora_config(&mut self, config: Option<LoraConfig>) {
        self.lora = config;
    }
}

impl Parameters for Llama {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        f(&format!("{prefix}model.embed_tokens.weight"), &self.embed_tokens);
        for (i, layer) in self.layers.iter().enumerate() {
            let at = format!("{prefix}model.layers.{i}");
            f(&format!("{at}.input_layernorm.weight"), &layer.input_layernorm);
            for (name, proj) in PROJS.iter().zip(&layer.projs) {
                f(&format!("{at}.{name}.weight"), &proj.weight);
                if let Some(bias) = &proj.bias {
                    f(&format!("{at}.{name}.bias"), bias);
                }
            }
            f(&format!("{at}.post_attention_layernorm.weight"), &layer.post_attention_layernorm);
        }
        f(&format!("{prefix}model.norm.weight"), &self.norm);
        if let Some(head) = &self.lm_head {
            f(&format!("{prefix}lm_head.weight"), head);
        }
    }

    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
        f(&format!("{prefix}model.embed_tokens.weight"), &mut self.embed_tokens);
        for (i, layer) in self.layers.iter_mut().enumerate() {
            let at = format!("{prefix}model.layers.{i}");
            f(&format!("{at}.input_layernorm.weight"), &mut layer.input_layernorm);
            for (name, proj) in PROJS.iter().zip(&mut layer.projs) {
                f(&format!("{at}.{name}.weight"), &mut proj.weight);
                if let Some(bias) = &mut proj.bias {
                    f(&format!("{at}.{name}.bias"), bias);
                }
            }
            f(
                &format!("{at}.post_attention_layernorm.weight"),
                &mut layer.post_attention_layernorm,
            );
        }
        f(&format!("{prefix}model.norm.weight"), &mut self.norm);
        if let Some(head) = &mut self.lm_head {
            f(&format!("{prefix}lm_head.weight"), head);
        }
    }
}
