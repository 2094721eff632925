//! LoRA (low-rank adaptation) as PEFT defines it: chosen projections `y = x Wᵀ` become
//! `y = x Wᵀ + s·(x Aᵀ) Bᵀ` with `A` `[r, in]` (Kaiming-uniform, as PEFT initialises it),
//! `B` `[out, r]` (zeros, so a new adapter changes nothing) and `s = alpha / r` (or
//! `alpha / √r` with rsLoRA). The base weights stay frozen: only `A` and `B` require
//! gradients, so backward computes no product for a base weight's gradient. Adapters save
//! and load alone in PEFT's layout (`adapter_config.json`, `adapter_model.safetensors`, the
//! names PEFT writes), and merge into the base weights for inference.
//!
//! ```no_run
//! use kiln_models::lora::{LoraConfig, LoraModel};
//! use kiln_models::{LoadOptions, llama::Llama};
//! let mut model = Llama::from_pretrained("SmolLM2-135M".as_ref(), LoadOptions::default())?;
//! let adapted = model.add_lora(&LoraConfig::new(8, 16.0, &["q_proj", "v_proj"]))?;
//! let params: Vec<_> = model.lora_parameters().into_iter().map(|(_, t)| t).collect();
//! // ... train `params` with any kiln optimizer, then:
//! model.save_lora("my-adapter".as_ref())?;
//! model.merge_lora()?; // W += s·BA, adapters gone: plain inference speed
//! # Ok::<(), kiln::Error>(())
//! ```

use std::path::Path;

use kiln::nn::init::{FanMode, Nonlinearity, kaiming_uniform_};
use kiln::{Error, Result, Tensor};
use serde_json::{Value, json};

use crate::linear::Linear;

/// PEFT's `LoraConfig`: the rank, the scale, dropout on the adapter's input, and which
/// projections to adapt.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraConfig {
    /// The rank `r` of `A` and `B`.
    pub r: usize,
    /// `lora_alpha`: the scale is `alpha / r`.
    pub alpha: f64,
    /// `lora_dropout`: dropout on the adapter's input while training.
    pub dropout: f64,
    /// `target_modules`: a projection is adapted when its name (`model.layers.0.self_attn.
    /// q_proj`) is one of these or ends in `.` and one of these; an entry may list
    /// alternatives as `q_proj|v_proj`, and `all-linear` adapts every projection but the
    /// output head.
    pub target_modules: Vec<String>,
    /// `use_rslora`: scale by `alpha / √r` instead.
    pub use_rslora: bool,
}

impl LoraConfig {
    /// Rank `r`, `alpha`, no dropout, the given targets.
    pub fn new(r: usize, alpha: f64, target_modules: &[&str]) -> LoraConfig {
        LoraConfig {
            r,
            alpha,
            dropout: 0.0,
            target_modules: target_modules.iter().map(|s| s.to_string()).collect(),
            use_rslora: false,
        }
    }

    /// The scale `s` of `s·BA`.
    pub fn scale(&self) -> f64 {
        match self.use_rslora {
            true => self.alpha / (self.r as f64).sqrt(),
            false => self.alpha / self.r as f64,
        }
    }

    /// Whether the projection `module` (its name without `.weight`) is a target.
    pub fn targets(&self, module: &str) -> bool {
        self.target_modules
            .iter()
            .flat_map(|t| t.split('|'))
            .any(|t| t == "all-linear" || module == t || module.ends_with(&format!(".{t}")))
    }

    fn check(&self) -> Result<()> {
        if self.r == 0 || !self.alpha.is_finite() || !(0.0..1.0).contains(&self.dropout) {
            return Err(Error::Value {
                op: "add_lora",
                detail: format!(
                    "needs a rank r >= 1, a finite alpha and 0 <= dropout < 1, got r {}, \
                     alpha {}, dropout {}",
                    self.r, self.alpha, self.dropout
                ),
            });
        }
        Ok(())
    }

