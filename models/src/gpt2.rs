//! GPT-2 (`GPT2LMHeadModel`): learned positions, pre-norm blocks, the tanh GELU, and the
//! output head tied to the token embedding. Its projections are `Conv1D`s, weights stored
//! `[in, out]` (the transpose of a `Linear`'s): they are transposed on load, so every
//! projection is `x @ wᵀ + b` as a `Linear`'s, whose product reads each weight row in place
//! (a decode step's bf16 dot products). Parameters keep the checkpoint's names; those four
//! weights have the transposed shape `[out, in]`. [`Gpt2::quantize_`] stores them (and, as
//! chosen, the head and the token embedding) quantized, as `Llama::quantize_` does.

use std::path::Path;

use kiln::nn::Parameters;
use kiln::nn::functional as F;
use kiln::{Result, Tensor};

use crate::cache::{KvCache, positions_on};
use crate::checkpoint::{Checkpoint, LoadOptions, Loader, Weights};
use crate::config::{Config, Gpt2Config};
use crate::linear::Linear;
use crate::quantize::{QuantConfig, QuantReport};
use crate::quantized::Quantized;

/// GPT-2 with its language-model head.
///
/// ```no_run
/// use kiln::prelude::*;
/// use kiln_models::{LoadOptions, gpt2::Gpt2};
/// let model = Gpt2::from_pretrained("gpt2-folder".as_ref(), LoadOptions::default())?;
/// let ids = Tensor::from_vec(vec![464i64, 3290, 318], [1, 3]);
/// let logits = model.forward(&ids)?; // [1, 3, 50257]
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Debug)]
pub struct Gpt2 {
    config: Gpt2Config,
    /// `transformer.` in checkpoints saved from `GPT2LMHeadModel`, empty in those of
    /// `GPT2Model` (the original OpenAI upload).
    prefix: String,
    wte: Tensor,
    wpe: Tensor,
    /// `0..n_positions` on the parameters' device (moving data to a device inside a
    /// compiled step would split its plan).
    positions: Tensor,
    blocks: Vec<Block>,
    ln_f: (Tensor, Tensor),
    /// The `config.json` it was loaded from: `save_pretrained` keeps its other keys.
    source: Option<serde_json::Value>,
    /// How the token embedding is stored when [`Gpt2::quantize_`] quantized it (`wte` then
    /// holds its blocks or rows; the tied head reads them too).
    wte_quantized: Option<Quantized>,
    /// The head's quantized copy of `wte` (when the head is quantized and the table not).
    head_quantized: Option<(Tensor, Quantized)>,
}

#[derive(Debug)]
struct Block {
    ln_1: (Tensor, Tensor),
    c_attn: Linear,
    attn_proj: Linear,
    ln_2: (Tensor, Tensor),
    c_fc: Linear,
    mlp_proj: Linear,
}

/// A projection of `weight` (`[out, in]`) and `bias`.
fn projection(weight: Tensor, bias: Tensor) -> Linear {
    Linear { weight, bias: Some(bias), adapter: None, quantized: None }
}

impl Gpt2 {
    /// Loads the model in the Hugging Face folder `dir` (`config.json` and its safetensors
    /// weights).
    ///
    /// # Errors
    /// [`kiln::Error::Io`] for an unreadable folder, config or file, or a config of
    /// another architecture; [`kiln::Error::Load`] listing every missing, unexpected or
    /// mis-shaped tensor.
    pub fn from_pretrained(dir: &Path, options: LoadOptions) -> Result<Gpt2> {
        let (config, source) = crate::config::read_dir(dir)?;
        let config = match config {
            Config::Gpt2(c) => c,
            other => {
                return Err(kiln::Error::Io {
                    op: "from_pretrained",
                    detail: format!(
                        "{}: config.json describes {other:?}, not GPT-2",
                        dir.display()
                    ),
                });
            }
        };
        let checkpoint = Checkpoint::open(dir)?;
        let mut model = Gpt2::load(config, &checkpoint, options)?;
        model.source = Some(source);
        Ok(model)
    }

