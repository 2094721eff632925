//! Generation against transformers' greedy `generate` (the fixtures' `greedy`), with the
//! key/value cache and without; the decode step planned once; sampling options.

use std::path::{Path, PathBuf};

use kiln::prelude::*;
use kiln_models::{CausalLm, GenerateOptions, LoadOptions, generate, gpt2::Gpt2, llama::Llama};

mod common;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// The rows of a saved `[rows, width]` i64 tensor of a fixture's expectations.
fn saved_rows(dir: &Path, name: &str) -> Vec<Vec<i64>> {
    let saved = kiln::serialize::load(dir.join("expected.safetensors"))
        .expect("the fixture's expectations");
    let t = &saved.iter().find(|(n, _)| n == name).expect("a saved tensor").1;
    let width = t.dims()[1];
    t.to_vec::<i64>().chunks(width).map(<[i64]>::to_vec).collect()
}

/// The fixture's prompts and transformers' greedy continuations of them.
fn prompts_and_greedy(dir: &Path) -> (Vec<Vec<i64>>, Vec<Vec<i64>>) {
    (saved_rows(dir, "input_ids"), saved_rows(dir, "greedy"))
}

fn greedy_matches_transformers(model: &impl CausalLm, name: &str) {
    let (prompts, want) = prompts_and_greedy(&fixture(name));
    let options = GenerateOptions { max_new_tokens: 8, ..GenerateOptions::default() };
    let mut streamed = vec![Vec::new(); prompts.len()];
    let cached = generate(model, &prompts, &options, |i, t| streamed[i].push(t))
        .expect("generation with the cache");
    assert_eq!(cached.tokens, want, "{name}: greedy with the cache");
    assert_eq!(streamed, want, "{name}: the tokens streamed as they came");
    // The decode step is planned at its first call and replayed for every later token.
    let stats = cached.stats.expect("compiled decode statistics");
    assert_eq!((stats.plans, stats.replays), (1, 6), "{name}: {stats}");
    assert!(stats.recompiles.is_empty(), "{name}: {stats}");
    assert_eq!(cached.decode_steps, 7);
    let uncached = generate(
        model,
        &prompts,
        &GenerateOptions { use_cache: false, ..options.clone() },
        |_, _| {},
    )
    .expect("generation without a cache");
    assert_eq!(uncached.tokens, want, "{name}: greedy without a cache");
    // Prompts of different lengths: left-padded, each counting positions from its own first
    // token, as transformers with an attention mask.
    let ragged = vec![prompts[0].clone(), prompts[1][3..].to_vec()];
    let padded = generate(model, &ragged, &options, |_, _| {}).expect("a left-padded batch");
    assert_eq!(
        padded.tokens,
        saved_rows(&fixture(name), "padded_greedy"),
        "{name}: a left-padded batch"
    );
    assert_eq!(padded.stats.expect("statistics").plans, 1, "{name}: one decode plan with padding");
}

#[test]
fn greedy_decoding_matches_transformers_with_and_without_the_cache() {
    let gpt2 = Gpt2::from_pretrained(&fixture("gpt2"), LoadOptions::default()).unwrap();
    greedy_matches_transformers(&gpt2, "gpt2");
    for name in ["llama", "qwen2", "llama-bf16-sharded"] {
        let model = Llama::from_pretrained(&fixture(name), LoadOptions::default()).unwrap();
        greedy_matches_transformers(&model, name);
    }
}

/// On a CUDA device (the emulated one in CI's `emulator/run-tests`): the parameters, the
/// cache and every step on the GPU, the same greedy tokens, one decode plan.
#[test]
fn greedy_decoding_on_cuda_matches_transformers() {
    let Some(gpu) = common::cuda_or_skip("greedy_decoding_on_cuda_matches_transformers") else {
        return;
    };
    let options = LoadOptions { device: gpu, ..LoadOptions::default() };
    let model = Llama::from_pretrained(&fixture("llama"), options).unwrap();
    assert_eq!(model.device(), gpu);
    greedy_matches_transformers(&model, "llama");
    // Weights stored as bf16 go to the device as stored and are widened there: the
    // conversions are device kernels, not host work, and give the CPU's parameters.
    let sharded = fixture("llama-bf16-sharded");
    let (model, profile) = kiln::profile(|| Llama::from_pretrained(&sharded, options));
    let model = model.unwrap();
    let steps: Vec<_> =
        profile.events().iter().filter(|e| e.kind != kiln::StepKind::Plan).collect();
    assert!(!steps.is_empty(), "the conversions run as kernels");
    for e in steps {
        assert_eq!((e.kind, e.device), (kiln::StepKind::Kernel, gpu), "{}", e.name);
    }
    let on_cpu = Llama::from_pretrained(&sharded, LoadOptions::default()).unwrap();
    for ((name, got), (_, want)) in model.named_parameters().iter().zip(on_cpu.named_parameters()) {
        assert_eq!(got.device(), gpu, "{name}");
        assert_eq!(got.to_vec::<f32>(), want.to_vec::<f32>(), "{name}");
    }
    greedy_matches_transformers(&model, "llama-bf16-sharded");
}

