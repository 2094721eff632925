//! The executor: runs a graph as a plan of fused kernels (compiled once and cached) and the
//! ops that are not fused.

use rustc_hash::FxHashMap as HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kiln_codegen::cpu::{self, CpuKernel};
use kiln_ir::fuse::{FusionPolicy, KernelStep, Step, partition_for};
use kiln_ir::kernel::Kernel;
use kiln_ir::{Graph, NodeId};

use crate::trace::{self, Event, MemoryPeak, StepKind};
use crate::{Buffer, CheckReport, Device, RunError, RuntimeError, cuda, native, reference, rows};

/// How a graph is executed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Execution {
    /// Elementwise chains fused into generated kernels (the default).
    #[default]
    Fused,
    /// One generated kernel per op: the unfused baseline.
    Unfused,
    /// The reference executor: one plain loop per op, in f64. The correctness oracle.
    Reference,
}

/// Counters of the kernel cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Kernels compiled.
    pub compiled: u64,
    /// Launches served by an already compiled kernel.
    pub hits: u64,
    /// Kernels that failed to compile and ran on the reference executor instead.
    pub fallbacks: u64,
}

/// Compiled kernels keyed by the kernel itself: its structural hash picks the bucket and
/// full equality confirms the match, so two kernels share code exactly when they would
/// generate the same code (parameter values and buffer identities are not part of it).
struct Cache {
    kernels: HashMap<Kernel, Option<Arc<CpuKernel>>>,
    stats: CacheStats,
}

static CACHE: LazyLock<Mutex<Cache>> = LazyLock::new(|| {
    Mutex::new(Cache { kernels: HashMap::default(), stats: CacheStats::default() })
});

/// The kernel cache's counters.
pub fn cache_stats() -> CacheStats {
    CACHE.lock().unwrap_or_else(PoisonError::into_inner).stats
}

/// The compiled kernel for `step`, from the cache or compiled now (with the time the
/// compile took); `None` when it cannot be compiled (the step then runs on the reference
/// executor).
fn compiled(step: &KernelStep) -> (Option<Arc<CpuKernel>>, Option<Duration>) {
    {
        let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(found) = cache.kernels.get(&step.kernel).cloned() {
            cache.stats.hits += 1;
            return (found, None);
        }
    }
    // Compile outside the lock: another thread may compile the same kernel meanwhile, which
    // costs a duplicate compile but never blocks on one.
    let started = Instant::now();
    let result = cpu::compile(&step.kernel).ok().map(Arc::new);
    let took = started.elapsed();
    let mut cache = CACHE.lock().unwrap_or_else(PoisonError::into_inner);
    if result.is_some() {
        cache.stats.compiled += 1;
    } else {
        cache.stats.fallbacks += 1;
    }
    (cache.kernels.entry(step.kernel.clone()).or_insert(result).clone(), Some(took))
}

/// The Cranelift IR of a kernel's generated code (compiling it if it is not cached yet).
///
/// # Errors
/// The code generator's message if the kernel cannot be compiled.
pub fn clif(kernel: &Kernel) -> Result<String, String> {
    if let Some(Some(k)) = CACHE.lock().unwrap_or_else(PoisonError::into_inner).kernels.get(kernel)
    {
        return Ok(k.clif().to_string());
    }
    cpu::compile(kernel).map(|k| k.clif().to_string()).map_err(|e| e.to_string())
}

/// Runs `graph` on `device` with `inputs` bound to its `Input` nodes and returns its outputs'
/// buffers (on `device`; inputs elsewhere are copied there first).
///
/// With `check` (a tolerance scale, 1.0 for the default tolerances), every fused kernel's
/// result is compared with the reference executor's value of the same node; the first
/// kernel that differs is reported as [`RuntimeError::CheckFailed`].
///
/// # Errors
/// A [`RunError`] naming the op that failed: out of memory, an index out of range, or a
/// failed check.
pub fn run(
    graph: &Graph,
    inputs: &[Buffer],
    mode: Execution,
    check: Option<f64>,
    device: Device,
) -> Result<Vec<Buffer>, RunError> {
    let fuse = match mode {
        Execution::Reference => {
            let host = on_device(inputs, Device::Cpu)?;
            return on_device(&reference::run(graph, &host)?, device);
        }
        Execution::Fused => true,
        Execution::Unfused => false,
    };
    Prepared::new(graph, fuse, false, device).run(inputs, check)
}

/// `buffers` on `device` (copies of those elsewhere).
fn on_device(buffers: &[Buffer], device: Device) -> Result<Vec<Buffer>, RunError> {
    buffers.iter().map(|b| b.to_device(device).map_err(RunError::from)).collect()
}

