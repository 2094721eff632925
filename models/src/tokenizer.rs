//! `tokenizer.json`: the tokenizers pretrained models ship (byte-level BPE as in GPT-2,
//! SentencePiece-style BPE with byte fallback as in Llama, WordPiece as in BERT), run by
//! Hugging Face's own Rust implementation, so ids agree with transformers'.

use std::path::Path;

use kiln::{Device, Error, Result, Tensor};

/// A model's tokenizer.
///
/// ```no_run
/// use kiln_models::Tokenizer;
/// let tokenizer = Tokenizer::from_dir("gpt2-folder".as_ref())?;
/// let ids = tokenizer.encode("Hello there", false)?;
/// assert_eq!(tokenizer.decode(&ids, true)?, "Hello there");
/// # Ok::<(), kiln::Error>(())
/// ```
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokenizer({} tokens)", self.vocab_size())
    }
}

/// Where [`Tokenizer::encode_padded`] puts the padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PaddingSide {
    /// After each sequence (for encoders and training).
    Right,
    /// Before each sequence, so that every prompt ends at the last position (for
    /// generation).
    Left,
}

fn failed(op: &'static str, e: impl std::fmt::Display) -> Error {
    Error::Value { op, detail: e.to_string() }
}

impl Tokenizer {
    /// Wraps a tokenizer built elsewhere in the crate (from a GGUF file's metadata).
    pub(crate) fn from_inner(inner: tokenizers::Tokenizer) -> Tokenizer {
        Tokenizer { inner }
    }

