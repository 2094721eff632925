//! Staged transcendentals: a vector loop whose kernel has `exp`, `tanh`, `sigmoid` or `erf` of f32
//! values computes them a block at a time with the host's widest vectors (`wide.rs`).
//!
//! For each block of [`BLOCK`] elements, a short loop over the block computes only the
//! functions' arguments and stores them in stack scratch, then one batch function per staged
//! op runs over the scratch; the main loop then loads those results instead of evaluating
//! the polynomials in 128-bit vectors. The arguments are computed twice (cheap elementwise
//! work next to a polynomial) so that the main loop keeps its shape. An elementwise row runs
//! block by block (`elementwise.rs`, `staged_vectors`: its vector loop checks no block
//! boundary); a row reduction's loop checks for a block's start at each vector ([`At`]). Only ops whose arguments do not depend on another staged op
//! are staged; the others stay inline, as do scalar tails, rows shorter than [`MIN_ROW`] and
//! hosts without AVX2 and FMA.

use super::helpers::Batch;
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{
    BlockArg, InstBuilder, MemFlagsData, StackSlot, StackSlotData, StackSlotKind, Type, Value,
    types,
};
use kiln_ir::DType;
use kiln_ir::kernel::{ExprKind, Kernel};

use super::translate::Translator;

/// Elements per block: a power of two, 2 KiB of scratch per staged op.
pub(super) const BLOCK: i64 = 512;

/// The shortest row worth staging: below it the calls and the second loop cost more than
/// the wider polynomials save.
pub(super) const MIN_ROW: usize = 64;

/// The staged ops of one kernel and their scratch.
pub(super) struct Staging {
    /// Staged expressions with their batch function's name, in expression order.
    staged: Vec<(usize, Batch)>,
    /// The expressions the arguments need (staged ones excluded).
    needed: Vec<bool>,
    slot: StackSlot,
}

/// What `compute_vector` does with staged expressions.
#[derive(Clone, Copy, Default)]
pub(super) enum Mode {
    /// Everything inline.
    #[default]
    Inline,
    /// Only the staged ops' arguments (the block's first loop).
    Arguments,
    /// Staged ops load their results at this byte offset into their scratch.
    Results(Value),
}

/// The expressions of `kernel` worth staging, with their batch functions, for a vector loop
/// of `vector` lanes over rows (long ones when `long_rows`): none unless the loop runs f32x4 with fused
/// multiply-adds on a host with wide vectors.
pub(super) fn staged_ops(
    kernel: &Kernel,
    vector: Option<(DType, Type)>,
    long_rows: bool,
    features: super::CpuFeatures,
) -> Vec<(usize, Batch)> {
    if vector != Some((DType::F32, types::F32X4))
        || kernel.reduce.is_some_and(|r| r.op == kiln_ir::ReduceOp::LogSumExp)
        || !long_rows
        || !features.fma
        || !features.wide
    {
        return Vec::new();
    }
    let mut after_staged = vec![false; kernel.exprs.len()];
    let mut staged = Vec::new();
    for (e, expr) in kernel.exprs.iter().enumerate() {
        let downstream = expr_args(&expr.kind).iter().any(|&a| after_staged[a]);
        if let ExprKind::Unary(op, _) = expr.kind
            && !downstream
            && let Some(helper) = Batch::for_unary(op)
        {
            staged.push((e, helper));
            after_staged[e] = true;
        } else {
            after_staged[e] = downstream;
        }
    }
    staged
}

impl Staging {
    /// The staging of `staged` (from [`staged_ops`], not empty) in the function `b` builds.
    pub(super) fn new(
        kernel: &Kernel,
        staged: Vec<(usize, Batch)>,
        b: &mut cranelift_frontend::FunctionBuilder<'_>,
    ) -> Staging {
        let mut needed = vec![false; kernel.exprs.len()];
        let mut stack: Vec<usize> =
            staged.iter().flat_map(|&(e, _)| expr_args(&kernel.exprs[e].kind)).collect();
        while let Some(e) = stack.pop() {
            if !needed[e] {
                needed[e] = true;
                stack.extend(expr_args(&kernel.exprs[e].kind));
            }
        }
        let bytes = (staged.len() as i64 * BLOCK * 4) as u32;
        let data = StackSlotData::new(StackSlotKind::ExplicitSlot, bytes, 6);
        let slot = b.create_sized_stack_slot(data);
        Staging { staged, needed, slot }
    }

    /// The scratch byte offset of staged expression `e`, if it is staged.
    pub(super) fn scratch_of(&self, e: usize) -> Option<i32> {
        let k = self.staged.iter().position(|&(s, _)| s == e)?;
        Some((k as i64 * BLOCK * 4) as i32)
    }

    /// Whether the arguments' loop computes expression `e`.
    pub(super) fn needs(&self, e: usize) -> bool {
        self.needed[e]
    }

    pub(super) fn slot(&self) -> StackSlot {
        self.slot
    }
}

fn expr_args(kind: &ExprKind) -> Vec<usize> {
    match *kind {
        ExprKind::Load(_) | ExprKind::Param(_) => vec![],
        ExprKind::Unary(_, a) | ExprKind::Cast(a) => vec![a],
        ExprKind::Binary(_, a, c) => vec![a, c],
        ExprKind::Where(c, a, d) => vec![c, a, d],
    }
}

