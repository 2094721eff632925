//! Shared helpers: a seeded generator, inputs in several layouts, plain-f64 reference
//! arithmetic, and dtype-aware comparisons.

#![allow(dead_code, reason = "each test module uses a different subset")]

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use half::{bf16, f16};
use kiln::prelude::*;

/// SplitMix64, independent of kiln's own generator.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }

    pub fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo) as u64) as i64
    }
}

/// The GPU tests share each device's caching allocator, and `cargo test` runs them on
/// parallel threads: a test that checks the allocator's counters holds this lock
/// exclusively ([`gpu_alone_or_skip`]) while every other GPU test holds it shared.
static DEVICE_MEMORY: RwLock<()> = RwLock::new(());

/// Held for the length of a GPU test; see [`DEVICE_MEMORY`].
pub enum MemoryLock {
    Shared(#[allow(dead_code, reason = "held, not read")] RwLockReadGuard<'static, ()>),
    Alone(#[allow(dead_code, reason = "held, not read")] RwLockWriteGuard<'static, ()>),
}

/// A shared hold on the devices' allocators, for a test that frees cached device memory
/// without being a GPU test ([`kiln::cuda::empty_cache`] works without a device).
pub fn shared_device_memory() -> MemoryLock {
    MemoryLock::Shared(DEVICE_MEMORY.read().unwrap_or_else(PoisonError::into_inner))
}

/// CUDA device 0 when there is one, with a shared hold on the allocators; otherwise
/// `None`, after printing why the calling test is skipped. With `KILN_REQUIRE_GPU=1` (CI's
/// run on the emulated device sets it) a missing device fails the test instead: a GPU run
/// that skipped everything must not pass.
pub fn gpu_or_skip(test: &str) -> Option<(Device, MemoryLock)> {
    let device = device_or_skip(test)?;
    Some((device, shared_device_memory()))
}

/// [`gpu_or_skip`] for a test that reads the allocator's counters: no other GPU test runs
/// while it holds the lock.
pub fn gpu_alone_or_skip(test: &str) -> Option<(Device, MemoryLock)> {
    let device = device_or_skip(test)?;
    let lock = DEVICE_MEMORY.write().unwrap_or_else(PoisonError::into_inner);
    Some((device, MemoryLock::Alone(lock)))
}

/// One test body, run on every device: `device_test!(name, body)` makes the module `name`
/// with the tests `on_cpu` (`body`, a function or closure of a [`Device`], on
/// [`Device::Cpu`]) and `on_cuda` (on CUDA device 0
/// with a shared hold on its allocator, skipping visibly through [`gpu_or_skip`] where there
/// is none). `emulator/run-tests` runs every `on_cuda` test on the emulated device.
macro_rules! device_test {
    ($name:ident, $body:expr) => {
        mod $name {
            #[test]
            fn on_cpu() {
                $body(kiln::Device::Cpu);
            }

            #[test]
            fn on_cuda() {
                let test = concat!(module_path!(), "::on_cuda");
                if let Some((gpu, _memory)) = crate::common::gpu_or_skip(test) {
                    $body(gpu);
                }
            }
        }
    };
}
pub(crate) use device_test;

fn device_or_skip(test: &str) -> Option<Device> {
    if kiln::cuda::is_available() {
        return Some(Device::Cuda(0));
    }
    let why = kiln::cuda::unavailable_reason().unwrap_or("kiln::cuda::device_count() is 0");
    skip(test, &format!("there is no CUDA device ({why})"), &["KILN_REQUIRE_GPU"]);
    None
}

/// Skips the calling test visibly (past the harness's capture), or fails it when every
/// variable of `required_by` is `1`: [`kiln_ir::testing::skip`], the one way a test skips.
pub use kiln_ir::testing::skip;

/// Rounds an f64 to the nearest value of `dtype` (Rust `as` semantics for integers).
pub fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F64 => v,
        DType::F32 => v as f32 as f64,
        DType::F16 => {
            nearest_16(v, |a| f16::from_f64(a).to_bits(), |b| f16::from_bits(b).to_f64(), 0x7c00)
        }
        DType::BF16 => {
            nearest_16(v, |a| bf16::from_f64(a).to_bits(), |b| bf16::from_bits(b).to_f64(), 0x7f80)
        }
        DType::I64 => v as i64 as f64,
        DType::I32 => v as i64 as i32 as f64,
        DType::I8 => v as i64 as i8 as f64,
        DType::U8 => v as i64 as u8 as f64,
        DType::Bool => f64::from(u8::from(v != 0.0)),
    }
}

