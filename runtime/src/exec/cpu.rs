//! CPU kernels: compiled through the kernel cache and launched over the thread pool.

use std::cell::Cell;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use rustc_hash::FxHashMap as HashMap;
use std::time::{Duration, Instant};

use kiln_codegen::cpu::{self, CpuKernel};
use kiln_codegen::generic;
use kiln_ir::Graph;
use kiln_ir::fuse::KernelStep;
use kiln_ir::kernel::Kernel;

use super::execute::Bufs;
use crate::cache::{CacheStats, KernelCache};
use crate::sizes::{Decision, Forms, Sizes, reuses};
use crate::{Buffer, RunError, RuntimeError};

/// The CPU's compiled kernels; `None` for a kernel that failed to compile (it runs on the
/// reference executor, and is not compiled again).
static CACHE: LazyLock<Mutex<KernelCache<Kernel, Option<Arc<CpuKernel>>>>> =
    LazyLock::new(|| Mutex::new(KernelCache::default()));

/// The CPU kernel cache's counters.
pub fn cache_stats() -> CacheStats {
    CACHE.lock().unwrap_or_else(PoisonError::into_inner).stats()
}

/// The compiled kernel for `kernel`, from the cache or compiled now (with the time the
/// compile took); `None` when it cannot be compiled (the step then runs on the reference
/// executor). In a plan of a program that ran before at other sizes ([`Sizes::Changed`]),
/// under [`SizePolicy::Auto`](crate::sizes::SizePolicy::Auto), a kernel of a form compiled
/// before at other sizes is compiled size-generic, and serves every later size of that form
/// (see [`crate::sizes`]).
pub(super) fn compiled(
    kernel: &Kernel,
    sizes: Sizes,
) -> (Option<Arc<CpuKernel>>, Option<Duration>) {
    let generic = |k: &Option<Arc<CpuKernel>>| k.as_ref().is_some_and(|k| k.is_generic());
    let cached = CACHE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_if(kernel, |k| reuses(generic(k), sizes, kernel));
    if let Some(found) = cached {
        return (found, None);
    }
    let ask =
        match FORMS.lock().unwrap_or_else(PoisonError::into_inner).decide(kernel, cpu::form, sizes)
        {
            Decision::Serve(k) => {
                let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
                return (cache.link(kernel.clone(), Some(k)), None);
            }
            Decision::Compile(ask) => ask,
        };
    // Compile outside the locks: another thread may compile the same kernel meanwhile, which
    // costs a duplicate compile but never blocks on one.
    let started = Instant::now();
    let result = if FAIL_COMPILES.with(Cell::get) {
        Err("compiles are made to fail (kiln::debug::fail_cpu_compiles)".to_string())
    } else {
        cpu::compile_generic(kernel, &ask.marks).map_err(|e| e.to_string())
    };
    let took = started.elapsed();
    let result = match result {
        Ok(k) => Some(Arc::new(k)),
        Err(message) => {
            report_failure(kernel, message);
            None
        }
    };
    if let Some(k) = &result {
        FORMS.lock().unwrap_or_else(PoisonError::into_inner).record(ask, k.clone());
    }
    let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
    let bytes = result.as_ref().map_or(0, |k| k.code_bytes());
    match &result {
        None => cache.note_failure(),
        Some(k) if k.is_generic() => cache.note_generic(),
        Some(_) => {}
    }
    (cache.insert(kernel.clone(), result, bytes), Some(took))
}

/// Every kernel form the CPU compiled, with its generic kernels.
static FORMS: LazyLock<Mutex<Forms<Arc<CpuKernel>>>> = LazyLock::new(Mutex::default);

/// Kernels that could not be compiled: name -> the code generator's message.
static FAILURES: LazyLock<Mutex<HashMap<String, String>>> = LazyLock::new(Mutex::default);

thread_local! {
    /// Makes new CPU compiles on this thread fail (for tests of the fallback).
    static FAIL_COMPILES: Cell<bool> = const { Cell::new(false) };
}

/// A failed compile is never silent: it is written to stderr once per kernel, kept for
/// [`compile_failures`] and the profile, and counted in the cache's `failures`.
fn report_failure(kernel: &Kernel, message: String) {
    let name = kernel.name();
    let mut failures = FAILURES.lock().unwrap_or_else(PoisonError::into_inner);
    if let std::collections::hash_map::Entry::Vacant(slot) = failures.entry(name) {
        eprintln!(
            "kiln: warning: CPU kernel {} ({}) could not be compiled: {message}; its ops run on the reference executor (slow)",
            slot.key(),
            kernel.shape
        );
        slot.insert(message);
    }
}

/// Every CPU kernel that could not be compiled, with the code generator's message.
pub fn compile_failures() -> Vec<(String, String)> {
    let failures = FAILURES.lock().unwrap_or_else(PoisonError::into_inner);
    let mut all: Vec<_> = failures.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    all.sort();
    all
}

/// Why the CPU kernel `name` could not be compiled, if it could not.
pub(crate) fn compile_failure(name: &str) -> Option<String> {
    FAILURES.lock().unwrap_or_else(PoisonError::into_inner).get(name).cloned()
}

/// Makes new CPU compiles on this thread fail (`true`) or work again, returning the
/// previous setting: a test hook for the reference-executor fallback.
pub fn fail_compiles(fail: bool) -> bool {
    FAIL_COMPILES.with(|f| f.replace(fail))
}

