//! What the executor did, step by step: the events behind `kiln::profile`, `KILN_DEBUG` and
//! `kiln::debug::kernels`.
//!
//! Recording is off unless a capture is active on this thread or `KILN_DEBUG` is set, so the
//! executor pays one thread-local check per step otherwise.

use std::cell::RefCell;
use std::panic::Location;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

/// What kind of step an event timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepKind {
    /// A generated (fused) kernel.
    Kernel,
    /// A library call (matmul through `gemm`).
    Library,
    /// An op run on the reference executor: a kernel that could not be compiled, or an op
    /// with no native loop.
    Reference,
    /// An op of a GPU plan that ran on the host, over copies of its inputs (no device
    /// kernel takes it), its result copied back.
    Host,
    /// Planning a realization: graph passes and fusion.
    Plan,
    /// A collective on a host group's engine (MPI, local ranks). It runs on the group's
    /// communication thread while the steps after it run; its duration is the time the
    /// plan then waited for it, and [`Event::overlapped`] the time it was hidden.
    Collective,
}

/// One executed step.
#[derive(Clone, Debug)]
pub struct Event {
    /// The kernel's name (`k_<hash>` for generated kernels), the op for other steps.
    pub name: String,
    /// What ran.
    pub kind: StepKind,
    /// The ops the step computed, in order, separated by spaces.
    pub ops: String,
    /// Why the fuser ended the kernel at its output (empty for other steps).
    pub cut: String,
    /// The iteration space (`[4096, 4096]`).
    pub shape: String,
    /// When the step started, from the start of the capture.
    pub start: Duration,
    /// How long it ran (compile time excluded).
    pub duration: Duration,
    /// On a GPU, the part of `duration` spent waiting for the device after the step was
    /// queued (the kernels' run plus the wait's own latency); the rest is the host's work of
    /// issuing it (arguments, allocations, the launch calls). Zero on the CPU.
    pub waited: Duration,
    /// Bytes of the input buffers it read.
    pub bytes_read: u64,
    /// Bytes it wrote.
    pub bytes_written: u64,
    /// Time spent compiling the kernel before this launch (`None` when it came from the cache).
    pub compile: Option<Duration>,
    /// The user lines that recorded the step's ops.
    pub sources: Vec<&'static Location<'static>>,
    /// The kernel's IR text, when sources were asked for.
    pub text: Option<String>,
    /// The kernel's Cranelift IR, when sources were asked for.
    pub clif: Option<String>,
    /// The CUDA C the kernel compiles to on a GPU, when sources were asked for (`None` for a
    /// `logsumexp` kernel, which a GPU plan does not have).
    pub cuda: Option<String>,
    /// For a collective: how long it was in flight while other steps ran, before the plan
    /// waited for it (communication hidden behind computation). Zero for other steps.
    pub overlapped: Duration,
    /// The device whose plan ran the step (the host's work for a GPU plan included, labelled
    /// by its kind): what its bandwidth is measured against.
    pub device: crate::Device,
    /// Whether the step ran inside the launch of the step before it, not a launch of its own
    /// (the members after the first of a GPU row group).
    pub joined: bool,
    /// Whether a size-generic kernel ran: one compiled for the kernel's form that reads the
    /// sizes it was compiled without when it runs (`KILN_SIZES`).
    pub generic: bool,
}

/// Memory of one realization: the peak of live buffers and the largest ones at that point.
#[derive(Clone, Debug, Default)]
pub struct MemoryPeak {
    /// The most bytes live at once (inputs, intermediates and outputs of the graph).
    pub peak_bytes: u64,
    /// The largest buffers live at the peak: bytes, the op that made it, its user line.
    pub largest: Vec<(u64, &'static str, Option<&'static Location<'static>>)>,
}

/// Everything recorded during a capture.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// Steps in execution order.
    pub events: Vec<Event>,
    /// One entry per realization.
    pub memory: Vec<MemoryPeak>,
}

struct Sink {
    origin: Instant,
    sources: bool,
    trace: Trace,
}

thread_local! {
    static SINKS: RefCell<Vec<Sink>> = const { RefCell::new(Vec::new()) };
}

/// `KILN_DEBUG`, a comma-separated list: a level (0 off, 1 a line per step, 2 also each new
/// kernel's source) and/or `passes` (the graph after each planning stage).
fn debug_setting() -> (u8, bool) {
    static SETTING: LazyLock<(u8, bool)> = LazyLock::new(|| {
        let text = kiln_ir::settings::Setting::Debug.text().unwrap_or_default();
        let mut setting = (0, false);
        for word in text.split(',').map(str::trim) {
            match word.parse() {
                Ok(level) => setting.0 = level,
                Err(_) if word == "passes" => setting.1 = true,
                Err(_) => {}
            }
        }
        setting
    });
    *SETTING
}

/// The `KILN_DEBUG` level: 0 (off), 1 (a line per step), 2 (also each new kernel's source).
pub fn debug_level() -> u8 {
    debug_setting().0
}

