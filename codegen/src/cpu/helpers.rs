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

extern "C" fn kiln_tanh(x: f64) -> f64 {
    unary(UnaryOp::Tanh, x)
}

extern "C" fn kiln_sigmoid(x: f64) -> f64 {
    unary(UnaryOp::Sigmoid, x)
}

extern "C" fn kiln_erf(x: f64) -> f64 {
    unary(UnaryOp::Erf, x)
}

extern "C" fn kiln_pow(x: f64, y: f64) -> f64 {
    binary(BinaryOp::Pow, x, y)
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

/// Every helper's name and address, for `JITBuilder::symbol`.
pub(super) fn symbols() -> Vec<(&'static str, *const u8)> {
    let mut out = vec![
        ("kiln_exp", kiln_exp as *const u8),
        ("kiln_log", kiln_log as *const u8),
        ("kiln_sin", kiln_sin as *const u8),
        ("kiln_cos", kiln_cos as *const u8),
        ("kiln_tanh", kiln_tanh as *const u8),
        ("kiln_sigmoid", kiln_sigmoid as *const u8),
        ("kiln_erf", kiln_erf as *const u8),
        ("kiln_pow", kiln_pow as *const u8),
        ("kiln_round_f16", kiln_round_f16 as *const u8),
        ("kiln_f16_to_f32", kiln_f16_to_f32 as *const u8),
        ("kiln_f32_to_f16", kiln_f32_to_f16 as *const u8),
    ];
    out.extend(super::wide::for_host().into_iter().map(|(n, f)| (n, f as *const u8)));
    out.push(("kiln_lse_f32s", super::wide::lse_for_host() as *const u8));
    out.push(("kiln_lse_end", super::wide::lse_end as *const u8));
    out.push(("kiln_lse_end_f64", super::wide::lse_end_f64 as *const u8));
    out.push(("kiln_exp_sum_f32s", super::wide::exp_sum_for_host() as *const u8));
    out
}

/// Every helper's Cranelift signature.
pub(super) fn signatures(module: &JITModule) -> Vec<(&'static str, Signature)> {
    let sig = |params: &[types::Type], ret: types::Type| {
        let mut s = module.make_signature();
        s.params.extend(params.iter().map(|&t| AbiParam::new(t)));
        s.returns.push(AbiParam::new(ret));
        s
    };
    let f64_1 = sig(&[types::F64], types::F64);
    let mut out: Vec<(&'static str, Signature)> =
        ["kiln_exp", "kiln_log", "kiln_sin", "kiln_cos", "kiln_tanh", "kiln_sigmoid", "kiln_erf"]
            .into_iter()
            .map(|n| (n, f64_1.clone()))
            .collect();
    out.push(("kiln_pow", sig(&[types::F64, types::F64], types::F64)));
    out.push(("kiln_round_f16", sig(&[types::F32], types::F32)));
    out.push(("kiln_f16_to_f32", sig(&[types::I32], types::F32)));
    out.push(("kiln_f32_to_f16", sig(&[types::F32], types::I32)));
    // The batch functions of `wide.rs`: (values, count), nothing returned.
    for (name, _) in super::wide::for_host() {
        let mut s = module.make_signature();
        s.params.extend([AbiParam::new(types::I64), AbiParam::new(types::I64)]);
        out.push((name, s));
    }
    // `logsumexp`'s block function (values, count, state) and its ends (state) -> f32, f64.
    let mut block = module.make_signature();
    block.params.extend([types::I64; 3].map(AbiParam::new));
    out.push(("kiln_lse_f32s", block));
    out.push(("kiln_lse_end", sig(&[types::I64], types::F32)));
    out.push(("kiln_lse_end_f64", sig(&[types::I64], types::F64)));
    // A row of exponentials and their sum (`rows.rs`): (x, shift, out, count) -> f64.
    out.push((
        "kiln_exp_sum_f32s",
        sig(&[types::I64, types::F32, types::I64, types::I64], types::F64),
    ));
    out
}
