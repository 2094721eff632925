//! Row groups on a GPU: a plan's consecutive kernels over the same rows, run as the one
//! kernel [`kiln_codegen::cuda::rows`] writes for them (a block per row, one launch).

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use cudarc::driver::{CudaFunction, LaunchConfig};
use kiln_codegen::cuda::library::LibraryKernel;
use kiln_codegen::cuda::param_types;
use kiln_codegen::cuda::rows::{self as codegen, GroupBuffer, RowMember, RowProgram};
use kiln_ir::fuse::KernelStep;
use kiln_ir::{Graph, NodeId};

use super::Gpu;
use super::kernels::{Arg, launch, library_functions};
use crate::exec::Bufs;
use crate::rows::GroupRun;
use crate::trace::{self, KernelRun};
use crate::{Buffer, RunError, RuntimeError};

/// How a group's kernel is launched: at most `threads` threads per block, at most
/// `blocks_per_sm` blocks per multiprocessor (a grid-stride loop over rows covers the rest).
/// 512 and 32 (an H200's best of 128 to 1024 and 8 or 32 on softmax and cross-entropy rows)
/// unless `KILN_CUDA_ROW_THREADS` and `KILN_CUDA_ROW_BLOCKS` say otherwise (for
/// tuning on a device; a group's source is written for its threads per block).
#[derive(Clone, Copy)]
struct Launch {
    threads: u32,
    blocks_per_sm: u64,
    /// Registers per thread the kernel may keep shared rows in (`KILN_CUDA_ROW_CACHE`).
    cache_registers: usize,
}

fn launch_sizes() -> Launch {
    static SIZES: std::sync::LazyLock<Launch> = std::sync::LazyLock::new(|| {
        use kiln_ir::settings::Setting;
        Launch {
            threads: Setting::CudaRowThreads.number().unwrap_or(512),
            blocks_per_sm: Setting::CudaRowBlocks.number::<u64>().unwrap_or(32).max(1),
            cache_registers: Setting::CudaRowCache.number().unwrap_or(codegen::CACHE_REGISTERS),
        }
    });
    *SIZES
}

/// A row group's kernel, made when its plan is prepared: its source, the node each buffer
/// argument holds (with whether the group writes it), its threads per block, and its
/// compiled entry point once the first run has looked it up. A run builds nothing.
pub(crate) struct GroupKernel {
    kernel: LibraryKernel,
    nodes: Vec<(NodeId, bool)>,
    threads: u32,
    rows: usize,
    function: OnceLock<Arc<CudaFunction>>,
}

impl GroupKernel {
    /// The kernel of a group of `members` over `rows` rows.
    pub(crate) fn new(graph: &Graph, members: &[&KernelStep], rows: usize) -> GroupKernel {
        // The group's buffers: each node once, inputs from outside first seen where read.
        let mut nodes: Vec<(NodeId, bool)> = Vec::new();
        let index_of = |n: NodeId, written: bool, nodes: &mut Vec<(NodeId, bool)>| {
            if let Some(i) = nodes.iter().position(|&(m, _)| m == n) {
                return i;
            }
            nodes.push((n, written));
            nodes.len() - 1
        };
        let mut program_members = Vec::with_capacity(members.len());
        for k in members {
            let inputs = k.inputs.iter().map(|&n| index_of(n, false, &mut nodes)).collect();
            let outputs = k.outputs.iter().map(|&n| index_of(n, true, &mut nodes)).collect();
            program_members.push(RowMember { kernel: &k.kernel, inputs, outputs });
        }
        let buffers = (nodes.iter())
            .map(|&(n, written)| GroupBuffer { dtype: graph.node(n).dtype, written })
            .collect();
        let program = RowProgram { members: program_members, buffers, rows };
        let threads = codegen::threads(&program, launch_sizes().threads);
        let source = codegen::source(&program, threads, launch_sizes().cache_registers);
        let name = codegen::entry_name(&source).expect("a group's source names its entry").into();
        let kernel = LibraryKernel { source, entries: vec![name] };
        GroupKernel { kernel, nodes, threads, rows, function: OnceLock::new() }
    }

    /// The source and entry point, to compile ahead of the first run.
    pub(crate) fn library_kernel(&self) -> &LibraryKernel {
        &self.kernel
    }

    /// The compiled entry point, and the time compiling it took when this call did.
    fn function(
        &self,
        gpu: &'static Gpu,
    ) -> Result<(Arc<CudaFunction>, Option<std::time::Duration>), RuntimeError> {
        if let Some(f) = self.function.get() {
            return Ok((f.clone(), None));
        }
        let compiling = Instant::now();
        let cached = super::kernels::library_cached(gpu, &self.kernel);
        let f = library_functions(gpu, &self.kernel)?[0].clone();
        let _ = self.function.set(f.clone());
        Ok((f, (!cached).then(|| compiling.elapsed())))
    }
}