/// `v` rounded once to a 16-bit float format, ties to even, as an oracle independent of
/// kiln's conversion: `half`'s conversion (which goes through f32 and may round twice) only
/// proposes a candidate; the nearest of it and its two neighbours is chosen exactly. For
/// overflow, infinity (`inf_bits`) stands for the power of two after the largest finite
/// value, as IEEE rounding defines it.
fn nearest_16(
    v: f64,
    to_bits: impl Fn(f64) -> u16,
    value: impl Fn(u16) -> f64,
    inf_bits: u16,
) -> f64 {
    if v.is_nan() {
        return f64::NAN;
    }
    let a = v.abs();
    let at = |b: u16| if b == inf_bits { 2.0 * value(b - 1) - value(b - 2) } else { value(b) };
    let c = to_bits(a).min(inf_bits);
    let candidates = [c.saturating_sub(1), c, (c + 1).min(inf_bits)];
    let mut best = candidates[1];
    for &b in &candidates {
        let (d, e) = ((a - at(b)).abs(), (a - at(best)).abs());
        if d < e || (d == e && b % 2 == 0) {
            best = b;
        }
    }
    if a.is_infinite() {
        best = inf_bits;
    }
    value(best).copysign(v)
}

/// `n` random values exactly representable in `dtype`: floats in [-3, 3], signed integers in
/// [-20, 20], u8 in [0, 40], bools.
pub fn values(rng: &mut Rng, n: usize, dtype: DType) -> Vec<f64> {
    (0..n)
        .map(|_| match dtype {
            DType::Bool => rng.int(0, 2) as f64,
            DType::U8 => rng.int(0, 41) as f64,
            DType::I8 | DType::I32 | DType::I64 => rng.int(-20, 21) as f64,
            d => round_to(d, rng.uniform(-3.0, 3.0)),
        })
        .collect()
}

/// A tensor of `dtype` holding `data` (row-major for `shape`).
pub fn tensor(data: &[f64], shape: &[usize], dtype: DType) -> Tensor {
    let shape = shape.to_vec();
    match dtype {
        DType::F64 => Tensor::from_vec(data.to_vec(), shape),
        DType::F32 => Tensor::from_vec(data.iter().map(|&v| v as f32).collect::<Vec<_>>(), shape),
        DType::F16 => {
            Tensor::from_vec(data.iter().map(|&v| f16::from_f64(v)).collect::<Vec<_>>(), shape)
        }
        DType::BF16 => {
            Tensor::from_vec(data.iter().map(|&v| bf16::from_f64(v)).collect::<Vec<_>>(), shape)
        }
        DType::I64 => Tensor::from_vec(data.iter().map(|&v| v as i64).collect::<Vec<_>>(), shape),
        DType::I32 => Tensor::from_vec(data.iter().map(|&v| v as i32).collect::<Vec<_>>(), shape),
        DType::I8 => Tensor::from_vec(data.iter().map(|&v| v as i8).collect::<Vec<_>>(), shape),
        DType::U8 => Tensor::from_vec(data.iter().map(|&v| v as u8).collect::<Vec<_>>(), shape),
        DType::Bool => Tensor::from_vec(data.iter().map(|&v| v != 0.0).collect::<Vec<_>>(), shape),
    }
}

/// How an input is laid out in its storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Dense, row-major.
    Contiguous,
    /// Stored with the dimensions reversed and permuted back: every stride differs.
    Permuted,
    /// A slice (offset and a gap in every row) of a larger storage.
    Sliced,
}

pub const LAYOUTS: [Layout; 3] = [Layout::Contiguous, Layout::Permuted, Layout::Sliced];

/// A tensor whose logical row-major values are `data`, stored in `layout`.
pub fn make(data: &[f64], shape: &[usize], dtype: DType, layout: Layout) -> Tensor {
    make_on(data, shape, dtype, layout, Device::Cpu)
}

