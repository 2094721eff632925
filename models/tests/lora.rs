//! LoRA against PEFT: `fixtures/llama-lora` is an adapter PEFT saved for the `llama`
//! fixture, with the logits, the causal LM loss and every adapter gradient PEFT computed
//! (`make_fixtures.py`). Also: new adapters start as the identity, only adapters get
//! gradients (no product for a frozen weight's), save/load round trips, merging, errors.

use std::path::{Path, PathBuf};

use kiln::nn::Parameters;
use kiln::nn::functional as F;
use kiln::prelude::*;
use kiln_models::lora::{LoraConfig, LoraModel};
use kiln_models::{LoadOptions, llama::Llama};

mod common;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn expected() -> Vec<(String, Tensor)> {
    kiln::serialize::load(fixture("llama-lora").join("expected.safetensors")).expect("expected")
}

fn get(saved: &[(String, Tensor)], name: &str) -> Tensor {
    saved.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no {name}")).1.clone()
}

fn assert_close(got: &Tensor, want: &Tensor, rel: f64, what: &str) {
    assert_eq!(got.dims(), want.dims(), "{what}");
    let (g, w) = (got.to_vec::<f64>(), want.to_vec::<f64>());
    let scale = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let worst = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(worst <= rel * scale.max(1e-3), "{what}: off by {worst:e} (largest {scale:e})");
    assert!(scale > 0.0, "{what}: nothing to compare");
}

/// transformers' causal LM loss: each position predicts the next id, the mean over them.
fn causal_loss(logits: &Tensor, ids: &Tensor) -> Tensor {
    let (b, t, v) = (logits.dims()[0], logits.dims()[1], logits.dims()[2]);
    let pred = logits.narrow(1, 0, t - 1).reshape(&[((t - 1) * b) as i64, v as i64]);
    let next = ids.narrow(1, 1, t - 1).reshape(&[((t - 1) * b) as i64]);
    F::cross_entropy(&pred, &next)
}

fn base() -> Llama {
    Llama::from_pretrained(&fixture("llama"), LoadOptions::default()).expect("the llama fixture")
}

#[test]
fn a_peft_adapter_gives_peft_logits_loss_and_gradients() {
    let mut model = base();
    let config = model.load_lora(&fixture("llama-lora")).unwrap();
    assert_eq!((config.r, config.alpha, config.scale()), (4, 8.0, 2.0));
    let saved = expected();
    let ids = get(&saved, "input_ids");
    let logits = model.forward(&ids).unwrap();
    assert_close(&logits, &get(&saved, "logits"), 1e-5, "logits");
    let loss = causal_loss(&logits, &ids);
    assert_close(&loss.reshape(&[1]), &get(&saved, "loss"), 1e-6, "loss");
    loss.backward();
    let params = model.lora_parameters();
    assert_eq!(params.len(), 12, "2 layers x 3 targets x (A, B)");
    for (name, t) in &params {
        let grad = t.grad().unwrap_or_else(|| panic!("{name} has no gradient"));
        assert_close(&grad, &get(&saved, &format!("grad.{name}")), 1e-4, name);
    }
    // The base is frozen: no gradient reaches a weight.
    for (name, t) in model.named_parameters() {
        assert!(t.grad().is_none() && !t.requires_grad(), "{name} got a gradient");
    }
}

/// On a CUDA device (the emulated one in CI's `emulator/run-tests`): PEFT's logits, loss and
/// adapter gradients with the model, the adapters and the step on the GPU; a new adapter's
/// matrices are made there.
#[test]
fn lora_on_cuda_matches_peft() {
    let Some(gpu) = common::cuda_or_skip("lora_on_cuda_matches_peft") else { return };
    let options = LoadOptions { device: gpu, ..LoadOptions::default() };
    let mut model = Llama::from_pretrained(&fixture("llama"), options).unwrap();
    model.load_lora(&fixture("llama-lora")).unwrap();
    let saved = expected();
    let ids = get(&saved, "input_ids").to(gpu);
    let logits = model.forward(&ids).unwrap();
    assert_eq!(logits.device(), gpu);
    assert_close(&logits, &get(&saved, "logits"), 1e-5, "logits on the device");
    causal_loss(&logits, &ids).backward();
    for (name, t) in model.lora_parameters() {
        assert_eq!(t.device(), gpu, "{name}");
        let grad = t.grad().unwrap_or_else(|| panic!("{name} has no gradient"));
        assert_close(&grad, &get(&saved, &format!("grad.{name}")), 1e-4, &name);
    }
    model.merge_lora().unwrap();
    assert_close(
        &model.forward(&ids).unwrap(),
        &get(&saved, "logits"),
        1e-5,
        "merged on the device",
    );
    let mut fresh = Llama::from_pretrained(&fixture("llama"), options).unwrap();
    fresh.add_lora(&LoraConfig::new(2, 4.0, &["v_proj"])).unwrap();
    assert!(fresh.lora_parameters().iter().all(|(_, t)| t.device() == gpu));
}

