//! 16-bit floats on f32x4 lanes: loads that widen four bf16 or f16 values, stores that
//! narrow them, and the rounding after every op of a 16-bit dtype, all in integer vector
//! operations (Cranelift 0.135 has no vector conversions for either format). Each gives the
//! bits of the scalar path's conversions (`half`'s, round to nearest with ties to even),
//! NaN payloads included.

use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{Endianness, InstBuilder, MemFlagsData, Type, Value, types};
use kiln_ir::DType;

use super::translate::Translator;

impl Translator<'_, '_> {
    /// A vector of `lanes` consecutive elements of `dtype` at `addr`: 16-bit floats are
    /// widened (exactly) into f32 lanes.
    pub(super) fn load_vector(&mut self, dtype: DType, lanes: Type, addr: Value) -> Value {
        let fl = MemFlagsData::new().with_notrap();
        match dtype {
            DType::BF16 => {
                let bits = self.b.ins().uload16x4(fl, addr, 0);
                let wide = self.b.ins().ishl_imm_u(bits, 16);
                self.f32s(wide)
            }
            DType::F16 => {
                let bits = self.b.ins().uload16x4(fl, addr, 0);
                self.f16_to_f32_vector(bits)
            }
            _ => self.b.ins().load(lanes, fl, addr, 0),
        }
    }

    /// Stores vector `v` of `dtype` values at `addr`: 16-bit floats (exact in their f32
    /// lanes, rounded by [`Self::narrow_vector`]) as their 16-bit encodings.
    pub(super) fn store_vector(&mut self, v: Value, dtype: DType, addr: Value) {
        let fl = MemFlagsData::new().with_notrap();
        let bits = match dtype {
            DType::BF16 => {
                let bits = self.i32s(v);
                self.b.ins().ushr_imm_u(bits, 16)
            }
            DType::F16 => self.f16_exact_bits_vector(v),
            _ => {
                self.b.ins().store(fl, v, addr, 0);
                return;
            }
        };
        // Each lane is below 2^16, so the saturating narrowing keeps it.
        let packed = self.b.ins().unarrow(bits, bits);
        let little = MemFlagsData::new().with_endianness(Endianness::Little);
        let pair = self.b.ins().bitcast(types::I64X2, little, packed);
        let low = self.b.ins().extractlane(pair, 0);
        self.b.ins().store(fl, low, addr, 0);
    }

    /// f32 lanes rounded to `dtype` (bf16 or f16), still in f32 lanes; other dtypes as
    /// they are.
    pub(super) fn narrow_vector(&mut self, v: Value, dtype: DType) -> Value {
        match dtype {
            DType::BF16 => {
                let bits = self.bf16_bits_vector(v);
                let wide = self.b.ins().ishl_imm_u(bits, 16);
                self.f32s(wide)
            }
            DType::F16 => self.round_to_f16_vector(v),
            _ => v,
        }
    }

    /// The bf16 bits (in the low half of each i32 lane) of f32 lanes, rounded to nearest
    /// with ties to even, NaN kept quiet: the scalar `bf16_bits` lane by lane.
    fn bf16_bits_vector(&mut self, v: Value) -> Value {
        let bits = self.i32s(v);
        let high = self.b.ins().ushr_imm_u(bits, 16);
        let one = self.i32_splat(1);
        let lsb = self.b.ins().band(high, one);
        let bias = self.i32_splat(0x7FFF);
        let biased = self.b.ins().iadd(bits, bias);
        let rounded = self.b.ins().iadd(biased, lsb);
        let rounded = self.b.ins().ushr_imm_u(rounded, 16);
        let magnitude = self.abs_bits(bits);
        // Both sides below 2^31: the signed compare is the unsigned one.
        let inf = self.i32_splat(0x7F80_0000);
        let nan = self.b.ins().icmp(IntCC::SignedGreaterThan, magnitude, inf);
        let quiet_bit = self.i32_splat(0x40);
        let quiet = self.b.ins().bor(high, quiet_bit);
        self.b.ins().bitselect(nan, quiet, rounded)
    }

