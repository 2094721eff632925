//! Constructors and attributes.

use half::{bf16, f16};
use kiln::prelude::*;

use crate::common::device_test;

#[test]
fn from_data_keeps_values_and_dtype() {
    let t = Tensor::from_vec(vec![1.5f64, -2.0, 3.25], [3]);
    assert_eq!((t.dtype(), t.dims(), t.numel(), t.ndim()), (DType::F64, &[3usize][..], 3, 1));
    assert_eq!(t.to_vec::<f64>(), vec![1.5, -2.0, 3.25]);
    let h = Tensor::from_slice(&[f16::from_f32(0.5), f16::from_f32(2.0)], vec![2, 1]);
    assert_eq!((h.dtype(), h.dims()), (DType::F16, &[2usize, 1][..]));
    assert_eq!(h.to_vec::<f16>(), vec![f16::from_f32(0.5), f16::from_f32(2.0)]);
    let b = Tensor::from_vec(vec![bf16::from_f32(1.0)], ());
    assert_eq!((b.dtype(), b.ndim()), (DType::BF16, 0));
    for (t, d) in [
        (Tensor::from_vec(vec![1i32], [1]), DType::I32),
        (Tensor::from_vec(vec![1u8], [1]), DType::U8),
        (Tensor::from_vec(vec![true], [1]), DType::Bool),
        (Tensor::scalar(3i64), DType::I64),
    ] {
        assert_eq!(t.dtype(), d);
        assert_eq!(t.item::<i64>(), if d == DType::I64 { 3 } else { 1 });
    }
    assert_eq!(Tensor::from_slice(&[1.0f32; 6], &[2usize, 3][..]).dims(), &[2, 3]);
}

#[test]
fn fills_and_ranges() {
    assert_eq!(Tensor::zeros([2, 2]).to_vec::<f32>(), vec![0.0; 4]);
    assert_eq!(Tensor::ones([3]).to_vec::<f32>(), vec![1.0; 3]);
    assert_eq!(Tensor::ones([3]).dtype(), DType::F32);
    assert_eq!(Tensor::full([2], true).to_vec::<bool>(), vec![true, true]);
    assert_eq!(Tensor::full_dtype([2], 2.5, DType::F64).to_vec::<f64>(), vec![2.5, 2.5]);
    let e = Tensor::eye(3).to_vec::<f32>();
    assert_eq!(e, vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
    assert_eq!(Tensor::arange(0i64, 10, 2).to_vec::<i64>(), vec![0, 2, 4, 6, 8]);
    assert_eq!(Tensor::arange(0i64, 10, 2).dtype(), DType::I64);
    assert_eq!(Tensor::arange(5i32, -1, -2).to_vec::<i32>(), vec![5, 3, 1]);
    assert_eq!(Tensor::arange(0.0f32, 1.0, 0.25).to_vec::<f32>(), vec![0.0, 0.25, 0.5, 0.75]);
    assert_eq!(Tensor::arange(0.0f32, 1.0, 0.25).dtype(), DType::F32);
    assert_eq!(Tensor::arange(3i64, 3, 1).numel(), 0);
    assert_eq!(Tensor::arange(0.0f64, 1.0, 0.3).to_vec::<f64>().len(), 4);
    let l = Tensor::linspace(-1.0, 1.0, 5).to_vec::<f32>();
    assert_eq!(l, vec![-1.0, -0.5, 0.0, 0.5, 1.0]);
    assert_eq!(Tensor::linspace(2.0, 3.0, 1).to_vec::<f32>(), vec![2.0]);
    assert_eq!(Tensor::linspace(2.0, 3.0, 0).numel(), 0);
}

#[test]
fn like_constructors_copy_shape_and_dtype() {
    let x = Tensor::from_vec(vec![1.0f64; 6], [2, 3]);
    for t in [x.zeros_like(), x.ones_like(), x.full_like(4), x.rand_like(), x.randn_like()] {
        assert_eq!((t.dims(), t.dtype()), (&[2usize, 3][..], DType::F64));
    }
    assert_eq!(x.full_like(4).to_vec::<f64>(), vec![4.0; 6]);
    let i = Tensor::from_vec(vec![1i32; 2], [2]);
    assert_eq!(i.ones_like().to_vec::<i32>(), vec![1, 1]);
    assert!(i.try_add(1).is_ok());
}

#[test]
fn random_values_are_seeded_and_distributed() {
    kiln::manual_seed(1234);
    let a = Tensor::rand([10_000]).to_vec::<f32>();
    let b = Tensor::rand([10_000]).to_vec::<f32>();
    assert_ne!(a, b, "two calls draw different streams");
    kiln::manual_seed(1234);
    assert_eq!(Tensor::rand([10_000]).to_vec::<f32>(), a, "the seed replays the stream");
    assert!(a.iter().all(|&v| (0.0..1.0).contains(&v)));
    let mean = a.iter().map(|&v| f64::from(v)).sum::<f64>() / a.len() as f64;
    assert!((mean - 0.5).abs() < 0.02, "uniform mean {mean}");

    let n = Tensor::randn([20_000]).to_vec::<f64>();
    let mean = n.iter().sum::<f64>() / n.len() as f64;
    let var = n.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n.len() as f64;
    assert!(mean.abs() < 0.03 && (var - 1.0).abs() < 0.05, "normal mean {mean} var {var}");

    let r = Tensor::randint(-2, 3, [5000]);
    assert_eq!(r.dtype(), DType::I64);
    let r = r.to_vec::<i64>();
    for v in -2..3 {
        let count = r.iter().filter(|&&x| x == v).count();
        assert!((800..1200).contains(&count), "randint value {v} drawn {count} times");
    }
    let mut p = Tensor::randperm(100).to_vec::<i64>();
    assert_ne!(p, (0..100).collect::<Vec<_>>());
    p.sort_unstable();
    assert_eq!(p, (0..100).collect::<Vec<_>>());
    // Half-precision uniform values never round up to 1.
    let hx = Tensor::zeros([4096]).half().rand_like().to_vec::<f32>();
    assert!(hx.iter().all(|&v| (0.0..1.0).contains(&v)));
}

#[test]
fn tensors_are_send_and_sync_and_clone_cheaply() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Tensor>();
    let x = Tensor::arange(0i64, 4, 1);
    let handle = std::thread::spawn(move || (&x * 2).sum().item::<i64>());
    assert_eq!(handle.join().unwrap(), 12);
}

