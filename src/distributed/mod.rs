//! Data-parallel training across processes: process groups and collectives.
//!
//! A [`ProcessGroup`] is a set of ranks that run the same program on different data. Its
//! collectives ([`ProcessGroup::all_reduce`], [`ProcessGroup::broadcast`],
//! [`ProcessGroup::all_gather`], [`ProcessGroup::reduce_scatter`]) are **graph ops**: like
//! every kiln op they record a node and return at once, and the communication happens when
//! the result is materialized, planned together with the computation around it: a
//! collective is issued as soon as its input is computed and communicates (on the group's
//! own thread, or NCCL's own stream) while the steps that do not read its result run —
//! inside
//! [`crate::compile()`] too, so a compiled step holds forward, backward, the gradient
//! all-reduce and the update. They are functional (they return a new tensor, as PyTorch's
//! `torch.distributed._functional_collectives` do); assign the result where you want it.
//!
//! Engines:
//! - [`Backend::Mpi`] (cargo feature `mpi`): CPU tensors through MPI (the `mpi` crate, over
//!   the system's MPI library, Open MPI 4.1 on Debian). Start the ranks with `mpirun`;
//!   CUDA tensors go through host copies.
//! - [`Backend::Nccl`]: CUDA tensors through NCCL, loaded at run time from `libnccl.so.2`
//!   (the `nvidia-nccl-cu13` wheel has it). Each rank uses the GPU of its local rank. Ranks
//!   agree on NCCL's id through MPI, so more than one rank needs the `mpi` feature.
//! - [`Backend::Local`]: ranks that are threads of one process ([`ProcessGroup::local`]), for
//!   tests and for trying distributed code without an MPI installation; a world of one
//!   ([`ProcessGroup::single`]) makes every collective the identity.
//!
//! Every rank must materialize the same collectives in the same order, as with any MPI or
//! NCCL program: record the same program on every rank, and read what you all-reduce on
//! every rank (a rank that never reads a collective's result never runs it, and the others
//! wait for it).
//!
//! ```
//! use kiln::distributed::{ProcessGroup, ReduceOp};
//! use kiln::Tensor;
//! // Two ranks as threads: each contributes its rank + 1.
//! let handles: Vec<_> = ProcessGroup::local(2)
//!     .into_iter()
//!     .map(|group| {
//!         std::thread::spawn(move || {
//!             let mine = Tensor::full([3], group.rank() as f64 + 1.0);
//!             group.all_reduce(&mine, ReduceOp::Sum).to_vec::<f32>()
//!         })
//!     })
//!     .collect();
//! for h in handles {
//!     assert_eq!(h.join().unwrap(), vec![3.0; 3]);
//! }
//! ```

mod sampler;

use std::sync::Arc;

use kiln_ir::{Collective, Op};
use kiln_runtime::collective::{self as engine, LocalGroup};

pub use kiln_ir::CollectiveKind;
pub use kiln_ir::CollectiveReduce as ReduceOp;
pub use kiln_runtime::collective::Communicator;
pub use sampler::DistributedSampler;

use crate::error::ok;
use crate::{Device, Error, Result, Tensor};

/// Which engine a process group communicates through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// MPI, on CPU tensors (cargo feature `mpi`).
    Mpi,
    /// NCCL, on CUDA tensors.
    Nccl,
    /// Threads of this process sharing memory.
    Local,
    /// An engine of the program's own ([`ProcessGroup::from_communicator`]).
    Custom,
}

/// A group of ranks and the engine that connects them. Cheap to clone; collectives of
/// clones are collectives of the same group.
#[derive(Clone, Debug)]
pub struct ProcessGroup {
    id: u32,
    rank: usize,
    world: usize,
    local_rank: usize,
    backend: Backend,
}

/// Rank, world size and local rank as a launcher sets them: Open MPI's `mpirun`, MPICH and
/// Intel MPI, Slurm's `srun`, and `torchrun`-style `RANK`/`WORLD_SIZE`/`LOCAL_RANK`.
/// `None` when the process was not started by a launcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchInfo {
    /// This process's rank.
    pub rank: usize,
    /// The number of processes.
    pub world: usize,
    /// The rank among the processes on this machine (which GPU to use).
    pub local_rank: usize,
}

impl LaunchInfo {
    /// What the environment says, or `None` outside a launcher.
    pub fn from_env() -> Option<LaunchInfo> {
        LaunchInfo::from_vars(|name| std::env::var(name).ok())
    }

