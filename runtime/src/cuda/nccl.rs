//! NCCL, loaded at run time like cuBLAS: collectives on device memory. Each communicator
//! queues its collectives on a stream of its own: the stream waits for the device's stream
//! (where kiln's kernels run) to reach the collective, and the device's stream waits for the
//! collective only where a step reads its result ([`Queued::land`]), so kernels queued in
//! between run while it communicates. None of this waits on the host.
//! A group spans one device per rank; the ranks agree on a 128-byte id that rank 0 draws
//! ([`nccl_unique_id`]) and sends to the others by some other channel (kiln uses MPI).

use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{CudaEvent, CudaStream};
use cudarc::nccl::{result, sys};
use kiln_ir::{Collective, CollectiveKind, CollectiveReduce, DType};

use super::Gpu;
use crate::collective::{Engine, register_engine, result_len};
use crate::{Buffer, Device, RuntimeError};

/// One rank's NCCL communicator on one device.
pub(crate) struct Nccl {
    comm: Mutex<Comm>,
    gpu: &'static Gpu,
    /// Where this communicator's collectives run, all of them, in the order issued.
    stream: Arc<CudaStream>,
    rank: usize,
    world: usize,
}

/// A collective queued on its communicator's stream.
pub(crate) struct Queued {
    out: Buffer,
    /// Kept until the device's stream is ordered after the collective: freed earlier, its
    /// memory could go to a kernel while NCCL still reads it.
    input: Buffer,
    done: CudaEvent,
    gpu: &'static Gpu,
}

impl Queued {
    /// Orders the device's stream after the collective (work queued from now on sees its
    /// result) and gives the result.
    ///
    /// # Errors
    /// [`RuntimeError::Cuda`] when the driver refuses the wait.
    pub(crate) fn land(self) -> Result<Buffer, RuntimeError> {
        self.gpu.bind()?;
        self.gpu.stream.wait(&self.done).map_err(|e| self.gpu.error("waiting for NCCL", e))?;
        drop(self.input);
        Ok(self.out)
    }
}

struct Comm(sys::ncclComm_t);

// SAFETY: an NCCL communicator may be used from any thread; every use goes through the
// mutex, so calls on it never overlap.
unsafe impl Send for Comm {}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: the communicator was created by `ncclCommInitRank` and is destroyed once.
        let _ = unsafe { result::comm_destroy(self.0) };
    }
}

fn unavailable(detail: &str) -> RuntimeError {
    RuntimeError::Collective { op: "nccl", detail: detail.to_string() }
}

/// Fails unless the NCCL library can be loaded (cudarc's entry points panic without it).
fn library() -> Result<(), RuntimeError> {
    // SAFETY: only looks the library up with `dlopen`.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(unavailable(
            "the NCCL library could not be loaded (kiln looks for libnccl.so on the loader's \
             path); install it (Debian: libnccl-dev; pip: nvidia-nccl-cu13, whose lib folder \
             holds only libnccl.so.2: add a libnccl.so link to it there) and put its folder on \
             LD_LIBRARY_PATH",
        ))
    }
}

fn failed(what: &str, e: &result::NcclError) -> RuntimeError {
    RuntimeError::Collective { op: "nccl", detail: format!("{what} failed: {:?}", e.0) }
}

/// The NCCL library's version as `(major, minor, patch)`.
///
/// # Errors
/// [`RuntimeError::Collective`] when the library is missing.
pub fn nccl_version() -> Result<(u32, u32, u32), RuntimeError> {
    library()?;
    let v = result::get_nccl_version().map_err(|e| failed("ncclGetVersion", &e))?;
    let v = u32::try_from(v).unwrap_or(0);
    // NCCL >= 2.9 encodes the version as major * 10000 + minor * 100 + patch.
    Ok((v / 10000, (v / 100) % 100, v % 100))
}

/// A new group id, drawn on one rank and handed to every rank of the group.
///
/// # Errors
/// [`RuntimeError::Collective`] when the library is missing or fails.
pub fn nccl_unique_id() -> Result<[u8; 128], RuntimeError> {
    library()?;
    let id = result::get_uniqueid().map_err(|e| failed("ncclGetUniqueId", &e))?;
    Ok(id.internal.map(|c| c as u8))
}

/// Joins rank `rank` of a `world`-rank NCCL group on CUDA device `ordinal`, returning the
/// group's number for [`kiln_ir::Collective::group`]. Every rank calls this with the same id.
///
/// # Errors
/// [`RuntimeError::BackendUnavailable`] without the device, [`RuntimeError::Collective`]
/// when NCCL is missing or fails.
pub fn nccl_group(
    ordinal: usize,
    rank: usize,
    world: usize,
    id: &[u8; 128],
) -> Result<u32, RuntimeError> {
    let gpu = super::gpu(ordinal)?;
    library()?;
    gpu.bind()?;
    let (ranks, me) = (to_int(world)?, to_int(rank)?);
    let id = sys::ncclUniqueId { internal: id.map(|b| b as std::ffi::c_char) };
    let mut comm: sys::ncclComm_t = std::ptr::null_mut();
    // SAFETY: `comm` is a valid place for the new communicator; the id came from
    // `ncclGetUniqueId` on one rank of this group.
    unsafe { result::comm_init_rank(&raw mut comm, ranks, id, me) }
        .map_err(|e| failed("ncclCommInitRank", &e))?;
    let stream = gpu.stream.fork().map_err(|e| gpu.error("creating NCCL's stream", e))?;
    let nccl = Nccl { comm: Mutex::new(Comm(comm)), gpu, stream, rank, world };
    Ok(register_engine(Engine::Nccl(Arc::new(nccl))))
}

