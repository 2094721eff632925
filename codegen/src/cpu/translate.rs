//! The translator: the state of one kernel's function as it is built, and the lowering of
//! each scalar and vector op (loads, stores, arithmetic, casts, the math functions).

use super::helpers::Helper;
use std::collections::HashMap;

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    BlockArg, InstBuilder, MemFlagsData, StackSlot, StackSlotData, StackSlotKind, Type, Value,
    types,
};
use cranelift_codegen::packed_option::ReservedValue;
use cranelift_frontend::FunctionBuilder;
use kiln_ir::kernel::{ExprKind, Kernel};
use kiln_ir::{BinaryOp, DType, UnaryOp};

use super::math;
use super::staging::{self, Staging};
use super::strategy::scalar_type;
use crate::walk::{Layout, Sz};

/// The flags of kernel loads and stores: kiln's buffers are aligned and every address a
/// kernel forms lies inside one, so no access traps.
pub(super) fn flags() -> MemFlagsData {
    MemFlagsData::trusted()
}

/// Where one vector iteration finds an input.
#[derive(Clone, Copy)]
pub(super) enum VecSrc {
    /// Constant along the row: the splatted value.
    Splat(Value),
    /// The address of the iteration's first element, the others following it.
    At(Value),
    /// The address of the iteration's first element and the bytes between elements.
    Gather(Value, i64),
}

/// What every kernel function loads in its entry block.
pub(super) struct Prologue {
    pub(super) start: Value,
    pub(super) end: Value,
    pub(super) ins: Vec<Value>,
    pub(super) outs: Vec<Value>,
    pub(super) param_scalar: HashMap<usize, Value>,
    pub(super) param_vector: HashMap<usize, Value>,
}

/// Which of the two trigonometric functions [`Translator::trig_vector`] computes.
#[derive(Clone, Copy)]
pub(super) enum Trig {
    Sin,
    Cos,
}

pub(super) struct Translator<'a, 'b> {
    pub(super) kernel: &'a Kernel,
    /// The walk of the reduced dimensions (all of them for an elementwise kernel).
    pub(super) walk: &'a Layout,
    /// A size-generic kernel's sizes, loaded by the prologue from the slots after its
    /// parameters ([`Sz::Slot`] indexes them); empty for a kernel specialised to its sizes.
    pub(super) sizes: Vec<Value>,
    /// How many size slots the kernel reads (0 for a specialised kernel).
    pub(super) size_slots: usize,
    /// Whether the rows are long enough for the batch functions (`staging::MIN_ROW`): a
    /// generic kernel's row length is not known, so this is part of its key.
    pub(super) long_rows: bool,
    pub(super) vector: Option<(DType, Type)>,
    /// Columns per strip when an elementwise kernel walks in strips (see [`strip_width`]).
    pub(super) strip: Option<usize>,
    pub(super) fma: bool,
    /// The batch functions run on wide vectors here ([`super::CpuFeatures::wide`]).
    pub(super) wide: bool,
    pub(super) helpers: HashMap<&'static str, cranelift_codegen::ir::FuncRef>,
    pub(super) b: &'a mut FunctionBuilder<'b>,
    /// Transcendentals computed a block at a time with wider vectors (`staging.rs`).
    pub(super) staging: Option<Staging>,
    pub(super) stage_mode: staging::Mode,
    /// Where the prologue stored each parameter's splat (expression, byte offset), so that
    /// loops load it: Cranelift rematerializes pure values at their uses, and a splatted
    /// bf16 parameter's conversion (about 35 instructions) ran in every iteration.
    pub(super) param_splats: Option<(StackSlot, HashMap<usize, i32>)>,
}

