//! BERT and the sentence encoder against transformers: the `bert` fixture is a tiny random
//! `BertModel` laid out as a sentence-transformers folder, with what transformers computes
//! for a padded batch (hidden states, the pooler, mean-pooled normalised embeddings) and for
//! random segment ids (`make_fixtures.py` writes it).

use std::path::{Path, PathBuf};

use kiln::nn::Parameters;
use kiln::prelude::*;
use kiln_models::bert::Bert;
use kiln_models::sentence::pool;
use kiln_models::{Checkpoint, LoadOptions, Pooling, SentenceEncoder};

/// The sentences the fixture encoded (make_fixtures.py's `SENTENCES`): two are cut at the
/// folder's `max_seq_length` of 16, one is empty.
const SENTENCES: [&str; 5] = [
    "The lazy fox compiles a graph.",
    "Grüße, naïve café 東京!",
    "def forward(x): return (x * 2.0 + 1.0).relu()",
    "unseen words: zyxwvut qqq",
    "",
];

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bert")
}

fn expected(name: &str) -> Tensor {
    let saved = kiln::serialize::load(fixture().join("expected.safetensors"))
        .expect("the fixture's expectations");
    saved.into_iter().find(|(n, _)| n == name).expect("a saved tensor").1
}

/// Every element within `rel` of transformers', relative to the larger of its magnitude and
/// 1, and the expectation not trivially small.
fn assert_close(got: &Tensor, want: &Tensor, rel: f64, what: &str) {
    assert_eq!(got.dims(), want.dims(), "{what}");
    let (g, w) = (got.to_vec::<f64>(), want.to_vec::<f64>());
    let worst = g.iter().zip(&w).map(|(a, b)| (a - b).abs() / b.abs().max(1.0)).fold(0.0, f64::max);
    assert!(worst <= rel, "{what}: an element differs by {worst:e} relative (limit {rel:e})");
    assert!(w.iter().any(|v| v.abs() > 0.1), "{what}: nothing to compare");
}

#[test]
fn hidden_states_and_the_pooler_match_transformers_on_a_padded_batch() {
    let model = Bert::from_pretrained(&fixture(), LoadOptions::default()).unwrap();
    assert!(model.has_pooler());
    let (ids, mask) = (expected("input_ids"), expected("attention_mask"));
    // transformers' 0/1 integer mask, as given, and as bools.
    for mask in [mask.clone(), mask.bool()] {
        let out = model.forward(&ids, None, Some(&mask)).unwrap();
        // Padded positions too: their queries see the real keys only, as transformers'.
        assert_close(&out.last_hidden_state, &expected("last_hidden_state"), 1e-4, "hidden");
        let pooled = out.pooler_output.expect("a pooler");
        assert_close(&pooled, &expected("pooler_output"), 1e-4, "pooler");
    }
    // Without the mask the padding is attended to: a different answer for padded rows.
    let unmasked = model.forward(&ids, None, None).unwrap().last_hidden_state;
    let d = (unmasked.narrow(0, 0, 1) - expected("last_hidden_state").narrow(0, 0, 1))
        .abs()
        .max()
        .item::<f64>();
    assert!(d > 1e-3, "the mask changed nothing ({d})");
}

#[test]
fn segment_ids_pick_the_token_type_embedding() {
    let model = Bert::from_pretrained(&fixture(), LoadOptions::default()).unwrap();
    let (ids, types) = (expected("typed_input_ids"), expected("typed_token_type_ids"));
    let out = model.forward(&ids, Some(&types), None).unwrap();
    assert_close(&out.last_hidden_state, &expected("typed_last_hidden_state"), 1e-4, "typed");
    let zeros = model.forward(&ids, Some(&types.zeros_like()), None).unwrap();
    let default = model.forward(&ids, None, None).unwrap();
    assert_close(&default.last_hidden_state, &zeros.last_hidden_state, 1e-6, "type 0");
}

