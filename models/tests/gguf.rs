//! GGUF files: every block type kiln reads dequantizes bit for bit as the `gguf` package
//! (llama.cpp's Python reference) does on the fixture it wrote (`make_gguf.py`); metadata of
//! every type reads as written; and a corpus of broken and hostile files (truncated, lying
//! counts, lengths, offsets and sizes, overlapping tensors, unknown types) gives errors that
//! name the call, never a panic.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use kiln::prelude::*;
use kiln_models::gguf::{Array, Gguf, Value};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf").join(name)
}

#[test]
fn every_block_type_dequantizes_bit_for_bit_as_the_gguf_package() {
    let file = Gguf::open(fixture("blocks.gguf")).unwrap();
    let expected = kiln::serialize::load(fixture("blocks.expected.safetensors")).unwrap();
    assert_eq!(file.tensors().len(), expected.len());
    let mut kinds = std::collections::BTreeSet::new();
    for (name, want) in &expected {
        let info = file.info(name).unwrap_or_else(|| panic!("{name} is in the file"));
        kinds.insert(info.kind.name());
        let got = file.tensor(name).unwrap();
        assert_eq!(got.dims(), want.dims(), "{name}: shape");
        assert_eq!(info.shape, want.dims(), "{name}: listed shape");
        let bits = |t: &Tensor| {
            t.to_dtype(DType::F32).to_vec::<f32>().iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        };
        assert_eq!(bits(&got), bits(want), "{name} ({})", info.kind);
        // The values are not all alike: the comparison has something to find.
        let w = want.to_vec::<f32>();
        assert!(w.iter().any(|&v| v != w[0]), "{name}: constant");
        assert_eq!(file.bytes(name).unwrap().len(), info.bytes.len());
    }
    // (Q8_K holds activations for the integer products, not weights: no file stores it and
    // the package does not read it; `quant`'s tests read it.)
    let read: Vec<String> = kiln_runtime::quant::dequantized()
        .filter(|&t| t != kiln_runtime::quant::GgmlType::Q8_K)
        .map(|t| t.name())
        .collect();
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>().len(),
        read.len(),
        "every type kiln reads, tested"
    );
}

#[test]
fn metadata_of_every_type_reads_as_written() {
    let file = Gguf::open(fixture("blocks.gguf")).unwrap();
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), 32);
    let get = |k: &str| file.get(k).unwrap_or_else(|| panic!("{k}")).clone();
    assert_eq!(get("general.architecture").as_str(), Some("llama"));
    assert_eq!(get("test.u8"), Value::U8(200));
    assert_eq!(get("test.i8"), Value::I8(-100));
    assert_eq!(get("test.u16"), Value::U16(60000));
    assert_eq!(get("test.i16"), Value::I16(-30000));
    assert_eq!(get("test.u32"), Value::U32(4_000_000_000));
    assert_eq!(get("test.i32"), Value::I32(-2_000_000_000));
    assert_eq!(get("test.u64"), Value::U64((1 << 63) + 5));
    assert_eq!(get("test.i64"), Value::I64(-(1 << 62)));
    assert_eq!(get("test.f32"), Value::F32(0.1));
    assert_eq!(get("test.f64"), Value::F64(0.1));
    assert_eq!(get("test.bool"), Value::Bool(true));
    assert_eq!(get("test.string").as_str(), Some("añb ✓"));
    let strings = get("test.strings");
    assert_eq!(
        strings.as_array().and_then(Array::as_strings),
        Some(&["a".to_string(), String::new(), "ünï".into()][..])
    );
    assert_eq!(get("test.f32s").as_array().and_then(Array::as_f32s), Some(&[0.5, -1.25, 3.0][..]));
    assert_eq!(get("test.i32s").as_array().and_then(Array::as_i32s), Some(&[1, -2, 3][..]));
    assert_eq!(
        get("test.nested"),
        Value::Array(Array::Array(vec![Array::I32(vec![1, 2]), Array::I32(vec![3])]))
    );
    assert_eq!(get("test.i8").as_u64(), None);
    assert_eq!(get("test.u16").as_u64(), Some(60000));
    assert_eq!(get("test.i16").as_f64(), Some(-30000.0));
}

