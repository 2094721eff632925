//! `save_pretrained`: every fixture written back as a Hugging Face folder loads again with
//! the same names, shapes, dtype, config and logits (bit for bit), whole or in shards.
//! `make_fixtures.py --check-saved` has transformers load folders written this way.

use std::path::{Path, PathBuf};

use kiln::prelude::*;
use kiln_models::{
    Checkpoint, Config, LoadOptions, SaveOptions, Tokenizer, gpt2::Gpt2, llama::Llama,
};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// A fresh folder under the system's temporary directory.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-save-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The checkpoint's tensors: name, shape, dtype.
fn layout(dir: &Path) -> Vec<(String, Vec<usize>, DType)> {
    let c = Checkpoint::open(dir).expect("a written checkpoint");
    let mut out: Vec<_> = c
        .names()
        .map(|n| {
            let shape = c.shape(n).expect("a listed tensor").to_vec();
            (n.to_string(), shape, c.tensor(n).expect("a listed tensor").dtype())
        })
        .collect();
    out.sort();
    out
}

fn ids() -> Tensor {
    Tensor::from_vec(vec![1i64, 5, 9, 2, 7, 3, 11, 4], [2, 4])
}

#[test]
fn saved_models_load_again_unchanged() {
    for name in ["gpt2", "llama", "qwen2", "llama-bf16-sharded"] {
        let (src, dst) = (fixture(name), scratch(name));
        let keep = LoadOptions {
            dtype: if name.contains("bf16") { DType::BF16 } else { DType::F32 },
            ..LoadOptions::default()
        };
        let (want, got) = if name == "gpt2" {
            let model = Gpt2::from_pretrained(&src, keep).unwrap();
            model.save_pretrained(&dst).unwrap();
            let again = Gpt2::from_pretrained(&dst, keep).unwrap();
            (model.forward(&ids()).unwrap(), again.forward(&ids()).unwrap())
        } else {
            let model = Llama::from_pretrained(&src, keep).unwrap();
            model.save_pretrained(&dst).unwrap();
            let again = Llama::from_pretrained(&dst, keep).unwrap();
            (model.forward(&ids()).unwrap(), again.forward(&ids()).unwrap())
        };
        assert_eq!(got.float().to_vec::<f32>(), want.float().to_vec::<f32>(), "{name}");
        assert_eq!(layout(&dst), layout(&src), "{name}: names, shapes and dtypes");
        assert_eq!(Config::from_dir(&dst).unwrap(), Config::from_dir(&src).unwrap(), "{name}");
        // The other keys of the config the model came from are kept.
        let text = std::fs::read_to_string(dst.join("config.json")).unwrap();
        assert!(text.contains("\"eos_token_id\""), "{name}: {text}");
        std::fs::remove_dir_all(&dst).unwrap();
    }
}

#[test]
fn large_models_are_written_in_shards_with_an_index() {
    let model = Llama::from_pretrained(&fixture("llama"), LoadOptions::default()).unwrap();
    let dst = scratch("shards");
    model.save_pretrained_with(&dst, SaveOptions { max_shard_bytes: 40_000 }).unwrap();
    let shards: Vec<String> = std::fs::read_dir(&dst)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    assert!(shards.len() > 1, "{shards:?}");
    assert!(shards.iter().all(|n| n.starts_with("model-0000") && n.contains("-of-0000")));
    let index = std::fs::read_to_string(dst.join("model.safetensors.index.json")).unwrap();
    assert!(index.contains("\"total_size\"") && index.contains("\"weight_map\""), "{index}");
    let again = Llama::from_pretrained(&dst, LoadOptions::default()).unwrap();
    assert_eq!(
        again.forward(&ids()).unwrap().to_vec::<f32>(),
        model.forward(&ids()).unwrap().to_vec::<f32>()
    );
    std::fs::remove_dir_all(&dst).unwrap();
}

#[test]
fn a_converted_model_names_its_dtype_and_its_tokenizer_comes_along() {
    let src = fixture("llama");
    let bf16 = LoadOptions { dtype: DType::BF16, ..LoadOptions::default() };
    let model = Llama::from_pretrained(&src, bf16).unwrap();
    let dst = scratch("bf16");
    model.save_pretrained(&dst).unwrap();
    Tokenizer::from_dir(&src).unwrap().save(&dst).unwrap();
    let text = std::fs::read_to_string(dst.join("config.json")).unwrap();
    assert!(text.contains("\"dtype\": \"bfloat16\""), "{text}");
    assert!(layout(&dst).iter().all(|(_, _, d)| *d == DType::BF16));
    let (a, b) = (Tokenizer::from_dir(&src).unwrap(), Tokenizer::from_dir(&dst).unwrap());
    assert_eq!(a.encode("hello there", true).unwrap(), b.encode("hello there", true).unwrap());
    std::fs::remove_dir_all(&dst).unwrap();
}

/// `Gpt2::new` (random, transformers' initialisation) has the fixture's tensor names, shapes
/// and dtypes once saved, and loads back with the same logits.
#[test]
fn a_new_gpt2_has_the_checkpoint_layout_and_loads_back() {
    let config = match Config::from_dir(&fixture("gpt2")).expect("the fixture's config") {
        Config::Gpt2(c) => c,
        other => panic!("a GPT-2 config, got {other:?}"),
    };
    kiln::manual_seed(5);
    let model = Gpt2::new(config, LoadOptions::default()).expect("a new model");
    let dir = scratch("new-gpt2");
    model.save_pretrained(&dir).expect("saved");
    assert_eq!(layout(&dir), layout(&fixture("gpt2")));
    let loaded = Gpt2::from_pretrained(&dir, LoadOptions::default()).expect("loads");
    let (a, b) = (model.forward(&ids()).expect("logits"), loaded.forward(&ids()).expect("logits"));
    assert_eq!(a.to_vec::<f32>(), b.to_vec::<f32>());
    let std = |t: &Tensor| t.to_vec::<f64>().iter().map(|v| v * v).sum::<f64>() / t.numel() as f64;
    let wte = &model.named_parameters()[0];
    assert!((std(&wte.1).sqrt() - 0.02).abs() < 0.002, "{}: {}", wte.0, std(&wte.1).sqrt());
    std::fs::remove_dir_all(dir).expect("cleaned up");
}