    /// As [`LaunchInfo::from_env`], reading variables through `var` (for tests).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Option<LaunchInfo> {
        let number = |names: &[&str]| names.iter().find_map(|n| var(n)?.trim().parse().ok());
        let rank = number(&["OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK"])?;
        let world = number(&["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", "WORLD_SIZE"])?;
        let local_rank = number(&[
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "MPI_LOCALRANKID",
            "SLURM_LOCALID",
            "LOCAL_RANK",
        ])
        .unwrap_or(0);
        (rank < world).then_some(LaunchInfo { rank, world, local_rank })
    }
}

/// Joins the process group the launcher started (PyTorch's `init_process_group`).
///
/// # Panics
/// Where [`try_init`] fails.
#[track_caller]
pub fn init(backend: Backend) -> ProcessGroup {
    ok(try_init(backend))
}

/// Joins the process group the launcher started. With [`Backend::Mpi`] the ranks are MPI's
/// (`MPI_COMM_WORLD`; a process started without `mpirun` is a world of one). With
/// [`Backend::Nccl`] each rank takes CUDA device `local_rank` and the ranks exchange NCCL's
/// id over MPI. [`Backend::Local`] here is a world of one ([`ProcessGroup::local`] makes
/// more). [`Backend::Custom`] is an error: make such a group with
/// [`ProcessGroup::from_communicator`].
///
/// # Errors
/// [`Error::Device`] when the engine is not built in (the `mpi` feature), its library is
/// missing, or the GPU is not there.
pub fn try_init(backend: Backend) -> Result<ProcessGroup> {
    match backend {
        Backend::Local => Ok(ProcessGroup::single()),
        Backend::Mpi => mpi_world(),
        Backend::Nccl => nccl_world(),
        Backend::Custom => Err(Error::Device {
            op: "distributed::init",
            detail: "kiln cannot start an engine of your own; make its group with \
                     `ProcessGroup::from_communicator`"
                .into(),
        }),
    }
}

#[cfg(feature = "mpi")]
fn mpi_world() -> Result<ProcessGroup> {
    use kiln_runtime::collective::Communicator;
    let world = kiln_runtime::mpi::World::join().map_err(device_error)?;
    let (rank, size) = (world.rank(), world.world());
    let local_rank = LaunchInfo::from_env().filter(|l| l.rank == rank).map_or(0, |l| l.local_rank);
    let id = engine::register(world);
    Ok(ProcessGroup { id, rank, world: size, local_rank, backend: Backend::Mpi })
}

#[cfg(not(feature = "mpi"))]
fn mpi_world() -> Result<ProcessGroup> {
    Err(Error::Device { op: "distributed::init", detail: no_mpi() })
}

#[cfg(not(feature = "mpi"))]
fn no_mpi() -> String {
    "kiln was built without MPI; enable the `mpi` feature (kiln = { features = [\"mpi\"] }), \
     which needs an MPI library and its headers (Debian: libopenmpi-dev openmpi-bin)"
        .into()
}

fn device_error(e: kiln_runtime::RuntimeError) -> Error {
    Error::Device { op: "distributed::init", detail: e.to_string() }
}

fn nccl_world() -> Result<ProcessGroup> {
    let launch = LaunchInfo::from_env().unwrap_or(LaunchInfo { rank: 0, world: 1, local_rank: 0 });
    // The GPU first: without one there is nothing NCCL could do.
    kiln_runtime::Buffer::from_slice(&[0u8])
        .and_then(|b| b.to_device(Device::Cuda(launch.local_rank)))
        .map_err(device_error)?;
    let id = nccl_id(launch)?;
    let group = kiln_runtime::cuda::nccl_group(launch.local_rank, launch.rank, launch.world, &id)
        .map_err(device_error)?;
    Ok(ProcessGroup {
        id: group,
        rank: launch.rank,
        world: launch.world,
        local_rank: launch.local_rank,
        backend: Backend::Nccl,
    })
}

/// NCCL's group id: drawn here for a world of one, else on rank 0 and broadcast over MPI.
fn nccl_id(launch: LaunchInfo) -> Result<[u8; 128]> {
    if launch.world == 1 {
        return kiln_runtime::cuda::nccl_unique_id().map_err(device_error);
    }
    #[cfg(feature = "mpi")]
    {
        use kiln_runtime::collective::Communicator;
        let world = kiln_runtime::mpi::World::join().map_err(device_error)?;
        let mut id = [0u8; 128];
        if world.rank() == 0 {
            id = kiln_runtime::cuda::nccl_unique_id().map_err(device_error)?;
        }
        world.broadcast_bytes(&mut id, 0).map_err(device_error)?;
        Ok(id)
    }
    #[cfg(not(feature = "mpi"))]
    Err(Error::Device {
        op: "distributed::init",
        detail: format!(
            "{} NCCL ranks must agree on a group id, which kiln sends over MPI: {}",
            launch.world,
            no_mpi()
        ),
    })
}

