//! Profiling: what ran, how long it took, how many bytes it moved, and why the fuser cut
//! kernels where it did.
//!
//! ```
//! use kiln::prelude::*;
//!
//! let x = Tensor::randn([256, 256]);
//! x.realize();
//! let program = || ((&x * 2.0).exp() + 1.0).sum_dim(1, false);
//! let (y, fused) = kiln::profile(|| program().realize().clone());
//! let (_, unfused) = kiln::with_execution(kiln::Execution::Unfused, || kiln::profile(|| program().realize().clone()));
//! assert_eq!(fused.launches(), 1);       // one kernel: mul, exp, add and the row sum
//! assert_eq!(unfused.launches(), 4);
//! println!("{fused}");                   // the per-kernel table
//! println!("{}", kiln::Profile::compare(&fused, &unfused));
//! # assert_eq!(y.dims(), &[256]);
//! ```

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::path::Path;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use kiln_runtime::trace::{self, Trace};
pub use kiln_runtime::trace::{Event as StepEvent, MemoryPeak, StepKind};

use crate::{Error, Result};

/// Runs `f`, recording every step that realizations inside it run on this thread, and
/// returns its value with the [`Profile`]. Only work realized inside `f` is seen: end the
/// closure with `.item()`, `.realize()` or an optimizer step.
pub fn profile<T>(f: impl FnOnce() -> T) -> (T, Profile) {
    let start = Instant::now();
    let (value, trace) = trace::capture(false, f);
    (value, Profile { trace, wall: start.elapsed() })
}

/// The steps one [`profile`] call recorded.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    trace: Trace,
    wall: Duration,
}

/// One kernel (or library call, or reference op) of a profile, over all its launches.
#[derive(Clone, Debug)]
pub struct KernelStats {
    /// The kernel's name (`k_<hash>`) or the op's.
    pub name: String,
    /// What ran.
    pub kind: StepKind,
    /// The ops it computes.
    pub ops: String,
    /// Why the fuser ended it (for kernels).
    pub cut: String,
    /// Its iteration space.
    pub shape: String,
    /// How many times it ran.
    pub launches: usize,
    /// Total time over its launches (compile time excluded).
    pub total: Duration,
    /// On a GPU, the part of `total` the host spent waiting for the device after queuing
    /// the launches; the rest is issuing them (see [`Profile::issue_time`]).
    pub waited: Duration,
    /// Bytes read over its launches.
    pub bytes_read: u64,
    /// Bytes written over its launches.
    pub bytes_written: u64,
    /// Time spent compiling it (zero when every launch came from the cache).
    pub compile: Duration,
    /// Launches served by the kernel cache.
    pub cache_hits: usize,
    /// The device whose plan ran it.
    pub device: crate::Device,
    /// The user lines that recorded its ops.
    pub sources: Vec<&'static std::panic::Location<'static>>,
    /// Whether a size-generic kernel ran (one compiled for every size of the kernel's form,
    /// reading its sizes when it runs; its `cut` says so too).
    pub generic: bool,
}

impl KernelStats {
    /// The mean time of one launch.
    pub fn mean(&self) -> Duration {
        self.total / u32::try_from(self.launches.max(1)).unwrap_or(u32::MAX)
    }

    /// Bytes moved per second over its launches, in GB/s.
    pub fn gbps(&self) -> f64 {
        (self.bytes_read + self.bytes_written) as f64 / self.total.as_secs_f64().max(1e-9) / 1e9
    }
}

impl Profile {
    /// Every step in execution order (planning steps included).
    pub fn events(&self) -> &[StepEvent] {
        &self.trace.events
    }

    fn steps(&self) -> impl Iterator<Item = &StepEvent> {
        self.trace.events.iter().filter(|e| e.kind != StepKind::Plan)
    }