/// A GGUF file written field by field, to break one field at a time.
#[derive(Clone)]
struct Builder {
    version: u32,
    keys: Vec<Vec<u8>>,
    tensors: Vec<Vec<u8>>,
    /// Overrides of the counts the header claims.
    key_count: Option<u64>,
    tensor_count: Option<u64>,
    data: Vec<u8>,
}

fn string(s: &[u8]) -> Vec<u8> {
    [&(s.len() as u64).to_le_bytes()[..], s].concat()
}

impl Builder {
    fn new() -> Builder {
        Builder {
            version: 3,
            keys: vec![],
            tensors: vec![],
            key_count: None,
            tensor_count: None,
            data: vec![],
        }
    }

    fn key(mut self, key: &str, kind: u32, value: &[u8]) -> Builder {
        self.keys
            .push([string(key.as_bytes()), kind.to_le_bytes().to_vec(), value.to_vec()].concat());
        self
    }

    fn tensor(mut self, name: &str, ne: &[u64], kind: u32, offset: u64) -> Builder {
        let mut t = string(name.as_bytes());
        t.extend((ne.len() as u32).to_le_bytes());
        ne.iter().for_each(|d| t.extend(d.to_le_bytes()));
        t.extend(kind.to_le_bytes());
        t.extend(offset.to_le_bytes());
        self.tensors.push(t);
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(self.version.to_le_bytes());
        b.extend(self.tensor_count.unwrap_or(self.tensors.len() as u64).to_le_bytes());
        b.extend(self.key_count.unwrap_or(self.keys.len() as u64).to_le_bytes());
        self.keys.iter().chain(&self.tensors).for_each(|k| b.extend(k));
        b.resize(b.len().div_ceil(32) * 32, 0);
        b.extend(&self.data);
        b
    }
}

/// Two F32 tensors of 8 values, a string and an array key: a valid file.
fn good() -> Builder {
    let mut b = Builder::new()
        .key("general.architecture", 8, &string(b"llama"))
        .key(
            "a.list",
            9,
            &[&4u32.to_le_bytes()[..], &2u64.to_le_bytes(), &[1, 0, 0, 0, 2, 0, 0, 0]].concat(),
        )
        .tensor("x", &[8], 0, 0)
        .tensor("y", &[4, 2], 0, 32);
    b.data = (0..64).map(|i| (i * 7) as u8).collect();
    b
}

struct Corpus {
    dir: PathBuf,
    files: usize,
}

impl Corpus {
    fn write(&mut self, bytes: &[u8]) -> PathBuf {
        self.files += 1;
        let path = self.dir.join(format!("{}.gguf", self.files));
        std::fs::write(&path, bytes).expect("a corpus file");
        path
    }

    /// Opens `bytes` (and reads every tensor when it opens): nothing may panic; `bad`
    /// files must fail to open with a message naming `Gguf::open` and containing `says`.
    #[track_caller]
    fn check(&mut self, what: &str, bytes: &[u8], bad: bool, says: &str) {
        let path = self.write(bytes);
        let opened = catch_unwind(AssertUnwindSafe(|| {
            let file = Gguf::open(&path)?;
            for t in file.tensors() {
                let _ = file.tensor(&t.name).map(|t| t.to_vec::<f32>());
            }
            Ok::<_, kiln::Error>(())
        }));
        let Ok(opened) = opened else { panic!("{what}: panicked") };
        match (opened, bad) {
            (Ok(()), true) => panic!("{what}: opened"),
            (Err(e), _) => {
                let e = e.to_string();
                assert!(e.starts_with("Gguf::open: ") && e.contains(says), "{what}: {e}");
            }
            (Ok(()), false) => {}
        }
    }
}