/// The prefill and decode plans pass the oracle: every fused kernel against the reference
/// executor.
#[test]
fn decode_and_prefill_plans_pass_kiln_check() {
    let model = Llama::from_pretrained(&fixture("llama"), LoadOptions::default()).unwrap();
    let (prompts, want) = prompts_and_greedy(&fixture("llama"));
    let options = GenerateOptions { max_new_tokens: 8, ..GenerateOptions::default() };
    let checked = kiln::with_check(|| generate(&model, &prompts, &options, |_, _| {})).unwrap();
    assert_eq!(checked.tokens, want);
}

#[test]
fn sampling_follows_its_options_and_its_seed() {
    let model = Llama::from_pretrained(&fixture("llama"), LoadOptions::default()).unwrap();
    let (prompts, greedy) = prompts_and_greedy(&fixture("llama"));
    let run =
        |options: GenerateOptions| generate(&model, &prompts, &options, |_, _| {}).unwrap().tokens;
    let sampled = GenerateOptions {
        max_new_tokens: 8,
        temperature: 1.0,
        seed: 7,
        ..GenerateOptions::default()
    };
    // One candidate left: sampling is greedy.
    assert_eq!(run(GenerateOptions { top_k: Some(1), ..sampled.clone() }), greedy);
    assert_eq!(run(GenerateOptions { top_p: Some(1e-9), ..sampled.clone() }), greedy);
    // A seed decides the draws.
    let a = run(sampled.clone());
    assert_eq!(a, run(sampled.clone()));
    let others: Vec<_> =
        (8..12).map(|seed| run(GenerateOptions { seed, ..sampled.clone() })).collect();
    assert!(others.iter().any(|o| *o != a), "four other seeds drew the same tokens: {a:?}");
    // A stop token ends its sequence, and only that one.
    let stop = greedy[0][2];
    let stopped = run(GenerateOptions {
        max_new_tokens: 8,
        stop_tokens: vec![stop],
        ..GenerateOptions::default()
    });
    assert_eq!(stopped[0], greedy[0][..3]);
    assert!(stopped[1].len() <= 8 && stopped[1].starts_with(&greedy[1][..1]));
    // A repetition penalty changes what greedy picks once a token repeats.
    let penalized = run(GenerateOptions {
        max_new_tokens: 8,
        repetition_penalty: 50.0,
        ..GenerateOptions::default()
    });
    for seq in &penalized {
        let mut seen = std::collections::HashSet::new();
        assert!(
            seq.iter().all(|t| seen.insert(*t)),
            "a heavily penalized sequence repeats: {seq:?}"
        );
    }
}

#[test]
fn bad_prompts_and_options_are_errors() {
    let model = Gpt2::from_pretrained(&fixture("gpt2"), LoadOptions::default()).unwrap();
    let error = |prompts: &[Vec<i64>], options: GenerateOptions| {
        generate(&model, prompts, &options, |_, _| {}).unwrap_err().to_string()
    };
    let uncached = GenerateOptions { use_cache: false, ..GenerateOptions::default() };
    let e = error(&[vec![1, 2, 3], vec![1, 2]], uncached);
    assert!(e.contains("prompts of 3 and 2 tokens without the cache"), "{e}");
    assert!(error(&[], GenerateOptions::default()).contains("no prompts"));
    assert!(error(&[vec![]], GenerateOptions::default()).contains("empty prompt"));
    let e = error(&[vec![1]], GenerateOptions { temperature: -1.0, ..GenerateOptions::default() });
    assert!(e.contains("temperature"), "{e}");
    let e = error(&[vec![1]], GenerateOptions { top_k: Some(0), ..GenerateOptions::default() });
    assert!(e.contains("top_k"), "{e}");
    let e = error(&[vec![1, 500]], GenerateOptions::default());
    assert!(e.contains("prompt 0 holds token 500, outside the vocabulary of 300"), "{e}");
    // Straight to the model, an id outside the vocabulary is the gather's index error.
    let e = model
        .forward(&Tensor::from_vec(vec![500i64], [1, 1]))
        .unwrap()
        .try_to_vec::<f32>()
        .unwrap_err()
        .to_string();
    assert!(e.contains("index 500 is out of bounds"), "{e}");
}

