//! User-defined opaque ops ([`kiln_ir::Op::Custom`]): the implementations registered under
//! each definition's id, and how the executors run them.
//!
//! - On the CPU the user's function fills the output a chunk at a time, on every thread of
//!   the team, reading its inputs through strided views ([`Input`]): a transposed or sliced
//!   operand is not copied first.
//! - On a GPU the user's CUDA C kernel runs over dense inputs on the device's stream, with
//!   kiln's launch convention ([`CudaKernel`]).
//! - The reference executor runs the CPU function; under `KILN_CHECK` a CPU run is made
//!   twice over differently filled outputs (an element the function did not write, or wrote
//!   differently, is reported), and a GPU run is compared with the CPU function's result.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use kiln_ir::{Custom, DType, Element, Shape, View};

use crate::buffer::with_element_type;
use crate::{Buffer, RuntimeError};

/// A CPU implementation: fills `output` (one chunk of the result) from `inputs`. An `Err`
/// fails the run with its message.
pub type CpuFn = dyn Fn(&[Input<'_>], &mut Output<'_>) -> Result<(), String> + Send + Sync;

/// How the CPU function's output may be split across threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Split {
    /// Any run of elements (each output element is computed on its own).
    #[default]
    Elements,
    /// Whole rows of the output's last dimension.
    Rows,
    /// Whole matrices of the output's last two dimensions.
    Matrices,
    /// No split: one call fills the whole output.
    Whole,
    /// Runs of at most this many elements (at least one): for an op whose elements are
    /// costly (each a dot product), so that a short output still spreads over the threads.
    Runs(usize),
}

/// A CUDA C implementation, compiled by NVRTC with kiln's options and helpers (`k_b2f`,
/// `k_f2b`, `k_h2f`, `k_f2h` convert bf16 and f16 bits). The entry point is declared
/// `extern "C" __global__ void entry(OUT* out, const IN0* in0, ..., long long n, long long
/// inner)`: `out` holds the `n` result elements, each input is dense and row-major, `inner`
/// is the size of the result's last dimension; 16-bit floats travel as `unsigned short`,
/// bools as `unsigned char`, `i8` as `signed char`. It is launched over `n` threads (at most
/// 32 blocks of 256 per multiprocessor: loop with a grid stride), or with
/// [`CudaKernel::warp_per_element`] over `32 n`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaKernel {
    /// The source.
    pub source: String,
    /// The entry point's name.
    pub entry: String,
    /// Whether each result element takes a warp (32 threads) instead of one thread: the
    /// launch covers `32 n` threads in whole warps and the grid's stride is a multiple of
    /// 32, so a loop `for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < 32 * n;
    /// i += (long long)gridDim.x * blockDim.x)` gives the 32 lanes of a warp the same
    /// element `i >> 5` on every turn, and `__shfl_xor_sync(0xffffffff, ..)` may combine
    /// them (a product's dot product split over a warp).
    pub warp_per_element: bool,
}

/// One definition's implementations.
pub struct Implementation {
    /// The op's name.
    pub name: &'static str,
    /// The CPU implementation (also the reference for the others).
    pub cpu: Box<CpuFn>,
    /// How the CPU implementation's output may be split.
    pub split: Split,
    /// The CUDA implementation, if there is one.
    pub cuda: Option<CudaKernel>,
    /// Without a CUDA implementation: whether GPU inputs run the CPU implementation on host
    /// copies (a host step in profiles) rather than failing.
    pub host_on_gpu: bool,
    /// A simpler implementation that `KILN_CHECK` compares the CPU one against, and the
    /// relative tolerance (of the larger magnitude, at least 1).
    pub reference: Option<(Box<CpuFn>, f64)>,
}

/// The registered implementations, by definition id.
static REGISTRY: RwLock<Option<HashMap<u64, Arc<Implementation>>>> = RwLock::new(None);
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Registers `implementation` and returns the id that [`Custom::id`] names it by.
pub fn register(implementation: Implementation) -> u64 {
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let mut registry = REGISTRY.write().unwrap_or_else(PoisonError::into_inner);
    registry.get_or_insert_with(HashMap::new).insert(id, Arc::new(implementation));
    id
}