    /// Writes the model as a Hugging Face folder (`config.json`, `model.safetensors`) that
    /// transformers' `GPT2LMHeadModel.from_pretrained` and [`Gpt2::from_pretrained`] load
    /// unchanged: the `Conv1D` weights transposed back to `[in, out]`, the head tied to the
    /// token embedding (not written), in the parameters' dtype.
    ///
    /// # Errors
    /// [`kiln::Error::Io`] when the folder or a file cannot be written.
    pub fn save_pretrained(&self, dir: &Path) -> Result<()> {
        self.save_pretrained_with(dir, crate::SaveOptions::default())
    }

    /// [`Gpt2::save_pretrained`] with shards of at most `options.max_shard_bytes`.
    ///
    /// # Errors
    /// As [`Gpt2::save_pretrained`].
    pub fn save_pretrained_with(&self, dir: &Path, options: crate::SaveOptions) -> Result<()> {
        if self.quantized_names().next().is_some() {
            let names: Vec<String> = self.quantized_names().collect();
            return Err(kiln::Error::Value {
                op: "Gpt2::save_pretrained",
                detail: format!(
                    "{} are quantized, and GPT-2 checkpoints store projections as Conv1D [in, out], which quantized rows cannot be: save the model before quantize_",
                    names.join(", ")
                ),
            });
        }
        let conv1d =
            ["attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"];
        let tensors: Vec<(String, Tensor)> = self
            .named_parameters()
            .into_iter()
            .map(|(name, t)| match conv1d.iter().any(|c| name.ends_with(c)) {
                true => (name, t.t().contiguous()),
                false => (name, t),
            })
            .collect();
        let config = Config::Gpt2(self.config.clone());
        crate::save::save(
            dir,
            self.source.as_ref(),
            &config,
            &tensors,
            &Default::default(),
            options,
        )
    }

    /// A new model of `config` with transformers' initialisation (embeddings and projections
    /// drawn from `N(0, 0.02²)`, biases at 0, norms at 1; kiln's generator, so
    /// [`kiln::manual_seed`] makes it reproducible), every parameter requiring gradients,
    /// named as `GPT2LMHeadModel`'s: a GPT-2 to train from scratch, or to time without a
    /// checkpoint.
    ///
    /// ```
    /// use kiln_models::config::Gpt2Config;
    /// use kiln_models::{LoadOptions, gpt2::Gpt2};
    /// let config = Gpt2Config { vocab_size: 50, n_positions: 16, n_embd: 32, n_layer: 2, n_head: 4, n_inner: 64, layer_norm_epsilon: 1e-5 };
    /// let model = Gpt2::new(config, LoadOptions::default())?;
    /// let logits = model.forward(&kiln::Tensor::from_vec(vec![1i64, 2, 3], [1, 3]))?;
    /// assert_eq!(logits.dims(), &[1, 3, 50]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    ///
    /// # Errors
    /// When the memory cannot be had.
    pub fn new(config: Gpt2Config, options: LoadOptions) -> Result<Gpt2> {
        let (e, inner) = (config.n_embd, config.n_inner);
        let on = |t: Tensor| t.to_dtype(options.dtype).to(options.device);
        let normal = |shape: [usize; 2]| on(Tensor::randn(shape) * 0.02);
        let norm = || (on(Tensor::ones([e])), on(Tensor::zeros([e])));
        // A projection's weight `[out, in]` (a `Conv1D`'s transposed) and bias.
        let proj =
            |inp: usize, out: usize| projection(normal([out, inp]), on(Tensor::zeros([out])));
        let blocks = (0..config.n_layer)
            .map(|_| Block {
                ln_1: norm(),
                c_attn: proj(e, 3 * e),
                attn_proj: proj(e, e),
                ln_2: norm(),
                c_fc: proj(e, inner),
                mlp_proj: proj(inner, e),
            })
            .collect();
        let mut model = Gpt2 {
            wte: normal([config.vocab_size, e]),
            wpe: normal([config.n_positions, e]),
            positions: positions_on(config.n_positions, options.device)?,
            blocks,
            ln_f: norm(),
            prefix: "transformer.".to_string(),
            config,
            source: None,
            wte_quantized: None,
            head_quantized: None,
        };
        crate::fresh_parameters(&mut model)?;
        Ok(model)
    }

