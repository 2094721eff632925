//! Row reductions: each output reduces a contiguous (or strided) row of its positions, with
//! per-lane accumulators in f64/i64.

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use std::collections::HashMap;

use cranelift_codegen::ir::{BlockArg, InstBuilder, MemFlagsData, Type, Value, types};
use kiln_ir::kernel::KernelReduce;
use kiln_ir::{DType, ReduceOp};

use super::math;
use super::strategy::scalar_type;
use super::translate::{Prologue, Translator, acc_ty_dtype};
use crate::walk::Walk;

/// What the vector part of one row needs from the row loop around it.
#[derive(Clone, Copy)]
struct Row<'a> {
    bases: &'a [Value],
    /// Outputs after the first: (expression, dtype, this row's base address).
    side: &'a [(usize, DType, Value)],
    acc: Value,
    len: Value,
    /// The constant 0, made once in the row loop.
    zero: Value,
    red: KernelReduce,
    dtype: DType,
}

impl<'b> Translator<'_, 'b> {
    /// The accumulator type and identity of a reduction over values of `dtype`.
    pub(super) fn identity(&mut self, op: ReduceOp, dtype: DType) -> Value {
        if dtype == DType::Bool {
            let v = i64::from(op == ReduceOp::Min || op == ReduceOp::Prod);
            return self.b.ins().iconst(types::I8, v);
        }
        if dtype.is_float() {
            let v = match op {
                ReduceOp::Sum => 0.0,
                ReduceOp::Prod => 1.0,
                ReduceOp::Max => f64::NEG_INFINITY,
                _ => f64::INFINITY,
            };
            return self.b.ins().f64const(v);
        }
        let v = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Max => i64::MIN,
            _ => i64::MAX,
        };
        self.iconst(v)
    }

    /// Folds one value (in its register type) into the accumulator.
    pub(super) fn combine(&mut self, op: ReduceOp, acc: Value, v: Value, dtype: DType) -> Value {
        if dtype == DType::Bool {
            return match op {
                ReduceOp::Max | ReduceOp::Sum => self.b.ins().bor(acc, v),
                _ => self.b.ins().band(acc, v),
            };
        }
        if dtype.is_float() {
            let v = if scalar_type(dtype) == types::F64 {
                v
            } else {
                self.b.ins().fpromote(types::F64, v)
            };
            return match op {
                ReduceOp::Sum => self.b.ins().fadd(acc, v),
                ReduceOp::Prod => self.b.ins().fmul(acc, v),
                ReduceOp::Max => self.b.ins().fmax(acc, v),
                _ => self.b.ins().fmin(acc, v),
            };
        }
        match op {
            ReduceOp::Sum => self.b.ins().iadd(acc, v),
            ReduceOp::Prod => self.b.ins().imul(acc, v),
            ReduceOp::Max => self.b.ins().smax(acc, v),
            _ => self.b.ins().smin(acc, v),
        }
    }

    /// A reduction kernel: for each output position in `start..end`, fold the body's value
    /// over the reduced dimensions (in rows of the last one, vectorized like elementwise
    /// kernels) into an f64 (float), i64 (integer) or i8 (bool) accumulator.
    pub(super) fn body_reduce(&mut self, red: KernelReduce, outer: &Walk) {
        let k = self.kernel;
        let out_expr = k.outputs[0];
        let dtype = k.exprs[out_expr].dtype;
        let Prologue { start, end, ins, outs, param_scalar, param_vector } = self.prologue();
        let out_ptr = outs[0];
        let starts = self.input_starts(&ins);
        let acc_ty = if dtype == DType::Bool {
            types::I8
        } else if dtype.is_float() {
            types::F64
        } else {
            types::I64
        };
        let inner_dims = self.walk.dims.clone();
        let len = *inner_dims.last().expect("at least one dimension") as i64;
        let rows: i64 = inner_dims[..inner_dims.len() - 1].iter().product::<usize>() as i64;
        let inner_strides: Vec<Vec<i64>> =
            self.walk.strides.iter().map(|s| s[..s.len() - 1].to_vec()).collect();

        let head = self.b.create_block();
        let o = self.b.append_block_param(head, types::I64);
        let obody = self.b.create_block();
        let rhead = self.b.create_block();
        let ir = self.b.append_block_param(rhead, types::I64);
        let racc = self.b.append_block_param(rhead, acc_ty);
        let rbody = self.b.create_block();
        let shead = self.b.create_block();
        let js = self.b.append_block_param(shead, types::I64);
        let sacc = self.b.append_block_param(shead, acc_ty);
        let sbody = self.b.create_block();
        let rdone = self.b.create_block();
        let dacc = self.b.append_block_param(rdone, acc_ty);
        let store = self.b.create_block();
        let facc = self.b.append_block_param(store, acc_ty);
        let exit = self.b.create_block();
        self.b.ins().jump(head, &[BlockArg::Value(start)]);

        self.b.switch_to_block(head);
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, o, end);
        self.b.ins().brif(more, obody, &[], exit, &[]);

        self.b.switch_to_block(obody);
        let outer_dims = outer.dims.clone();
        let outer_bases = self.advance(&starts, o, &outer_dims, &outer.strides);
        let zero = self.iconst(0);
        let init = self.identity(red.op, dtype);
        self.b.ins().jump(rhead, &[BlockArg::Value(zero), BlockArg::Value(init)]);

        self.b.switch_to_block(rhead);
        let rows_v = self.iconst(rows);
        let more_rows = self.b.ins().icmp(IntCC::UnsignedLessThan, ir, rows_v);
        self.b.ins().brif(more_rows, rbody, &[], store, &[BlockArg::Value(racc)]);

        self.b.switch_to_block(rbody);
        let bases =
            self.advance(&outer_bases, ir, &inner_dims[..inner_dims.len() - 1], &inner_strides);
        let len_v = self.iconst(len);
        // Outputs after the first hold the reduced value itself at every domain position:
        // this row starts at position `o * rows * len + ir * len`.
        let side: Vec<(usize, DType, Value)> = k.outputs[1..]
            .iter()
            .zip(&outs[1..])
            .map(|(&e, &base)| {
                let dtype = k.exprs[e].dtype;
                let size = dtype.size_in_bytes() as i64;
                let a = self.b.ins().imul_imm_s(o, rows * len * size);
                let r = self.b.ins().imul_imm_s(ir, len * size);
                let off = self.b.ins().iadd(a, r);
                (e, dtype, self.b.ins().iadd(base, off))
            })
            .collect();
        let row = Row { bases: &bases, side: &side, acc: racc, len: len_v, zero, red, dtype };
        let (j0, acc0) = match self.vector {
            Some((_, lanes)) if matches!(red.op, ReduceOp::Max | ReduceOp::Min) => {
                self.row_vector_extremum(&row, &param_vector, lanes)
            }
            Some((_, lanes)) => self.row_vector_accumulate(&row, &param_vector, lanes),
            None => (zero, racc),
        };
        self.b.ins().jump(shead, &[BlockArg::Value(j0), BlockArg::Value(acc0)]);

        self.b.switch_to_block(shead);
        let go = self.b.ins().icmp(IntCC::UnsignedLessThan, js, len_v);
        self.b.ins().brif(go, sbody, &[], rdone, &[BlockArg::Value(sacc)]);
        self.b.switch_to_block(sbody);
        let values = self.compute_scalar(js, &bases, &param_scalar);
        for &(e, side_dtype, base) in &side {
            let off = self.b.ins().imul_imm_s(js, side_dtype.size_in_bytes() as i64);
            let addr = self.b.ins().iadd(base, off);
            self.store(values[e], side_dtype, addr);
        }
        let acc = self.combine(red.op, sacc, values[out_expr], dtype);
        let j_next = self.b.ins().iadd_imm_s(js, 1);
        self.b.ins().jump(shead, &[BlockArg::Value(j_next), BlockArg::Value(acc)]);

        self.b.switch_to_block(rdone);
        let ir_next = self.b.ins().iadd_imm_s(ir, 1);
        self.b.ins().jump(rhead, &[BlockArg::Value(ir_next), BlockArg::Value(dacc)]);

        self.b.switch_to_block(store);
        let result = if dtype.is_float() {
            self.demote(facc, dtype)
        } else if dtype == DType::Bool {
            facc
        } else {
            self.narrow(facc, dtype)
        };
        let off = self.b.ins().imul_imm_s(o, dtype.size_in_bytes() as i64);
        let addr = self.b.ins().iadd(out_ptr, off);
        self.store(result, dtype, addr);
        let o_next = self.b.ins().iadd_imm_s(o, 1);
        self.b.ins().jump(head, &[BlockArg::Value(o_next)]);

        self.b.switch_to_block(exit);
        self.b.ins().return_(&[]);
    }

    /// The vector part of a max/min row: returns the position where the scalar tail starts
    /// and the accumulator so far.
    fn row_vector_extremum(
        &mut self,
        row: &Row<'_>,
        param_vector: &HashMap<usize, Value>,
        lanes: Type,
    ) -> (Value, Value) {
        let Row { bases, side, acc: racc, len: len_v, zero, red, dtype } = *row;
        let out_expr = self.kernel.outputs[0];
        // Max and min are exact in any order: keep a vector accumulator in the lanes'
        // own type and fold its lanes into the scalar one when the row's vector part ends.
        // The loop compares and selects (two instructions where Cranelift's
        // NaN-propagating `fmax` takes about nine) and remembers NaN lanes apart.
        let width = lanes.lane_count();
        let mask_ty = if lanes == types::F32X4 { types::I32X4 } else { types::I64X2 };
        let (splats, starts) = self.vector_row(bases, zero, lanes);
        let vhead = self.b.create_block();
        let jv = self.b.append_block_param(vhead, types::I64);
        let vacc = self.b.append_block_param(vhead, lanes);
        let vnan = self.b.append_block_param(vhead, mask_ty);
        let ptrs = self.carried(vhead, starts.len());
        let vbody = self.b.create_block();
        let vdone = self.b.create_block();
        let ident = self.float_const(
            if red.op == ReduceOp::Max { f64::NEG_INFINITY } else { f64::INFINITY },
            lanes.lane_type(),
        );
        let init = self.b.ins().splat(lanes, ident);
        let no_nan = self.b.ins().iconst(mask_ty.lane_type(), 0);
        let no_nan = self.b.ins().splat(mask_ty, no_nan);
        let mut args = vec![BlockArg::Value(zero), BlockArg::Value(init), BlockArg::Value(no_nan)];
        args.extend(starts.iter().map(|&v| BlockArg::Value(v)));
        self.b.ins().jump(vhead, &args);
        self.b.switch_to_block(vhead);
        let next = self.b.ins().iadd_imm_s(jv, i64::from(width));
        let fits = self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, next, len_v);
        self.b.ins().brif(fits, vbody, &[], vdone, &[]);
        self.b.switch_to_block(vbody);
        let srcs = self.vector_srcs(&splats, &ptrs);
        let values = self.compute_vector(&srcs, param_vector, lanes);
        self.store_side_vectors(side, &values, jv);
        let v = values[out_expr];
        let cc = if red.op == ReduceOp::Max { FloatCC::GreaterThan } else { FloatCC::LessThan };
        let better = self.b.ins().fcmp(cc, v, vacc);
        let better = self.b.ins().bitcast(lanes, MemFlagsData::new(), better);
        let folded = self.b.ins().bitselect(better, v, vacc);
        let is_nan = self.b.ins().fcmp(FloatCC::Unordered, v, v);
        let nans = self.b.ins().bor(vnan, is_nan);
        let mut loop_args =
            vec![BlockArg::Value(next), BlockArg::Value(folded), BlockArg::Value(nans)];
        let steps = self.input_steps(&splats, lanes);
        let advanced = self.advance_ptrs(&ptrs, &steps);
        loop_args.extend(advanced.iter().map(|&v| BlockArg::Value(v)));
        self.b.ins().jump(vhead, &loop_args);
        self.b.switch_to_block(vdone);
        let mut acc = racc;
        for lane in 0..width {
            let v = self.b.ins().extractlane(vacc, lane as u8);
            acc = self.combine(red.op, acc, v, dtype);
        }
        let any_nan = self.b.ins().vany_true(vnan);
        let nan = self.b.ins().f64const(f64::NAN);
        let acc = self.b.ins().select(any_nan, nan, acc);
        (jv, acc)
    }

    /// The vector part of a sum/product row: returns the position where the scalar tail
    /// starts and the accumulator so far.
    fn row_vector_accumulate(
        &mut self,
        row: &Row<'_>,
        param_vector: &HashMap<usize, Value>,
        lanes: Type,
    ) -> (Value, Value) {
        let Row { bases, side, acc: racc, len: len_v, zero, red, dtype } = *row;
        let out_expr = self.kernel.outputs[0];
        // Every lane accumulates in f64, in f64x2 vectors (an f32x4 is widened into two),
        // so that the lanes' additions do not wait on each other; the lanes are combined
        // in order when the row's vector part ends.
        let width = lanes.lane_count();
        let n_acc = (width / 2) as usize;
        let (splats, starts) = self.vector_row(bases, zero, lanes);
        let vhead = self.b.create_block();
        let jv = self.b.append_block_param(vhead, types::I64);
        let vaccs: Vec<Value> =
            (0..n_acc).map(|_| self.b.append_block_param(vhead, types::F64X2)).collect();
        let ptrs = self.carried(vhead, starts.len());
        let vbody = self.b.create_block();
        let vdone = self.b.create_block();
        let identity = self.identity(red.op, dtype);
        let identities = self.b.ins().splat(types::F64X2, identity);
        let first = self.b.ins().insertlane(identities, racc, 0);
        let mut args = vec![BlockArg::Value(zero), BlockArg::Value(first)];
        args.extend((1..n_acc).map(|_| BlockArg::Value(identities)));
        args.extend(starts.iter().map(|&v| BlockArg::Value(v)));
        self.b.ins().jump(vhead, &args);
        self.b.switch_to_block(vhead);
        let next = self.b.ins().iadd_imm_s(jv, i64::from(width));
        let fits = self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, next, len_v);
        self.b.ins().brif(fits, vbody, &[], vdone, &[]);
        self.b.switch_to_block(vbody);
        let srcs = self.vector_srcs(&splats, &ptrs);
        let values = self.compute_vector(&srcs, param_vector, lanes);
        self.store_side_vectors(side, &values, jv);
        let v = values[out_expr];
        let wide = if lanes == types::F32X4 {
            let (lo, hi) = math::widen(&mut self.math(), v);
            vec![lo, hi]
        } else {
            vec![v]
        };
        let mut next_args = vec![BlockArg::Value(next)];
        for (&acc, &w) in vaccs.iter().zip(&wide) {
            let folded = match red.op {
                ReduceOp::Prod => self.b.ins().fmul(acc, w),
                _ => self.b.ins().fadd(acc, w),
            };
            next_args.push(BlockArg::Value(folded));
        }
        let steps = self.input_steps(&splats, lanes);
        let advanced = self.advance_ptrs(&ptrs, &steps);
        next_args.extend(advanced.iter().map(|&v| BlockArg::Value(v)));
        self.b.ins().jump(vhead, &next_args);
        self.b.switch_to_block(vdone);
        let mut acc = None;
        for &vacc in &vaccs {
            for lane in 0..2u8 {
                let v = self.b.ins().extractlane(vacc, lane);
                acc = Some(match acc {
                    None => v,
                    Some(a) => self.combine(red.op, a, v, acc_ty_dtype(dtype)),
                });
            }
        }
        let acc = acc.expect("at least one accumulator");
        (jv, acc)
    }
}