#[test]
fn broken_and_hostile_files_are_errors_naming_what_they_claim() {
    let dir = std::env::temp_dir().join(format!("kiln-gguf-corpus-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = Corpus { dir: dir.clone(), files: 0 };
    let good = good();
    let bytes = good.bytes();
    c.check("the good file", &bytes, false, "");
    for cut in 0..bytes.len() {
        c.check(&format!("truncated at {cut}"), &bytes[..cut], true, "");
    }
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..400 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let mut b = bytes.clone();
        let at = (seed % b.len() as u64) as usize;
        b[at] ^= 1 << (seed >> 60 & 7);
        c.check(&format!("flip {i} at {at}"), &b, false, "");
    }
    let with = |f: &dyn Fn(&mut Builder)| {
        let mut b = good.clone();
        f(&mut b);
        b.bytes()
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("bad magic", [b"GGUG", &bytes[4..]].concat(), "not a GGUF file"),
        ("version 1", with(&|b| b.version = 1), "version 1"),
        ("big-endian", with(&|b| b.version = 3u32.swap_bytes()), "big-endian"),
        (
            "2^60 tensors",
            with(&|b| b.tensor_count = Some(1 << 60)),
            "claims 1152921504606846976 tensors",
        ),
        ("u64::MAX keys", with(&|b| b.key_count = Some(u64::MAX)), "metadata entries"),
        (
            "a 2^62-byte key",
            with(&|b| b.keys[0][..8].copy_from_slice(&(1u64 << 62).to_le_bytes())),
            "truncated",
        ),
        (
            "a 2^61-element array",
            with(&|b| b.keys[1][22..30].copy_from_slice(&(1u64 << 61).to_le_bytes())),
            "claims 2305843009213693952 elements",
        ),
        (
            "value type 13",
            with(&|b| b.keys[0][28..32].copy_from_slice(&13u32.to_le_bytes())),
            "value type 13",
        ),
        ("key twice", with(&|b| b.keys.push(b.keys[0].clone())), "appears twice"),
        (
            "tensor twice",
            with(&|b| *b = b.clone().tensor("x", &[8], 0, 64).with_data(96)),
            "appears twice",
        ),
        (
            "tensor type 4",
            with(&|b| *b = b.clone().tensor("z", &[8], 4, 64).with_data(96)),
            "tensor type 4",
        ),
        ("unread type", with(&|b| *b = b.clone().tensor("z", &[256], 16, 64).with_data(160)), ""),
        (
            "no whole blocks",
            with(&|b| *b = b.clone().tensor("z", &[16], 2, 64).with_data(96)),
            "not whole blocks",
        ),
        (
            "0 dimensions",
            with(&|b| *b = b.clone().tensor("z", &[], 0, 64).with_data(96)),
            "0 dimensions",
        ),
        (
            "5 dimensions",
            with(&|b| *b = b.clone().tensor("z", &[1; 5], 0, 64).with_data(96)),
            "5 dimensions",
        ),
        (
            "sizes overflow",
            with(&|b| *b = b.clone().tensor("z", &[1 << 40, 1 << 40], 0, 64).with_data(96)),
            "overflows",
        ),
        ("past the end", with(&|b| *b = b.clone().tensor("z", &[8], 0, 64)), "ends past the file"),
        (
            "offset 2^63",
            with(&|b| *b = b.clone().tensor("z", &[8], 0, 1 << 63).with_data(96)),
            "ends past the file",
        ),
        (
            "unaligned",
            with(&|b| *b = b.clone().tensor("z", &[8], 0, 36).with_data(96)),
            "not a multiple of the alignment 32",
        ),
        (
            "overlapping",
            with(&|b| *b = b.clone().tensor("z", &[16], 0, 0).with_data(96)),
            "overlaps",
        ),
        (
            "alignment 3",
            with(&|b| *b = b.clone().key("general.alignment", 4, &3u32.to_le_bytes())),
            "power of two",
        ),
        ("nested 6 deep", with(&|b| *b = b.clone().key("deep", 9, &nested(6))), "deeper than 4"),
    ];
    let (count, cut) = (cases.len(), bytes.len());
    for (what, bytes, says) in cases {
        let bad = !says.is_empty();
        c.check(what, &bytes, bad, says);
    }
    let bool2 = good.clone().key("b", 7, &[2]).bytes();
    c.check("a bool of 2", &bool2, true, "not 0 or 1");
    let file = good.clone().tensor("z", &[256], 16, 64).with_data(160).bytes();
    let path = c.write(&file);
    let err = Gguf::open(&path).unwrap().tensor("z").unwrap_err().to_string();
    assert!(
        err.starts_with("Gguf::tensor: ") && err.contains("z: IQ2_XXS is not a type kiln reads"),
        "{err}"
    );
    let err = Gguf::open(&path).unwrap().tensor("w").unwrap_err().to_string();
    assert!(err.contains("missing: w"), "{err}");
    // Every case ran: the good file, each truncation, the flips, the cases, two more.
    assert_eq!(c.files, 1 + cut + 400 + count + 2);
    let _ = std::fs::remove_dir_all(dir);
}

/// An array value nested `depth` levels (the innermost empty).
fn nested(depth: usize) -> Vec<u8> {
    let mut v = [&4u32.to_le_bytes()[..], &0u64.to_le_bytes()].concat();
    for _ in 1..depth {
        v = [&9u32.to_le_bytes()[..], &1u64.to_le_bytes(), &v].concat();
    }
    v
}

impl Builder {
    /// The data section grown to `len` bytes.
    fn with_data(mut self, len: usize) -> Builder {
        self.data.resize(len, 1);
        self
    }
}

/// transformers' input ids and logits of a fixture (`llama`, `qwen2`), which llama.cpp's
/// converter turned into the GGUF files.
fn expected_of(fixture: &str) -> (Tensor, Tensor) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(fixture);
    let saved = kiln::serialize::load(dir.join("expected.safetensors")).expect("the expectations");
    let get = |name: &str| saved.iter().find(|(n, _)| n == name).expect("a saved tensor").1.clone();
    (get("input_ids"), get("logits"))
}