    /// The names of the weights stored quantized.
    fn quantized_names(&self) -> impl Iterator<Item = String> + '_ {
        let p = &self.prefix;
        let blocks = self.blocks.iter().enumerate().flat_map(move |(i, b)| {
            PROJECTIONS
                .iter()
                .zip(b.projections())
                .filter(|(_, l)| l.quantized.is_some())
                .map(move |(name, _)| format!("{p}h.{i}.{name}.weight"))
        });
        let wte = self.wte_quantized.as_ref().map(|_| format!("{p}wte.weight"));
        let head = self.head_quantized.as_ref().map(|_| "lm_head.weight".to_string());
        blocks.chain(wte).chain(head)
    }

    /// Stores the projections' weights (and, as `config` says, the head and the token
    /// embedding) as GGML blocks or per-channel int8 rows, in place, as
    /// `Llama::quantize_` does; the head is tied to the embedding, so a quantized head
    /// reads the quantized table, or a quantized copy of it when the table stays. Returns
    /// what was quantized and what was left, with the reasons. A quantized GPT-2 cannot be
    /// saved (its checkpoints store projections transposed).
    ///
    /// ```
    /// use kiln_models::config::Gpt2Config;
    /// use kiln_models::quantize::QuantConfig;
    /// use kiln_models::{LoadOptions, gpt2::Gpt2};
    /// use kiln_runtime::quant::GgmlType;
    /// let config = Gpt2Config { vocab_size: 50, n_positions: 16, n_embd: 64, n_layer: 2, n_head: 4, n_inner: 128, layer_norm_epsilon: 1e-5 };
    /// let mut model = Gpt2::new(config, LoadOptions::default())?;
    /// let report = model.quantize_(&QuantConfig::new(GgmlType::Q8_0))?;
    /// assert!(report.quantized.contains(&"transformer.h.0.attn.c_attn.weight".to_string()));
    /// let logits = model.forward(&kiln::Tensor::from_vec(vec![1i64, 2, 3], [1, 3]))?;
    /// assert_eq!(logits.dims(), &[1, 3, 50]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    ///
    /// # Errors
    /// A `kind` other than Q8_0, Q4_0, Q4_K and int8.
    pub fn quantize_(&mut self, config: &QuantConfig) -> Result<QuantReport> {
        crate::quantize::check(config)?;
        let mut report = QuantReport::default();
        let p = self.prefix.clone();
        for (i, block) in self.blocks.iter_mut().enumerate() {
            for (name, linear) in PROJECTIONS.iter().zip(block.projections_mut()) {
                crate::quantize::linear(&format!("{p}h.{i}.{name}"), linear, config, &mut report)?;
            }
        }
        let wte = format!("{p}wte.weight");
        if config.embeddings && self.wte_quantized.is_none() {
            match crate::quantize::quantized(&self.wte, config.kind, config.activations)? {
                Ok((stored, q)) => {
                    (self.wte, self.wte_quantized) = (stored, Some(q));
                    self.head_quantized = None;
                    report.quantized.push(wte);
                }
                Err(why) => report.kept.push((wte, why)),
            }
        }
        let head = "lm_head.weight".to_string();
        match (&self.wte_quantized, &self.head_quantized) {
            _ if !config.head => {}
            // The tied head reads the quantized table.
            (Some(_), _) => {}
            (None, Some((_, q))) => report.kept.push((head, format!("already {}", q.kind))),
            (None, None) => {
                match crate::quantize::quantized(&self.wte, config.kind, config.activations)? {
                    Ok(copy) => {
                        self.head_quantized = Some(copy);
                        report.quantized.push(head);
                    }
                    Err(why) => report.kept.push((head, why)),
                }
            }
        }
        Ok(report)
    }

    /// Builds the model of `config` from `checkpoint`'s tensors.
    ///
    /// # Errors
    /// As [`Gpt2::from_pretrained`].
    pub fn load(
        config: Gpt2Config,
        checkpoint: &dyn Weights,
        options: LoadOptions,
    ) -> Result<Gpt2> {
        let prefix =
            if checkpoint.shape("transformer.wte.weight").is_some() { "transformer." } else { "" }
                .to_string();
        let mut l = Loader::new(checkpoint, options);
        let (e, inner) = (config.n_embd, config.n_inner);
        let p = |name: &str| format!("{prefix}{name}");
        let wte = l.take(&p("wte.weight"), &[config.vocab_size, e]);
        let wpe = l.take(&p("wpe.weight"), &[config.n_positions, e]);
        // A norm's (weight, bias), or a Conv1D's (weight transposed to [out, in], bias).
        let norm = |l: &mut Loader<'_>, name: &str| {
            (l.take(&format!("{name}.weight"), &[e]), l.take(&format!("{name}.bias"), &[e]))
        };
        let conv = |l: &mut Loader<'_>, name: &str, inp: usize, out: usize| {
            projection(
                l.take_transposed(&format!("{name}.weight"), [inp, out]),
                l.take(&format!("{name}.bias"), &[out]),
            )
        };
        let blocks = (0..config.n_layer)
            .map(|i| {
                let h = p(&format!("h.{i}"));
                // The causal mask buffers older checkpoints saved.
                l.skip(&format!("{h}.attn.bias"));
                l.skip(&format!("{h}.attn.masked_bias"));
                Block {
                    ln_1: norm(&mut l, &format!("{h}.ln_1")),
                    c_attn: conv(&mut l, &format!("{h}.attn.c_attn"), e, 3 * e),
                    attn_proj: conv(&mut l, &format!("{h}.attn.c_proj"), e, e),
                    ln_2: norm(&mut l, &format!("{h}.ln_2")),
                    c_fc: conv(&mut l, &format!("{h}.mlp.c_fc"), e, inner),
                    mlp_proj: conv(&mut l, &format!("{h}.mlp.c_proj"), inner, e),
                }
            })
            .collect();
        let ln_f = norm(&mut l, &p("ln_f"));
        // The head is the token embedding; a file may still carry a copy of it.
        l.skip("lm_head.weight");
        l.finish()?;
        let positions = positions_on(config.n_positions, options.device)?;
        Ok(Gpt2 {
            config,
            prefix,
            wte,
            wpe,
            positions,
            blocks,
            ln_f,
            source: None,
            wte_quantized: None,
            head_quantized: None,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Gpt2Config {
        &self.config
    }

    /// The device the parameters live on.
    pub fn device(&self) -> kiln::Device {
        self.wte.device()
    }

    /// Next-token logits `[batch, len, vocab]` for token ids `[batch, len]`, every token
    /// attending to those before it.
    ///
    /// # Errors
    /// [`kiln::Error::Shape`] when `ids` is not 2-D or longer than `n_positions`;
    /// [`kiln::Error::Index`] for an id outside the vocabulary.
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.forward_with(ids, None, 0)
    }

    /// A key/value cache for `batch` sequences of up to `max_len` tokens (at most
    /// `n_positions`), in the model's dtype on its device.
    ///
    /// # Errors
    /// When the memory cannot be had.
    pub fn new_cache(&self, batch: usize, max_len: usize) -> Result<KvCache> {
        let c = &self.config;
        let max_len = max_len.min(c.n_positions);
        let shape = [batch, c.n_head, max_len, c.n_embd / c.n_head];
        KvCache::new(c.n_layer, shape, self.wte.dtype(), self.wte.device())
    }

    /// Logits `[batch, len, vocab]` for the tokens `ids` (`[batch, len]`) at `positions`
    /// (an i64 tensor `[len]`), their keys and values written into `cache` and each token
    /// attending to the cache up to its position.
    ///
    /// # Errors
    /// As [`Gpt2::forward`]; a position past the cache's length is an index error.
    pub fn forward_cached(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        cache: &KvCache,
    ) -> Result<Tensor> {
        self.forward_with(ids, Some((cache, positions)), 0)
    }

    /// [`Gpt2::forward`] (`cached` `None`) or [`Gpt2::forward_cached`] (the cache and
    /// the positions), with the logits of the last `logits_to_keep` positions only
    /// (`[batch, logits_to_keep, vocab]`; 0 keeps them all), as transformers'
    /// `logits_to_keep`: a prefill that only samples the next token runs the head on one
    /// row per sequence.
    ///
    /// # Errors
    /// As [`Gpt2::forward_cached`].
    pub fn forward_with(
        &self,
        ids: &Tensor,
        cached: Option<(&KvCache, &Tensor)>,
        logits_to_keep: usize,
    ) -> Result<Tensor> {
        let (batch, len) = match ids.dims() {
            &[b, t] if t <= self.config.n_positions => (b, t),
            _ => {
                return Err(kiln::Error::Shape {
                    op: "Gpt2::forward",
                    detail: format!(
                        "takes token ids [batch, len] with len <= n_positions {}, got {}",
                        self.config.n_positions,
                        ids.shape()
                    ),
                });
            }
        };
        let (e, heads) = (self.config.n_embd, self.config.n_head);
        let (positions, mask) = match cached {
            // Host data moved to the device, as `KvCache::mask`'s key slots.
            None => (self.positions.narrow(0, 0, len), None),
            Some((cache, slots)) => (cache.position_ids(slots)?, Some(cache.mask(slots)?)),
        };
        let tokens = match &self.wte_quantized {
            Some(q) => crate::quantized::embedding(ids, q, &self.wte)?.to_dtype(self.wpe.dtype()),
            None => F::try_embedding(ids, &self.wte)?,
        };
        let mut h = tokens + F::try_embedding(&positions, &self.wpe)?;
        let eps = self.config.layer_norm_epsilon;
        let norm = |x: &Tensor, (w, b): &(Tensor, Tensor)| {
            F::try_layer_norm(x, &[e], Some(w), Some(b), eps)
        };
        let split = |x: Tensor| {
            x.reshape(&[batch as i64, len as i64, heads as i64, (e / heads) as i64]).transpose(1, 2)
        };
        for (i, block) in self.blocks.iter().enumerate() {
            let qkv = block.c_attn.apply(&norm(&h, &block.ln_1)?)?;
            let (q, k, v) = (
                split(qkv.narrow(-1, 0, e)),
                split(qkv.narrow(-1, e, e)),
                split(qkv.narrow(-1, 2 * e, e)),
            );
            let y = match cached {
                None => F::scaled_dot_product_attention(&q, &k, &v, None, true),
                Some((cache, positions)) => {
                    let (k, v) = cache.write(i, positions, &k, &v)?;
                    let options =
                        F::AttentionOptions { attn_mask: mask.as_ref(), ..Default::default() };
                    F::try_scaled_dot_product_attention_with(&q, &k, &v, options)?
                }
            };
            let y = y.transpose(1, 2).reshape(&[batch as i64, len as i64, e as i64]);
            h = h + block.attn_proj.apply(&y)?;
            let m = block.c_fc.apply(&norm(&h, &block.ln_2)?)?.gelu_tanh();
            h = h + block.mlp_proj.apply(&m)?;
        }
        let x = norm(&crate::keep_last(h, logits_to_keep)?, &self.ln_f)?;
        match (&self.head_quantized, &self.wte_quantized) {
            (Some((copy, q)), _) => {
                Ok(crate::quantized::matmul_t(&x, q, copy)?.to_dtype(x.dtype()))
            }
            (None, Some(q)) => {
                Ok(crate::quantized::matmul_t(&x, q, &self.wte)?.to_dtype(x.dtype()))
            }
            (None, None) => x.try_matmul(&self.wte.t()),
        }
    }
}

