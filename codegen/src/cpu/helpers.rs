//! Functions that generated kernels call: math without a Cranelift instruction, and the
//! 16-bit float conversions. Each is registered with the JIT by name, and each is the
//! scalar semantics of `kiln_ir::semantics`, so a lane sent to a helper computes what the
//! reference executor computes.

use cranelift_codegen::ir::{AbiParam, Signature, types};
use cranelift_jit::JITModule;
use cranelift_module::Module;
use half::f16;
use kiln_ir::semantics::{self, binary, unary};
use kiln_ir::{BinaryOp, UnaryOp};

extern "C" fn kiln_exp(x: f64) -> f64 {
    unary(UnaryOp::Exp, x)
}

extern "C" fn kiln_log(x: f64) -> f64 {
    unary(UnaryOp::Log, x)
}

extern "C" fn kiln_sin(x: f64) -> f64 {
    unary(UnaryOp::Sin, x)
}

extern "C" fn kiln_cos(x: f64) -> f64 {
    unary(UnaryOp::Cos, x)
}

extern "C" fn kiln_tan(x: f64) -> f64 {
    unary(UnaryOp::Tan, x)
}

extern "C" fn kiln_tanh(x: f64) -> f64 {
    unary(UnaryOp::Tanh, x)
}

extern "C" fn kiln_sigmoid(x: f64) -> f64 {
    unary(UnaryOp::Sigmoid, x)
}

extern "C" fn kiln_erf(x: f64) -> f64 {
    unary(UnaryOp::Erf, x)
}

extern "C" fn kiln_erfc(x: f64) -> f64 {
    unary(UnaryOp::Erfc, x)
}

extern "C" fn kiln_pow(x: f64, y: f64) -> f64 {
    binary(BinaryOp::Pow, x, y)
}

extern "C" fn kiln_fmod(x: f64, y: f64) -> f64 {
    binary(BinaryOp::Rem, x, y)
}

extern "C" fn kiln_round_f16(x: f32) -> f32 {
    semantics::round_f32_to_f16(x)
}

extern "C" fn kiln_f16_to_f32(bits: u32) -> f32 {
    f16::from_bits(bits as u16).to_f32()
}

extern "C" fn kiln_f32_to_f16(x: f32) -> u32 {
    u32::from(f16::from_f32(x).to_bits())
}

/// A function that generated kernels call, as Cranelift's `LibCall` names a runtime
/// function: its symbol, address and signature come from one exhaustive match each, so a
/// helper cannot be registered under one name and called under another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Helper {
    /// The scalar f64 functions of `kiln_ir::semantics`: f64 -> f64.
    Exp,
    Log,
    Sin,
    Cos,
    Tan,
    Tanh,
    Sigmoid,
    Erf,
    /// `pow`: (f64, f64) -> f64.
    Pow,
    /// `fmod`, exact: (f64, f64) -> f64.
    Fmod,
    /// `erfc` (no vector polynomial): f64 -> f64.
    Erfc,
    /// An f32 rounded to f16 precision: f32 -> f32.
    RoundF16,
    /// f16 bits (in an i32) to f32, and back.
    F16ToF32,
    F32ToF16,
    /// The batch functions of `wide.rs` over a block of f32 (values, count), in place.
    Batch(Batch),
    /// `logsumexp`'s block function (values, count, state).
    LseF32s,
    /// `logsumexp`'s ends: (state) -> f32, and -> f64.
    LseEnd,
    LseEndF64,
    /// A row of exponentials and their sum (`rows.rs`): (x, shift, out, count) -> f64.
    ExpSumF32s,
}

/// A batch function of `wide.rs`: one op over a block of f32 values, in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Batch {
    Exp,
    Tanh,
    Sigmoid,
    Erf,
}

