//! Row reductions: each output reduces a contiguous (or strided) row of its positions, with
//! per-lane accumulators in f64/i64.

use super::helpers::Helper;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use std::collections::HashMap;

use cranelift_codegen::ir::{BlockArg, InstBuilder, MemFlagsData, Type, Value, types};
use kiln_ir::kernel::ExprKind;
use kiln_ir::kernel::KernelReduce;
use kiln_ir::{BinaryOp, DType, ReduceOp, UnaryOp};

use super::math;
use super::staging::At;
use super::strategy::scalar_type;
use super::translate::{Prologue, Translator, acc_ty_dtype};
use crate::walk::{Layout, Rows, Sz};

/// A row sum of `exp(x - s)` over a contiguous f32 input `x`, `s` fixed along the row (or
/// absent), whose only other output is the exponentials themselves (softmax's middle pass):
/// one call per row to `kiln_exp_sum_f32s` (`wide.rs`), which computes them in the host's
/// widest vectors, stores them and sums them, where the vector loop would stage the
/// arguments in scratch, call the batch `exp`, and then store and widen every value in
/// 128-bit vectors (about four times the instructions per value).
#[derive(Clone, Copy)]
struct ExpSumRow {
    x: usize,
    shift: Shift,
}

/// What an [`ExpSumRow`] subtracts before the exponential.
#[derive(Clone, Copy)]
enum Shift {
    Zero,
    /// A parameter (its expression).
    Param(usize),
    /// An input that stays put along the row.
    Input(usize),
}

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

    /// Where this row of the kernel's outputs after the first goes: (expression, dtype,
    /// address). Those outputs hold the reduced value itself at every domain position, and
    /// row `ir` of output `o` starts at position `o * rows * len + ir * len`.
    pub(super) fn side_outputs(
        &mut self,
        outs: &[Value],
        o: Value,
        ir: Value,
    ) -> Vec<(usize, DType, Value)> {
        let k = self.kernel;
        let (numel, len) = (self.walk.numel, self.walk.inner());
        k.outputs[1..]
            .iter()
            .zip(&outs[1..])
            .map(|(&e, &base)| {
                let dtype = k.exprs[e].dtype;
                let size = dtype.size_in_bytes() as i64;
                let a = self.mul_size(o, numel, size);
                let r = self.mul_size(ir, len, size);
                let off = self.b.ins().iadd(a, r);
                (e, dtype, self.b.ins().iadd(base, off))
            })
            .collect()
    }

    /// A reduction kernel: for each output position in `start..end`, fold the body's value
    /// over the reduced dimensions (in rows of the last one, vectorized like elementwise
    /// kernels) into an f64 (float), i64 (integer) or i8 (bool) accumulator.
    pub(super) fn body_reduce(&mut self, red: KernelReduce, outer: &Layout) {
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
        let Rows { len, count: rows, dims: row_dims, strides: row_strides } = self.walk.rows();

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
        let rows_v = self.size(rows);
        let more_rows = self.b.ins().icmp(IntCC::UnsignedLessThan, ir, rows_v);
        self.b.ins().brif(more_rows, rbody, &[], store, &[BlockArg::Value(racc)]);

        self.b.switch_to_block(rbody);
        let bases = self.advance(&outer_bases, ir, &row_dims, &row_strides);
        let len_v = self.size(len);
        let side = self.side_outputs(&outs, o, ir);
        let row = Row { bases: &bases, side: &side, acc: racc, len: len_v, zero, red, dtype };
        let exp_row = self.exp_sum_row(red);
        let (j0, acc0) = match self.vector {
            _ if let Some(er) = exp_row => self.exp_sum_call(&row, er, &param_scalar),
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

    /// The shape of a row sum that goes to `kiln_exp_sum_f32s` whole (see [`ExpSumRow`]).
    fn exp_sum_row(&self, red: KernelReduce) -> Option<ExpSumRow> {
        let k = self.kernel;
        if red.op != ReduceOp::Sum
            || self.vector != Some((DType::F32, types::F32X4))
            || !self.fma
            || !self.long_rows
            || !self.wide
        {
            return None;
        }
        let out = k.outputs[0];
        let ExprKind::Unary(UnaryOp::Exp, arg) = k.exprs[out].kind else { return None };
        // At most one side output, and that is the exponentials themselves.
        if k.exprs[out].dtype != DType::F32
            || k.outputs.len() > 2
            || k.outputs[1..].iter().any(|&o| o != out)
        {
            return None;
        }
        // An f32 input whose last stride is `stride`.
        let input = |e: usize, stride: i64| match k.exprs[e].kind {
            ExprKind::Load(i)
                if k.inputs[i].dtype == DType::F32
                    && self.walk.strides[i].last() == Some(&Sz::Known(stride)) =>
            {
                Some(i)
            }
            _ => None,
        };
        let (x, shift) = match k.exprs[arg].kind {
            ExprKind::Load(_) => (input(arg, 1)?, Shift::Zero),
            ExprKind::Binary(BinaryOp::Sub, a, c) => {
                let shift = match k.exprs[c].kind {
                    ExprKind::Param(_) if k.exprs[c].dtype == DType::F32 => Shift::Param(c),
                    _ => Shift::Input(input(c, 0)?),
                };
                (input(a, 1)?, shift)
            }
            _ => return None,
        };
        Some(ExpSumRow { x, shift })
    }

    /// One row of an [`ExpSumRow`] kernel: the exponentials (and the side output) by one call;
    /// returns the end of the row and the accumulator with the row's sum added.
    fn exp_sum_call(
        &mut self,
        row: &Row<'_>,
        er: ExpSumRow,
        param_scalar: &HashMap<usize, Value>,
    ) -> (Value, Value) {
        let x = self.element_addr(er.x, row.zero, row.bases);
        let shift = match er.shift {
            Shift::Zero => self.b.ins().f32const(0.0),
            Shift::Param(e) => param_scalar[&e],
            Shift::Input(i) => self.load(DType::F32, row.bases[i]),
        };
        let out = row.side.first().map_or(row.zero, |&(_, _, base)| base);
        let sum = self.call(Helper::ExpSumF32s, &[x, shift, out, row.len]);
        (row.len, self.b.ins().fadd(row.acc, sum))
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
        // Max and min are exact in any order: keep vector accumulators in the lanes' own type
        // and fold their lanes into the scalar one when the row's vector part ends. Each step
        // compares and selects (one `maxps`, where Cranelift's NaN-propagating `fmax` takes
        // about nine instructions) and remembers NaN lanes apart. Two vectors a step, into two
        // accumulators, so that the compares do not wait on each other; one more step takes
        // an odd vector.
        let width = i64::from(lanes.lane_count());
        let mask_ty = if lanes == types::F32X4 { types::I32X4 } else { types::I64X2 };
        let (splats, starts) = self.vector_row(bases, zero, lanes);
        let steps = self.input_steps(&splats, lanes);
        let ident = self.float_const(
            if red.op == ReduceOp::Max { f64::NEG_INFINITY } else { f64::INFINITY },
            lanes.lane_type(),
        );
        let init = self.b.ins().splat(lanes, ident);
        let no_nan = self.b.ins().iconst(mask_ty.lane_type(), 0);
        let no_nan = self.b.ins().splat(mask_ty, no_nan);

        // Pairs: (j, acc a, acc b, nan lanes, pointers).
        let phead = self.b.create_block();
        let jp = self.b.append_block_param(phead, types::I64);
        let pacc =
            [self.b.append_block_param(phead, lanes), self.b.append_block_param(phead, lanes)];
        let pnan = self.b.append_block_param(phead, mask_ty);
        let pptrs = self.carried(phead, starts.len());
        let pbody = self.b.create_block();
        let pdone = self.b.create_block();
        let mut args = vec![zero, init, init, no_nan];
        args.extend(&starts);
        self.jump_with(phead, &args);
        self.b.switch_to_block(phead);
        let next = self.b.ins().iadd_imm_s(jp, 2 * width);
        let fits = self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, next, len_v);
        self.b.ins().brif(fits, pbody, &[], pdone, &[]);
        self.b.switch_to_block(pbody);
        let mut ptrs = pptrs.clone();
        let mut nans = pnan;
        let mut folded = [pacc[0], pacc[1]];
        for (k, acc) in folded.iter_mut().enumerate() {
            let j = self.b.ins().iadd_imm_s(jp, k as i64 * width);
            let at = At { j, first: zero, end: len_v, splats: &splats, ptrs: &ptrs };
            let v = self.extremum_vector(side, &at, param_vector, lanes);
            (*acc, nans) = self.fold_extremum(red.op, *acc, nans, v, lanes);
            ptrs = self.advance_ptrs(&ptrs, &steps);
        }
        let mut args = vec![next, folded[0], folded[1], nans];
        args.extend(&ptrs);
        self.jump_with(phead, &args);

        // At most one vector more.
        self.b.switch_to_block(pdone);
        let vacc = self.fold_extremum(red.op, pacc[0], pnan, pacc[1], lanes).0;
        let next = self.b.ins().iadd_imm_s(jp, width);
        let fits = self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, next, len_v);
        let one = self.b.create_block();
        let vdone = self.b.create_block();
        let jv = self.b.append_block_param(vdone, types::I64);
        let dacc = self.b.append_block_param(vdone, lanes);
        let dnan = self.b.append_block_param(vdone, mask_ty);
        let args = [BlockArg::Value(jp), BlockArg::Value(vacc), BlockArg::Value(pnan)];
        self.b.ins().brif(fits, one, &[], vdone, &args);
        self.b.switch_to_block(one);
        let at = At { j: jp, first: zero, end: len_v, splats: &splats, ptrs: &pptrs };
        let v = self.extremum_vector(side, &at, param_vector, lanes);
        let (acc, nans) = self.fold_extremum(red.op, vacc, pnan, v, lanes);
        self.jump_with(vdone, &[next, acc, nans]);

        self.b.switch_to_block(vdone);
        let mut acc = racc;
        for lane in 0..lanes.lane_count() {
            let v = self.b.ins().extractlane(dacc, lane as u8);
            acc = self.combine(red.op, acc, v, dtype);
        }
        let any_nan = self.b.ins().vany_true(dnan);
        let nan = self.b.ins().f64const(f64::NAN);
        let acc = self.b.ins().select(any_nan, nan, acc);
        (jv, acc)
    }

    /// The reduced expression's vector at element `j` (whose inputs `ptrs` point at), after
    /// storing the kernel's other outputs there.
    fn extremum_vector(
        &mut self,
        side: &[(usize, DType, Value)],
        at: &At<'_>,
        param_vector: &HashMap<usize, Value>,
        lanes: Type,
    ) -> Value {
        let values = self.vector_at(at, param_vector, lanes);
        self.store_side_vectors(side, &values, at.j);
        values[self.kernel.outputs[0]]
    }

    /// `acc` and `v` folded lane by lane, and the NaN lanes seen so far.
    fn fold_extremum(
        &mut self,
        op: ReduceOp,
        acc: Value,
        nans: Value,
        v: Value,
        lanes: Type,
    ) -> (Value, Value) {
        // Written `acc < v` (max) and `v < acc` (min) so that the x86 backend emits one
        // `maxps`/`minps`, which keeps the accumulator where `v` is NaN.
        let better = if op == ReduceOp::Max {
            self.b.ins().fcmp(FloatCC::LessThan, acc, v)
        } else {
            self.b.ins().fcmp(FloatCC::LessThan, v, acc)
        };
        let better = self.b.ins().bitcast(lanes, MemFlagsData::new(), better);
        let folded = self.b.ins().bitselect(better, v, acc);
        let is_nan = self.b.ins().fcmp(FloatCC::Unordered, v, v);
        (folded, self.b.ins().bor(nans, is_nan))
    }

    /// Jumps to `block` with `args`.
    pub(super) fn jump_with(&mut self, block: cranelift_codegen::ir::Block, args: &[Value]) {
        let args: Vec<BlockArg> = args.iter().map(|&v| BlockArg::Value(v)).collect();
        self.b.ins().jump(block, &args);
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
        // Every lane accumulates in f64, in f64x2 vectors (an f32x4 is widened into two).
        // Two vectors a step, into two sets of accumulators, so that no addition waits on
        // the one before (an f64 add takes four cycles; a step issues in about as many); a
        // last step takes an odd vector, and the lanes are combined in order at the end.
        let width = i64::from(lanes.lane_count());
        let n_acc = (width / 2) as usize;
        let (splats, starts) = self.vector_row(bases, zero, lanes);
        let steps = self.input_steps(&splats, lanes);
        let identity = self.identity(red.op, dtype);
        let identities = self.b.ins().splat(types::F64X2, identity);
        let first = self.b.ins().insertlane(identities, racc, 0);
        let mut init = vec![first];
        init.resize(2 * n_acc, identities);

        let phead = self.b.create_block();
        let jp = self.b.append_block_param(phead, types::I64);
        let paccs: Vec<Value> =
            (0..2 * n_acc).map(|_| self.b.append_block_param(phead, types::F64X2)).collect();
        let pptrs = self.carried(phead, starts.len());
        let pbody = self.b.create_block();
        let pdone = self.b.create_block();
        let mut args = vec![zero];
        args.extend(&init);
        args.extend(&starts);
        self.jump_with(phead, &args);
        self.b.switch_to_block(phead);
        let next = self.b.ins().iadd_imm_s(jp, 2 * width);
        let fits = self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, next, len_v);
        self.b.ins().brif(fits, pbody, &[], pdone, &[]);
        self.b.switch_to_block(pbody);
        let mut ptrs = pptrs.clone();
        let mut folded = Vec::with_capacity(2 * n_acc);
        for (k, accs) in paccs.chunks(n_acc).enumerate() {
            let j = self.b.ins().iadd_imm_s(jp, k as i64 * width);
            let at = At { j, first: zero, end: len_v, splats: &splats, ptrs: &ptrs };
            folded.extend(self.accumulate_vector(side, &at, param_vector, lanes, red.op, accs));
            ptrs = self.advance_ptrs(&ptrs, &steps);
        }
        let mut args = vec![next];
        args.extend(&folded);
        args.extend(&ptrs);
        self.jump_with(phead, &args);

        // At most one vector more, into the merged accumulators.
        self.b.switch_to_block(pdone);
        let merged: Vec<Value> =
            (0..n_acc).map(|i| self.fold_wide(red.op, paccs[i], paccs[n_acc + i])).collect();
        let next = self.b.ins().iadd_imm_s(jp, width);
        let fits = self.b.ins().icmp(IntCC::UnsignedLessThanOrEqual, next, len_v);
        let one = self.b.create_block();
        let vdone = self.b.create_block();
        let jv = self.b.append_block_param(vdone, types::I64);
        let vaccs: Vec<Value> =
            (0..n_acc).map(|_| self.b.append_block_param(vdone, types::F64X2)).collect();
        let mut args = vec![BlockArg::Value(jp)];
        args.extend(merged.iter().map(|&v| BlockArg::Value(v)));
        self.b.ins().brif(fits, one, &[], vdone, &args);
        self.b.switch_to_block(one);
        let at = At { j: jp, first: zero, end: len_v, splats: &splats, ptrs: &pptrs };
        let accs = self.accumulate_vector(side, &at, param_vector, lanes, red.op, &merged);
        let mut args = vec![next];
        args.extend(&accs);
        self.jump_with(vdone, &args);

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

    /// Computes the vector at `at.j` (storing the kernel's other outputs) and folds the
    /// reduced expression, widened to f64x2 vectors, into `accs`.
    fn accumulate_vector(
        &mut self,
        side: &[(usize, DType, Value)],
        at: &At<'_>,
        param_vector: &HashMap<usize, Value>,
        lanes: Type,
        op: ReduceOp,
        accs: &[Value],
    ) -> Vec<Value> {
        let values = self.vector_at(at, param_vector, lanes);
        self.store_side_vectors(side, &values, at.j);
        let v = values[self.kernel.outputs[0]];
        let wide = if lanes == types::F32X4 {
            let (lo, hi) = math::widen(&mut self.math(), v);
            vec![lo, hi]
        } else {
            vec![v]
        };
        accs.iter().zip(&wide).map(|(&acc, &w)| self.fold_wide(op, acc, w)).collect()
    }

    fn fold_wide(&mut self, op: ReduceOp, acc: Value, w: Value) -> Value {
        match op {
            ReduceOp::Prod => self.b.ins().fmul(acc, w),
            _ => self.b.ins().fadd(acc, w),
        }
    }
}
