//! `logsumexp` reductions in one pass over each row.
//!
//! Softmax, log-softmax and cross-entropy need `log(sum(exp(x - m)))` with `m` the row's
//! maximum. Written as a max kernel and then a sum kernel, a row is read twice, and the
//! second pass (an exponential per element) cannot start until the first has streamed the
//! whole row in. Here a row is read once: the kernel computes the reduced expression a
//! block of [`LSE_BLOCK`] values at a time into stack scratch (four lanes a step where
//! the kernel vectorizes, one otherwise), and hands each block to `kiln_lse_f32s`
//! (`wide.rs`), which finds the block's maximum, rescales the running sum when the maximum
//! grows (an online softmax, one rescale per block instead of per element) and adds the
//! block's exponentials with the host's widest vectors. The block is in L1 between the
//! two; memory streams the next block in meanwhile. `kiln_lse_end` turns the running state
//! into the result, or `kiln_lse_end_f64` into an f64 result when the kernel reduces f32
//! values widened to f64 (a log-softmax's, [`kiln_ir::passes::precise_log_softmax`]).

use super::helpers::Helper;
use std::collections::HashMap;

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{
    BlockArg, InstBuilder, MemFlagsData, StackSlot, StackSlotData, StackSlotKind, Type, Value,
    types,
};
use kiln_ir::DType;
use kiln_ir::kernel::{Expr, ExprKind, Kernel};

use super::translate::{Prologue, Translator};
use super::wide::LSE_BLOCK;
use crate::CodegenError;
use crate::walk::{Layout, Rows, Sz};

/// For a `logsumexp` kernel: the kernel to compile in its place, if any, and the dtype of
/// its result. A kernel that reduces f32 values gives f32; one whose reduced expression
/// widens f32 values to f64 as its last step is compiled without the widening (the fold
/// reads f32 values and keeps its state in f64 either way) and gives f64.
///
/// # Errors
/// Any other reduced dtype: the planner expands those (`kiln_ir::passes::ExpandLogSumExp`).
pub(super) fn fold_of(kernel: &Kernel) -> Result<(Option<Kernel>, DType), CodegenError> {
    if kernel.reduce.is_none_or(|r| r.op != kiln_ir::ReduceOp::LogSumExp) {
        return Ok((None, DType::F32));
    }
    let out = kernel.outputs[0];
    match kernel.exprs[out] {
        Expr { dtype: DType::F32, .. } => Ok((None, DType::F32)),
        Expr { kind: ExprKind::Cast(a), dtype: DType::F64 }
            if kernel.exprs[a].dtype == DType::F32
                && out + 1 == kernel.exprs.len()
                && !kernel.outputs[1..].contains(&out) =>
        {
            let mut narrowed = kernel.clone();
            narrowed.exprs.pop();
            narrowed.outputs[0] = a;
            Ok((Some(narrowed), DType::F64))
        }
        _ => Err(CodegenError::Cranelift(
            "logsumexp kernels reduce f32 values (or f32 values widened to f64) only".into(),
        )),
    }
}

/// The stack slots of a `logsumexp` kernel.
#[derive(Clone, Copy)]
struct Slots {
    /// A block of the reduced expression's values (f32).
    scratch: StackSlot,
    /// The running state (`wide::LseState`: the maximum and the sum, two f64).
    state: StackSlot,
}

/// One row of a `logsumexp` output: where its inputs start and its side outputs go.
struct LseRow<'a> {
    bases: &'a [Value],
    /// Outputs after the first: (expression, dtype, this row's base address).
    side: &'a [(usize, DType, Value)],
    len: Sz,
}

impl Translator<'_, '_> {
    /// A `logsumexp` kernel: for each output position in `start..end`, the state starts
    /// empty, every row of its reduced positions is folded in block by block, and the end
    /// function gives the value stored (as `result`, f32 or f64).
    pub(super) fn body_logsumexp(&mut self, outer: &Layout, result: DType) {
        let Prologue { start, end, ins, outs, param_scalar, param_vector } = self.prologue();
        let starts = self.input_starts(&ins);
        let slots = Slots { scratch: self.slot((LSE_BLOCK * 4) as u32), state: self.slot(16) };
        let Rows { len, count: rows, dims: row_dims, strides: row_strides } = self.walk.rows();

        let head = self.b.create_block();
        let o = self.b.append_block_param(head, types::I64);
        let obody = self.b.create_block();
        let rhead = self.b.create_block();
        let ir = self.b.append_block_param(rhead, types::I64);
        let rbody = self.b.create_block();
        let store = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(head, &[BlockArg::Value(start)]);

        self.b.switch_to_block(head);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, o, end);
        self.b.ins().brif(more, obody, &[], exit, &[]);

