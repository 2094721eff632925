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
use super::sizes::Step;
use super::strategy::COLUMN_BLOCK;
use super::translate::{Prologue, Translator, VecSrc};
use crate::walk::{Layout, Rows, Sz};

/// How many reduced positions a column reduction folds into its accumulators at once.
const POSITIONS: usize = 4;

/// Consecutive reduced positions' view of a column block.
#[derive(Clone, Copy)]
struct Segment<'a> {
    /// The inputs' addresses at each reduced position, in order.
    ptrs: &'a [Vec<Value>],
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
    pub(super) fn body_reduce_columns(&mut self, red: KernelReduce, outer: &Layout, lanes: Type) {
        let k = self.kernel;
        let out_expr = k.outputs[0];
        let dtype = k.exprs[out_expr].dtype;
        let Prologue { start, end, ins, outs, param_scalar, param_vector } = self.prologue();
        let n_in = ins.len();
        let out_ptr = outs[0];
        let starts = self.input_starts(&ins);
        let sizes: Vec<i64> = k.inputs.iter().map(|i| i.dtype.size_in_bytes() as i64).collect();
        // Per input: its stride across outputs (0 or 1) and along the innermost reduced dim.
        let across: Vec<i64> = (outer.strides.iter())
            .map(|s| s.last().and_then(|s| s.known()).expect("0 or 1 (`column_type`)"))
            .collect();
        let along: Vec<Sz> = self.walk.strides.iter().map(|s| *s.last().expect("a dim")).collect();
        let Rows { len, count: rows, dims: row_dims, strides: row_strides } = self.walk.rows();
        let kept_inner = outer.inner();
        let slot = self.b.create_sized_stack_slot(StackSlotData::new(
            StackSlotKind::ExplicitSlot,
            (COLUMN_BLOCK * 8) as u32,
            4,
        ));
        let slot_addr = self.b.ins().stack_addr(types::I64, slot, 0);

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
        let kept_v = self.size(kept_inner);
        let (_, j0) = self.divrem(o, kept_inner);
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
        let rows_v = self.size(rows);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, ir, rows_v);
        self.b.ins().brif(more, rbody, &[], store, &[]);
        self.b.switch_to_block(rbody);
        let rbases = self.advance(&bases, ir, &row_dims, &row_strides);
        let template = Segment {
            ptrs: &[],
            across: &across,
            sizes: &sizes,
            count,
            slot_addr,
            zero,
            red,
            dtype,
        };
        let steps: Vec<Step> = (0..n_in).map(|idx| self.step(along[idx], sizes[idx])).collect();
        let params = (param_scalar, param_vector);
        let rdone = self.fold_reduced_run(&template, &rbases, &steps, len, &params, lanes);

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

    /// The innermost reduced dimension of one row of the reduced walk, from the inputs'
    /// addresses `rbases` (stepping `steps` bytes per position), folded into the slot's
    /// accumulators; returns the block it ends in, for the caller to fill.
    fn fold_reduced_run(
        &mut self,
        template: &Segment<'_>,
        rbases: &[Value],
        steps: &[Step],
        len: Sz,
        params: &(HashMap<usize, Value>, HashMap<usize, Value>),
        lanes: Type,
    ) -> Block {
        // The innermost reduced dimension, with the inputs' addresses carried: first
        // POSITIONS reduced positions at a time (each accumulator loaded and stored once for
        // all of them, in their order, so the sums are the same), then one at a time.
        let seg = |ptrs| Segment { ptrs, ..*template };
        let (param_scalar, param_vector) = params;
        let n_in = rbases.len();
        let zero = template.zero;
        let ptr_args = |v: &[Value]| v.iter().map(|&x| BlockArg::Value(x)).collect::<Vec<_>>();
        let len_v = self.size(len);
        let mhead = self.b.create_block();
        let jm = self.b.append_block_param(mhead, types::I64);
        let mptrs = self.carried(mhead, n_in);
        let mbody = self.b.create_block();
        let lhead = self.b.create_block();
        let jl = self.b.append_block_param(lhead, types::I64);
        let ptrs = self.carried(lhead, n_in);
        let lbody = self.b.create_block();
        let rdone = self.b.create_block();
        let mut args = vec![BlockArg::Value(zero)];
        args.extend(ptr_args(rbases));
        self.b.ins().jump(mhead, &args);
        self.b.switch_to_block(mhead);
        let after = self.b.ins().iadd_imm_s(jm, POSITIONS as i64);
        let fits = self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, after, len_v);
        let mut rest = vec![BlockArg::Value(jm)];
        rest.extend(ptr_args(&mptrs));
        self.b.ins().brif(fits, mbody, &[], lhead, &rest);

        self.b.switch_to_block(mbody);
        let mut positions = vec![mptrs.clone()];
        for _ in 1..POSITIONS {
            let next = self.advance_steps(positions.last().expect("a position"), steps);
            positions.push(next);
        }
        let mnext = self.fold_segment(&seg(&positions), param_scalar, param_vector, lanes);
        self.b.switch_to_block(mnext);
        let stepped = self.advance_steps(positions.last().expect("a position"), steps);
        let mut args = vec![BlockArg::Value(after)];
        args.extend(ptr_args(&stepped));
        self.b.ins().jump(mhead, &args);

        self.b.switch_to_block(lhead);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, jl, len_v);
        self.b.ins().brif(more, lbody, &[], rdone, &[]);
        self.b.switch_to_block(lbody);
        let single = [ptrs.clone()];
        let lnext = self.fold_segment(&seg(&single), param_scalar, param_vector, lanes);
        self.b.switch_to_block(lnext);
        let stepped = self.advance_steps(&ptrs, steps);
        let jl_next = self.b.ins().iadd_imm_s(jl, 1);
        let mut args = vec![BlockArg::Value(jl_next)];
        args.extend(ptr_args(&stepped));
        self.b.ins().jump(lhead, &args);

        rdone
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

    /// Folds consecutive reduced positions' segments of the block into the accumulator slot,
    /// by vectors then one by one, each accumulator loaded once, folded with every position
    /// in order, and stored once; returns the block it ends by jumping to, for the caller to
    /// fill.
    fn fold_segment(
        &mut self,
        seg: &Segment<'_>,
        param_scalar: &HashMap<usize, Value>,
        param_vector: &HashMap<usize, Value>,
        lanes: Type,
    ) -> Block {
        let Segment { ptrs: positions, across, sizes, count, slot_addr, zero, red, dtype } = *seg;
        let n_in = across.len();
        let width = i64::from(lanes.lane_count());
        let out_expr = self.kernel.outputs[0];
        let chead = self.b.create_block();
        let j = self.b.append_block_param(chead, types::I64);
        let cbody = self.b.create_block();
        let thead = self.b.create_block();
        let tj = self.b.append_block_param(thead, types::I64);
        let tbody = self.b.create_block();
        let lnext = self.b.create_block();
        // Inputs constant across the outputs: one value per position, splatted.
        let splats: Vec<Vec<Option<VecSrc>>> = positions
            .iter()
            .map(|ptrs| {
                (0..n_in)
                    .map(|idx| {
                        (across[idx] == 0).then(|| {
                            let v = self.load(self.kernel.inputs[idx].dtype, ptrs[idx]);
                            VecSrc::Splat(self.b.ins().splat(lanes, v))
                        })
                    })
                    .collect()
            })
            .collect();
        self.b.ins().jump(chead, &[BlockArg::Value(zero)]);
        self.b.switch_to_block(chead);
        let next = self.b.ins().iadd_imm_s(j, width);
        let fits = self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, next, count);
        self.b.ins().brif(fits, cbody, &[], thead, &[BlockArg::Value(j)]);
        self.b.switch_to_block(cbody);
        let acc_at = self.b.ins().imul_imm_s(j, 8);
        let acc_at = self.b.ins().iadd(slot_addr, acc_at);
        let halves: usize = if lanes == types::F32X4 { 2 } else { 1 };
        let mut accs: Vec<Value> = (0..halves)
            .map(|h| {
                let offset = (h * 16) as i32;
                self.b.ins().load(types::F64X2, MemFlagsData::trusted(), acc_at, offset)
            })
            .collect();
        for (ptrs, splat) in positions.iter().zip(&splats) {
            let srcs: Vec<VecSrc> = (0..n_in)
                .map(|idx| match splat[idx] {
                    Some(s) => s,
                    None => {
                        let off = self.b.ins().imul_imm_s(j, sizes[idx]);
                        VecSrc::At(self.b.ins().iadd(ptrs[idx], off))
                    }
                })
                .collect();
            let values = self.compute_vector(&srcs, param_vector, lanes);
            let v = values[out_expr];
            let wide = if halves == 2 {
                let (lo, hi) = math::widen(&mut self.math(), v);
                vec![lo, hi]
            } else {
                vec![v]
            };
            for (acc, w) in accs.iter_mut().zip(wide) {
                *acc = match red.op {
                    ReduceOp::Sum => self.b.ins().fadd(*acc, w),
                    ReduceOp::Prod => self.b.ins().fmul(*acc, w),
                    ReduceOp::Max => self.b.ins().fmax(*acc, w),
                    _ => self.b.ins().fmin(*acc, w),
                };
            }
        }
        for (h, acc) in accs.into_iter().enumerate() {
            self.b.ins().store(MemFlagsData::trusted(), acc, acc_at, (h * 16) as i32);
        }
        self.b.ins().jump(chead, &[BlockArg::Value(next)]);

        self.b.switch_to_block(thead);
        let go = self.b.ins().icmp(IntCC::UnsignedLessThan, tj, count);
        self.b.ins().brif(go, tbody, &[], lnext, &[]);
        self.b.switch_to_block(tbody);
        let acc_at = self.b.ins().imul_imm_s(tj, 8);
        let acc_at = self.b.ins().iadd(slot_addr, acc_at);
        let mut acc = self.b.ins().load(types::F64, MemFlagsData::trusted(), acc_at, 0);
        for ptrs in positions {
            let addrs: Vec<Value> = (0..n_in)
                .map(|idx| {
                    let off = self.b.ins().imul_imm_s(tj, across[idx] * sizes[idx]);
                    self.b.ins().iadd(ptrs[idx], off)
                })
                .collect();
            let values = self.compute_scalar(zero, &addrs, param_scalar);
            acc = self.combine(red.op, acc, values[out_expr], dtype);
        }
        self.b.ins().store(MemFlagsData::trusted(), acc, acc_at, 0);
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
