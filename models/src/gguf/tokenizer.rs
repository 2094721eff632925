//! A GGUF file's tokenizer (`tokenizer.ggml.*`) as a `tokenizer.json`, built as transformers
//! builds it from the same metadata (`AutoTokenizer.from_pretrained(..., gguf_file=...)`), so
//! ids agree with transformers': SentencePiece-style BPE (`llama`: merges recovered from the
//! token scores, byte fallback) and byte-level BPE (`gpt2`: the file's merges, the split
//! pattern its `tokenizer.ggml.pre` names).

use std::collections::HashMap;

use kiln::{Error, Result};
use serde_json::{Value as Json, json};

use super::{Array, Gguf, Value};
use crate::Tokenizer;

/// llama.cpp's token types that become added tokens: control (special) and user-defined.
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

/// Llama 3's split pattern (and its relatives').
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split pattern.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split pattern of each `tokenizer.ggml.pre` transformers knows for the families kiln
/// runs; any other byte-level vocabulary splits as GPT-2 does.
const SPLITS: &[(&str, &str)] = &[
    ("llama3", LLAMA3_SPLIT),
    ("llama-v3", LLAMA3_SPLIT),
    ("llama-bpe", LLAMA3_SPLIT),
    ("smaug-bpe", LLAMA3_SPLIT),
    ("dbrx", LLAMA3_SPLIT),
    ("qwen2", QWEN2_SPLIT),
    ("deepseek-r1-qwen", QWEN2_SPLIT),
];

fn fail(file: &Gguf, detail: String) -> Error {
    Error::Io { op: "Tokenizer::from_gguf", detail: format!("{}: {detail}", file.path().display()) }
}

/// The metadata a tokenizer is built from.
struct Vocab<'a> {
    tokens: &'a [String],
    types: Option<&'a [i32]>,
    scores: Option<&'a [f32]>,
    merges: Option<&'a [String]>,
}

impl Tokenizer {
    /// The tokenizer a GGUF file describes (`tokenizer.ggml.model` `llama` or `gpt2`), with
    /// its special tokens and whether it adds BOS and EOS, as transformers builds it from the
    /// file.
    ///
    /// ```no_run
    /// use kiln_models::{Tokenizer, gguf::Gguf};
    /// let tokenizer = Tokenizer::from_gguf(&Gguf::open("tinyllama.Q8_0.gguf")?)?;
    /// let ids = tokenizer.encode("Hello", true)?;
    /// # Ok::<(), kiln::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Io`] naming the file: no tokenizer in its metadata, a tokenizer model other
    /// than `llama` and `gpt2`, metadata of the wrong type, or token ids out of range.
    pub fn from_gguf(file: &Gguf) -> Result<Tokenizer> {
        let json = tokenizer_json(file)?;
        let inner: tokenizers::Tokenizer =
            json.to_string().parse().map_err(|e| fail(file, format!("{e}")))?;
        Ok(Tokenizer::from_inner(inner))
    }
}

fn array<'a, T: ?Sized>(
    file: &'a Gguf,
    key: &str,
    get: impl Fn(&'a Array) -> Option<&'a T>,
    kind: &str,
) -> Result<Option<&'a T>> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_array()
            .and_then(get)
            .map(Some)
            .ok_or_else(|| fail(file, format!("{key} is not an array of {kind}"))),
    }
}

