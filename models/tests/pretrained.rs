//! kiln-models against transformers: the fixtures under `tests/fixtures` are tiny random
//! checkpoints that transformers saved, with the logits it computed for them
//! (`make_fixtures.py` writes them). Also: names line up with the files, and broken
//! checkpoints give errors that name what is wrong.

use std::path::{Path, PathBuf};

use kiln::nn::Parameters;
use kiln::prelude::*;
use kiln_models::{Checkpoint, LoadOptions, gpt2::Gpt2, llama::Llama};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// transformers' input ids and logits for a fixture.
fn expected(dir: &Path) -> (Tensor, Tensor) {
    let saved = kiln::serialize::load(dir.join("expected.safetensors"))
        .expect("the fixture's expectations");
    let get = |name: &str| saved.iter().find(|(n, _)| n == name).expect("a saved tensor").1.clone();
    (get("input_ids"), get("logits"))
}

/// Every logit within `rel` of transformers', relative to the larger of its magnitude and 1.
fn assert_logits(got: &Tensor, want: &Tensor, rel: f64, what: &str) {
    assert_eq!(got.dims(), want.dims(), "{what}");
    let (g, w) = (got.to_vec::<f64>(), want.to_vec::<f64>());
    let worst = g.iter().zip(&w).map(|(a, b)| (a - b).abs() / b.abs().max(1.0)).fold(0.0, f64::max);
    assert!(worst <= rel, "{what}: a logit differs by {worst:e} relative (limit {rel:e})");
    // The logits are not all alike: the comparison has something to find.
    let spread = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    assert!(spread > 1.0, "{what}: logits of magnitude {spread}");
}

#[test]
fn gpt2_logits_match_transformers() {
    let dir = fixture("gpt2");
    let model = Gpt2::from_pretrained(&dir, LoadOptions::default()).unwrap();
    let (ids, want) = expected(&dir);
    assert_logits(&model.forward(&ids).unwrap(), &want, 1e-4, "gpt2");
    let last = want.narrow(1, ids.dims()[1] - 1, 1);
    assert_logits(&model.forward_with(&ids, None, 1).unwrap(), &last, 1e-4, "gpt2, the last");
}

#[test]
fn llama_with_grouped_queries_and_llama3_rope_matches_transformers() {
    let dir = fixture("llama");
    let model = Llama::from_pretrained(&dir, LoadOptions::default()).unwrap();
    assert!(model.config().num_key_value_heads < model.config().num_attention_heads);
    let (ids, want) = expected(&dir);
    assert_logits(&model.forward(&ids).unwrap(), &want, 1e-4, "llama");
    // transformers' logits_to_keep: the last positions' logits alone (0 keeps them all).
    let len = ids.dims()[1];
    for keep in [1, 3] {
        let last = want.narrow(1, len - keep, keep);
        assert_logits(&model.forward_with(&ids, None, keep).unwrap(), &last, 1e-4, "kept");
    }
    assert_logits(&model.forward_with(&ids, None, 0).unwrap(), &want, 1e-4, "all kept");
}

#[test]
fn qwen2_with_biases_and_a_tied_head_matches_transformers() {
    let dir = fixture("qwen2");
    let model = Llama::from_pretrained(&dir, LoadOptions::default()).unwrap();
    assert!(model.config().qkv_bias && model.config().tie_word_embeddings);
    let (ids, want) = expected(&dir);
    assert_logits(&model.forward(&ids).unwrap(), &want, 1e-4, "qwen2");
}

#[test]
fn sharded_bf16_checkpoints_load_in_any_float_type() {
    let dir = fixture("llama-bf16-sharded");
    let checkpoint = Checkpoint::open(&dir).unwrap();
    assert!(checkpoint.names().count() > 10);
    let (ids, want) = expected(&dir);
    // Widened to f32 on load: what transformers computes from the same bf16 weights.
    let f32_model = Llama::from_pretrained(&dir, LoadOptions::default()).unwrap();
    assert_logits(&f32_model.forward(&ids).unwrap(), &want, 1e-4, "bf16 weights in f32");
    // Kept in bf16: every op rounds to bf16 (8 bits of mantissa), so within a few percent.
    let options = LoadOptions { dtype: DType::BF16, ..LoadOptions::default() };
    let bf16_model = Llama::from_pretrained(&dir, options).unwrap();
    assert!(bf16_model.parameters().iter().all(|p| p.dtype() == DType::BF16));
    let got = bf16_model.forward(&ids).unwrap().to_dtype(DType::F32);
    let (g, w) = (got.to_vec::<f64>(), want.to_vec::<f64>());
    let scale = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let worst = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(worst <= 0.05 * scale, "bf16: {worst} against logits up to {scale}");
}

