//! The MPI engine (feature `mpi`): kiln's own duplicate of `MPI_COMM_WORLD`, with errors
//! returned rather than aborting the job, and every call serialized by a lock.

use std::ffi::{c_char, c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use kiln_ir::{CollectiveKind, CollectiveReduce, DType};
use mpi::ffi;

use crate::RuntimeError;
use crate::collective::Communicator;

/// MPI, initialized once per process (by kiln, or before it by the program).
pub struct World {
    comm: ffi::MPI_Comm,
    rank: usize,
    size: usize,
    lock: Mutex<()>,
}

// SAFETY: an MPI communicator handle may be used from any thread once MPI runs with
// `MPI_THREAD_SERIALIZED` or better (checked in `join`); every call holds `lock`, so no two
// overlap.
unsafe impl Send for World {}
// SAFETY: as above.
unsafe impl Sync for World {}

static WORLD: OnceLock<std::result::Result<Arc<World>, String>> = OnceLock::new();

unsafe extern "C" {
    fn atexit(callback: extern "C" fn()) -> c_int;
}

/// Finalizes MPI when the process exits, if kiln initialized it (`mpirun` reports a rank
/// that exits without finalizing as a failure).
extern "C" fn finalize() {
    let mut done: c_int = 0;
    // SAFETY: plain queries and the final call, made once at exit from the main thread.
    unsafe {
        ffi::MPI_Finalized(&raw mut done);
        if done == 0 {
            ffi::MPI_Finalize();
        }
    }
}

fn mpi_error(what: &str, code: c_int) -> String {
    let mut text = [0 as c_char; 512];
    let mut len: c_int = 0;
    // SAFETY: `text` has room for MPI_MAX_ERROR_STRING (256 in Open MPI) characters.
    unsafe { ffi::MPI_Error_string(code, text.as_mut_ptr(), &raw mut len) };
    let len = usize::try_from(len).unwrap_or(0).min(text.len());
    let message: String = text[..len].iter().map(|&c| c as u8 as char).collect();
    format!("{what} failed: {message} (error {code})")
}

fn check(what: &str, code: c_int) -> std::result::Result<(), String> {
    // MPI_SUCCESS is 0 in every implementation.
    if code == 0 { Ok(()) } else { Err(mpi_error(what, code)) }
}

impl World {
    /// The process's MPI world, initializing MPI on first use (finalized at exit when kiln
    /// initialized it).
    ///
    /// # Errors
    /// [`RuntimeError::Collective`] with MPI's message when it cannot start.
    pub fn join() -> Result<Arc<World>, RuntimeError> {
        WORLD
            .get_or_init(|| World::init().map(Arc::new))
            .clone()
            .map_err(|detail| RuntimeError::Collective { op: "mpi", detail })
    }

    fn init() -> std::result::Result<World, String> {
        let mut initialized: c_int = 0;
        // SAFETY: MPI's documented start-up sequence; `MPI_Initialized` may be called at any
        // time, `MPI_Init_thread` only once (guarded by the `OnceLock` and the flag).
        unsafe {
            check("MPI_Initialized", ffi::MPI_Initialized(&raw mut initialized))?;
            let mut provided: c_int = 0;
            if initialized == 0 {
                let (mut argc, mut argv) = (0, std::ptr::null_mut());
                check(
                    "MPI_Init_thread",
                    ffi::MPI_Init_thread(
                        &raw mut argc,
                        &raw mut argv,
                        ffi::RSMPI_THREAD_MULTIPLE,
                        &raw mut provided,
                    ),
                )?;
                atexit(finalize);
            } else {
                check("MPI_Query_thread", ffi::MPI_Query_thread(&raw mut provided))?;
            }
            if provided < ffi::RSMPI_THREAD_SERIALIZED {
                return Err(format!(
                    "the MPI library gives thread level {provided}, and kiln calls it from \
                     whichever thread materializes a tensor: it needs MPI_THREAD_SERIALIZED"
                ));
            }
            let mut comm = ffi::RSMPI_COMM_NULL;
            check("MPI_Comm_dup", ffi::MPI_Comm_dup(ffi::RSMPI_COMM_WORLD, &raw mut comm))?;
            check(
                "MPI_Comm_set_errhandler",
                ffi::MPI_Comm_set_errhandler(comm, ffi::RSMPI_ERRORS_RETURN),
            )?;
            let (mut rank, mut size) = (0, 0);
            check("MPI_Comm_rank", ffi::MPI_Comm_rank(comm, &raw mut rank))?;
            check("MPI_Comm_size", ffi::MPI_Comm_size(comm, &raw mut size))?;
            Ok(World {
                comm,
                rank: usize::try_from(rank).unwrap_or(0),
                size: usize::try_from(size).unwrap_or(1),
                lock: Mutex::new(()),
            })
        }
    }

    /// Broadcasts raw bytes from `root` (NCCL's id).
    ///
    /// # Errors
    /// [`RuntimeError::Collective`] with MPI's message.
    pub fn broadcast_bytes(&self, bytes: &mut [u8], root: usize) -> Result<(), RuntimeError> {
        let mut out = vec![0u8; bytes.len()];
        let kind = CollectiveKind::Broadcast { root: u32::try_from(root).unwrap_or(0) };
        self.run(kind, DType::U8, bytes, &mut out)
            .map_err(|detail| RuntimeError::Collective { op: "broadcast", detail })?;
        bytes.copy_from_slice(&out);
        Ok(())
    }
}

fn datatype(dtype: DType) -> std::result::Result<ffi::MPI_Datatype, String> {
    // SAFETY: reads of MPI's predefined handles, valid after initialization.
    unsafe {
        Ok(match dtype {
            DType::F32 => ffi::RSMPI_FLOAT,
            DType::F64 => ffi::RSMPI_DOUBLE,
            DType::I32 => ffi::RSMPI_INT32_T,
            DType::I64 => ffi::RSMPI_INT64_T,
            DType::I8 => ffi::RSMPI_INT8_T,
            DType::U8 => ffi::RSMPI_UINT8_T,
            other => return Err(format!("no MPI type for {other}")),
        })
    }
}

fn operation(r: CollectiveReduce) -> ffi::MPI_Op {
    // SAFETY: reads of MPI's predefined handles, valid after initialization.
    unsafe {
        match r {
            CollectiveReduce::Sum | CollectiveReduce::Mean => ffi::RSMPI_SUM,
            CollectiveReduce::Product => ffi::RSMPI_PROD,
            CollectiveReduce::Max => ffi::RSMPI_MAX,
            CollectiveReduce::Min => ffi::RSMPI_MIN,
        }
    }
}

impl Communicator for World {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.size
    }

    fn engine(&self) -> &'static str {
        "mpi"
    }

    fn run(
        &self,
        kind: CollectiveKind,
        dtype: DType,
        input: &[u8],
        output: &mut [u8],
    ) -> std::result::Result<(), String> {
        let ty = datatype(dtype)?;
        let count = |bytes: usize| {
            c_int::try_from(bytes / dtype.size_in_bytes()).map_err(|_| {
                "MPI counts elements in a C int: split tensors of more than 2^31 elements"
                    .to_string()
            })
        };
        let (send, recv) = (input.as_ptr().cast::<c_void>(), output.as_mut_ptr().cast::<c_void>());
        let _serial = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: `input` and `output` hold the counts passed (the runtime sizes `output` for
        // the collective's result), of the MPI type matching `dtype`.
        unsafe {
            match kind {
                CollectiveKind::AllReduce(r) => check(
                    "MPI_Allreduce",
                    ffi::MPI_Allreduce(
                        send,
                        recv,
                        count(input.len())?,
                        ty,
                        operation(r),
                        self.comm,
                    ),
                ),
                CollectiveKind::Broadcast { root } => {
                    output.copy_from_slice(input);
                    let root = c_int::try_from(root).unwrap_or(0);
                    let n = count(output.len())?;
                    let recv = output.as_mut_ptr().cast::<c_void>();
                    check("MPI_Bcast", ffi::MPI_Bcast(recv, n, ty, root, self.comm))
                }
                CollectiveKind::AllGather => {
                    let n = count(input.len())?;
                    check("MPI_Allgather", ffi::MPI_Allgather(send, n, ty, recv, n, ty, self.comm))
                }
                CollectiveKind::ReduceScatter(r) => {
                    let n = count(output.len())?;
                    let op = operation(r);
                    check(
                        "MPI_Reduce_scatter_block",
                        ffi::MPI_Reduce_scatter_block(send, recv, n, ty, op, self.comm),
                    )
                }
            }
        }
    }

    fn barrier(&self) -> std::result::Result<(), String> {
        let _serial = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: a barrier on kiln's communicator.
        check("MPI_Barrier", unsafe { ffi::MPI_Barrier(self.comm) })
    }
}