/// Where a vector loop stands: the element `j` it computes next, the row's first element
/// `first` (blocks start there) and the end of its vector part's bound `end` (`j + lanes <=
/// end` while the loop runs), the inputs' splats and the moving inputs' pointers at `j`.
pub(super) struct At<'a> {
    pub(super) j: Value,
    pub(super) first: Value,
    pub(super) end: Value,
    pub(super) splats: &'a [Option<Value>],
    pub(super) ptrs: &'a [Value],
}

impl Translator<'_, '_> {
    /// Before a vector iteration at `at.j`: when `j` starts a block, computes the staged ops
    /// over the block; then sets the mode in which `compute_vector` reads their results.
    /// Does nothing for a kernel without staging.
    fn stage(
        &mut self,
        at: &At<'_>,
        params: &std::collections::HashMap<usize, Value>,
        lanes: Type,
    ) {
        if self.staging.is_none() {
            return;
        }
        let width = i64::from(lanes.lane_count());
        let into = self.b.ins().isub(at.j, at.first);
        let off = self.b.ins().band_imm_s(into, BLOCK - 1);
        let starts_block = self.b.ins().icmp_imm_s(IntCC::Equal, off, 0);
        let compute = self.b.create_block();
        let go_on = self.b.create_block();
        self.b.ins().brif(starts_block, compute, &[], go_on, &[]);

        // The block's length: whole vectors, at most BLOCK.
        self.b.switch_to_block(compute);
        let left = self.b.ins().isub(at.end, at.j);
        let block = self.iconst(BLOCK);
        let n = self.b.ins().umin(left, block);
        let n = self.b.ins().band_imm_s(n, !(width - 1));
        self.stage_block(at.splats, at.ptrs, n, params, lanes);
        self.b.ins().jump(go_on, &[]);

        self.b.switch_to_block(go_on);
        self.read_staged(off);
    }

    /// From here, `compute_vector` reads the staged ops' results at element `off` of their
    /// block's scratch.
    pub(super) fn read_staged(&mut self, off: Value) {
        let off_bytes = self.b.ins().imul_imm_s(off, 4);
        self.stage_mode = Mode::Results(off_bytes);
    }

    /// Computes the staged ops over the `n` elements (whole vectors, at most [`BLOCK`]) whose
    /// moving inputs start at `ptrs`: a loop that stores their arguments in the scratch,
    /// then one batch call per op. Leaves the builder after the calls.
    pub(super) fn stage_block(
        &mut self,
        splats: &[Option<Value>],
        ptrs: &[Value],
        n: Value,
        params: &std::collections::HashMap<usize, Value>,
        lanes: Type,
    ) {
        let staging = self.staging.take().expect("a staged kernel");
        let width = i64::from(lanes.lane_count());
        let head = self.b.create_block();
        let t = self.b.append_block_param(head, types::I64);
        let carried = self.carried(head, ptrs.len());
        let body = self.b.create_block();
        let calls = self.b.create_block();
        let zero = self.iconst(0);
        let mut args = vec![BlockArg::Value(zero)];
        args.extend(ptrs.iter().map(|&p| BlockArg::Value(p)));
        self.b.ins().jump(head, &args);
        self.b.switch_to_block(head);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, t, n);
        self.b.ins().brif(more, body, &[], calls, &[]);
        self.b.switch_to_block(body);
        let srcs = self.vector_srcs(splats, &carried);
        self.stage_mode = Mode::Arguments;
        self.staging = Some(staging);
        let values = self.compute_vector(&srcs, params, lanes);
        let staging = self.staging.take().expect("staging is set");
        self.stage_mode = Mode::Inline;
        let bytes = self.b.ins().imul_imm_s(t, 4);
        for &(e, _) in &staging.staged {
            let arg = expr_args(&self.kernel.exprs[e].kind)[0];
            let base = self.scratch_addr(&staging, e);
            let addr = self.b.ins().iadd(base, bytes);
            self.b.ins().store(MemFlagsData::trusted(), values[arg], addr, 0);
        }
        let t_next = self.b.ins().iadd_imm_s(t, width);
        let steps = self.input_steps(splats, lanes);
        let advanced = self.advance_ptrs(&carried, &steps);
        let mut args = vec![BlockArg::Value(t_next)];
        args.extend(advanced.iter().map(|&p| BlockArg::Value(p)));
        self.b.ins().jump(head, &args);
        self.b.switch_to_block(calls);
        for &(e, helper) in &staging.staged {
            let base = self.scratch_addr(&staging, e);
            let f = self.helpers[helper.preserving()];
            self.b.ins().call(f, &[base, n]);
        }
        self.staging = Some(staging);
    }

    /// Every expression's vector at `at.j`, the staged ones read from their block's results
    /// (computed first when `j` starts a block).
    pub(super) fn vector_at(
        &mut self,
        at: &At<'_>,
        params: &std::collections::HashMap<usize, Value>,
        lanes: Type,
    ) -> Vec<Value> {
        self.stage(at, params, lanes);
        let srcs = self.vector_srcs(at.splats, at.ptrs);
        let values = self.compute_vector(&srcs, params, lanes);
        self.stage_mode = Mode::Inline;
        values
    }

    /// The address of staged expression `e`'s scratch.
    pub(super) fn scratch_addr(&mut self, staging: &Staging, e: usize) -> Value {
        let off = staging.scratch_of(e).expect("a staged expression");
        self.b.ins().stack_addr(types::I64, staging.slot(), off)
    }
}