impl<'b> Translator<'_, 'b> {
    pub(super) fn math(&mut self) -> math::Math<'_, 'b> {
        math::Math { b: self.b, fma: self.fma }
    }

    /// `n` pointer-sized parameters of `block`.
    pub(super) fn carried(&mut self, block: cranelift_codegen::ir::Block, n: usize) -> Vec<Value> {
        (0..n).map(|_| self.b.append_block_param(block, types::I64)).collect()
    }

    pub(super) fn iconst(&mut self, v: i64) -> Value {
        self.b.ins().iconst(types::I64, v)
    }

    /// The entry block: the function's parameters, the buffer pointers and the kernel's
    /// parameters, loaded once (splatted too when the loop is vectorized).
    pub(super) fn prologue(&mut self) -> Prologue {
        let k = self.kernel;
        let entry = self.b.create_block();
        self.b.append_block_params_for_function_params(entry);
        self.b.switch_to_block(entry);
        let [bufs, params, start, end] =
            self.b.block_params(entry).try_into().expect("four parameters");
        let n_in = k.inputs.len();
        let ptrs: Vec<Value> = (0..n_in + k.outputs.len())
            .map(|i| self.b.ins().load(types::I64, flags(), bufs, (8 * i) as i32))
            .collect();
        let mut scalar = HashMap::new();
        let mut vector = HashMap::new();
        let n_params = k.exprs.iter().filter(|e| matches!(e.kind, ExprKind::Param(_))).count();
        let slot = (self.vector.is_some() && n_params > 0).then(|| {
            let data = StackSlotData::new(StackSlotKind::ExplicitSlot, 16 * n_params as u32, 4);
            (self.b.create_sized_stack_slot(data), HashMap::new())
        });
        self.param_splats = slot;
        for (e, expr) in k.exprs.iter().enumerate() {
            if let ExprKind::Param(p) = expr.kind {
                let v = self.param_value(params, p, expr.dtype);
                if let Some((_, lanes)) = self.vector {
                    let splat = self.b.ins().splat(lanes, v);
                    vector.insert(e, splat);
                    if let Some((slot, offsets)) = &mut self.param_splats {
                        let at = 16 * offsets.len() as i32;
                        self.b.ins().stack_store(types::I64, splat, *slot, at);
                        offsets.insert(e, at);
                    }
                }
                scalar.insert(e, v);
            }
        }
        let first = 8 * k.params as i32;
        self.sizes = (0..self.size_slots as i32)
            .map(|i| self.b.ins().load(types::I64, flags(), params, first + 8 * i))
            .collect();
        let outs = ptrs[n_in..].to_vec();
        Prologue {
            start,
            end,
            ins: ptrs[..n_in].to_vec(),
            outs,
            param_scalar: scalar,
            param_vector: vector,
        }
    }

    /// Each input's address with its view's offset added.
    pub(super) fn input_starts(&mut self, ins: &[Value]) -> Vec<Value> {
        (0..ins.len())
            .map(|idx| {
                let size = self.kernel.inputs[idx].dtype.size_in_bytes() as i64;
                match self.walk.offsets[idx] {
                    Sz::Known(o) => self.b.ins().iadd_imm_s(ins[idx], o * size),
                    Sz::Slot(_) => {
                        let bytes = self.mul_size_const(self.walk.offsets[idx], size);
                        self.b.ins().iadd(ins[idx], bytes)
                    }
                }
            })
            .collect()
    }

    pub(super) fn compute_vector(
        &mut self,
        srcs: &[VecSrc],
        params: &HashMap<usize, Value>,
        lanes: Type,
    ) -> Vec<Value> {
        let k = self.kernel;
        let mask_type = if lanes == types::F32X4 { types::I32X4 } else { types::I64X2 };
        let mut vals: Vec<Value> = Vec::with_capacity(k.exprs.len());
        for (e, expr) in k.exprs.iter().enumerate() {
            if let Some(s) = &self.staging {
                match self.stage_mode {
                    staging::Mode::Arguments if !s.needs(e) => {
                        vals.push(Value::reserved_value());
                        continue;
                    }
                    staging::Mode::Results(off) => {
                        if let Some(at) = s.scratch_of(e) {
                            let base = self.b.ins().stack_addr(types::I64, s.slot(), at);
                            let addr = self.b.ins().iadd(base, off);
                            vals.push(self.b.ins().load(lanes, flags(), addr, 0));
                            continue;
                        }
                    }
                    _ => {}
                }
            }
            let v = match expr.kind {
                ExprKind::Load(idx) => match srcs[idx] {
                    VecSrc::Splat(v) => v,
                    VecSrc::At(addr) => self.load_vector(expr.dtype, lanes, addr),
                    VecSrc::Gather(addr, step) => {
                        let first = self.load(expr.dtype, addr);
                        let mut v = self.b.ins().splat(lanes, first);
                        for lane in 1..lanes.lane_count() {
                            let at = self.b.ins().iadd_imm_s(addr, step * i64::from(lane));
                            let x = self.load(expr.dtype, at);
                            v = self.b.ins().insertlane(v, x, lane as u8);
                        }
                        v
                    }
                },
                ExprKind::Param(_) => match &self.param_splats {
                    Some((slot, offsets)) => {
                        self.b.ins().stack_load(types::I64, lanes, *slot, offsets[&e])
                    }
                    None => params[&e],
                },
                ExprKind::Unary(op, a) => {
                    let x = vals[a];
                    match op {
                        UnaryOp::Neg => self.b.ins().fneg(x),
                        UnaryOp::Abs => self.b.ins().fabs(x),
                        UnaryOp::Sqrt => self.b.ins().sqrt(x),
                        UnaryOp::Floor => self.b.ins().floor(x),
                        UnaryOp::Ceil => self.b.ins().ceil(x),
                        UnaryOp::Round => self.b.ins().nearest(x),
                        UnaryOp::Recip => {
                            let one = self.float_const(1.0, lanes.lane_type());
                            let ones = self.b.ins().splat(lanes, one);
                            self.b.ins().fdiv(ones, x)
                        }
                        UnaryOp::Relu => {
                            let zero = self.float_const(0.0, lanes.lane_type());
                            let zeros = self.b.ins().splat(lanes, zero);
                            let neg = self.b.ins().fcmp(FloatCC::LessThan, x, zeros);
                            let mask = self.b.ins().bitcast(lanes, MemFlagsData::new(), neg);
                            self.b.ins().bitselect(mask, zeros, x)
                        }
                        UnaryOp::Not => self.b.ins().bnot(x),
                        UnaryOp::Exp => math::exp(&mut self.math(), x),
                        UnaryOp::Tanh => math::tanh(&mut self.math(), x),
                        UnaryOp::Sigmoid => math::sigmoid(&mut self.math(), x),
                        UnaryOp::Erf => math::erf(&mut self.math(), x),
                        UnaryOp::Log => math::log(&mut self.math(), x),
                        UnaryOp::Sin => self.trig_vector(Trig::Sin, x),
                        UnaryOp::Cos => self.trig_vector(Trig::Cos, x),
                        UnaryOp::Tan => self.tan_vector(x),
                        UnaryOp::Erfc => unreachable!("erfc is not vectorised (strategy.rs)"),
                    }
                }
                ExprKind::Binary(op, a, c) => {
                    let (x, y) = (vals[a], vals[c]);
                    match op {
                        BinaryOp::Add => self.b.ins().fadd(x, y),
                        BinaryOp::Sub => self.b.ins().fsub(x, y),
                        BinaryOp::Mul => self.b.ins().fmul(x, y),
                        BinaryOp::Div => self.b.ins().fdiv(x, y),
                        BinaryOp::Pow => self.pow_vector(x, y),
                        BinaryOp::Maximum => self.b.ins().fmax(x, y),
                        BinaryOp::Minimum => self.b.ins().fmin(x, y),
                        BinaryOp::And => self.b.ins().band(x, y),
                        BinaryOp::Or => self.b.ins().bor(x, y),
                        cmp => {
                            let cc = float_cc(cmp);
                            let m = self.b.ins().fcmp(cc, x, y);
                            debug_assert_eq!(self.b.func.dfg.value_type(m), mask_type);
                            m
                        }
                    }
                }
                ExprKind::Where(c, a, d) => {
                    let mask = self.b.ins().bitcast(lanes, MemFlagsData::new(), vals[c]);
                    self.b.ins().bitselect(mask, vals[a], vals[d])
                }
                // Between f32 and a 16-bit float (`lane_type`): the rounding below is the cast.
                ExprKind::Cast(a) => vals[a],
            };
            let rounds = matches!(expr.kind, ExprKind::Unary(..) | ExprKind::Binary(..))
                || matches!(expr.kind, ExprKind::Cast(a) if k.exprs[a].dtype != expr.dtype);
            let v = if rounds { self.narrow_vector(v, expr.dtype) } else { v };
            vals.push(v);
        }
        vals
    }

    pub(super) fn compute_scalar(
        &mut self,
        j: Value,
        bases: &[Value],
        params: &HashMap<usize, Value>,
    ) -> Vec<Value> {
        let k = self.kernel;
        let mut vals: Vec<Value> = Vec::with_capacity(k.exprs.len());
        for (e, expr) in k.exprs.iter().enumerate() {
            let dtype = expr.dtype;
            let v = match expr.kind {
                ExprKind::Load(idx) => {
                    let addr = self.element_addr(idx, j, bases);
                    self.load(dtype, addr)
                }
                ExprKind::Param(_) => params[&e],
                ExprKind::Unary(op, a) => self.unary(op, vals[a], dtype),
                ExprKind::Binary(op, a, c) => {
                    self.binary(op, vals[a], vals[c], k.exprs[a].dtype, dtype)
                }
                ExprKind::Where(c, a, d) => self.b.ins().select(vals[c], vals[a], vals[d]),
                ExprKind::Cast(a) => self.cast(vals[a], k.exprs[a].dtype, dtype),
            };
            vals.push(v);
        }
        vals
    }

    /// `x^y` for four f32 lanes: the vector path, and the scalar f64 function for every lane
    /// when one of them needs IEEE's special cases (a zero, infinite or NaN operand, or a
    /// negative base with a fractional exponent).
    pub(super) fn pow_vector(&mut self, x: Value, y: Value) -> Value {
        let fast = math::pow(&mut self.math(), x, y);
        let ok = math::pow_fast_lanes(&mut self.math(), x, y);
        let special = self.b.ins().bnot(ok);
        let any = self.b.ins().vany_true(special);
        let slow = self.b.create_block();
        let done = self.b.create_block();
        let result = self.b.append_block_param(done, types::F32X4);
        self.b.ins().brif(any, slow, &[], done, &[BlockArg::Value(fast)]);
        self.b.set_cold_block(slow);
        self.b.switch_to_block(slow);
        let mut v = fast;
        for lane in 0..4u8 {
            let xs = self.b.ins().extractlane(x, lane);
            let ys = self.b.ins().extractlane(y, lane);
            let r = self.via_f64(Helper::Pow, &[xs, ys], DType::F32);
            v = self.b.ins().insertlane(v, r, lane);
        }
        self.b.ins().jump(done, &[BlockArg::Value(v)]);
        self.b.switch_to_block(done);
        result
    }

    /// `sin` or `cos` of four f32 lanes: the vector path, and the scalar f64 function for
    /// every lane when one of them is beyond its range (huge, infinite or NaN).
    pub(super) fn trig_vector(&mut self, trig: Trig, x: Value) -> Value {
        let (cos, helper) = match trig {
            Trig::Cos => (true, Helper::Cos),
            Trig::Sin => (false, Helper::Sin),
        };
        let fast = math::sin_cos(&mut self.math(), x, cos);
        let ax = self.b.ins().fabs(x);
        let limit = self.b.ins().f32const(math::TRIG_LIMIT);
        let limit = self.b.ins().splat(types::F32X4, limit);
        let outside = self.b.ins().fcmp(FloatCC::UnorderedOrGreaterThan, ax, limit);
        let any = self.b.ins().vany_true(outside);
        let slow = self.b.create_block();
        let done = self.b.create_block();
        let result = self.b.append_block_param(done, types::F32X4);
        self.b.ins().brif(any, slow, &[], done, &[BlockArg::Value(fast)]);
        self.b.set_cold_block(slow);
        self.b.switch_to_block(slow);
        let v = self.lanes_via_f64(helper, x, fast, outside);
        self.b.ins().jump(done, &[BlockArg::Value(v)]);
        self.b.switch_to_block(done);
        result
    }

    /// `tan` of four f32 lanes, each the f64 function rounded once (exactly the reference's
    /// value; there is no vector polynomial for it yet, so it costs four calls).
    pub(super) fn tan_vector(&mut self, x: Value) -> Value {
        let mut v = x;
        for lane in 0..4u8 {
            let s = self.b.ins().extractlane(x, lane);
            let r = self.via_f64(Helper::Tan, &[s], DType::F32);
            v = self.b.ins().insertlane(v, r, lane);
        }
        v
    }

    /// `fast` with the lanes that `mask` selects replaced by the scalar f64 function `helper`
    /// of `x`'s lane (only those: a lane's value never depends on its neighbours).
    pub(super) fn lanes_via_f64(
        &mut self,
        helper: Helper,
        x: Value,
        fast: Value,
        mask: Value,
    ) -> Value {
        let mut slow = fast;
        for lane in 0..4u8 {
            let s = self.b.ins().extractlane(x, lane);
            let r = self.via_f64(helper, &[s], DType::F32);
            slow = self.b.ins().insertlane(slow, r, lane);
        }
        let mask = self.b.ins().bitcast(types::F32X4, MemFlagsData::new(), mask);
        self.b.ins().bitselect(mask, slow, fast)
    }

    pub(super) fn float_const(&mut self, v: f64, ty: Type) -> Value {
        if ty == types::F32 { self.b.ins().f32const(v as f32) } else { self.b.ins().f64const(v) }
    }

    pub(super) fn call(&mut self, helper: Helper, args: &[Value]) -> Value {
        let f = self.helpers[helper.name()];
        let call = self.b.ins().call(f, args);
        self.b.inst_results(call)[0]
    }

    /// Rounds a value held in a wider register to its dtype, as the reference does after
    /// every op: f16/bf16 through their precision, narrow integers by wrapping.
    pub(super) fn narrow(&mut self, v: Value, dtype: DType) -> Value {
        match dtype {
            DType::F16 => self.call(Helper::RoundF16, &[v]),
            DType::BF16 => {
                let bits = self.bf16_bits(v);
                let wide = self.b.ins().ishl_imm_u(bits, 16);
                self.b.ins().bitcast(types::F32, MemFlagsData::new(), wide)
            }
            DType::I32 => {
                let r = self.b.ins().ireduce(types::I32, v);
                self.b.ins().sextend(types::I64, r)
            }
            DType::I8 => {
                let r = self.b.ins().ireduce(types::I8, v);
                self.b.ins().sextend(types::I64, r)
            }
            DType::U8 => self.b.ins().band_imm_u(v, 0xff),
            DType::F32 | DType::F64 | DType::I64 | DType::Bool => v,
        }
    }

    /// The bf16 bits (in the low half of an i32) of an f32 value, rounded to nearest with
    /// ties to even, NaN kept quiet: `half`'s `bf16::from_f32`, inline instead of a call.
    fn bf16_bits(&mut self, v: Value) -> Value {
        let bits = self.b.ins().bitcast(types::I32, MemFlagsData::new(), v);
        let high = self.b.ins().ushr_imm_u(bits, 16);
        let lsb = self.b.ins().band_imm_u(high, 1);
        let biased = self.b.ins().iadd_imm_s(bits, 0x7FFF);
        let rounded = self.b.ins().iadd(biased, lsb);
        let rounded = self.b.ins().ushr_imm_u(rounded, 16);
        let magnitude = self.b.ins().band_imm_u(bits, 0x7FFF_FFFF);
        let nan = self.b.ins().icmp_imm_u(IntCC::UnsignedGreaterThan, magnitude, 0x7F80_0000);
        let quiet = self.b.ins().bor_imm_u(high, 0x40);
        self.b.ins().select(nan, quiet, rounded)
    }

    /// An f64 value rounded once to float `dtype` (held in an f32 register for 16-bit
    /// types). Rounding to f32 first and then to 16 bits would round twice, and a value just
    /// above a 16-bit tie would land on the tie and go to even; rounding to f32 *to odd*
    /// keeps the inexactness in the last bit, so the second rounding is the correct one.
    pub(super) fn demote(&mut self, v: Value, dtype: DType) -> Value {
        match dtype {
            DType::F64 => v,
            DType::F32 => self.b.ins().fdemote(types::F32, v),
            _ => {
                let f = self.b.ins().fdemote(types::F32, v);
                let back = self.b.ins().fpromote(types::F64, f);
                // Ordered: NaN stays as it is.
                let inexact = self.b.ins().fcmp(FloatCC::OrderedNotEqual, back, v);
                let bits = self.b.ins().bitcast(types::I32, MemFlagsData::new(), f);
                let low = self.b.ins().band_imm_u(bits, 1);
                let even = self.b.ins().icmp_imm_s(IntCC::Equal, low, 0);
                let fix = self.b.ins().band(inexact, even);
                // The odd neighbour lies on the other side of `v` from the nearest value.
                let (ab, av) = (self.b.ins().fabs(back), self.b.ins().fabs(v));
                let above = self.b.ins().fcmp(FloatCC::GreaterThan, ab, av);
                let (down, up) =
                    (self.b.ins().iadd_imm_s(bits, -1), self.b.ins().iadd_imm_s(bits, 1));
                let moved = self.b.ins().select(above, down, up);
                let odd = self.b.ins().select(fix, moved, bits);
                let f = self.b.ins().bitcast(types::F32, MemFlagsData::new(), odd);
                self.narrow(f, dtype)
            }
        }
    }

    /// Parameter `p` as a value of `dtype`. Parameter slots hold an f64 for float
    /// parameters and an i64 for integer and bool ones (see [`param_slots`]), so that large
    /// integers pass exactly.
    pub(super) fn param_value(&mut self, params: Value, p: usize, dtype: DType) -> Value {
        let at = (8 * p) as i32;
        if !dtype.is_float() {
            let i = self.b.ins().load(types::I64, flags(), params, at);
            return if dtype == DType::Bool {
                self.b.ins().icmp_imm_s(IntCC::NotEqual, i, 0)
            } else {
                self.narrow(i, dtype)
            };
        }
        let raw = self.b.ins().load(types::F64, flags(), params, at);
        self.demote(raw, dtype)
    }

    pub(super) fn load(&mut self, dtype: DType, addr: Value) -> Value {
        let fl = MemFlagsData::new().with_notrap();
        match dtype {
            DType::F32 => self.b.ins().load(types::F32, fl, addr, 0),
            DType::F64 => self.b.ins().load(types::F64, fl, addr, 0),
            DType::F16 => {
                let bits = self.b.ins().uload16(types::I32, fl, addr, 0);
                self.call(Helper::F16ToF32, &[bits])
            }
            DType::BF16 => {
                let bits = self.b.ins().uload16(types::I32, fl, addr, 0);
                let wide = self.b.ins().ishl_imm_u(bits, 16);
                self.b.ins().bitcast(types::F32, MemFlagsData::new(), wide)
            }
            DType::I64 => self.b.ins().load(types::I64, fl, addr, 0),
            DType::I32 => self.b.ins().sload32(fl, addr, 0),
            DType::I8 => self.b.ins().sload8(types::I64, fl, addr, 0),
            DType::U8 => self.b.ins().uload8(types::I64, fl, addr, 0),
            DType::Bool => self.b.ins().load(types::I8, fl, addr, 0),
        }
    }

    pub(super) fn store(&mut self, v: Value, dtype: DType, addr: Value) {
        let fl = MemFlagsData::new().with_notrap();
        match dtype {
            DType::F32 | DType::F64 | DType::I64 | DType::Bool => {
                self.b.ins().store(fl, v, addr, 0);
            }
            DType::F16 => {
                let bits = self.call(Helper::F32ToF16, &[v]);
                self.b.ins().istore16(fl, bits, addr, 0);
            }
            DType::BF16 => {
                let bits = self.bf16_bits(v);
                self.b.ins().istore16(fl, bits, addr, 0);
            }
            DType::I32 => {
                self.b.ins().istore32(fl, v, addr, 0);
            }
            DType::I8 | DType::U8 => {
                self.b.ins().istore8(fl, v, addr, 0);
            }
        }
    }

    /// A float function computed in f64 by a helper, rounded back to `dtype`.
    pub(super) fn via_f64(&mut self, helper: Helper, args: &[Value], dtype: DType) -> Value {
        let wide: Vec<Value> = args
            .iter()
            .map(|&a| if dtype == DType::F64 { a } else { self.b.ins().fpromote(types::F64, a) })
            .collect();
        let r = self.call(helper, &wide);
        self.demote(r, dtype)
    }

    pub(super) fn unary(&mut self, op: UnaryOp, x: Value, dtype: DType) -> Value {
        if dtype == DType::Bool {
            // logical_not of a bool (0 or 1).
            return self.b.ins().bxor_imm_u(x, 1);
        }
        if !dtype.is_float() {
            let v = match op {
                UnaryOp::Neg => self.b.ins().ineg(x),
                UnaryOp::Abs => self.b.ins().iabs(x),
                UnaryOp::Relu => {
                    let zero = self.iconst(0);
                    self.b.ins().smax(x, zero)
                }
                other => unreachable!("{} is float-only", other.name()),
            };
            return self.narrow(v, dtype);
        }
        let polynomial = op.is_transcendental() && op != UnaryOp::Erfc;
        if matches!(dtype, DType::F32 | DType::BF16 | DType::F16) && polynomial {
            // One lane of the vector polynomial: an element gets the same bits whether its
            // kernel reaches it in a vector or in a scalar tail (which depends on the layout,
            // so it differs between plans of one program). A 16-bit result is the f32 one
            // rounded, as PyTorch computes 16-bit transcendentals.
            let v = self.b.ins().splat(types::F32X4, x);
            let r = match op {
                UnaryOp::Exp => math::exp(&mut self.math(), v),
                UnaryOp::Log => math::log(&mut self.math(), v),
                UnaryOp::Tanh => math::tanh(&mut self.math(), v),
                UnaryOp::Sigmoid => math::sigmoid(&mut self.math(), v),
                UnaryOp::Erf => math::erf(&mut self.math(), v),
                UnaryOp::Sin => self.trig_vector(Trig::Sin, v),
                UnaryOp::Cos => self.trig_vector(Trig::Cos, v),
                UnaryOp::Tan => self.tan_vector(v),
                UnaryOp::Neg
                | UnaryOp::Abs
                | UnaryOp::Sqrt
                | UnaryOp::Relu
                | UnaryOp::Recip
                | UnaryOp::Floor
                | UnaryOp::Ceil
                | UnaryOp::Round
                | UnaryOp::Erfc
                | UnaryOp::Not => unreachable!("{} has no vector polynomial", op.name()),
            };
            let r = self.b.ins().extractlane(r, 0);
            return self.narrow(r, dtype);
        }
        let ty = scalar_type(dtype);
        let v = match op {
            UnaryOp::Neg => self.b.ins().fneg(x),
            UnaryOp::Abs => self.b.ins().fabs(x),
            UnaryOp::Sqrt => self.b.ins().sqrt(x),
            UnaryOp::Floor => self.b.ins().floor(x),
            UnaryOp::Ceil => self.b.ins().ceil(x),
            UnaryOp::Round => self.b.ins().nearest(x),
            UnaryOp::Recip => {
                let one = self.float_const(1.0, ty);
                self.b.ins().fdiv(one, x)
            }
            UnaryOp::Relu => {
                let zero = self.float_const(0.0, ty);
                let neg = self.b.ins().fcmp(FloatCC::LessThan, x, zero);
                self.b.ins().select(neg, zero, x)
            }
            UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Tan
            | UnaryOp::Tanh
            | UnaryOp::Sigmoid
            | UnaryOp::Erf
            | UnaryOp::Erfc => {
                let helper = Helper::for_unary(op).expect("every transcendental has a helper");
                return self.via_f64(helper, &[x], dtype);
            }
            UnaryOp::Not => unreachable!("logical_not takes bools"),
        };
        self.narrow(v, dtype)
    }

    pub(super) fn binary(
        &mut self,
        op: BinaryOp,
        x: Value,
        y: Value,
        arg: DType,
        dtype: DType,
    ) -> Value {
        if op.is_comparison() {
            return if arg.is_float() {
                self.b.ins().fcmp(float_cc(op), x, y)
            } else {
                self.b.ins().icmp(int_cc(op), x, y)
            };
        }
        if arg == DType::Bool {
            return match op {
                BinaryOp::And | BinaryOp::Minimum => self.b.ins().band(x, y),
                BinaryOp::Or | BinaryOp::Maximum => self.b.ins().bor(x, y),
                other => unreachable!("{} does not take bools", other.name()),
            };
        }
        if !arg.is_float() {
            let v = match op {
                BinaryOp::Add => self.b.ins().iadd(x, y),
                BinaryOp::Sub => self.b.ins().isub(x, y),
                BinaryOp::Mul => self.b.ins().imul(x, y),
                BinaryOp::Maximum => self.b.ins().smax(x, y),
                BinaryOp::Minimum => self.b.ins().smin(x, y),
                BinaryOp::Div | BinaryOp::Rem => self.int_division(op, x, y),
                BinaryOp::BitAnd => self.b.ins().band(x, y),
                BinaryOp::BitOr => self.b.ins().bor(x, y),
                BinaryOp::BitXor => self.b.ins().bxor(x, y),
                BinaryOp::Shl | BinaryOp::Shr => self.shift(op, x, y),
                other => unreachable!("{} does not take integers", other.name()),
            };
            return self.narrow(v, dtype);
        }
        let v = match op {
            BinaryOp::Add => self.b.ins().fadd(x, y),
            BinaryOp::Sub => self.b.ins().fsub(x, y),
            BinaryOp::Mul => self.b.ins().fmul(x, y),
            BinaryOp::Div => self.b.ins().fdiv(x, y),
            BinaryOp::Maximum => self.b.ins().fmax(x, y),
            BinaryOp::Minimum => self.b.ins().fmin(x, y),
            BinaryOp::Pow if dtype == DType::F32 => {
                // One lane of the vector `pow`, as for the transcendental functions above.
                let (xv, yv) =
                    (self.b.ins().splat(types::F32X4, x), self.b.ins().splat(types::F32X4, y));
                let r = self.pow_vector(xv, yv);
                return self.b.ins().extractlane(r, 0);
            }
            BinaryOp::Pow => return self.via_f64(Helper::Pow, &[x, y], dtype),
            // Exact in f64 for every narrower float too: the remainder of two f32s is an f32.
            BinaryOp::Rem => return self.via_f64(Helper::Fmod, &[x, y], dtype),
            other => unreachable!("{} does not take floats", other.name()),
        };
        self.narrow(v, dtype)
    }

    /// Integer `/` (toward zero) or `%` of i64 values, with the semantics' answers where the
    /// hardware traps: 0 for a zero divisor, and `i64::MIN / -1` wrapping (its `%` is 0).
    fn int_division(&mut self, op: BinaryOp, x: Value, y: Value) -> Value {
        let zero = self.b.ins().iconst(types::I64, 0);
        let one = self.b.ins().iconst(types::I64, 1);
        let by_zero = self.b.ins().icmp_imm_s(IntCC::Equal, y, 0);
        let by_minus_one = self.b.ins().icmp_imm_s(IntCC::Equal, y, -1);
        let risky = self.b.ins().bor(by_zero, by_minus_one);
        let safe = self.b.ins().select(risky, one, y);
        let (v, special) = if op == BinaryOp::Div {
            (self.b.ins().sdiv(x, safe), self.b.ins().ineg(x))
        } else {
            (self.b.ins().srem(x, safe), zero)
        };
        let v = self.b.ins().select(by_minus_one, special, v);
        self.b.ins().select(by_zero, zero, v)
    }

    /// `<<` or `>>` of i64 values by an amount outside `0..64` as the semantics say: `<<`
    /// gives 0 and `>>` the sign.
    fn shift(&mut self, op: BinaryOp, x: Value, y: Value) -> Value {
        let in_range = self.b.ins().icmp_imm_u(IntCC::UnsignedLessThan, y, 64);
        let amount = self.b.ins().band_imm_u(y, 63);
        if op == BinaryOp::Shl {
            let v = self.b.ins().ishl(x, amount);
            let zero = self.b.ins().iconst(types::I64, 0);
            self.b.ins().select(in_range, v, zero)
        } else {
            let v = self.b.ins().sshr(x, amount);
            let sign = self.b.ins().sshr_imm_u(x, 63);
            self.b.ins().select(in_range, v, sign)
        }
    }

    pub(super) fn cast(&mut self, v: Value, from: DType, to: DType) -> Value {
        if from == to {
            return v;
        }
        match (from, to) {
            (_, DType::Bool) => {
                if from.is_float() {
                    let zero = self.float_const(0.0, scalar_type(from));
                    self.b.ins().fcmp(FloatCC::NotEqual, v, zero)
                } else {
                    self.b.ins().icmp_imm_s(IntCC::NotEqual, v, 0)
                }
            }
            (DType::Bool, t) if t.is_float() => {
                let wide = self.b.ins().uextend(types::I64, v);
                let f = self.b.ins().fcvt_from_sint(scalar_type(t), wide);
                self.narrow(f, t)
            }
            (DType::Bool, _) => self.b.ins().uextend(types::I64, v),
            (f, t) if f.is_float() && t.is_float() => {
                let (fty, tty) = (scalar_type(f), scalar_type(t));
                if fty == types::F64 {
                    return self.demote(v, t);
                }
                let w = if tty == types::F64 { self.b.ins().fpromote(types::F64, v) } else { v };
                self.narrow(w, t)
            }
            (f, t) if f.is_float() => {
                let i = self.b.ins().fcvt_to_sint_sat(types::I64, v);
                self.narrow(i, t)
            }
            (_, t) if t.is_float() => {
                let f = self.b.ins().fcvt_from_sint(scalar_type(t), v);
                self.narrow(f, t)
            }
            (_, t) => self.narrow(v, t),
        }
    }
}