/// The implementations of `op`.
pub(crate) fn lookup(op: &Custom) -> Result<Arc<Implementation>, RuntimeError> {
    let registry = REGISTRY.read().unwrap_or_else(PoisonError::into_inner);
    registry.as_ref().and_then(|r| r.get(&op.id)).cloned().ok_or_else(|| RuntimeError::Custom {
        op: op.name,
        detail: format!("no implementation is registered under id {}", op.id),
    })
}

/// One input of a CPU implementation: a strided view of a buffer on the host.
pub struct Input<'a> {
    buffer: &'a Buffer,
    view: &'a View,
    index: usize,
}

impl<'a> Input<'a> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.buffer.dtype()
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        self.view.shape().dims()
    }

    /// The stride of each dimension, in elements of [`Input::data`] (0 for a broadcast,
    /// negative for a flipped dimension).
    pub fn strides(&self) -> &[isize] {
        self.view.strides()
    }

    /// Where element `[0, 0, ..]` is in [`Input::data`].
    pub fn offset(&self) -> usize {
        self.view.offset()
    }

    /// The position in [`Input::data`] of the element at `index` (one entry per dimension,
    /// each below its size, which is not checked).
    pub fn position(&self, index: &[usize]) -> usize {
        let from_start: isize =
            index.iter().zip(self.strides()).map(|(&i, &s)| i as isize * s).sum();
        self.offset().wrapping_add_signed(from_start)
    }

    /// The position in [`Input::data`] of the input's element number `i` in row-major
    /// order (below the input's element count, which is not checked).
    pub fn position_of(&self, mut i: usize) -> usize {
        let mut at = self.offset();
        for (&size, &stride) in self.shape().iter().zip(self.strides()).rev() {
            if size > 0 {
                at = at.wrapping_add_signed((i % size) as isize * stride);
                i /= size;
            }
        }
        at
    }

    /// The whole buffer the view reads, as elements of `T`: element `index` of the input is
    /// `data[position(index)]`.
    ///
    /// # Errors
    /// When `T` is not the input's element type.
    pub fn data<T: Element>(&self) -> Result<&'a [T], String> {
        self.buffer.as_slice::<T>().ok_or_else(|| {
            format!("input {} holds {} elements, read as {}", self.index, self.dtype(), T::DTYPE)
        })
    }

    /// The elements in row-major order, when the view is dense and row-major (no copy).
    ///
    /// # Errors
    /// As [`Input::data`].
    pub fn contiguous<T: Element>(&self) -> Result<Option<&'a [T]>, String> {
        let data = self.data::<T>()?;
        let n = self.view.shape().numel();
        Ok(self.view.is_contiguous().then(|| &data[self.offset()..self.offset() + n]))
    }

    /// The elements in row-major order, converted to `T` as Rust's `as` converts (a copy).
    pub fn to_vec<T: Element>(&self) -> Vec<T> {
        self.buffer.gather(self.view)
    }
}

/// The part of the result one call of a CPU implementation fills.
pub struct Output<'a> {
    /// The chunk's memory: `len` initialized elements of the type `element` names.
    chunk: *mut u8,
    element: TypeId,
    _chunk: PhantomData<&'a mut [u8]>,
    dtype: DType,
    shape: &'a Shape,
    start: usize,
    len: usize,
}

impl Output<'_> {
    /// The result's element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The result's dimensions (of the whole result, not of this chunk).
    pub fn shape(&self) -> &[usize] {
        self.shape.dims()
    }

    /// The row-major position of the chunk's first element in the result.
    pub fn start(&self) -> usize {
        self.start
    }

    /// The chunk's number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the chunk is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chunk's elements, to be written: element `i` is the result's element
    /// `start() + i` in row-major order.
    ///
    /// # Errors
    /// When `T` is not the result's element type.
    pub fn values<T: Element>(&mut self) -> Result<&mut [T], String> {
        if TypeId::of::<T>() != self.element {
            return Err(format!(
                "the result holds {} elements, written as {}",
                self.dtype,
                T::DTYPE
            ));
        }
        // SAFETY: `chunk` holds `len` initialized elements of `T` (its type id is `T`'s),
        // borrowed mutably for as long as `self` is.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.chunk.cast::<T>(), self.len) })
    }
}

