//! Quantized models written by `save_pretrained` (weights as GGML blocks, their types in each
//! file's metadata) and read back by `from_pretrained`: as they were with `keep_quantized`,
//! dequantized without it; files whose metadata lies are errors naming the tensor.

use std::path::{Path, PathBuf};

use kiln::nn::Parameters;
use kiln::{DType, Tensor};
use kiln_models::llama::Llama;
use kiln_models::quantize::{QuantConfig, QuantKind};
use kiln_models::{Activations, LoadOptions, SaveOptions};
use kiln_runtime::quant::GgmlType;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// A fresh folder under the system's temporary directory.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-qsave-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The folder's `config.json`.
fn config_json(dir: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(dir.join("config.json")).expect("a written config");
    serde_json::from_str(&text).expect("valid JSON")
}

fn load(dir: &Path, keep_quantized: bool) -> Llama {
    let options =
        LoadOptions { keep_quantized, activations: Activations::Int8, ..LoadOptions::default() };
    Llama::from_pretrained(dir, options).expect("a saved folder")
}

fn ids() -> Tensor {
    Tensor::from_vec(vec![3i64, 17, 5, 60, 2, 9], [1, 6])
}

/// Every parameter of `a` and `b`: the same names, dtypes and values.
fn same_parameters(a: &Llama, b: &Llama) {
    let (a, b) = (a.named_parameters(), b.named_parameters());
    let names = |p: &[(String, Tensor)]| p.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&a), names(&b));
    for ((name, x), (_, y)) in a.iter().zip(&b) {
        assert_eq!(x.dtype(), y.dtype(), "{name}");
        assert_eq!(x.dims(), y.dims(), "{name}");
        assert_eq!(x.to_vec::<f64>(), y.to_vec::<f64>(), "{name}");
    }
}

/// A model's logits for a prefill and for one row (the blocks read in place).
fn logits(model: &Llama) -> (Vec<f32>, Vec<f32>) {
    let ids = ids();
    let prefill = model.forward(&ids).expect("a forward");
    let one = model.forward(&ids.narrow(1, 0, 1)).expect("a forward");
    (prefill.to_vec::<f32>(), one.to_vec::<f32>())
}

#[test]
fn a_quantized_model_loads_back_as_it_was_saved() {
    let mut model = load(&fixture("shakespeare-256"), false);
    let config = QuantConfig {
        embeddings: true,
        activations: Activations::Int8,
        ..QuantConfig::new(GgmlType::Q4_K)
    };
    let report = model.quantize_(&config).expect("quantize_");
    assert_eq!(report.quantized.len(), 2 * 7 + 2, "{report:?}");
    let dir = scratch("q4_k");
    model.save_pretrained(&dir).expect("save_pretrained");
    let json = config_json(&dir);
    assert_eq!(json["quantization_config"]["format"], "kiln");
    // No quant_method: transformers refuses the folder rather than load blocks as weights.
    assert_eq!(json["quantization_config"]["quant_method"], serde_json::Value::Null);
    assert_eq!(json["quantization_config"]["types"], serde_json::json!(["Q4_K"]));
    assert_eq!(json["torch_dtype"], serde_json::Value::Null);

    // Kept: the same blocks, the same types, the same logits bit for bit.
    let kept = load(&dir, true);
    same_parameters(&model, &kept);
    let quantized: Vec<String> = kept
        .named_parameters()
        .into_iter()
        .filter(|(_, t)| t.dtype() == DType::U8)
        .map(|(n, _)| n)
        .collect();
    assert_eq!(quantized.len(), report.quantized.len());
    assert_eq!(kept.dtype(), DType::F32);
    let want = logits(&model);
    assert_eq!(logits(&kept), want);

    // In shards: the same.
    let sharded = scratch("q4_k-sharded");
    model.save_pretrained_with(&sharded, SaveOptions { max_shard_bytes: 100_000 }).unwrap();
    assert!(sharded.join("model.safetensors.index.json").exists());
    same_parameters(&model, &load(&sharded, true));

    // Dequantized: floats of the blocks' values, so a prefill (which dequantizes the blocks
    // for a dense product) computes the same logits.
    let floats = load(&dir, false);
    assert!(floats.named_parameters().iter().all(|(_, t)| t.dtype() == DType::F32));
    assert_eq!(logits(&floats).0, want.0);
    for dir in [dir, sharded] {
        std::fs::remove_dir_all(dir).unwrap();
    }
}