/// A graph made ready to run: optimized, partitioned, its kernels compiled. Running it again
/// with new input buffers costs no planning, hashing or compiling; built `symbolic`, it can
/// also take new values for its constants and random keys between runs ([`Prepared::rebind`]).
pub struct Prepared {
    graph: Graph,
    device: Device,
    steps: Vec<PreparedStep>,
    /// How many steps (and outputs) read each node: buffers are freed after the last.
    readers: Vec<u32>,
    outputs: Vec<NodeId>,
    /// The node of the prepared graph that each node of the given graph became.
    map: HashMap<NodeId, NodeId>,
    /// Where each `Full` node's value is a kernel parameter: (step, parameter).
    params_of: HashMap<NodeId, Vec<(usize, usize)>>,
    /// Runs of CPU kernel steps that execute row tile by row tile (see [`crate::rows`]).
    groups: Vec<rows::RowGroup>,
    /// Scatters whose base is one value everywhere, with the step of the kernel that would
    /// have written that base: the kernel is skipped and the scatter fills its output with
    /// the kernel's parameter (read at run time, so `compile()` can rebind it).
    fills: HashMap<NodeId, usize>,
}

/// The scatters of a CPU plan whose base only a constant kernel writes and only they read
/// (the gradient of a gather scatters into zeros): scatter node -> the kernel's step.
fn constant_scatter_bases(
    graph: &Graph,
    steps: &[PreparedStep],
    readers: &[u32],
) -> HashMap<NodeId, usize> {
    let mut writer: HashMap<NodeId, usize> = HashMap::default();
    for (i, s) in steps.iter().enumerate() {
        if let PreparedStep::Kernel { step, .. } = s
            && let [out] = step.outputs[..]
            && step.kernel.inputs.is_empty()
            && let kiln_ir::kernel::ExprKind::Param(_) =
                step.kernel.exprs[step.kernel.outputs[0]].kind
            && step.kernel.reduce.is_none()
        {
            writer.insert(out, i);
        }
    }
    let mut fills = HashMap::default();
    for s in steps {
        if let PreparedStep::Node(n) = s
            && let kiln_ir::Op::Scatter { .. } = graph.node(*n).op
            && let Some(&k) = writer.get(&graph.args(*n)[0])
            && readers[graph.args(*n)[0].index()] == 1
        {
            fills.insert(*n, k);
        }
    }
    fills
}

/// The value a constant kernel (see [`constant_scatter_bases`]) writes.
fn fill_value(step: &PreparedStep) -> kiln_ir::Scalar {
    let PreparedStep::Kernel { step, .. } = step else {
        unreachable!("fills come from kernel steps")
    };
    let kiln_ir::kernel::ExprKind::Param(p) = step.kernel.exprs[step.kernel.outputs[0]].kind else {
        unreachable!("a constant kernel stores a parameter")
    };
    step.params[p]
}

enum PreparedStep {
    Kernel {
        step: Box<KernelStep>,
        kernel: Option<Arc<CpuKernel>>,
        /// Compile time not yet reported (the first run reports it).
        compile: Option<Duration>,
    },
    Node(NodeId),
    MatMul(NodeId, [(NodeId, kiln_ir::View); 2]),
}