/// Whether `KILN_DEBUG` asks for the graph after each planning stage (`KILN_DEBUG=passes`).
pub fn debug_passes() -> bool {
    debug_setting().1
}

/// Whether steps are being recorded on this thread.
pub fn enabled() -> bool {
    debug_level() > 0 || SINKS.with(|s| !s.borrow().is_empty())
}

/// Whether the innermost capture wants kernel sources (or `KILN_DEBUG` is 2 or more).
pub fn wants_sources() -> bool {
    debug_level() >= 2 || SINKS.with(|s| s.borrow().last().is_some_and(|s| s.sources))
}

/// Runs `f`, recording every step the executor runs on this thread meanwhile. Captures
/// nest: an inner capture's events are also given to the outer ones.
pub fn capture<T>(sources: bool, f: impl FnOnce() -> T) -> (T, Trace) {
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            SINKS.with(|s| s.borrow_mut().pop());
        }
    }
    SINKS.with(|s| {
        s.borrow_mut().push(Sink { origin: Instant::now(), sources, trace: Trace::default() });
    });
    let pop = Pop;
    let value = f();
    let trace = SINKS.with(|s| {
        s.borrow_mut().last_mut().map(|sink| std::mem::take(&mut sink.trace)).unwrap_or_default()
    });
    drop(pop);
    (value, trace)
}

/// Records a step that began at `started` (an `Instant` taken before it ran).
pub(crate) fn record(started: Instant, mut event: Event) {
    if debug_level() > 0 {
        print_debug(&event);
    }
    SINKS.with(|s| {
        for sink in s.borrow_mut().iter_mut() {
            event.start = started.saturating_duration_since(sink.origin);
            sink.trace.events.push(event.clone());
        }
    });
}

/// Records the memory peak of a realization.
pub(crate) fn record_memory(peak: MemoryPeak) {
    SINKS.with(|s| {
        for sink in s.borrow_mut().iter_mut() {
            sink.trace.memory.push(peak.clone());
        }
    });
}

fn print_debug(e: &Event) {
    let micros = e.duration.as_secs_f64() * 1e6;
    let gbps = (e.bytes_read + e.bytes_written) as f64 / e.duration.as_secs_f64().max(1e-9) / 1e9;
    let compiled = e
        .compile
        .map_or(String::new(), |c| format!("  (compiled in {:.2} ms)", c.as_secs_f64() * 1e3));
    eprintln!(
        "kiln: {:<9} {:<18} {:<14} {:>10.1} us {:>8.2} GB/s  {}{compiled}",
        format!("{:?}", e.kind).to_lowercase(),
        e.name,
        e.shape,
        micros,
        gbps,
        e.ops
    );
    if debug_level() >= 2 && e.compile.is_some() {
        if let Some(text) = &e.text {
            eprintln!("{text}");
        }
        if let Some(clif) = &e.clif {
            eprintln!("{clif}");
        }
    }
}

// The events of the executor's steps.

use std::sync::Arc;

use kiln_codegen::cpu::CpuKernel;
use kiln_ir::fuse::KernelStep;
use kiln_ir::{Graph, NodeId};

use crate::Buffer;

/// The ops of a fused kernel for people: scalar constants and their broadcasts are left
/// out, reductions show their axes and casts their target, and the ops of a user-defined op
/// are grouped under its name (`swish(mul sigmoid mul)`).
pub fn describe_ops(graph: &Graph, nodes: &[NodeId]) -> String {
    use kiln_ir::Op;
    let is_constant = |n: NodeId| matches!(graph.node(n).op, Op::Full(_));
    let shown = nodes.iter().filter(|&&n| match &graph.node(n).op {
        Op::Full(_) => false,
        Op::View(_) => !graph.args(n).into_iter().all(is_constant),
        _ => true,
    });
    let mut out = String::new();
    let mut open: Option<kiln_ir::Label> = None;
    for &n in shown {
        let node = graph.node(n);
        let name = match &node.op {
            op @ (Op::Reduce { .. } | Op::Cast(_)) => op.to_string(),
            op => op.name().to_string(),
        };
        if node.label != open {
            if open.is_some() {
                out.push(')');
            }
            if !out.is_empty() {
                out.push(' ');
            }
            if let Some(label) = node.label {
                out.push_str(&format!("{label}("));
            }
            open = node.label;
        } else if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&name);
    }
    if open.is_some() {
        out.push(')');
    }
    out
}

/// A buffer's size in bytes.
pub(crate) fn bytes(b: &Buffer) -> u64 {
    (b.len() * b.dtype().size_in_bytes()) as u64
}

/// An event with only its name, kind, ops and cut filled in.
pub(crate) fn plain_event(name: &str, kind: StepKind, ops: String, cut: String) -> Event {
    Event {
        name: name.to_string(),
        kind,
        ops,
        cut,
        shape: String::new(),
        start: Duration::ZERO,
        duration: Duration::ZERO,
        waited: Duration::ZERO,
        bytes_read: 0,
        bytes_written: 0,
        compile: None,
        sources: Vec::new(),
        text: None,
        clif: None,
        cuda: None,
        overlapped: Duration::ZERO,
        device: crate::Device::Cpu,
        joined: false,
        generic: false,
    }
}