#[test]
fn per_channel_int8_saves_its_rows_and_scales_and_loads_back() {
    let mut model = load(&fixture("shakespeare-256"), false);
    let config = QuantConfig {
        embeddings: true,
        activations: Activations::Int8,
        ..QuantConfig::new(QuantKind::Int8)
    };
    let report = model.quantize_(&config).expect("quantize_");
    assert_eq!(report.quantized.len(), 2 * 7 + 2, "{report:?}");
    let dir = scratch("int8");
    model.save_pretrained(&dir).expect("save_pretrained");
    // The rows as i8 and their scales beside them, [out, 1] in f32.
    let checkpoint = kiln_models::Checkpoint::open(&dir).unwrap();
    let up = "model.layers.1.mlp.up_proj.weight";
    assert_eq!(checkpoint.tensor(up).unwrap().dtype(), DType::I8);
    assert_eq!(checkpoint.shape(up), Some(&[512, 256][..]));
    let scale = checkpoint.tensor(&format!("{up}_scale")).unwrap();
    assert_eq!((scale.dtype(), scale.dims()), (DType::F32, &[512, 1][..]));
    let json = config_json(&dir);
    assert_eq!(json["quantization_config"]["types"], serde_json::json!(["int8"]));

    let kept = load(&dir, true);
    same_parameters(&model, &kept);
    let want = logits(&model);
    assert_eq!(logits(&kept), want);
    // In shards of about one projection each, every row's scales in its shard.
    let sharded = scratch("int8-sharded");
    model.save_pretrained_with(&sharded, SaveOptions { max_shard_bytes: 100_000 }).unwrap();
    assert_eq!(logits(&load(&sharded, true)), want);
    std::fs::remove_dir_all(sharded).unwrap();
    // Dequantized (`scale · q`): the floats a prefill with float activations multiplies by
    // (with int8 activations a prefill may take integer products instead).
    let floats = load(&dir, false);
    assert!(floats.named_parameters().iter().all(|(_, t)| t.dtype() == DType::F32));
    let mut weight_only = load(&fixture("shakespeare-256"), false);
    weight_only.quantize_(&QuantConfig { activations: Activations::F32, ..config }).unwrap();
    assert_eq!(logits(&floats).0, logits(&weight_only).0);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_tied_model_s_quantized_head_is_kept_when_blocks_are() {
    // Qwen2's fixture ties its head to the table: quantize_ gives the head a quantized copy.
    let mut model = load(&fixture("qwen2"), false);
    // (How the products take their input is the loader's choice, not the folder's.)
    let config = QuantConfig { activations: Activations::Int8, ..QuantConfig::new(GgmlType::Q8_0) };
    model.quantize_(&config).expect("quantize_");
    let head = |m: &Llama| {
        m.named_parameters().into_iter().find(|(n, _)| n == "lm_head.weight").map(|p| p.1.dtype())
    };
    assert_eq!(head(&model), Some(DType::U8));
    let dir = scratch("qwen2-q8_0");
    model.save_pretrained(&dir).expect("save_pretrained");
    let kept = load(&dir, true);
    same_parameters(&model, &kept);
    assert_eq!(logits(&kept), logits(&model));
    // Dequantized, the tied model's head is its table again, and the copy is not loaded.
    assert_eq!(head(&load(&dir, false)), None);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn metadata_that_lies_about_blocks_is_an_error_naming_the_tensor() {
    let mut model = load(&fixture("llama"), false);
    model.quantize_(&QuantConfig::new(GgmlType::Q8_0)).expect("quantize_");
    let dir = scratch("lies");
    model.save_pretrained(&dir).expect("save_pretrained");
    let file = dir.join("model.safetensors");
    let (tensors, metadata) = kiln::serialize::load_with_metadata(&file).unwrap();
    let up = "model.layers.0.mlp.up_proj.weight";
    let key = format!("quantized:{up}");
    assert_eq!(metadata.get(&key).map(String::as_str), Some("Q8_0"));
    let cases = [
        (key.clone(), "Q9_9".to_string(), "names a kind the quantized products do not read"),
        (key.clone(), "F16".to_string(), "names a kind the quantized products do not read"),
        // Rows of 34-byte Q8_0 blocks are not whole Q4_K blocks of 144 bytes.
        (key.clone(), "Q4_K".to_string(), "Q4_K blocks are u8 [rows, a multiple of 144 bytes]"),
        ("quantized:model.norm.weight".into(), "Q8_0".into(), "is stored as F32 [32]"),
        ("quantized:no.such.weight".into(), "Q8_0".into(), "is not a tensor of the file"),
        // int8 rows are i8 with their scales beside them.
        (
            key.clone(),
            "int8".to_string(),
            "int8 rows are i8 [rows, cols], with float scales [48, 1]",
        ),
    ];
    for (key, value, want) in cases {
        let mut lying = metadata.clone();
        lying.insert(key.clone(), value);
        kiln::serialize::save_with_metadata(&file, &tensors, &lying).unwrap();
        let options = LoadOptions { keep_quantized: true, ..LoadOptions::default() };
        let err = Llama::from_pretrained(&dir, options).expect_err("a lying file").to_string();
        let name = key.trim_start_matches("quantized:");
        assert!(err.contains(name) && err.contains(want), "{key}: {err}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn int8_projections_save_as_compressed_tensors_and_such_checkpoints_load() {
    let mut model = load(&fixture("shakespeare-256"), false);
    let config =
        QuantConfig { activations: Activations::Int8, ..QuantConfig::new(QuantKind::Int8) };
    model.quantize_(&config).expect("quantize_");
    let dir = scratch("compressed-tensors");
    model.save_pretrained(&dir).expect("save_pretrained");
    let config_path = dir.join("config.json");
    let json = config_json(&dir);
    let q = &json["quantization_config"];
    assert_eq!(q["quant_method"], "compressed-tensors");
    assert_eq!(q["format"], "naive-quantized");
    let group = &q["config_groups"]["group_0"];
    assert_eq!(group["weights"]["strategy"], "channel");
    assert_eq!(group["targets"].as_array().map(Vec::len), Some(2 * 7 + 1));
    let want = logits(&model);

    // A checkpoint compressed-tensors wrote has no kiln metadata, and 16-bit scales.
    let file = dir.join("model.safetensors");
    let (tensors, _) = kiln::serialize::load_with_metadata(&file).unwrap();
    let plain = std::collections::BTreeMap::from([("format".to_string(), "pt".to_string())]);
    kiln::serialize::save_with_metadata(&file, &tensors, &plain).unwrap();
    assert_eq!(logits(&load(&dir, true)), want);
    let bf16: Vec<(String, Tensor)> = (tensors.iter().cloned())
        .map(|(n, t)| if n.ends_with("_scale") { (n, t.bfloat16()) } else { (n, t) })
        .collect();
    kiln::serialize::save_with_metadata(&file, &bf16, &plain).unwrap();
    let rounded = load(&dir, true);
    assert!(rounded.named_parameters().iter().any(|(_, t)| t.dtype() == DType::I8));
    let got = logits(&rounded).0;
    let scale = want.0.iter().fold(0f32, |m, v| m.max(v.abs()));
    let error = got.iter().zip(&want.0).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
    assert!(error > 0.0 && error < 0.02, "bf16 scales: {error}");

    // Schemes kiln does not read are errors naming them.
    let mut other = json.clone();
    other["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] =
        "group".into();
    std::fs::write(&config_path, other.to_string()).unwrap();
    let err = Llama::from_pretrained(&dir, LoadOptions::default()).unwrap_err().to_string();
    assert!(err.contains("compressed-tensors group group_0") && err.contains("\"group\""), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}
