//! A corpus of generated bad calls: shapes that do not fit, dims and indices out of range,
//! wrong dtypes, malformed einsum equations and malformed safetensors files, all through the
//! `try_` forms and the loaders. None may panic or abort; each must return an error whose
//! message names the op that was called.

use std::panic::{AssertUnwindSafe, catch_unwind};

use kiln::prelude::*;

use crate::common::Rng;

/// The bad calls run so far and the names of the ops, checked at the end.
struct Corpus {
    calls: usize,
}

impl Corpus {
    /// Runs one bad call: it must return an error (not panic) whose message starts with one
    /// of `ops` (the op names a user would recognize for this call).
    #[track_caller]
    fn bad<T: std::fmt::Debug>(
        &mut self,
        what: &str,
        ops: &[&str],
        call: impl FnOnce() -> kiln::Result<T>,
    ) {
        self.calls += 1;
        let result = catch_unwind(AssertUnwindSafe(call));
        let Ok(result) = result else { panic!("{what}: panicked instead of returning an error") };
        let err = match result {
            Ok(v) => panic!("{what}: accepted, gave {v:?}"),
            Err(e) => e.to_string(),
        };
        assert!(
            ops.iter().any(|op| err.starts_with(op)),
            "{what}: the message does not name {ops:?}: {err}"
        );
        assert!(!err.contains("panicked") && !err.is_empty(), "{what}: {err}");
    }

    /// Runs a call that may succeed or fail (a fuzzed input): it must not panic, and a
    /// failure must name one of `ops`.
    #[track_caller]
    fn maybe<T>(&mut self, what: &str, ops: &[&str], call: impl FnOnce() -> kiln::Result<T>) {
        self.calls += 1;
        match catch_unwind(AssertUnwindSafe(call)) {
            Err(_) => panic!("{what}: panicked"),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                let err = e.to_string();
                assert!(ops.iter().any(|op| err.starts_with(op)), "{what}: {err}");
            }
        }
    }
}

fn zeros(shape: &[usize]) -> Tensor {
    Tensor::zeros(shape)
}