/// `named_parameters()` are the checkpoint's names and shapes (GPT-2's Conv1D weights
/// transposed), every one of them.
#[test]
fn parameter_names_and_shapes_are_the_checkpoints() {
    for name in ["gpt2", "llama", "qwen2"] {
        let dir = fixture(name);
        let checkpoint = Checkpoint::open(&dir).unwrap();
        let params = if name == "gpt2" {
            Gpt2::from_pretrained(&dir, LoadOptions::default()).unwrap().named_parameters()
        } else {
            Llama::from_pretrained(&dir, LoadOptions::default()).unwrap().named_parameters()
        };
        let mut names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, checkpoint.names().collect::<Vec<_>>(), "{name}");
        for (n, t) in &params {
            let stored = checkpoint.shape(n).expect("a stored tensor");
            // GPT-2's Conv1D weights are transposed into Linear ones on load.
            let conv1d = name == "gpt2"
                && [".c_attn.weight", ".c_proj.weight", ".c_fc.weight"]
                    .iter()
                    .any(|s| n.ends_with(s));
            let want: Vec<usize> =
                if conv1d { stored.iter().rev().copied().collect() } else { stored.to_vec() };
            assert_eq!(t.dims(), want, "{name}: {n}");
        }
    }
}

/// A scratch copy of a fixture, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn of(name: &str, tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("kiln-models-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch folder");
        for entry in std::fs::read_dir(fixture(name)).expect("the fixture folder") {
            let entry = entry.expect("a fixture file");
            std::fs::copy(entry.path(), dir.join(entry.file_name())).expect("a copy");
        }
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn load_error(dir: &Path) -> String {
    match Llama::from_pretrained(dir, LoadOptions::default()) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_missing_tensor_and_a_lying_config_are_named_with_their_shapes() {
    // The checkpoint without one tensor: every other name still loads, the error names it.
    let scratch = Scratch::of("llama", "missing");
    let path = scratch.0.join("model.safetensors");
    let kept: Vec<(String, Tensor)> = kiln::serialize::load(&path)
        .unwrap()
        .into_iter()
        .filter(|(n, _)| n != "model.layers.1.mlp.up_proj.weight")
        .collect();
    kiln::serialize::save(&path, &kept).unwrap();
    let e = load_error(&scratch.0);
    assert!(
        e.contains("missing: model.layers.1.mlp.up_proj.weight (the model expects [48, 32])"),
        "{e}"
    );

    // A config whose sizes disagree with the weights: both shapes, for every tensor.
    let scratch = Scratch::of("llama", "lying");
    let config = std::fs::read_to_string(scratch.0.join("config.json")).unwrap();
    std::fs::write(
        scratch.0.join("config.json"),
        config.replace("\"intermediate_size\": 48", "\"intermediate_size\": 50"),
    )
    .unwrap();
    let e = load_error(&scratch.0);
    assert!(e.contains("model.layers.0.mlp.gate_proj.weight: the checkpoint holds shape [48, 32], the model (config.json) expects [50, 32]"), "{e}");
    assert!(e.contains("model.layers.1.mlp.down_proj.weight"), "{e}");
}

#[test]
fn broken_files_and_indexes_are_errors_that_name_the_file() {
    // A shard cut short.
    let scratch = Scratch::of("llama-bf16-sharded", "truncated");
    let shard = scratch.0.join("model-00002-of-00003.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 100]).unwrap();
    let e = load_error(&scratch.0);
    assert!(e.contains("model-00002-of-00003.safetensors is not a valid safetensors file"), "{e}");

    // An index naming a file that is not there.
    let scratch = Scratch::of("llama-bf16-sharded", "index");
    std::fs::remove_file(scratch.0.join("model-00003-of-00003.safetensors")).unwrap();
    let e = load_error(&scratch.0);
    assert!(e.contains("cannot map") && e.contains("model-00003-of-00003.safetensors"), "{e}");

    // An index that is not JSON, and one that puts a tensor in the wrong file.
    let scratch = Scratch::of("llama-bf16-sharded", "json");
    let index = scratch.0.join("model.safetensors.index.json");
    std::fs::write(&index, "{\"weight_map\": ").unwrap();
    assert!(load_error(&scratch.0).contains("is not valid JSON"));
    let scratch = Scratch::of("llama-bf16-sharded", "misplaced");
    let index = scratch.0.join("model.safetensors.index.json");
    let text = std::fs::read_to_string(&index).unwrap();
    let moved = text.replacen(
        "\"model.norm.weight\": \"model-0000",
        "\"model.norm.weight\": \"model-9999",
        1,
    );
    assert_ne!(moved, text);
    std::fs::write(&index, moved).unwrap();
    let e = load_error(&scratch.0);
    assert!(e.contains("model-9999"), "{e}");

    // A folder without weights, and a model of another architecture.
    let e = load_error(&std::env::temp_dir());
    assert!(e.contains("config.json"), "{e}");
    let e = load_error(&fixture("gpt2"));
    assert!(e.contains("not a Llama-family model"), "{e}");
    let e =
        Gpt2::from_pretrained(&fixture("llama"), LoadOptions::default()).unwrap_err().to_string();
    assert!(e.contains("not GPT-2"), "{e}");
}