/// The largest difference from `want` relative to the larger of its magnitude and 1.
fn worst(got: &Tensor, want: &Tensor) -> f64 {
    assert_eq!(got.dims(), want.dims());
    let (g, w) = (got.to_vec::<f64>(), want.to_vec::<f64>());
    g.iter().zip(&w).map(|(a, b)| (a - b).abs() / b.abs().max(1.0)).fold(0.0, f64::max)
}

#[test]
fn a_llama_converted_by_llama_cpp_matches_transformers() {
    use kiln_models::{LoadOptions, llama::Llama};
    let (ids, want) = expected_of("llama");
    let model = Llama::from_gguf(fixture("llama-f32.gguf"), LoadOptions::default()).unwrap();
    // Grouped-query attention, Llama 3.1's rotary scaling (as llama.cpp's divisors), the
    // query and key rows put back in transformers' order.
    let c = model.config();
    assert!(c.num_key_value_heads < c.num_attention_heads);
    assert!(matches!(c.rope.scaling, kiln_models::config::RopeScaling::Divisors(_)));
    let f32_error = worst(&model.forward(&ids).unwrap(), &want);
    assert!(f32_error < 1e-4, "f32 logits differ by {f32_error:e}");
    // Q8_0 weights (the head, embeddings and projections; llama.cpp keeps ffn_down, whose
    // rows of 48 are not whole blocks, in F16): transformers' logits with the same
    // dequantized weights, which differ from the f32 model's.
    let model = Llama::from_gguf(fixture("llama-q8_0.gguf"), LoadOptions::default()).unwrap();
    let got = model.forward(&ids).unwrap();
    let q8 = kiln::serialize::load(fixture("llama-q8_0.expected.safetensors")).unwrap();
    let q8_error = worst(&got, &q8[0].1);
    assert!(q8_error < 1e-4, "Q8_0 logits differ by {q8_error:e}");
    let quantization = worst(&got, &want);
    assert!(quantization > 1e-2, "Q8_0 logits within {quantization:e} of f32's");
    // The divisors have no config.json form: saving says so instead of writing a model
    // transformers would run with other frequencies.
    let dir = std::env::temp_dir().join(format!("kiln-gguf-save-{}", std::process::id()));
    let err = model.save_pretrained(&dir).unwrap_err().to_string();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(err.starts_with("save_pretrained: ") && err.contains("no config.json form"), "{err}");
}

