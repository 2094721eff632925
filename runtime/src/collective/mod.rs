//! Process groups and the step that runs a collective node.
//!
//! A collective in a graph names its group by number ([`kiln_ir::Collective::group`]); the
//! group's [`Communicator`] is registered here once, when the group is created. Engines move
//! host memory in five element types (`f32`, `f64`, `i32`, `i64`, `u8`) and four reductions
//! (sum, product, max, min); everything else is this module's work: 16-bit floats travel as
//! `f32` (summed in `f32`, rounded once), `bool` as `u8` (sum as or, product as and, as
//! PyTorch does), and a mean is a sum divided by the number of ranks. NCCL groups work on
//! device memory instead ([`crate::cuda`]).

mod local;
mod queue;

use std::sync::{Arc, PoisonError, RwLock};

use kiln_ir::{Collective, CollectiveKind, CollectiveReduce, DType, Element, Shape, View};

pub use local::LocalGroup;
use queue::HostEngine;
pub(crate) use queue::Pending;

use crate::{Buffer, RuntimeError};

/// A communication engine for one process group: how a collective reaches the other ranks.
///
/// Every rank must run the same collectives in the same order (the engine's rule, as with
/// MPI and NCCL); kiln plans a graph the same way on every rank, so ranks that record the
/// same program issue the same sequence.
pub trait Communicator: Send + Sync {
    /// This process's rank, `0..world()`.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn world(&self) -> usize;
    /// The engine's name for messages (`"mpi"`, `"local"`).
    fn engine(&self) -> &'static str;
    /// Runs one collective over host memory. `dtype` is `F32`, `F64`, `I32`, `I64` or `U8`;
    /// `input` holds this rank's elements (native byte order) and `output` has room for the
    /// result ([`CollectiveKind`] says its size). Reductions are `Sum`, `Product`, `Max` or
    /// `Min`, never `Mean`.
    ///
    /// # Errors
    /// The engine's message.
    fn run(
        &self,
        kind: CollectiveKind,
        dtype: DType,
        input: &[u8],
        output: &mut [u8],
    ) -> Result<(), String>;
    /// Waits until every rank has reached the barrier.
    ///
    /// # Errors
    /// The engine's message.
    fn barrier(&self) -> Result<(), String>;
}

/// A registered group's engine.
#[derive(Clone)]
pub(crate) enum Engine {
    /// Host memory through a [`Communicator`], on the group's communication thread.
    Host(Arc<HostEngine>),
    /// Device memory through NCCL.
    Nccl(Arc<crate::cuda::Nccl>),
}

static GROUPS: RwLock<Vec<Engine>> = RwLock::new(Vec::new());

/// Registers a group's engine and returns the number graphs name it by.
pub fn register(communicator: Arc<dyn Communicator>) -> u32 {
    register_engine(Engine::Host(Arc::new(HostEngine::new(communicator))))
}

pub(crate) fn register_engine(engine: Engine) -> u32 {
    let mut groups = GROUPS.write().unwrap_or_else(PoisonError::into_inner);
    groups.push(engine);
    u32::try_from(groups.len() - 1).unwrap_or(u32::MAX)
}

pub(crate) fn engine(group: u32) -> Result<Engine, RuntimeError> {
    let groups = GROUPS.read().unwrap_or_else(PoisonError::into_inner);
    groups.get(group as usize).cloned().ok_or_else(|| RuntimeError::Collective {
        op: "collective",
        detail: format!("process group {group} was never created in this process"),
    })
}

/// Waits until every rank of `group` has reached the barrier.
///
/// # Errors
/// [`RuntimeError::Collective`] for an unknown group or the engine's failure.
pub fn barrier(group: u32) -> Result<(), RuntimeError> {
    let failed =
        |detail: String| RuntimeError::Collective { op: "barrier", detail: detail.clone() };
    match engine(group)? {
        Engine::Host(h) => h.submit("barrier", move |c| c.barrier().map_err(failed))?.wait(),
        Engine::Nccl(n) => n.barrier(),
    }
}

/// How a dtype travels through a host engine, and what a reduction becomes there.
fn wire(dtype: DType, kind: CollectiveKind) -> (DType, CollectiveKind) {
    let on_wire = |r: CollectiveReduce| match (dtype, r) {
        (DType::Bool, CollectiveReduce::Sum) => CollectiveReduce::Max,
        (DType::Bool, CollectiveReduce::Product) => CollectiveReduce::Min,
        (_, CollectiveReduce::Mean) => CollectiveReduce::Sum,
        (_, r) => r,
    };
    let kind = match kind {
        CollectiveKind::AllReduce(r) => CollectiveKind::AllReduce(on_wire(r)),
        CollectiveKind::ReduceScatter(r) => CollectiveKind::ReduceScatter(on_wire(r)),
        other => other,
    };
    let dtype = match dtype {
        DType::F16 | DType::BF16 => DType::F32,
        DType::Bool => DType::U8,
        other => other,
    };
    (dtype, kind)
}

/// The native bytes of `values`.
pub(super) fn as_bytes<T: Element>(values: &[T]) -> &[u8] {
    // SAFETY: kiln's element types are plain numbers without padding; the bytes cover
    // exactly the slice's memory and live as long as it.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), size_of_val(values)) }
}