    /// f32 lanes rounded to f16's precision and range, still in f32 lanes (what converting
    /// to f16 and back gives, with ties to even): normal results by adding half an f16 step
    /// (less one, plus the kept bit's parity) and clearing the bits below it, which carries
    /// into the exponent; subnormal ones by the hardware's own rounding of `|x| + 0.5`
    /// (whose step is f16's smallest); from 65520 up, infinity; NaN quiet with the top of
    /// its payload.
    fn round_to_f16_vector(&mut self, v: Value) -> Value {
        let bits = self.i32s(v);
        let abs = self.abs_bits(bits);
        let sign_mask = self.i32_splat(i64::from(i32::MIN));
        let sign = self.b.ins().band(bits, sign_mask);
        let kept = self.b.ins().ushr_imm_u(bits, 13);
        let one = self.i32_splat(1);
        let parity = self.b.ins().band(kept, one);
        let half_step = self.i32_splat(0xFFF);
        let normal = self.b.ins().iadd(bits, half_step);
        let normal = self.b.ins().iadd(normal, parity);
        let low_bits = self.i32_splat(!0x1FFF);
        let normal = self.b.ins().band(normal, low_bits);
        let (steps, half_bits) = self.f16_subnormal_steps(abs);
        let half = self.f32s(half_bits);
        let subnormal = self.f32s(steps);
        let subnormal = self.b.ins().fsub(subnormal, half);
        let subnormal = self.i32s(subnormal);
        let subnormal = self.b.ins().bor(subnormal, sign);
        let r = self.below_f16_normal(abs, subnormal, normal);
        // 65520, halfway between f16's largest finite value and the next power of two.
        let overflow = self.i32_splat(0x477F_F000);
        let big = self.b.ins().icmp(IntCC::SignedGreaterThanOrEqual, abs, overflow);
        let inf = self.i32_splat(0x7F80_0000);
        let signed_inf = self.b.ins().bor(sign, inf);
        let r = self.b.ins().bitselect(big, signed_inf, r);
        let nan = self.b.ins().icmp(IntCC::SignedGreaterThan, abs, inf);
        let quiet_bit = self.i32_splat(0x0040_0000);
        let quiet = self.b.ins().bor(bits, quiet_bit);
        let quiet = self.b.ins().band(quiet, low_bits);
        let r = self.b.ins().bitselect(nan, quiet, r);
        self.f32s(r)
    }

    /// The f16 bits (low half of each i32 lane) of f32 lanes that hold f16 values exactly
    /// (every value of an f16 expression is rounded by [`Self::narrow_vector`]): normal
    /// ones rebiased and shifted, subnormal ones counted in f16's smallest step by adding
    /// 0.5, infinity and NaN from their exponent and payload.
    fn f16_exact_bits_vector(&mut self, v: Value) -> Value {
        let bits = self.i32s(v);
        let abs = self.abs_bits(bits);
        let high = self.b.ins().ushr_imm_u(bits, 16);
        let sign_mask = self.i32_splat(0x8000);
        let sign = self.b.ins().band(high, sign_mask);
        let rebias = self.i32_splat(-(112 << 23));
        let normal = self.b.ins().iadd(abs, rebias);
        let normal = self.b.ins().ushr_imm_u(normal, 13);
        let (steps, half_bits) = self.f16_subnormal_steps(abs);
        let subnormal = self.b.ins().isub(steps, half_bits);
        let finite = self.below_f16_normal(abs, subnormal, normal);
        let f32_inf = self.i32_splat(0x7F80_0000);
        let not_finite = self.b.ins().icmp(IntCC::SignedGreaterThanOrEqual, abs, f32_inf);
        let payload = self.b.ins().ushr_imm_u(abs, 13);
        let payload_mask = self.i32_splat(0x3FF);
        let payload = self.b.ins().band(payload, payload_mask);
        let f16_inf = self.i32_splat(0x7C00);
        let special = self.b.ins().bor(payload, f16_inf);
        let magnitude = self.b.ins().bitselect(not_finite, special, finite);
        self.b.ins().bor(magnitude, sign)
    }