#[test]
fn a_qwen2_converted_by_llama_cpp_matches_transformers() {
    use kiln_models::{LoadOptions, llama::Llama};
    let (ids, want) = expected_of("qwen2");
    let model = Llama::from_gguf(fixture("qwen2-f32.gguf"), LoadOptions::default()).unwrap();
    // Query, key and value biases, a tied head, one key/value head, rows as transformers'.
    let c = model.config();
    assert!(c.qkv_bias && !c.o_bias && c.tie_word_embeddings && c.num_key_value_heads == 1);
    let error = worst(&model.forward(&ids).unwrap(), &want);
    assert!(error < 1e-4, "qwen2 logits differ by {error:e}");
    // Files that do not describe a model say what is missing.
    for (file, says) in [
        ("blocks.gguf", "the metadata has no llama.embedding_length"),
        ("tokenizer-spm.gguf", "the file has no token_embd.weight"),
        ("tokenizer-bpe.gguf", "general.architecture is \"gpt2\": kiln builds llama and qwen2"),
    ] {
        let err = Llama::from_gguf(fixture(file), LoadOptions::default()).unwrap_err().to_string();
        assert!(err.starts_with("Llama::from_gguf: ") && err.contains(says), "{file}: {err}");
    }
    // A lying layer count or context is refused before anything is made of it.
    let path = std::env::temp_dir().join(format!("kiln-gguf-lying-{}.gguf", std::process::id()));
    for (key, value) in [("llama.block_count", 1u64 << 60), ("llama.context_length", 1 << 40)] {
        let mut b = Builder::new()
            .key("general.architecture", 8, &string(b"llama"))
            .key("llama.embedding_length", 10, &8u64.to_le_bytes())
            .key("llama.attention.head_count", 10, &2u64.to_le_bytes())
            .key("llama.feed_forward_length", 10, &8u64.to_le_bytes())
            .key(key, 10, &value.to_le_bytes())
            .tensor("token_embd.weight", &[8, 4], 0, 0);
        if key != "llama.block_count" {
            b = b.key("llama.block_count", 10, &1u64.to_le_bytes());
        }
        std::fs::write(&path, b.with_data(128).bytes()).unwrap();
        let err = Llama::from_gguf(&path, LoadOptions::default()).unwrap_err().to_string();
        assert!(err.contains("the metadata does not describe this file"), "{key}: {err}");
    }
    let _ = std::fs::remove_file(path);
}

#[test]
fn gguf_tokenizers_give_transformers_ids() {
    use kiln_models::Tokenizer;
    let text = std::fs::read_to_string(fixture("tokenizers.expected.json")).unwrap();
    let expected: serde_json::Value = serde_json::from_str(&text).unwrap();
    let files = expected.as_object().unwrap();
    assert_eq!(files.len(), 2);
    for (name, want) in files {
        let tokenizer = Tokenizer::from_gguf(&Gguf::open(fixture(name)).unwrap()).unwrap();
        assert_eq!(tokenizer.vocab_size() as u64, want["vocab_size"].as_u64().unwrap(), "{name}");
        let ids = |v: &serde_json::Value| -> Vec<i64> {
            v.as_array().unwrap().iter().map(|i| i.as_i64().unwrap()).collect()
        };
        for case in want["cases"].as_array().unwrap() {
            let t = case["text"].as_str().unwrap();
            let with = tokenizer.encode(t, true).unwrap();
            assert_eq!(with, ids(&case["ids"]), "{name}: {t:?} with special tokens");
            assert_eq!(tokenizer.encode(t, false).unwrap(), ids(&case["plain"]), "{name}: {t:?}");
            assert_eq!(
                tokenizer.decode(&with, true).unwrap(),
                case["decoded"].as_str().unwrap(),
                "{name}: {t:?} decoded"
            );
        }
    }
    // A file without a tokenizer says so.
    let err =
        Tokenizer::from_gguf(&Gguf::open(fixture("blocks.gguf")).unwrap()).unwrap_err().to_string();
    assert!(err.starts_with("Tokenizer::from_gguf: ") && err.contains("no tokenizer"), "{err}");
}