device_test!(tensors_from_little_endian_bytes, super::from_le_bytes_on);

/// Tensors from their stored bytes (as in a safetensors file) straight onto `device`.
fn from_le_bytes_on(device: Device) {
    let f: Vec<u8> = [1.5f32, -2.0, 3.25].iter().flat_map(|x| x.to_le_bytes()).collect();
    let t = Tensor::try_from_le_bytes(&f, DType::F32, [3], device).expect("the bytes fit");
    assert_eq!((t.device(), t.to_vec::<f32>()), (device, vec![1.5, -2.0, 3.25]));
    let b: Vec<u8> = [1.0f32, 0.5].iter().flat_map(|&x| bf16::from_f32(x).to_le_bytes()).collect();
    let t = Tensor::try_from_le_bytes(&b, DType::BF16, [1, 2], device).expect("the bytes fit");
    assert_eq!(t.float().to_vec::<f32>(), [1.0, 0.5]);
    let i: Vec<u8> = [-7i64, 9].iter().flat_map(|x| x.to_le_bytes()).collect();
    assert_eq!(
        Tensor::try_from_le_bytes(&i, DType::I64, [2], device)
            .expect("the bytes fit")
            .to_vec::<i64>(),
        [-7, 9]
    );
    let t = Tensor::try_from_le_bytes(&[1, 0], DType::Bool, [2], device).expect("the bytes fit");
    assert_eq!(t.to_vec::<bool>(), [true, false]);
    // Bytes that do not hold the shape, and a bool that is not 0 or 1, are errors.
    let err = Tensor::try_from_le_bytes(&f[..11], DType::F32, [3], device).expect_err("an error");
    assert!(err.to_string().contains("11 bytes cannot hold shape [3] of f32"), "{err}");
    assert!(Tensor::try_from_le_bytes(&[2], DType::Bool, [1], device).is_err());
}
