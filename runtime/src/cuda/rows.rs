//! Row groups on a GPU: a plan's consecutive kernels over the same rows, run as the one
//! kernel [`kiln_codegen::cuda::rows`] writes for them (a block per row, one launch).

use std::time::Instant;

use cudarc::driver::LaunchConfig;
use kiln_codegen::cuda::library::LibraryKernel;
use kiln_codegen::cuda::param_types;
use kiln_codegen::cuda::rows::{self as codegen, RowMember, RowProgram};
use kiln_ir::fuse::KernelStep;
use kiln_ir::{Graph, NodeId};

use super::Gpu;
use super::kernels::{Arg, launch, library_functions};
use crate::exec::Bufs;
use crate::rows::{GroupRun, RowGroup};
use crate::trace::{self, KernelRun};
use crate::{Buffer, RunError, RuntimeError};

/// Blocks per multiprocessor a group's launch asks for at most (a grid-stride loop over
/// rows covers the rest).
const BLOCKS_PER_SM: u64 = 8;

/// The kernel of a group of `members` over `rows` rows, the node each of its buffer
/// arguments holds (with whether the group writes it), and its threads per block.
fn group_kernel(
    graph: &Graph,
    members: &[&KernelStep],
    rows: usize,
) -> (LibraryKernel, Vec<(NodeId, bool)>, u32) {
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
    let buffers = nodes.iter().map(|&(n, w)| (graph.node(n).dtype, w)).collect();
    let program = RowProgram { members: program_members, buffers, rows };
    let name = codegen::entry_name(&program);
    let kernel = LibraryKernel { source: codegen::source(&program), entries: vec![name] };
    (kernel, nodes, codegen::threads(&program))
}

/// The kernel of a row group of `members` over `rows` rows (compiled ahead of its first run
/// with the rest of its plan).
pub(crate) fn row_group_kernel(
    graph: &Graph,
    members: &[&KernelStep],
    rows: usize,
) -> LibraryKernel {
    group_kernel(graph, members, rows).0
}

/// Runs `members` (the steps of `group`, in order) as one kernel on `gpu`. Returns every
/// output read after the group (all of them with `keep_all`, for checked runs) and, when
/// `tracing`, one trace event per member, the launch's time shared out among them.
pub(crate) fn run_group(
    gpu: &'static Gpu,
    graph: &Graph,
    members: &[&KernelStep],
    group: &RowGroup,
    bufs: &Bufs,
    tracing: bool,
    keep_all: bool,
) -> Result<GroupRun, RunError> {
    let started = Instant::now();
    let root = graph.node(members[0].outputs[0]);
    let at =
        |error: RuntimeError| RunError { error, op: Some(root.op.name()), origin: root.origin };
    let (kernel, nodes, threads) = group_kernel(graph, members, group.rows);
    let compiling = Instant::now();
    let cached = super::kernels::library_cached(gpu, &kernel);
    let functions = library_functions(gpu, &kernel).map_err(at)?;
    let compile = (!cached).then(|| compiling.elapsed());
    // Every output gets a device buffer (the group's internal ones are dropped after it).
    let mut produced: Vec<(NodeId, Buffer)> = Vec::new();
    for k in members {
        for (&n, len) in k.outputs.iter().zip(k.kernel.output_lens()) {
            produced.push((n, Buffer::on_gpu(gpu, graph.node(n).dtype, len).map_err(at)?));
        }
    }
    let mut args = Vec::new();
    for &(n, written) in &nodes {
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
    args.push(Arg::I64(i64::try_from(group.rows).unwrap_or(i64::MAX)));
    let blocks = (group.rows as u64).clamp(1, u64::from(gpu.sms) * BLOCKS_PER_SM);
    let config = LaunchConfig {
        grid_dim: (u32::try_from(blocks).unwrap_or(1), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the arguments follow `codegen::source`'s signature (a pointer per buffer, each
    // member's parameters of `param_types`, the rows); every member writes all positions of
    // its outputs' rows, each of which has a buffer of the output's length; inputs are read
    // through views the graph checked to lie inside their buffers, and group-internal reads
    // stay inside their rows (`rows::find`); buffers live until the stream has run the
    // kernel, since freed blocks are reused only by later work on the same stream.
    unsafe { launch(gpu, &functions[0], &args, config) }.map_err(at)?;
    let mut events = Vec::new();
    if tracing {
        gpu.synchronize().map_err(at)?;
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
            let info =
                KernelRun { compiled: None, generated: true, compile: compile.filter(|_| i == 0) };
            let share = if total > 0 {
                wall.mul_f64((read + written) as f64 / total as f64)
            } else {
                wall / u32::try_from(members.len()).unwrap_or(1)
            };
            let mut e = trace::kernel_event(graph, k, info, read, written, share);
            e.cut = format!(
                "{}; one launch with its row group of {} kernels (time shared by bytes moved)",
                e.cut,
                members.len()
            );
            e.joined = i > 0;
            events.push(e);
        }
    }
    let outs =
        produced.into_iter().filter(|(n, _)| keep_all || !group.internal.contains(n)).collect();
    Ok((outs, events))
}
