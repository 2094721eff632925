//! compressed-tensors' packed int4 checkpoints (llm-compressor's W4A16 scheme), from
//! `fixtures/shakespeare-256-w4a16` (`make_compressed_int4.py`: the 256-wide model's
//! projections as symmetric int4 with a bf16 scale per group of 128): loaded dequantized
//! and kept as Q4_0 blocks, against the logits of the same weights in PyTorch and of
//! transformers with the compressed-tensors package; the schemes and files kiln does not
//! read are errors naming them.

use std::path::{Path, PathBuf};

use kiln::nn::Parameters;
use kiln::{DType, Tensor};
use kiln_models::llama::Llama;
use kiln_models::quantize::QuantKind;
use kiln_models::{GenerateOptions, LoadOptions, generate};
use kiln_runtime::quant::GgmlType;

mod common;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/shakespeare-256-w4a16")
}

/// The largest difference relative to the largest magnitude of `want`.
fn relative(got: &Tensor, want: &Tensor) -> f64 {
    let (g, w) = (got.to_vec::<f64>(), want.to_vec::<f64>());
    let scale = w.iter().fold(0f64, |m, v| m.max(v.abs()));
    g.iter().zip(&w).fold(0f64, |m, (a, b)| m.max((a - b).abs())) / scale
}

fn expected(name: &str) -> Tensor {
    let tensors = kiln::serialize::load(fixture().join("expected.safetensors")).expect("expected");
    tensors.into_iter().find(|(n, _)| n == name).expect("an expected tensor").1
}

#[test]
fn packed_int4_checkpoints_load_dequantized_and_kept_as_q4_0() {
    let ids = expected("ids");
    let (exact, transformers) = (expected("logits_exact"), expected("logits"));
    // Dequantized: every projection's values `q · scale`, exactly.
    let dense = Llama::from_pretrained(&fixture(), LoadOptions::default()).expect("dequantized");
    assert!(dense.named_parameters().iter().all(|(_, t)| t.dtype() == DType::F32));
    let names: Vec<String> = dense.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert!(names.contains(&"model.layers.1.mlp.down_proj.weight".to_string()), "{names:?}");
    let logits = dense.forward(&ids).expect("a prefill");
    assert!(relative(&logits, &exact) < 1e-5, "{:e}", relative(&logits, &exact));
    // transformers rounds each decompressed weight to bf16: its logits are close, not equal.
    assert!(relative(&logits, &transformers) < 1e-2, "{:e}", relative(&logits, &transformers));
    // Kept: the 14 projections as Q4_0 blocks (their groups of 128 are whole blocks, their
    // bf16 scales exact in f16), the same values.
    let keep = LoadOptions { keep_quantized: true, ..LoadOptions::default() };
    let kept = Llama::from_pretrained(&fixture(), keep).expect("kept");
    let blocks = kept.named_parameters().iter().filter(|(_, t)| t.dtype() == DType::U8).count();
    assert_eq!(blocks, 14);
    use kiln_models::lora::LoraModel;
    for (name, linear) in kept.linears() {
        assert_eq!(linear.quantized(), Some(QuantKind::Blocks(GgmlType::Q4_0)), "{name}");
    }
    // A prefill (blocks dequantized) and one row (the blocks read in place).
    let logits = kept.forward(&ids).expect("a prefill");
    assert!(relative(&logits, &exact) < 1e-5, "{:e}", relative(&logits, &exact));
    let one = ids.narrow(1, 0, 1);
    let (a, b) = (kept.forward(&one).expect("one row"), dense.forward(&one).expect("one row"));
    assert!(relative(&a, &b) < 1e-5, "{:e}", relative(&a, &b));
    let prompt = vec![ids.to_vec::<i64>()];
    let options = GenerateOptions { max_new_tokens: 8, ..GenerateOptions::default() };
    let a = generate(&kept, &prompt, &options, |_, _| {}).expect("kept");
    let b = generate(&dense, &prompt, &options, |_, _| {}).expect("dequantized");
    assert_eq!(a.tokens, b.tokens);
}

