//! CUDA graphs: a plan's device work captured once and replayed with one launch (what
//! PyTorch's `reduce-overhead` mode does), for `compile()`d plans (`exec/graph.rs`).
//!
//! **Capture** ([`capture`]). While a plan runs inside it, this thread's allocations on the
//! device come from an [`Arena`] that the graph keeps; its kernel launches, cuBLAS calls and
//! device copies are recorded by the driver's stream capture instead of running; and kiln
//! notes, in order, the block each allocation got and the graph node each launch became.
//! Work that a graph cannot hold (a copy between host and device, a wait for the device)
//! fails with an error that names it, and the plan runs without a graph.
//!
//! **Update** ([`update`]). Each replay walks the plan on the host again: allocation `k` gets
//! the block it got at capture, so every pointer is the one the graph holds; device work is
//! not queued; and a launch whose arguments differ from its node's (a learning rate, a random
//! key, the copies into and out of the plan's buffers) updates that node's parameters. A
//! step none of whose values changed is skipped ([`skip_steps`]): the cursors move past it and
//! its results are the blocks the capture noted. The graph is then launched once.
//!
//! A capture runs on a stream of its own, so work that other threads queue on the device
//! meanwhile runs as usual and stays out of the graph; the graph is launched on the device's
//! stream, ordered with everything else.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{CudaFunction, CudaStream, DriverError, LaunchConfig, result, sys};
use kiln_ir::DType;
use rustc_hash::FxHashMap;

use super::Gpu;
use super::deferred::Deferred;
use super::kernels::Arg;
use super::memory::{DeviceMemory, Home};
use crate::{Buffer, RuntimeError};

/// Device memory owned by one captured graph: every block its capture allocated, reused
/// within the capture as the device's cache would be, and returned to that cache when the
/// graph and the last buffer on it are gone.
pub(crate) struct Arena {
    gpu: &'static Gpu,
    free: Mutex<BTreeMap<usize, Vec<sys::CUdeviceptr>>>,
    owned: Mutex<Vec<(usize, sys::CUdeviceptr)>>,
}

impl Arena {
    pub(crate) fn new(gpu: &'static Gpu) -> Arc<Arena> {
        Arc::new(Arena { gpu, free: Mutex::default(), owned: Mutex::default() })
    }

    /// A block of `size` bytes (a rounded size): a free one of the arena's, else a new one
    /// from the device's cache.
    pub(crate) fn block(self: &Arc<Self>, size: usize) -> Result<DeviceMemory, RuntimeError> {
        let reused = self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&size)
            .and_then(Vec::pop);
        let ptr = match reused {
            Some(ptr) => ptr,
            None => {
                let ptr = self.gpu.take(size)?;
                self.owned.lock().unwrap_or_else(PoisonError::into_inner).push((size, ptr));
                ptr
            }
        };
        Ok(DeviceMemory::new(self.gpu, ptr, size, Home::Arena(self.clone())))
    }

    /// A dropped buffer's block, free for the capture's later allocations.
    pub(crate) fn release(&self, size: usize, ptr: sys::CUdeviceptr) {
        self.free.lock().unwrap_or_else(PoisonError::into_inner).entry(size).or_default().push(ptr);
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // Work queued later reuses the blocks only after the graph's last launch: one stream.
        for (size, ptr) in self.owned.get_mut().unwrap_or_else(PoisonError::into_inner).drain(..) {
            self.gpu.give_back(size, ptr);
        }
    }
}

/// A captured kernel launch: its graph node and the arguments the node now holds.
struct Launch {
    node: sys::CUgraphNode,
    function: sys::CUfunction,
    config: LaunchConfig,
    args: Vec<Arg>,
}

fn same_config(a: &LaunchConfig, b: &LaunchConfig) -> bool {
    (a.grid_dim, a.block_dim, a.shared_mem_bytes) == (b.grid_dim, b.block_dim, b.shared_mem_bytes)
}

