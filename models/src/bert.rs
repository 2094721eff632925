//! BERT (`BertModel`): token, position and segment embeddings, post-norm encoder layers
//! attending in both directions (padding hidden by the attention mask), and the optional
//! pooler. The encoder of the MiniLM sentence-transformers family; [`crate::sentence`] adds
//! their pooling and normalisation.

use std::path::Path;

use kiln::nn::Parameters;
use kiln::nn::functional as F;
use kiln::{DType, Result, Tensor};

use crate::checkpoint::{Checkpoint, LoadOptions, Loader};
use crate::config::{BertConfig, Config};

/// BERT's encoder, with its pooler when the checkpoint has one.
///
/// ```no_run
/// use kiln::prelude::*;
/// use kiln_models::{LoadOptions, bert::Bert};
/// let model = Bert::from_pretrained("bert-folder".as_ref(), LoadOptions::default())?;
/// let ids = Tensor::from_vec(vec![101i64, 7592, 102, 101, 2088, 0], [2, 3]);
/// let mask = Tensor::from_vec(vec![true, true, true, true, true, false], [2, 3]);
/// let out = model.forward(&ids, None, Some(&mask))?;
/// assert_eq!(out.last_hidden_state.dims(), &[2, 3, model.config().hidden_size]);
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Debug)]
pub struct Bert {
    config: BertConfig,
    /// `bert.` in checkpoints saved from a task model (`BertForMaskedLM` and friends), empty
    /// in those of `BertModel` (sentence-transformers' folders).
    prefix: String,
    word: Tensor,
    position: Tensor,
    token_type: Tensor,
    embeddings_norm: (Tensor, Tensor),
    layers: Vec<Layer>,
    pooler: Option<(Tensor, Tensor)>,
    /// The `config.json` it was loaded from: `save_pretrained` keeps its other keys.
    source: Option<serde_json::Value>,
}

/// What [`Bert::forward`] returns.
#[derive(Clone, Debug)]
pub struct BertOutput {
    /// The last layer's hidden states, `[batch, len, hidden]`.
    pub last_hidden_state: Tensor,
    /// The pooler's `tanh(dense(h[:, 0]))`, `[batch, hidden]`, when the model has a pooler.
    pub pooler_output: Option<Tensor>,
}

/// One encoder layer's (weight, bias) pairs, in the order of [`LAYER_PAIRS`].
#[derive(Debug)]
struct Layer([(Tensor, Tensor); 8]);

/// A layer's parameter pairs (`.weight`, `.bias`), named as in the checkpoint.
const LAYER_PAIRS: [&str; 8] = [
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "attention.output.LayerNorm",
    "intermediate.dense",
    "output.dense",
    "output.LayerNorm",
];

impl Bert {
    /// Loads the model in the Hugging Face folder `dir` (`config.json` and its safetensors
    /// weights; a sentence-transformers folder keeps them at its root).
    ///
    /// # Errors
    /// [`kiln::Error::Io`] for an unreadable folder, config or file, or a config of
    /// another architecture; [`kiln::Error::Load`] listing every missing, unexpected or
    /// mis-shaped tensor.
    pub fn from_pretrained(dir: &Path, options: LoadOptions) -> Result<Bert> {
        let (config, source) = crate::config::read_dir(dir)?;
        let config = match config {
            Config::Bert(c) => c,
            other => {
                return Err(kiln::Error::Io {
                    op: "from_pretrained",
                    detail: format!("{}: config.json describes {other:?}, not BERT", dir.display()),
                });
            }
        };
        let checkpoint = Checkpoint::open(dir)?;
        let mut model = Bert::load(config, &checkpoint, options)?;
        model.source = Some(source);
        Ok(model)
    }

    /// Writes the model as a Hugging Face folder (`config.json`, `model.safetensors`) that
    /// transformers' `BertModel.from_pretrained` and [`Bert::from_pretrained`] load
    /// unchanged, in the parameters' dtype.
    ///
    /// # Errors
    /// [`kiln::Error::Io`] when the folder or a file cannot be written.
    pub fn save_pretrained(&self, dir: &Path) -> Result<()> {
        self.save_pretrained_with(dir, crate::SaveOptions::default())
    }

    /// [`Bert::save_pretrained`] with shards of at most `options.max_shard_bytes`.
    ///
    /// # Errors
    /// As [`Bert::save_pretrained`].
    pub fn save_pretrained_with(&self, dir: &Path, options: crate::SaveOptions) -> Result<()> {
        let config = Config::Bert(self.config.clone());
        crate::save::save(
            dir,
            self.source.as_ref(),
            &config,
            &self.named_parameters(),
            &Default::default(),
            options,
        )
    }