#[test]
fn the_sentence_encoder_reads_the_folder_and_matches_sentence_transformers() {
    let encoder = SentenceEncoder::from_dir(&fixture(), LoadOptions::default()).unwrap();
    assert_eq!(encoder.pooling(), Pooling::Mean);
    assert!(encoder.normalizes());
    // The tokenizer truncates at max_seq_length keeping [CLS] and [SEP], as the fixture's.
    let (ids, mask) = encoder
        .tokenizer()
        .encode_padded(&SENTENCES, true, 0, kiln_models::PaddingSide::Right, Device::Cpu)
        .unwrap();
    assert_eq!(ids.to_vec::<i64>(), expected("input_ids").to_vec::<i64>());
    assert_eq!(mask.to_vec::<bool>(), expected("attention_mask").bool().to_vec::<bool>());
    let want = expected("embeddings");
    let got = encoder.encode(&SENTENCES).unwrap();
    assert_close(&got, &want, 1e-4, "embeddings");
    let norms = got.square().sum_dim(1, false).sqrt().to_vec::<f64>();
    assert!(norms.iter().all(|n| (n - 1.0).abs() < 1e-5), "{norms:?}");
    // Sorted by length into batches of two and put back in order: the same embeddings.
    assert_close(&encoder.encode_with(&SENTENCES, 2).unwrap(), &want, 1e-4, "batches of 2");
    let one = encoder.encode(&SENTENCES[3..4]).unwrap();
    assert_close(&one, &want.narrow(0, 3, 1), 1e-4, "alone");
    assert_eq!(encoder.encode(&[]).unwrap().dims(), &[0, 32]);
}

#[test]
fn bf16_autocast_embeddings_stay_within_a_percent_of_f32() {
    let encoder = SentenceEncoder::from_dir(&fixture(), LoadOptions::default()).unwrap();
    let want = encoder.encode(&SENTENCES).unwrap();
    let got = kiln::autocast(DType::BF16, || encoder.encode(&SENTENCES)).unwrap();
    assert_eq!(got.dtype(), DType::F32);
    // Unit vectors: the cosine is the dot product.
    let cosines = (&got * &want).sum_dim(1, false).to_vec::<f64>();
    assert!(cosines.iter().all(|c| *c > 0.99), "{cosines:?}");
}

/// The f64 reference of sentence-transformers' poolings.
fn pool_reference(
    h: &[f64],
    mask: &[bool],
    (b, l, d): (usize, usize, usize),
    p: Pooling,
) -> Vec<f64> {
    let mut out = vec![0.0; b * d];
    for i in 0..b {
        let real: Vec<usize> = (0..l).filter(|&t| mask[i * l + t]).collect();
        for j in 0..d {
            let at = |t: usize| h[(i * l + t) * d + j];
            let sum: f64 = real.iter().map(|&t| at(t)).sum();
            let n = (real.len() as f64).max(1e-9);
            out[i * d + j] = match p {
                Pooling::Mean => sum / n,
                Pooling::MeanSqrtLen => sum / n.sqrt(),
                Pooling::Cls => at(0),
                Pooling::Max => (0..l)
                    .map(|t| if mask[i * l + t] { at(t) } else { -1e9 })
                    .fold(f64::MIN, f64::max),
            };
        }
    }
    out
}

#[test]
fn every_pooling_agrees_with_an_f64_reference() {
    let (b, l, d) = (3, 7, 5);
    let h = Tensor::randn([b, l, d]);
    // Real lengths 7, 3 and 1 (and a query all padding would pool to zeros, not NaN).
    let mask: Vec<bool> = (0..b * l).map(|k| k % l < [7, 3, 1][k / l]).collect();
    let mask_t = Tensor::from_vec(mask.clone(), [b, l]);
    for p in [Pooling::Mean, Pooling::MeanSqrtLen, Pooling::Cls, Pooling::Max] {
        let got = pool(&h, &mask_t, p).unwrap().to_vec::<f64>();
        let want = pool_reference(&h.to_vec::<f64>(), &mask, (b, l, d), p);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-5 * w.abs().max(1.0), "{p:?}: {g} against {w}");
        }
    }
    // A strided view of the states pools as its copy.
    let wide = Tensor::randn([b, l, 2 * d]);
    let view = wide.narrow(2, 1, d);
    let a = pool(&view, &mask_t, Pooling::Mean).unwrap().to_vec::<f64>();
    let c = pool(&view.contiguous(), &mask_t, Pooling::Mean).unwrap().to_vec::<f64>();
    assert_eq!(a, c);
    let empty = Tensor::from_vec(vec![false; l], [1, l]);
    let zeros = pool(&Tensor::randn([1, l, d]), &empty, Pooling::Mean).unwrap();
    assert_eq!(zeros.to_vec::<f64>(), vec![0.0; d]);
}

