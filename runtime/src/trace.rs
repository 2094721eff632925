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
    /// An op run on the reference executor (gather, scatter, cumsum, ...), or a kernel that
    /// could not be compiled.
    Reference,
    /// Planning a realization: graph passes and fusion.
    Plan,
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
    /// The CUDA C the kernel compiles to on a GPU, when sources were asked for.
    pub cuda: Option<String>,
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

/// `KILN_DEBUG`: 0 (off), 1 (a line per step), 2 (also each new kernel's source).
pub fn debug_level() -> u8 {
    static LEVEL: LazyLock<u8> = LazyLock::new(|| {
        std::env::var("KILN_DEBUG").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0)
    });
    *LEVEL
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