/// An index check that a captured plan's gather or scatter makes after each launch of the
/// graph, from the flag its kernels write (see `library.rs`).
pub(crate) struct IndexCheck {
    pub(crate) op: &'static str,
    pub(crate) flag: Buffer,
    pub(crate) axis: usize,
    pub(crate) size: usize,
}

/// What a capture noted, in order, which every update walks again.
#[derive(Default)]
struct Record {
    allocations: Vec<(usize, sys::CUdeviceptr)>,
    launches: Vec<Launch>,
    checks: Vec<IndexCheck>,
    /// Where each step of the plan (by its index; a row group by its first) started in
    /// `allocations` and `launches`, and what it left for later steps; one more entry for the
    /// plan's end. An update skips a step whose values did not change.
    steps: FxHashMap<usize, StepRecord>,
}

/// One captured step: the cursors where it started, and its results' blocks.
struct StepRecord {
    allocation: usize,
    launch: usize,
    outputs: Vec<StepOutput>,
}

/// A buffer a captured step left: its node (an index of the plan's graph), block, dtype and
/// length.
pub(crate) struct StepOutput {
    pub(crate) node: usize,
    pub(crate) block: (u64, usize),
    pub(crate) dtype: DType,
    pub(crate) len: usize,
}

enum Mode {
    Capture,
    Update { exec: sys::CUgraphExec, allocation: usize, launch: usize, updated: usize },
}

/// The capture or update running on this thread.
struct Sink {
    gpu: &'static Gpu,
    /// The stream being captured.
    stream: Arc<CudaStream>,
    arena: Arc<Arena>,
    record: Record,
    mode: Mode,
}

thread_local! {
    static SINK: RefCell<Option<Sink>> = const { RefCell::new(None) };
}

/// `f` of this thread's capture or update on `gpu`, or `None` when there is none.
fn with_sink<R>(gpu: &Gpu, f: impl FnOnce(&mut Sink) -> R) -> Option<R> {
    SINK.with(|s| match s.borrow_mut().as_mut() {
        Some(sink) if std::ptr::eq(sink.gpu, gpu) => Some(f(sink)),
        _ => None,
    })
}

fn mismatch(gpu: &Gpu, what: String) -> RuntimeError {
    RuntimeError::Cuda {
        device: gpu.device(),
        detail: format!("a replayed plan differs from its CUDA graph: {what}"),
    }
}

/// The block for an allocation of `size` bytes made while a plan is captured or updated on
/// this thread, or `None` outside them.
pub(crate) fn allocate(gpu: &Gpu, size: usize) -> Option<Result<DeviceMemory, RuntimeError>> {
    with_sink(gpu, |sink| match &mut sink.mode {
        Mode::Capture => {
            let block = sink.arena.block(size)?;
            sink.record.allocations.push((size, block.ptr()));
            Ok(block)
        }
        Mode::Update { allocation, .. } => {
            let k = *allocation;
            *allocation += 1;
            match sink.record.allocations.get(k) {
                Some(&(captured, ptr)) if captured == size => {
                    Ok(DeviceMemory::new(sink.gpu, ptr, size, Home::Borrowed))
                }
                other => Err(mismatch(
                    sink.gpu,
                    format!("allocation {k} is {size} bytes, {other:?} when captured"),
                )),
            }
        }
    })
}

/// An error when `gpu` is capturing or updating a plan on this thread: `what` (host work)
/// cannot be part of a graph.
pub(crate) fn no_host_work(gpu: &Gpu, what: &str) -> Result<(), RuntimeError> {
    match with_sink(gpu, |_| ()) {
        None => Ok(()),
        Some(()) => Err(RuntimeError::Cuda {
            device: gpu.device(),
            detail: format!("{what} cannot be captured in a CUDA graph"),
        }),
    }
}

/// The stream this thread queues `gpu`'s work on: the capture's while it captures a plan,
/// else the device's.
pub(crate) fn stream(gpu: &Gpu) -> Arc<CudaStream> {
    with_sink(gpu, |sink| sink.stream.clone()).unwrap_or_else(|| gpu.stream.clone())
}