/// The version of the NCCL library found at run time, `(major, minor, patch)`: a check that
/// [`Backend::Nccl`] can load it (it needs no GPU).
///
/// # Errors
/// [`Error::Device`] naming the library when it cannot be loaded.
pub fn nccl_version() -> Result<(u32, u32, u32)> {
    kiln_runtime::cuda::nccl_version().map_err(device_error)
}

/// A new NCCL group id (what rank 0 draws and sends to the others), without a GPU: a check
/// that the library works on this machine.
///
/// # Errors
/// [`Error::Device`] when the library cannot be loaded or fails.
pub fn nccl_unique_id() -> Result<[u8; 128]> {
    kiln_runtime::cuda::nccl_unique_id().map_err(device_error)
}

impl ProcessGroup {
    /// A world of one rank: every collective is the identity. Code written for many ranks
    /// runs unchanged on one.
    pub fn single() -> ProcessGroup {
        ProcessGroup::local(1).pop().unwrap_or_else(|| unreachable!("local(1) has one rank"))
    }

    /// `world` ranks that are threads of this process, rank `r` at index `r`: move each to
    /// its own thread. Collectives meet at a barrier and read each other's tensors from
    /// shared memory.
    pub fn local(world: usize) -> Vec<ProcessGroup> {
        LocalGroup::new(world)
            .into_iter()
            .enumerate()
            .map(|(rank, ranks)| ProcessGroup {
                id: engine::register(Arc::new(ranks)),
                rank,
                world: world.max(1),
                local_rank: rank,
                backend: Backend::Local,
            })
            .collect()
    }

    /// A group on an engine of your own: anything that moves host memory between ranks (a
    /// cluster's own transport, a test double). kiln converts dtypes to the communicator's
    /// five wire types and runs every collective on the group's communication thread, in
    /// order, as it does for MPI.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kiln::distributed::{CollectiveKind, Communicator, ProcessGroup, ReduceOp};
    /// use kiln::{DType, Tensor};
    ///
    /// /// A world of one that counts the bytes it is handed.
    /// struct Counting(std::sync::atomic::AtomicUsize);
    /// impl Communicator for Counting {
    ///     fn rank(&self) -> usize { 0 }
    ///     fn world(&self) -> usize { 1 }
    ///     fn engine(&self) -> &'static str { "counting" }
    ///     fn run(&self, _: CollectiveKind, _: DType, input: &[u8], output: &mut [u8])
    ///         -> Result<(), String> {
    ///         self.0.fetch_add(input.len(), std::sync::atomic::Ordering::Relaxed);
    ///         output.copy_from_slice(input);
    ///         Ok(())
    ///     }
    ///     fn barrier(&self) -> Result<(), String> { Ok(()) }
    /// }
    /// let counting = Arc::new(Counting(Default::default()));
    /// let group = ProcessGroup::from_communicator(counting.clone());
    /// let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], [3]);
    /// assert_eq!(group.all_reduce(&x, ReduceOp::Sum).to_vec::<f32>(), [1.0, 2.0, 3.0]);
    /// assert_eq!(counting.0.load(std::sync::atomic::Ordering::Relaxed), 12);
    /// ```
    pub fn from_communicator(communicator: Arc<dyn Communicator>) -> ProcessGroup {
        let (rank, world) = (communicator.rank(), communicator.world());
        ProcessGroup {
            id: engine::register(communicator),
            rank,
            world,
            local_rank: 0,
            backend: Backend::Custom,
        }
    }

    /// This process's rank, `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The rank among the ranks on this machine (which GPU an NCCL rank uses).
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// The engine.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The device this group's tensors live on: CUDA device `local_rank` for NCCL, else the
    /// CPU.
    pub fn device(&self) -> Device {
        match self.backend {
            Backend::Nccl => Device::Cuda(self.local_rank),
            _ => Device::Cpu,
        }
    }