    /// f32 lanes of the f16 values whose bits are in the low half of each i32 lane
    /// (exact): the exponent and fraction shifted into place and scaled by `2^112` (which
    /// also normalizes subnormals), infinity and NaN (made quiet) set apart.
    fn f16_to_f32_vector(&mut self, h: Value) -> Value {
        let magnitude_mask = self.i32_splat(0x7FFF);
        let em = self.b.ins().band(h, magnitude_mask);
        let sign_mask = self.i32_splat(0x8000);
        let sign = self.b.ins().band(h, sign_mask);
        let sign = self.b.ins().ishl_imm_u(sign, 16);
        let shifted = self.b.ins().ishl_imm_u(em, 13);
        let as_f = self.f32s(shifted);
        let scale_bits = self.i32_splat((127 + 112) << 23);
        let scale = self.f32s(scale_bits);
        let finite = self.b.ins().fmul(as_f, scale);
        let finite = self.i32s(finite);
        let f16_inf = self.i32_splat(0x7C00);
        let not_finite = self.b.ins().icmp(IntCC::SignedGreaterThanOrEqual, em, f16_inf);
        let nan = self.b.ins().icmp(IntCC::SignedGreaterThan, em, f16_inf);
        let exponent = self.i32_splat(0x7F80_0000);
        let quiet_bit = self.i32_splat(0x0040_0000);
        let quiet = self.b.ins().band(nan, quiet_bit);
        let special = self.b.ins().bor(shifted, exponent);
        let special = self.b.ins().bor(special, quiet);
        let magnitude = self.b.ins().bitselect(not_finite, special, finite);
        let bits = self.b.ins().bor(magnitude, sign);
        self.f32s(bits)
    }

    /// The bits of `|x| + 0.5` (`abs` holds `|x|`'s bits) and of 0.5: below f16's smallest
    /// normal value the sum's last bit is f16's smallest subnormal step, so the hardware's
    /// rounding of the sum rounds `|x|` to it (ties to even), and the difference of the bits
    /// counts the steps.
    fn f16_subnormal_steps(&mut self, abs: Value) -> (Value, Value) {
        let half_bits = self.i32_splat(0x3F00_0000);
        let half = self.f32s(half_bits);
        let abs_f = self.f32s(abs);
        let sum = self.b.ins().fadd(abs_f, half);
        (self.i32s(sum), half_bits)
    }

    /// `small` where `abs` (an f32's magnitude bits) is below f16's smallest normal value,
    /// else `normal`.
    fn below_f16_normal(&mut self, abs: Value, small: Value, normal: Value) -> Value {
        let smallest_normal = self.i32_splat(113 << 23);
        let below = self.b.ins().icmp(IntCC::SignedLessThan, abs, smallest_normal);
        self.b.ins().bitselect(below, small, normal)
    }

    fn abs_bits(&mut self, bits: Value) -> Value {
        let mask = self.i32_splat(0x7FFF_FFFF);
        self.b.ins().band(bits, mask)
    }

    fn i32_splat(&mut self, c: i64) -> Value {
        let c = self.b.ins().iconst(types::I32, c);
        self.b.ins().splat(types::I32X4, c)
    }

    fn i32s(&mut self, v: Value) -> Value {
        self.b.ins().bitcast(types::I32X4, MemFlagsData::new(), v)
    }

    fn f32s(&mut self, v: Value) -> Value {
        self.b.ins().bitcast(types::F32X4, MemFlagsData::new(), v)
    }
}