#[test]
fn frozen_weights_cost_no_gradient_products() {
    // A weight's gradient is a product contracting over the 14 tokens, `[out, 14] @ [14, in]`.
    // With adapters of rank 4, every such product is an adapter's (`r` on one side); with
    // every weight trainable, each projection and the head add one of their own sizes.
    let ids = get(&expected(), "input_ids");
    let weight_gradients = |model: &Llama| -> Vec<(usize, usize, usize)> {
        let loss = causal_loss(&model.forward(&ids).unwrap(), &ids);
        let ((), profile) = kiln::profile(|| loss.backward());
        profile
            .kernels()
            .iter()
            .filter(|k| k.ops.contains("matmul"))
            .filter_map(|k| {
                let dims: Vec<usize> = k
                    .shape
                    .split(|c: char| !c.is_ascii_digit())
                    .filter_map(|d| d.parse().ok())
                    .collect();
                match dims[..] {
                    [out, 14, 14, inp] if out != 14 => Some((out, inp, k.launches)),
                    _ => None,
                }
            })
            .collect()
    };
    let mut adapted = base();
    adapted.load_lora(&fixture("llama-lora")).unwrap();
    let lora = weight_gradients(&adapted);
    assert!(!lora.is_empty() && lora.iter().all(|&(o, i, _)| o == 4 || i == 4), "{lora:?}");
    let full = base();
    for (_, t) in full.named_parameters() {
        t.requires_grad_(true);
    }
    let frozen: usize =
        weight_gradients(&full).iter().filter(|&&(o, i, _)| o != 4 && i != 4).map(|p| p.2).sum();
    assert_eq!(frozen, 15, "two layers' seven projections and the head");
}

#[test]
fn new_adapters_start_as_the_identity_and_train_only_themselves() {
    let saved = expected();
    let ids = get(&saved, "input_ids");
    let want = base().forward(&ids).unwrap();
    let mut model = base();
    kiln::manual_seed(3);
    let n = model.add_lora(&LoraConfig::new(2, 4.0, &["q_proj|o_proj"])).unwrap();
    assert_eq!(n, 4);
    assert_close(&model.forward(&ids).unwrap(), &want, 0.0, "B = 0 changes nothing");
    for (name, t) in model.lora_parameters() {
        assert!(t.requires_grad() && t.is_leaf(), "{name}");
        let values = t.to_vec::<f64>();
        if name.contains("lora_A") {
            // Kaiming-uniform with a = √5: within 1/√in, and not all alike.
            let bound = 1.0 / (t.dims()[1] as f64).sqrt();
            assert!(
                values.iter().all(|v| v.abs() <= bound)
                    && values.iter().any(|v| v.abs() > bound / 4.0)
            );
        } else {
            assert!(values.iter().all(|&v| v == 0.0), "{name} starts at zero");
        }
    }
    // One SGD step moves B (A's gradient is zero while B is): the logits change.
    let params: Vec<Tensor> = model.lora_parameters().into_iter().map(|(_, t)| t).collect();
    let mut sgd =
        kiln::optim::Sgd::new(params, kiln::optim::SgdConfig { lr: 0.5, ..Default::default() });
    causal_loss(&model.forward(&ids).unwrap(), &ids).backward();
    sgd.step();
    let moved = (model.forward(&ids).unwrap() - &want).abs().max().item::<f64>();
    assert!(moved > 1e-3, "the step changed nothing ({moved})");
}