impl Prepared {
    /// Optimizes and partitions `graph` (fused or one kernel per op) for `device` and compiles
    /// its CPU kernels (through the kernel cache; CUDA kernels are compiled by their first
    /// run). `symbolic` keeps constants and random keys rebindable.
    pub fn new(graph: &Graph, fuse: bool, symbolic: bool, device: Device) -> Prepared {
        let planning = Instant::now();
        let (optimized, map) = if symbolic {
            kiln_ir::passes::optimize_symbolic(graph)
        } else {
            // Simplify and merge common subexpressions; outputs may merge, so remember where
            // each went.
            let (g, outputs) = kiln_ir::passes::optimize(graph);
            (g, graph.outputs().iter().copied().zip(outputs).collect())
        };
        let policy = if fuse { FusionPolicy::On } else { FusionPolicy::Off };
        let plan = partition_for(&optimized, policy, device.fusion_target());
        let outputs: Vec<NodeId> = graph.outputs().iter().map(|o| map[o]).collect();
        let bound = optimized.topo_order().iter().map(|n| n.index() + 1).max().unwrap_or(0);
        let mut readers = vec![0u32; bound];
        let mut params_of: HashMap<NodeId, Vec<(usize, usize)>> = HashMap::default();
        let mut steps = Vec::with_capacity(plan.steps.len());
        for (i, step) in plan.steps.into_iter().enumerate() {
            let read = |n: NodeId, readers: &mut Vec<u32>| readers[n.index()] += 1;
            steps.push(match step {
                Step::Kernel(k) => {
                    for &n in &k.inputs {
                        read(n, &mut readers);
                    }
                    for (j, &n) in k.param_nodes.iter().enumerate() {
                        params_of.entry(n).or_default().push((i, j));
                    }
                    let (kernel, compile) =
                        if device == Device::Cpu { compiled(&k) } else { (None, None) };
                    PreparedStep::Kernel { step: k, kernel, compile }
                }
                Step::Node(n) => {
                    for a in optimized.args(n) {
                        read(a, &mut readers);
                    }
                    PreparedStep::Node(n)
                }
                Step::MatMul { node, operands } => {
                    for (n, _) in &operands {
                        read(*n, &mut readers);
                    }
                    PreparedStep::MatMul(node, operands)
                }
            });
        }
        for &o in &outputs {
            readers[o.index()] += 1;
        }
        let gpu_compiling = Instant::now();
        if let Device::Cuda(i) = device
            && let Ok(gpu) = cuda::gpu(i)
        {
            let kernels: Vec<&Kernel> = steps
                .iter()
                .filter_map(|s| match s {
                    PreparedStep::Kernel { step, .. } => Some(&step.kernel),
                    _ => None,
                })
                .collect();
            let mut took = cuda::precompile(gpu, &kernels).into_iter();
            for s in &mut steps {
                if let PreparedStep::Kernel { compile, .. } = s {
                    *compile = took.next().flatten();
                }
            }
        }
        let gpu_compiling = gpu_compiling.elapsed();
        if trace::enabled() {
            let ops = format!("{} nodes, {} steps", optimized.len(), steps.len());
            let mut e = plain_event("plan", StepKind::Plan, ops, String::new());
            // CPU kernels compile one by one; GPU kernels in parallel (their wall time).
            let compiling: Duration = if device == Device::Cpu {
                steps
                    .iter()
                    .filter_map(|s| match s {
                        PreparedStep::Kernel { compile, .. } => *compile,
                        _ => None,
                    })
                    .sum()
            } else {
                gpu_compiling
            };
            e.duration = planning.elapsed().saturating_sub(compiling);
            trace::record(planning, e);
        }
        // Grouping and fills change the schedule, not the kernels: one kernel per op (the
        // unfused baseline) keeps its one-pass-per-op schedule.
        let (groups, fills) = if device == Device::Cpu && fuse {
            let fills = constant_scatter_bases(&optimized, &steps, &readers);
            let kernels: Vec<Option<&KernelStep>> = steps
                .iter()
                .enumerate()
                .map(|(i, s)| match s {
                    PreparedStep::Kernel { step, kernel: Some(_), .. }
                        if !fills.values().any(|&k| k == i) =>
                    {
                        Some(&**step)
                    }
                    _ => None,
                })
                .collect();
            (rows::find(&kernels, &readers), fills)
        } else {
            (Vec::new(), HashMap::default())
        };
        Prepared {
            graph: optimized,
            device,
            steps,
            readers,
            outputs,
            map,
            params_of,
            groups,
            fills,
        }
    }

    /// Gives the `Full` or `Random` node `node` of the graph this was prepared from a new
    /// value or key (`op`), for the following runs. Nodes that optimization dropped are
    /// ignored.
    ///
    /// # Panics
    /// If `op` is not of the node's kind (see [`Graph::rebind_leaf`]).
    pub fn rebind(&mut self, node: NodeId, op: &kiln_ir::Op) {
        let Some(&n) = self.map.get(&node) else { return };
        if &self.graph.node(n).op == op {
            return;
        }
        if let (kiln_ir::Op::Full(v), Some(uses)) = (op, self.params_of.get(&n)) {
            for &(s, j) in uses {
                if let PreparedStep::Kernel { step, .. } = &mut self.steps[s] {
                    step.params[j] = *v;
                }
            }
        }
        self.graph.rebind_leaf(n, op.clone());
    }

    /// The device the plan runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The number of steps (kernels, library calls and reference ops) one run takes.
    pub fn steps(&self) -> usize {
        self.steps.len()
    }