#[test]
fn five_hundred_bad_calls_give_errors_naming_the_op() {
    let mut c = Corpus { calls: 0 };
    let mut rng = Rng::new(0xbad);
    let shapes: Vec<Vec<usize>> =
        vec![vec![], vec![3], vec![2, 3], vec![4, 1, 5], vec![2, 3, 4, 5], vec![0, 3], vec![7, 2]];

    // Shapes that do not broadcast, for every binary op and `where`.
    let pairs = [
        (vec![2, 3], vec![4, 3]),
        (vec![3], vec![4]),
        (vec![2, 3, 4], vec![3, 2, 4]),
        (vec![5, 1], vec![4, 3]),
    ];
    for (a, b) in &pairs {
        let (x, y) = (zeros(a), zeros(b));
        c.bad("add", &["add"], || x.try_add(&y));
        c.bad("sub", &["sub"], || x.try_sub(&y));
        c.bad("mul", &["mul"], || x.try_mul(&y));
        c.bad("div", &["div"], || x.try_div(&y));
        c.bad("maximum", &["maximum"], || x.try_maximum(&y));
        c.bad("gt", &["gt"], || x.try_gt(&y));
        c.bad("where", &["where"], || Tensor::try_where_(&x.gt(0.0), &x, &y));
        c.bad("matmul", &["matmul"], || x.try_matmul(&y));
        c.bad("cat", &["cat"], || Tensor::try_cat(&[&x, &y], 1));
        c.bad("stack", &["stack"], || Tensor::try_stack(&[&x, &y], 0));
        c.bad("masked_fill", &["masked_fill"], || x.try_masked_fill(&y.gt(0.0), 1.0));
    }
    // Products whose inner sizes differ, at every rank.
    for k in 1..5usize {
        for rank in 1..4usize {
            let mut a = vec![2; rank];
            let mut b = vec![2; rank];
            a[rank - 1] = k;
            b[rank.saturating_sub(2)] = k + 1;
            let (x, y) = (zeros(&a), zeros(&b));
            c.bad("matmul inner", &["matmul"], || x.try_matmul(&y));
        }
        c.bad("mm", &["mm"], || zeros(&[2, k]).try_mm(&zeros(&[k + 1, 2])));
        c.bad("bmm", &["bmm"], || zeros(&[2, 3, k]).try_bmm(&zeros(&[2, k + 1, 3])));
        c.bad("dot", &["dot"], || zeros(&[k]).try_dot(&zeros(&[k + 1])));
    }

    // Dims out of range, for every dim-taking op and rank.
    for shape in &shapes {
        let x = zeros(shape);
        let rank = shape.len() as i64;
        for dim in [rank.max(1), -rank - 1, 64, -64] {
            let what = format!("dim {dim} of {shape:?}");
            c.bad(&what, &["sum"], || x.try_sum_dim(dim, false));
            c.bad(&what, &["mean"], || x.try_mean_dim(dim, true));
            c.bad(&what, &["max"], || x.try_max_dim(dim, false));
            c.bad(&what, &["softmax"], || x.try_softmax(dim));
            c.bad(&what, &["log_softmax"], || x.try_log_softmax(dim));
            c.bad(&what, &["cumsum"], || x.try_cumsum(dim));
            c.bad(&what, &["transpose"], || x.try_transpose(0, dim));
            c.bad(&what, &["squeeze"], || x.try_squeeze(dim));
            c.bad(&what, &["flip"], || x.try_flip(&[dim]));
            c.bad(&what, &["select"], || x.try_select(dim, 0));
            c.bad(&what, &["narrow"], || x.try_narrow(dim, 0, 1));
            c.bad(&what, &["split"], || x.try_split(1, dim));
            c.bad(&what, &["chunk"], || x.try_chunk(2, dim));
            c.bad(&what, &["gather"], || {
                x.try_gather(dim, &Tensor::full_dtype(&shape[..], 0, DType::I64))
            });
            c.bad(&what, &["index_select"], || {
                x.try_index_select(dim, &Tensor::from_vec(vec![0i64], [1]))
            });
        }
        for dim in [rank + 1, -rank - 2, 99] {
            c.bad(&format!("unsqueeze {dim} of {shape:?}"), &["unsqueeze"], || {
                x.try_unsqueeze(dim)
            });
        }
    }

    // Indices and ranges out of bounds.
    let x = zeros(&[4, 5]);
    for (start, len) in [(0, 6), (5, 1), (3, 3), (usize::MAX, 2), (2, usize::MAX)] {
        c.bad("narrow range", &["narrow"], || x.try_narrow(1, start, len));
    }
    for index in [5, -6, 100, i64::MIN, i64::MAX] {
        c.bad("select index", &["select"], || x.try_select(1, index));
    }
    for bad in [vec![5i64, 0], vec![-1], vec![0, 9, 2]] {
        let index = Tensor::from_vec(bad.clone(), [bad.len()]);
        c.bad("index_select index", &["index_select", "gather"], || {
            x.try_index_select(1, &index).and_then(|t| t.try_to_vec::<f32>())
        });
        let index =
            Tensor::from_vec(bad.iter().map(|&i| i * 7).collect::<Vec<_>>(), [1, bad.len()]);
        c.bad("gather index", &["gather"], || {
            x.try_gather(1, &index).and_then(|t| t.try_to_vec::<f32>())
        });
    }
    c.bad("split size 0", &["split"], || x.try_split(0, 0));
    c.bad("chunk 0", &["chunk"], || x.try_chunk(0, 0));

    // Reshapes, views, expands, permutes and repeats that cannot be.
    for shape in &shapes {
        let x = zeros(shape);
        let n = shape.iter().product::<usize>() as i64;
        c.bad("reshape size", &["reshape"], || x.try_reshape(&[n + 1]));
        c.bad("reshape two -1", &["reshape"], || x.try_reshape(&[-1, -1]));
        c.bad("reshape negative", &["reshape"], || x.try_reshape(&[-2, n.max(1)]));
        c.bad("view size", &["view"], || x.try_view(&[n + 2]));
        c.bad("view negative", &["view"], || x.try_view(&[-3]));
        c.bad("permute short", &["permute"], || x.try_permute(&vec![0; shape.len() + 1]));
        c.bad("permute repeated", &["permute"], || x.try_permute(&vec![0; shape.len().max(2)]));
        c.bad("expand fewer dims", &["expand"], || {
            if shape.is_empty() { zeros(&[2]).try_expand(&[]) } else { x.try_expand(&[]) }
        });
        c.bad("expand a non-1", &["expand"], || zeros(&[3, 2]).try_expand(&[3, 5]));
        c.bad("expand negative", &["expand"], || zeros(&[1]).try_expand(&[-3]));
        c.bad("repeat short", &["repeat"], || {
            if shape.is_empty() { zeros(&[2, 2]).try_repeat(&[2]) } else { x.try_repeat(&[]) }
        });
    }
    for strided in [zeros(&[4, 6]).t(), zeros(&[4, 6]).narrow(1, 1, 3)] {
        c.bad("view of a non-contiguous tensor", &["view"], || strided.try_view(&[-1]));
    }

    // Dtype mistakes.
    let f = zeros(&[2, 2]);
    let i = Tensor::full_dtype([2, 2], 0, DType::I64);
    let b = f.gt(0.0);
    c.bad("float index", &["gather"], || f.try_gather(1, &f));
    c.bad("float index_select", &["index_select"], || {
        f.try_index_select(0, &Tensor::from_vec(vec![0.0f32], [1]))
    });
    c.bad("bool matmul", &["matmul"], || b.try_matmul(&b));
    c.bad("mixed matmul", &["matmul"], || f.try_matmul(&i));
    c.bad("float mask", &["masked_fill"], || f.try_masked_fill(&f, 0.0));
    c.bad("non-bool condition", &["where"], || Tensor::try_where_(&f, &f, &f));
    c.bad("item of many", &["item"], || f.try_item::<f32>());
    c.bad("from_vec length", &["from_vec"], || Tensor::try_from_vec(vec![1.0f32; 5], [2, 3]));
    c.bad("from_slice length", &["from_slice"], || Tensor::try_from_slice(&[1i64; 3], [4]));
    c.bad("randint empty", &["randint"], || Tensor::try_randint(3, 3, [2]));
    c.bad("arange zero step", &["arange"], || Tensor::try_arange(0.0f32, 1.0, 0.0));
    c.bad("arange wrong way", &["arange"], || Tensor::try_arange(0i64, 10, -1));

    // Devices: a GPU that is not there (on a machine with one, an index past the last).
    c.bad("to a missing device", &["to", "cuda"], || f.try_to(Device::Cuda(1000)));

    // Einsum equations: fixed mistakes, then random strings over the equation alphabet.
    let (m, v) = (zeros(&[2, 3]), zeros(&[3]));
    for eq in [
        "",
        "->",
        "ij",
        "ij->",
        "ij,j",
        "ijk->i",
        "ij->ik",
        "ij->ii",
        "i1->i",
        "i..j->i",
        "ij->i->j",
        "....->",
        "ij,jk->ik",
        "Ii->",
    ] {
        c.maybe(&format!("einsum {eq:?}"), &["einsum"], || kiln::try_einsum(eq, &[&m, &v]));
    }
    let alphabet: Vec<char> = "ijkIJ,.->1 ".chars().collect();
    for _ in 0..150 {
        let len = rng.int(0, 12) as usize;
        let eq: String =
            (0..len).map(|_| alphabet[rng.int(0, alphabet.len() as i64) as usize]).collect();
        let ops: Vec<&Tensor> = [&m, &v, &m][..rng.int(1, 4) as usize].to_vec();
        c.maybe(&format!("einsum {eq:?}"), &["einsum"], || kiln::try_einsum(&eq, &ops));
    }

    // Malformed safetensors files: every third truncation of a valid file, lying header lengths,
    // bad JSON, offsets past the data, unknown dtypes.
    let dir = std::env::temp_dir().join(format!("kiln-bad-inputs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let good = dir.join("good.safetensors");
    kiln::serialize::save(
        &good,
        &[("w".to_string(), Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]))],
    )
    .expect("save");
    let bytes = std::fs::read(&good).expect("read back");
    let load = |name: &str, data: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, data).expect("write");
        kiln::serialize::load(&path)
    };
    for cut in (0..bytes.len()).step_by(3) {
        c.bad(&format!("truncated at {cut}"), &["load"], || load("cut.safetensors", &bytes[..cut]));
    }
    let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    for lie in [
        0u64,
        1,
        header_len - 1,
        header_len + 1,
        header_len + 1000,
        u64::MAX,
        u64::MAX / 2,
        1 << 40,
    ] {
        let mut b = bytes.clone();
        b[..8].copy_from_slice(&lie.to_le_bytes());
        c.bad(&format!("header length {lie}"), &["load"], || load("lie.safetensors", &b));
    }
    let header = |json: &str| {
        let mut b = (json.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(json.as_bytes());
        b.extend_from_slice(&[0u8; 12]);
        b
    };
    let bad_headers = [
        "{",
        "[]",
        "null",
        "{\"w\": 3}",
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 16]}}",
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 12]}}",
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [12, 0]}}",
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [4, 16]}}",
        "{\"w\": {\"dtype\": \"I16\", \"shape\": [6], \"data_offsets\": [0, 12]}}",
        "{\"w\": {\"dtype\": \"F8_E4M3\", \"shape\": [12], \"data_offsets\": [0, 12]}}",
        "{\"w\": {\"dtype\": \"Q4\", \"shape\": [3], \"data_offsets\": [0, 12]}}",
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [18446744073709551615, 2], \"data_offsets\": [0, 12]}}",
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [-3], \"data_offsets\": [0, 12]}}",
        "{\"w\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 18446744073709551615]}}",
        "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}, \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
        "\u{0}\u{0}\u{0}",
    ];
    for h in bad_headers {
        c.bad(&format!("header {h:?}"), &["load"], || load("header.safetensors", &header(h)));
    }
    for _ in 0..60 {
        let mut b = bytes.clone();
        let at = rng.int(8, b.len() as i64) as usize;
        b[at] = rng.int(0, 256) as u8;
        c.maybe("a flipped byte", &["load"], || load("flip.safetensors", &b));
    }
    c.bad("a missing file", &["load"], || kiln::serialize::load(dir.join("missing.safetensors")));
    std::fs::remove_dir_all(&dir).ok();

    assert!(c.calls >= 500, "only {} bad calls", c.calls);
}