/// Elements per task of a CPU implementation's split output.
const CHUNK: usize = 1 << 14;

/// `op`'s result computed by its CPU implementation over `inputs` (host buffers and the
/// views read of them). With `verify`, the implementation runs twice over outputs filled
/// differently first, and an element that differs is an error.
pub(crate) fn run_cpu(
    op: &Custom,
    inputs: &[(&Buffer, &View)],
    verify: bool,
) -> Result<Buffer, RuntimeError> {
    let imp = lookup(op)?;
    let views: Vec<Input<'_>> = inputs
        .iter()
        .enumerate()
        .map(|(index, &(buffer, view))| Input { buffer, view, index })
        .collect();
    let cpu = &*imp.cpu;
    let first = with_element_type!(op.dtype, T => filled::<T>(op, &imp, cpu, &views, false))?;
    if verify {
        let second = with_element_type!(op.dtype, T => filled::<T>(op, &imp, cpu, &views, true))?;
        unwritten(op, &first, &second)?;
        if let Some((reference, tolerance)) = &imp.reference {
            let want = with_element_type!(
                op.dtype, T => filled::<T>(op, &imp, &**reference, &views, false)
            )?;
            if let Some((at, got, want)) = difference(&first, &want, *tolerance) {
                return Err(RuntimeError::Custom {
                    op: op.name,
                    detail: format!(
                        "its CPU implementation's element {:?} of its {} result is {got}, its \
                         reference implementation's is {want} (checked under KILN_CHECK, \
                         tolerance {tolerance:e} of the larger magnitude)",
                        unravel(&op.shape, at),
                        op.shape,
                    ),
                });
            }
        }
    }
    Ok(first)
}