fn tokenizer_json(file: &Gguf) -> Result<Json> {
    let model = file.get("tokenizer.ggml.model").and_then(Value::as_str);
    let tokens = array(file, "tokenizer.ggml.tokens", Array::as_strings, "strings")?;
    let (Some(model), Some(tokens)) = (model, tokens) else {
        return Err(fail(
            file,
            "the metadata holds no tokenizer (tokenizer.ggml.model and tokens)".into(),
        ));
    };
    let vocab = Vocab {
        tokens,
        types: array(file, "tokenizer.ggml.token_type", Array::as_i32s, "int32")?,
        scores: array(file, "tokenizer.ggml.scores", Array::as_f32s, "float32")?,
        merges: array(file, "tokenizer.ggml.merges", Array::as_strings, "strings")?,
    };
    let id = |key: &str| -> Result<Option<usize>> {
        let Some(v) = file.get(&format!("tokenizer.ggml.{key}")) else { return Ok(None) };
        match v.as_u64() {
            Some(i) if (i as usize) < tokens.len() => Ok(Some(i as usize)),
            _ => Err(fail(
                file,
                format!("tokenizer.ggml.{key} is {v:?}, not a token id below {}", tokens.len()),
            )),
        }
    };
    let flag = |key: &str, default: bool| match file.get(&format!("tokenizer.ggml.{key}")) {
        Some(Value::Bool(b)) => *b,
        _ => default,
    };
    let (bos, eos) = (id("bos_token_id")?, id("eos_token_id")?);
    let specials: Vec<usize> = [bos, eos, id("unknown_token_id")?, id("padding_token_id")?]
        .into_iter()
        .flatten()
        .collect();
    let spm = match model {
        "llama" => true,
        "gpt2" => false,
        other => {
            return Err(fail(
                file,
                format!(
                    "tokenizer.ggml.model is {other:?}: kiln builds llama (SentencePiece BPE) and gpt2 (byte-level BPE) tokenizers"
                ),
            ));
        }
    };
    // llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise.
    let (add_bos, add_eos) = (flag("add_bos_token", spm), flag("add_eos_token", false));
    let pre = file.get("tokenizer.ggml.pre").and_then(Value::as_str);
    let mut json = if spm { sentencepiece(&vocab) } else { byte_level(&vocab, pre) };
    json["added_tokens"] = added_tokens(&vocab, &specials, !spm);
    json["post_processor"] = template(tokens, bos.filter(|_| add_bos), eos.filter(|_| add_eos));
    Ok(json)
}