    /// `adapter_config.json` as PEFT writes it (the keys PEFT reads for plain LoRA).
    pub fn to_json(&self, base_model: Option<&str>) -> Value {
        json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": self.r,
            "lora_alpha": self.alpha,
            "lora_dropout": self.dropout,
            "target_modules": self.target_modules,
            "use_rslora": self.use_rslora,
            "bias": "none",
            "fan_in_fan_out": false,
            "init_lora_weights": true,
            "use_dora": false,
            "modules_to_save": null,
            "base_model_name_or_path": base_model,
        })
    }

    /// Reads PEFT's `adapter_config.json`; `file` names it in errors.
    ///
    /// # Errors
    /// [`Error::Io`] for another `peft_type`, a missing or mistyped key, or a LoRA variant
    /// kiln-models does not compute (DoRA, bias training, `fan_in_fan_out`).
    pub fn from_json(value: &Value, file: &str) -> Result<LoraConfig> {
        let io =
            |detail: String| Error::Io { op: "load_lora", detail: format!("{file}: {detail}") };
        let get = |key: &str| value.get(key).filter(|v| !v.is_null());
        if get("peft_type").and_then(Value::as_str) != Some("LORA") {
            return Err(io("peft_type is not \"LORA\"".into()));
        }
        for (key, ok) in [("use_dora", Value::Bool(false)), ("fan_in_fan_out", Value::Bool(false))]
        {
            if get(key).is_some_and(|v| *v != ok) {
                return Err(io(format!("{key} is set: kiln-models computes plain LoRA")));
            }
        }
        if get("bias").is_some_and(|b| b != "none") {
            return Err(io("bias is not \"none\": kiln-models trains no biases".into()));
        }
        let r = get("r").and_then(Value::as_u64).ok_or_else(|| io("\"r\" is missing".into()))?;
        let alpha = get("lora_alpha").and_then(Value::as_f64).unwrap_or(8.0);
        let target_modules = match get("target_modules") {
            Some(Value::Array(a)) => {
                a.iter().map(|t| t.as_str().map(String::from)).collect::<Option<Vec<_>>>()
            }
            // A single string is PEFT's regular expression: kiln-models reads the common
            // form `.*(q_proj|v_proj)$` as its alternatives of module names.
            Some(Value::String(s)) => Some(vec![
                s.trim_start_matches(".*")
                    .trim_start_matches('(')
                    .trim_end_matches('$')
                    .trim_end_matches(')')
                    .to_string(),
            ]),
            _ => None,
        }
        .ok_or_else(|| io("target_modules should be a list of names".into()))?;
        Ok(LoraConfig {
            r: r as usize,
            alpha,
            dropout: get("lora_dropout").and_then(Value::as_f64).unwrap_or(0.0),
            target_modules,
            use_rslora: get("use_rslora").and_then(Value::as_bool).unwrap_or(false),
        })
    }
}

/// One projection's adapter: `A` `[r, in]`, `B` `[out, r]`, the scale, and dropout.
#[derive(Clone, Debug)]
pub struct Adapter {
    /// `lora_A`, `[r, in]`.
    pub a: Tensor,
    /// `lora_B`, `[out, r]`.
    pub b: Tensor,
    /// `s` of `s·BA`.
    pub scale: f64,
    /// Dropout on the adapter's input, applied while training.
    pub dropout: f64,
    /// Whether dropout applies ([`LoraModel::train_lora`]).
    pub training: bool,
}

/// A model whose projections LoRA adapts (the Llama family implements it); the
/// provided methods do the rest.
pub trait LoraModel {
    /// Every projection LoRA may adapt, named as in the checkpoint without `.weight`
    /// (`model.layers.0.self_attn.q_proj`), in the checkpoint's order.
    fn linears(&self) -> Vec<(String, &Linear)>;

    /// [`LoraModel::linears`], mutably.
    fn linears_mut(&mut self) -> Vec<(String, &mut Linear)>;

    /// The adapters' settings, when they were added or loaded.
    fn lora_config(&self) -> Option<&LoraConfig>;

    /// Records the adapters' settings (`None` after a merge).
    fn set_lora_config(&mut self, config: Option<LoraConfig>);