impl Batch {
    /// The batch function that computes `op` over a block, if there is one.
    pub(super) fn for_unary(op: UnaryOp) -> Option<Batch> {
        match op {
            UnaryOp::Exp => Some(Batch::Exp),
            UnaryOp::Tanh => Some(Batch::Tanh),
            UnaryOp::Sigmoid => Some(Batch::Sigmoid),
            UnaryOp::Erf => Some(Batch::Erf),
            UnaryOp::Erfc
            | UnaryOp::Neg
            | UnaryOp::Abs
            | UnaryOp::Sqrt
            | UnaryOp::Log
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Tan
            | UnaryOp::Relu
            | UnaryOp::Recip
            | UnaryOp::Floor
            | UnaryOp::Ceil
            | UnaryOp::Round
            | UnaryOp::Not => None,
        }
    }

    /// The function of a kernel's own module that calls this one and preserves every
    /// register (`preserve_all`): a kernel's loop keeps its accumulators and constants in
    /// registers across the once-a-block call, where a System V call would clobber every
    /// vector register and the register allocator would spill the loop's accumulators for
    /// the whole loop.
    pub(super) fn preserving(self) -> &'static str {
        match self {
            Batch::Exp => "kiln_exp_f32s_preserving",
            Batch::Tanh => "kiln_tanh_f32s_preserving",
            Batch::Sigmoid => "kiln_sigmoid_f32s_preserving",
            Batch::Erf => "kiln_erf_f32s_preserving",
        }
    }
}

impl Helper {
    /// Every helper, in the order kernels' modules declare them (it shows in CLIF text).
    pub(super) const ALL: [Helper; 22] = [
        Helper::Exp,
        Helper::Log,
        Helper::Sin,
        Helper::Cos,
        Helper::Tan,
        Helper::Tanh,
        Helper::Sigmoid,
        Helper::Erf,
        Helper::Pow,
        Helper::RoundF16,
        Helper::F16ToF32,
        Helper::F32ToF16,
        Helper::Batch(Batch::Exp),
        Helper::Batch(Batch::Tanh),
        Helper::Batch(Batch::Sigmoid),
        Helper::Batch(Batch::Erf),
        Helper::LseF32s,
        Helper::LseEnd,
        Helper::LseEndF64,
        Helper::ExpSumF32s,
        Helper::Fmod,
        Helper::Erfc,
    ];

    /// The scalar f64 function that computes `op` (for transcendental ops and the lanes
    /// their vector forms send back), if there is one.
    pub(super) fn for_unary(op: UnaryOp) -> Option<Helper> {
        match op {
            UnaryOp::Exp => Some(Helper::Exp),
            UnaryOp::Log => Some(Helper::Log),
            UnaryOp::Sin => Some(Helper::Sin),
            UnaryOp::Cos => Some(Helper::Cos),
            UnaryOp::Tan => Some(Helper::Tan),
            UnaryOp::Tanh => Some(Helper::Tanh),
            UnaryOp::Sigmoid => Some(Helper::Sigmoid),
            UnaryOp::Erf => Some(Helper::Erf),
            UnaryOp::Erfc => Some(Helper::Erfc),
            UnaryOp::Neg
            | UnaryOp::Abs
            | UnaryOp::Sqrt
            | UnaryOp::Relu
            | UnaryOp::Recip
            | UnaryOp::Floor
            | UnaryOp::Ceil
            | UnaryOp::Round
            | UnaryOp::Not => None,
        }
    }

