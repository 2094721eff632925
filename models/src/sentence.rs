//! Sentence embeddings as sentence-transformers computes them: a BERT encoder over a padded
//! batch, its hidden states pooled over the real tokens (mean, `[CLS]`, max, or mean over
//! `√len`), then L2-normalised when the folder's `modules.json` lists a `Normalize` module.
//! A sentence-transformers folder (`all-MiniLM-L6-v2` and its family) loads unchanged.

use std::path::Path;

use kiln::nn::functional as F;
use kiln::{Device, Error, Result, Tensor};
use serde_json::Value;

use crate::bert::Bert;
use crate::checkpoint::LoadOptions;
use crate::tokenizer::{PaddingSide, Tokenizer};

/// How token states become one vector per sentence (sentence-transformers' `Pooling`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over the real tokens (`pooling_mode_mean_tokens`).
    Mean,
    /// The first token's state, `[CLS]` (`pooling_mode_cls_token`).
    Cls,
    /// The element-wise maximum over the real tokens (`pooling_mode_max_tokens`).
    Max,
    /// The sum over the real tokens divided by `√count` (`pooling_mode_mean_sqrt_len_tokens`).
    MeanSqrtLen,
}

/// Pools hidden states `[batch, len, dim]` over the tokens `mask` (`[batch, len]`, bool,
/// `true` on real tokens) marks: `[batch, dim]`.
///
/// # Errors
/// [`Error::Shape`] when the mask is not `[batch, len]` of the states.
pub fn pool(hidden: &Tensor, mask: &Tensor, pooling: Pooling) -> Result<Tensor> {
    let dims = hidden.dims();
    if dims.len() != 3 || mask.dims() != &dims[..2] {
        return Err(Error::Shape {
            op: "pool",
            detail: format!(
                "takes hidden states [batch, len, dim] and a mask [batch, len], got {} and {}",
                hidden.shape(),
                mask.shape()
            ),
        });
    }
    let real = mask.bool().unsqueeze(-1);
    let count = || real.to_dtype(hidden.dtype()).sum_dim(1, false).clamp_min(1e-9);
    let sum = || hidden.masked_fill(&real.logical_not(), 0.0).sum_dim(1, false);
    Ok(match pooling {
        Pooling::Mean => sum() / count(),
        Pooling::MeanSqrtLen => sum() / count().sqrt(),
        Pooling::Cls => hidden.select(1, 0),
        // sentence-transformers fills padding with -1e9 before the maximum.
        Pooling::Max => hidden.masked_fill(&real.logical_not(), -1e9).amax(1, false),
    })
}

/// A BERT sentence encoder with its tokenizer, pooling and normalisation.
///
/// ```no_run
/// use kiln_models::{LoadOptions, SentenceEncoder};
/// let encoder =
///     SentenceEncoder::from_dir("all-MiniLM-L6-v2".as_ref(), LoadOptions::default())?;
/// let embeddings = encoder.encode(&["A fox.", "A graph, compiled."])?; // [2, 384]
/// let similarity = embeddings.narrow(0, 0, 1).matmul(&embeddings.narrow(0, 1, 1).t());
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Debug)]
pub struct SentenceEncoder {
    model: Bert,
    tokenizer: Tokenizer,
    pooling: Pooling,
    normalize: bool,
    pad_id: i64,
}

impl SentenceEncoder {
    /// Loads a sentence-transformers folder (or a plain BERT folder with a `tokenizer.json`):
    /// the model and tokenizer at its root, the pooling from the `Pooling` module's
    /// `config.json`, normalisation when `modules.json` lists `Normalize`, and truncation to
    /// `sentence_bert_config.json`'s `max_seq_length`. Without `modules.json` it pools the
    /// mean and does not normalise, as sentence-transformers does for a plain model.
    ///
    /// # Errors
    /// As [`Bert::from_pretrained`] and [`Tokenizer::from_dir`]; [`Error::Io`] for a
    /// module file that is not the JSON sentence-transformers writes.
    pub fn from_dir(dir: &Path, options: LoadOptions) -> Result<SentenceEncoder> {
        let model = Bert::from_pretrained(dir, options)?;
        let (mut pooling, mut normalize) = (Pooling::Mean, false);
        if let Some(modules) = read_json(&dir.join("modules.json"))? {
            for module in modules.as_array().into_iter().flatten() {
                let kind = module.get("type").and_then(Value::as_str).unwrap_or("");
                let path = module.get("path").and_then(Value::as_str).unwrap_or("");
                if kind.ends_with(".Pooling") {
                    pooling = read_pooling(&dir.join(path).join("config.json"))?;
                } else if kind.ends_with(".Normalize") {
                    normalize = true;
                }
            }
        }
        let max_len = read_json(&dir.join("sentence_bert_config.json"))?
            .and_then(|c| c.get("max_seq_length").and_then(Value::as_u64))
            .map_or(model.config().max_position_embeddings, |n| n as usize)
            .min(model.config().max_position_embeddings);
        let tokenizer =
            Tokenizer::from_dir(dir)?.without_padding().with_truncation(Some(max_len))?;
        let pad_id = tokenizer.token_to_id("[PAD]").unwrap_or(model.config().pad_token_id);
        Ok(SentenceEncoder { model, tokenizer, pooling, normalize, pad_id })
    }

