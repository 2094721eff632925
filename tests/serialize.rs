//! safetensors: exact round trips for every dtype, and load errors that list every mismatch.

use kiln::nn::{Linear, Module, Parameters};
use kiln::prelude::*;
use kiln::serialize::{load, save};

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("kiln-test-{}-{name}.safetensors", std::process::id()))
}

#[test]
fn every_dtype_round_trips_bit_for_bit() {
    let specials =
        [0.0, -0.0, 1.5, -2.25, f64::INFINITY, f64::NEG_INFINITY, 1e-310, 3.0e38, f64::NAN];
    let floats = Tensor::from_vec(specials.to_vec(), [3, 3]);
    let tensors: Vec<(String, Tensor)> = vec![
        ("f64".into(), floats.clone()),
        ("f32".into(), floats.float()),
        ("f16".into(), floats.half()),
        ("bf16".into(), floats.bfloat16()),
        ("i64".into(), Tensor::from_vec(vec![i64::MIN, -1, 0, i64::MAX], [2, 2])),
        ("i32".into(), Tensor::from_vec(vec![i32::MIN, 7, i32::MAX], [3])),
        ("u8".into(), Tensor::from_vec(vec![0u8, 128, 255], [3, 1])),
        ("bool".into(), Tensor::from_vec(vec![true, false, true], [3])),
        ("scalar".into(), Tensor::scalar(2.5f32)),
        ("empty".into(), Tensor::zeros([0, 4])),
        // A transposed view is written in row-major order of its own shape.
        ("transposed".into(), Tensor::arange(0.0f32, 6.0, 1.0).reshape(&[2, 3]).t()),
    ];
    let path = temp("dtypes");
    save(&path, &tensors).expect("save");
    let loaded = load(&path).expect("load");
    std::fs::remove_file(&path).expect("cleanup");
    let mut want = tensors.clone();
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(loaded.len(), want.len());
    for ((name, got), (want_name, t)) in loaded.iter().zip(&want) {
        assert_eq!(name, want_name);
        assert_eq!((got.dtype(), got.shape()), (t.dtype(), t.shape()), "{name}");
        let bits = |x: &Tensor| -> Vec<u64> {
            match x.dtype() {
                DType::F64 => x.to_vec::<f64>().iter().map(|v| v.to_bits()).collect(),
                DType::F32 => x.to_vec::<f32>().iter().map(|v| u64::from(v.to_bits())).collect(),
                DType::F16 => {
                    x.to_vec::<half::f16>().iter().map(|v| u64::from(v.to_bits())).collect()
                }
                DType::BF16 => {
                    x.to_vec::<half::bf16>().iter().map(|v| u64::from(v.to_bits())).collect()
                }
                _ => x.to_vec::<i64>().iter().map(|&v| v as u64).collect(),
            }
        };
        assert_eq!(bits(got), bits(t), "{name}");
    }
}

#[test]
fn models_save_and_load_by_name() {
    let a = Linear::new(4, 3);
    let path = temp("model");
    a.save(&path).expect("save");
    let b = Linear::new(4, 3);
    b.load(&path).expect("load");
    assert_eq!(b.weight.to_vec::<f32>(), a.weight.to_vec::<f32>());
    assert!(b.weight.is_leaf() && b.weight.requires_grad());
    let x = Tensor::randn([2, 4]);
    assert_eq!(b.forward(&x).to_vec::<f32>(), a.forward(&x).to_vec::<f32>());

    // Every difference is listed, and nothing is written.
    struct Other {
        weight: Tensor,
        gain: Tensor,
        bias: Tensor,
    }
    kiln::parameters!(Other { weight, gain, bias });
    let other = Other {
        weight: Tensor::zeros([3, 5]).requires_grad_(true),
        gain: Tensor::zeros([3]).requires_grad_(true),
        bias: Tensor::zeros([3]).double().requires_grad_(true),
    };
    let e = other.load(&path).unwrap_err();
    assert_eq!(
        e.to_string(),
        "load: the file does not match the model:\n  weight: the file has shape [3, 4], the model [3, 5]\n  missing from the file: gain (shape [3], f32)\n  bias: the file has dtype f32, the model f64; convert the model (or the file) first"
    );
    assert!(other.weight.to_vec::<f32>().iter().all(|&v| v == 0.0));
    let small = Linear::with_options(4, 3, false, DType::F32);
    let e = small.load(&path).unwrap_err();
    assert_eq!(
        e.to_string(),
        "load: the file does not match the model:\n  not in the model: bias (shape [3], f32)"
    );
    std::fs::remove_file(&path).expect("cleanup");
}

#[test]
fn bad_files_are_io_errors() {
    let e = load(temp("missing")).unwrap_err();
    assert!(matches!(e, kiln::Error::Io { op: "load", .. }), "{e}");
    let path = temp("garbage");
    std::fs::write(&path, b"not a safetensors file").expect("write");
    let e = load(&path).unwrap_err();
    std::fs::remove_file(&path).expect("cleanup");
    assert!(e.to_string().contains("is not a valid safetensors file"), "{e}");
    let t = Tensor::zeros([1]);
    let e = save(temp("dup"), &[("a".into(), t.clone()), ("a".into(), t)]).unwrap_err();
    assert_eq!(e.to_string(), "save: the name \"a\" appears twice; names must be unique");
    let e = save("/nonexistent-dir/x.safetensors", &[]).unwrap_err();
    assert!(matches!(e, kiln::Error::Io { op: "save", .. }), "{e}");
}

#[cfg(unix)]
#[test]
fn saved_files_get_the_mode_a_plain_create_gives_or_keep_the_replaced_one_s() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).expect("a file").permissions().mode();
    let (path, plain) = (temp("mode"), temp("mode-plain"));
    let _ = std::fs::remove_file(&path);
    std::fs::File::create(&plain).expect("a plain file");
    let tensors = vec![("x".to_string(), Tensor::ones([2]))];
    save(&path, &tensors).expect("save");
    assert_eq!(mode(&path), mode(&plain), "a new file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).expect("chmod");
    save(&path, &tensors).expect("save");
    assert_eq!(mode(&path) & 0o777, 0o640, "a replaced file");
    for p in [path, plain] {
        std::fs::remove_file(p).expect("cleanup");
    }
}