#[test]
fn projections_kept_quantized_read_their_blocks_and_match_the_dequantized_model() {
    use kiln_models::{GenerateOptions, LoadOptions, generate, llama::Llama};
    let keep = LoadOptions { keep_quantized: true, ..LoadOptions::default() };
    let quantized = Llama::from_gguf(fixture("llama-q8_0.gguf"), keep).unwrap();
    let dense = Llama::from_gguf(fixture("llama-q8_0.gguf"), LoadOptions::default()).unwrap();
    // The projections, head and embedding table llama.cpp stored as Q8_0 keep their blocks
    // (u8), ffn_down (F16) not.
    let kept: Vec<String> = quantized
        .named_parameters()
        .into_iter()
        .filter(|(_, t)| t.dtype() == DType::U8)
        .map(|(n, _)| n)
        .collect();
    assert_eq!(kept.len(), 2 * 6 + 2, "{kept:?}"); // and the head and the table
    assert!(kept.iter().all(|n| !n.contains("down_proj")), "{kept:?}");
    // A prefill (14 rows: the blocks dequantized for a dense product) gives transformers'
    // logits with the dequantized weights.
    let (ids, _) = expected_of("llama");
    let q8 = kiln::serialize::load(fixture("llama-q8_0.expected.safetensors")).unwrap();
    let error = worst(&quantized.forward(&ids).unwrap(), &q8[0].1);
    assert!(error < 1e-4, "prefill logits differ by {error:e}");
    // One row at a time (the blocks read in place) agrees with the dequantized model.
    let one = ids.narrow(0, 0, 1).narrow(1, 0, 1);
    let error = worst(&quantized.forward(&one).unwrap(), &dense.forward(&one).unwrap());
    assert!(error < 1e-5, "one-row logits differ by {error:e}");
    // Greedy decoding with the cache (one row per step) continues as the dequantized model.
    let prompt: Vec<i64> = ids.narrow(0, 0, 1).to_vec::<i64>();
    let options = GenerateOptions { max_new_tokens: 6, ..GenerateOptions::default() };
    let a = generate(&quantized, std::slice::from_ref(&prompt), &options, |_, _| {}).unwrap();
    let b = generate(&dense, &[prompt], &options, |_, _| {}).unwrap();
    assert_eq!(a.tokens, b.tokens);
    // Blocks save as they are (`quantized_save.rs`), but this file's rotary divisors have no
    // config.json form: refused before anything is written.
    let dir = std::env::temp_dir().join(format!("kiln-gguf-save-q-{}", std::process::id()));
    let err = quantized.save_pretrained(&dir).unwrap_err().to_string();
    assert!(err.contains("rope_freqs.weight"), "{err}");
    assert!(!dir.exists());
}

#[test]
fn adapters_train_over_projections_kept_quantized() {
    use kiln_models::lora::{LoraConfig, LoraModel};
    use kiln_models::{LoadOptions, llama::Llama};
    let keep = LoadOptions { keep_quantized: true, ..LoadOptions::default() };
    let mut models = [
        Llama::from_gguf(fixture("llama-q8_0.gguf"), keep).unwrap(),
        Llama::from_gguf(fixture("llama-q8_0.gguf"), LoadOptions::default()).unwrap(),
    ];
    let ids = Tensor::from_vec(vec![5i64], [1, 1]);
    let grads: Vec<Vec<Vec<f64>>> = models
        .iter_mut()
        .map(|model| {
            kiln::manual_seed(3);
            // (A query adapter gets no gradient from one position: its softmax is 1.)
            model.add_lora(&LoraConfig::new(2, 4.0, &["v_proj", "gate_proj"])).unwrap();
            // B starts at zero: give it values so that gradients reach A through it.
            for (name, p) in model.lora_parameters() {
                if name.contains("lora_B") {
                    kiln::no_grad(|| p.copy_(&(Tensor::ones(p.dims().to_vec()) * 0.1)));
                }
            }
            // One row: the quantized products read their blocks, and backward goes through
            // the dequantized weights.
            let logits = model.forward(&ids).unwrap();
            (&logits * &logits).mean().backward();
            model.lora_parameters().iter().map(|(_, p)| p.grad().unwrap().to_vec::<f64>()).collect()
        })
        .collect();
    // Merging into blocks is refused, and the adapters stay.
    let err = models[0].merge_lora().unwrap_err().to_string();
    assert!(err.starts_with("merge_lora: ") && err.contains("Q8_0 blocks"), "{err}");
    assert!(!models[0].lora_parameters().is_empty());
    for (q, d) in grads[0].iter().zip(&grads[1]) {
        let scale = d.iter().fold(0f64, |m, v| m.max(v.abs()));
        let worst = q.iter().zip(d).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
        assert!(scale > 0.0 && worst <= 1e-4 * scale, "{worst:e} of {scale:e}");
    }
}