    /// The steps grouped by kernel, in order of first launch.
    pub fn kernels(&self) -> Vec<KernelStats> {
        let mut order: Vec<KernelStats> = Vec::new();
        let mut index: HashMap<(String, String), usize> = HashMap::new();
        for e in self.steps() {
            let key = (e.name.clone(), e.shape.clone());
            let i = *index.entry(key).or_insert_with(|| {
                order.push(KernelStats {
                    name: e.name.clone(),
                    kind: e.kind,
                    ops: e.ops.clone(),
                    cut: e.cut.clone(),
                    shape: e.shape.clone(),
                    launches: 0,
                    total: Duration::ZERO,
                    waited: Duration::ZERO,
                    bytes_read: 0,
                    bytes_written: 0,
                    compile: Duration::ZERO,
                    cache_hits: 0,
                    sources: e.sources.clone(),
                    device: e.device,
                    generic: e.generic,
                });
                order.len() - 1
            });
            let k = &mut order[i];
            k.launches += 1;
            k.total += e.duration;
            k.waited += e.waited;
            k.bytes_read += e.bytes_read;
            k.bytes_written += e.bytes_written;
            match e.compile {
                Some(c) => k.compile += c,
                None if e.kind == StepKind::Kernel => k.cache_hits += 1,
                None => {}
            }
        }
        order
    }

    /// Steps run (kernel launches, library calls and reference ops). The kernels of a GPU
    /// row group are one launch; [`Profile::kernels`] lists each of them.
    pub fn launches(&self) -> usize {
        self.steps().filter(|e| !e.joined).count()
    }

    /// Time in steps, compile time excluded.
    pub fn step_time(&self) -> Duration {
        self.steps().map(|e| e.duration).sum()
    }

    /// On a GPU: the host's time issuing the steps (arguments, allocations, launch calls),
    /// apart from waiting for the device. A profiled GPU step waits for its kernels before
    /// the next is issued, so this is the launch overhead a CUDA graph removes. Zero on the CPU.
    pub fn issue_time(&self) -> Duration {
        self.steps()
            .filter(|e| e.device != crate::Device::Cpu)
            .map(|e| e.duration - e.waited.min(e.duration))
            .sum()
    }

    /// On a GPU: the time spent waiting for the device after issuing each step (the kernels'
    /// run plus the wait's latency). Zero on the CPU.
    pub fn device_wait_time(&self) -> Duration {
        self.steps().map(|e| e.waited).sum()
    }

    /// Time spent planning realizations (graph passes and fusion).
    pub fn planning_time(&self) -> Duration {
        self.trace.events.iter().filter(|e| e.kind == StepKind::Plan).map(|e| e.duration).sum()
    }

    /// Time spent compiling kernels.
    pub fn compile_time(&self) -> Duration {
        self.trace.events.iter().filter_map(|e| e.compile).sum()
    }

    /// Wall-clock time of the profiled closure (recording, planning and compiling included).
    pub fn wall_time(&self) -> Duration {
        self.wall
    }

    /// Realizations that ran (plans run, whether just made or replayed by a compiled
    /// function).
    pub fn realizations(&self) -> usize {
        self.trace.memory.len()
    }

    /// Plans made (graph passes and fusion); fewer than realizations when a compiled
    /// function replays its plan.
    pub fn plans(&self) -> usize {
        self.trace.events.iter().filter(|e| e.kind == StepKind::Plan).count()
    }

    /// Bytes read plus bytes written by every step.
    pub fn bytes_moved(&self) -> u64 {
        self.steps().map(|e| e.bytes_read + e.bytes_written).sum()
    }

    /// The largest memory peak of any realization, with the buffers live at that point.
    pub fn peak_memory(&self) -> MemoryPeak {
        self.trace.memory.iter().max_by_key(|m| m.peak_bytes).cloned().unwrap_or_default()
    }

    /// The Chrome trace-event JSON of the steps (open it in Perfetto or `chrome://tracing`).
    pub fn chrome_trace_json(&self) -> String {
        let mut out = String::from("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[");
        for (i, e) in self.trace.events.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            let sources: Vec<String> = e.sources.iter().map(ToString::to_string).collect();
            let _ = write!(
                out,
                "{{\"name\":{},\"cat\":{},\"ph\":\"X\",\"pid\":1,\"tid\":1,\"ts\":{:.3},\"dur\":{:.3},\"args\":{{\"ops\":{},\"cut\":{},\"shape\":{},\"bytes_read\":{},\"bytes_written\":{},\"compile_us\":{:.3},\"sources\":{}}}}}",
                json(&e.name),
                json(&format!("{:?}", e.kind).to_lowercase()),
                us(e.start),
                us(e.duration),
                json(&e.ops),
                json(&e.cut),
                json(&e.shape),
                e.bytes_read,
                e.bytes_written,
                e.compile.map_or(0.0, us),
                json(&sources.join(", ")),
            );
        }
        out.push_str("]}");
        out
    }

    /// Writes [`Profile::chrome_trace_json`] to `path`.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be written.
    pub fn to_chrome_trace(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.chrome_trace_json()).map_err(|e| Error::Io {
            op: "to_chrome_trace",
            detail: format!("cannot write {}: {e}", path.display()),
        })
    }

    /// Two profiles of the same work side by side (fused against unfused, typically), with
    /// the speed-up; `Display` prints it.
    pub fn compare<'a>(fused: &'a Profile, unfused: &'a Profile) -> Comparison<'a> {
        Comparison { fused, unfused }
    }
}

