//! Constructors: from data, fills, ranges and random values.

use kiln_ir::{DType, Element, Op, RandomDist, Scalar, Shape, random};
use kiln_runtime::Buffer;

use super::Tensor;
use crate::error::ok;
use crate::{Device, Error, Result};

impl Tensor {
    /// A tensor of `shape` holding `data` in row-major order; the dtype follows the element
    /// type (`f32` gives [`DType::F32`], `i64` gives [`DType::I64`], ...).
    ///
    /// # Panics
    /// If `data.len()` differs from the shape's element count; [`Tensor::try_from_vec`]
    /// returns the error instead.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let t = Tensor::from_vec(vec![1i64, 2, 3, 4], [2, 2]);
    /// assert_eq!(t.dtype(), DType::I64);
    /// ```
    #[track_caller]
    pub fn from_vec<T: Element>(data: Vec<T>, shape: impl Into<Shape>) -> Tensor {
        ok(Tensor::try_from_vec(data, shape))
    }

    /// [`Tensor::from_vec`], returning an error when the length does not match the shape.
    ///
    /// # Errors
    /// [`Error::Shape`] when `data.len()` differs from the shape's element count;
    /// [`Error::Runtime`] when memory runs out.
    #[track_caller]
    pub fn try_from_vec<T: Element>(data: Vec<T>, shape: impl Into<Shape>) -> Result<Tensor> {
        Tensor::try_from_slice(&data, shape).map_err(|e| e.reported_as("from_vec"))
    }

    /// A tensor of `shape` holding a copy of `data` in row-major order.
    ///
    /// # Panics
    /// If `data.len()` differs from the shape's element count.
    #[track_caller]
    pub fn from_slice<T: Element>(data: &[T], shape: impl Into<Shape>) -> Tensor {
        ok(Tensor::try_from_slice(data, shape))
    }

    /// [`Tensor::from_slice`], returning an error when the length does not match the shape.
    ///
    /// # Errors
    /// [`Error::Shape`] when `data.len()` differs from the shape's element count;
    /// [`Error::Runtime`] when memory runs out.
    #[track_caller]
    pub fn try_from_slice<T: Element>(data: &[T], shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        if data.len() != shape.numel() {
            return Err(Error::shape(
                "from_slice",
                format!(
                    "{} values cannot fill shape {shape}, which has {} elements; pass a shape whose dimensions multiply to {}",
                    data.len(),
                    shape.numel(),
                    data.len()
                ),
            ));
        }
        let buffer = Buffer::from_slice(data).map_err(kiln_runtime::RunError::from)?;
        Ok(Tensor::from_buffer(buffer, shape))
    }

    /// A tensor of `shape` and `dtype` on `device` from its elements' little-endian bytes in
    /// row-major order (a safetensors tensor's data, say): one copy into host memory, or, for
    /// a GPU, one upload straight from `bytes`, so that a memory-mapped file's pages go to
    /// the device without a host buffer in between.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let bytes: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    /// let t = Tensor::try_from_le_bytes(&bytes, DType::F32, [2], Device::Cpu)?;
    /// assert_eq!(t.to_vec::<f32>(), [1.5, -2.0]);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Shape`] when `bytes` does not hold the shape's elements of `dtype`;
    /// [`Error::Runtime`] for a bool byte other than 0 or 1, when memory runs out or the
    /// device fails.
    #[track_caller]
    pub fn try_from_le_bytes(
        bytes: &[u8],
        dtype: DType,
        shape: impl Into<Shape>,
        device: Device,
    ) -> Result<Tensor> {
        let shape = shape.into();
        let fits = shape.numel().checked_mul(dtype.size_in_bytes()) == Some(bytes.len());
        if !fits {
            return Err(Error::shape(
                "from_le_bytes",
                format!(
                    "{} bytes cannot hold shape {shape} of {dtype} ({} elements of {} bytes)",
                    bytes.len(),
                    shape.numel(),
                    dtype.size_in_bytes()
                ),
            ));
        }
        let buffer = Buffer::from_le_bytes(dtype, shape.numel(), bytes, device)
            .map_err(kiln_runtime::RunError::from)?;
        Ok(Tensor::from_buffer(buffer, shape))
    }