/// [`make`] on `device`: the storage is moved there before the view is taken, so the
/// device's kernels read the layout itself.
pub fn make_on(
    data: &[f64],
    shape: &[usize],
    dtype: DType,
    layout: Layout,
    device: Device,
) -> Tensor {
    let tensor =
        |data: &[f64], shape: &[usize], dtype: DType| tensor(data, shape, dtype).to(device);
    let rank = shape.len();
    match layout {
        Layout::Contiguous => tensor(data, shape, dtype),
        Layout::Permuted if rank >= 2 => {
            let rev: Vec<usize> = shape.iter().rev().copied().collect();
            let mut storage = vec![0.0; data.len()];
            for (flat, &v) in data.iter().enumerate() {
                let idx = unravel(flat, shape);
                let ridx: Vec<usize> = idx.iter().rev().copied().collect();
                storage[ravel(&ridx, &rev)] = v;
            }
            let perm: Vec<i64> = (0..rank as i64).rev().collect();
            let t = tensor(&storage, &rev, dtype).permute(&perm);
            assert!(!t.is_contiguous() || shape.iter().filter(|&&d| d > 1).count() < 2);
            t
        }
        Layout::Sliced if rank >= 1 => {
            let mut padded_shape = shape.to_vec();
            padded_shape[rank - 1] += 3;
            let mut storage = vec![7.0; padded_shape.iter().product()];
            for (flat, &v) in data.iter().enumerate() {
                let mut idx = unravel(flat, shape);
                idx[rank - 1] += 1;
                storage[ravel(&idx, &padded_shape)] = v;
            }
            tensor(&storage, &padded_shape, dtype).narrow(-1, 1, shape[rank - 1])
        }
        _ => tensor(data, shape, dtype),
    }
}

pub fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        if shape[d] > 0 {
            idx[d] = flat % shape[d];
            flat /= shape[d];
        }
    }
    idx
}

pub fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &d)| acc * d + i)
}

/// NumPy broadcasting, written out independently of kiln.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let get = |s: &[usize], i: usize| if i + s.len() >= rank { s[i + s.len() - rank] } else { 1 };
    (0..rank)
        .map(|i| match (get(a, i), get(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// The flat index into an input of `shape` that output index `out_idx` reads under
/// broadcasting.
pub fn broadcast_index(out_idx: &[usize], shape: &[usize]) -> usize {
    let skip = out_idx.len() - shape.len();
    let idx: Vec<usize> = shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if d == 1 { 0 } else { out_idx[skip + i] })
        .collect();
    ravel(&idx, shape)
}

/// The relative (and absolute, near zero) tolerance of values computed in `dtype`.
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-12,
        DType::F32 => 2e-6,
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        _ => 0.0,
    }
}

/// Compares element by element; NaNs must match NaNs and infinities must match exactly.
#[track_caller]
pub fn assert_close(got: &[f64], want: &[f64], dtype: DType, context: &str) {
    assert_close_tol(got, want, tolerance(dtype), context);
}

/// [`assert_close`] with an explicit relative tolerance (0 means exact).
#[track_caller]
pub fn assert_close_tol(got: &[f64], want: &[f64], tol: f64, context: &str) {
    assert_eq!(got.len(), want.len(), "{context}: lengths differ");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() || tol == 0.0 {
            g == w
        } else {
            (g - w).abs() <= tol * w.abs().max(1.0)
        };
        assert!(ok, "{context}: element {i}: got {g}, want {w} (tolerance {tol})");
    }
}

/// A tensor's values as f64, with its dtype checked.
#[track_caller]
pub fn read(t: &Tensor, dtype: DType) -> Vec<f64> {
    assert_eq!(t.dtype(), dtype, "result dtype");
    t.to_vec::<f64>()
}

/// What `loss.backward()` ran, as `(name, ops)` per step: the gradients are realized by
/// `backward`, so the steps, not a graph, say how they were computed. The loss is realized
/// first, so that only the backward's steps are listed.
pub fn backward_ran(loss: &Tensor) -> Vec<(String, String)> {
    loss.realize();
    let (_, p) = kiln::profile(|| loss.backward());
    p.events().iter().map(|e| (e.name.clone(), e.ops.clone())).collect()
}
