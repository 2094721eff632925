//! Row groups: consecutive CPU kernels that each work on the same rows run tile by tile.
//!
//! A row softmax is three kernels over a `[rows, n]` tensor: the row maxima, the sum of
//! `exp(x - max)` (which also writes that exponential), and the division. Run one after the
//! other, each streams the whole tensor through memory, and the exponential is written out
//! only to be read back. But row `r` of each kernel reads only row `r` of what the kernels
//! before it wrote, so the three can instead run on a tile of a few rows at a time: the tile
//! stays in the core's cache between them, and a value that only the group reads (the
//! exponential) lives in a small per-tile scratch buffer and never reaches memory at all.
//! Layer norm and its gradients, log-softmax and cross-entropy have the same shape.
//!
//! This is scheduling, not code generation: a CPU kernel computes any range `start..end` of
//! its output positions, so a group calls each kernel on the tile's range, with the pointers
//! of group-internal buffers shifted so that the tile's rows land in its scratch.

use std::ptr::NonNull;

use kiln_codegen::cpu::CpuKernel;
use kiln_codegen::cuda::rows as cuda_rows;
use kiln_ir::fuse::KernelStep;
use kiln_ir::kernel::Kernel;
use kiln_ir::{NodeId, View};

use crate::exec::{Bufs, PreparedStep};
use crate::trace::{self, Event};
use crate::{Buffer, RunError};
use crate::{Device, RuntimeError};
use kiln_ir::Graph;
use rustc_hash::FxHashMap as HashMap;
use std::time::Instant;

/// When groups form and how large their tiles are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowGroupSizes {
    /// Kernels whose largest domain is smaller than this run one after another: their data
    /// already stays in the caches.
    pub min_positions: usize,
    /// Domain positions of the largest member per tile (at least one row).
    pub tile_positions: usize,
}

impl Default for RowGroupSizes {
    /// Groups from a million positions, tiles of 32K positions: a tile's buffers take a
    /// few hundred KiB, within a core's L2 cache.
    fn default() -> RowGroupSizes {
        RowGroupSizes { min_positions: 1 << 20, tile_positions: 1 << 15 }
    }
}

thread_local! {
    static SIZES: std::cell::Cell<RowGroupSizes> = std::cell::Cell::new(RowGroupSizes::default());
}

/// The sizes plans prepared on this thread group rows by.
pub fn row_group_sizes() -> RowGroupSizes {
    SIZES.with(std::cell::Cell::get)
}

/// Runs `f` with plans prepared on this thread grouping rows by `sizes` (tests use tiny
/// sizes to run the grouped schedule on small tensors, a row per tile).
pub fn with_row_group_sizes<T>(sizes: RowGroupSizes, f: impl FnOnce() -> T) -> T {
    let old = SIZES.with(|s| s.replace(sizes));
    struct Restore(RowGroupSizes);
    impl Drop for Restore {
        fn drop(&mut self) {
            SIZES.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(old);
    f()
}

/// Steps `start..end` of a plan, all CPU kernels over the same `rows`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RowGroup {
    pub start: usize,
    pub end: usize,
    pub rows: usize,
    /// Rows per tile.
    pub tile: usize,
    /// Outputs that only the group's own kernels read: they live in per-tile scratch.
    pub internal: Vec<NodeId>,
}

/// The row counts a kernel can be split by: products of its leading dimensions (for a
/// reduction, of its kept dimensions), larger than 1.
fn row_counts(k: &Kernel) -> Vec<usize> {
    let dims = k.shape.dims();
    let limit = k.reduce.map_or(dims.len(), |r| r.kept);
    let mut product = 1;
    let mut counts = Vec::new();
    for &d in &dims[..limit] {
        if d > 1 {
            product *= d;
            counts.push(product);
        }
    }
    counts
}

/// Whether `view` (over a domain whose first `row_dims` dimensions index the rows) reads,
/// at every position of row `r`, only elements `r * per_row .. (r + 1) * per_row` of its
/// buffer.
fn reads_its_row(view: &View, row_dims: usize, per_row: usize) -> bool {
    let dims = view.shape().dims();
    let strides = view.strides();
    // Row r starts at r * per_row; the offset and the inner dimensions must stay inside it.
    let mut reach = view.offset();
    for (&d, &s) in dims[row_dims..].iter().zip(&strides[row_dims..]) {
        if d > 1 {
            let Ok(s) = usize::try_from(s) else { return false };
            reach += s * (d - 1);
        }
    }
    if reach >= per_row {
        return false;
    }
    let mut expected = per_row;
    for (&d, &s) in dims[..row_dims].iter().zip(&strides[..row_dims]).rev() {
        if d > 1 && usize::try_from(s) != Ok(expected) {
            return false;
        }
        expected *= d;
    }
    true
}

/// The row counts (among `candidates`) for which `k` can join a group whose earlier members
/// produced `produced` (node, elements): every read of those nodes must be row-local.
fn fitting(
    k: &Kernel,
    inputs: &[NodeId],
    produced: &[(NodeId, usize)],
    candidates: &[usize],
    on: Grouping,
) -> Vec<usize> {
    let own = row_counts(k);
    candidates
        .iter()
        .copied()
        .filter(|rows| own.contains(rows))
        .filter(|&rows| on == Grouping::Cpu || cuda_rows::unsupported(k, rows).is_none())
        .filter(|&rows| {
            let Some(rd) = k.shape.leading_dims(rows) else { return false };
            inputs.iter().zip(&k.inputs).all(|(n, input)| {
                match produced.iter().find(|(p, _)| p == n) {
                    None => true,
                    Some(&(_, len)) => {
                        len % rows == 0 && reads_its_row(&input.view, rd, len / rows)
                    }
                }
            })
        })
        .collect()
}

/// Where a plan's row groups run, which decides what may join one and when a group pays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Grouping {
    /// Tile by tile on the CPU's threads, from [`RowGroupSizes::min_positions`] positions.
    Cpu,
    /// As one GPU kernel, a block per row ([`kiln_codegen::cuda::rows`]), at any size: it
    /// saves launches as well as memory traffic.
    Cuda,
}

