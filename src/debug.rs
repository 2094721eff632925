//! Looking at what kiln records and generates: the graph a realization would run, before and
//! after fusion, and the kernels it compiles.
//!
//! Set `KILN_DEBUG=1` to print one line per executed step (kernel, shape, time, GB/s, fused
//! ops) to standard error, and `KILN_DEBUG=2` to also print each newly compiled kernel's IR
//! and Cranelift IR.

use crate::Tensor;

/// When consecutive CPU kernels over the same rows form a row group (see
/// [`with_row_group_sizes`]).
pub use kiln_runtime::rows::RowGroupSizes;

/// Runs a closure with row groups formed at other sizes on this thread: kernels over the
/// same rows (softmax, layer norm, cross-entropy and their gradients) normally run a tile
/// of rows at a time from a million positions up. Tests use tiny sizes to run the grouped
/// schedule on small tensors; `min_positions: usize::MAX` turns grouping off.
///
/// ```
/// use kiln::prelude::*;
/// use kiln::debug::{RowGroupSizes, with_row_group_sizes};
/// let x = Tensor::randn([8, 16]);
/// x.realize();
/// let tiny = RowGroupSizes { min_positions: 1, tile_positions: 1 };
/// let (y, profile) = with_row_group_sizes(tiny, || kiln::profile(|| x.softmax(-1).to_vec::<f32>()));
/// assert!(profile.events().iter().any(|e| e.cut.contains("row tile by row tile")));
/// assert_eq!(y, x.softmax(-1).to_vec::<f32>());
/// ```
pub use kiln_runtime::rows::with_row_group_sizes;

/// The graph that computing `tensors` would run now, in Graphviz DOT: one box per op with
/// its shape and dtype, realized inputs as `input` nodes, and the results kiln would keep
/// drawn bold. Nothing is computed.
///
/// ```
/// use kiln::prelude::*;
/// let x = Tensor::ones([2, 3]);
/// let y = (&x * 2.0).exp().sum_dim(1, false);
/// let dot = kiln::debug::graph_dot(&[&y]);
/// assert!(dot.starts_with("digraph"));
/// assert!(dot.contains("exp") && dot.contains("sum[1]"));
/// ```
pub fn graph_dot(tensors: &[&Tensor]) -> String {
    let nodes: Vec<_> = tensors.iter().map(|t| t.storage().node()).collect();
    match crate::engine::realize::pending_graph(&nodes) {
        Ok(g) => g.to_dot(),
        Err(e) => format!(
            "digraph kiln {{\n    error [label=\"{}\"];\n}}\n",
            e.to_string().replace('"', "\\\"")
        ),
    }
}

/// What running a realization would take: the fused kernels and other ops of its plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanSummary {
    /// Generated kernels.
    pub kernels: usize,
    /// Other steps: ops that run on their own (matmul, gather, scatter, ...), reshapes that
    /// reuse a buffer, in-place assignments.
    pub other_ops: usize,
    /// For each kernel: its name, the ops it fuses, and why its result is stored.
    pub kernel_notes: Vec<String>,
    /// The text of each kernel.
    pub kernel_text: Vec<String>,
    /// The Cranelift IR generated for each kernel.
    pub clif: Vec<String>,
    /// The Cranelift IR of each kernel compiled size-generic with every size, stride and
    /// offset read when it runs (what serves its other sizes; see [`SizePolicy`]).
    pub generic_clif: Vec<String>,
}