#[test]
fn parameter_names_are_the_checkpoints_and_save_pretrained_round_trips() {
    let dir = fixture();
    let model = Bert::from_pretrained(&dir, LoadOptions::default()).unwrap();
    let checkpoint = Checkpoint::open(&dir).unwrap();
    let params = model.named_parameters();
    let mut names: Vec<&str> = params.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, checkpoint.names().collect::<Vec<_>>());
    for (n, t) in &params {
        assert_eq!(t.dims(), checkpoint.shape(n).expect("stored"), "{n}");
    }
    let out = std::env::temp_dir().join(format!("kiln-bert-saved-{}", std::process::id()));
    model.save_pretrained(&out).unwrap();
    let again = Bert::from_pretrained(&out, LoadOptions::default()).unwrap();
    let ids = expected("typed_input_ids");
    let (a, b) =
        (model.forward(&ids, None, None).unwrap(), again.forward(&ids, None, None).unwrap());
    assert_close(&b.last_hidden_state, &a.last_hidden_state, 0.0, "saved and loaded");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn a_task_checkpoint_with_the_bert_prefix_and_heads_loads_its_encoder() {
    let dir = std::env::temp_dir().join(format!("kiln-bert-prefixed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(fixture().join("config.json"), dir.join("config.json")).unwrap();
    let mut tensors = kiln::serialize::load(fixture().join("model.safetensors")).unwrap();
    for (name, _) in &mut tensors {
        *name = format!("bert.{name}");
    }
    // BertForMaskedLM's head: not the encoder's, left out.
    tensors.push(("cls.predictions.bias".into(), Tensor::zeros([186])));
    kiln::serialize::save(dir.join("model.safetensors"), &tensors).unwrap();
    let model = Bert::from_pretrained(&dir, LoadOptions::default()).unwrap();
    assert!(model.named_parameters().iter().all(|(n, _)| n.starts_with("bert.")));
    let (ids, mask) = (expected("input_ids"), expected("attention_mask"));
    let out = model.forward(&ids, None, Some(&mask)).unwrap();
    assert_close(&out.last_hidden_state, &expected("last_hidden_state"), 1e-4, "prefixed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_inputs_are_errors_naming_the_call_and_the_shapes() {
    let model = Bert::from_pretrained(&fixture(), LoadOptions::default()).unwrap();
    let ids = expected("input_ids");
    let message =
        |r: kiln::Result<kiln_models::bert::BertOutput>| r.expect_err("an error").to_string();
    let m = message(model.forward(&ids, None, Some(&Tensor::ones([5, 3]).bool())));
    assert!(
        m.contains("Bert::forward") && m.contains("attention_mask") && m.contains("[5, 3]"),
        "{m}"
    );
    let m = message(model.forward(&ids.narrow(0, 0, 1).reshape(&[16]), None, None));
    assert!(m.contains("[batch, len]"), "{m}");
    let long = Tensor::zeros([1, 41]).long();
    let m = message(model.forward(&long, None, None));
    assert!(m.contains("max_position_embeddings 40"), "{m}");
    // An index is checked when the rows are gathered: at realization, naming the lookup.
    let types = Tensor::full([5, 16], 2.0).long();
    let m = message(model.forward(&ids, Some(&types), None).and_then(|out| {
        out.last_hidden_state.try_realize()?;
        Ok(out)
    }));
    assert!(m.contains("index 2 is out of bounds") && m.contains("size 2"), "{m}");
    let encoder = SentenceEncoder::from_dir(&fixture(), LoadOptions::default()).unwrap();
    let m = encoder.encode_with(&SENTENCES, 0).expect_err("batch 0").to_string();
    assert!(m.contains("batch_size"), "{m}");
    let m = pool(&Tensor::zeros([2, 3, 4]), &Tensor::zeros([2, 4]).bool(), Pooling::Mean)
        .expect_err("mask shape")
        .to_string();
    assert!(m.contains("pool") && m.contains("[2, 4]"), "{m}");
}