/// The native bytes of `values`, writable.
fn as_bytes_mut<T: Element>(values: &mut [T]) -> &mut [u8] {
    // SAFETY: as `as_bytes`; every bit pattern is a valid value of the engines' wire types
    // (f32, f64, i32, i64, u8), the only types written through this.
    unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<u8>(), size_of_val(values)) }
}

/// Native bytes back to elements of `T`.
pub(super) fn from_bytes<T: Element>(bytes: &[u8]) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    bytes
        .chunks_exact(size)
        // SAFETY: each chunk holds the bytes of one `T`, written by an engine moving values
        // of the same type; every bit pattern of the wire types is valid.
        .map(|c| unsafe { c.as_ptr().cast::<T>().read_unaligned() })
        .collect()
}

/// A dense host buffer's elements as another dtype (16-bit floats to and from `f32`, `bool`
/// to and from `u8`).
fn convert(buffer: &Buffer, to: DType) -> Result<Buffer, RuntimeError> {
    let all = View::contiguous(Shape::from([buffer.len()]));
    crate::buffer::with_element_type!(buffer.dtype(), S => {
        let values = buffer.gather::<S>(&all);
        crate::buffer::with_element_type!(to, W => Buffer::from_iter::<W>(
            values.len(),
            values.iter().map(|v| W::from_scalar(v.to_scalar())),
        ))
    })
}

/// Runs collective `c` on `input` (a dense host buffer), giving a buffer of `out_len`
/// elements of the input's dtype.
pub(crate) fn eval(c: &Collective, input: &Buffer, out_len: usize) -> Result<Buffer, RuntimeError> {
    start(c, input.clone(), out_len)?.wait()
}

/// Issues collective `c` on `input` (a dense host buffer) to its group's communication
/// thread, behind the group's earlier collectives; the result (`out_len` elements of the
/// input's dtype) arrives through the handle while the caller goes on.
///
/// # Errors
/// [`RuntimeError::Collective`] for an unknown or NCCL group, or a group of another size
/// than the graph's. The engine's own failure comes from [`Pending::wait`].
pub(crate) fn start(
    c: &Collective,
    input: Buffer,
    out_len: usize,
) -> Result<Pending<Buffer>, RuntimeError> {
    let c = *c;
    let failed = |detail: String| RuntimeError::Collective { op: c.name(), detail };
    let host = match engine(c.group)? {
        Engine::Host(h) => h,
        Engine::Nccl(_) => {
            return Err(failed(format!(
                "this group runs on NCCL, which works on CUDA tensors; move the tensor to \
                 the group's device first (it is on {})",
                input.device()
            )));
        }
    };
    let world = host.communicator.world();
    if world != c.world as usize {
        return Err(failed(format!(
            "the graph expects {} ranks, group {} has {world}",
            c.world, c.group
        )));
    }
    host.submit(c.name(), move |communicator| run_host(&c, communicator, &input, out_len))
}

/// Runs `c` through a host engine: to its wire type, across the ranks, and back.
fn run_host(
    c: &Collective,
    communicator: &dyn Communicator,
    input: &Buffer,
    out_len: usize,
) -> Result<Buffer, RuntimeError> {
    let failed = |detail: String| RuntimeError::Collective { op: c.name(), detail };
    let dtype = input.dtype();
    let (wire_dtype, kind) = wire(dtype, c.kind);
    // The engines' own types travel straight from and into kiln's buffers.
    let converted;
    let send = if wire_dtype == dtype {
        input
    } else {
        converted = convert(input, wire_dtype)?;
        &converted
    };
    let mean = c.reduce() == Some(CollectiveReduce::Mean);
    let mut ran = Ok(());
    macro_rules! through {
        ($wire:ty) => {{
            let values = send.as_slice::<$wire>().ok_or_else(|| {
                failed(format!("a {} buffer that is not in host memory", send.dtype()))
            })?;
            Buffer::zeroed_with::<$wire>(out_len, |out| {
                ran = communicator.run(kind, wire_dtype, as_bytes(values), as_bytes_mut(out));
                if mean {
                    let world = c.world as $wire;
                    out.iter_mut().for_each(|v| *v /= world);
                }
            })?
        }};
    }
    let out = match wire_dtype {
        DType::F32 => through!(f32),
        DType::F64 => through!(f64),
        DType::I32 => through!(i32),
        DType::I64 => through!(i64),
        DType::I8 => through!(i8),
        DType::U8 => through!(u8),
        other => {
            return Err(failed(format!(
                "{other} does not travel: the wire carries f32, f64 and integers"
            )));
        }
    };
    ran.map_err(|e| {
        failed(format!(
            "the {} engine failed (rank {}): {e}",
            communicator.engine(),
            communicator.rank()
        ))
    })?;
    if wire_dtype == dtype { Ok(out) } else { convert(&out, dtype) }
}

/// The number of elements a collective's result has for an input of `len` elements.
pub(crate) fn result_len(c: &Collective, len: usize) -> usize {
    match c.kind {
        CollectiveKind::AllGather => len * c.world as usize,
        CollectiveKind::ReduceScatter(_) => len / c.world as usize,
        _ => len,
    }
}