/// A block's parameter pairs (`.weight`, `.bias`), named as in the checkpoint, in the
/// order of [`Block::pairs`] and [`Block::pairs_mut`].
const BLOCK_PAIRS: [&str; 6] =
    ["ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"];

/// A block's projections, in the order of [`Block::projections`].
const PROJECTIONS: [&str; 4] = ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"];

/// A projection's (weight, bias): GPT-2's always have a bias.
fn pair(l: &Linear) -> (&Tensor, &Tensor) {
    (&l.weight, l.bias.as_ref().expect("a GPT-2 projection has a bias"))
}

fn pair_mut(l: &mut Linear) -> (&mut Tensor, &mut Tensor) {
    (&mut l.weight, l.bias.as_mut().expect("a GPT-2 projection has a bias"))
}

impl Block {
    fn pairs(&self) -> [(&Tensor, &Tensor); 6] {
        [
            (&self.ln_1.0, &self.ln_1.1),
            pair(&self.c_attn),
            pair(&self.attn_proj),
            (&self.ln_2.0, &self.ln_2.1),
            pair(&self.c_fc),
            pair(&self.mlp_proj),
        ]
    }

    fn pairs_mut(&mut self) -> [(&mut Tensor, &mut Tensor); 6] {
        let (ln_1, ln_2) = (&mut self.ln_1, &mut self.ln_2);
        [
            (&mut ln_1.0, &mut ln_1.1),
            pair_mut(&mut self.c_attn),
            pair_mut(&mut self.attn_proj),
            (&mut ln_2.0, &mut ln_2.1),
            pair_mut(&mut self.c_fc),
            pair_mut(&mut self.mlp_proj),
        ]
    }