/// Two profiles side by side; see [`Profile::compare`].
#[derive(Clone, Copy, Debug)]
pub struct Comparison<'a> {
    fused: &'a Profile,
    unfused: &'a Profile,
}

impl Comparison<'_> {
    /// Unfused step time over fused step time.
    pub fn speedup(&self) -> f64 {
        self.unfused.step_time().as_secs_f64() / self.fused.step_time().as_secs_f64().max(1e-12)
    }
}

/// The bandwidth this machine reaches copying 64 MiB with every core, in GB/s (bytes read
/// plus written), measured once per process; the yardstick of the profile's GB/s column.
pub fn machine_bandwidth() -> f64 {
    static GBPS: LazyLock<f64> = LazyLock::new(|| {
        const N: usize = 1 << 23; // 8 Mi f64 = 64 MiB
        let src = vec![1.0f64; N];
        let mut dst = vec![0.0f64; N];
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        let chunk = N.div_ceil(threads);
        let mut best = f64::INFINITY;
        for _ in 0..4 {
            let start = Instant::now();
            std::thread::scope(|s| {
                for (d, c) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                    s.spawn(move || d.copy_from_slice(c));
                }
            });
            best = best.min(start.elapsed().as_secs_f64());
        }
        std::hint::black_box(&dst);
        (2 * N * 8) as f64 / best / 1e9
    });
    *GBPS
}

/// The bandwidth `device` copies at, in GB/s (bytes read plus written): the yardstick of
/// the profile's `%bw` column. The CPU's is [`machine_bandwidth`]; a GPU's is
/// [`crate::cuda::copy_bandwidth`] over 128 MiB (the median of five copies), measured once per
/// device and process (0 when the device cannot be used, which leaves the column empty).
pub fn copy_ceiling(device: crate::Device) -> f64 {
    static GPUS: std::sync::Mutex<Vec<(usize, f64)>> = std::sync::Mutex::new(Vec::new());
    match device {
        crate::Device::Cpu => machine_bandwidth(),
        crate::Device::Cuda(i) => {
            let mut known = GPUS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(&(_, gbps)) = known.iter().find(|(d, _)| *d == i) {
                return gbps;
            }
            let gbps = crate::cuda::copy_bandwidth(i, 1 << 27, 5).unwrap_or(0.0);
            known.push((i, gbps));
            gbps
        }
    }
}

/// `part` as a percentage of `whole`, or an empty column when there is no yardstick.
fn percent(part: f64, whole: f64) -> String {
    if whole > 0.0 { format!("{:.0}%", 100.0 * part / whole) } else { "-".to_string() }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}