/// Whether a plan's launches on `gpu` are being walked to update its graph on this thread:
/// work that the graph holds as it is (cuBLAS calls, device copies) is then not queued.
pub(crate) fn replaying(gpu: &Gpu) -> bool {
    with_sink(gpu, |sink| matches!(sink.mode, Mode::Update { .. })).unwrap_or(false)
}

/// Keeps an index check for after each launch of the graph being captured: `true` when
/// there is a capture or an update (which has the capture's checks already) on this thread.
pub(crate) fn defer_check(gpu: &Gpu, check: IndexCheck) -> bool {
    with_sink(gpu, |sink| {
        if matches!(sink.mode, Mode::Capture) {
            sink.record.checks.push(check);
        }
    })
    .is_some()
}

/// Whether this thread is capturing a plan on `gpu` (steps then note what they leave).
pub(crate) fn capturing(gpu: &Gpu) -> bool {
    with_sink(gpu, |sink| matches!(sink.mode, Mode::Capture)).unwrap_or(false)
}

/// While capturing: step `step` of the plan starts (or, at the plan's step count, the plan
/// ends).
pub(crate) fn step_starts(gpu: &Gpu, step: usize) {
    with_sink(gpu, |sink| {
        if matches!(sink.mode, Mode::Capture) {
            let (allocation, launch) = (sink.record.allocations.len(), sink.record.launches.len());
            let outputs = Vec::new();
            sink.record.steps.insert(step, StepRecord { allocation, launch, outputs });
        }
    });
}

/// While capturing: step `step` left `outputs` for the steps after it.
pub(crate) fn step_left(gpu: &Gpu, step: usize, outputs: Vec<StepOutput>) {
    with_sink(gpu, |sink| {
        if let (Mode::Capture, Some(record)) = (&sink.mode, sink.record.steps.get_mut(&step)) {
            record.outputs = outputs;
        }
    });
}

/// While updating: skips the steps from `step` to `end` (their arguments did not change), as
/// if they ran: moves the cursors past them and returns what they left, on the graph's own
/// blocks. `None` when not updating.
pub(crate) fn skip_steps(
    gpu: &'static Gpu,
    step: usize,
    end: usize,
) -> Option<Result<Vec<(usize, Buffer)>, RuntimeError>> {
    with_sink(gpu, |sink| {
        let Mode::Update { allocation, launch, .. } = &mut sink.mode else { return None };
        let (Some(from), Some(to)) = (sink.record.steps.get(&step), sink.record.steps.get(&end))
        else {
            return Some(Err(mismatch(gpu, format!("step {step} was not captured"))));
        };
        if (*allocation, *launch) != (from.allocation, from.launch) {
            let what = format!("step {step} starts at another allocation or launch");
            return Some(Err(mismatch(gpu, what)));
        }
        (*allocation, *launch) = (to.allocation, to.launch);
        let left = from
            .outputs
            .iter()
            .map(|o| (o.node, Buffer::borrowed_on_gpu(sink.gpu, o.block, o.dtype, o.len)));
        Some(Ok(left.collect()))
    })
    .flatten()
}