/// A copy of the fixture under the system's temporary directory, its config changed by
/// `edit`.
fn edited(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-compressed-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    for file in ["model.safetensors", "tokenizer.json"] {
        std::fs::copy(fixture().join(file), dir.join(file)).expect("a copy");
    }
    let text = std::fs::read_to_string(fixture().join("config.json")).expect("the config");
    let mut config: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    edit(&mut config);
    std::fs::write(dir.join("config.json"), config.to_string()).expect("a config");
    dir
}

fn error(dir: &Path) -> String {
    let err = Llama::from_pretrained(dir, LoadOptions::default()).expect_err("refused");
    let _ = std::fs::remove_dir_all(dir);
    err.to_string()
}

#[test]
fn schemes_and_files_it_does_not_read_are_errors_naming_them() {
    let weights = "/quantization_config/config_groups/group_0/weights";
    for (what, key, value) in [
        ("asymmetric", "symmetric", serde_json::json!(false)),
        ("ordered", "actorder", serde_json::json!("group")),
        ("3-bit", "num_bits", serde_json::json!(3)),
    ] {
        let dir = edited(what, |c| c.pointer_mut(weights).expect("weights")[key] = value.clone());
        let m = error(&dir);
        assert!(m.contains("group group_0") && m.contains("4-bit per group"), "{what}: {m}");
    }
    // A packed weight whose parts disagree with each other names it.
    let dir = edited("parts", |_| {});
    let mut tensors = kiln::serialize::load(dir.join("model.safetensors")).expect("the weights");
    for (name, t) in &mut tensors {
        if name == "model.layers.0.mlp.up_proj.weight_shape" {
            *t = Tensor::from_vec(vec![512i64, 264], [2]);
        }
    }
    kiln::serialize::save(dir.join("model.safetensors"), &tensors).expect("written");
    let m = error(&dir);
    assert!(m.contains("model.layers.0.mlp.up_proj.weight") && m.contains("[512, 264]"), "{m}");
}

/// On a CUDA device (the emulated one in CI's `emulator/run-tests`): the packed int4
/// checkpoint kept as Q4_0 blocks on the device gives the CPU's logits and tokens.
#[test]
fn packed_int4_checkpoints_kept_on_cuda_match_the_cpu() {
    let Some(gpu) = common::cuda_or_skip("packed_int4_checkpoints_kept_on_cuda_match_the_cpu")
    else {
        return;
    };
    let keep = LoadOptions { keep_quantized: true, ..LoadOptions::default() };
    let cpu = Llama::from_pretrained(&fixture(), keep).expect("on the CPU");
    let on_gpu = Llama::from_pretrained(&fixture(), LoadOptions { device: gpu, ..keep });
    let on_gpu = on_gpu.expect("on the GPU");
    let blocks = |m: &Llama| {
        m.named_parameters()
            .iter()
            .filter(|(_, t)| t.dtype() == DType::U8 && t.device() == m.device())
            .count()
    };
    assert_eq!((blocks(&on_gpu), on_gpu.device()), (14, gpu));
    let ids = expected("ids");
    let one = ids.narrow(1, 0, 1);
    let prefill = on_gpu.forward(&ids.to(gpu)).expect("a prefill");
    assert!(relative(&prefill, &cpu.forward(&ids).expect("on the CPU")) < 1e-5);
    let row = kiln::with_check(|| on_gpu.forward(&one.to(gpu)).expect("one row").cpu());
    assert!(relative(&row, &cpu.forward(&one).expect("on the CPU")) < 1e-5);
    let prompt = vec![ids.to_vec::<i64>()];
    let options = GenerateOptions { max_new_tokens: 6, ..GenerateOptions::default() };
    let a = generate(&on_gpu, &prompt, &options, |_, _| {}).expect("on the GPU");
    let b = generate(&cpu, &prompt, &options, |_, _| {}).expect("on the CPU");
    assert_eq!(a.tokens, b.tokens);
}