/// The plan that computing `tensors` would run now under the current execution mode (see
/// [`crate::with_execution`]), without running it.
///
/// ```
/// use kiln::prelude::*;
/// let x = Tensor::ones([4, 4]);
/// x.realize();
/// let y = ((&x * 2.0).exp() + 1.0).sqrt();
/// assert_eq!(kiln::debug::plan_summary(&[&y]).kernels, 1);
/// assert_eq!(kiln::with_execution(kiln::Execution::Unfused, || kiln::debug::plan_summary(&[&y])).kernels, 4);
/// ```
pub fn plan_summary(tensors: &[&Tensor]) -> PlanSummary {
    use kiln_ir::fuse::Step;
    let nodes: Vec<_> = tensors.iter().map(|t| t.storage().node()).collect();
    let Ok(captured) = crate::engine::realize::pending_graph(&nodes) else {
        return PlanSummary::default();
    };
    let plan = plan(&captured, tensors);
    let graph = &plan.graph;
    let mut summary = PlanSummary::default();
    for step in plan.steps {
        match step {
            Step::Kernel(k) => {
                summary.kernels += 1;
                let ops: Vec<&str> = k.fused.iter().map(|&n| graph.node(n).op.name()).collect();
                summary.kernel_notes.push(format!(
                    "{}: {} (stored: {})",
                    k.kernel.name(),
                    ops.join(" "),
                    k.cut
                ));
                summary.kernel_text.push(k.kernel.to_string());
                summary
                    .clif
                    .push(kiln_runtime::exec::clif(&k.kernel).unwrap_or_else(|e| format!("; {e}")));
                summary.generic_clif.push(
                    kiln_runtime::exec::generic_clif(&k.kernel)
                        .unwrap_or_else(|e| format!("; {e}")),
                );
            }
            Step::Node(_)
            | Step::Library { .. }
            | Step::Alias { .. }
            | Step::AssignInPlace { .. }
            | Step::ScatterOntoFill { .. }
            | Step::ScatterInPlace { .. } => summary.other_ops += 1,
        }
    }
    summary
}

/// One kernel that a closure generated, as [`kernels`] returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelSource {
    /// The kernel's name: `k_` and a hash of its structure, stable across runs.
    pub name: String,
    /// The ops it fuses, in order.
    pub ops: String,
    /// Why the fuser ended it.
    pub cut: String,
    /// Its iteration space.
    pub shape: String,
    /// The backend-neutral kernel IR.
    pub text: String,
    /// The Cranelift IR of its CPU code (`None` for a kernel that ran on the reference
    /// executor).
    pub clif: Option<String>,
    /// The CUDA C the kernel compiles to on an NVIDIA GPU (NVRTC), generated from the same
    /// kernel IR (`None` for a `logsumexp` kernel: a GPU plan computes it as max, exp, sum
    /// and log).
    pub cuda: Option<String>,
}

/// Runs `f` and returns every distinct kernel that realizations inside it launched, in order
/// of first launch, with its kernel IR and generated code (Cranelift IR for the CPU, CUDA C
/// for NVIDIA GPUs): snapshot-test these to review every change to the code generators.
///
/// ```
/// use kiln::prelude::*;
/// let x = Tensor::ones([8, 8]);
/// x.realize();
/// let y = (&x * 2.0).exp().sum_dim(1, false); // the temporaries end with the statement
/// let (_, kernels) = kiln::debug::kernels(|| y.realize().clone());
/// assert_eq!(kernels.len(), 1);
/// assert_eq!(kernels[0].ops, "mul exp sum[1]");
/// assert!(kernels[0].clif.as_deref().unwrap().contains("function"));
/// ```
pub fn kernels<T>(f: impl FnOnce() -> T) -> (T, Vec<KernelSource>) {
    use kiln_runtime::trace::{self, StepKind};
    let (value, recorded) = trace::capture(true, f);
    let mut seen = std::collections::HashSet::new();
    let kernels = recorded
        .events
        .into_iter()
        .filter(|e| e.text.is_some() && seen.insert(e.name.clone()))
        .map(|e| KernelSource {
            name: e.name,
            ops: e.ops,
            cut: e.cut,
            shape: e.shape,
            text: e.text.unwrap_or_default(),
            clif: e.clif.filter(|_| e.kind == StepKind::Kernel),
            cuda: e.cuda,
        })
        .collect();
    (value, kernels)
}