    /// A zero-dimensional tensor holding `value`, of `value`'s dtype.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let s = Tensor::scalar(2.5f32);
    /// assert_eq!(s.ndim(), 0);
    /// assert_eq!(s.item::<f32>(), 2.5);
    /// ```
    #[track_caller]
    pub fn scalar<T: Element>(value: T) -> Tensor {
        Tensor::from_slice(&[value], ())
    }

    /// An `f32` tensor of zeros.
    #[track_caller]
    pub fn zeros(shape: impl Into<Shape>) -> Tensor {
        Tensor::full_dtype(shape, 0.0, DType::F32)
    }

    /// An `f32` tensor of ones.
    #[track_caller]
    pub fn ones(shape: impl Into<Shape>) -> Tensor {
        Tensor::full_dtype(shape, 1.0, DType::F32)
    }

    /// A tensor filled with `value`. As in PyTorch, the dtype is the default of the value's
    /// kind: `f32` for a float, `i64` for an integer, `bool` for a bool.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// assert_eq!(Tensor::full([2], 1.5).dtype(), DType::F32);
    /// assert_eq!(Tensor::full([2], 7).dtype(), DType::I64);
    /// assert_eq!(Tensor::full([2], 7).to_vec::<i64>(), vec![7, 7]);
    /// ```
    #[track_caller]
    pub fn full(shape: impl Into<Shape>, value: impl Into<Scalar>) -> Tensor {
        let value = value.into();
        Tensor::full_dtype(shape, value, DType::default_for(value.category()))
    }

    /// A tensor of `dtype` filled with `value` (converted with Rust `as` semantics).
    #[track_caller]
    pub fn full_dtype(shape: impl Into<Shape>, value: impl Into<Scalar>, dtype: DType) -> Tensor {
        ok(Tensor::try_full_dtype(shape, value, dtype))
    }

    /// [`Tensor::full_dtype`] (and so `zeros`, `ones`, `full`), returning an error instead of
    /// panicking.
    ///
    /// # Errors
    /// [`Error::Shape`] when the tensor's element count or byte size overflows (a shape no
    /// memory can hold); [`Error::DType`] for a value the dtype cannot take.
    #[track_caller]
    pub fn try_full_dtype(
        shape: impl Into<Shape>,
        value: impl Into<Scalar>,
        dtype: DType,
    ) -> Result<Tensor> {
        Tensor::from_leaf(Op::Full(value.into()), shape.into(), dtype)
    }

    /// The `n x n` identity matrix (`f32`).
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// assert_eq!(Tensor::eye(2).to_vec::<f32>(), vec![1.0, 0.0, 0.0, 1.0]);
    /// ```
    #[track_caller]
    pub fn eye(n: usize) -> Tensor {
        ok(Tensor::try_eye(n))
    }

    /// [`Tensor::eye`], returning an error when `n x n` elements cannot exist.
    ///
    /// The matrix is computed lazily (row index equals column index), so it costs nothing
    /// until it is read and fuses into what reads it.
    ///
    /// # Errors
    /// [`Error::Shape`] when `n * n` overflows or the matrix would exceed addressable memory.
    #[track_caller]
    pub fn try_eye(n: usize) -> Result<Tensor> {
        Shape::new(vec![n, n]).check_size("eye", DType::F32)?;
        let i = Tensor::try_arange(0i64, n as i64, 1)?;
        Ok(i.try_unsqueeze(1)?.try_eq(&i.try_unsqueeze(0)?)?.float())
    }

    /// The values `start, start + step, ...` below `end` (above it for a negative step), of
    /// the arguments' type: `arange(0i64, 10, 2)` is `i64`, `arange(0.0f32, 1.0, 0.25)` is
    /// `f32`.
    ///
    /// # Panics
    /// If `step` is zero or points away from `end`; [`Tensor::try_arange`] returns the error.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// assert_eq!(Tensor::arange(0i64, 10, 3).to_vec::<i64>(), vec![0, 3, 6, 9]);
    /// assert_eq!(Tensor::arange(1.0f32, 0.0, -0.25).to_vec::<f32>(), vec![1.0, 0.75, 0.5, 0.25]);
    /// ```
    #[track_caller]
    pub fn arange<T: Element>(start: T, end: T, step: T) -> Tensor {
        ok(Tensor::try_arange(start, end, step))
    }