        self.b.switch_to_block(obody);
        let outer_bases = self.advance(&starts, o, &outer.dims.clone(), &outer.strides);
        let state = self.b.ins().stack_addr(types::I64, slots.state, 0);
        let neg_inf = self.b.ins().f64const(f64::NEG_INFINITY);
        let zero_f = self.b.ins().f64const(0.0);
        self.b.ins().store(MemFlagsData::trusted(), neg_inf, state, 0);
        self.b.ins().store(MemFlagsData::trusted(), zero_f, state, 8);
        let zero = self.iconst(0);
        self.b.ins().jump(rhead, &[BlockArg::Value(zero)]);

        self.b.switch_to_block(rhead);
        let rows_v = self.size(rows);
        let more_rows = self.b.ins().icmp(IntCC::UnsignedLessThan, ir, rows_v);
        self.b.ins().brif(more_rows, rbody, &[], store, &[]);

        self.b.switch_to_block(rbody);
        let bases = self.advance(&outer_bases, ir, &row_dims, &row_strides);
        let side = self.side_outputs(&outs, o, ir);
        let row = LseRow { bases: &bases, side: &side, len };
        self.lse_row(&row, slots, &param_scalar, &param_vector);
        let ir_next = self.b.ins().iadd_imm_s(ir, 1);
        self.b.ins().jump(rhead, &[BlockArg::Value(ir_next)]);

        self.b.switch_to_block(store);
        let state = self.b.ins().stack_addr(types::I64, slots.state, 0);
        let end = if result == DType::F64 { Helper::LseEndF64 } else { Helper::LseEnd };
        let value = self.call(end, &[state]);
        let off = self.b.ins().imul_imm_s(o, result.size_in_bytes() as i64);
        let addr = self.b.ins().iadd(outs[0], off);
        self.store(value, result, addr);
        let o_next = self.b.ins().iadd_imm_s(o, 1);
        self.b.ins().jump(head, &[BlockArg::Value(o_next)]);