/// Finds the row groups among a plan's steps: `kernels[i]` is step `i`'s kernel when it is
/// a kernel that may join a group. `readers[n]` counts every read of node `n` (plan outputs
/// included).
pub(crate) fn find(
    kernels: &[Option<&KernelStep>],
    readers: &[u32],
    on: Grouping,
) -> Vec<RowGroup> {
    let sizes = SIZES.with(std::cell::Cell::get);
    let mut groups = Vec::new();
    let mut i = 0;
    while i < kernels.len() {
        let Some(first) = kernels[i] else {
            i += 1;
            continue;
        };
        let mut candidates =
            fitting(&first.kernel, &first.inputs, &[], &row_counts(&first.kernel), on);
        let mut produced = outputs_of(first);
        let mut largest = first.kernel.shape.numel();
        let mut end = i + 1;
        while end < kernels.len() && !candidates.is_empty() {
            let Some(next) = kernels[end] else { break };
            let fit = fitting(&next.kernel, &next.inputs, &produced, &candidates, on);
            if fit.is_empty() {
                break;
            }
            candidates = fit;
            produced.extend(outputs_of(next));
            largest = largest.max(next.kernel.shape.numel());
            end += 1;
        }
        // Tiles are the group's only parallelism: a few rows of millions of elements run
        // faster as kernels split across the threads one after another.
        let threads = crate::team::threads();
        let rows = candidates.iter().max().copied().unwrap_or(0);
        // Only groups with a row reduction gain: they keep each row in cache from the
        // reduction to its use. Purely elementwise chains that the fusion pass left apart
        // (their values are read elsewhere too) run faster as whole kernels: W7's GELU
        // kernels took 1.04 ms per million elements grouped, 0.99 ms alone.
        let reduces = kernels[i..end].iter().flatten().any(|k| k.kernel.reduce.is_some());
        let pays = match on {
            Grouping::Cpu => largest >= sizes.min_positions && rows >= 2 * threads,
            Grouping::Cuda => true,
        };
        if end - i >= 2 && reduces && pays {
            let tile =
                (sizes.tile_positions / (largest / rows).max(1)).min(rows / (2 * threads)).max(1);
            let members = &kernels[i..end];
            let internal = produced
                .iter()
                .map(|&(n, _)| n)
                .filter(|n| {
                    let reads = members
                        .iter()
                        .flatten()
                        .flat_map(|k| &k.inputs)
                        .filter(|m| *m == n)
                        .count();
                    reads as u32 == readers[n.index()]
                })
                .collect();
            groups.push(RowGroup { start: i, end, rows, tile, internal });
            i = end;
        } else {
            i += 1;
        }
    }
    groups
}