/// The graph that computing `tensors` would run, after the graph passes and fusion, in
/// Graphviz DOT: each fused kernel is a box (a cluster) around the ops it computes, labelled
/// with its name and the reason the fuser ended it; library calls and reference ops stand
/// alone. Compare it with [`graph_dot`], the graph before.
///
/// ```
/// use kiln::prelude::*;
/// let x = Tensor::ones([4, 4]);
/// x.realize();
/// let y = (&x * 2.0).exp().sum_dim(1, false);
/// let dot = kiln::debug::fused_dot(&[&y]);
/// assert!(dot.contains("subgraph cluster_0") && dot.contains("exp"));
/// ```
pub fn fused_dot(tensors: &[&Tensor]) -> String {
    use std::fmt::Write as _;

    use kiln_ir::fuse::Step;
    let nodes: Vec<_> = tensors.iter().map(|t| t.storage().node()).collect();
    let plan = match crate::engine::realize::pending_graph(&nodes) {
        Ok(g) => plan(&g, tensors),
        Err(e) => {
            return format!(
                "digraph kiln {{\n    error [label=\"{}\"];\n}}\n",
                escape(&e.to_string())
            );
        }
    };
    let graph = &plan.graph;
    let label = |id: kiln_ir::NodeId| {
        let n = graph.node(id);
        escape(&format!("%{} = {}\\n{} {}", id.index(), n.op, n.shape, n.dtype))
    };
    let mut out = String::from("digraph kiln {\n    node [shape=box];\n");
    let mut drawn = std::collections::HashSet::new();
    for (i, step) in plan.steps.iter().enumerate() {
        match step {
            Step::Kernel(k) => {
                let _ = writeln!(
                    out,
                    "    subgraph cluster_{i} {{\n        label=\"{} (ends: {})\";\n        style=rounded;",
                    k.kernel.name(),
                    escape(&k.cut.to_string())
                );
                for &n in &k.fused {
                    drawn.insert(n);
                    let _ = writeln!(out, "        n{} [label=\"{}\"];", n.index(), label(n));
                }
                out.push_str("    }\n");
            }
            Step::Node(n)
            | Step::Library { node: n, .. }
            | Step::Alias { node: n, .. }
            | Step::AssignInPlace { node: n, .. }
            | Step::ScatterOntoFill { node: n, .. }
            | Step::ScatterInPlace { node: n } => {
                drawn.insert(*n);
                let _ =
                    writeln!(out, "    n{} [label=\"{}\", style=filled];", n.index(), label(*n));
            }
        }
    }
    for id in graph.topo_order() {
        if !drawn.contains(&id) {
            let _ = writeln!(out, "    n{} [label=\"{}\", style=dashed];", id.index(), label(id));
        }
        for a in graph.args(id) {
            let _ = writeln!(out, "    n{} -> n{};", a.index(), id.index());
        }
    }
    for o in graph.outputs() {
        let _ = writeln!(out, "    n{} [penwidth=2];", o.index());
    }
    out.push_str("}\n");
    out
}

fn escape(s: &str) -> String {
    s.replace('"', "\\\"")
}

/// The options the executor would plan `tensors` with now: fused or not as set, priced for
/// the device of the first tensor (the reference executor's graphs are shown fused).
fn options(tensors: &[&Tensor]) -> kiln_ir::pipeline::PlanOptions {
    use kiln_ir::pipeline::{Constants, Fusion, PlanOptions};
    let device = tensors.first().map_or(crate::Device::Cpu, |t| t.device());
    crate::engine::execution::plan_options(Constants::Fold, device).unwrap_or(PlanOptions {
        fusion: Fusion::Fused,
        constants: Constants::Fold,
        target: device.target(),
    })
}

/// The plan the executor would make for the captured graph of `tensors`.
fn plan(captured: &kiln_ir::Graph, tensors: &[&Tensor]) -> kiln_ir::pipeline::Plan {
    kiln_ir::pipeline::Planner::default().plan(captured, options(tensors))
}

