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

/// The elements of a dense host buffer as `T`'s native bytes.
fn bytes_of<T: Element>(buffer: &Buffer) -> Vec<u8> {
    let all = View::contiguous(Shape::from([buffer.len()]));
    buffer.gather::<T>(&all).iter().flat_map(|&v| pod_bytes(v)).collect()
}

pub(super) fn pod_bytes<T: Element>(v: T) -> Vec<u8> {
    let size = std::mem::size_of::<T>();
    let mut out = vec![0u8; size];
    // SAFETY: `T` is one of kiln's element types, plain numbers without padding; `out` has
    // room for exactly one of them.
    unsafe { std::ptr::copy_nonoverlapping((&raw const v).cast::<u8>(), out.as_mut_ptr(), size) };
    out
}

/// Native bytes back to elements of `T`.
pub(super) fn from_bytes<T: Element>(bytes: &[u8]) -> Vec<T> {
    let size = std::mem::size_of::<T>();
    bytes
        .chunks_exact(size)
        // SAFETY: each chunk holds the bytes of one `T`, written by `pod_bytes` or by an
        // engine moving values of the same type; every bit pattern of these types is valid.
        .map(|c| unsafe { c.as_ptr().cast::<T>().read_unaligned() })
        .collect()
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
    let send = match wire_dtype {
        DType::F32 => bytes_of::<f32>(input),
        DType::F64 => bytes_of::<f64>(input),
        DType::I32 => bytes_of::<i32>(input),
        DType::I64 => bytes_of::<i64>(input),
        _ => bytes_of::<u8>(input),
    };
    let mut recv = vec![0u8; out_len * wire_dtype.size_in_bytes()];
    communicator.run(kind, wire_dtype, &send, &mut recv).map_err(|e| {
        failed(format!(
            "the {} engine failed (rank {}): {e}",
            communicator.engine(),
            communicator.rank()
        ))
    })?;
    let mean = c.reduce() == Some(CollectiveReduce::Mean);
    let world = f64::from(c.world);
    macro_rules! back {
        ($wire:ty) => {{
            let values = from_bytes::<$wire>(&recv);
            crate::buffer::with_element_type!(dtype, T => Buffer::from_iter::<T>(
                out_len,
                values.into_iter().map(|v| {
                    let s = v.to_scalar();
                    T::from_scalar(if mean { kiln_ir::Scalar::F64(s.to_f64() / world) } else { s })
                }),
            ))
        }};
    }
    match wire_dtype {
        DType::F32 => back!(f32),
        DType::F64 => back!(f64),
        DType::I32 => back!(i32),
        DType::I64 => back!(i64),
        _ => back!(u8),
    }
}

/// The number of elements a collective's result has for an input of `len` elements.
pub(crate) fn result_len(c: &Collective, len: usize) -> usize {
    match c.kind {
        CollectiveKind::AllGather => len * c.world as usize,
        CollectiveKind::ReduceScatter(_) => len / c.world as usize,
        _ => len,
    }
}