/// The result of `cpu` (one of `imp`'s CPU functions) over `inputs`, split as `imp` says,
/// each chunk first filled with zero bits (or, with `ones`, with every bit set; `true` for
/// bools).
fn filled<T: Element>(
    op: &Custom,
    imp: &Implementation,
    cpu: &CpuFn,
    inputs: &[Input<'_>],
    ones: bool,
) -> Result<Buffer, RuntimeError> {
    /// The buffer's memory shared by the threads, each writing its own chunk.
    struct Shared<T>(*mut MaybeUninit<T>);
    // SAFETY: the tasks write disjoint chunks.
    unsafe impl<T> Sync for Shared<T> {}
    let n = op.shape.numel();
    let dims = op.shape.dims();
    let trailing = |k: usize| dims[dims.len().saturating_sub(k)..].iter().product::<usize>().max(1);
    let chunk = match imp.split {
        Split::Elements => CHUNK,
        Split::Rows => (CHUNK / trailing(1)).max(1) * trailing(1),
        Split::Matrices => (CHUNK / trailing(2)).max(1) * trailing(2),
        Split::Whole => n.max(1),
        Split::Runs(run) => run.max(1),
    };
    let failure: Mutex<Option<(usize, String)>> = Mutex::new(None);
    // SAFETY: every task fills its chunk before handing it to the user's function; the
    // chunks cover the buffer.
    let buffer = unsafe {
        Buffer::from_raw_fill(T::DTYPE, n, |ptr| {
            let out = Shared(ptr.cast::<MaybeUninit<T>>());
            crate::team::for_each(n.div_ceil(chunk), &|task| {
                let out = &out;
                let start = task * chunk;
                let len = chunk.min(n - start);
                let raw = std::slice::from_raw_parts_mut(out.0.add(start), len);
                let byte = if ones && T::DTYPE != DType::Bool { 0xff } else { 0 };
                std::ptr::write_bytes(raw.as_mut_ptr(), byte, len);
                let values = &mut *(raw as *mut [MaybeUninit<T>] as *mut [T]);
                if ones && T::DTYPE == DType::Bool {
                    values.fill(T::from_scalar(kiln_ir::Scalar::Bool(true)));
                }
                let mut output = Output {
                    chunk: values.as_mut_ptr().cast::<u8>(),
                    element: TypeId::of::<T>(),
                    _chunk: PhantomData,
                    dtype: T::DTYPE,
                    shape: &op.shape,
                    start,
                    len,
                };
                let result =
                    std::panic::catch_unwind(AssertUnwindSafe(|| cpu(inputs, &mut output)));
                let message = match result {
                    Ok(Ok(())) => return,
                    Ok(Err(message)) => message,
                    Err(panic) => format!("it panicked: {}", panic_message(&*panic)),
                };
                let mut failure = failure.lock().unwrap_or_else(PoisonError::into_inner);
                if failure.as_ref().is_none_or(|(at, _)| start < *at) {
                    *failure = Some((start, message));
                }
            });
            Ok::<(), std::convert::Infallible>(())
        })
    }?
    .unwrap_or_else(|never| match never {});
    match failure.into_inner().unwrap_or_else(PoisonError::into_inner) {
        None => Ok(buffer),
        Some((start, message)) => Err(RuntimeError::Custom {
            op: op.name,
            detail: format!(
                "its CPU implementation failed on the chunk of its {} result from element \
                 {start}: {message}",
                op.shape
            ),
        }),
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// Fails if two runs of `op` over differently filled outputs differ: the first element that
/// does was not written (or depends on more than the inputs).
fn unwritten(op: &Custom, first: &Buffer, second: &Buffer) -> Result<(), RuntimeError> {
    let size = op.dtype.size_in_bytes();
    let bytes = |b: &Buffer| {
        // SAFETY: a host buffer of `len` elements of `size` bytes each.
        unsafe { std::slice::from_raw_parts(b.as_ptr(), b.len() * size) }
    };
    let differs =
        bytes(first).chunks(size).zip(bytes(second).chunks(size)).position(|(a, b)| a != b);
    let Some(at) = differs else { return Ok(()) };
    let index = unravel(&op.shape, at);
    Err(RuntimeError::Custom {
        op: op.name,
        detail: format!(
            "its CPU implementation did not write element {index:?} of its {} result (checked \
             under KILN_CHECK by running it twice over differently filled outputs: it left \
             that element as it found it, or computed it from something other than its \
             inputs); every element of `Output::values` must be written",
            op.shape
        ),
    })
}

/// The multi-index of row-major position `at` in `shape`.
pub(crate) fn unravel(shape: &Shape, mut at: usize) -> Vec<usize> {
    let mut index = vec![0; shape.rank()];
    for (d, &size) in shape.dims().iter().enumerate().rev() {
        if size > 0 {
            index[d] = at % size;
            at /= size;
        }
    }
    index
}

/// Fails if `got` (a GPU implementation's result, on the host) differs from `want` (the CPU
/// implementation's) by more than the dtype's tolerance, relative to the larger magnitude.
pub(crate) fn compare(
    op: &Custom,
    got: &Buffer,
    want: &Buffer,
    scale: f64,
) -> Result<(), RuntimeError> {
    let tolerance = scale * crate::exec::check_tolerance(op.dtype);
    let Some((at, got, want)) = difference(got, want, tolerance) else { return Ok(()) };
    Err(RuntimeError::Custom {
        op: op.name,
        detail: format!(
            "its CUDA implementation's element {:?} of its {} result is {got}, its CPU \
             implementation's is {want} (checked under KILN_CHECK: the CPU implementation is \
             the reference)",
            unravel(&op.shape, at),
            op.shape,
        ),
    })
}

/// The first element where `got` and `want` differ by more than `tolerance` of the larger
/// magnitude (at least 1), with both values; NaNs in both places agree.
fn difference(got: &Buffer, want: &Buffer, tolerance: f64) -> Option<(usize, f64, f64)> {
    let all = View::contiguous(Shape::from([got.len()]));
    let (g, w) = (got.gather::<f64>(&all), want.gather::<f64>(&all));
    let bad = g.iter().zip(&w).position(|(&a, &b)| {
        let same_nan = a.is_nan() && b.is_nan();
        !(same_nan || a == b || (a - b).abs() <= tolerance * a.abs().max(b.abs()).max(1.0))
    });
    bad.map(|at| (at, g[at], w[at]))
}