/// What each stage of the planner makes of the graph that computing `tensors` would run
/// now: `(stage, text)` pairs, the graph after each named pass, then the partition (each
/// stored value and why) and the lowered steps with their Kernel IR. `KILN_DEBUG=passes`
/// prints the same to standard error for every realization.
///
/// ```
/// use kiln::prelude::*;
/// let x = Tensor::ones([4]);
/// x.realize();
/// let y = (&x * 1.0).exp();
/// let stages = kiln::debug::passes(&[&y]);
/// let names: Vec<&str> = stages.iter().map(|(n, _)| n.as_str()).collect();
/// assert_eq!(
///     names,
///     [
///         "precise_log_softmax", "expand_logsumexp", "transpose_products", "gather_first",
///         "casts_before_views", "simplify", "cse", "partition.cuts", "partition.shared_values",
///         "partition.kept_results", "partition.into_reductions",
///         "partition.casts_into_producers", "partition.shared_into_consumers", "lower",
///         "reuse_buffers"
///     ]
/// );
/// assert!(stages[4].1.contains("mul"));   // before simplify: x * 1
/// assert!(!stages[5].1.contains("mul"));  // after it: gone
/// ```
pub fn passes(tensors: &[&Tensor]) -> Vec<(String, String)> {
    let nodes: Vec<_> = tensors.iter().map(|t| t.storage().node()).collect();
    let Ok(captured) = crate::engine::realize::pending_graph(&nodes) else { return Vec::new() };
    let mut stages = Vec::new();
    kiln_ir::pipeline::Planner::default().plan_observed(
        &captured,
        options(tensors),
        &mut |name, stage| stages.push((name.to_string(), stage.to_string())),
    );
    stages
}

/// The CPU kernel cache's counters: hits, misses, compiles, evictions, failed compiles,
/// size-generic compiles and the sizes they served, and what it holds now (kernels, bytes of
/// machine code).
///
/// ```
/// use kiln::prelude::*;
/// let x = Tensor::randn([16]);
/// (&x * 3.0).exp().to_vec::<f32>();
/// let before = kiln::debug::cache_stats();
/// (&x * 3.0).exp().to_vec::<f32>();          // the same kernel again
/// assert!(kiln::debug::cache_stats().hits > before.hits);
/// ```
///
/// A kernel that comes back with other sizes is compiled once more, size-generic, and that
/// compile serves every later size ([`SizePolicy`]):
///
/// ```
/// use kiln::prelude::*;
/// let before = kiln::debug::cache_stats();
/// for n in [300, 301, 302, 303, 304] {
///     (Tensor::randn([n, 7]) * 3.0).tanh().sum().item::<f32>();
/// }
/// let after = kiln::debug::cache_stats();
/// assert!(after.generic > before.generic && after.served > before.served);
/// ```
pub fn cache_stats() -> CacheStats {
    kiln_runtime::exec::cache_stats()
}

/// The counters of a kernel cache.
pub use kiln_runtime::cache::{CacheLimits, CacheStats};

/// When kernels (CPU and CUDA) are compiled size-generic: `KILN_SIZES` (`auto` by default), or
/// [`set_size_policy`].
pub use kiln_runtime::exec::{SizePolicy, set_size_policy, size_policy};

/// What of the CPU generated code relies on beyond the baseline ISA ([`with_clif_features`]).
pub use kiln_runtime::CpuFeatures;

/// Runs `f` with the Cranelift IR that [`plan_summary`] and [`kernels`] report generated for
/// a host with `features` rather than this one (text only: what runs is this host's code),
/// so a snapshot of it reads the same on every host.
///
/// ```
/// use kiln::debug::CpuFeatures;
/// use kiln::prelude::*;
/// let x = Tensor::ones([64]);
/// x.realize();
/// let y = (&x * 2.0).exp();
/// let clif = kiln::debug::with_clif_features(CpuFeatures::X86_64_BASELINE, || {
///     kiln::debug::plan_summary(&[&y]).clif.remove(0)
/// });
/// assert!(clif.contains("function") && !clif.contains(" fma "));
/// ```
pub fn with_clif_features<T>(features: CpuFeatures, f: impl FnOnce() -> T) -> T {
    kiln_runtime::trace::with_clif_features(features, f)
}