    /// An encoder of `model` and `tokenizer` with the given pooling and normalisation.
    pub fn new(model: Bert, tokenizer: Tokenizer, pooling: Pooling, normalize: bool) -> Self {
        let pad_id = tokenizer.token_to_id("[PAD]").unwrap_or(model.config().pad_token_id);
        SentenceEncoder { model, tokenizer, pooling, normalize, pad_id }
    }

    /// The encoder.
    pub fn model(&self) -> &Bert {
        &self.model
    }

    /// The tokenizer (truncating to the folder's `max_seq_length`).
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The pooling.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Whether embeddings are L2-normalised.
    pub fn normalizes(&self) -> bool {
        self.normalize
    }

    /// The embeddings of `sentences`, `[sentences.len(), hidden]` (f32), in batches of 32.
    ///
    /// # Errors
    /// As [`SentenceEncoder::encode_with`].
    pub fn encode(&self, sentences: &[&str]) -> Result<Tensor> {
        self.encode_with(sentences, 32)
    }

    /// [`SentenceEncoder::encode`] in batches of `batch_size`: as sentence-transformers,
    /// the sentences are sorted by length (in characters) first, so that each batch pads
    /// little, and the embeddings come back in the order given.
    ///
    /// # Errors
    /// [`Error::Value`] for a batch size of 0 or a text the tokenizer refuses; the
    /// model's errors.
    pub fn encode_with(&self, sentences: &[&str], batch_size: usize) -> Result<Tensor> {
        if batch_size == 0 {
            return Err(Error::Value {
                op: "SentenceEncoder::encode",
                detail: "batch_size must be at least 1".into(),
            });
        }
        // By length in characters, as sentence-transformers sorts: near enough to the
        // token count to batch alike lengths, without tokenizing every text twice.
        let mut order: Vec<usize> = (0..sentences.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(sentences[i].chars().count()));
        let mut parts = Vec::new();
        for chunk in order.chunks(batch_size) {
            let texts: Vec<&str> = chunk.iter().map(|&i| sentences[i]).collect();
            let embedded = self.embed_batch(&texts)?;
            embedded.try_realize()?;
            parts.push(embedded);
        }
        let hidden = self.model.config().hidden_size;
        let device = self.model.device();
        if parts.is_empty() {
            return Ok(Tensor::zeros([0, hidden]).to(device));
        }
        let sorted = Tensor::try_cat(&parts.iter().collect::<Vec<_>>(), 0)?;
        // Row `order[j]` of the answer is row `j` of the sorted batches.
        let mut back = vec![0i64; order.len()];
        for (j, &i) in order.iter().enumerate() {
            back[i] = j as i64;
        }
        sorted.try_index_select(0, &Tensor::from_vec(back, [order.len()]).to(device))
    }

    /// One padded batch's embeddings, `[texts.len(), hidden]`.
    fn embed_batch(&self, texts: &[&str]) -> Result<Tensor> {
        let device: Device = self.model.device();
        let (ids, mask) =
            self.tokenizer.encode_padded(texts, true, self.pad_id, PaddingSide::Right, device)?;
        let hidden = self.model.forward(&ids, None, Some(&mask))?.last_hidden_state;
        let pooled = pool(&hidden, &mask, self.pooling)?.to_dtype(kiln::DType::F32);
        Ok(match self.normalize {
            true => F::try_normalize(&pooled, 2.0, 1, 1e-12)?,
            false => pooled,
        })
    }
}

/// `path` parsed, or `None` when there is no such file.
fn read_json(path: &Path) -> Result<Option<Value>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(format!("cannot read {}: {e}", path.display()))),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| io(format!("{} is not valid JSON: {e}", path.display())))
}

/// The pooling a `Pooling` module's `config.json` turns on.
fn read_pooling(path: &Path) -> Result<Pooling> {
    let config = read_json(path)?.ok_or_else(|| {
        io(format!("{} is missing (modules.json lists a Pooling module there)", path.display()))
    })?;
    let on = |key: &str| config.get(key).and_then(Value::as_bool).unwrap_or(false);
    let modes = [
        ("pooling_mode_mean_tokens", Pooling::Mean),
        ("pooling_mode_cls_token", Pooling::Cls),
        ("pooling_mode_max_tokens", Pooling::Max),
        ("pooling_mode_mean_sqrt_len_tokens", Pooling::MeanSqrtLen),
    ];
    let chosen: Vec<Pooling> =
        modes.iter().filter(|(key, _)| on(key)).map(|&(_, mode)| mode).collect();
    match chosen[..] {
        [mode] => Ok(mode),
        _ => Err(io(format!(
            "{}: kiln-models pools with exactly one of {}; this file turns on {}",
            path.display(),
            modes.map(|(key, _)| key).join(", "),
            chosen.len()
        ))),
    }
}

fn io(detail: String) -> Error {
    Error::Io { op: "SentenceEncoder::from_dir", detail }
}