fn outputs_of(k: &KernelStep) -> Vec<(NodeId, usize)> {
    k.outputs.iter().copied().zip(k.kernel.output_lens()).collect()
}

/// One member of a group as it runs.
pub(crate) struct Member<'a> {
    pub step: &'a KernelStep,
    pub kernel: &'a CpuKernel,
    /// The element size of each output.
    pub sizes: Vec<usize>,
}

/// Where a member's buffer is: a full buffer, or the tile's scratch for a group-internal
/// one (by index), with its elements per row and element size.
#[derive(Clone, Copy)]
enum Place {
    Full(*const u8),
    Scratch { slot: usize, per_row: usize, size: usize },
}

/// Runs the members over `rows` rows, `tile` rows at a time, in parallel over tiles. `input_ptr(n)`
/// gives the buffer of a node read from outside the group; `outputs[m][o]` is the full
/// buffer for member `m`'s output `o`, or `None` for a group-internal one. Returns the
/// seconds each member's calls took (measured when `timed`), summed over tiles and threads,
/// or [`RuntimeError::OutOfMemory`] when a tile's scratch cannot be allocated (a row of
/// millions of elements).
///
/// # Safety
/// The group must come from [`find`] over these steps (every read of an internal node is
/// row-local), the input pointers must be valid buffers of the lengths the kernels read,
/// and every full output buffer must have room for the member's whole output.
pub(crate) unsafe fn run(
    members: &[Member<'_>],
    rows: usize,
    tile: usize,
    input_ptr: &dyn Fn(NodeId) -> *const u8,
    outputs: &[Vec<Option<*mut u8>>],
    timed: bool,
) -> Result<Vec<f64>, RuntimeError> {
    // Each internal buffer's elements per row and element size.
    let mut slots: Vec<(usize, usize)> = Vec::new();
    let mut places: Vec<(Vec<Place>, Vec<Place>)> = Vec::new();
    // Where the group's own outputs are, for the members that read them.
    let mut produced: Vec<(NodeId, Place)> = Vec::new();
    for (m, member) in members.iter().enumerate() {
        let k = member.step;
        let ins: Vec<Place> = k
            .inputs
            .iter()
            .map(|&n| match produced.iter().find(|p| p.0 == n) {
                Some(&(_, place)) => place,
                None => Place::Full(input_ptr(n)),
            })
            .collect();
        let lens = k.kernel.output_lens();
        let outs: Vec<Place> = lens
            .iter()
            .enumerate()
            .map(|(o, &len)| match outputs[m][o] {
                Some(p) => Place::Full(p),
                None => {
                    let size = member.sizes[o];
                    slots.push((len / rows, size));
                    Place::Scratch { slot: slots.len() - 1, per_row: len / rows, size }
                }
            })
            .collect();
        produced.extend(k.outputs.iter().copied().zip(outs.iter().copied()));
        places.push((ins, outs));
    }
    let params: Vec<Vec<u64>> =
        members.iter().map(|m| m.kernel.slots(&m.step.kernel, &m.step.params)).collect();
    let tiles = rows.div_ceil(tile);

    struct Shared<'s> {
        places: &'s [(Vec<Place>, Vec<Place>)],
    }
    // SAFETY: the raw pointers are only dereferenced by the kernels, and tiles write
    // disjoint rows of the full outputs and their own scratch.
    unsafe impl Sync for Shared<'_> {}
    let shared = Shared { places: &places };
    let run_tile = |t: usize| -> Result<Vec<f64>, RuntimeError> {
        let shared = &shared;
        let (r0, r1) = (t * tile, ((t + 1) * tile).min(rows));
        let mut scratch: Vec<(NonNull<u8>, usize)> = Vec::with_capacity(slots.len());
        for &(per_row, size) in &slots {
            let bytes = (per_row * tile * size).max(1);
            let Some(block) = crate::alloc::allocate(bytes) else {
                for (ptr, class) in scratch {
                    crate::alloc::release(ptr, class);
                }
                return Err(RuntimeError::OutOfMemory { device: Device::Cpu, bytes });
            };
            scratch.push(block);
        }
        let at = |p: Place| -> *mut u8 {
            match p {
                Place::Full(p) => p.cast_mut(),
                // Shifted so that row r0's first element is the scratch's first byte: the
                // kernel adds r * per_row back for rows r0..r1.
                Place::Scratch { slot, per_row, size } => {
                    scratch[slot].0.as_ptr().wrapping_sub(r0 * per_row * size)
                }
            }
        };
        let mut took = vec![0.0; members.len()];
        for (m, member) in members.iter().enumerate() {
            let (ins, outs) = &shared.places[m];
            let ptrs: Vec<*mut u8> = ins.iter().chain(outs).map(|&p| at(p)).collect();
            let positions = member.step.kernel.output_len() / rows;
            let started = timed.then(std::time::Instant::now);
            // SAFETY: per this function's contract; `r0..r1` are rows of every member.
            unsafe {
                member.kernel.call(
                    ptrs.as_ptr(),
                    params[m].as_ptr(),
                    (r0 * positions) as u64,
                    (r1 * positions) as u64,
                );
            }
            if let Some(s) = started {
                took[m] += s.elapsed().as_secs_f64();
            }
        }
        for (ptr, class) in scratch {
            crate::alloc::release(ptr, class);
        }
        Ok(took)
    };
    let add = |a: Result<Vec<f64>, RuntimeError>, b: Result<Vec<f64>, RuntimeError>| {
        let (mut a, b) = (a?, b?);
        a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
        Ok(a)
    };
    let none = || Ok(vec![0.0; members.len()]);
    crate::team::map(tiles, &run_tile).into_iter().fold(none(), add)
}