fn to_int(n: usize) -> Result<std::ffi::c_int, RuntimeError> {
    std::ffi::c_int::try_from(n).map_err(|_| unavailable("too many ranks for NCCL"))
}

impl Nccl {
    /// Runs `c` on `input`, a buffer on this communicator's device: the device's stream
    /// continues after it.
    pub(crate) fn run(&self, c: &Collective, input: &Buffer) -> Result<Buffer, RuntimeError> {
        self.start(c, input.clone())?.land()
    }

    /// Queues `c` on `input` (a buffer on this communicator's device) on the communicator's
    /// stream, after the work queued so far on the device's stream.
    pub(crate) fn start(&self, c: &Collective, input: Buffer) -> Result<Queued, RuntimeError> {
        let op = c.name();
        if input.device() != self.gpu.device() {
            return Err(RuntimeError::Collective {
                op,
                detail: format!(
                    "the group's NCCL communicator is on {}, the tensor on {}; move it there",
                    self.gpu.device(),
                    input.device()
                ),
            });
        }
        if c.world as usize != self.world {
            return Err(RuntimeError::Collective {
                op,
                detail: format!(
                    "the graph expects {} ranks, the group has {}",
                    c.world, self.world
                ),
            });
        }
        let dtype = input.dtype();
        let out_len = result_len(c, input.len());
        let out = Buffer::on_gpu(self.gpu, dtype, out_len)?;
        self.gpu.bind()?;
        let send = input.device_ptr(self.gpu)? as *const c_void;
        let recv = out.device_ptr(self.gpu)? as *mut c_void;
        let failed = |e| self.gpu.error("ordering NCCL's stream", e);
        // After everything queued so far: the input's producer, and every earlier user of
        // the output's (cached) memory.
        self.stream.join(&self.gpu.stream).map_err(failed)?;
        let stream: sys::cudaStream_t = self.stream.cu_stream().cast();
        let ty = data_type(dtype);
        let comm = self.comm.lock().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: `send` holds `input.len()` elements of `dtype` and `recv` room for the
        // result (`result_len`), both on this communicator's device; the stream runs after
        // their earlier uses, and `Queued` keeps both alive until the device's stream is
        // ordered after it.
        let queued = unsafe {
            match c.kind {
                CollectiveKind::AllReduce(r) => result::all_reduce(
                    send,
                    recv,
                    input.len(),
                    ty,
                    red_op(dtype, r),
                    comm.0,
                    stream,
                ),
                CollectiveKind::Broadcast { root } => {
                    result::broadcast(send, recv, input.len(), ty, root as i32, comm.0, stream)
                }
                CollectiveKind::AllGather => {
                    result::all_gather(send, recv, input.len(), ty, comm.0, stream)
                }
                CollectiveKind::ReduceScatter(r) => result::reduce_scatter(
                    send,
                    recv,
                    out_len,
                    ty,
                    red_op(dtype, r),
                    comm.0,
                    stream,
                ),
            }
        };
        queued.map_err(|e| RuntimeError::Collective {
            op,
            detail: format!("NCCL failed on rank {} of {}: {:?}", self.rank, self.world, e.0),
        })?;
        let done = self.stream.record_event(None).map_err(failed)?;
        Ok(Queued { out, input, done, gpu: self.gpu })
    }

    /// Every rank's stream has reached this point: an all-reduce of one element, awaited.
    pub(crate) fn barrier(&self) -> Result<(), RuntimeError> {
        let one = Buffer::from_slice(&[1f32])?.to_device(Device::Cuda(self.gpu.ordinal))?;
        let c = Collective {
            kind: CollectiveKind::AllReduce(CollectiveReduce::Sum),
            group: 0,
            world: u32::try_from(self.world).unwrap_or(u32::MAX),
        };
        self.run(&c, &one)?;
        self.gpu.synchronize()
    }
}

/// NCCL's element type for a dtype (`bool` travels as bytes).
fn data_type(dtype: DType) -> sys::ncclDataType_t {
    use sys::ncclDataType_t as T;
    match dtype {
        DType::F32 => T::ncclFloat32,
        DType::F64 => T::ncclFloat64,
        DType::F16 => T::ncclFloat16,
        DType::BF16 => T::ncclBfloat16,
        DType::I64 => T::ncclInt64,
        DType::I32 => T::ncclInt32,
        DType::I8 => T::ncclInt8,
        DType::U8 | DType::Bool => T::ncclUint8,
    }
}

/// NCCL's reduction (a mean is NCCL's own average; on `bool`, sum is or and product and).
fn red_op(dtype: DType, r: CollectiveReduce) -> sys::ncclRedOp_t {
    use sys::ncclRedOp_t as R;
    match (dtype, r) {
        (DType::Bool, CollectiveReduce::Sum) | (_, CollectiveReduce::Max) => R::ncclMax,
        (DType::Bool, CollectiveReduce::Product) | (_, CollectiveReduce::Min) => R::ncclMin,
        (_, CollectiveReduce::Sum) => R::ncclSum,
        (_, CollectiveReduce::Product) => R::ncclProd,
        (_, CollectiveReduce::Mean) => R::ncclAvg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtypes_and_reductions_map_to_nccls() {
        use sys::{ncclDataType_t as T, ncclRedOp_t as R};
        assert_eq!(data_type(DType::BF16), T::ncclBfloat16);
        assert_eq!(data_type(DType::Bool), T::ncclUint8);
        assert_eq!(red_op(DType::Bool, CollectiveReduce::Sum), R::ncclMax);
        assert_eq!(red_op(DType::F32, CollectiveReduce::Sum), R::ncclSum);
        assert_eq!(red_op(DType::F16, CollectiveReduce::Mean), R::ncclAvg);
        assert_eq!(red_op(DType::I64, CollectiveReduce::Product), R::ncclProd);
    }
}