#[test]
fn int8_activations_run_integer_products_close_to_the_float_ones() {
    use kiln_models::{Activations, LoadOptions, llama::Llama};
    let keep = LoadOptions { keep_quantized: true, ..LoadOptions::default() };
    let int8 = LoadOptions { activations: Activations::Int8, ..keep };
    let float = Llama::from_gguf(fixture("llama-q8_0.gguf"), keep).unwrap();
    let model = Llama::from_gguf(fixture("llama-q8_0.gguf"), int8).unwrap();
    let one = Tensor::from_vec(vec![5i64], [1, 1]);
    let (logits, profile) = kiln::profile(|| {
        let logits = model.forward(&one).unwrap();
        logits.realize();
        logits
    });
    let ran = |name: &str| profile.events().iter().filter(|e| e.name == name).count();
    // Each layer's six Q8_0 projections (q, k, v, o, gate, up) and the head read quantized
    // activations, quantized once per input: q, k and v share theirs, gate and up theirs.
    let layers = model.config().num_hidden_layers;
    assert_eq!(ran("matmul_q8_0_int8"), 6 * layers + 1, "{:?}", profile.kernels());
    assert_eq!(ran("quantize_q8_0"), 3 * layers + 1);
    assert_eq!(ran("matmul_q8_0"), 0);
    // Each input value is rounded to within half a step of its block's scale (1/254 of the
    // block's largest magnitude; here a block is a whole 32-wide row), and the errors
    // compound over the layers: the logits move by about 2% of their largest magnitude
    // (1.9% measured), where a wrong product would move them by all of it. (The products
    // themselves match the f64 product of both sides' blocks: `quant::int8`'s tests.)
    let (got, want) = (logits.to_vec::<f64>(), float.forward(&one).unwrap().to_vec::<f64>());
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
    let error = got.iter().zip(&want).fold(0f64, |m, (a, b)| m.max((a - b).abs())) / scale;
    assert!(error > 0.0 && error < 4e-2, "int8 activations move the logits by {error:e}");
    // A prefill (more than four rows): integer products of the same activation blocks
    // where the CPU has AVX512-VNNI (moving the logits as one row's did), else the dense
    // product of the dequantized weights, as with float activations.
    let ids = Tensor::from_vec((0..9).collect::<Vec<i64>>(), [1, 9]);
    let (logits, profile) = kiln::profile(|| {
        let logits = model.forward(&ids).unwrap();
        logits.realize();
        logits
    });
    let (got, want) = (logits.to_vec::<f64>(), float.forward(&ids).unwrap().to_vec::<f64>());
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
    let error = got.iter().zip(&want).fold(0f64, |m, (a, b)| m.max((a - b).abs())) / scale;
    let packed = profile.events().iter().filter(|e| e.name == "matmul_packed_int8").count();
    if kiln_runtime::quant::gemm_available() {
        // The six projections of each layer and the head (over every row here).
        assert_eq!(packed, 6 * layers + 1, "{:?}", profile.kernels());
        assert!(error > 0.0 && error < 4e-2, "int8 activations move the prefill by {error:e}");
    } else {
        assert_eq!(packed, 0);
        assert!(error < 1e-6, "{error:e}");
    }
}