    /// Runs the plan with `inputs` bound to the graph's `Input` nodes, in order; returns the
    /// outputs' buffers (new buffers on every run). `check` compares every kernel with the
    /// reference executor, as [`run`] does.
    ///
    /// # Errors
    /// As [`run`].
    pub fn run(&mut self, inputs: &[Buffer], check: Option<f64>) -> Result<Vec<Buffer>, RunError> {
        let graph = &self.graph;
        let tracing = trace::enabled();
        let mut memory = tracing.then(MemoryPeak::default);
        let gpu = match self.device {
            Device::Cpu => None,
            Device::Cuda(i) => Some(cuda::gpu(i)?),
        };
        let moved;
        let inputs = if inputs.iter().all(|b| b.device() == self.device) {
            inputs
        } else {
            moved = on_device(inputs, self.device)?;
            &moved[..]
        };
        // GPU work is queued, not done: a traced step waits for it so its time is its own.
        let settle = |at: &kiln_ir::Node| -> Result<(), RunError> {
            match gpu {
                Some(g) if tracing => g.synchronize().map_err(|error| RunError {
                    error,
                    op: Some(at.op.name()),
                    origin: at.origin,
                }),
                _ => Ok(()),
            }
        };
        let mut bufs = Bufs(vec![None; self.readers.len()]);
        for (&n, b) in graph.inputs().iter().zip(inputs) {
            bufs.insert(n, b.clone());
        }
        let mut readers = self.readers.clone();
        let mut done_reading = |bufs: &mut Bufs, n: NodeId| {
            let r = &mut readers[n.index()];
            *r -= 1;
            if *r == 0 {
                bufs.remove(&n);
            }
        };
        let mut index = 0;
        while index < self.steps.len() {
            let started = Instant::now();
            if let Some(group) = self.groups.iter().find(|g| g.start == index) {
                // The oracle compares every kernel's full outputs: a checked run keeps the
                // group's internal buffers whole.
                let keep_all = check.is_some();
                let steps = &mut self.steps[group.start..group.end];
                let (outs, events) = run_row_group(graph, steps, group, &bufs, tracing, keep_all)?;
                // Laid end to end from the group's start: the kernels ran interleaved, tile
                // by tile, and their durations are their shares of the group's time.
                let mut at = started;
                for e in events {
                    let next = at + e.duration;
                    trace::record(at, e);
                    at = next;
                }
                for (node, buf) in outs {
                    bufs.insert(node, buf);
                }
                track_memory(memory.as_mut(), graph, &bufs, None);
                // In order: a buffer a later member reads is not freed before that member
                // is checked (its read is counted).
                for s in &self.steps[group.start..group.end] {
                    let PreparedStep::Kernel { step: k, .. } = s else { continue };
                    if let Some(scale) = check {
                        let expected = kernel_reference(graph, k, &bufs)?;
                        for (out, want) in k.outputs.iter().zip(&expected) {
                            compare(graph, k, &bufs[out], want, scale)?;
                        }
                    }
                    for &n in &k.inputs {
                        if keep_all || !group.internal.contains(&n) {
                            done_reading(&mut bufs, n);
                        }
                    }
                }
                index = group.end;
                continue;
            }
            if self.fills.values().any(|&k| k == index) {
                // A constant base: the scatter that reads it fills its own output.
                index += 1;
                continue;
            }
            let fill = match &self.steps[index] {
                PreparedStep::Node(n) => self.fills.get(n).map(|&k| fill_value(&self.steps[k])),
                _ => None,
            };
            let step = &mut self.steps[index];
            index += 1;
            match step {
                PreparedStep::Node(n) => {
                    let args = graph.args(*n);
                    let (arg_bufs, (out, kind)) = match fill {
                        Some(value) => {
                            let arg_bufs: Vec<&Buffer> =
                                args[1..].iter().map(|a| &bufs[a]).collect();
                            let out = native::scatter_onto_fill(graph, *n, value, &arg_bufs)?;
                            (arg_bufs, (out, StepKind::Library))
                        }
                        None => {
                            let arg_bufs: Vec<&Buffer> = args.iter().map(|a| &bufs[a]).collect();
                            let out = eval_node_on(gpu, graph, *n, &arg_bufs)?;
                            (arg_bufs, out)
                        }
                    };
                    settle(graph.node(*n))?;
                    if tracing {
                        let node = graph.node(*n);
                        let name = node.op.name();
                        let mut e = plain_event(name, kind, name.to_string(), String::new());
                        e.shape = node.shape.to_string();
                        e.bytes_read = arg_bufs.iter().map(|b| bytes(b)).sum();
                        e.bytes_written = bytes(&out);
                        e.sources = node.origin.into_iter().collect();
                        e.duration = started.elapsed();
                        trace::record(started, e);
                        track_memory(memory.as_mut(), graph, &bufs, Some((*n, &out)));
                    }
                    for a in args {
                        done_reading(&mut bufs, a);
                    }
                    bufs.insert(*n, out);
                }
                PreparedStep::MatMul(node, operands) => {
                    let n = graph.node(*node);
                    let [(a, va), (b, vb)] = &*operands;
                    let out = matmul_on(gpu, &bufs[a], va, &bufs[b], vb).map_err(|error| {
                        RunError { error, op: Some(n.op.name()), origin: n.origin }
                    })?;
                    settle(n)?;
                    if tracing {
                        let mut e = plain_event(
                            "matmul",
                            StepKind::Library,
                            "matmul".into(),
                            String::new(),
                        );
                        e.shape = format!("{} @ {}", va.shape(), vb.shape());
                        e.bytes_read = bytes(&bufs[a]) + bytes(&bufs[b]);
                        e.bytes_written = bytes(&out);
                        e.sources = n.origin.into_iter().collect();
                        e.duration = started.elapsed();
                        trace::record(started, e);
                        track_memory(memory.as_mut(), graph, &bufs, Some((*node, &out)));
                    }
                    for (o, _) in &*operands {
                        done_reading(&mut bufs, *o);
                    }
                    bufs.insert(*node, out);
                }
                PreparedStep::Kernel { step: k, kernel, compile } => {
                    let (outs, compile, generated) = match gpu {
                        None => {
                            let outs = run_kernel(graph, k, kernel.as_deref(), &bufs)?;
                            // The compile is reported once, by the first run (if traced).
                            (outs, compile.take(), kernel.is_some())
                        }
                        Some(g) => {
                            let (outs, took) = run_gpu_kernel(g, graph, k, &bufs)?;
                            settle(graph.node(k.outputs[0]))?;
                            // Compiled while planning (in parallel), or now.
                            (outs, compile.take().or(took), true)
                        }
                    };
                    if tracing {
                        let info = KernelRun { compiled: kernel.clone(), generated, compile };
                        let read = k.inputs.iter().map(|i| bytes(&bufs[i])).sum();
                        let written = outs.iter().map(bytes).sum();
                        let e = kernel_event(graph, k, info, read, written, started.elapsed());
                        trace::record(started, e);
                        track_memory(memory.as_mut(), graph, &bufs, Some((k.outputs[0], &outs[0])));
                    }
                    if let Some(scale) = check {
                        let expected = kernel_reference(graph, k, &bufs)?;
                        for (out, want) in outs.iter().zip(&expected) {
                            compare(graph, k, out, want, scale)?;
                        }
                    }
                    for &n in &k.inputs {
                        done_reading(&mut bufs, n);
                    }
                    for (node, buf) in k.outputs.iter().zip(outs) {
                        bufs.insert(*node, buf);
                    }
                }
            }
        }
        if let Some(memory) = memory {
            trace::record_memory(memory);
        }
        Ok(self.outputs.iter().map(|o| bufs[o].clone()).collect())
    }
}