    /// Builds the model of `config` from `checkpoint`'s tensors.
    ///
    /// # Errors
    /// As [`Bert::from_pretrained`].
    pub fn load(config: BertConfig, checkpoint: &Checkpoint, options: LoadOptions) -> Result<Bert> {
        let prefix = if checkpoint.contains("bert.embeddings.word_embeddings.weight") {
            "bert."
        } else {
            ""
        }
        .to_string();
        let mut l = Loader::new(checkpoint, options);
        let (h, inner) = (config.hidden_size, config.intermediate_size);
        let p = |name: &str| format!("{prefix}{name}");
        let pair = |l: &mut Loader<'_>, name: &str, out: usize, inp: Option<usize>| {
            let weight: Vec<usize> = inp.map_or(vec![out], |i| vec![out, i]);
            (l.take(&format!("{name}.weight"), &weight), l.take(&format!("{name}.bias"), &[out]))
        };
        let word = l.take(&p("embeddings.word_embeddings.weight"), &[config.vocab_size, h]);
        let position = l.take(
            &p("embeddings.position_embeddings.weight"),
            &[config.max_position_embeddings, h],
        );
        let token_type =
            l.take(&p("embeddings.token_type_embeddings.weight"), &[config.type_vocab_size, h]);
        let embeddings_norm = pair(&mut l, &p("embeddings.LayerNorm"), h, None);
        // transformers 4.x saved the position ids buffer.
        l.skip(&p("embeddings.position_ids"));
        let layers = (0..config.num_hidden_layers)
            .map(|i| {
                let n = |name: &str| p(&format!("encoder.layer.{i}.{name}"));
                Layer([
                    pair(&mut l, &n("attention.self.query"), h, Some(h)),
                    pair(&mut l, &n("attention.self.key"), h, Some(h)),
                    pair(&mut l, &n("attention.self.value"), h, Some(h)),
                    pair(&mut l, &n("attention.output.dense"), h, Some(h)),
                    pair(&mut l, &n("attention.output.LayerNorm"), h, None),
                    pair(&mut l, &n("intermediate.dense"), inner, Some(h)),
                    pair(&mut l, &n("output.dense"), h, Some(inner)),
                    pair(&mut l, &n("output.LayerNorm"), h, None),
                ])
            })
            .collect();
        let pooler = checkpoint
            .contains(&p("pooler.dense.weight"))
            .then(|| pair(&mut l, &p("pooler.dense"), h, Some(h)));
        // The heads of task models (masked LM, next sentence, classifiers) are not the
        // encoder's: a `bert.`-prefixed checkpoint may carry them.
        if !prefix.is_empty() {
            let heads: Vec<String> =
                checkpoint.names().filter(|n| !n.starts_with(&prefix)).map(String::from).collect();
            for name in heads {
                l.skip(&name);
            }
        }
        l.finish()?;
        Ok(Bert {
            config,
            prefix,
            word,
            position,
            token_type,
            embeddings_norm,
            layers,
            pooler,
            source: None,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// The device the parameters live on.
    pub fn device(&self) -> kiln::Device {
        self.word.device()
    }

    /// The parameters' dtype.
    pub fn dtype(&self) -> DType {
        self.word.dtype()
    }

    /// Whether the checkpoint had a pooler (`pooler.dense`).
    pub fn has_pooler(&self) -> bool {
        self.pooler.is_some()
    }

    /// The encoder's output for token ids `[batch, len]`: `token_type_ids` (`[batch, len]`,
    /// zeros when `None`) pick the segment embedding, and `attention_mask` (`[batch, len]`,
    /// bool or 0/1 numbers, `true`/1 on real tokens) hides padding from every query, as
    /// transformers' `BertModel`.
    ///
    /// # Errors
    /// [`kiln::Error::Shape`] when `ids` is not 2-D, longer than `max_position_embeddings`,
    /// or the types or mask have another shape; [`kiln::Error::Index`] for an id outside
    /// the vocabulary or a type outside `type_vocab_size`.
    pub fn forward(
        &self,
        ids: &Tensor,
        token_type_ids: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
    ) -> Result<BertOutput> {
        let c = &self.config;
        let (batch, len) = match ids.dims() {
            &[b, t] if t <= c.max_position_embeddings => (b, t),
            _ => {
                return Err(shape(format!(
                    "takes token ids [batch, len] with len <= max_position_embeddings {}, got {}",
                    c.max_position_embeddings,
                    ids.shape()
                )));
            }
        };
        for (name, t) in [("token_type_ids", token_type_ids), ("attention_mask", attention_mask)] {
            if let Some(t) = t
                && t.dims() != ids.dims()
            {
                return Err(shape(format!(
                    "{name} {} should have the token ids' shape {}",
                    t.shape(),
                    ids.shape()
                )));
            }
        }
        let types = match token_type_ids {
            Some(t) => F::try_embedding(t, &self.token_type)?,
            // Segment 0 for every token: one row, broadcast.
            None => self.token_type.narrow(0, 0, 1),
        };
        // Positions 0..len: the table's first rows.
        let positions = self.position.narrow(0, 0, len);
        let x = F::try_embedding(ids, &self.word)? + types + positions;
        let (hidden, heads) = (c.hidden_size, c.num_attention_heads);
        let eps = c.layer_norm_eps;
        let norm = |x: &Tensor, (w, b): &(Tensor, Tensor)| {
            F::try_layer_norm(x, &[hidden], Some(w), Some(b), eps)
        };
        let linear = |x: &Tensor, (w, b): &(Tensor, Tensor)| -> Result<Tensor> {
            Ok(x.try_matmul(&w.t())? + b)
        };
        let split = |x: Tensor| {
            x.reshape(&[batch as i64, len as i64, heads as i64, (hidden / heads) as i64])
                .transpose(1, 2)
        };
        // Keys hidden from every query of their sequence: [batch, 1, 1, len].
        let mask = attention_mask.map(|m| m.bool().unsqueeze(1).unsqueeze(1));
        let options = F::AttentionOptions { attn_mask: mask.as_ref(), ..Default::default() };
        let mut h = norm(&x, &self.embeddings_norm)?;
        for Layer([q, k, v, o, attention_norm, up, down, output_norm]) in &self.layers {
            let (q, k, v) = (split(linear(&h, q)?), split(linear(&h, k)?), split(linear(&h, v)?));
            let y = F::try_scaled_dot_product_attention_with(&q, &k, &v, options)?;
            let y = y.transpose(1, 2).reshape(&[batch as i64, len as i64, hidden as i64]);
            h = norm(&(linear(&y, o)? + &h), attention_norm)?;
            let m = c.hidden_act.apply(&linear(&h, up)?);
            h = norm(&(linear(&m, down)? + &h), output_norm)?;
        }
        let pooler_output = match &self.pooler {
            Some(dense) => Some(linear(&h.try_select(1, 0)?, dense)?.tanh()),
            None => None,
        };
        Ok(BertOutput { last_hidden_state: h, pooler_output })
    }
}

fn shape(detail: String) -> kiln::Error {
    kiln::Error::Shape { op: "Bert::forward", detail }
}

impl Layer {
    fn pairs_mut(&mut self) -> impl Iterator<Item = (&'static str, &mut (Tensor, Tensor))> {
        LAYER_PAIRS.into_iter().zip(self.0.iter_mut())
    }
}

impl Parameters for Bert {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor)) {
        let p = format!("{prefix}{}", self.prefix);
        f(&format!("{p}embeddings.word_embeddings.weight"), &self.word);
        f(&format!("{p}embeddings.position_embeddings.weight"), &self.position);
        f(&format!("{p}embeddings.token_type_embeddings.weight"), &self.token_type);
        f(&format!("{p}embeddings.LayerNorm.weight"), &self.embeddings_norm.0);
        f(&format!("{p}embeddings.LayerNorm.bias"), &self.embeddings_norm.1);
        for (i, layer) in self.layers.iter().enumerate() {
            for (name, (w, b)) in LAYER_PAIRS.iter().zip(&layer.0) {
                f(&format!("{p}encoder.layer.{i}.{name}.weight"), w);
                f(&format!("{p}encoder.layer.{i}.{name}.bias"), b);
            }
        }
        if let Some((w, b)) = &self.pooler {
            f(&format!("{p}pooler.dense.weight"), w);
            f(&format!("{p}pooler.dense.bias"), b);
        }
    }

    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor)) {
        let p = format!("{prefix}{}", self.prefix);
        f(&format!("{p}embeddings.word_embeddings.weight"), &mut self.word);
        f(&format!("{p}embeddings.position_embeddings.weight"), &mut self.position);
        f(&format!("{p}embeddings.token_type_embeddings.weight"), &mut self.token_type);
        f(&format!("{p}embeddings.LayerNorm.weight"), &mut self.embeddings_norm.0);
        f(&format!("{p}embeddings.LayerNorm.bias"), &mut self.embeddings_norm.1);
        for (i, layer) in self.layers.iter_mut().enumerate() {
            for (name, (w, b)) in layer.pairs_mut() {
                f(&format!("{p}encoder.layer.{i}.{name}.weight"), w);
                f(&format!("{p}encoder.layer.{i}.{name}.bias"), b);
            }
        }
        if let Some((w, b)) = &mut self.pooler {
            f(&format!("{p}pooler.dense.weight"), w);
            f(&format!("{p}pooler.dense.bias"), b);
        }
    }
}