#[test]
fn adapters_save_load_and_merge() {
    let saved = expected();
    let ids = get(&saved, "input_ids");
    let mut model = base();
    model.load_lora(&fixture("llama-lora")).unwrap();
    let with_adapters = model.forward(&ids).unwrap();
    let dir = std::env::temp_dir().join(format!("kiln-lora-{}", std::process::id()));
    model.save_lora(&dir).unwrap();
    let mut again = base();
    again.load_lora(&dir).unwrap();
    assert_close(&again.forward(&ids).unwrap(), &with_adapters, 0.0, "saved and loaded");
    // Merged: the same logits, no adapters left, and save_pretrained writes the merged model.
    again.merge_lora().unwrap();
    assert!(again.lora_parameters().is_empty() && again.lora_config().is_none());
    assert_close(&again.forward(&ids).unwrap(), &get(&saved, "logits"), 1e-5, "merged");
    let merged_dir = dir.join("merged");
    again.save_pretrained(&merged_dir).unwrap();
    let plain = Llama::from_pretrained(&merged_dir, LoadOptions::default()).unwrap();
    assert_close(&plain.forward(&ids).unwrap(), &get(&saved, "logits"), 1e-5, "merged, saved");
    // Under bf16 autocast the adapted model runs too, close to f32.
    let low = kiln::autocast(DType::BF16, || model.forward(&ids).unwrap()).float();
    assert_close(&low, &with_adapters, 0.05, "bf16 autocast");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lora_mistakes_are_errors_that_say_what_to_do() {
    let mut model = base();
    let m = model.add_lora(&LoraConfig::new(4, 8.0, &["query"])).unwrap_err().to_string();
    assert!(
        m.contains("no projection matches") && m.contains("model.layers.0.self_attn.q_proj"),
        "{m}"
    );
    let m = model.add_lora(&LoraConfig::new(0, 8.0, &["q_proj"])).unwrap_err().to_string();
    assert!(m.contains("rank"), "{m}");
    let m = model.merge_lora().unwrap_err().to_string();
    assert!(m.contains("no LoRA adapters"), "{m}");
    model.add_lora(&LoraConfig::new(4, 8.0, &["q_proj"])).unwrap();
    let m = model.add_lora(&LoraConfig::new(4, 8.0, &["v_proj"])).unwrap_err().to_string();
    assert!(m.contains("already has LoRA adapters"), "{m}");
    // An adapter saved at another rank than its config says: each matrix named, both shapes.
    let dir = std::env::temp_dir().join(format!("kiln-lora-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(fixture("llama-lora").join("adapter_config.json")).unwrap();
    std::fs::write(dir.join("adapter_config.json"), text.replace("\"r\": 4", "\"r\": 3")).unwrap();
    std::fs::copy(
        fixture("llama-lora").join("adapter_model.safetensors"),
        dir.join("adapter_model.safetensors"),
    )
    .unwrap();
    let m = base().load_lora(&dir).unwrap_err().to_string();
    assert!(
        m.contains("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight")
            && m.contains("[4, 32]")
            && m.contains("[3, 32]"),
        "{m}"
    );
    let m = base().load_lora(&fixture("llama")).unwrap_err().to_string();
    assert!(m.contains("adapter_config.json"), "{m}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn peft_configs_read_as_peft_writes_them() {
    let json = serde_json::json!({
        "peft_type": "LORA", "r": 8, "lora_alpha": 32, "lora_dropout": 0.1,
        "target_modules": ".*(q_proj|v_proj)$", "use_rslora": true, "bias": "none",
    });
    let c = LoraConfig::from_json(&json, "adapter_config.json").unwrap();
    assert_eq!((c.r, c.alpha, c.dropout, c.use_rslora), (8, 32.0, 0.1, true));
    assert!((c.scale() - 32.0 / 8f64.sqrt()).abs() < 1e-12);
    assert!(
        c.targets("model.layers.3.self_attn.q_proj")
            && c.targets("model.layers.0.self_attn.v_proj")
    );
    assert!(
        !c.targets("model.layers.0.self_attn.k_proj") && !c.targets("model.layers.0.mlp.up_proj")
    );
    let dora = serde_json::json!({ "peft_type": "LORA", "r": 8, "target_modules": ["q_proj"], "use_dora": true });
    let m = LoraConfig::from_json(&dora, "adapter_config.json").unwrap_err().to_string();
    assert!(m.contains("use_dora"), "{m}");
    let round = LoraConfig::from_json(&c.to_json(None), "x").unwrap();
    assert_eq!(round.target_modules, c.target_modules);
}