/// The live buffers of a run, by node index.
struct Bufs(Vec<Option<Buffer>>);

impl Bufs {
    fn insert(&mut self, n: NodeId, b: Buffer) {
        self.0[n.index()] = Some(b);
    }

    fn remove(&mut self, n: &NodeId) {
        self.0[n.index()] = None;
    }

    fn iter(&self) -> impl Iterator<Item = (NodeId, &Buffer)> {
        self.0.iter().enumerate().filter_map(|(i, b)| b.as_ref().map(|b| (NodeId::new(i), b)))
    }
}

impl std::ops::Index<&NodeId> for Bufs {
    type Output = Buffer;
    fn index(&self, n: &NodeId) -> &Buffer {
        self.0[n.index()]
            .as_ref()
            .expect("a step reads only buffers computed before it and not yet freed")
    }
}

/// The ops of a fused kernel for people: scalar constants and their broadcasts are left
/// out, reductions show their axes and casts their target.
pub fn describe_ops(graph: &Graph, nodes: &[NodeId]) -> String {
    use kiln_ir::Op;
    let is_constant = |n: NodeId| matches!(graph.node(n).op, Op::Full(_));
    let shown: Vec<String> = nodes
        .iter()
        .filter(|&&n| match &graph.node(n).op {
            Op::Full(_) => false,
            Op::View(_) => !graph.args(n).into_iter().all(is_constant),
            _ => true,
        })
        .map(|&n| match &graph.node(n).op {
            op @ (Op::Reduce { .. } | Op::Cast(_)) => op.to_string(),
            op => op.name().to_string(),
        })
        .collect();
    shown.join(" ")
}

fn bytes(b: &Buffer) -> u64 {
    (b.len() * b.dtype().size_in_bytes()) as u64
}

fn plain_event(name: &str, kind: StepKind, ops: String, cut: String) -> Event {
    Event {
        name: name.to_string(),
        kind,
        ops,
        cut,
        shape: String::new(),
        start: Duration::ZERO,
        duration: Duration::ZERO,
        bytes_read: 0,
        bytes_written: 0,
        compile: None,
        sources: Vec::new(),
        text: None,
        clif: None,
        cuda: None,
    }
}