/// The dtype whose register type is a reduction's accumulator: combining two accumulators
/// must not convert either (an f32 lane is promoted when it is folded in, an f64
/// accumulator is not).
pub(super) fn acc_ty_dtype(dtype: DType) -> DType {
    if dtype.is_float() { DType::F64 } else { dtype }
}

pub(super) fn float_cc(op: BinaryOp) -> FloatCC {
    match op {
        BinaryOp::Eq => FloatCC::Equal,
        BinaryOp::Ne => FloatCC::NotEqual,
        BinaryOp::Lt => FloatCC::LessThan,
        BinaryOp::Le => FloatCC::LessThanOrEqual,
        BinaryOp::Gt => FloatCC::GreaterThan,
        BinaryOp::Ge => FloatCC::GreaterThanOrEqual,
        other => unreachable!("{} is not a comparison", other.name()),
    }
}

pub(super) fn int_cc(op: BinaryOp) -> IntCC {
    match op {
        BinaryOp::Eq => IntCC::Equal,
        BinaryOp::Ne => IntCC::NotEqual,
        BinaryOp::Lt => IntCC::SignedLessThan,
        BinaryOp::Le => IntCC::SignedLessThanOrEqual,
        BinaryOp::Gt => IntCC::SignedGreaterThan,
        BinaryOp::Ge => IntCC::SignedGreaterThanOrEqual,
        other => unreachable!("{} is not a comparison", other.name()),
    }
}