/// The buffers a row group leaves for later steps, and its trace events.
pub(crate) type GroupRun = (Vec<(NodeId, Buffer)>, Vec<Event>);

/// Runs a row group's kernels tile by tile (see [`crate::rows`]), returning the outputs read
/// after the group and, when `tracing`, one event per kernel: the group's wall time shared
/// out in proportion to the time each kernel's calls took.
pub(crate) fn run_group(
    graph: &Graph,
    steps: &mut [PreparedStep],
    group: &RowGroup,
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
        members.push(Member { step, kernel, sizes });
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
            took = run(&members, group.rows, group.tile, &input, &outputs, tracing)?;
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
                .map(|n| sizes.get(n).copied().unwrap_or_else(|| trace::bytes(&bufs[n])))
                .sum();
            let written = k.outputs.iter().map(|n| sizes[n]).sum();
            let share = if total > 0.0 { t / total } else { 1.0 / members.len() as f64 };
            let info = trace::KernelRun {
                compiled: Some(kernel),
                generated: true,
                compile,
                cuda_marks: Vec::new(),
            };
            let mut e = trace::kernel_event(graph, k, info, read, written, wall.mul_f64(share));
            e.cut = format!("{}; runs row tile by row tile with its group", e.cut);
            events.push(e);
        }
    }
    let nodes = owners.into_iter().map(|(_, _, n)| n);
    Ok((nodes.zip(outs).collect(), events))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::Shape;

    #[test]
    fn row_local_reads_are_recognized() {
        let dims = [4, 3, 5];
        let view = |strides: &[isize], offset: usize| {
            View::from_parts(Shape::new(dims.to_vec()), strides.to_vec(), offset)
        };
        // Dense [12, 5] read row by row, 12 rows of 5.
        assert!(reads_its_row(&view(&[15, 5, 1], 0), 2, 5));
        // One value per row (a row max broadcast along the row).
        assert!(reads_its_row(&view(&[3, 1, 0], 0), 2, 1));
        // 4 rows of 15.
        assert!(reads_its_row(&view(&[15, 5, 1], 0), 1, 15));
        // A transpose reads across rows.
        assert!(!reads_its_row(&view(&[1, 20, 4], 0), 2, 5));
        // A shifted read (a slice) leaves the row, unless it stays inside it.
        assert!(!reads_its_row(&view(&[15, 5, 1], 1), 2, 5));
        assert!(reads_its_row(
            &View::from_parts(Shape::new(vec![4, 3, 4]), vec![15, 5, 1], 1),
            2,
            5
        ));
        // The next row's data (a narrow along the rows).
        assert!(!reads_its_row(&view(&[15, 5, 1], 5), 2, 5));
        // A broadcast across rows reads other rows' data.
        assert!(!reads_its_row(&view(&[0, 0, 1], 0), 2, 5));
        let shape = Shape::new(dims.to_vec());
        assert_eq!(shape.leading_dims(12), Some(2));
        assert_eq!(shape.leading_dims(4), Some(1));
        assert_eq!(shape.leading_dims(6), None);
    }
}