/// While updating: the launch of `function` with `args` updates its node (when they
/// differ) instead of running. `None` when not updating.
pub(crate) fn update_launch(
    gpu: &Gpu,
    function: &CudaFunction,
    args: &[Arg],
    config: LaunchConfig,
) -> Option<Result<(), RuntimeError>> {
    with_sink(gpu, |sink| {
        let Mode::Update { exec, launch, updated, .. } = &mut sink.mode else {
            return None;
        };
        let k = *launch;
        *launch += 1;
        let Some(node) = sink.record.launches.get_mut(k) else {
            return Some(Err(mismatch(sink.gpu, format!("launch {k} was not captured"))));
        };
        if node.function != function.cu_function() {
            return Some(Err(mismatch(sink.gpu, format!("launch {k} runs another kernel"))));
        }
        if node.args == args && same_config(&node.config, &config) {
            return Some(Ok(()));
        }
        let mut values: Vec<*mut c_void> = args.iter().map(Arg::as_param).collect();
        let params = sys::CUDA_KERNEL_NODE_PARAMS {
            func: node.function,
            gridDimX: config.grid_dim.0,
            gridDimY: config.grid_dim.1,
            gridDimZ: config.grid_dim.2,
            blockDimX: config.block_dim.0,
            blockDimY: config.block_dim.1,
            blockDimZ: config.block_dim.2,
            sharedMemBytes: config.shared_mem_bytes,
            kernelParams: values.as_mut_ptr(),
            extra: std::ptr::null_mut(),
            kern: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        };
        // SAFETY: a node of this graph's executable, given the function it was captured with
        // and arguments that match its parameters (the same code built them); the driver
        // copies the values before returning.
        let set = unsafe { sys::cuGraphExecKernelNodeSetParams_v2(*exec, node.node, &params) };
        if let Err(e) = set.result() {
            return Some(Err(sink.gpu.error("updating a CUDA graph's kernel", e)));
        }
        node.args = args.to_vec();
        node.config = config;
        *updated += 1;
        Some(Ok(()))
    })
    .flatten()
}

/// While capturing: notes the graph node that the launch just queued became.
pub(crate) fn note_launch(
    gpu: &Gpu,
    function: &CudaFunction,
    args: &[Arg],
    config: LaunchConfig,
) -> Result<(), RuntimeError> {
    with_sink(gpu, |sink| {
        if !matches!(sink.mode, Mode::Capture) {
            return Ok(());
        }
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut deps: *const sys::CUgraphNode = std::ptr::null();
        let mut count = 0usize;
        // SAFETY: the device's stream, capturing; the outputs are plain locals, and the
        // dependency array the driver returns is read before the next call on the stream.
        unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                sink.stream.cu_stream(),
                &mut status,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut deps,
                std::ptr::null_mut(),
                &mut count,
            )
        }
        .result()
        .map_err(|e| sink.gpu.error("reading a CUDA graph capture", e))?;
        if count != 1 || deps.is_null() {
            return Err(mismatch(sink.gpu, format!("a captured launch has {count} dependencies")));
        }
        // SAFETY: the driver returned one dependency at `deps`.
        let node = unsafe { *deps };
        let function = function.cu_function();
        sink.record.launches.push(Launch { node, function, config, args: args.to_vec() });
        Ok(())
    })
    .unwrap_or(Ok(()))
}

/// A plan's captured graph: its executable, the memory its pointers address, and what the
/// capture noted.
pub(crate) struct Captured {
    gpu: &'static Gpu,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    arena: Arc<Arena>,
    record: Record,
    /// The index checks of the plan's gathers and scatters.
    checks: Option<Arc<Deferred>>,
}

// SAFETY: the graph and its executable are used only through `&mut Captured` (one thread at
// a time), as the driver requires.
unsafe impl Send for Captured {}

impl Captured {
    /// Queues one launch of the graph on the device's stream, and the copies of its index
    /// checks behind it; fails with a bad index of the previous launch (see `deferred.rs`).
    pub(crate) fn launch(&self) -> Result<(), RuntimeError> {
        self.gpu.bind()?;
        // SAFETY: an executable graph of this device, launched on its stream.
        unsafe { result::graph::launch(self.exec, self.gpu.stream.cu_stream()) }
            .map_err(|e| self.gpu.error("launching a CUDA graph", e))?;
        self.checks.as_ref().map_or(Ok(()), |c| c.launched())
    }

    /// Kernel launches the graph holds (with the copies into and out of its buffers).
    pub(crate) fn launches(&self) -> usize {
        self.record.launches.len()
    }
}

impl Drop for Captured {
    fn drop(&mut self) {
        // SAFETY: created by `capture`, destroyed once; the driver defers the executable's
        // release until its queued launches have run.
        unsafe {
            let _ = result::graph::exec_destroy(self.exec);
            let _ = result::graph::destroy(self.graph);
        }
    }
}