fn kind_name(k: StepKind) -> &'static str {
    match k {
        StepKind::Kernel => "kernel",
        StepKind::Library => "library",
        StepKind::Reference => "reference",
        StepKind::Host => "host",
        StepKind::Plan => "plan",
        StepKind::Collective => "collective",
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<18} {:<9} {:>5} {:>9} {:>9} {:>8} {:>8} {:>7} {:>5} {:>8} {:>4}  ops [why the kernel ends]",
            "kernel",
            "kind",
            "runs",
            "total ms",
            "mean us",
            "MB read",
            "MB write",
            "GB/s",
            "%bw",
            "comp ms",
            "hits"
        )?;
        for k in self.kernels() {
            let cut = if k.cut.is_empty() { String::new() } else { format!(" [{}]", k.cut) };
            writeln!(
                f,
                "{:<18} {:<9} {:>5} {:>9.3} {:>9.1} {:>8.2} {:>8.2} {:>7.2} {:>5} {:>8.2} {:>4}  {}{cut}",
                k.name,
                kind_name(k.kind),
                k.launches,
                ms(k.total),
                k.mean().as_secs_f64() * 1e6,
                mb(k.bytes_read),
                mb(k.bytes_written),
                k.gbps(),
                percent(k.gbps(), copy_ceiling(k.device)),
                ms(k.compile),
                k.cache_hits,
                k.ops,
            )?;
        }
        let step = self.step_time();
        writeln!(
            f,
            "total: {} launches in {} realizations ({} planned); {:.3} ms in steps, {:.3} ms planning, {:.3} ms compiling, {:.3} ms wall",
            self.launches(),
            self.realizations(),
            self.plans(),
            ms(step),
            ms(self.planning_time()),
            ms(self.compile_time()),
            ms(self.wall),
        )?;
        // A GPU plan's steps are measured against the GPU's copies (its host work included:
        // it is time the step took).
        let device =
            self.steps().map(|e| e.device).find(|d| *d != crate::Device::Cpu).unwrap_or_default();
        let (ceiling, what) = match device {
            crate::Device::Cpu => (machine_bandwidth(), "this machine copies at".to_string()),
            d => (copy_ceiling(d), format!("{d} copies at")),
        };
        let gbps = self.bytes_moved() as f64 / step.as_secs_f64().max(1e-9) / 1e9;
        writeln!(
            f,
            "moved {:.2} MB at {gbps:.2} GB/s ({} of the {ceiling:.1} GB/s {what})",
            mb(self.bytes_moved()),
            percent(gbps, ceiling),
        )?;
        if device != crate::Device::Cpu {
            let launches =
                self.steps().filter(|e| e.device != crate::Device::Cpu && !e.joined).count();
            let issue = self.issue_time();
            writeln!(
                f,
                "on {device}: {:.3} ms issuing {launches} steps on the host ({:.1} us each), {:.3} ms waiting for the device",
                ms(issue),
                issue.as_secs_f64() * 1e6 / launches.max(1) as f64,
                ms(self.device_wait_time()),
            )?;
        }
        let peak = self.peak_memory();
        write!(f, "peak memory {:.2} MB", mb(peak.peak_bytes))?;
        if !peak.largest.is_empty() {
            let largest: Vec<String> = peak
                .largest
                .iter()
                .map(|(b, op, at)| match at {
                    Some(at) => format!("{:.2} MB {op} at {at}", mb(*b)),
                    None => format!("{:.2} MB {op}", mb(*b)),
                })
                .collect();
            write!(f, "; largest live then: {}", largest.join(", "))?;
        }
        Ok(())
    }
}

impl fmt::Display for Comparison<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (a, b) = (self.fused, self.unfused);
        writeln!(f, "{:<22} {:>12} {:>12}", "", "fused", "unfused")?;
        let rows: [(&str, f64, f64, usize); 7] = [
            ("launches", a.launches() as f64, b.launches() as f64, 0),
            ("step time (ms)", ms(a.step_time()), ms(b.step_time()), 3),
            ("planning (ms)", ms(a.planning_time()), ms(b.planning_time()), 3),
            ("compiling (ms)", ms(a.compile_time()), ms(b.compile_time()), 3),
            ("wall (ms)", ms(a.wall_time()), ms(b.wall_time()), 3),
            ("MB moved", mb(a.bytes_moved()), mb(b.bytes_moved()), 2),
            ("peak memory (MB)", mb(a.peak_memory().peak_bytes), mb(b.peak_memory().peak_bytes), 2),
        ];
        for (name, x, y, digits) in rows {
            writeln!(f, "{name:<22} {x:>12.digits$} {y:>12.digits$}")?;
        }
        writeln!(f, "speed-up (step time): {:.2}x", self.speedup())?;
        let kernels: Vec<KernelStats> =
            a.kernels().into_iter().filter(|k| k.kind == StepKind::Kernel).collect();
        if !kernels.is_empty() {
            writeln!(f, "fused kernels and why each ends where it does:")?;
        }
        for k in kernels {
            writeln!(f, "  {} {}: {} [{}]", k.name, k.shape, k.ops, k.cut)?;
        }
        Ok(())
    }
}

/// A JSON string literal.
fn json(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