/// Every CPU kernel the code generator could not compile, by name, with its message. Their
/// ops run on the reference executor (correct, much slower); each failure is also written to
/// stderr once, counted in [`cache_stats`]`().failures`, and noted on the kernel's profile
/// row. An empty list is the normal case.
///
/// ```
/// assert!(kiln::debug::compile_failures().is_empty());
/// ```
pub fn compile_failures() -> Vec<(String, String)> {
    kiln_runtime::exec::compile_failures()
}

/// How many matrix products of GPU tensors ran on the host (`gemm` over device↔host copies)
/// because cuBLAS could not take their layout: batch dimensions with no single stride
/// (heads split by a reshape and a transpose), `k == 0`, or sizes past 2³¹. Each shows as a
/// `host` step in profiles, and the first at each call site warns on standard error. 0 is
/// the normal case, and always on the CPU.
///
/// ```
/// assert_eq!(kiln::debug::host_products(), 0);
/// ```
pub fn host_products() -> u64 {
    kiln_runtime::exec::host_products()
}

/// How many kernel runs the correctness oracle (`KILN_CHECK`, [`crate::with_check`]) left
/// unchecked: a kernel that could not be compiled runs on the reference executor, and the
/// oracle would only compare the reference with itself. The first such run is also written to
/// stderr. 0 is the normal case.
///
/// ```
/// kiln::with_check(|| (kiln::Tensor::ones([4]) * 2.0).to_vec::<f32>());
/// assert_eq!(kiln::debug::unchecked_kernel_runs(), 0);
/// ```
pub fn unchecked_kernel_runs() -> u64 {
    kiln_runtime::exec::unchecked_runs()
}

/// Whether bf16 matrix products on the CPU run on its bf16 dot-product instructions
/// (AVX512-BF16: about twice f32's rate; sums in f32, subnormals flushed to zero as the
/// instruction does) rather than widened to f32 for `gemm` (exact products, f32 sums, at
/// f32's speed). Profiles name the path in a bf16 product's ops column
/// (`matmul bf16-dot` or `matmul bf16-widened-to-f32`). Setting the environment variable
/// `KILN_NO_BF16_DOT` selects the widening path.
///
/// ```
/// // Either answer is a working configuration; it depends on the CPU.
/// let fast = kiln::debug::bf16_dot_products();
/// println!("bf16 products on dot-product instructions: {fast}");
/// ```
pub fn bf16_dot_products() -> bool {
    kiln_runtime::bf16_dot_products()
}

/// Lets this thread's bf16 products on the CPU use its bf16 dot products where it has them
/// (`true`, the default) or makes them widen to f32 (`false`), returning the previous
/// setting: a hook for testing both paths on one machine.
#[doc(hidden)]
pub fn allow_bf16_dot_products(allow: bool) -> bool {
    kiln_runtime::allow_bf16_dot_products(allow)
}

/// Makes this thread's bf16 products run the bf16 dot-product path with a portable loop in
/// place of the AVX512-BF16 instruction (`true`), on any x86-64 host, returning the previous
/// setting: a hook for testing that path where the CPU lacks the instruction. Profiles name
/// it `matmul bf16-dot-portable`.
#[doc(hidden)]
pub fn portable_bf16_dot_products(on: bool) -> bool {
    kiln_runtime::portable_bf16_dot_products(on)
}

/// Makes every new CPU compile on this thread fail (`true`) or work again (`false`),
/// returning the previous setting: a hook for testing the reference-executor fallback.
/// Kernels already compiled stay cached.
#[doc(hidden)]
pub fn fail_cpu_compiles(fail: bool) -> bool {
    kiln_runtime::exec::fail_compiles(fail)
}

/// Bounds every kernel cache (the CPU's and each GPU's) to `limits`; the least recently used
/// kernels are evicted past them. `KILN_KERNEL_CACHE=N[,BYTES]` sets them at start-up
/// (default 4096 kernels, 256 MiB of code).
pub fn set_kernel_cache_limits(limits: CacheLimits) {
    kiln_runtime::cache::set_limits(limits);
}
