//! Sizes in generated code: known numbers become immediates and magic-number divisions; a
//! size-generic kernel's numbers ([`Sz::Slot`]) are values its prologue loaded, multiplied
//! and divided at run time (once per row, not per element).

use cranelift_codegen::ir::{InstBuilder, Value};

use super::translate::Translator;
use crate::walk::Sz;

/// How far a pointer moves per position: bytes known when the kernel is compiled, or a
/// value read at run time (a size-generic kernel's stride).
#[derive(Clone, Copy)]
pub(super) enum Step {
    Bytes(i64),
    Value(Value),
}

impl Translator<'_, '_> {
    /// The value of size `s`.
    pub(super) fn size(&mut self, s: Sz) -> Value {
        match s {
            Sz::Known(v) => self.iconst(v),
            Sz::Slot(i) => self.sizes[i as usize],
        }
    }

    /// `x * s * scale`.
    pub(super) fn mul_size(&mut self, x: Value, s: Sz, scale: i64) -> Value {
        match s {
            Sz::Known(v) => self.b.ins().imul_imm_s(x, v * scale),
            Sz::Slot(i) => {
                let y = self.b.ins().imul(x, self.sizes[i as usize]);
                if scale == 1 { y } else { self.b.ins().imul_imm_s(y, scale) }
            }
        }
    }

    /// The step of a stride `s` over elements of `scale` bytes.
    pub(super) fn step(&mut self, s: Sz, scale: i64) -> Step {
        match s {
            Sz::Known(v) => Step::Bytes(v * scale),
            Sz::Slot(_) => Step::Value(self.mul_size_const(s, scale)),
        }
    }

    /// Pointers advanced by `steps` each.
    pub(super) fn advance_steps(&mut self, ptrs: &[Value], steps: &[Step]) -> Vec<Value> {
        (ptrs.iter().zip(steps))
            .map(|(&p, &s)| match s {
                Step::Bytes(b) => self.b.ins().iadd_imm_s(p, b),
                Step::Value(v) => self.b.ins().iadd(p, v),
            })
            .collect()
    }

    /// `s * scale` as a value.
    pub(super) fn mul_size_const(&mut self, s: Sz, scale: i64) -> Value {
        match s {
            Sz::Known(v) => self.iconst(v * scale),
            Sz::Slot(i) => self.b.ins().imul_imm_s(self.sizes[i as usize], scale),
        }
    }

    /// `(x / d, x % d)` for a size `d` and an element index `x`: [`Self::divrem_const`] when
    /// `d` is known, a division when it is read at run time (once per row, not per element).
    pub(super) fn divrem(&mut self, x: Value, d: Sz) -> (Value, Value) {
        match d {
            Sz::Known(d) => self.divrem_const(x, d as u64),
            Sz::Slot(i) => {
                let d = self.sizes[i as usize];
                let q = self.b.ins().udiv(x, d);
                let back = self.b.ins().imul(q, d);
                let r = self.b.ins().isub(x, back);
                (q, r)
            }
        }
    }

    /// `(x / d, x % d)` for a constant `d` and an element index `x` (below 2^48): a
    /// multiply-high and a shift instead of a 64-bit division, which costs tens of cycles
    /// and which a row's address computation does once per dimension.
    pub(super) fn divrem_const(&mut self, x: Value, d: u64) -> (Value, Value) {
        if d == 0 {
            // An empty dimension: the loop never runs, any value will do.
            return (x, x);
        }
        if d.is_power_of_two() {
            let q = self.b.ins().ushr_imm_s(x, i64::from(d.trailing_zeros()));
            let r = self.b.ins().band_imm_s(x, (d - 1) as i64);
            return (q, r);
        }
        let (m, k) = div_magic(d);
        let m = self.iconst(m as i64);
        let mut q = self.b.ins().umulhi(x, m);
        if k > 64 {
            q = self.b.ins().ushr_imm_s(q, i64::from(k - 64));
        }
        let back = self.b.ins().imul_imm_s(q, d as i64);
        let r = self.b.ins().isub(x, back);
        (q, r)
    }
}

/// The multiplier `m` and shift `k` with `x / d == (x·m) >> k` for every `x < 2^48`:
/// `m = ceil(2^k / d)` with `k >= 48 + ceil(log2 d)` bounds the rounding error below one
/// step of `x / d`, and `m` fits 64 bits (`m < 2^49`, or `m <= 2^63` when `k` is 64).
pub(crate) fn div_magic(d: u64) -> (u64, u32) {
    let bits = 64 - (d - 1).leading_zeros();
    let k = (48 + bits).max(64);
    let m = (1u128 << k).div_ceil(u128::from(d));
    (m as u64, k)
}