        self.b.switch_to_block(exit);
        self.b.ins().return_(&[]);
    }

    fn slot(&mut self, bytes: u32) -> StackSlot {
        let data = StackSlotData::new(StackSlotKind::ExplicitSlot, bytes, 6);
        self.b.create_sized_stack_slot(data)
    }

    /// Folds one row into the state. A row that is just a contiguous f32 input goes to the
    /// block function as it lies in memory; any other expression is computed a block at a
    /// time into scratch (vectors first where the kernel vectorizes, then one at a time),
    /// each block then going to the block function.
    fn lse_row(
        &mut self,
        row: &LseRow<'_>,
        slots: Slots,
        param_scalar: &HashMap<usize, Value>,
        param_vector: &HashMap<usize, Value>,
    ) {
        let k = self.kernel;
        let zero = self.iconst(0);
        if let ExprKind::Load(i) = k.exprs[k.outputs[0]].kind
            && k.inputs[i].dtype == DType::F32
            && self.walk.strides[i].last() == Some(&Sz::Known(1))
            && row.side.is_empty()
        {
            let at = self.element_addr(i, zero, row.bases);
            let len = self.size(row.len);
            let state = self.b.ins().stack_addr(types::I64, slots.state, 0);
            let f = self.helpers[Helper::LseF32s.name()];
            self.b.ins().call(f, &[at, len, state]);
            return;
        }
        let (splats, lanes) = match self.vector {
            Some((_, lanes)) => (self.vector_row(row.bases, zero, lanes).0, Some(lanes)),
            None => (Vec::new(), None),
        };

        let bhead = self.b.create_block();
        let b0 = self.b.append_block_param(bhead, types::I64);
        let bbody = self.b.create_block();
        let done = self.b.create_block();
        self.b.ins().jump(bhead, &[BlockArg::Value(zero)]);

        self.b.switch_to_block(bhead);
        let len_v = self.size(row.len);
        let more = self.b.ins().icmp(IntCC::SignedLessThan, b0, len_v);
        self.b.ins().brif(more, bbody, &[], done, &[]);

        self.b.switch_to_block(bbody);
        let len_v = self.size(row.len);
        let left = self.b.ins().isub(len_v, b0);
        let block = self.iconst(LSE_BLOCK as i64);
        let n = self.b.ins().umin(left, block);
        let scratch = self.b.ins().stack_addr(types::I64, slots.scratch, 0);
        let t_tail = match lanes {
            Some(lanes) => {
                // The pointers start anew at each block: carried across the block
                // function's call, they would live on the stack through the loop.
                let ptrs: Vec<Value> = (0..splats.len())
                    .filter(|&idx| splats[idx].is_none())
                    .map(|idx| self.element_addr(idx, b0, row.bases))
                    .collect();
                let width = i64::from(lanes.lane_count());
                let fill = VectorFill { splats: &splats, ptrs: &ptrs, lanes, width };
                self.lse_fill_vectors(row, &fill, b0, n, scratch, param_vector)
            }
            None => zero,
        };
        self.lse_fill_scalars(row, b0, t_tail, n, scratch, param_scalar);
        let state = self.b.ins().stack_addr(types::I64, slots.state, 0);
        let f = self.helpers[Helper::LseF32s.name()];
        self.b.ins().call(f, &[scratch, n, state]);
        let b_next = self.b.ins().iadd(b0, n);
        self.b.ins().jump(bhead, &[BlockArg::Value(b_next)]);

        self.b.switch_to_block(done);
    }

    /// Stores the block's whole vectors in scratch: returns where the scalar part starts.
    fn lse_fill_vectors(
        &mut self,
        row: &LseRow<'_>,
        fill: &VectorFill<'_>,
        b0: Value,
        n: Value,
        scratch: Value,
        params: &HashMap<usize, Value>,
    ) -> Value {
        let out = self.kernel.outputs[0];
        let nv = self.b.ins().band_imm_s(n, !(fill.width - 1));
        let steps = self.input_steps(fill.splats, fill.lanes);
        let head = self.b.create_block();
        let t = self.b.append_block_param(head, types::I64);
        let ptrs = self.carried(head, fill.ptrs.len());
        let body = self.b.create_block();
        let after = self.b.create_block();
        let zero = self.iconst(0);
        let mut args = vec![zero];
        args.extend(fill.ptrs);
        self.jump_with(head, &args);

        self.b.switch_to_block(head);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, t, nv);
        self.b.ins().brif(more, body, &[], after, &[]);

        self.b.switch_to_block(body);
        let srcs = self.vector_srcs(fill.splats, &ptrs);
        let values = self.compute_vector(&srcs, params, fill.lanes);
        let j = self.b.ins().iadd(b0, t);
        self.store_side_vectors(row.side, &values, j);
        let bytes = self.b.ins().imul_imm_s(t, 4);
        let addr = self.b.ins().iadd(scratch, bytes);
        self.b.ins().store(MemFlagsData::trusted(), values[out], addr, 0);
        let t_next = self.b.ins().iadd_imm_s(t, fill.width);
        let advanced = self.advance_ptrs(&ptrs, &steps);
        let mut args = vec![t_next];
        args.extend(&advanced);
        self.jump_with(head, &args);

        self.b.switch_to_block(after);
        nv
    }

    /// Stores the block's values from `t0` to `n` in scratch one at a time.
    fn lse_fill_scalars(
        &mut self,
        row: &LseRow<'_>,
        b0: Value,
        t0: Value,
        n: Value,
        scratch: Value,
        params: &HashMap<usize, Value>,
    ) {
        let out = self.kernel.outputs[0];
        let head = self.b.create_block();
        let t = self.b.append_block_param(head, types::I64);
        let body = self.b.create_block();
        let after = self.b.create_block();
        self.b.ins().jump(head, &[BlockArg::Value(t0)]);

        self.b.switch_to_block(head);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, t, n);
        self.b.ins().brif(more, body, &[], after, &[]);

        self.b.switch_to_block(body);
        let j = self.b.ins().iadd(b0, t);
        let values = self.compute_scalar(j, row.bases, params);
        for &(e, dtype, base) in row.side {
            let off = self.b.ins().imul_imm_s(j, dtype.size_in_bytes() as i64);
            let addr = self.b.ins().iadd(base, off);
            self.store(values[e], dtype, addr);
        }
        let bytes = self.b.ins().imul_imm_s(t, 4);
        let addr = self.b.ins().iadd(scratch, bytes);
        self.b.ins().store(MemFlagsData::trusted(), values[out], addr, 0);
        let t_next = self.b.ins().iadd_imm_s(t, 1);
        self.b.ins().jump(head, &[BlockArg::Value(t_next)]);

        self.b.switch_to_block(after);
    }
}

/// The vector loop's inputs for one block.
struct VectorFill<'a> {
    splats: &'a [Option<Value>],
    ptrs: &'a [Value],
    lanes: Type,
    width: i64,
}
