//! Tokenizers against Hugging Face's Python `tokenizers` (the fixtures' `expected.json`,
//! written by `make_tokenizers.py`): byte-level BPE, SentencePiece-style BPE with byte
//! fallback, WordPiece; ids and decoded text identical.

use std::path::{Path, PathBuf};

use kiln::prelude::*;
use kiln_models::{PaddingSide, Tokenizer};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizers")
}

#[test]
fn every_kind_encodes_and_decodes_as_the_reference() {
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("expected.json")).unwrap())
            .unwrap();
    for kind in ["byte_level_bpe", "sentencepiece_bpe", "wordpiece"] {
        let tok = Tokenizer::from_file(&dir().join(format!("{kind}.json"))).unwrap();
        let want = &expected[kind];
        assert_eq!(tok.vocab_size() as u64, want["vocab_size"].as_u64().unwrap(), "{kind}");
        let cases = want["cases"].as_array().unwrap();
        assert!(cases.len() >= 10);
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let special = case["add_special_tokens"].as_bool().unwrap();
            let ids: Vec<i64> =
                case["ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
            assert_eq!(tok.encode(text, special).unwrap(), ids, "{kind}: {text:?}");
            assert_eq!(
                tok.decode(&ids, true).unwrap(),
                case["decoded"].as_str().unwrap(),
                "{kind}: {text:?}"
            );
            assert_eq!(
                tok.decode(&ids, false).unwrap(),
                case["decoded_with_special"].as_str().unwrap(),
                "{kind}"
            );
        }
    }
}

#[test]
fn special_tokens_padding_and_errors() {
    let tok = Tokenizer::from_file(&dir().join("sentencepiece_bpe.json")).unwrap();
    assert_eq!(tok.token_to_id("<s>"), Some(1));
    assert_eq!(tok.id_to_token(1).as_deref(), Some("<s>"));
    assert_eq!(tok.token_to_id("no such token"), None);
    // Left padding puts every sequence's last token at the last position.
    let texts = ["a b", "The quick brown fox jumps"];
    let (ids, mask) = tok.encode_padded(&texts, true, 0, PaddingSide::Left, Device::Cpu).unwrap();
    let (short, long) = (tok.encode(texts[0], true).unwrap(), tok.encode(texts[1], true).unwrap());
    assert_eq!(ids.dims(), [2, long.len()]);
    let rows = ids.to_vec::<i64>();
    assert_eq!(rows[long.len()..], long[..]);
    assert_eq!(rows[long.len() - short.len()..long.len()], short[..]);
    assert!(rows[..long.len() - short.len()].iter().all(|&t| t == 0));
    let mask = mask.to_vec::<bool>();
    assert_eq!(mask.iter().filter(|&&m| m).count(), short.len() + long.len());
    let (right, _) = tok.encode_padded(&texts, true, 0, PaddingSide::Right, Device::Cpu).unwrap();
    assert_eq!(right.to_vec::<i64>()[..short.len()], short[..]);
    // Errors name the file, or the id.
    let e = Tokenizer::from_file(Path::new("/nonexistent/tokenizer.json")).unwrap_err().to_string();
    assert!(e.contains("/nonexistent/tokenizer.json"), "{e}");
    let e = tok.decode(&[1, 100_000], true).unwrap_err().to_string();
    assert!(e.contains("token 100000 is outside the vocabulary of 400"), "{e}");
}