    /// Reads a `tokenizer.json`.
    ///
    /// # Errors
    /// [`Error::Io`] naming the file when it cannot be read or parsed.
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| Error::Io {
            op: "Tokenizer::from_file",
            detail: format!("{}: {e}", path.display()),
        })?;
        Ok(Tokenizer { inner })
    }

    /// A character-level tokenizer: character `chars[i]` is token `i`, text is split into
    /// its characters and decoded by joining them (a BPE without merges, which
    /// transformers' `PreTrainedTokenizerFast` reads too). A character outside `chars` is
    /// left out of an encoding.
    ///
    /// ```
    /// use kiln_models::Tokenizer;
    /// let t = Tokenizer::from_characters(&['\n', ' ', 'a', 'b'])?;
    /// assert_eq!(t.encode("ab a\n", false)?, vec![2, 3, 1, 2, 0]);
    /// assert_eq!(t.decode(&[3, 1, 2], false)?, "b a");
    /// # Ok::<(), kiln::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Value`] when a character repeats.
    pub fn from_characters(chars: &[char]) -> Result<Tokenizer> {
        let mut vocab = serde_json::Map::new();
        for (i, c) in chars.iter().enumerate() {
            if vocab.insert(c.to_string(), i.into()).is_some() {
                return Err(failed("Tokenizer::from_characters", format!("{c:?} repeats")));
            }
        }
        let json = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null,
            "decoder": { "type": "Fuse" },
            "model": {
                "type": "BPE", "dropout": null, "unk_token": null,
                "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
                "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": [],
            },
        });
        let inner: tokenizers::Tokenizer =
            json.to_string().parse().map_err(|e| failed("Tokenizer::from_characters", e))?;
        Ok(Tokenizer { inner })
    }

    /// Reads `dir/tokenizer.json`.
    ///
    /// # Errors
    /// As [`Tokenizer::from_file`].
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        Tokenizer::from_file(&dir.join("tokenizer.json"))
    }

    /// Writes `dir/tokenizer.json` (Hugging Face's format, which [`Tokenizer::from_dir`]
    /// and transformers read), for a model folder written by `save_pretrained`.
    ///
    /// # Errors
    /// [`kiln::Error::Io`] when the file cannot be written.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join("tokenizer.json");
        self.inner.save(&path, true).map_err(|e| kiln::Error::Io {
            op: "Tokenizer::save",
            detail: format!("cannot write {}: {e}", path.display()),
        })
    }

    /// The tokenizer truncating every encoding to at most `max_length` ids, special tokens
    /// included (they are kept: BERT's `[CLS] … [SEP]` stays whole), as transformers'
    /// `truncation=True, max_length=…`; `None` truncates nothing.
    ///
    /// # Errors
    /// [`Error::Value`] when `max_length` leaves no room beside the special tokens.
    pub fn with_truncation(mut self, max_length: Option<usize>) -> Result<Tokenizer> {
        let params = match max_length {
            None => None,
            Some(max_length) => {
                let special = self.encode("", true)?.len();
                if max_length <= special {
                    return Err(failed(
                        "Tokenizer::with_truncation",
                        format!(
                            "max_length {max_length} leaves no room for text beside the \
                             {special} special tokens the tokenizer adds"
                        ),
                    ));
                }
                Some(tokenizers::TruncationParams { max_length, ..Default::default() })
            }
        };
        self.inner.with_truncation(params).map_err(|e| failed("Tokenizer::with_truncation", e))?;
        Ok(self)
    }

    /// The tokenizer without the padding its `tokenizer.json` may ask for (some pad every
    /// text to a fixed length): [`Tokenizer::encode_padded`] then pads each batch to its
    /// longest text only.
    #[must_use]
    pub fn without_padding(mut self) -> Tokenizer {
        self.inner.with_padding(None);
        self
    }

    /// Tokens in the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The ids of `text`; `add_special_tokens` adds what the tokenizer's post-processor
    /// adds (a BOS token, BERT's `[CLS]` and `[SEP]`).
    ///
    /// # Errors
    /// [`Error::Value`] with the tokenizer's reason.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<i64>> {
        let encoding =
            self.inner.encode(text, add_special_tokens).map_err(|e| failed("encode", e))?;
        Ok(encoding.get_ids().iter().map(|&id| i64::from(id)).collect())
    }

    /// [`Tokenizer::encode`] of each text.
    ///
    /// # Errors
    /// As [`Tokenizer::encode`].
    pub fn encode_batch(&self, texts: &[&str], add_special_tokens: bool) -> Result<Vec<Vec<i64>>> {
        texts.iter().map(|t| self.encode(t, add_special_tokens)).collect()
    }

    /// The texts encoded and padded with `pad_id` to the longest: ids `[batch, len]` (i64)
    /// and the attention mask `[batch, len]` (bool, `true` on real tokens), on `device`.
    ///
    /// # Errors
    /// As [`Tokenizer::encode`].
    pub fn encode_padded(
        &self,
        texts: &[&str],
        add_special_tokens: bool,
        pad_id: i64,
        side: PaddingSide,
        device: Device,
    ) -> Result<(Tensor, Tensor)> {
        // The real tokens of each text: padding its tokenizer.json asks for is replaced by
        // this batch's own.
        let encoded = texts
            .iter()
            .map(|text| {
                let e = self
                    .inner
                    .encode(*text, add_special_tokens)
                    .map_err(|e| failed("encode_padded", e))?;
                Ok(e.get_ids()
                    .iter()
                    .zip(e.get_attention_mask())
                    .filter(|&(_, &real)| real == 1)
                    .map(|(&id, _)| i64::from(id))
                    .collect::<Vec<i64>>())
            })
            .collect::<Result<Vec<_>>>()?;
        let len = encoded.iter().map(Vec::len).max().unwrap_or(0);
        let (mut ids, mut mask) = (Vec::new(), Vec::new());
        for seq in &encoded {
            let pad = len - seq.len();
            let (before, after) = match side {
                PaddingSide::Left => (pad, 0),
                PaddingSide::Right => (0, pad),
            };
            ids.extend(
                std::iter::repeat_n(pad_id, before)
                    .chain(seq.iter().copied())
                    .chain(std::iter::repeat_n(pad_id, after)),
            );
            mask.extend(
                std::iter::repeat_n(false, before)
                    .chain(std::iter::repeat_n(true, seq.len()))
                    .chain(std::iter::repeat_n(false, after)),
            );
        }
        let shape = [encoded.len(), len];
        Ok((Tensor::from_vec(ids, shape).to(device), Tensor::from_vec(mask, shape).to(device)))
    }

    /// The text of `ids`; `skip_special_tokens` leaves out BOS, EOS, padding and the like.
    ///
    /// # Errors
    /// [`Error::Value`] for an id outside the vocabulary, with the tokenizer's reason.
    pub fn decode(&self, ids: &[i64], skip_special_tokens: bool) -> Result<String> {
        let ids = ids
            .iter()
            .map(|&id| {
                u32::try_from(id).ok().filter(|&id| (id as usize) < self.vocab_size()).ok_or_else(
                    || {
                        failed(
                            "decode",
                            format!(
                                "token {id} is outside the vocabulary of {}",
                                self.vocab_size()
                            ),
                        )
                    },
                )
            })
            .collect::<Result<Vec<u32>>>()?;
        self.inner.decode(&ids, skip_special_tokens).map_err(|e| failed("decode", e))
    }

    /// The id of a token of the vocabulary (`"<|endoftext|>"`, `"</s>"`).
    pub fn token_to_id(&self, token: &str) -> Option<i64> {
        self.inner.token_to_id(token).map(i64::from)
    }

    /// The token of an id.
    pub fn id_to_token(&self, id: i64) -> Option<String> {
        u32::try_from(id).ok().and_then(|id| self.inner.id_to_token(id))
    }
}