/// How a kernel step ran: on generated code (with its compile time, if it was compiled for
/// this launch), or on the reference executor.
pub(crate) struct KernelRun {
    /// The CPU kernel, when one ran.
    pub(crate) compiled: Option<Arc<CpuKernel>>,
    /// Whether generated code ran (on the CPU or a GPU) rather than the reference executor.
    pub(crate) generated: bool,
    pub(crate) compile: Option<Duration>,
    /// The marks of the CUDA kernel that ran, when it was size-generic (empty otherwise).
    pub(crate) cuda_marks: Vec<bool>,
}

/// The event of a kernel step.
pub(crate) fn kernel_event(
    graph: &Graph,
    k: &KernelStep,
    info: KernelRun,
    bytes_read: u64,
    bytes_written: u64,
    duration: Duration,
) -> Event {
    let kind = if info.generated { StepKind::Kernel } else { StepKind::Reference };
    let cut = match k.outputs.len() {
        1 => k.cut.to_string(),
        n => {
            let s = if n > 2 { "s" } else { "" };
            match k.kernel.reduce {
                Some(_) => format!("{}; also writes the values it reduces", k.cut),
                None => format!("{}; also writes {} kept result{s}", k.cut, n - 1),
            }
        }
    };
    let name = k.kernel.name();
    let generic = info.compiled.as_ref().is_some_and(|c| c.is_generic())
        || kiln_codegen::generic::is_generic(&info.cuda_marks);
    let cut = match (info.generated, crate::exec::cpu::compile_failure(&name)) {
        (false, Some(why)) => {
            format!("{cut}; could not be compiled, ran on the reference executor: {why}")
        }
        _ if generic => format!("{cut}; size-generic"),
        _ => cut,
    };
    let mut e = plain_event(&name, kind, describe_ops(graph, &k.fused), cut);
    e.shape = k.kernel.shape.to_string();
    e.duration = duration;
    e.compile = info.compile;
    e.bytes_read = bytes_read;
    e.bytes_written = bytes_written;
    e.generic = generic;
    let mut sources: Vec<_> = k.fused.iter().filter_map(|&n| graph.node(n).origin).collect();
    sources.dedup();
    e.sources = sources;
    if wants_sources() {
        e.text = Some(k.kernel.to_string());
        e.clif = match clif_features() {
            Some(features) if info.compiled.is_some() => {
                let marks = info.compiled.as_ref().map_or(&[][..], |c| c.marks());
                kiln_codegen::cpu::clif_generic(&k.kernel, features, marks).ok()
            }
            _ => info.compiled.map(|c| c.clif().to_string()),
        };
        // A GPU plan has no logsumexp kernel: its planner writes one as max, exp, sum, log.
        let cuda = k.kernel.reduce.is_none_or(|r| r.op != kiln_ir::ReduceOp::LogSumExp);
        e.cuda = cuda.then(|| kiln_codegen::cuda::source_generic(&k.kernel, &info.cuda_marks));
    }
    e
}

/// Updates the peak of live bytes with the buffers live while a step's output is written.
pub(crate) fn track_memory<'b>(
    memory: Option<&mut MemoryPeak>,
    graph: &Graph,
    bufs: impl Iterator<Item = (NodeId, &'b Buffer)>,
    new: Option<(NodeId, &Buffer)>,
) {
    let Some(memory) = memory else { return };
    let mut live: Vec<(u64, NodeId)> = bufs.map(|(n, b)| (bytes(b), n)).collect();
    if let Some((n, b)) = new {
        live.push((bytes(b), n));
    }
    let total: u64 = live.iter().map(|(b, _)| b).sum();
    if total <= memory.peak_bytes {
        return;
    }
    live.sort_by_key(|&(b, _)| std::cmp::Reverse(b));
    memory.peak_bytes = total;
    memory.largest = live
        .iter()
        .take(5)
        .map(|&(b, n)| {
            let node = graph.node(n);
            (b, node.op.name(), node.origin)
        })
        .collect();
}

thread_local! {
    /// The host features whose Cranelift IR this thread's reports show ([`with_clif_features`]).
    static CLIF_FEATURES: std::cell::Cell<Option<kiln_codegen::cpu::CpuFeatures>> =
        const { std::cell::Cell::new(None) };
}

/// Runs `f` with the Cranelift IR that this thread's kernel reports show (traces,
/// [`crate::exec::clif`]) generated for a host with `features` instead of this one's: text
/// only, the kernels that run are this host's. Snapshot tests use it to read the same on
/// every host.
pub fn with_clif_features<T>(features: kiln_codegen::cpu::CpuFeatures, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<kiln_codegen::cpu::CpuFeatures>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CLIF_FEATURES.set(self.0);
        }
    }
    let _restore = Restore(CLIF_FEATURES.replace(Some(features)));
    f()
}

/// The features [`with_clif_features`] set on this thread, if any.
pub(crate) fn clif_features() -> Option<kiln_codegen::cpu::CpuFeatures> {
    CLIF_FEATURES.get()
}