    /// Attaches a new adapter to every target projection (PEFT's `get_peft_model`): `A`
    /// Kaiming-uniform (bound `1/√in`), `B` zeros, requiring gradients; the base weights
    /// do not. Returns how many projections were adapted.
    ///
    /// # Errors
    /// [`Error::Value`] for a bad rank, alpha or dropout, when no projection matches the
    /// targets (the message lists the names there are), or when the model already has
    /// adapters.
    fn add_lora(&mut self, config: &LoraConfig) -> Result<usize> {
        config.check()?;
        if self.lora_config().is_some() {
            return Err(Error::Value {
                op: "add_lora",
                detail: "the model already has LoRA adapters: merge_lora() them first".into(),
            });
        }
        let mut adapted = 0;
        for (name, linear) in self.linears_mut() {
            if !config.targets(&name) {
                continue;
            }
            let (w, r) = (&linear.weight, config.r);
            let ((out, inp), dtype) = (linear.features(), linear.dtype());
            let a = Tensor::zeros([r, inp]).to_dtype(dtype).to(w.device());
            // PEFT: kaiming_uniform_(A, a=√5), a bound of 1/√in.
            kaiming_uniform_(&a, 5f64.sqrt(), FanMode::FanIn, Nonlinearity::LeakyReLU(0.0))?;
            let b = Tensor::zeros([out, r]).to_dtype(dtype).to(w.device());
            linear.adapter = Some(adapter(a, b, config)?);
            adapted += 1;
        }
        if adapted == 0 {
            return Err(no_target(config, &self.linears()));
        }
        self.set_lora_config(Some(config.clone()));
        Ok(adapted)
    }

    /// The adapters' matrices under the names PEFT saves them with
    /// (`base_model.model.<projection>.lora_A.weight`, `….lora_B.weight`): hand the tensors to
    /// an optimizer.
    fn lora_parameters(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for (name, linear) in self.linears() {
            if let Some(a) = &linear.adapter {
                out.push((format!("base_model.model.{name}.lora_A.weight"), a.a.clone()));
                out.push((format!("base_model.model.{name}.lora_B.weight"), a.b.clone()));
            }
        }
        out
    }

    /// Dropout on the adapters' inputs on (`true`, training) or off.
    fn train_lora(&mut self, training: bool) {
        for (_, linear) in self.linears_mut() {
            if let Some(a) = &mut linear.adapter {
                a.training = training;
            }
        }
    }

    /// Writes the adapters alone as PEFT does: `dir/adapter_config.json` and
    /// `dir/adapter_model.safetensors`, which PEFT's `PeftModel.from_pretrained` and
    /// [`LoraModel::load_lora`] read.
    ///
    /// # Errors
    /// [`Error::Value`] when the model has no adapters; [`Error::Io`] when a file cannot be
    /// written.
    fn save_lora(&self, dir: &Path) -> Result<()> {
        let config = self.lora_config().ok_or_else(|| Error::Value {
            op: "save_lora",
            detail: "the model has no LoRA adapters (add_lora or load_lora first)".into(),
        })?;
        let io = |e: String| Error::Io { op: "save_lora", detail: e };
        std::fs::create_dir_all(dir).map_err(|e| io(format!("{}: {e}", dir.display())))?;
        let text =
            serde_json::to_string_pretty(&config.to_json(None)).map_err(|e| io(e.to_string()))?;
        let path = dir.join("adapter_config.json");
        std::fs::write(&path, text + "\n").map_err(|e| io(format!("{}: {e}", path.display())))?;
        let tensors: Vec<(String, Tensor)> =
            self.lora_parameters().into_iter().map(|(n, t)| (n, t.detach())).collect();
        kiln::serialize::save(dir.join("adapter_model.safetensors"), &tensors)
    }