/// Runs `body` with `gpu`'s stream capturing (see the [module documentation](self)), its
/// allocations on this thread from `arena`, and returns its result with the graph.
///
/// # Errors
/// `body`'s error (after the capture is ended and discarded), or the driver's when capturing
/// or instantiating fails.
pub(crate) fn capture<T, E: From<RuntimeError>>(
    gpu: &'static Gpu,
    arena: Arc<Arena>,
    body: impl FnOnce() -> Result<T, E>,
) -> Result<(T, Captured), E> {
    gpu.bind()?;
    let capturing = gpu.ctx.new_stream().map_err(|e| gpu.error("creating a stream", e))?;
    let stream = capturing.cu_stream();
    let relaxed = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: the device's stream, not capturing (captures do not nest: one thread, one sink).
    unsafe { result::stream::begin_capture(stream, relaxed) }
        .map_err(|e| gpu.error("starting a CUDA graph capture", e))?;
    let sink = Sink {
        gpu,
        stream: capturing.clone(),
        arena,
        record: Record::default(),
        mode: Mode::Capture,
    };
    SINK.with(|s| *s.borrow_mut() = Some(sink));
    let out = body();
    let sink = SINK.with(|s| s.borrow_mut().take()).expect("installed above");
    // SAFETY: the capture begun above, on this thread.
    let ended: Result<sys::CUgraph, DriverError> = unsafe { result::stream::end_capture(stream) };
    let out = match (out, ended) {
        (Ok(out), Ok(graph)) if !graph.is_null() => (out, graph),
        (out, ended) => {
            if let Ok(graph) = ended
                && !graph.is_null()
            {
                // SAFETY: the graph just ended, owned here.
                let _ = unsafe { result::graph::destroy(graph) };
            }
            out?;
            return Err(gpu.error("capturing a CUDA graph", "the capture was invalidated").into());
        }
    };
    let (value, graph) = out;
    let flags = sys::CUgraphInstantiate_flags(0);
    // SAFETY: a graph captured above.
    let exec = match unsafe { result::graph::instantiate(graph, flags) } {
        Ok(exec) => exec,
        Err(e) => {
            // SAFETY: as above.
            let _ = unsafe { result::graph::destroy(graph) };
            return Err(gpu.error("instantiating a CUDA graph", e).into());
        }
    };
    let Sink { arena, mut record, .. } = sink;
    let checks = std::mem::take(&mut record.checks);
    let mut captured = Captured { gpu, graph, exec, arena, record, checks: None };
    if !checks.is_empty() {
        captured.checks = Some(Deferred::new(gpu, checks)?);
    }
    Ok((value, captured))
}

/// Runs `body` (the plan that `captured` holds) as an update of `captured`'s launches (see
/// the [module documentation](self)); returns its result and how many launches changed.
///
/// # Errors
/// `body`'s error, or a mismatch between the plan and the graph.
pub(crate) fn update<T, E: From<RuntimeError>>(
    captured: &mut Captured,
    body: impl FnOnce() -> Result<T, E>,
) -> Result<(T, usize), E> {
    let sink = Sink {
        gpu: captured.gpu,
        stream: captured.gpu.stream.clone(),
        arena: captured.arena.clone(),
        record: std::mem::take(&mut captured.record),
        mode: Mode::Update { exec: captured.exec, allocation: 0, launch: 0, updated: 0 },
    };
    SINK.with(|s| *s.borrow_mut() = Some(sink));
    let out = body();
    let sink = SINK.with(|s| s.borrow_mut().take()).expect("installed above");
    captured.record = sink.record;
    let out = out?;
    let Mode::Update { launch, updated, .. } = sink.mode else { unreachable!("an update") };
    if launch != captured.record.launches.len() {
        let what = format!("{launch} launches, {} captured", captured.record.launches.len());
        return Err(mismatch(captured.gpu, what).into());
    }
    Ok((out, updated))
}