/// The decode step writes each token's keys and values into the cache's own buffers: their
/// addresses do not change, and the scatters write the new token's rows, not the cache.
#[test]
fn the_cache_is_written_in_place() {
    let model = Llama::from_pretrained(&fixture("llama"), LoadOptions::default()).unwrap();
    let cache = model.new_cache(1, 64).unwrap();
    let (k, v) = cache.layer(0).unwrap();
    let mut step = kiln::compile(|(ids, positions): (&Tensor, &Tensor)| {
        model.forward_with(ids, Some((&cache, positions)), 1)
    });
    let token = Tensor::from_vec(vec![3i64], [1, 1]);
    // A new cache's layers share one buffer of zeros: the first write gives each its own.
    step.try_call((&token, &Tensor::from_vec(vec![0i64], [1]))).unwrap().unwrap().realize();
    let at = (k.data_ptr(), v.data_ptr());
    for p in 1..6i64 {
        step.try_call((&token, &Tensor::from_vec(vec![p], [1]))).unwrap().unwrap().realize();
    }
    assert_eq!((k.data_ptr(), v.data_ptr()), at);
    let ((), profile) = kiln::profile(|| {
        step.try_call((&token, &Tensor::from_vec(vec![6i64], [1]))).unwrap().unwrap().realize();
    });
    let scatters: Vec<_> = profile.events().iter().filter(|e| e.name == "scatter").collect();
    let layers = model.config().num_hidden_layers;
    assert_eq!(scatters.len(), 2 * layers);
    let row = (k.dims()[1] * k.dims()[3] * 4) as u64;
    for e in scatters {
        assert_eq!(e.bytes_written, row, "one token's keys or values, not the cache");
    }
    assert_eq!(step.stats().plans, 1);
}

/// The model the repository ships (`data/shakespeare-llama`, which `train_llama` wrote): its
/// tokenizer gives transformers' ids, and it gives transformers' logits and greedy text.
#[test]
fn the_bundled_model_generates_what_transformers_does() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/shakespeare-llama");
    let saved = kiln::serialize::load(fixture("shakespeare-llama.expected.safetensors"))
        .expect("make_fixtures.py's expectations");
    let get = |name: &str| saved.iter().find(|(n, _)| n == name).expect("a saved tensor").1.clone();
    let tokenizer = kiln_models::Tokenizer::from_dir(&dir).expect("the bundled tokenizer");
    let prompt = tokenizer.encode("ROMEO:\n", true).expect("a prompt");
    assert_eq!(prompt, get("input_ids").to_vec::<i64>());
    let model = Llama::from_pretrained(&dir, LoadOptions::default()).expect("the bundled model");
    let ids = Tensor::from_vec(prompt.clone(), [1, prompt.len()]);
    let (got, want) =
        (model.forward(&ids).expect("logits").to_vec::<f64>(), get("logits").to_vec::<f64>());
    let worst =
        got.iter().zip(&want).map(|(a, b)| (a - b).abs() / b.abs().max(1.0)).fold(0.0, f64::max);
    assert!(worst <= 1e-4, "logits differ by {worst:e}");
    let options = GenerateOptions { max_new_tokens: 48, ..GenerateOptions::default() };
    let out = generate(&model, &[prompt], &options, |_, _| {}).expect("greedy generation");
    assert_eq!(out.tokens[0], get("greedy").to_vec::<i64>());
    let text = tokenizer.decode(&out.tokens[0], false).expect("text");
    assert!(text.chars().filter(char::is_ascii_alphabetic).count() > 20, "{text:?}");
}

/// `generate` records no gradients (transformers' runs under `torch.no_grad`): a model whose
/// parameters require them, as a new one's do, decodes without building autograd history.
#[test]
fn generation_records_no_gradients() {
    let config = match kiln_models::Config::from_dir(&fixture("llama")).expect("a config") {
        kiln_models::Config::Llama(c) => c,
        other => panic!("a Llama config, got {other:?}"),
    };
    let model = Llama::new(config, LoadOptions::default()).expect("a new model");
    assert!(model.named_parameters().iter().all(|(_, t)| t.requires_grad()));
    let options = GenerateOptions { max_new_tokens: 3, ..GenerateOptions::default() };
    let mut seen = Vec::new();
    generate(&model, &[vec![1, 2, 3]], &options, |_, _| seen.push(kiln::is_grad_enabled()))
        .expect("generates");
    assert_eq!(seen, [false; 3]);
    assert!(kiln::is_grad_enabled(), "grad mode is restored after");
}