    /// The symbol the JIT registers and kernels import.
    pub(super) fn name(self) -> &'static str {
        match self {
            Helper::Exp => "kiln_exp",
            Helper::Log => "kiln_log",
            Helper::Sin => "kiln_sin",
            Helper::Cos => "kiln_cos",
            Helper::Tan => "kiln_tan",
            Helper::Tanh => "kiln_tanh",
            Helper::Sigmoid => "kiln_sigmoid",
            Helper::Erf => "kiln_erf",
            Helper::Pow => "kiln_pow",
            Helper::Fmod => "kiln_fmod",
            Helper::Erfc => "kiln_erfc",
            Helper::RoundF16 => "kiln_round_f16",
            Helper::F16ToF32 => "kiln_f16_to_f32",
            Helper::F32ToF16 => "kiln_f32_to_f16",
            Helper::Batch(Batch::Exp) => "kiln_exp_f32s",
            Helper::Batch(Batch::Tanh) => "kiln_tanh_f32s",
            Helper::Batch(Batch::Sigmoid) => "kiln_sigmoid_f32s",
            Helper::Batch(Batch::Erf) => "kiln_erf_f32s",
            Helper::LseF32s => "kiln_lse_f32s",
            Helper::LseEnd => "kiln_lse_end",
            Helper::LseEndF64 => "kiln_lse_end_f64",
            Helper::ExpSumF32s => "kiln_exp_sum_f32s",
        }
    }

    /// The function's address in this process (the batch functions for this host's vectors).
    fn address(self) -> *const u8 {
        match self {
            Helper::Exp => kiln_exp as *const u8,
            Helper::Log => kiln_log as *const u8,
            Helper::Sin => kiln_sin as *const u8,
            Helper::Cos => kiln_cos as *const u8,
            Helper::Tan => kiln_tan as *const u8,
            Helper::Tanh => kiln_tanh as *const u8,
            Helper::Sigmoid => kiln_sigmoid as *const u8,
            Helper::Erf => kiln_erf as *const u8,
            Helper::Pow => kiln_pow as *const u8,
            Helper::Fmod => kiln_fmod as *const u8,
            Helper::Erfc => kiln_erfc as *const u8,
            Helper::RoundF16 => kiln_round_f16 as *const u8,
            Helper::F16ToF32 => kiln_f16_to_f32 as *const u8,
            Helper::F32ToF16 => kiln_f32_to_f16 as *const u8,
            Helper::Batch(b) => super::wide::for_host(b) as *const u8,
            Helper::LseF32s => super::wide::lse_for_host() as *const u8,
            Helper::LseEnd => super::wide::lse_end as *const u8,
            Helper::LseEndF64 => super::wide::lse_end_f64 as *const u8,
            Helper::ExpSumF32s => super::wide::exp_sum_for_host() as *const u8,
        }
    }

    /// The function's Cranelift signature in `module` (System V).
    pub(super) fn signature(self, module: &JITModule) -> Signature {
        let (params, ret): (&[types::Type], Option<types::Type>) = match self {
            Helper::Exp
            | Helper::Log
            | Helper::Sin
            | Helper::Cos
            | Helper::Tan
            | Helper::Tanh
            | Helper::Sigmoid
            | Helper::Erf
            | Helper::Erfc => (&[types::F64], Some(types::F64)),
            Helper::Pow | Helper::Fmod => (&[types::F64, types::F64], Some(types::F64)),
            Helper::RoundF16 => (&[types::F32], Some(types::F32)),
            Helper::F16ToF32 => (&[types::I32], Some(types::F32)),
            Helper::F32ToF16 => (&[types::F32], Some(types::I32)),
            Helper::Batch(_) => (&[types::I64, types::I64], None),
            Helper::LseF32s => (&[types::I64; 3], None),
            Helper::LseEnd => (&[types::I64], Some(types::F32)),
            Helper::LseEndF64 => (&[types::I64], Some(types::F64)),
            Helper::ExpSumF32s => {
                (&[types::I64, types::F32, types::I64, types::I64], Some(types::F64))
            }
        };
        let mut s = module.make_signature();
        s.params.extend(params.iter().map(|&t| AbiParam::new(t)));
        s.returns.extend(ret.map(AbiParam::new));
        s
    }
}

/// Every helper's name and address, for `JITBuilder::symbol`.
pub(super) fn symbols() -> Vec<(&'static str, *const u8)> {
    Helper::ALL.iter().map(|h| (h.name(), h.address())).collect()
}