    #[track_caller]
    fn collective(&self, kind: CollectiveKind, t: &Tensor) -> Result<Tensor> {
        let c = Collective { kind, group: self.id, world: self.world_u32() };
        let differentiable = match kind {
            CollectiveKind::AllReduce(r) | CollectiveKind::ReduceScatter(r) => {
                matches!(r, ReduceOp::Sum | ReduceOp::Mean)
            }
            CollectiveKind::AllGather => true,
            CollectiveKind::Broadcast { .. } => false,
        };
        if !differentiable && t.requires_grad() && crate::autograd::is_grad_enabled() {
            return Err(Error::Autograd {
                op: c.name(),
                detail: format!(
                    "{c} has no gradient, and the tensor requires grad; pass `t.detach()` (or \
                     record it under `kiln::no_grad()`); sum and mean reductions and all_gather \
                     are differentiable"
                ),
            });
        }
        Tensor::from_op(Op::Collective(c), &[t])
    }

    fn world_u32(&self) -> u32 {
        u32::try_from(self.world).unwrap_or(u32::MAX)
    }

    /// Every rank's `t` reduced by `op`, on every rank.
    ///
    /// # Panics
    /// Where [`ProcessGroup::try_all_reduce`] fails.
    #[track_caller]
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Tensor {
        ok(self.try_all_reduce(t, op))
    }

    /// Every rank's `t` reduced by `op`, on every rank. Sums and products of `bool` are or
    /// and and; a mean needs a float dtype. Differentiable for sum and mean (the gradient is
    /// the same all-reduce of the result's gradient: the loss is taken as the sum of every
    /// rank's).
    ///
    /// # Errors
    /// [`Error::DType`] for a mean of integers, [`Error::Autograd`] for a max, min or
    /// product of a tensor that requires grad.
    #[track_caller]
    pub fn try_all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.collective(CollectiveKind::AllReduce(op), t)
    }

    /// Rank `root`'s `t`, on every rank.
    ///
    /// # Panics
    /// Where [`ProcessGroup::try_broadcast`] fails.
    #[track_caller]
    pub fn broadcast(&self, t: &Tensor, root: usize) -> Tensor {
        ok(self.try_broadcast(t, root))
    }

    /// Rank `root`'s `t`, on every rank (every rank passes a tensor of the same shape and
    /// dtype). Not differentiable.
    ///
    /// # Errors
    /// [`Error::Shape`] for a root outside the group, [`Error::Autograd`] for a tensor that
    /// requires grad.
    #[track_caller]
    pub fn try_broadcast(&self, t: &Tensor, root: usize) -> Result<Tensor> {
        let root = u32::try_from(root).unwrap_or(u32::MAX);
        self.collective(CollectiveKind::Broadcast { root }, t)
    }

    /// The ranks' `t` concatenated along dimension 0, in rank order.
    ///
    /// # Panics
    /// Where [`ProcessGroup::try_all_gather`] fails.
    #[track_caller]
    pub fn all_gather(&self, t: &Tensor) -> Tensor {
        ok(self.try_all_gather(t))
    }

    /// The ranks' `t` concatenated along dimension 0, in rank order (PyTorch's
    /// `all_gather_into_tensor`). Differentiable: the gradient is a reduce-scatter.
    ///
    /// # Errors
    /// [`Error::Shape`] for a 0-dimensional tensor.
    #[track_caller]
    pub fn try_all_gather(&self, t: &Tensor) -> Result<Tensor> {
        self.collective(CollectiveKind::AllGather, t)
    }

    /// The reduction of the ranks' `t`, split along dimension 0: rank `r` gets part `r`.
    ///
    /// # Panics
    /// Where [`ProcessGroup::try_reduce_scatter`] fails.
    #[track_caller]
    pub fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Tensor {
        ok(self.try_reduce_scatter(t, op))
    }

    /// The reduction of the ranks' `t`, split along dimension 0 into `world_size()` equal
    /// parts: rank `r` gets part `r` (PyTorch's `reduce_scatter_tensor`). Differentiable for
    /// sum and mean: the gradient is an all-gather.
    ///
    /// # Errors
    /// [`Error::Shape`] when dimension 0 does not split evenly, as for
    /// [`ProcessGroup::try_all_reduce`] otherwise.
    #[track_caller]
    pub fn try_reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        self.collective(CollectiveKind::ReduceScatter(op), t)
    }

    /// Waits until every rank has called `barrier`. Pending collectives are not flushed:
    /// materialize what you need first.
    ///
    /// # Errors
    /// [`Error::Runtime`] when the engine fails.
    pub fn barrier(&self) -> Result<()> {
        engine::barrier(self.id).map_err(|error| {
            Error::Runtime(kiln_runtime::RunError { error, op: Some("barrier"), origin: None })
        })
    }
}