/// Whether new CPU compiles on this thread are made to fail ([`fail_compiles`]).
pub fn compiles_fail() -> bool {
    FAIL_COMPILES.with(Cell::get)
}

/// The Cranelift IR of a kernel's generated code (compiling it if it is not cached yet).
///
/// # Errors
/// The code generator's message if the kernel cannot be compiled.
pub fn clif(kernel: &Kernel) -> Result<String, String> {
    if let Some(features) = crate::trace::clif_features() {
        return cpu::clif_with(kernel, features).map_err(|e| e.to_string());
    }
    if let Some(Some(k)) = CACHE.lock().unwrap_or_else(PoisonError::into_inner).get(kernel) {
        return Ok(k.clif().to_string());
    }
    cpu::compile(kernel).map(|k| k.clif().to_string()).map_err(|e| e.to_string())
}

/// The Cranelift IR of `kernel`'s most generic form: every size, stride and offset read
/// when it runs but the strides 0 and 1 (see [`SizePolicy`](crate::sizes::SizePolicy)); for another host's features
/// inside `kiln::debug::with_clif_features`.
///
/// # Errors
/// The code generator's message if the kernel cannot be compiled.
pub fn generic_clif(kernel: &Kernel) -> Result<String, String> {
    let marks = generic::generic_marks(kernel);
    let features = match crate::trace::clif_features() {
        Some(f) => f,
        None => cpu::CpuFeatures::host().map_err(|e| e.to_string())?,
    };
    cpu::clif_generic(kernel, features, &marks).map_err(|e| e.to_string())
}

/// Positions per thread task: large enough to amortize a task, small enough to balance.
const CHUNK: usize = 1 << 15;

/// The fewest outputs of a task that [`launch`] splits below the kernel's own minimum.
const LANE_CHUNK: usize = 16;

/// Runs a kernel step on the CPU: its compiled code, or (when it could not be compiled) its
/// ops one by one on the reference executor.
pub(super) fn run_kernel(
    graph: &Graph,
    step: &KernelStep,
    kernel: Option<&CpuKernel>,
    bufs: &Bufs,
) -> Result<Vec<Buffer>, RunError> {
    let root = graph.node(step.outputs[0]);
    let at =
        |error: RuntimeError| RunError { error, op: Some(root.op.name()), origin: root.origin };
    let Some(kernel) = kernel else {
        return super::check::kernel_reference(graph, step, bufs);
    };
    let n = step.kernel.output_len();
    // Domain positions per output position: 1, or the size of a reduction's reduced dims.
    let per_output = (step.kernel.shape.numel() / n.max(1)).max(1);
    let params: Vec<u64> = kernel.slots(&step.kernel, &step.params);
    let inputs: Vec<*const u8> = step.inputs.iter().map(|i| bufs[i].as_ptr()).collect();
    let outputs: Vec<_> = step
        .outputs
        .iter()
        .zip(step.kernel.output_lens())
        .map(|(&o, len)| (graph.node(o).dtype, len))
        .collect();
    // SAFETY: the kernel writes every one of the `n` positions of each output (its range is
    // 0..n, split into disjoint chunks; a reduction's unreduced outputs get every domain
    // position of its output positions), reads its inputs only through views that the graph
    // checked to lie inside their buffers, and the buffers outlive the calls.
    let filled = unsafe {
        Buffer::from_raw_fill_many(&outputs, |outs| {
            let mut ptrs: Vec<*mut u8> = inputs.iter().map(|&p| p.cast_mut()).collect();
            ptrs.extend_from_slice(outs);
            launch(kernel, &ptrs, &params, n, per_output);
            Ok::<(), RuntimeError>(())
        })
    };
    filled.map_err(at)?.map_err(at)
}

/// Calls the kernel over output positions `0..n`, in parallel chunks of about `CHUNK`
/// domain positions when there is enough work.
fn launch(kernel: &CpuKernel, ptrs: &[*mut u8], params: &[u64], n: usize, per_output: usize) {
    struct Args(*const *mut u8, *const u64);
    // SAFETY: the pointers are only read by the kernel, and each task writes a disjoint
    // range of the output.
    unsafe impl Sync for Args {}
    let args = Args(ptrs.as_ptr(), params.as_ptr());
    let call = |start: usize, end: usize| {
        let a = &args;
        // SAFETY: see `run_kernel`; `start..end` lies inside `0..n`, and `kernel` (which owns
        // the code) is borrowed for the whole launch.
        unsafe { kernel.call(a.0, a.1, start as u64, end as u64) };
    };
    let threads = crate::team::threads();
    let mut chunk = (CHUNK / per_output).max(kernel.min_chunk());
    if per_output > 1 && n <= chunk && n >= 2 * LANE_CHUNK && n * per_output >= 2 * CHUNK {
        // One task would leave every other thread idle (a column sum over a few hundred
        // outputs): split the outputs evenly instead, in whole vectors.
        chunk = n.div_ceil(threads).next_multiple_of(LANE_CHUNK);
    }
    if n <= chunk || threads == 1 {
        call(0, n);
        return;
    }
    crate::team::for_each(n.div_ceil(chunk), &|c| call(c * chunk, ((c + 1) * chunk).min(n)));
}