/// How a kernel step ran: on generated code (with its compile time, if it was compiled for
/// this launch), or on the reference executor.
struct KernelRun {
    /// The CPU kernel, when one ran.
    compiled: Option<Arc<CpuKernel>>,
    /// Whether generated code ran (on the CPU or a GPU) rather than the reference executor.
    generated: bool,
    compile: Option<Duration>,
}

fn kernel_event(
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
    let mut e = plain_event(&k.kernel.name(), kind, describe_ops(graph, &k.fused), cut);
    e.shape = k.kernel.shape.to_string();
    e.duration = duration;
    e.compile = info.compile;
    e.bytes_read = bytes_read;
    e.bytes_written = bytes_written;
    let mut sources: Vec<_> = k.fused.iter().filter_map(|&n| graph.node(n).origin).collect();
    sources.dedup();
    e.sources = sources;
    if trace::wants_sources() {
        e.text = Some(k.kernel.to_string());
        e.clif = info.compiled.map(|c| c.clif().to_string());
        e.cuda = Some(kiln_codegen::cuda::source(&k.kernel));
    }
    e
}

/// Updates the peak of live bytes with the buffers live while a step's output is written.
fn track_memory(
    memory: Option<&mut MemoryPeak>,
    graph: &Graph,
    bufs: &Bufs,
    new: Option<(NodeId, &Buffer)>,
) {
    let Some(memory) = memory else { return };
    let mut live: Vec<(u64, NodeId)> = bufs.iter().map(|(n, b)| (bytes(b), n)).collect();
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

/// Compares a kernel's output with the reference value, within a tolerance for its dtype
/// (scaled by `scale`): generated math is a few ULP from the reference's f64 math.
fn compare(
    graph: &Graph,
    step: &KernelStep,
    got: &Buffer,
    want: &Buffer,
    scale: f64,
) -> Result<(), RunError> {
    use kiln_ir::DType;
    let tolerance = |d: DType| match d {
        DType::F64 => 1e-12,
        DType::F32 => 1e-5,
        DType::F16 => 4e-3,
        DType::BF16 => 3e-2,
        _ => 0.0,
    };
    // A float result is as precise as the least precise float the kernel computes with (an
    // f64 result of f32 math carries f32 rounding).
    let dtype = got.dtype();
    let tol = scale
        * if dtype.is_float() {
            step.kernel
                .exprs
                .iter()
                .map(|e| e.dtype)
                .filter(|d| d.is_float())
                .map(tolerance)
                .fold(tolerance(dtype), f64::max)
        } else {
            0.0
        };
    let all = kiln_ir::View::contiguous(kiln_ir::Shape::from([got.len()]));
    let (g, w) = (got.gather::<f64>(&all), want.gather::<f64>(&all));
    let bad = g.iter().zip(&w).position(|(a, b)| {
        !((a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= tol * b.abs().max(1.0))
    });
    let Some(i) = bad else { return Ok(()) };
    let root = graph.node(step.outputs[0]);
    let ops: Vec<&str> = step.fused.iter().map(|&n| graph.node(n).op.name()).collect();
    let mut sources: Vec<String> =
        step.fused.iter().filter_map(|&n| graph.node(n).origin).map(|l| l.to_string()).collect();
    sources.dedup();
    Err(RunError {
        error: RuntimeError::CheckFailed(Box::new(CheckReport {
            kernel: step.kernel.name(),
            ops: ops.join(" "),
            detail: format!(
                "element {i} is {}, the reference gives {} (tolerance {tol:e})",
                g[i], w[i]
            ),
            sources: sources.join(", "),
            text: step.kernel.to_string(),
        })),
        op: Some(root.op.name()),
        origin: root.origin,
    })
}

/// Runs a node that is not a kernel: natively or on the reference executor on the host; on
/// a GPU with a library kernel, or else on host copies of its inputs with the result copied
/// back.
fn eval_node_on(
    gpu: Option<&'static cuda::Gpu>,
    graph: &Graph,
    n: NodeId,
    args: &[&Buffer],
) -> Result<(Buffer, StepKind), RunError> {
    if let Some(g) = gpu
        && let Some(out) = cuda::eval_node(g, graph, n, args)
    {
        return Ok((out?, StepKind::Library));
    }
    let device = gpu.map_or(Device::Cpu, |g| g.device());
    let host;
    let args = if device == Device::Cpu {
        args
    } else {
        host = on_device(&args.iter().map(|&b| b.clone()).collect::<Vec<_>>(), Device::Cpu)?;
        &host.iter().collect::<Vec<_>>()[..]
    };
    let (out, kind) = match crate::native::eval(graph, n, args) {
        Some(out) => (out?, StepKind::Library),
        None => (reference::eval_node(graph, n, args)?, StepKind::Reference),
    };
    let node = graph.node(n);
    let out = out.to_device(device).map_err(|error| RunError {
        error,
        op: Some(node.op.name()),
        origin: node.origin,
    })?;
    Ok((out, kind))
}

/// A matrix product: `gemm` on the CPU, cuBLAS on a GPU (or the host's `gemm` over copies
/// for operand layouts cuBLAS cannot take).
fn matmul_on(
    gpu: Option<&'static cuda::Gpu>,
    a: &Buffer,
    va: &kiln_ir::View,
    b: &Buffer,
    vb: &kiln_ir::View,
) -> Result<Buffer, RuntimeError> {
    let Some(gpu) = gpu else { return crate::matmul::matmul(a, va, b, vb) };
    if let Some(out) = cuda::matmul(gpu, a, va, b, vb)? {
        return Ok(out);
    }
    let (ha, hb) = (a.to_device(Device::Cpu)?, b.to_device(Device::Cpu)?);
    if a.dtype() != kiln_ir::DType::BF16 {
        return crate::matmul::matmul(&ha, va, &hb, vb)?.to_device(gpu.device());
    }
    // `gemm` has no bf16: multiply in f32 and round once.
    let dense = |b: &Buffer, v: &kiln_ir::View| -> Result<(Buffer, kiln_ir::View), RuntimeError> {
        Ok((Buffer::from_slice(&b.gather::<f32>(v))?, kiln_ir::View::contiguous(v.shape().clone())))
    };
    let ((fa, fva), (fb, fvb)) = (dense(&ha, va)?, dense(&hb, vb)?);
    let product = crate::matmul::matmul(&fa, &fva, &fb, &fvb)?;
    let all = kiln_ir::View::contiguous(kiln_ir::Shape::from([product.len()]));
    Buffer::from_slice(&product.gather::<half::bf16>(&all))?.to_device(gpu.device())
}

/// Launches a kernel step on a GPU.
fn run_gpu_kernel(
    gpu: &'static cuda::Gpu,
    graph: &Graph,
    step: &KernelStep,
    bufs: &Bufs,
) -> Result<(Vec<Buffer>, Option<Duration>), RunError> {
    let root = graph.node(step.outputs[0]);
    let inputs: Vec<&Buffer> = step.inputs.iter().map(|i| &bufs[i]).collect();
    let dtypes: Vec<_> = step.outputs.iter().map(|&o| graph.node(o).dtype).collect();
    cuda::run_kernel(gpu, step, &dtypes, &inputs).map_err(|error| RunError {
        error,
        op: Some(root.op.name()),
        origin: root.origin,
    })
}

/// The buffers a row group leaves for later steps, and its trace events.
type GroupRun = (Vec<(NodeId, Buffer)>, Vec<Event>);

/// Runs a row group's kernels tile by tile (see [`crate::rows`]), returning the outputs read
/// after the group and, when `tracing`, one event per kernel: the group's wall time shared
/// out in proportion to the time each kernel's calls took.
fn run_row_group(
    graph: &Graph,
    steps: &mut [PreparedStep],
    group: &rows::RowGroup,
    bufs: &Bufs,
    tracing: bool,
    keep_all: bool,
) -> Result<GroupRun, RunError> {
    let started = Instant::now();
    let mut members = Vec::with_capacity(steps.len());
    let mut compiles = Vec::with_capacity(steps.len());
    for s in steps.iter_mut() {
        let PreparedStep::Kernel { step, kernel: Some(kernel), compile } = s else {
            unreachable!("a row group holds compiled CPU kernels")
        };
        compiles.push((compile.take(), kernel.clone()));
        let sizes = step.outputs.iter().map(|&o| graph.node(o).dtype.size_in_bytes()).collect();
        members.push(rows::Member { step, kernel, sizes });
    }
    // Every output that is read after the group gets a full buffer.
    let mut specs = Vec::new();
    let mut owners = Vec::new();
    for (m, member) in members.iter().enumerate() {
        let lens = member.step.kernel.output_lens();
        for (o, (&n, len)) in member.step.outputs.iter().zip(lens).enumerate() {
            if keep_all || !group.internal.contains(&n) {
                specs.push((graph.node(n).dtype, len));
                owners.push((m, o, n));
            }
        }
    }
    let root = graph.node(members[0].step.outputs[0]);
    let at =
        |error: RuntimeError| RunError { error, op: Some(root.op.name()), origin: root.origin };
    let mut took = Vec::new();
    // SAFETY: the group came from `rows::find` over these steps; external inputs are live
    // buffers the graph checked the kernels' views against; every full output is written
    // at every position (each member computes all of its rows, tile by tile).
    let filled = unsafe {
        Buffer::from_raw_fill_many(&specs, |ptrs| {
            let mut outputs: Vec<Vec<Option<*mut u8>>> =
                members.iter().map(|m| vec![None; m.step.outputs.len()]).collect();
            for (&(m, o, _), &p) in owners.iter().zip(ptrs) {
                outputs[m][o] = Some(p);
            }
            let input = |n: NodeId| bufs[&n].as_ptr();
            took = rows::run(&members, group.rows, group.tile, &input, &outputs, tracing)?;
            Ok::<(), RuntimeError>(())
        })
    };
    let outs = filled.map_err(at)?.map_err(at)?;
    let mut events = Vec::new();
    if tracing {
        let wall = started.elapsed();
        let total: f64 = took.iter().sum();
        // Bytes of every buffer of the group, internal ones included.
        let mut sizes: HashMap<NodeId, u64> = HashMap::default();
        for m in &members {
            for ((&n, len), size) in
                m.step.outputs.iter().zip(m.step.kernel.output_lens()).zip(&m.sizes)
            {
                sizes.insert(n, (len * size) as u64);
            }
        }
        for ((m, t), (compile, kernel)) in members.iter().zip(&took).zip(compiles) {
            let k = m.step;
            let read = k
                .inputs
                .iter()
                .map(|n| sizes.get(n).copied().unwrap_or_else(|| bytes(&bufs[n])))
                .sum();
            let written = k.outputs.iter().map(|n| sizes[n]).sum();
            let share = if total > 0.0 { t / total } else { 1.0 / members.len() as f64 };
            let info = KernelRun { compiled: Some(kernel), generated: true, compile };
            let mut e = kernel_event(graph, k, info, read, written, wall.mul_f64(share));
            e.cut = format!("{}; runs row tile by row tile with its group", e.cut);
            events.push(e);
        }
    }
    let nodes = owners.into_iter().map(|(_, _, n)| n);
    Ok((nodes.zip(outs).collect(), events))
}

/// Positions per thread task: large enough to amortize a task, small enough to balance.
const CHUNK: usize = 1 << 15;

fn run_kernel(
    graph: &Graph,
    step: &KernelStep,
    kernel: Option<&CpuKernel>,
    bufs: &Bufs,
) -> Result<Vec<Buffer>, RunError> {
    let root = graph.node(step.outputs[0]);
    let at =
        |error: RuntimeError| RunError { error, op: Some(root.op.name()), origin: root.origin };
    let Some(kernel) = kernel else {
        return run_fused_nodes_on_reference(graph, step, bufs);
    };
    let n = step.kernel.output_len();
    // Domain positions per output position: 1, or the size of a reduction's reduced dims.
    let per_output = (step.kernel.shape.numel() / n.max(1)).max(1);
    let params: Vec<u64> = cpu::param_slots(&step.kernel, &step.params);
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
    let entry = kernel.entry();
    let call = |start: usize, end: usize| {
        let a = &args;
        // SAFETY: see `run_kernel`; `start..end` lies inside `0..n`.
        unsafe { entry(a.0, a.1, start as u64, end as u64) };
    };
    let chunk = (CHUNK / per_output).max(kernel.min_chunk());
    if n <= chunk || rayon::current_num_threads() == 1 {
        call(0, n);
        return;
    }
    use rayon::prelude::*;
    (0..n.div_ceil(chunk)).into_par_iter().for_each(|c| call(c * chunk, ((c + 1) * chunk).min(n)));
}

/// Runs the nodes of a kernel that could not be compiled, one by one on the reference
/// executor.
fn run_fused_nodes_on_reference(
    graph: &Graph,
    step: &KernelStep,
    bufs: &Bufs,
) -> Result<Vec<Buffer>, RunError> {
    kernel_reference(graph, step, bufs)
}

/// The reference executor's values of a kernel's outputs, computed from the buffers the
/// kernel reads (host copies of device buffers): what the check oracle compares each kernel
/// with, so that a difference is this kernel's alone, not carried from an earlier one.
fn kernel_reference(
    graph: &Graph,
    step: &KernelStep,
    bufs: &Bufs,
) -> Result<Vec<Buffer>, RunError> {
    let mut local: HashMap<NodeId, Buffer> = HashMap::default();
    for &n in &step.fused {
        let mut args = Vec::new();
        for a in graph.args(n) {
            let b = match local.get(&a) {
                Some(b) => b.clone(),
                None => bufs[&a].to_device(Device::Cpu)?,
            };
            args.push(b);
        }
        let refs: Vec<&Buffer> = args.iter().collect();
        let out = reference::eval_node(graph, n, &refs)?;
        local.insert(n, out);
    }
    Ok(step.outputs.iter().map(|o| local[o].clone()).collect())
}