    fn projections(&self) -> [&Linear; 4] {
        [&self.c_attn, &self.attn_proj, &self.c_fc, &self.mlp_proj]
    }

    fn projections_mut(&mut self) -> [&mut Linear; 4] {
        [&mut self.c_attn, &mut self.attn_proj, &mut self.c_fc, &mut self.mlp_proj]
    }
}

impl Parameters for Gpt2 {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        let p = format!("{prefix}{}", self.prefix);
        f(&format!("{p}wte.weight"), &self.wte);
        f(&format!("{p}wpe.weight"), &self.wpe);
        for (i, block) in self.blocks.iter().enumerate() {
            for (name, (w, b)) in BLOCK_PAIRS.iter().zip(block.pairs()) {
                f(&format!("{p}h.{i}.{name}.weight"), w);
                f(&format!("{p}h.{i}.{name}.bias"), b);
            }
        }
        f(&format!("{p}ln_f.weight"), &self.ln_f.0);
        f(&format!("{p}ln_f.bias"), &self.ln_f.1);
    }

    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
        let p = format!("{prefix}{}", self.prefix);
        f(&format!("{p}wte.weight"), &mut self.wte);
        f(&format!("{p}wpe.weight"), &mut self.wpe);
        for (i, block) in self.blocks.iter_mut().enumerate() {
            for (name, (w, b)) in BLOCK_PAIRS.iter().zip(block.pairs_mut()) {
                f(&format!("{p}h.{i}.{name}.weight"), w);
                f(&format!("{p}h.{i}.{name}.bias"), b);
            }
        }
        f(&format!("{p}ln_f.weight"), &mut self.ln_f.0);
        f(&format!("{p}ln_f.bias"), &mut self.ln_f.1);
    }
}
