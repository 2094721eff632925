//! Column reductions: a reduction whose neighbouring outputs read neighbouring elements
//! (a sum over rows) vectorized across its outputs, in blocks of [`super::COLUMN_BLOCK`].

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{
    Block, BlockArg, InstBuilder, MemFlagsData, StackSlotData, StackSlotKind, Type, Value, types,
};
use std::collections::HashMap;

use kiln_ir::kernel::KernelReduce;
use kiln_ir::{DType, ReduceOp};

use super::math;
use super::strategy::COLUMN_BLOCK;
use super::translate::{Prologue, Translator, VecSrc};
use crate::walk::Walk;

/// One reduced position's view of a column block.
#[derive(Clone, Copy)]
struct Segment<'a> {
    /// The inputs' addresses at this reduced position.
    ptrs: &'a [Value],
    /// Per input: its stride across outputs (0 or 1).
    across: &'a [i64],
    /// Per input: its element size in bytes.
    sizes: &'a [i64],
    /// How many outputs the block holds.
    count: Value,
    slot_addr: Value,
    /// The constant 0, made once before the loops.
    zero: Value,
    red: KernelReduce,
    dtype: DType,
}

impl<'b> Translator<'_, 'b> {
    /// A reduction vectorized across its outputs: for each block of up to [`COLUMN_BLOCK`]
    /// neighbouring outputs, f64 accumulators in a stack slot, and a walk over the reduced
    /// positions that adds each position's row segment of the block to them with vectors.
    /// The input streams one contiguous segment at a time, where a walk per output would
    /// stride across the whole input for every element.
    pub(super) fn body_reduce_columns(&mut self, red: KernelReduce, outer: &Walk, lanes: Type) {
        let k = self.kernel;
        let out_expr = k.outputs[0];
        let dtype = k.exprs[out_expr].dtype;
        let Prologue { start, end, ins, outs, param_scalar, param_vector } = self.prologue();
        let n_in = ins.len();
        let out_ptr = outs[0];
        let starts = self.input_starts(&ins);
        let sizes: Vec<i64> = k.inputs.iter().map(|i| i.dtype.size_in_bytes() as i64).collect();
        // Per input: its stride across outputs (0 or 1) and along the innermost reduced dim.
        let across: Vec<i64> = outer.strides.iter().map(|s| *s.last().expect("a dim")).collect();
        let along: Vec<i64> = self.walk.strides.iter().map(|s| *s.last().expect("a dim")).collect();
        let inner_dims = self.walk.dims.clone();
        let len = *inner_dims.last().expect("a dimension") as i64;
        let rows: i64 = inner_dims[..inner_dims.len() - 1].iter().product::<usize>() as i64;
        let row_strides: Vec<Vec<i64>> =
            self.walk.strides.iter().map(|s| s[..s.len() - 1].to_vec()).collect();
        let kept_inner = *outer.dims.last().expect("a dimension") as i64;
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            (COLUMN_BLOCK * 8) as u32,
            4,
        ));
        let slot_addr = self.b.ins().stack_addr(types::I64, slot, 0);
        let ptr_args = |v: &[Value]| v.iter().map(|&x| BlockArg::Value(x)).collect::<Vec<_>>();

        let head = self.b.create_block();
        let o = self.b.append_block_param(head, types::I64);
        let block_start = self.b.create_block();
        let exit = self.b.create_block();
        self.b.ins().jump(head, &[BlockArg::Value(start)]);
        self.b.switch_to_block(head);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, o, end);
        self.b.ins().brif(more, block_start, &[], exit, &[]);

        // The block: outputs o..o+count, within one run of the innermost kept dimension.
        self.b.switch_to_block(block_start);
        let kept_v = self.iconst(kept_inner);
        let (_, j0) = self.divrem_const(o, kept_inner as u64);
        let to_row_end = self.b.ins().isub(kept_v, j0);
        let to_end = self.b.ins().isub(end, o);
        let block_v = self.iconst(COLUMN_BLOCK as i64);
        let count = self.b.ins().umin(to_row_end, to_end);
        let count = self.b.ins().umin(count, block_v);
        let bases = self.advance(&starts, o, &outer.dims, &outer.strides);
        let identity = self.identity(red.op, dtype);
        let identities = self.b.ins().splat(types::F64X2, identity);
        let (rows_start, zero) = self.fill_slot(slot_addr, identities);

        // Rows of the reduced walk (all but its innermost dimension).
        self.b.switch_to_block(rows_start);
        let rhead = self.b.create_block();
        let ir = self.b.append_block_param(rhead, types::I64);
        let rbody = self.b.create_block();
        let store = self.b.create_block();
        self.b.ins().jump(rhead, &[BlockArg::Value(zero)]);
        self.b.switch_to_block(rhead);
        let rows_v = self.iconst(rows);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, ir, rows_v);
        self.b.ins().brif(more, rbody, &[], store, &[]);
        self.b.switch_to_block(rbody);
        let rbases = self.advance(&bases, ir, &inner_dims[..inner_dims.len() - 1], &row_strides);
        // The innermost reduced dimension, with the inputs' addresses carried.
        let lhead = self.b.create_block();
        let jl = self.b.append_block_param(lhead, types::I64);
        let ptrs = self.carried(lhead, n_in);
        let lbody = self.b.create_block();
        let rdone = self.b.create_block();
        let mut args = vec![BlockArg::Value(zero)];
        args.extend(ptr_args(&rbases));
        self.b.ins().jump(lhead, &args);
        self.b.switch_to_block(lhead);
        let len_v = self.iconst(len);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, jl, len_v);
        self.b.ins().brif(more, lbody, &[], rdone, &[]);

        // One reduced position: the block's segment, by vectors then one by one.
        self.b.switch_to_block(lbody);
        let segment = Segment {
            ptrs: &ptrs,
            across: &across,
            sizes: &sizes,
            count,
            slot_addr,
            zero,
            red,
            dtype,
        };
        let lnext = self.fold_segment(&segment, &param_scalar, &param_vector, lanes);

        self.b.switch_to_block(lnext);
        let stepped: Vec<Value> = (0..n_in)
            .map(|idx| self.b.ins().iadd_imm_s(ptrs[idx], along[idx] * sizes[idx]))
            .collect();
        let jl_next = self.b.ins().iadd_imm_s(jl, 1);
        let mut args = vec![BlockArg::Value(jl_next)];
        args.extend(ptr_args(&stepped));
        self.b.ins().jump(lhead, &args);

        self.b.switch_to_block(rdone);
        let ir_next = self.b.ins().iadd_imm_s(ir, 1);
        self.b.ins().jump(rhead, &[BlockArg::Value(ir_next)]);

        // The block's results, rounded to the output dtype.
        self.b.switch_to_block(store);
        self.store_block(slot_addr, o, count, dtype, out_ptr, zero);
        let o_next = self.b.ins().iadd(o, count);
        self.b.ins().jump(head, &[BlockArg::Value(o_next)]);

        self.b.switch_to_block(exit);
        self.b.ins().return_(&[]);
    }

    /// Sets every f64 of the accumulator slot to `identities` (an f64x2 splat); returns the
    /// block after the loop, current, and the constant 0 for the loops that follow.
    fn fill_slot(&mut self, slot_addr: Value, identities: Value) -> (Block, Value) {
        let ihead = self.b.create_block();
        let i = self.b.append_block_param(ihead, types::I64);
        let ibody = self.b.create_block();
        let rows_start = self.b.create_block();
        let zero = self.iconst(0);
        self.b.ins().jump(ihead, &[BlockArg::Value(zero)]);
        self.b.switch_to_block(ihead);
        let all = self.iconst((COLUMN_BLOCK * 8) as i64);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, i, all);
        self.b.ins().brif(more, ibody, &[], rows_start, &[]);
        self.b.switch_to_block(ibody);
        let at = self.b.ins().iadd(slot_addr, i);
        self.b.ins().store(MemFlagsData::trusted(), identities, at, 0);
        let i_next = self.b.ins().iadd_imm_s(i, 16);
        self.b.ins().jump(ihead, &[BlockArg::Value(i_next)]);

        self.b.switch_to_block(rows_start);
        (rows_start, zero)
    }

    /// Folds one reduced position's segment of the block into the accumulator slot, by
    /// vectors then one by one; returns the block it ends by jumping to, for the caller to fill.
    fn fold_segment(
        &mut self,
        seg: &Segment<'_>,
        param_scalar: &HashMap<usize, Value>,
        param_vector: &HashMap<usize, Value>,
        lanes: Type,
    ) -> Block {
        let Segment { ptrs, across, sizes, count, slot_addr, zero, red, dtype } = *seg;
        let n_in = ptrs.len();
        let width = i64::from(lanes.lane_count());
        let out_expr = self.kernel.outputs[0];
        let chead = self.b.create_block();
        let j = self.b.append_block_param(chead, types::I64);
        let cbody = self.b.create_block();
        let thead = self.b.create_block();
        let tj = self.b.append_block_param(thead, types::I64);
        let tbody = self.b.create_block();
        let lnext = self.b.create_block();
        self.b.ins().jump(chead, &[BlockArg::Value(zero)]);
        self.b.switch_to_block(chead);
        let next = self.b.ins().iadd_imm_s(j, width);
        let fits = self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, next, count);
        self.b.ins().brif(fits, cbody, &[], thead, &[BlockArg::Value(j)]);
        self.b.switch_to_block(cbody);
        let mut srcs = Vec::with_capacity(n_in);
        for idx in 0..n_in {
            if across[idx] == 0 {
                let v = self.b.ins().load(
                    lanes.lane_type(),
                    MemFlagsData::new().with_notrap(),
                    ptrs[idx],
                    0,
                );
                srcs.push(VecSrc::Splat(self.b.ins().splat(lanes, v)));
            } else {
                let off = self.b.ins().imul_imm_s(j, sizes[idx]);
                srcs.push(VecSrc::At(self.b.ins().iadd(ptrs[idx], off)));
            }
        }
        let values = self.compute_vector(&srcs, param_vector, lanes);
        let v = values[out_expr];
        let wide = if lanes == types::F32X4 {
            let (lo, hi) = math::widen(&mut self.math(), v);
            vec![lo, hi]
        } else {
            vec![v]
        };
        let acc_at = self.b.ins().imul_imm_s(j, 8);
        let acc_at = self.b.ins().iadd(slot_addr, acc_at);
        for (h, w) in wide.into_iter().enumerate() {
            let offset = (h * 16) as i32;
            let acc = self.b.ins().load(types::F64X2, MemFlagsData::trusted(), acc_at, offset);
            let folded = match red.op {
                ReduceOp::Sum => self.b.ins().fadd(acc, w),
                ReduceOp::Prod => self.b.ins().fmul(acc, w),
                ReduceOp::Max => self.b.ins().fmax(acc, w),
                _ => self.b.ins().fmin(acc, w),
            };
            self.b.ins().store(MemFlagsData::trusted(), folded, acc_at, offset);
        }
        self.b.ins().jump(chead, &[BlockArg::Value(next)]);

        self.b.switch_to_block(thead);
        let go = self.b.ins().icmp(IntCC::UnsignedLessThan, tj, count);
        self.b.ins().brif(go, tbody, &[], lnext, &[]);
        self.b.switch_to_block(tbody);
        let addrs: Vec<Value> = (0..n_in)
            .map(|idx| {
                let off = self.b.ins().imul_imm_s(tj, across[idx] * sizes[idx]);
                self.b.ins().iadd(ptrs[idx], off)
            })
            .collect();
        let values = self.compute_scalar(zero, &addrs, param_scalar);
        let acc_at = self.b.ins().imul_imm_s(tj, 8);
        let acc_at = self.b.ins().iadd(slot_addr, acc_at);
        let acc = self.b.ins().load(types::F64, MemFlagsData::trusted(), acc_at, 0);
        let folded = self.combine(red.op, acc, values[out_expr], dtype);
        self.b.ins().store(MemFlagsData::trusted(), folded, acc_at, 0);
        let tj_next = self.b.ins().iadd_imm_s(tj, 1);
        self.b.ins().jump(thead, &[BlockArg::Value(tj_next)]);
        lnext
    }

    /// Writes the block's `count` accumulators, rounded to `dtype`, to the outputs from `o`;
    /// leaves the block after the loop current.
    fn store_block(
        &mut self,
        slot_addr: Value,
        o: Value,
        count: Value,
        dtype: DType,
        out_ptr: Value,
        zero: Value,
    ) {
        let shead = self.b.create_block();
        let sj = self.b.append_block_param(shead, types::I64);
        let sbody = self.b.create_block();
        let block_done = self.b.create_block();
        self.b.ins().jump(shead, &[BlockArg::Value(zero)]);
        self.b.switch_to_block(shead);
        let go = self.b.ins().icmp(IntCC::UnsignedLessThan, sj, count);
        self.b.ins().brif(go, sbody, &[], block_done, &[]);
        self.b.switch_to_block(sbody);
        let acc_at = self.b.ins().imul_imm_s(sj, 8);
        let acc_at = self.b.ins().iadd(slot_addr, acc_at);
        let acc = self.b.ins().load(types::F64, MemFlagsData::trusted(), acc_at, 0);
        let result = self.demote(acc, dtype);
        let pos = self.b.ins().iadd(o, sj);
        let off = self.b.ins().imul_imm_s(pos, dtype.size_in_bytes() as i64);
        let addr = self.b.ins().iadd(out_ptr, off);
        self.store(result, dtype, addr);
        let sj_next = self.b.ins().iadd_imm_s(sj, 1);
        self.b.ins().jump(shead, &[BlockArg::Value(sj_next)]);
        self.b.switch_to_block(block_done);
    }
}