    /// Reads adapters PEFT (or [`LoraModel::save_lora`]) wrote and attaches them, in the
    /// model's dtype and on its device.
    ///
    /// # Errors
    /// [`Error::Io`] for a missing or unreadable file or a config of another kind;
    /// [`Error::Load`] listing every adapter matrix that is missing, unexpected or of the
    /// wrong shape; [`Error::Value`] when the model already has adapters.
    fn load_lora(&mut self, dir: &Path) -> Result<LoraConfig> {
        if self.lora_config().is_some() {
            return Err(Error::Value {
                op: "load_lora",
                detail: "the model already has LoRA adapters: merge_lora() them first".into(),
            });
        }
        let path = dir.join("adapter_config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::Io {
            op: "load_lora",
            detail: format!("cannot read {}: {e}", path.display()),
        })?;
        let value: Value = serde_json::from_str(&text).map_err(|e| Error::Io {
            op: "load_lora",
            detail: format!("{} is not valid JSON: {e}", path.display()),
        })?;
        let config = LoraConfig::from_json(&value, &path.display().to_string())?;
        let saved = kiln::serialize::load(dir.join("adapter_model.safetensors"))?;
        let mut saved: std::collections::BTreeMap<String, Tensor> = saved.into_iter().collect();
        let mut problems = Vec::new();
        let mut attached = Vec::new();
        for (name, linear) in self.linears_mut() {
            if !config.targets(&name) {
                continue;
            }
            let (r, (out, inp), dtype) = (config.r, linear.features(), linear.dtype());
            let device = linear.weight.device();
            let mut take = |which: &str, shape: [usize; 2]| {
                let key = format!("base_model.model.{name}.{which}.weight");
                match saved.remove(&key) {
                    Some(t) if t.dims() == shape => Some(t.to_dtype(dtype).to(device).detach()),
                    Some(t) => {
                        problems.push(format!(
                            "{key}: the file holds shape {}, the model expects {shape:?}",
                            t.shape()
                        ));
                        None
                    }
                    None => {
                        problems.push(format!("missing: {key} (the model expects {shape:?})"));
                        None
                    }
                }
            };
            let a = take("lora_A", [r, inp]);
            let b = take("lora_B", [out, r]);
            if let (Some(a), Some(b)) = (a, b) {
                attached.push((linear, adapter(a, b, &config)?));
            }
        }
        problems.extend(saved.keys().map(|k| format!("unexpected: {k} (no such adapter)")));
        if !problems.is_empty() {
            return Err(Error::Load {
                detail: format!("{}:\n{}", dir.display(), problems.join("\n")),
            });
        }
        if attached.is_empty() {
            drop(attached);
            return Err(no_target(&config, &self.linears()));
        }
        for (linear, adapter) in attached {
            linear.adapter = Some(adapter);
        }
        self.set_lora_config(Some(config.clone()));
        Ok(config)
    }

    /// Folds every adapter into its base weight (`W += s·BA`, PEFT's `merge_and_unload`) and
    /// removes it: the model computes what it computed with the adapters, at the speed of
    /// the base model, and `save_pretrained` writes the merged weights.
    ///
    /// # Errors
    /// [`Error::Value`] when the model has no adapters.
    fn merge_lora(&mut self) -> Result<()> {
        if self.lora_config().is_none() {
            return Err(Error::Value {
                op: "merge_lora",
                detail: "the model has no LoRA adapters to merge".into(),
            });
        }
        // Checked before any adapter is folded, so a refusal leaves the model as it was.
        let kept = self.linears().into_iter().find_map(|(name, linear)| {
            linear.quantized.as_ref().filter(|_| linear.adapter.is_some()).map(|q| (name, q.kind))
        });
        if let Some((name, kind)) = kept {
            return Err(Error::Value {
                op: "merge_lora",
                detail: format!(
                    "{name} keeps its weight as {kind}: an adapter cannot be folded into it (load with keep_quantized: false to merge)"
                ),
            });
        }
        let mut merged = Vec::new();
        kiln::no_grad(|| -> Result<()> {
            for (_, linear) in self.linears_mut() {
                if let Some(a) = linear.adapter.take() {
                    let delta = a.b.detach().try_matmul(&a.a.detach())? * a.scale;
                    linear.weight =
                        (&linear.weight + delta.to_dtype(linear.weight.dtype())).detach();
                    merged.push(linear.weight.clone());
                }
            }
            Ok(())
        })?;
        Tensor::try_realize_all(&merged.iter().collect::<Vec<_>>())?;
        self.set_lora_config(None);
        Ok(())
    }
}

/// An adapter of `a` and `b`, both made leaves that require gradients.
fn adapter(a: Tensor, b: Tensor, config: &LoraConfig) -> Result<Adapter> {
    Tensor::try_realize_all(&[&a, &b])?;
    Ok(Adapter {
        a: a.try_requires_grad_(true)?,
        b: b.try_requires_grad_(true)?,
        scale: config.scale(),
        dropout: config.dropout,
        training: false,
    })
}

fn no_target(config: &LoraConfig, linears: &[(String, &Linear)]) -> Error {
    let names: Vec<&str> = linears.iter().take(8).map(|(n, _)| n.as_str()).collect();
    Error::Value {
        op: "add_lora",
        detail: format!(
            "no projection matches target_modules {:?}; the model's are named like {}",
            config.target_modules,
            names.join(", ")
        ),
    }
}