    /// [`Tensor::arange`], returning an error for a bad step.
    ///
    /// # Errors
    /// [`Error::Shape`] when `step` is zero or points away from `end`.
    #[track_caller]
    pub fn try_arange<T: Element>(start: T, end: T, step: T) -> Result<Tensor> {
        let (s, e, st) = (start.to_scalar(), end.to_scalar(), step.to_scalar());
        let n = if T::DTYPE.is_float() {
            let (s, e, st) = (s.to_f64(), e.to_f64(), st.to_f64());
            if st == 0.0 || !st.is_finite() || (e - s) * st < 0.0 {
                return Err(arange_error(s, e, st));
            }
            ((e - s) / st).ceil().max(0.0) as usize
        } else {
            let (s, e, st) = (s.to_i64(), e.to_i64(), st.to_i64());
            if st == 0 || (e - s).signum() * st.signum() < 0 {
                return Err(arange_error(s, e, st));
            }
            let (d, st) = (i128::from(e) - i128::from(s), i128::from(st));
            ((d + st - st.signum()) / st).max(0) as usize
        };
        let values: Vec<T> = if T::DTYPE.is_float() {
            (0..n)
                .map(|i| T::from_scalar(Scalar::F64(s.to_f64() + i as f64 * st.to_f64())))
                .collect()
        } else {
            (0..n)
                .map(|i| T::from_scalar(Scalar::I64(s.to_i64() + i as i64 * st.to_i64())))
                .collect()
        };
        Tensor::try_from_vec(values, [n])
    }

    /// `steps` evenly spaced `f32` values from `start` to `end`, both included.
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// assert_eq!(Tensor::linspace(0.0, 1.0, 5).to_vec::<f32>(), vec![0.0, 0.25, 0.5, 0.75, 1.0]);
    /// ```
    #[track_caller]
    pub fn linspace(start: f64, end: f64, steps: usize) -> Tensor {
        let step = if steps > 1 { (end - start) / (steps - 1) as f64 } else { 0.0 };
        // Like PyTorch, compute the second half from the end so that `end` is exact.
        let values: Vec<f32> = (0..steps)
            .map(|i| {
                if i < steps / 2 || steps == 1 {
                    start + step * i as f64
                } else {
                    end - step * (steps - 1 - i) as f64
                }
            })
            .map(|v| v as f32)
            .collect();
        Tensor::from_vec(values, [steps])
    }

    /// Uniform random `f32` values in `[0, 1)`; see [`crate::manual_seed`].
    #[track_caller]
    pub fn rand(shape: impl Into<Shape>) -> Tensor {
        Tensor::random(RandomDist::Uniform, shape.into(), DType::F32)
    }

    /// Standard normal random `f32` values; see [`crate::manual_seed`].
    #[track_caller]
    pub fn randn(shape: impl Into<Shape>) -> Tensor {
        Tensor::random(RandomDist::Normal, shape.into(), DType::F32)
    }

    /// Uniform random `i64` values in `[low, high)`; see [`crate::manual_seed`].
    ///
    /// # Panics
    /// If `low >= high`; [`Tensor::try_randint`] returns the error.
    #[track_caller]
    pub fn randint(low: i64, high: i64, shape: impl Into<Shape>) -> Tensor {
        ok(Tensor::try_randint(low, high, shape))
    }

    /// [`Tensor::randint`], returning an error for an empty range.
    ///
    /// # Errors
    /// [`Error::Shape`] when `low >= high`.
    #[track_caller]
    pub fn try_randint(low: i64, high: i64, shape: impl Into<Shape>) -> Result<Tensor> {
        let key = crate::random::next_key();
        Tensor::from_leaf(
            Op::Random { dist: RandomDist::Int { low, high }, key },
            shape.into(),
            DType::I64,
        )
    }