/// The post-processor adding BOS and EOS (when given) around each sequence, as transformers
/// writes it for the tokenizers it builds from GGUF.
fn template(tokens: &[String], bos: Option<usize>, eos: Option<usize>) -> Json {
    let special =
        |i: usize, type_id: u32| json!({ "SpecialToken": { "id": tokens[i], "type_id": type_id } });
    let sequence = |s: &str, type_id: u32| json!({ "Sequence": { "id": s, "type_id": type_id } });
    let mut single = Vec::new();
    let mut pair = Vec::new();
    for (part, type_id, out) in [("A", 0, &mut single), ("B", 1, &mut pair)] {
        out.extend(bos.map(|b| special(b, type_id)));
        out.push(sequence(part, type_id));
        out.extend(eos.map(|e| special(e, type_id)));
    }
    let pair: Vec<Json> = single.iter().cloned().chain(pair).collect();
    let mut specials = serde_json::Map::new();
    for i in bos.into_iter().chain(eos) {
        specials.insert(
            tokens[i].clone(),
            json!({ "id": tokens[i], "ids": [i], "tokens": [tokens[i]] }),
        );
    }
    json!({ "type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials })
}

/// The file's vocabulary: token → id (a later duplicate wins, as in a Python dict).
fn vocab_map(tokens: &[String]) -> serde_json::Map<String, Json> {
    tokens.iter().enumerate().map(|(i, t)| (t.clone(), i.into())).collect()
}

fn sentencepiece(vocab: &Vocab<'_>) -> Json {
    let merges = match vocab.merges {
        Some(m) => m.iter().map(|m| split_merge(m)).collect(),
        None => recovered_merges(vocab.tokens, vocab.scores),
    };
    json!({
        "version": "1.0", "truncation": null, "padding": null, "normalizer": null,
        "pre_tokenizer": { "type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false },
        "decoder": { "type": "Sequence", "decoders": [
            { "type": "Replace", "pattern": { "String": "▁" }, "content": " " },
            { "type": "ByteFallback" }, { "type": "Fuse" },
            { "type": "Strip", "content": " ", "start": 1, "stop": 0 },
        ]},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
            "ignore_merges": false, "vocab": vocab_map(vocab.tokens), "merges": merges,
        },
    })
}

fn byte_level(vocab: &Vocab<'_>, pre: Option<&str>) -> Json {
    let spelling = byte_spelling();
    let alphabet: std::collections::HashSet<char> = spelling.iter().copied().collect();
    // A token written outside the byte alphabet is respelled byte by byte.
    let tokens: Vec<String> = vocab
        .tokens
        .iter()
        .map(|t| {
            if t.chars().all(|c| alphabet.contains(&c)) {
                t.clone()
            } else {
                t.bytes().map(|b| spelling[b as usize]).collect()
            }
        })
        .collect();
    let merges: Vec<Json> = vocab.merges.unwrap_or(&[]).iter().map(|m| split_merge(m)).collect();
    let byte_level = |use_regex: bool, prefix: bool| json!({ "type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": true, "use_regex": use_regex });
    let pre_tokenizer = match SPLITS.iter().find(|s| Some(s.0) == pre) {
        Some(&(_, split)) => json!({ "type": "Sequence", "pretokenizers": [
            { "type": "Split", "pattern": { "Regex": split }, "behavior": "Isolated", "invert": false },
            byte_level(false, false),
        ]}),
        None => byte_level(true, false),
    };
    json!({
        "version": "1.0", "truncation": null, "padding": null, "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "decoder": byte_level(true, true),
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab_map(&tokens), "merges": merges,
        },
    })
}

/// `"a b"` as the pair `["a", "b"]` (a merge's parts never hold a space).
fn split_merge(merge: &str) -> Json {
    let (l, r) = merge.split_once(' ').unwrap_or((merge, ""));
    json!([l, r])
}

/// Merges a vocabulary without them implies (transformers' `generate_merges`): every split of
/// a token into two tokens, best score first (ties: shorter left part, then shorter right),
/// the splits of one token in the order of their parts' ids.
fn recovered_merges(tokens: &[String], scores: Option<&[f32]>) -> Vec<Json> {
    let ids: HashMap<&str, usize> =
        tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
    // The score of each distinct token (a later duplicate wins), in first-seen order.
    let mut order: Vec<&str> = Vec::new();
    let mut score: HashMap<&str, f64> = HashMap::new();
    for (i, t) in tokens.iter().enumerate() {
        // Without scores, earlier tokens merge first.
        let s = scores.and_then(|s| s.get(i)).map_or(-(i as f64), |&s| f64::from(s));
        if score.insert(t, s).is_none() {
            order.push(t);
        }
    }
    let mut merges: Vec<(&str, &str, f64)> = Vec::new();
    for merged in order {
        let mut local: Vec<(&str, &str, f64)> = merged
            .char_indices()
            .skip(1)
            .map(|(at, _)| merged.split_at(at))
            .filter(|(l, r)| ids.contains_key(l) && ids.contains_key(r))
            .map(|(l, r)| (l, r, score[merged]))
            .collect();
        local.sort_by_key(|&(l, r, _)| (ids[l], ids[r]));
        merges.extend(local);
    }
    // Python sorts (score, len(l), len(r)) in reverse, stably: best score first, and for
    // equal scores the longer parts first. Lengths count characters.
    let key = |m: &(&str, &str, f64)| (m.0.chars().count(), m.1.chars().count());
    merges.sort_by(|a, b| b.2.total_cmp(&a.2).then_with(|| key(b).cmp(&key(a))));
    merges.into_iter().map(|(l, r, _)| json!([l, r])).collect()
}

/// Control tokens (and the ones the special ids name) as special added tokens,
/// user-defined ones as plain added tokens; in a byte-level vocabulary a control token
/// written outside the byte alphabet is a mislabel and skipped, as transformers does.
fn added_tokens(vocab: &Vocab<'_>, specials: &[usize], byte_level: bool) -> Json {
    let alphabet: std::collections::HashSet<char> = byte_spelling().into_iter().collect();
    let types = vocab.types.unwrap_or(&[]);
    let mut added = Vec::new();
    for (i, t) in vocab.tokens.iter().enumerate() {
        let kind = types.get(i).copied();
        let spelled = !byte_level || t.chars().all(|c| alphabet.contains(&c));
        let special = (kind == Some(CONTROL) && spelled) || specials.contains(&i);
        if special || kind == Some(USER_DEFINED) {
            added.push(json!({
                "id": i, "content": t, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": special,
            }));
        }
    }
    Json::Array(added)
}

/// GPT-2's spelling of each byte as a printable character (`bytes_to_unicode`).
fn byte_spelling() -> Vec<char> {
    let printable =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut next = 256;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).expect("a Latin-1 character")
            } else {
                next += 1;
                char::from_u32(next - 1).expect("a character below 0x144")
            }
        })
        .collect()
}