/// Runs `members` (a group's steps, in order) as its `kernel` on `gpu`. Returns every output
/// but the `dropped` ones (those only the group reads, unless a checked run keeps them) and, when
/// `tracing`, one trace event per member, the launch's time shared out among them.
pub(crate) fn run_group(
    gpu: &'static Gpu,
    graph: &Graph,
    members: &[&KernelStep],
    kernel: &GroupKernel,
    dropped: &[NodeId],
    bufs: &Bufs,
    tracing: bool,
) -> Result<GroupRun, RunError> {
    let started = Instant::now();
    let root = graph.node(members[0].outputs[0]);
    let at =
        |error: RuntimeError| RunError { error, op: Some(root.op.name()), origin: root.origin };
    let (function, compile) = kernel.function(gpu).map_err(at)?;
    // Every output gets a device buffer (the group's internal ones are dropped after it).
    let mut produced: Vec<(NodeId, Buffer)> = Vec::new();
    for k in members {
        for (&n, len) in k.outputs.iter().zip(k.kernel.output_lens()) {
            produced.push((n, Buffer::on_gpu(gpu, graph.node(n).dtype, len).map_err(at)?));
        }
    }
    let mut args = Vec::new();
    for &(n, written) in &kernel.nodes {
        let buffer = if written {
            &produced.iter().find(|(m, _)| *m == n).expect("every output has a buffer").1
        } else {
            &bufs[&n]
        };
        args.push(Arg::Ptr(buffer.device_ptr(gpu).map_err(at)?));
    }
    for k in members {
        for (&t, &v) in param_types(&k.kernel).iter().zip(&k.params) {
            args.push(Arg::param(t, v));
        }
    }
    args.push(Arg::I64(i64::try_from(kernel.rows).unwrap_or(i64::MAX)));
    let blocks = (kernel.rows as u64).clamp(1, u64::from(gpu.sms) * launch_sizes().blocks_per_sm);
    let config = LaunchConfig {
        grid_dim: (u32::try_from(blocks).unwrap_or(1), 1, 1),
        block_dim: (kernel.threads, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments follow `codegen::source`'s signature (a pointer per buffer, each
    // member's parameters of `param_types`, the rows); every member writes all positions of
    // its outputs' rows, each of which has a buffer of the output's length; inputs are read
    // through views the graph checked to lie inside their buffers, and group-internal reads
    // stay inside their rows (`rows::find`); buffers live until the stream has run the
    // kernel, since freed blocks are reused only by later work on the same stream.
    unsafe { launch(gpu, &function, &args, config) }.map_err(at)?;
    let mut events = Vec::new();
    if tracing {
        let waiting = std::time::Instant::now();
        gpu.synchronize().map_err(at)?;
        let waited = waiting.elapsed();
        let wall = started.elapsed();
        let bytes = |n: &NodeId| match produced.iter().find(|(m, _)| m == n) {
            Some((_, b)) => trace::bytes(b),
            None => trace::bytes(&bufs[n]),
        };
        // One launch: its time is shared out by the bytes each member moves (the group
        // is memory-bound), so every member's GB/s is the group's.
        let moved: Vec<(u64, u64)> = members
            .iter()
            .map(|k| (k.inputs.iter().map(bytes).sum(), k.outputs.iter().map(bytes).sum()))
            .collect();
        let total: u64 = moved.iter().map(|(r, w)| r + w).sum();
        for (i, (k, &(read, written))) in members.iter().zip(&moved).enumerate() {
            let info = KernelRun {
                compiled: None,
                generated: true,
                compile: compile.filter(|_| i == 0),
                cuda_marks: Vec::new(),
            };
            let fraction = if total > 0 {
                (read + written) as f64 / total as f64
            } else {
                1.0 / members.len() as f64
            };
            let share = wall.mul_f64(fraction);
            let mut e = trace::kernel_event(graph, k, info, read, written, share);
            e.waited = waited.mul_f64(fraction);
            e.cut = format!(
                "{}; one launch with its row group of {} kernels (time shared by bytes moved)",
                e.cut,
                members.len()
            );
            e.joined = i > 0;
            events.push(e);
        }
    }
    let outs = produced.into_iter().filter(|(n, _)| !dropped.contains(n)).collect();
    Ok((outs, events))
}