    /// A random permutation of `0..n` (`i64`); see [`crate::manual_seed`].
    ///
    /// ```
    /// # use kiln::prelude::*;
    /// let mut p = Tensor::randperm(5).to_vec::<i64>();
    /// p.sort();
    /// assert_eq!(p, vec![0, 1, 2, 3, 4]);
    /// ```
    #[track_caller]
    pub fn randperm(n: usize) -> Tensor {
        let key = crate::random::next_key();
        let mut perm: Vec<i64> = (0..n as i64).collect();
        // Fisher-Yates, drawing position i's swap partner from element i of the stream.
        for i in (1..n).rev() {
            let j = random::int(key, i as u64, 0, i as i64 + 1) as usize;
            perm.swap(i, j);
        }
        Tensor::from_vec(perm, [n])
    }

    #[track_caller]
    fn random(dist: RandomDist, shape: Shape, dtype: DType) -> Tensor {
        ok(Tensor::try_random(dist, shape, dtype))
    }

    #[track_caller]
    fn try_random(dist: RandomDist, shape: Shape, dtype: DType) -> Result<Tensor> {
        let key = crate::random::next_key();
        Tensor::from_leaf(Op::Random { dist, key }, shape, dtype)
    }

    /// [`Tensor::rand`], returning an error for a shape no memory can hold.
    ///
    /// # Errors
    /// [`Error::Shape`] when the element count or byte size overflows.
    #[track_caller]
    pub fn try_rand(shape: impl Into<Shape>) -> Result<Tensor> {
        Tensor::try_random(RandomDist::Uniform, shape.into(), DType::F32)
    }

    /// [`Tensor::randn`], returning an error for a shape no memory can hold.
    ///
    /// # Errors
    /// [`Error::Shape`] when the element count or byte size overflows.
    #[track_caller]
    pub fn try_randn(shape: impl Into<Shape>) -> Result<Tensor> {
        Tensor::try_random(RandomDist::Normal, shape.into(), DType::F32)
    }

    /// Zeros of this tensor's shape and dtype, on its device.
    #[track_caller]
    pub fn zeros_like(&self) -> Tensor {
        self.full_like(0)
    }

    /// Ones of this tensor's shape and dtype, on its device.
    #[track_caller]
    pub fn ones_like(&self) -> Tensor {
        self.full_like(1)
    }

    /// `value` in this tensor's shape and dtype, on its device.
    #[track_caller]
    pub fn full_like(&self, value: impl Into<Scalar>) -> Tensor {
        let op = Op::Full(value.into());
        ok(Tensor::from_leaf_on(op, self.shape().clone(), self.dtype(), self.device()))
    }

    /// Uniform random values in `[0, 1)` of this tensor's shape and (float) dtype.
    ///
    /// # Panics
    /// If the tensor's dtype is not a float type.
    #[track_caller]
    pub fn rand_like(&self) -> Tensor {
        ok(self.random_like(RandomDist::Uniform, "rand_like"))
    }

    /// Standard normal random values of this tensor's shape and (float) dtype.
    ///
    /// # Panics
    /// If the tensor's dtype is not a float type.
    #[track_caller]
    pub fn randn_like(&self) -> Tensor {
        ok(self.random_like(RandomDist::Normal, "randn_like"))
    }

    /// Uniform `[0, 1)` values of `shape` and `dtype`, drawn where `device` computes them.
    #[track_caller]
    pub(crate) fn rand_on(shape: Shape, dtype: DType, device: crate::Device) -> Result<Tensor> {
        let key = crate::random::next_key();
        Tensor::from_leaf_on(Op::Random { dist: RandomDist::Uniform, key }, shape, dtype, device)
    }

    #[track_caller]
    fn random_like(&self, dist: RandomDist, op: &'static str) -> Result<Tensor> {
        if !self.dtype().is_float() {
            return Err(Error::dtype(
                op,
                format!(
                    "needs a float tensor, got {}; cast it first, e.g. with .float()",
                    self.dtype()
                ),
            ));
        }
        let key = crate::random::next_key();
        let op = Op::Random { dist, key };
        Tensor::from_leaf_on(op, self.shape().clone(), self.dtype(), self.device())
    }
}

fn arange_error<T: std::fmt::Display>(start: T, end: T, step: T) -> Error {
    Error::shape(
        "arange",
        format!(
            "step {step} cannot go from {start} to {end}: it must be non-zero and point toward end"
        ),
    )
}
